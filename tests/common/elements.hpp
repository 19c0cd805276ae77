#pragma once
// Typed element access for tests that check collectives over every DataType: store a value
// converted to the element type, read one back as a double.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <strata/types.hpp>

namespace strata::test {

/// Stores `v`, converted to type t, as element i of `base`.
inline void store_element(DataType t, void* base, size_t i, double v) {
  char* p = static_cast<char*>(base) + i * dtype_size(t);
  switch (t) {
    case DataType::Int8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case DataType::UInt8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case DataType::Int32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::UInt32: {
      uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::Int64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DataType::UInt64: {
      uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DataType::Float16: {
      float16_t x = to_float16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case DataType::BFloat16: {
      bfloat16_t x = to_bfloat16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case DataType::Float32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::Float64: std::memcpy(p, &v, 8); break;
  }
}

/// Element i of `base` (type t) as a double.
inline double load_element(DataType t, const void* base, size_t i) {
  const char* p = static_cast<const char*>(base) + i * dtype_size(t);
  switch (t) {
    case DataType::Int8: {
      int8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case DataType::UInt8: {
      uint8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case DataType::Int32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::UInt32: {
      uint32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::Int64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DataType::UInt64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DataType::Float16: {
      float16_t x;
      std::memcpy(&x, p, 2);
      return to_float(x);
    }
    case DataType::BFloat16: {
      bfloat16_t x;
      std::memcpy(&x, p, 2);
      return to_float(x);
    }
    case DataType::Float32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::Float64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
  }
  return 0;
}

}  // namespace strata::test

#pragma once
// Element values of the MoE tests, independent of the library's kernels: read and write one
// element of a bf16/fp16/fp32 buffer as float, round a float to the type, and the routings
// the tests draw. Shared by the one-host tests (moe_test.cpp) and the rank program across
// hosts (tests/multihost/mh_moe_rank.cpp).

#include <cstddef>

#include <strata/strata.hpp>

namespace strata::test::moe_values {

inline float get(DataType dt, const void* p, size_t i) {
  switch (dt) {
    case DataType::BFloat16: return to_float(static_cast<const bfloat16_t*>(p)[i]);
    case DataType::Float16: return to_float(static_cast<const float16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

inline void put(DataType dt, void* p, size_t i, float v) {
  switch (dt) {
    case DataType::BFloat16: static_cast<bfloat16_t*>(p)[i] = to_bfloat16(v); break;
    case DataType::Float16: static_cast<float16_t*>(p)[i] = to_float16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

/// v as the type stores it.
inline float round_to(DataType dt, float v) {
  float b[1];
  put(dt, b, 0, v);
  return get(dt, b, 0);
}

/// How tokens pick experts: spread, all to the same ones, or some rows with no selection.
enum class Routing { Uniform, Skewed, EmptyRows };
inline const char* routing_name(Routing r) {
  return r == Routing::Uniform ? "uniform" : r == Routing::Skewed ? "skewed" : "emptyrows";
}

}  // namespace strata::test::moe_values

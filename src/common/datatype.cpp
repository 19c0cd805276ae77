#include <cstring>
#include <strata/types.hpp>

namespace strata {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::Int8:
    case DataType::UInt8: return 1;
    case DataType::Float16:
    case DataType::BFloat16: return 2;
    case DataType::Int32:
    case DataType::UInt32:
    case DataType::Float32: return 4;
    case DataType::Int64:
    case DataType::UInt64:
    case DataType::Float64: return 8;
  }
  return 0;
}

const char* to_string(DataType t) {
  switch (t) {
    case DataType::Int8: return "int8";
    case DataType::UInt8: return "uint8";
    case DataType::Int32: return "int32";
    case DataType::UInt32: return "uint32";
    case DataType::Int64: return "int64";
    case DataType::UInt64: return "uint64";
    case DataType::Float16: return "float16";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::BAnd: return "band";
    case ReduceOp::BOr: return "bor";
    case ReduceOp::BXor: return "bxor";
  }
  return "unknown";
}

const char* to_string(Code c) {
  switch (c) {
    case Code::Ok: return "Ok";
    case Code::InvalidArgument: return "InvalidArgument";
    case Code::Timeout: return "Timeout";
    case Code::PeerFailed: return "PeerFailed";
    case Code::Aborted: return "Aborted";
    case Code::Unavailable: return "Unavailable";
    case Code::Internal: return "Internal";
  }
  return "Unknown";
}

bool is_floating(DataType t) {
  return t == DataType::Float16 || t == DataType::BFloat16 || t == DataType::Float32 || t == DataType::Float64;
}

float to_float(bfloat16_t h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bfloat16_t to_bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

float to_float(float16_t h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float16_t to_float16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) {  // inf or nan
    return {static_cast<uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u))};
  }
  if (absu >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (absu < 0x38800000u) {                                                 // result is subnormal or zero
    if (absu < 0x33000000u) return {static_cast<uint16_t>(sign)};
    uint32_t e = absu >> 23;
    uint32_t man = (absu & 0x7fffffu) | 0x800000u;
    // value = man * 2^(e-150) and the half subnormal unit is 2^-24, so h = man >> (126 - e).
    uint32_t s = 126 - e;
    uint32_t h = man >> s;
    uint32_t rem = man & ((1u << s) - 1);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return {static_cast<uint16_t>(sign | h)};
  }
  uint32_t h = ((absu - 0x38000000u) >> 13);
  uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return {static_cast<uint16_t>(sign | h)};
}

}  // namespace strata

#include "cli/bench_colls.hpp"

#include <cstring>

namespace strata::bench {

const CollInfo kColls[10] = {
    {Coll::AllReduce, "all_reduce", true, false, false},
    {Coll::Reduce, "reduce", true, true, false},
    {Coll::Broadcast, "broadcast", false, true, false},
    {Coll::AllGather, "all_gather", false, false, true},
    {Coll::ReduceScatter, "reduce_scatter", true, false, true},
    {Coll::AllToAll, "all_to_all", false, false, true},
    {Coll::Gather, "gather", false, true, true},
    {Coll::Scatter, "scatter", false, true, true},
    {Coll::Barrier, "barrier", false, false, false},
    {Coll::SendRecv, "sendrecv", false, false, false},
};

const CollInfo& info(Coll c) {
  for (const auto& i : kColls)
    if (i.coll == c) return i;
  return kColls[0];
}

std::optional<Coll> parse_coll(std::string_view s) {
  for (const auto& i : kColls)
    if (s == i.name) return i.coll;
  // The spellings of MPI, NCCL and torch.distributed are accepted too.
  if (s == "allreduce") return Coll::AllReduce;
  if (s == "allgather" || s == "all_gather_into_tensor") return Coll::AllGather;
  if (s == "reducescatter" || s == "reduce_scatter_tensor") return Coll::ReduceScatter;
  if (s == "alltoall" || s == "all_to_all_single") return Coll::AllToAll;
  if (s == "bcast") return Coll::Broadcast;
  return std::nullopt;
}

double busbw_factor(Coll c, int n) {
  double nd = n;
  switch (c) {
    case Coll::AllReduce: return 2.0 * (nd - 1) / nd;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll:
    case Coll::Gather:
    case Coll::Scatter: return (nd - 1) / nd;
    case Coll::Reduce:
    case Coll::Broadcast:
    case Coll::SendRecv: return 1.0;
    case Coll::Barrier: return 0.0;
  }
  return 1.0;
}

size_t in_count(Coll coll, int n, int r, int root, size_t c) {
  switch (coll) {
    case Coll::ReduceScatter:
    case Coll::AllToAll: return c * n;
    case Coll::Scatter: return r == root ? c * n : 0;
    case Coll::Broadcast: return r == root ? c : 0;
    case Coll::Barrier: return 0;
    default: return c;
  }
}
size_t out_count(Coll coll, int n, int r, int root, size_t c) {
  switch (coll) {
    case Coll::AllGather:
    case Coll::AllToAll: return c * n;
    case Coll::Gather: return r == root ? c * n : 0;
    case Coll::Reduce: return r == root ? c : 0;
    case Coll::Barrier: return 0;
    default: return c;
  }
}

const TypeInfo kTypes[10] = {
    {DataType::Int8, "int8", 1, false},      {DataType::UInt8, "uint8", 1, false},
    {DataType::Int32, "int32", 4, false},    {DataType::UInt32, "uint32", 4, false},
    {DataType::Int64, "int64", 8, false},    {DataType::UInt64, "uint64", 8, false},
    {DataType::Float16, "float16", 2, true}, {DataType::BFloat16, "bfloat16", 2, true},
    {DataType::Float32, "float32", 4, true}, {DataType::Float64, "float64", 8, true},
};
const TypeInfo& info(DataType d) {
  for (const auto& t : kTypes)
    if (t.dt == d) return t;
  return kTypes[8];
}
std::optional<DataType> parse_dtype(std::string_view s) {
  for (const auto& t : kTypes)
    if (s == t.name) return t.dt;
  if (s == "float" || s == "fp32") return DataType::Float32;
  if (s == "double" || s == "fp64") return DataType::Float64;
  if (s == "half" || s == "fp16") return DataType::Float16;
  if (s == "bf16") return DataType::BFloat16;
  if (s == "int") return DataType::Int32;
  return std::nullopt;
}

namespace {
constexpr const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};
}  // namespace

const char* op_name(ReduceOp op) { return kOpNames[static_cast<int>(op)]; }
std::optional<ReduceOp> parse_op(std::string_view s) {
  for (int i = 0; i < 5; ++i)
    if (s == kOpNames[i]) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t e8 = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (e8 == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  int32_t e = static_cast<int32_t>(e8) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(h);
}
float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (e == 31) x = sign | 0x7f800000u | (mant << 13);
  else x = sign | ((e - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}
float bf16_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double pattern(ReduceOp op, int rank, size_t i) {
  size_t v = (static_cast<size_t>(rank) * 7 + i) % 11;
  if (op == ReduceOp::Prod) return v % 3 == 0 ? 2.0 : 1.0;
  return static_cast<double>(v + 1);
}

double reduced(ReduceOp op, int n, size_t i) {
  double acc = pattern(op, 0, i);
  for (int b = 1; b < n; ++b) {
    double v = pattern(op, b, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      default: break;  // the bench offers sum..avg only (kOpNames)
    }
  }
  return op == ReduceOp::Avg ? acc / n : acc;
}

std::optional<double> expected(Coll coll, ReduceOp op, int n, int r, int root, size_t c, size_t k) {
  switch (coll) {
    case Coll::AllReduce: return reduced(op, n, k);
    case Coll::Reduce:
      if (r != root) return std::nullopt;
      return reduced(op, n, k);
    case Coll::Broadcast: return pattern(op, root, k);
    case Coll::AllGather: return pattern(op, static_cast<int>(k / c), k % c);
    case Coll::ReduceScatter: return reduced(op, n, static_cast<size_t>(r) * c + k);
    case Coll::AllToAll: return pattern(op, static_cast<int>(k / c), static_cast<size_t>(r) * c + k % c);
    case Coll::Gather:
      if (r != root) return std::nullopt;
      return pattern(op, static_cast<int>(k / c), k % c);
    case Coll::Scatter: return pattern(op, root, static_cast<size_t>(r) * c + k);
    case Coll::SendRecv: return pattern(op, (r + n - 1) % n, k);
    case Coll::Barrier: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace strata::bench

#pragma once
// What `strata bench` measures and what the right answer is, shared with its Open MPI peer
// (bench/peers/mpi_bench.cpp): the collectives and their size conventions (nccl-tests), the
// data types and operations, the data pattern and the expected result of every collective.
// Free of libstrata symbols: the peer compiles bench_colls.cpp without linking the library.
// bench/peers/torch_bench.py mirrors it in Python; keep the two in step.

#include <strata/types.hpp>  // DataType, ReduceOp (the enums only)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace strata::bench {

// ---- collectives ------------------------------------------------------------------------------

/// The collectives the bench sweeps.
enum class Coll {
  AllReduce,
  Reduce,
  Broadcast,
  AllGather,
  ReduceScatter,
  AllToAll,
  Gather,
  Scatter,
  Barrier,
  SendRecv
};

/// A collective's name and the conventions its rows follow.
struct CollInfo {
  Coll coll;
  const char* name;
  bool reduces;     // takes --op
  bool rooted;      // takes --root
  bool total_size;  // size = n × per-rank block (nccl-tests: all_gather, reduce_scatter, all_to_all, ...)
};

/// Every collective, in the order of the help text.
extern const CollInfo kColls[10];

/// The entry of kColls for `c`.
const CollInfo& info(Coll c);
/// "all_reduce" (also the MPI, NCCL and torch.distributed spellings) -> Coll.
std::optional<Coll> parse_coll(std::string_view s);
/// nccl-tests' bus bandwidth factor: busbw = algbw × factor, so that busbw is comparable with
/// the hardware's bandwidth whatever the rank count.
double busbw_factor(Coll c, int n);
/// Elements in the call's input on rank r (0: not read there). `c` is the count the call
/// takes (the per-rank block for the total-size collectives).
size_t in_count(Coll coll, int n, int r, int root, size_t c);
/// Elements in the call's output on rank r (0: not written there); `c` as for in_count.
size_t out_count(Coll coll, int n, int r, int root, size_t c);

// ---- data types -------------------------------------------------------------------------------

/// A data type's name, element size and kind.
struct TypeInfo {
  DataType dt;
  const char* name;
  size_t size;
  bool floating;
};
/// Every data type, in the order of the help text.
extern const TypeInfo kTypes[10];
/// The entry of kTypes for `d`.
const TypeInfo& info(DataType d);
/// "float32" (also "float", "fp32", "bf16", ...) -> DataType.
std::optional<DataType> parse_dtype(std::string_view s);

/// "sum", "prod", "min", "max", "avg".
const char* op_name(ReduceOp op);
/// The inverse of op_name.
std::optional<ReduceOp> parse_op(std::string_view s);

/// Half-precision conversions of our own (round to nearest even), so the peer needs no library.
uint16_t f32_to_f16(float f);
/// float16 bits -> float.
float f16_to_f32(uint16_t h);
/// float -> bfloat16 bits (round to nearest even; NaN stays NaN).
uint16_t f32_to_bf16(float f);
/// bfloat16 bits -> float.
float bf16_to_f32(uint16_t h);

/// Storage of one float16 element.
struct F16 {
  uint16_t bits;
};
/// Storage of one bfloat16 element.
struct BF16 {
  uint16_t bits;
};

/// Calls f(T{}) with the storage type of `dt` (F16/BF16 for the half types).
template <class F>
decltype(auto) with_type(DataType dt, F&& f) {
  switch (dt) {
    case DataType::Int8: return f(int8_t{});
    case DataType::UInt8: return f(uint8_t{});
    case DataType::Int32: return f(int32_t{});
    case DataType::UInt32: return f(uint32_t{});
    case DataType::Int64: return f(int64_t{});
    case DataType::UInt64: return f(uint64_t{});
    case DataType::Float16: return f(F16{});
    case DataType::BFloat16: return f(BF16{});
    case DataType::Float64: return f(double{});
    case DataType::Float32: break;
  }
  return f(float{});
}

template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, F16>) return F16{f32_to_f16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, BF16>) return BF16{f32_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<int64_t>(v));  // wraps
  else return static_cast<T>(v);
}
template <class T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, F16>) return f16_to_f32(v.bits);
  else if constexpr (std::is_same_v<T, BF16>) return bf16_to_f32(v.bits);
  else return static_cast<double>(v);
}

// ---- data pattern and expected results --------------------------------------------------------
// Small integers, so sums are exact in every type (float16 and int8 included, up to 11 ranks);
// distinct per rank for up to 11 ranks, so a block landing at the wrong place is seen.

/// Input element i of `rank`.
double pattern(ReduceOp op, int rank, size_t i);
/// Reduction over ranks 0..n-1 of pattern(op, b, i).
double reduced(ReduceOp op, int n, size_t i);
/// Expected value of output element k on rank r; nullopt where the output is not defined.
/// `c` is the count the call takes. The input of rank b is pattern(op, b, i) at index i.
std::optional<double> expected(Coll coll, ReduceOp op, int n, int r, int root, size_t c, size_t k);

/// Writes value(i) to p[i] for i in [0, count), in the storage type of dt.
template <class Value>
void fill(DataType dt, void* p, size_t count, Value&& value) {
  with_type(dt, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(p);
    for (size_t i = 0; i < count; ++i) d[i] = from_double<T>(value(i));
  });
}

struct CheckResult {
  size_t wrong = 0;
  size_t first = 0;  // index of the first wrong element
  double got = 0, want = 0;
};

/// Compares p[0..count) with want(k) (integers exactly, floating types within rounding).
template <class Want>
CheckResult check(DataType dt, const void* p, size_t count, Want&& want) {
  CheckResult res;
  with_type(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* d = static_cast<const T*>(p);
    double tol = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, double> ? 1e-12 : 1e-2;
    for (size_t k = 0; k < count; ++k) {
      double w = want(k);
      double g = to_double(d[k]);
      bool ok;
      if constexpr (std::is_integral_v<T>) ok = d[k] == from_double<T>(w);
      else ok = std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w));
      if (!ok) {
        if (res.wrong == 0) {
          res.first = k;
          res.got = g;
          res.want = std::is_integral_v<T> ? to_double(from_double<T>(w)) : w;
        }
        ++res.wrong;
      }
    }
  });
  return res;
}

/// Sentinel written to outputs before the checked call: a value no collective produces here.
inline constexpr double kSentinel = -3.0;

}  // namespace strata::bench

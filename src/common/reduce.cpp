#include "common/reduce.hpp"

#include <algorithm>
#include <cstring>

namespace strata::kernels {
namespace {

template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<float16_t> {
  using type = float;
};
template <>
struct Acc<bfloat16_t> {
  using type = float;
};

template <class T>
inline typename Acc<T>::type load(const T& v) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>) return to_float(v);
  else return v;
}
template <class T, class A>
inline T store(A v) {
  if constexpr (std::is_same_v<T, float16_t>) return to_float16(v);
  else if constexpr (std::is_same_v<T, bfloat16_t>) return to_bfloat16(v);
  else return static_cast<T>(v);
}

template <class A>
inline A apply(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<A>(a + b);
    case ReduceOp::Prod: return static_cast<A>(a * b);
    case ReduceOp::Min: return std::min(a, b);
    case ReduceOp::Max: return std::max(a, b);
  }
  return a;
}

template <class T>
void reduce_typed(ReduceOp op, T* dst, const T* const* srcs, int n, size_t count, int divisor) {
  using A = typename Acc<T>::type;
  constexpr size_t kBlock = 512;
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t len = std::min(kBlock, count - base);
    for (size_t i = 0; i < len; ++i) acc[i] = load(srcs[0][base + i]);
    for (int s = 1; s < n; ++s) {
      const T* src = srcs[s] + base;
      for (size_t i = 0; i < len; ++i) acc[i] = apply<A>(op, acc[i], load(src[i]));
    }
    if (op == ReduceOp::Avg) {
      if constexpr (std::is_floating_point_v<A>) {
        for (size_t i = 0; i < len; ++i) acc[i] = acc[i] / static_cast<A>(divisor);
      }
    }
    T* d = dst + base;
    for (size_t i = 0; i < len; ++i) d[i] = store<T>(acc[i]);
  }
}

template <class T>
void dispatch(ReduceOp op, void* dst, const void* const* srcs, int n, size_t count, int divisor) {
  reduce_typed<T>(op, static_cast<T*>(dst), reinterpret_cast<const T* const*>(srcs), n, count, divisor);
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrcs, size_t count,
            int avg_divisor) {
  if (count == 0 || nsrcs <= 0) return;
  switch (dtype) {
    case DataType::Int8: return dispatch<int8_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::UInt8: return dispatch<uint8_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::Int32: return dispatch<int32_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::UInt32: return dispatch<uint32_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::Int64: return dispatch<int64_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::UInt64: return dispatch<uint64_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::Float16: return dispatch<float16_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::BFloat16: return dispatch<bfloat16_t>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::Float32: return dispatch<float>(op, dst, srcs, nsrcs, count, avg_divisor);
    case DataType::Float64: return dispatch<double>(op, dst, srcs, nsrcs, count, avg_divisor);
  }
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memcpy(dst, src, bytes);
}

const char* isa() { return "scalar"; }

}  // namespace strata::kernels

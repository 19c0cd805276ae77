// Element-wise reduction kernels: scalar, AVX2 and AVX-512, chosen at run time.
//
// Semantics shared by every instruction set (the tests hold them to it bit for bit):
// - Per element, sources are combined in order: acc = s0; acc = op(acc, s1); ...; acc = op(acc, s[n-1]).
//   Floating sums and products therefore equal a sequential accumulation, whatever the width.
// - float16/bfloat16 are widened to float32, accumulated over all sources, and rounded once
//   (round to nearest even) exactly like to_float16()/to_bfloat16(): a NaN stays a NaN
//   (float16 NaNs come out as the canonical quiet NaN with their sign, bfloat16 NaNs keep
//   their payload with the quiet bit set), subnormals are kept.
// - min/max follow std::min(acc, x) / std::max(acc, x): a NaN already in the accumulator
//   stays, a NaN arriving later is ignored; with equal values (-0 vs +0) the accumulator wins.
// - Bitwise and/or/xor (integers only) have scalar loops that the compiler vectorises.
// - Integers wrap (two's complement). Avg is meant for floating types (the API rejects it
//   for integers); here an integer Avg is the wrapped sum divided by avg_divisor, truncated.
// - dst may alias a source exactly: each block of every source is read before dst is written.
//
// The SIMD code lives in functions carrying __attribute__((target(...))), so the library is
// built with default flags and runs on any x86-64; nothing wider than the CPU supports is
// ever called.

#include "common/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/env.hpp"
#include "common/log.hpp"
#include "common/reduce_isa.hpp"

#if defined(__x86_64__)
#define STRATA_KERNELS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*()
// placeholders (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#else
#define STRATA_KERNELS_X86 0
#endif

namespace strata::kernels {
namespace {

template <class T>
constexpr bool kIsHalf = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;

// ---------------------------------------------------------------------------------------------
// Scalar: the portable fallback, the integer Avg, and the definition the SIMD code follows.
// ---------------------------------------------------------------------------------------------
namespace scalar {

template <class T>
using Acc = std::conditional_t<kIsHalf<T>, float, T>;

template <class T>
inline Acc<T> load(T v) {
  if constexpr (kIsHalf<T>) return to_float(v);
  else return v;
}

template <class T>
inline T store(Acc<T> v) {
  if constexpr (std::is_same_v<T, float16_t>) return to_float16(v);
  else if constexpr (std::is_same_v<T, bfloat16_t>) return to_bfloat16(v);
  else return v;
}

template <ReduceOp kOp, class A>
inline A combine(A acc, A x) {
  if constexpr (std::is_integral_v<A>) {
    // Wrap-around arithmetic without signed overflow: compute in the unsigned type.
    using U = std::make_unsigned_t<A>;
    if constexpr (kOp == ReduceOp::Sum || kOp == ReduceOp::Avg) return static_cast<A>(U(U(acc) + U(x)));
    if constexpr (kOp == ReduceOp::Prod) {
      // At least unsigned int, so that narrow types do not promote to (signed) int.
      using W = std::common_type_t<U, unsigned>;
      return static_cast<A>(U(W(U(acc)) * W(U(x))));
    }
    if constexpr (kOp == ReduceOp::BAnd) return static_cast<A>(acc & x);
    if constexpr (kOp == ReduceOp::BOr) return static_cast<A>(acc | x);
    if constexpr (kOp == ReduceOp::BXor) return static_cast<A>(acc ^ x);
  } else {
    if constexpr (kOp == ReduceOp::Sum || kOp == ReduceOp::Avg) return acc + x;
    if constexpr (kOp == ReduceOp::Prod) return acc * x;
  }
  if constexpr (kOp == ReduceOp::Min) return x < acc ? x : acc;
  if constexpr (kOp == ReduceOp::Max) return acc < x ? x : acc;
}

template <class A>
inline A average(A sum, int divisor) {
  if constexpr (std::is_floating_point_v<A>) {
    return sum / static_cast<A>(divisor);
  } else {
    if (divisor < 1) return sum;
    if constexpr (std::is_signed_v<A>) return static_cast<A>(static_cast<int64_t>(sum) / divisor);
    else return static_cast<A>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(divisor));
  }
}

template <class T, ReduceOp kOp>
void run(T* dst, const T* const* srcs, int n, size_t count, int divisor) {
  using A = Acc<T>;
  constexpr size_t kBlock = 256;
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    const T* s0 = srcs[0] + base;
    for (size_t i = 0; i < len; ++i) acc[i] = load(s0[i]);
    for (int s = 1; s < n; ++s) {
      const T* src = srcs[s] + base;
      for (size_t i = 0; i < len; ++i) acc[i] = combine<kOp>(acc[i], load(src[i]));
    }
    if constexpr (kOp == ReduceOp::Avg) {
      for (size_t i = 0; i < len; ++i) acc[i] = average(acc[i], divisor);
    }
    T* d = dst + base;
    for (size_t i = 0; i < len; ++i) d[i] = store<T>(acc[i]);
  }
}

template <class T>
void reduce_typed(ReduceOp op, T* dst, const T* const* srcs, int n, size_t count, int divisor) {
  switch (op) {
    case ReduceOp::Sum: return run<T, ReduceOp::Sum>(dst, srcs, n, count, divisor);
    case ReduceOp::Prod: return run<T, ReduceOp::Prod>(dst, srcs, n, count, divisor);
    case ReduceOp::Min: return run<T, ReduceOp::Min>(dst, srcs, n, count, divisor);
    case ReduceOp::Max: return run<T, ReduceOp::Max>(dst, srcs, n, count, divisor);
    case ReduceOp::Avg: return run<T, ReduceOp::Avg>(dst, srcs, n, count, divisor);
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      // Integers only (validate refuses them on floating types); the compiler vectorises
      // these loops itself, so they have no hand-written SIMD twins.
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::BAnd) return run<T, ReduceOp::BAnd>(dst, srcs, n, count, divisor);
        if (op == ReduceOp::BOr) return run<T, ReduceOp::BOr>(dst, srcs, n, count, divisor);
        return run<T, ReduceOp::BXor>(dst, srcs, n, count, divisor);
      }
      return;
  }
}

}  // namespace scalar

#if STRATA_KERNELS_X86

// Constants used by the half-precision stores.
constexpr uint32_t kBf16RoundBias = 0x7fff;  // + lsb of the kept half: round to nearest even
constexpr uint32_t kBf16QuietBit = 0x40;     // set on NaNs (as to_bfloat16 does)
constexpr uint16_t kF16CanonicalNaN = 0x7e00;
constexpr uint16_t kF16Inf = 0x7c00;

// Software prefetch for sources streamed from memory. Measured with bench/kernels_bench
// (2-vCPU EPYC, float32/int32 sum of two 16 MiB sources, median of 7): AVX-512 went from
// 37-38 to 41-45 GB/s (AVX2 ~40 without), while at 4 KiB the extra instructions cost ~20%;
// hence only for calls whose sources are larger than L2 (1 MiB here) and likely to come from DRAM.
constexpr size_t kPrefetchMinBytes = size_t{1} << 20;  // per source (beyond L2)
constexpr size_t kPrefetchDistance = 1024;             // bytes ahead of the loads
// AVX-512 reductions of 32- and 64-bit types write results of kStreamMinBytes and more with
// non-temporal stores: they leave the cache anyway, and streaming them skips reading every
// destination line first.

template <size_t kBytes>
__attribute__((always_inline)) inline void prefetch_ahead(const void* p) {
  const char* c = static_cast<const char*>(p) + kPrefetchDistance;
  for (size_t b = 0; b < kBytes; b += 64) _mm_prefetch(c + b, _MM_HINT_T0);
}

// ---------------------------------------------------------------------------------------------
// AVX2 (+FMA, F16C). One Vec<T> per element type: the accumulator vector V, how many
// elements one V covers, loads/stores (widening/rounding halves), the ops. Tails go through
// a small zero-filled buffer.
// ---------------------------------------------------------------------------------------------
namespace avx2 {

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c,bmi,bmi2")))
#define STRATA_AVX2_INLINE STRATA_AVX2 __attribute__((always_inline)) inline

template <class T>
struct Vec;

template <>
struct Vec<float> {
  using V = __m256;
  static constexpr size_t kLanes = 8;
  STRATA_AVX2_INLINE static V load(const float* p) { return _mm256_loadu_ps(p); }
  STRATA_AVX2_INLINE static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_ps(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  // minps(x, acc) = x < acc ? x : acc, i.e. std::min(acc, x) including NaNs and signed zeros.
  STRATA_AVX2_INLINE static V min(V acc, V x) { return _mm256_min_ps(x, acc); }
  STRATA_AVX2_INLINE static V max(V acc, V x) { return _mm256_max_ps(x, acc); }
  STRATA_AVX2_INLINE static V divisor(int d) { return _mm256_set1_ps(static_cast<float>(d)); }
  STRATA_AVX2_INLINE static V div(V a, V d) { return _mm256_div_ps(a, d); }
};

template <>
struct Vec<double> {
  using V = __m256d;
  static constexpr size_t kLanes = 4;
  STRATA_AVX2_INLINE static V load(const double* p) { return _mm256_loadu_pd(p); }
  STRATA_AVX2_INLINE static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_pd(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  STRATA_AVX2_INLINE static V min(V acc, V x) { return _mm256_min_pd(x, acc); }
  STRATA_AVX2_INLINE static V max(V acc, V x) { return _mm256_max_pd(x, acc); }
  STRATA_AVX2_INLINE static V divisor(int d) { return _mm256_set1_pd(static_cast<double>(d)); }
  STRATA_AVX2_INLINE static V div(V a, V d) { return _mm256_div_pd(a, d); }
};

// Halves: eight elements widened to one float vector; ops are those of Vec<float>.
struct HalfOps {
  using V = __m256;
  static constexpr size_t kLanes = 8;
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_ps(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  STRATA_AVX2_INLINE static V min(V acc, V x) { return _mm256_min_ps(x, acc); }
  STRATA_AVX2_INLINE static V max(V acc, V x) { return _mm256_max_ps(x, acc); }
  STRATA_AVX2_INLINE static V divisor(int d) { return _mm256_set1_ps(static_cast<float>(d)); }
  STRATA_AVX2_INLINE static V div(V a, V d) { return _mm256_div_ps(a, d); }
};

template <>
struct Vec<float16_t> : HalfOps {
  STRATA_AVX2_INLINE static V load(const float16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  STRATA_AVX2_INLINE static void store(float16_t* p, V v) {
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    // The hardware keeps NaN payload bits; to_float16 returns the canonical quiet NaN.
    const __m128i magnitude = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    const __m128i is_nan = _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(kF16Inf));
    const __m128i canonical =
        _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0x8000))), _mm_set1_epi16(kF16CanonicalNaN));
    h = _mm_blendv_epi8(h, canonical, is_nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
};

template <>
struct Vec<bfloat16_t> : HalfOps {
  STRATA_AVX2_INLINE static V load(const bfloat16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  STRATA_AVX2_INLINE static void store(bfloat16_t* p, V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i high = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(kBf16RoundBias), lsb);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(kBf16QuietBit));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, quiet, is_nan);
    // Eight 32-bit values (all below 0x10000) to eight 16-bit ones.
    const __m256i packed = _mm256_packus_epi32(r, r);
    const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(ordered));
  }
};

// Integers: one 256-bit register of T; add/mul wrap.
template <class T>
struct IntBase {
  using V = __m256i;
  static constexpr size_t kLanes = 32 / sizeof(T);
  STRATA_AVX2_INLINE static V load(const T* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  STRATA_AVX2_INLINE static void store(T* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};

// 8-bit products from two 16-bit multiplies: the low byte of (a * b) mod 2^16 only depends on
// the low bytes, so the even bytes come from a * b and the odd ones from (a >> 8) * (b >> 8).
STRATA_AVX2_INLINE __m256i mul_epi8(__m256i a, __m256i b) {
  const __m256i even = _mm256_mullo_epi16(a, b);
  const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)), _mm256_slli_epi16(odd, 8));
}

// 64-bit products mod 2^64 from 32x32->64 multiplies.
STRATA_AVX2_INLINE __m256i mul_epi64(__m256i a, __m256i b) {
  const __m256i low = _mm256_mul_epu32(a, b);
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b), _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
}

template <>
struct Vec<int8_t> : IntBase<int8_t> {
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_epi8(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return mul_epi8(a, b); }
  STRATA_AVX2_INLINE static V min(V a, V b) { return _mm256_min_epi8(a, b); }
  STRATA_AVX2_INLINE static V max(V a, V b) { return _mm256_max_epi8(a, b); }
};
template <>
struct Vec<uint8_t> : IntBase<uint8_t> {
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_epi8(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return mul_epi8(a, b); }
  STRATA_AVX2_INLINE static V min(V a, V b) { return _mm256_min_epu8(a, b); }
  STRATA_AVX2_INLINE static V max(V a, V b) { return _mm256_max_epu8(a, b); }
};
template <>
struct Vec<int32_t> : IntBase<int32_t> {
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return _mm256_mullo_epi32(a, b); }
  STRATA_AVX2_INLINE static V min(V a, V b) { return _mm256_min_epi32(a, b); }
  STRATA_AVX2_INLINE static V max(V a, V b) { return _mm256_max_epi32(a, b); }
};
template <>
struct Vec<uint32_t> : IntBase<uint32_t> {
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return _mm256_mullo_epi32(a, b); }
  STRATA_AVX2_INLINE static V min(V a, V b) { return _mm256_min_epu32(a, b); }
  STRATA_AVX2_INLINE static V max(V a, V b) { return _mm256_max_epu32(a, b); }
};
template <>
struct Vec<int64_t> : IntBase<int64_t> {
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_epi64(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return mul_epi64(a, b); }
  STRATA_AVX2_INLINE static V min(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  STRATA_AVX2_INLINE static V max(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
};
template <>
struct Vec<uint64_t> : IntBase<uint64_t> {
  // Unsigned compare = signed compare after flipping the top bit.
  STRATA_AVX2_INLINE static V greater(V a, V b) {
    const __m256i flip = _mm256_set1_epi64x(INT64_MIN);
    return _mm256_cmpgt_epi64(_mm256_xor_si256(a, flip), _mm256_xor_si256(b, flip));
  }
  STRATA_AVX2_INLINE static V add(V a, V b) { return _mm256_add_epi64(a, b); }
  STRATA_AVX2_INLINE static V mul(V a, V b) { return mul_epi64(a, b); }
  STRATA_AVX2_INLINE static V min(V a, V b) { return _mm256_blendv_epi8(a, b, greater(a, b)); }
  STRATA_AVX2_INLINE static V max(V a, V b) { return _mm256_blendv_epi8(a, b, greater(b, a)); }
};

template <class W, ReduceOp kOp>
STRATA_AVX2_INLINE typename W::V combine(typename W::V acc, typename W::V x) {
  if constexpr (kOp == ReduceOp::Sum || kOp == ReduceOp::Avg) return W::add(acc, x);
  if constexpr (kOp == ReduceOp::Prod) return W::mul(acc, x);
  if constexpr (kOp == ReduceOp::Min) return W::min(acc, x);
  if constexpr (kOp == ReduceOp::Max) return W::max(acc, x);
}

// A partial vector: copy the tail into a zeroed buffer, reduce it as a whole vector, copy
// back only `len` elements.
template <class T>
struct Tail {
  T v[Vec<T>::kLanes] = {};
};

template <class T, ReduceOp kOp>
STRATA_AVX2 void run(T* dst, const T* const* srcs, int n, size_t count, int divisor) {
  using W = Vec<T>;
  using V = typename W::V;
  constexpr size_t kL = W::kLanes;
  [[maybe_unused]] V dv{};
  if constexpr (kOp == ReduceOp::Avg) dv = W::divisor(divisor);
  constexpr size_t kBlockBytes = 4 * kL * sizeof(T);  // per source and iteration
  const bool prefetch = count * sizeof(T) >= kPrefetchMinBytes;
  size_t i = 0;
  for (; i + 4 * kL <= count; i += 4 * kL) {
    const T* s0 = srcs[0] + i;
    if (prefetch) prefetch_ahead<kBlockBytes>(s0);
    V a0 = W::load(s0), a1 = W::load(s0 + kL), a2 = W::load(s0 + 2 * kL), a3 = W::load(s0 + 3 * kL);
    for (int s = 1; s < n; ++s) {
      const T* p = srcs[s] + i;
      if (prefetch) prefetch_ahead<kBlockBytes>(p);
      a0 = combine<W, kOp>(a0, W::load(p));
      a1 = combine<W, kOp>(a1, W::load(p + kL));
      a2 = combine<W, kOp>(a2, W::load(p + 2 * kL));
      a3 = combine<W, kOp>(a3, W::load(p + 3 * kL));
    }
    if constexpr (kOp == ReduceOp::Avg) {
      a0 = W::div(a0, dv), a1 = W::div(a1, dv), a2 = W::div(a2, dv), a3 = W::div(a3, dv);
    }
    W::store(dst + i, a0), W::store(dst + i + kL, a1), W::store(dst + i + 2 * kL, a2);
    W::store(dst + i + 3 * kL, a3);
  }
  for (; i + kL <= count; i += kL) {
    V a = W::load(srcs[0] + i);
    for (int s = 1; s < n; ++s) a = combine<W, kOp>(a, W::load(srcs[s] + i));
    if constexpr (kOp == ReduceOp::Avg) a = W::div(a, dv);
    W::store(dst + i, a);
  }
  if (i < count) {
    const size_t len = count - i;
    Tail<T> in, out;
    std::memcpy(in.v, srcs[0] + i, len * sizeof(T));
    V a = W::load(in.v);
    for (int s = 1; s < n; ++s) {
      std::memcpy(in.v, srcs[s] + i, len * sizeof(T));
      a = combine<W, kOp>(a, W::load(in.v));
    }
    if constexpr (kOp == ReduceOp::Avg) a = W::div(a, dv);
    W::store(out.v, a);
    std::memcpy(dst + i, out.v, len * sizeof(T));
  }
}

template <class T>
STRATA_AVX2 void reduce_typed(ReduceOp op, T* dst, const T* const* srcs, int n, size_t count, int divisor) {
  switch (op) {
    case ReduceOp::Sum: return run<T, ReduceOp::Sum>(dst, srcs, n, count, divisor);
    case ReduceOp::Prod: return run<T, ReduceOp::Prod>(dst, srcs, n, count, divisor);
    case ReduceOp::Min: return run<T, ReduceOp::Min>(dst, srcs, n, count, divisor);
    case ReduceOp::Max: return run<T, ReduceOp::Max>(dst, srcs, n, count, divisor);
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<T>) return scalar::run<T, ReduceOp::Avg>(dst, srcs, n, count, divisor);
      else return run<T, ReduceOp::Avg>(dst, srcs, n, count, divisor);
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor: return scalar::reduce_typed<T>(op, dst, srcs, n, count, divisor);
  }
}

}  // namespace avx2

// ---------------------------------------------------------------------------------------------
// AVX-512 (F, BW, VL, DQ; BF16 when present). Same shape as AVX2 with 512-bit vectors and
// masked loads/stores for the tail.
// ---------------------------------------------------------------------------------------------
namespace avx512 {

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2")))
#define STRATA_AVX512_INLINE STRATA_AVX512 __attribute__((always_inline)) inline

// The low `len` bits set; len < number of lanes.
template <class M>
STRATA_AVX512_INLINE M low_bits(size_t len) {
  return static_cast<M>((uint64_t{1} << len) - 1);
}

template <class T>
struct Vec;

template <>
struct Vec<float> {
  using V = __m512;
  static constexpr size_t kLanes = 16;
  STRATA_AVX512_INLINE static V load(const float* p) { return _mm512_loadu_ps(p); }
  STRATA_AVX512_INLINE static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  STRATA_AVX512_INLINE static void stream(float* p, V v) { _mm512_stream_ps(p, v); }
  STRATA_AVX512_INLINE static V load_n(const float* p, size_t len) {
    return _mm512_maskz_loadu_ps(low_bits<__mmask16>(len), p);
  }
  STRATA_AVX512_INLINE static void store_n(float* p, V v, size_t len) {
    _mm512_mask_storeu_ps(p, low_bits<__mmask16>(len), v);
  }
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_ps(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  STRATA_AVX512_INLINE static V min(V acc, V x) { return _mm512_min_ps(x, acc); }
  STRATA_AVX512_INLINE static V max(V acc, V x) { return _mm512_max_ps(x, acc); }
  STRATA_AVX512_INLINE static V divisor(int d) { return _mm512_set1_ps(static_cast<float>(d)); }
  STRATA_AVX512_INLINE static V div(V a, V d) { return _mm512_div_ps(a, d); }
};

template <>
struct Vec<double> {
  using V = __m512d;
  static constexpr size_t kLanes = 8;
  STRATA_AVX512_INLINE static V load(const double* p) { return _mm512_loadu_pd(p); }
  STRATA_AVX512_INLINE static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  STRATA_AVX512_INLINE static void stream(double* p, V v) { _mm512_stream_pd(p, v); }
  STRATA_AVX512_INLINE static V load_n(const double* p, size_t len) {
    return _mm512_maskz_loadu_pd(low_bits<__mmask8>(len), p);
  }
  STRATA_AVX512_INLINE static void store_n(double* p, V v, size_t len) {
    _mm512_mask_storeu_pd(p, low_bits<__mmask8>(len), v);
  }
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_pd(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  STRATA_AVX512_INLINE static V min(V acc, V x) { return _mm512_min_pd(x, acc); }
  STRATA_AVX512_INLINE static V max(V acc, V x) { return _mm512_max_pd(x, acc); }
  STRATA_AVX512_INLINE static V divisor(int d) { return _mm512_set1_pd(static_cast<double>(d)); }
  STRATA_AVX512_INLINE static V div(V a, V d) { return _mm512_div_pd(a, d); }
};

// Halves: sixteen elements (256 bits) widened to one float vector.
struct HalfOps {
  using V = __m512;
  static constexpr size_t kLanes = 16;
  STRATA_AVX512_INLINE static __m256i load_bits(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  }
  STRATA_AVX512_INLINE static __m256i load_bits_n(const void* p, size_t len) {
    return _mm256_maskz_loadu_epi16(low_bits<__mmask16>(len), p);
  }
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_ps(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  STRATA_AVX512_INLINE static V min(V acc, V x) { return _mm512_min_ps(x, acc); }
  STRATA_AVX512_INLINE static V max(V acc, V x) { return _mm512_max_ps(x, acc); }
  STRATA_AVX512_INLINE static V divisor(int d) { return _mm512_set1_ps(static_cast<float>(d)); }
  STRATA_AVX512_INLINE static V div(V a, V d) { return _mm512_div_ps(a, d); }
};

template <>
struct Vec<float16_t> : HalfOps {
  STRATA_AVX512_INLINE static V widen(__m256i h) { return _mm512_cvtph_ps(h); }
  STRATA_AVX512_INLINE static __m256i narrow(V v) {
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // The hardware keeps NaN payload bits; to_float16 returns the canonical quiet NaN.
    const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m256i canonical = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0x8000))),
                                              _mm256_set1_epi16(kF16CanonicalNaN));
    return _mm256_mask_mov_epi16(h, is_nan, canonical);
  }
  STRATA_AVX512_INLINE static V load(const float16_t* p) { return widen(load_bits(p)); }
  STRATA_AVX512_INLINE static V load_n(const float16_t* p, size_t len) { return widen(load_bits_n(p, len)); }
  STRATA_AVX512_INLINE static void store(float16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  STRATA_AVX512_INLINE static void store_n(float16_t* p, V v, size_t len) {
    _mm256_mask_storeu_epi16(p, low_bits<__mmask16>(len), narrow(v));
  }
};

// bfloat16 rounding in integer arithmetic, exactly as to_bfloat16().
STRATA_AVX512_INLINE __m256i narrow_bf16_exact(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(kBf16RoundBias), lsb);
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(kBf16QuietBit));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, is_nan, quiet));
}

// kHw: use VCVTNEPS2BF16 (AVX512_BF16). It rounds to nearest even and quiets NaNs like
// to_bfloat16, but flushes subnormal inputs to zero, so vectors holding a float32 subnormal
// take the integer path.
template <bool kHw>
struct Bf16 : HalfOps {
  STRATA_AVX512_INLINE static V widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  STRATA_AVX512_INLINE static __m256i narrow(V v) {
    if constexpr (kHw) {
      const __m512i u = _mm512_castps_si512(v);
      const __mmask16 subnormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                                  _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
      if (__builtin_expect(subnormal == 0, 1)) return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    }
    return narrow_bf16_exact(v);
  }
  STRATA_AVX512_INLINE static V load(const bfloat16_t* p) { return widen(load_bits(p)); }
  STRATA_AVX512_INLINE static V load_n(const bfloat16_t* p, size_t len) { return widen(load_bits_n(p, len)); }
  STRATA_AVX512_INLINE static void store(bfloat16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  STRATA_AVX512_INLINE static void store_n(bfloat16_t* p, V v, size_t len) {
    _mm256_mask_storeu_epi16(p, low_bits<__mmask16>(len), narrow(v));
  }
};

template <class T>
struct IntBase {
  using V = __m512i;
  static constexpr size_t kLanes = 64 / sizeof(T);
  STRATA_AVX512_INLINE static V load(const T* p) { return _mm512_loadu_si512(p); }
  STRATA_AVX512_INLINE static void store(T* p, V v) { _mm512_storeu_si512(p, v); }
  STRATA_AVX512_INLINE static void stream(T* p, V v) { _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v); }
  STRATA_AVX512_INLINE static V load_n(const T* p, size_t len) {
    if constexpr (sizeof(T) == 1) return _mm512_maskz_loadu_epi8(low_bits<__mmask64>(len), p);
    if constexpr (sizeof(T) == 4) return _mm512_maskz_loadu_epi32(low_bits<__mmask16>(len), p);
    if constexpr (sizeof(T) == 8) return _mm512_maskz_loadu_epi64(low_bits<__mmask8>(len), p);
  }
  STRATA_AVX512_INLINE static void store_n(T* p, V v, size_t len) {
    if constexpr (sizeof(T) == 1) _mm512_mask_storeu_epi8(p, low_bits<__mmask64>(len), v);
    if constexpr (sizeof(T) == 4) _mm512_mask_storeu_epi32(p, low_bits<__mmask16>(len), v);
    if constexpr (sizeof(T) == 8) _mm512_mask_storeu_epi64(p, low_bits<__mmask8>(len), v);
  }
};

STRATA_AVX512_INLINE __m512i mul_epi8(__m512i a, __m512i b) {
  const __m512i even = _mm512_mullo_epi16(a, b);
  const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
  return _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi16(0x00ff)), _mm512_slli_epi16(odd, 8));
}

template <>
struct Vec<int8_t> : IntBase<int8_t> {
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_epi8(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return mul_epi8(a, b); }
  STRATA_AVX512_INLINE static V min(V a, V b) { return _mm512_min_epi8(a, b); }
  STRATA_AVX512_INLINE static V max(V a, V b) { return _mm512_max_epi8(a, b); }
};
template <>
struct Vec<uint8_t> : IntBase<uint8_t> {
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_epi8(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return mul_epi8(a, b); }
  STRATA_AVX512_INLINE static V min(V a, V b) { return _mm512_min_epu8(a, b); }
  STRATA_AVX512_INLINE static V max(V a, V b) { return _mm512_max_epu8(a, b); }
};
template <>
struct Vec<int32_t> : IntBase<int32_t> {
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mullo_epi32(a, b); }
  STRATA_AVX512_INLINE static V min(V a, V b) { return _mm512_min_epi32(a, b); }
  STRATA_AVX512_INLINE static V max(V a, V b) { return _mm512_max_epi32(a, b); }
};
template <>
struct Vec<uint32_t> : IntBase<uint32_t> {
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mullo_epi32(a, b); }
  STRATA_AVX512_INLINE static V min(V a, V b) { return _mm512_min_epu32(a, b); }
  STRATA_AVX512_INLINE static V max(V a, V b) { return _mm512_max_epu32(a, b); }
};
template <>
struct Vec<int64_t> : IntBase<int64_t> {
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_epi64(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mullo_epi64(a, b); }
  STRATA_AVX512_INLINE static V min(V a, V b) { return _mm512_min_epi64(a, b); }
  STRATA_AVX512_INLINE static V max(V a, V b) { return _mm512_max_epi64(a, b); }
};
template <>
struct Vec<uint64_t> : IntBase<uint64_t> {
  STRATA_AVX512_INLINE static V add(V a, V b) { return _mm512_add_epi64(a, b); }
  STRATA_AVX512_INLINE static V mul(V a, V b) { return _mm512_mullo_epi64(a, b); }
  STRATA_AVX512_INLINE static V min(V a, V b) { return _mm512_min_epu64(a, b); }
  STRATA_AVX512_INLINE static V max(V a, V b) { return _mm512_max_epu64(a, b); }
};

template <class W, ReduceOp kOp>
STRATA_AVX512_INLINE typename W::V combine(typename W::V acc, typename W::V x) {
  if constexpr (kOp == ReduceOp::Sum || kOp == ReduceOp::Avg) return W::add(acc, x);
  if constexpr (kOp == ReduceOp::Prod) return W::mul(acc, x);
  if constexpr (kOp == ReduceOp::Min) return W::min(acc, x);
  if constexpr (kOp == ReduceOp::Max) return W::max(acc, x);
}

// Elements [begin, count) of the reduction.
template <class W, class T, ReduceOp kOp, bool kStream>
STRATA_AVX512 void run_blocks(T* dst, const T* const* srcs, int n, size_t begin, size_t count, int divisor) {
  using V = typename W::V;
  constexpr size_t kL = W::kLanes;
  [[maybe_unused]] V dv{};
  if constexpr (kOp == ReduceOp::Avg) dv = W::divisor(divisor);
  constexpr size_t kBlockBytes = 4 * kL * sizeof(T);  // per source and iteration
  const bool prefetch = count * sizeof(T) >= kPrefetchMinBytes;
  size_t i = begin;
  for (; i + 4 * kL <= count; i += 4 * kL) {
    const T* s0 = srcs[0] + i;
    if (prefetch) prefetch_ahead<kBlockBytes>(s0);
    V a0 = W::load(s0), a1 = W::load(s0 + kL), a2 = W::load(s0 + 2 * kL), a3 = W::load(s0 + 3 * kL);
    for (int s = 1; s < n; ++s) {
      const T* p = srcs[s] + i;
      if (prefetch) prefetch_ahead<kBlockBytes>(p);
      a0 = combine<W, kOp>(a0, W::load(p));
      a1 = combine<W, kOp>(a1, W::load(p + kL));
      a2 = combine<W, kOp>(a2, W::load(p + 2 * kL));
      a3 = combine<W, kOp>(a3, W::load(p + 3 * kL));
    }
    if constexpr (kOp == ReduceOp::Avg) {
      a0 = W::div(a0, dv), a1 = W::div(a1, dv), a2 = W::div(a2, dv), a3 = W::div(a3, dv);
    }
    if constexpr (kStream) {
      W::stream(dst + i, a0), W::stream(dst + i + kL, a1), W::stream(dst + i + 2 * kL, a2);
      W::stream(dst + i + 3 * kL, a3);
    } else {
      W::store(dst + i, a0), W::store(dst + i + kL, a1), W::store(dst + i + 2 * kL, a2);
      W::store(dst + i + 3 * kL, a3);
    }
  }
  // The streamed stores are ordered before any later store (the flag that publishes them).
  if constexpr (kStream) _mm_sfence();
  for (; i + kL <= count; i += kL) {
    V a = W::load(srcs[0] + i);
    for (int s = 1; s < n; ++s) a = combine<W, kOp>(a, W::load(srcs[s] + i));
    if constexpr (kOp == ReduceOp::Avg) a = W::div(a, dv);
    W::store(dst + i, a);
  }
  if (i < count) {
    const size_t len = count - i;
    V a = W::load_n(srcs[0] + i, len);
    for (int s = 1; s < n; ++s) a = combine<W, kOp>(a, W::load_n(srcs[s] + i, len));
    if constexpr (kOp == ReduceOp::Avg) a = W::div(a, dv);
    W::store_n(dst + i, a, len);
  }
}

template <class W>
concept Streams = requires(typename W::V v) {
  W::stream(nullptr, v);
};

template <class W, class T, ReduceOp kOp>
STRATA_AVX512 void run(T* dst, const T* const* srcs, int n, size_t count, int divisor, Stores stores) {
  if constexpr (Streams<W>) {
    const auto addr = reinterpret_cast<uintptr_t>(dst);
    const bool stream = stores == Stores::Streamed || count * sizeof(T) >= kStreamMinBytes;
    if (stream && addr % sizeof(T) == 0) {
      // Streamed stores need a 64-byte aligned destination: the elements before the first
      // aligned one go the usual way.
      const size_t head = std::min(count, ((64 - addr % 64) % 64) / sizeof(T));
      run_blocks<W, T, kOp, false>(dst, srcs, n, 0, head, divisor);
      return run_blocks<W, T, kOp, true>(dst, srcs, n, head, count, divisor);
    }
  }
  run_blocks<W, T, kOp, false>(dst, srcs, n, 0, count, divisor);
}

template <class W, class T>
STRATA_AVX512 void reduce_with(ReduceOp op, T* dst, const T* const* srcs, int n, size_t count, int divisor,
                               Stores stores) {
  switch (op) {
    case ReduceOp::Sum: return run<W, T, ReduceOp::Sum>(dst, srcs, n, count, divisor, stores);
    case ReduceOp::Prod: return run<W, T, ReduceOp::Prod>(dst, srcs, n, count, divisor, stores);
    case ReduceOp::Min: return run<W, T, ReduceOp::Min>(dst, srcs, n, count, divisor, stores);
    case ReduceOp::Max: return run<W, T, ReduceOp::Max>(dst, srcs, n, count, divisor, stores);
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<T>) return scalar::run<T, ReduceOp::Avg>(dst, srcs, n, count, divisor);
      else return run<W, T, ReduceOp::Avg>(dst, srcs, n, count, divisor, stores);
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor: return scalar::reduce_typed<T>(op, dst, srcs, n, count, divisor);
  }
}

}  // namespace avx512

struct CpuFeatures {
  bool avx2 = false;        // AVX2 + FMA + F16C
  bool avx512 = false;      // AVX-512 F + BW + VL + DQ
  bool avx512bf16 = false;  // VCVTNEPS2BF16
};

const CpuFeatures& cpu() {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0).
    // F16C from CPUID leaf 1 (not every compiler's __builtin_cpu_supports knows "f16c").
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    return f;
  }();
  return features;
}

// Copy with non-temporal stores (they bypass the caches and skip reading the destination
// lines first): align the destination to a cache line, stream 256-byte blocks, fence, then the
// tail with memcpy. The fence makes the streamed stores ordered before any later store (a
// flag that publishes the data).
STRATA_AVX2 void copy_streaming(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 256; d += 256, s += 256, bytes -= 256) {
    const __m256i* in = reinterpret_cast<const __m256i*>(s);
    __m256i* out = reinterpret_cast<__m256i*>(d);
    const __m256i v0 = _mm256_loadu_si256(in), v1 = _mm256_loadu_si256(in + 1), v2 = _mm256_loadu_si256(in + 2),
                  v3 = _mm256_loadu_si256(in + 3), v4 = _mm256_loadu_si256(in + 4), v5 = _mm256_loadu_si256(in + 5),
                  v6 = _mm256_loadu_si256(in + 6), v7 = _mm256_loadu_si256(in + 7);
    _mm256_stream_si256(out, v0), _mm256_stream_si256(out + 1, v1), _mm256_stream_si256(out + 2, v2);
    _mm256_stream_si256(out + 3, v3), _mm256_stream_si256(out + 4, v4), _mm256_stream_si256(out + 5, v5);
    _mm256_stream_si256(out + 6, v6), _mm256_stream_si256(out + 7, v7);
  }
  _mm_sfence();
  std::memcpy(d, s, bytes);
}

#endif  // STRATA_KERNELS_X86

template <class T>
void reduce_typed(Isa isa, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count, int divisor,
                  Stores stores) {
  T* d = static_cast<T*>(dst);
  const T* const* s = reinterpret_cast<const T* const*>(srcs);
#if STRATA_KERNELS_X86
  if (isa == Isa::Avx512) {
    if constexpr (std::is_same_v<T, bfloat16_t>) {
      if (cpu().avx512bf16) return avx512::reduce_with<avx512::Bf16<true>>(op, d, s, n, count, divisor, stores);
      return avx512::reduce_with<avx512::Bf16<false>>(op, d, s, n, count, divisor, stores);
    } else {
      return avx512::reduce_with<avx512::Vec<T>>(op, d, s, n, count, divisor, stores);
    }
  }
  if (isa == Isa::Avx2) return avx2::reduce_typed<T>(op, d, s, n, count, divisor);
#endif
  (void)isa, (void)stores;
  scalar::reduce_typed<T>(op, d, s, n, count, divisor);
}

Isa choose(const std::string& requested) {
  const Isa best = best_supported();
  if (requested.empty() || requested == "auto") return best;
  std::optional<Isa> want = parse_isa(requested);
  if (!want) {
    STRATA_LOG(
        Warn, "STRATA_KERNELS=" << requested << " is not one of scalar, avx2, avx512, auto; using " << to_string(best));
    return best;
  }
  Isa use = *want;
  while (!supported(use)) use = static_cast<Isa>(static_cast<int>(use) - 1);  // Scalar is always supported
  if (use != *want) {
    STRATA_LOG(Warn, "STRATA_KERNELS=" << requested << ": this CPU does not support it; using " << to_string(use));
  }
  return use;
}

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "unknown";
}

std::optional<Isa> parse_isa(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (Isa isa : kAllIsas) {
    if (lower == to_string(isa)) return isa;
  }
  return std::nullopt;
}

bool supported(Isa isa) {
#if STRATA_KERNELS_X86
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return cpu().avx2;
    case Isa::Avx512: return cpu().avx512;
  }
  return false;
#else
  return isa == Isa::Scalar;
#endif
}

Isa best_supported() {
  if (supported(Isa::Avx512)) return Isa::Avx512;
  if (supported(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

Isa active() {
  static const Isa isa = choose(Env::get().kernels);
  return isa;
}

void reduce(Isa isa, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrcs, size_t count,
            int avg_divisor, Stores stores) {
  if (count == 0 || nsrcs <= 0) return;
  switch (dtype) {
    case DataType::Int8: return reduce_typed<int8_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::UInt8: return reduce_typed<uint8_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::Int32: return reduce_typed<int32_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::UInt32: return reduce_typed<uint32_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::Int64: return reduce_typed<int64_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::UInt64: return reduce_typed<uint64_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::Float16: return reduce_typed<float16_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::BFloat16: return reduce_typed<bfloat16_t>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::Float32: return reduce_typed<float>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
    case DataType::Float64: return reduce_typed<double>(isa, op, dst, srcs, nsrcs, count, avg_divisor, stores);
  }
}

void reduce(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrcs, size_t count, int avg_divisor,
            Stores stores) {
  reduce(active(), dtype, op, dst, srcs, nsrcs, count, avg_divisor, stores);
}

void copy_uncached(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
#if STRATA_KERNELS_X86
  if (active() != Isa::Scalar) return copy_streaming(dst, src, bytes);
#endif
  std::memcpy(dst, src, bytes);
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
#if STRATA_KERNELS_X86
  // Measured with bench/kernels_bench on the project's machine kind (2-vCPU EPYC, median of 5,
  // bytes read + written): memcpy wins up to 4 MiB (83 vs 71 GB/s: the destination stays in
  // cache), streaming from 8 MiB (8 MiB 67 vs 63, 16 MiB 62 vs 43, 64 MiB 30 vs 28 GB/s).
  constexpr size_t kStreamingMinBytes = size_t{8} << 20;
  if (bytes >= kStreamingMinBytes && active() != Isa::Scalar) return copy_streaming(dst, src, bytes);
#endif
  std::memcpy(dst, src, bytes);
}

const char* isa() { return to_string(active()); }

}  // namespace strata::kernels

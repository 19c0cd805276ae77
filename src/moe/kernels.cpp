#include "moe/kernels.hpp"

#include "common/reduce.hpp"
#include "common/reduce_isa.hpp"

#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*()
// placeholders (GCC bug 105593, fixed in 13; as in common/reduce.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

// Combine is memory bound, so these loops only have to keep up with the copy bandwidth: plain
// loops that the compiler vectorises, cloned per instruction set (ifunc picks one at load
// time). The element order of every sum is fixed (one row after another), so the result is
// the same bits whichever clone runs.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define STRATA_MOE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATA_MOE_CLONES
#endif

namespace strata::moe::kernels {
namespace {

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // Quiet NaNs stay NaN (the rounding add could carry them into infinity).
  uint32_t nan = ((u & 0x7f800000u) == 0x7f800000u) & ((u & 0x007fffffu) != 0);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t q = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(nan ? q : r);
}

STRATA_MOE_CLONES
void acc_bf16(float* __restrict acc, const uint16_t* __restrict row, float w, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += w * bf16_to_f32(row[i]);
}

STRATA_MOE_CLONES
void acc_f32(float* __restrict acc, const float* __restrict row, float w, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += w * row[i];
}

STRATA_MOE_CLONES
void store_bf16(uint16_t* __restrict out, const float* __restrict acc, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(acc[i]);
}

#if defined(__x86_64__)
// F16C converts exactly (both directions, round to nearest even), so it gives the same bits
// as strata::to_float / to_float16.
__attribute__((target("avx2,f16c"))) void acc_f16_f16c(float* acc, const uint16_t* row, float w, size_t n) {
  const __m256 vw = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
    __m256 a = _mm256_loadu_ps(acc + i);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(a, _mm256_mul_ps(vw, x)));
  }
  for (; i < n; ++i) acc[i] += w * to_float(float16_t{row[i]});
}

__attribute__((target("avx2,f16c"))) void store_f16_f16c(uint16_t* out, const float* acc, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(acc + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = to_float16(acc[i]).bits;
}

bool have_f16c() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok;
}

// The combine's hot loop for bfloat16: 128 columns at a time, the partial sums of all rows in
// eight registers, so each output element costs one read per row and one write (the float32
// row of accumulate()/store() went through L1 n+2 times per element). Arithmetic is that of
// acc_bf16 and store_bf16: per row w*x then product + sum, in row order, no fused
// multiply-add, and the product first (when both are NaN, x86 keeps the first operand's
// payload, as acc_bf16's compiled loop does); then the same integer rounding.
#define STRATA_MOE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

STRATA_MOE_AVX512 inline __m512 widen_bf16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// f32_to_bf16, sixteen at a time (the constants are hoisted once inlined).
STRATA_MOE_AVX512 inline __m256i round_bf16(__m512 a) {
  __m512i v = _mm512_castps_si512(a);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(v, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __m512i q = _mm512_or_si512(_mm512_srli_epi32(v, 16), _mm512_set1_epi32(0x40));
  __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, q));
}

STRATA_MOE_AVX512 void wsum_bf16_avx512(uint16_t* out, const uint16_t* const* rows, const float* w, int n, size_t H,
                                        bool stream) {
  constexpr size_t kVec = 16, kUnroll = 8, kChunk = kVec * kUnroll;
  // Streaming stores need 32-byte aligned destinations; chunks are 256 bytes, so the first
  // decides for all.
  stream = stream && reinterpret_cast<uintptr_t>(out) % 32 == 0;
  size_t i = 0;
  for (; i + kChunk <= H; i += kChunk) {
    __m512 a[kUnroll];
    for (size_t u = 0; u < kUnroll; ++u) a[u] = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __m512 vw = _mm512_set1_ps(w[j]);
      const uint16_t* r = rows[j] + i;
      for (size_t u = 0; u < kUnroll; ++u) {
        __m512 x = widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + u * kVec)));
        a[u] = _mm512_add_ps(_mm512_mul_ps(vw, x), a[u]);
      }
    }
    for (size_t u = 0; u < kUnroll; ++u) {
      auto* o = reinterpret_cast<__m256i*>(out + i + u * kVec);
      if (stream) _mm256_stream_si256(o, round_bf16(a[u]));
      else _mm256_storeu_si256(o, round_bf16(a[u]));
    }
  }
  // The last columns 16 at a time, masked: the same instructions, so the same bits.
  for (; i < H; i += kVec) {
    const __mmask16 m = H - i >= kVec ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (H - i)) - 1);
    __m512 a = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      __m512 x = widen_bf16(_mm256_maskz_loadu_epi16(m, rows[j] + i));
      a = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(w[j]), x), a);
    }
    _mm256_mask_storeu_epi16(out + i, m, round_bf16(a));
  }
}

// A dispatch row is a few KiB: strata::kernels::copy_uncached fences after each one, which
// waits for the row's write-combining buffers to drain before the next row starts; one fence
// per call is enough (nothing reads the rows before sent_to is published).
STRATA_MOE_AVX512 void copy_stream_avx512(std::byte* d, const std::byte* s, size_t bytes) {
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 256; d += 256, s += 256, bytes -= 256) {
    __m512i v0 = _mm512_loadu_si512(s), v1 = _mm512_loadu_si512(s + 64), v2 = _mm512_loadu_si512(s + 128),
            v3 = _mm512_loadu_si512(s + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), v0);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64), v1);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 128), v2);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 192), v3);
  }
  std::memcpy(d, s, bytes);
}

// The kernel set the collectives use (STRATA_KERNELS may lower it; it implies F, BW and VL).
bool have_avx512() {
  static const bool ok = strata::kernels::active() == strata::kernels::Isa::Avx512;
  return ok;
}
#else
bool have_f16c() { return false; }
bool have_avx512() { return false; }
#endif

}  // namespace

void accumulate(DataType dt, float* acc, const void* row, float w, size_t n) {
  switch (dt) {
    case DataType::BFloat16: acc_bf16(acc, static_cast<const uint16_t*>(row), w, n); return;
    case DataType::Float32: acc_f32(acc, static_cast<const float*>(row), w, n); return;
    case DataType::Float16: {
      auto* r = static_cast<const uint16_t*>(row);
#if defined(__x86_64__)
      if (have_f16c()) return acc_f16_f16c(acc, r, w, n);
#endif
      for (size_t i = 0; i < n; ++i) acc[i] += w * to_float(float16_t{r[i]});
      return;
    }
    default: return;
  }
}

void store(DataType dt, void* out, const float* acc, size_t n) {
  switch (dt) {
    case DataType::BFloat16: store_bf16(static_cast<uint16_t*>(out), acc, n); return;
    case DataType::Float32: std::memcpy(out, acc, n * sizeof(float)); return;
    case DataType::Float16: {
      auto* o = static_cast<uint16_t*>(out);
#if defined(__x86_64__)
      if (have_f16c()) return store_f16_f16c(o, acc, n);
#endif
      for (size_t i = 0; i < n; ++i) o[i] = to_float16(acc[i]).bits;
      return;
    }
    default: return;
  }
}

void weighted_sum(DataType dt, void* out, const void* const* rows, const float* w, int n, size_t H, bool stream) {
#if defined(__x86_64__)
  if (dt == DataType::BFloat16 && have_avx512())
    return wsum_bf16_avx512(static_cast<uint16_t*>(out), reinterpret_cast<const uint16_t* const*>(rows), w, n, H,
                            stream);
#endif
  (void)stream;
  // Column blocks small enough for L1, through the per-row kernels (elementwise, so blocking
  // does not change any sum).
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  const size_t esz = dtype_size(dt);
  for (size_t i = 0; i < H; i += kBlock) {
    const size_t len = std::min(kBlock, H - i);
    std::fill_n(acc, len, 0.0f);
    for (int j = 0; j < n; ++j) accumulate(dt, acc, static_cast<const std::byte*>(rows[j]) + i * esz, w[j], len);
    store(dt, static_cast<std::byte*>(out) + i * esz, acc, len);
  }
}

void copy_streaming_unfenced(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (have_avx512()) return copy_stream_avx512(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
#endif
  strata::kernels::copy_uncached(dst, src, bytes);
}

void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace strata::moe::kernels

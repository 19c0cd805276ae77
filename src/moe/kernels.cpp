#include "moe/kernels.hpp"

#include <immintrin.h>

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
#else
bool have_f16c() { return false; }
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

}  // namespace strata::moe::kernels

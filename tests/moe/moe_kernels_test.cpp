// The combine's row kernel (moe::kernels::weighted_sum) against a scalar model written here
// and against the per-row kernels it replaced (accumulate then store): every output bit
// equal (a NaN may carry either NaN operand's payload), for every payload type, row count, width (vector body and
// tails), special values (NaN, infinities, signed zeros, subnormals, rounding ties, overflow) and both store kinds.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "moe/kernels.hpp"

namespace {

using strata::DataType;
namespace mk = strata::moe::kernels;

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// float32 -> bfloat16, round to nearest even, NaN kept quiet: the model of DESIGN §5.
uint16_t model_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// A bfloat16 payload mixing ordinary values with the ones that break careless kernels.
uint16_t draw_bf16(std::mt19937& g) {
  static const uint16_t kSpecial[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1,
                                      0x0001, 0x8001, 0x007f, 0x7f7f, 0xff7f, 0x3f80, 0xbf80};
  uint32_t r = g();
  if (r % 16 == 0) return kSpecial[(r >> 8) % (sizeof kSpecial / sizeof kSpecial[0])];
  return static_cast<uint16_t>(r >> 16);
}

float draw_weight(std::mt19937& g) {
  uint32_t r = g();
  switch (r % 8) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 1.0f;
    case 3: return bits_to_f32(0x7f000000u);  // large: products overflow
    default: return std::ldexp(static_cast<float>(r >> 8) / 16777216.0f, -static_cast<int>(r % 5)) * 0.5f;
  }
}

struct Case {
  std::vector<std::vector<uint16_t>> rows16;
  std::vector<std::vector<float>> rows32;
  std::vector<float> w;
  std::vector<const void*> ptrs;
};

Case make_case(std::mt19937& g, DataType dt, int n, size_t H) {
  Case c;
  for (int j = 0; j < n; ++j) {
    c.w.push_back(draw_weight(g));
    if (dt == DataType::Float32) {
      std::vector<float> r(H);
      for (auto& v : r) v = bits_to_f32(static_cast<uint32_t>(draw_bf16(g)) << 16 | (g() & 0xffffu));
      c.rows32.push_back(std::move(r));
    } else {
      std::vector<uint16_t> r(H);
      for (auto& v : r) v = draw_bf16(g);
      c.rows16.push_back(std::move(r));
    }
  }
  for (int j = 0; j < n; ++j)
    c.ptrs.push_back(dt == DataType::Float32 ? static_cast<const void*>(c.rows32[j].data())
                                             : static_cast<const void*>(c.rows16[j].data()));
  return c;
}

bool is_nan16(DataType dt, uint16_t v) {
  return dt == DataType::BFloat16 ? (v & 0x7fffu) > 0x7f80u : (v & 0x7fffu) > 0x7c00u;
}

/// Equal bits, or both NaN: which of two NaN payloads an addition keeps is the compiler's
/// choice (it may swap the operands of a commutative add), in the old kernels as in the new.
bool same_bf16(uint16_t a, uint16_t b) {
  return a == b || (is_nan16(DataType::BFloat16, a) && is_nan16(DataType::BFloat16, b));
}

bool same_rows(DataType dt, const unsigned char* a, const unsigned char* b, size_t H) {
  for (size_t i = 0; i < H; ++i) {
    if (dt == DataType::Float32) {
      uint32_t x, y;
      std::memcpy(&x, a + 4 * i, 4);
      std::memcpy(&y, b + 4 * i, 4);
      if (x != y && !(std::isnan(bits_to_f32(x)) && std::isnan(bits_to_f32(y)))) return false;
    } else {
      uint16_t x, y;
      std::memcpy(&x, a + 2 * i, 2);
      std::memcpy(&y, b + 2 * i, 2);
      if (x != y && !(is_nan16(dt, x) && is_nan16(dt, y))) return false;
    }
  }
  return true;
}

TEST(MoeKernels, WeightedSumMatchesTheScalarModelBitForBit) {
  std::mt19937 g(20261204);
  const size_t widths[] = {1, 7, 16, 127, 128, 129, 300, 4096, 7168 + 5};
  for (size_t H : widths)
    for (int n = 0; n <= 9; ++n)
      for (int stream = 0; stream < 2; ++stream)
        for (size_t skew : {size_t{0}, size_t{1}}) {  // 64-byte aligned output, and not
          Case c = make_case(g, DataType::BFloat16, n, H);
          std::vector<uint16_t> out(H + 64, 0x1234);
          uint16_t* o = out.data() + (64 - reinterpret_cast<uintptr_t>(out.data()) % 64) / 2 + skew;
          mk::weighted_sum(DataType::BFloat16, o, c.ptrs.data(), c.w.data(), n, H, stream != 0);
          mk::stream_fence();
          for (size_t i = 0; i < H; ++i) {
            float acc = 0.0f;
            for (int j = 0; j < n; ++j) {
              // Multiply, round, add: no fused multiply-add.
              volatile float p = c.w[j] * bits_to_f32(static_cast<uint32_t>(c.rows16[j][i]) << 16);
              acc = acc + p;
            }
            ASSERT_TRUE(same_bf16(o[i], model_bf16(acc)))
                << "H " << H << " rows " << n << " stream " << stream << " skew " << skew << " at " << i;
          }
        }
}

TEST(MoeKernels, WeightedSumMatchesAccumulateThenStore) {
  std::mt19937 g(7);
  for (DataType dt : {DataType::BFloat16, DataType::Float16, DataType::Float32})
    for (size_t H : {size_t{5}, size_t{128}, size_t{1000}, size_t{4096 + 3}})
      for (int n : {0, 1, 3, 8}) {
        Case c = make_case(g, dt, n, H);
        const size_t esz = dt == DataType::Float32 ? 4 : 2;
        std::vector<unsigned char> got(H * esz), want(H * esz);
        std::vector<float> acc(H, 0.0f);
        for (int j = 0; j < n; ++j) mk::accumulate(dt, acc.data(), c.ptrs[j], c.w[j], H);
        mk::store(dt, want.data(), acc.data(), H);
        mk::weighted_sum(dt, got.data(), c.ptrs.data(), c.w.data(), n, H, false);
        ASSERT_TRUE(same_rows(dt, got.data(), want.data(), H))
            << "dtype " << static_cast<int>(dt) << " H " << H << " rows " << n;
      }
}

}  // namespace

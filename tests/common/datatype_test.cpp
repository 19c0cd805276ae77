// Datatype names/sizes and the float16/bfloat16 conversions, checked against an oracle that
// finds the nearest representable value by search (no bit tricks shared with the library).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <strata/types.hpp>

namespace strata {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Value of a float16 pattern, computed arithmetically.
double f16_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(static_cast<double>(man), -24);
  else if (exp == 31) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(static_cast<double>(1024 + man), exp - 25);
  return (h & 0x8000) ? -v : v;
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

// Round-to-nearest-even float16 by search: the non-negative patterns 0x0000..0x7bff are
// ordered like their values; 65536 (the pattern of infinity, even) closes the table, so ties
// at the top and overflow come out as IEEE 754 says.
uint16_t f16_oracle(float f) {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (uint32_t h = 0; h <= 0x7bff; ++h) t.push_back(f16_value(static_cast<uint16_t>(h)));
    t.push_back(65536.0);
    return t;
  }();
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65536.0) return sign | 0x7c00;
  const size_t hi = static_cast<size_t>(std::lower_bound(table.begin(), table.end(), a) - table.begin());
  if (table[hi] == a) return static_cast<uint16_t>(sign | hi);
  const size_t lo = hi - 1;
  const double dlo = a - table[lo], dhi = table[hi] - a;
  const size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

// Round-to-nearest-even bfloat16: the two candidates are the float truncated to its top 16
// bits and the next pattern up (2^128 stands for the infinity pattern).
uint16_t bf16_oracle(float f) {
  const uint32_t u = to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t lo = u & 0xffff0000u;
  const uint32_t hi = lo + 0x10000u;
  auto value = [](uint32_t bits) {
    if ((bits & 0x7f800000u) == 0x7f800000u) return std::ldexp(1.0, 128);
    return std::fabs(static_cast<double>(from_bits(bits)));
  };
  if ((u & 0x7fffffffu) >= 0x7f800000u) return static_cast<uint16_t>(u >> 16);  // infinity
  const double a = std::fabs(static_cast<double>(f));
  const double dlo = a - value(lo), dhi = value(hi) - a;
  const uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (((lo >> 16) & 1) == 0 ? lo : hi);
  return static_cast<uint16_t>(pick >> 16);
}

TEST(DataType, SizesNamesAndKinds) {
  struct Row {
    DataType t;
    size_t size;
    const char* name;
    bool floating;
  };
  const Row rows[] = {{DataType::Int8, 1, "int8", false},      {DataType::UInt8, 1, "uint8", false},
                      {DataType::Int32, 4, "int32", false},    {DataType::UInt32, 4, "uint32", false},
                      {DataType::Int64, 8, "int64", false},    {DataType::UInt64, 8, "uint64", false},
                      {DataType::Float16, 2, "float16", true}, {DataType::BFloat16, 2, "bfloat16", true},
                      {DataType::Float32, 4, "float32", true}, {DataType::Float64, 8, "float64", true}};
  for (const Row& r : rows) {
    EXPECT_EQ(dtype_size(r.t), r.size) << r.name;
    EXPECT_STREQ(to_string(r.t), r.name);
    EXPECT_EQ(is_floating(r.t), r.floating) << r.name;
  }
  EXPECT_EQ(dtype_of_v<const float>, DataType::Float32);
  EXPECT_EQ(dtype_of_v<bfloat16_t>, DataType::BFloat16);
  EXPECT_STREQ(to_string(ReduceOp::Avg), "avg");
  EXPECT_STREQ(to_string(Code::PeerFailed), "PeerFailed");
}

// Every float16 pattern widens to its exact value; NaNs stay NaN with their sign.
TEST(DataType, Float16WidensExactlyAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const float f = to_float(float16_t{h});
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), f16_value(h)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

// float16 -> float -> float16 is the identity except that NaNs become the quiet NaN 0x7e00
// with their sign.
TEST(DataType, Float16RoundTripAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const uint16_t back = to_float16(to_float(float16_t{h})).bits;
    const uint16_t want = f16_is_nan(h) ? static_cast<uint16_t>((h & 0x8000) | 0x7e00) : h;
    ASSERT_EQ(back, want) << std::hex << "0x" << h;
  }
}

// bfloat16 -> float is a shift, so every pattern (NaN payloads too) comes back; NaNs are quieted.
TEST(DataType, BFloat16RoundTripAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t b = static_cast<uint16_t>(p);
    const float f = to_float(bfloat16_t{b});
    ASSERT_EQ(to_bits(f), static_cast<uint32_t>(b) << 16) << std::hex << b;
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    const uint16_t want = nan ? static_cast<uint16_t>(b | 0x40) : b;
    ASSERT_EQ(to_bfloat16(f).bits, want) << std::hex << "0x" << b;
  }
}

// float32 -> float16 rounding against the search oracle: every combination of the top 19 bits
// (sign, exponent, the mantissa bits float16 keeps) with low 13-bit patterns around the
// rounding point (0x1000 is exactly half a float16 unit for normal results), plus random floats.
TEST(DataType, Float16RoundingMatchesOracle) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};
  for (uint32_t top = 0; top < (1u << 19); ++top) {
    for (uint32_t low : lows) {
      const float f = from_bits((top << 13) | low);
      const uint16_t got = to_float16(f).bits, want = f16_oracle(f);
      ASSERT_EQ(got, want) << std::hex << "float 0x" << to_bits(f) << " (" << f << "): got 0x" << got << ", expected 0x"
                           << want;
    }
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 1000000; ++i) {
    const float f = from_bits(static_cast<uint32_t>(rng()));
    ASSERT_EQ(to_float16(f).bits, f16_oracle(f)) << std::hex << "float 0x" << to_bits(f);
  }
}

// float32 -> bfloat16 against the oracle: every top-16-bit pattern with low halves around the
// rounding point (0x8000 is the tie).
TEST(DataType, BFloat16RoundingMatchesOracle) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t top = 0; top <= 0xffff; ++top) {
    for (uint32_t low : lows) {
      const float f = from_bits((top << 16) | low);
      const uint16_t got = to_bfloat16(f).bits, want = bf16_oracle(f);
      ASSERT_EQ(got, want) << std::hex << "float 0x" << to_bits(f) << ": got 0x" << got << ", expected 0x" << want;
    }
  }
}

TEST(DataType, RoundingTiesGoToEven) {
  // float16: unit in the last place at 1.0 is 2^-10.
  EXPECT_EQ(to_float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);                          // tie, 1.0 is even
  EXPECT_EQ(to_float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);                      // tie, rounds up to even
  EXPECT_EQ(to_float16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits, 0x3c01);  // above the tie
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7bff);                                              // largest finite
  EXPECT_EQ(to_float16(65519.0f).bits, 0x7bff);                                              // below the midpoint
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);  // midpoint to 2^16: ties to even = infinity
  EXPECT_EQ(to_float16(-65520.0f).bits, 0xfc00);
  // bfloat16: unit in the last place at 1.0 is 2^-7.
  EXPECT_EQ(to_bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_EQ(to_bfloat16(from_bits(0x7f7fffff)).bits, 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(to_bfloat16(from_bits(0x7f7f7fff)).bits, 0x7f7f);
}

TEST(DataType, NaNAndInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(to_float16(inf).bits, 0x7c00);
  EXPECT_EQ(to_float16(-inf).bits, 0xfc00);
  EXPECT_EQ(to_bfloat16(inf).bits, 0x7f80);
  EXPECT_EQ(to_bfloat16(-inf).bits, 0xff80);
  EXPECT_TRUE(std::isinf(to_float(float16_t{0x7c00})));
  EXPECT_TRUE(std::isinf(to_float(bfloat16_t{0xff80})));
  // NaNs whose payload sits only in bits a narrowing drops must not turn into infinity.
  for (uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f801fffu, 0xffffffffu}) {
    const float f = from_bits(nan);
    const uint16_t h = to_float16(f).bits;
    EXPECT_TRUE(f16_is_nan(h)) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
    const uint16_t b = to_bfloat16(f).bits;
    EXPECT_TRUE((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0) << std::hex << nan << " -> " << b;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
  }
}

TEST(DataType, Subnormals) {
  // float16 subnormals: the smallest is 2^-24.
  EXPECT_EQ(to_float(float16_t{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(to_float(float16_t{0x83ff}), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -24)).bits, 0x0001);
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -25)).bits, 0x0000);     // tie with 0: even
  EXPECT_EQ(to_float16(std::ldexp(3.0f, -25)).bits, 0x0002);     // tie between 1 and 2 units: even
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -26)).bits, 0x0000);     // below half a unit
  EXPECT_EQ(to_float16(-std::ldexp(1.0f, -30)).bits, 0x8000);    // -0 keeps its sign
  EXPECT_EQ(to_float16(std::ldexp(1023.5f, -24)).bits, 0x0400);  // rounds up into the normals
  // bfloat16 shares float32's exponent range: float32 subnormals are kept, not flushed.
  EXPECT_EQ(to_bfloat16(from_bits(0x00010000)).bits, 0x0001);
  EXPECT_EQ(to_bfloat16(from_bits(0x00018000)).bits, 0x0002);  // tie: even
  EXPECT_EQ(to_bfloat16(from_bits(0x00008000)).bits, 0x0000);  // tie: even
  EXPECT_EQ(to_bfloat16(from_bits(0x80008001)).bits, 0x8001);
}

}  // namespace
}  // namespace strata

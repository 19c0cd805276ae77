// Reduction kernels: every instruction set this CPU has, every dtype and op, against a
// reference written here (sequential accumulation per element, sources in order 0..n-1).
#include "common/reduce.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/reduce_isa.hpp"

namespace strata {
// Readable parameter names in gtest and ctest output (found by argument-dependent lookup).
static void PrintTo(DataType t, std::ostream* os) { *os << to_string(t); }
namespace kernels {
static void PrintTo(Isa isa, std::ostream* os) { *os << to_string(isa); }
}  // namespace kernels
}  // namespace strata

namespace strata::kernels {
namespace {

constexpr DataType kAllDtypes[] = {DataType::Int8,    DataType::UInt8,  DataType::Int32,   DataType::UInt32,
                                   DataType::Int64,   DataType::UInt64, DataType::Float16, DataType::BFloat16,
                                   DataType::Float32, DataType::Float64};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                                ReduceOp::Avg, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor};
constexpr int kSourceCounts[] = {1, 2, 3, 8};
constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 63, 64, 65, 1000, 4099};

template <class T>
constexpr bool kHalf = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;

// ---- Reference, independent of the kernels -------------------------------------------------

// float16 -> float by value (not by bit manipulation as the library does).
float f16_value(float16_t h) {
  const int sign = h.bits >> 15;
  const int exp = (h.bits >> 10) & 0x1f;
  const int man = h.bits & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(man + 1024), exp - 25);
  return sign ? -v : v;
}

float bf16_value(bfloat16_t b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <class T>
auto ref_load(T v) {
  if constexpr (std::is_same_v<T, float16_t>) return f16_value(v);
  else if constexpr (std::is_same_v<T, bfloat16_t>) return bf16_value(v);
  else return v;
}

template <class T, class A>
T ref_store(A v) {
  // Rounding to the half types is specified by to_float16/to_bfloat16 (tested in datatype_test).
  if constexpr (std::is_same_v<T, float16_t>) return to_float16(v);
  else if constexpr (std::is_same_v<T, bfloat16_t>) return to_bfloat16(v);
  else return v;
}

template <class A>
A ref_op(ReduceOp op, A acc, A x) {
  if constexpr (std::is_integral_v<A>) {
    // Two's complement wrap: compute modulo 2^64, then truncate.
    const uint64_t a = static_cast<uint64_t>(acc), b = static_cast<uint64_t>(x);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return static_cast<A>(a + b);
      case ReduceOp::Prod: return static_cast<A>(a * b);
      case ReduceOp::Min: return x < acc ? x : acc;
      case ReduceOp::Max: return acc < x ? x : acc;
      case ReduceOp::BAnd: return static_cast<A>(a & b);
      case ReduceOp::BOr: return static_cast<A>(a | b);
      case ReduceOp::BXor: return static_cast<A>(a ^ b);
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return acc + x;
      case ReduceOp::Prod: return acc * x;
      case ReduceOp::Min: return x < acc ? x : acc;  // std::min(acc, x)
      case ReduceOp::Max: return acc < x ? x : acc;  // std::max(acc, x)
      default: break;                                // bitwise: integers only
    }
  }
  return acc;
}

template <class A>
A ref_average(A sum, int divisor) {
  if constexpr (std::is_floating_point_v<A>) {
    return sum / static_cast<A>(divisor);
  } else if constexpr (std::is_signed_v<A>) {
    return static_cast<A>(static_cast<int64_t>(sum) / divisor);  // truncates toward zero
  } else {
    return static_cast<A>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(divisor));
  }
}

template <class T>
T ref_reduce_one(ReduceOp op, const std::vector<const T*>& srcs, size_t i, int divisor) {
  auto acc = ref_load(srcs[0][i]);
  for (size_t s = 1; s < srcs.size(); ++s) acc = ref_op(op, acc, ref_load(srcs[s][i]));
  if (op == ReduceOp::Avg) acc = ref_average(acc, divisor);
  return ref_store<T>(acc);
}

// ---- Comparison ------------------------------------------------------------------------------

template <class T>
uint64_t bits_of(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else if constexpr (kHalf<T>) return std::isnan(ref_load(v));
  else return false;
}

// Bit-exact, except that two NaNs match when several NaNs met in one element: which payload
// survives an addition of two NaNs is not something either side controls.
template <class T>
bool same(T got, T want, bool nan_payload_exact) {
  if (bits_of(got) == bits_of(want)) return true;
  return !nan_payload_exact && is_nan(got) && is_nan(want);
}

template <class T>
std::string show(T v) {
  std::ostringstream os;
  if constexpr (kHalf<T>) os << ref_load(v) << " (0x" << std::hex << v.bits << ")";
  else if constexpr (std::is_floating_point_v<T>) os << v << " (0x" << std::hex << bits_of(v) << ")";
  else if constexpr (sizeof(T) == 1) os << static_cast<int>(v);
  else os << v;
  return os.str();
}

// ---- Inputs ----------------------------------------------------------------------------------

template <class T>
T special_value(std::mt19937_64& rng) {
  if constexpr (std::is_same_v<T, float16_t>) {
    constexpr uint16_t kSpecial[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x8201, 0x7bff, 0xfbff,
                                     0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55, 0x0400};
    return float16_t{kSpecial[rng() % std::size(kSpecial)]};
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    constexpr uint16_t kSpecial[] = {0x0000, 0x8000, 0x0001, 0x007f, 0x8040, 0x7f7f, 0xff7f,
                                     0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa5, 0x0080};
    return bfloat16_t{kSpecial[rng() % std::size(kSpecial)]};
  } else {
    using L = std::numeric_limits<T>;
    const T kSpecial[] = {T(0),      -T(0),         L::denorm_min(), -L::denorm_min(), L::min() / 4,    L::max(),
                          -L::max(), L::infinity(), -L::infinity(),  L::quiet_NaN(),   -L::quiet_NaN(), L::min()};
    return kSpecial[rng() % std::size(kSpecial)];
  }
}

// Mostly ordinary values in a range that keeps products of 8 sources finite, some arbitrary
// bit patterns and special values (NaN, inf, subnormals, signed zeros).
template <class T>
T random_value(std::mt19937_64& rng, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(rng());
  } else {
    const uint64_t dice = rng() % 100;
    if (dice < 4) return special_value<T>(rng);
    if (dice < 8) {
      T v;
      const uint64_t r = rng();
      std::memcpy(static_cast<void*>(&v), &r, sizeof(T));
      return v;
    }
    std::uniform_real_distribution<double> magnitude(op == ReduceOp::Prod ? 0.5 : 0.0,
                                                     op == ReduceOp::Prod ? 2.0 : 100);
    double v = magnitude(rng) * ((rng() & 1) ? -1 : 1);
    if constexpr (std::is_same_v<T, float16_t>) return to_float16(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, bfloat16_t>) return to_bfloat16(static_cast<float>(v));
    else return static_cast<T>(v);
  }
}

enum class Alias { None, First, Last };

const char* to_string(Alias a) {
  switch (a) {
    case Alias::None: return "none";
    case Alias::First: return "dst=srcs[0]";
    case Alias::Last: return "dst=srcs[n-1]";
  }
  return "?";
}

template <class T>
T sentinel() {
  T v;
  std::memset(static_cast<void*>(&v), 0xA5, sizeof v);
  return v;
}

// One case: n sources of `count` elements starting `offset` elements into their allocation
// (so vector loads are misaligned), dst separate or aliasing a source.
template <class T>
::testing::AssertionResult check_case(Isa isa, ReduceOp op, int n, size_t count, Alias alias, size_t offset,
                                      std::mt19937_64& rng, Stores stores = Stores::Auto) {
  constexpr size_t kGuard = 8;
  // Sources sized exactly, so reading past the end is caught by ASan.
  std::vector<std::vector<T>> storage(n, std::vector<T>(offset + count));
  std::vector<const T*> srcs(n);
  for (int s = 0; s < n; ++s) {
    for (auto& v : storage[s]) v = random_value<T>(rng, op);
    srcs[s] = storage[s].data() + offset;
  }
  const int divisor = n;
  std::vector<T> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = ref_reduce_one<T>(op, srcs, i, divisor);

  std::vector<T> separate(offset + count + kGuard, sentinel<T>());
  T* dst = separate.data() + offset;
  if (alias == Alias::First) dst = storage[0].data() + offset;
  if (alias == Alias::Last) dst = storage[n - 1].data() + offset;

  std::vector<const void*> raw(srcs.begin(), srcs.end());
  reduce(isa, dtype_of_v<T>, op, dst, raw.data(), n, count, divisor, stores);

  auto where = [&] {
    std::ostringstream os;
    os << "isa=" << to_string(isa) << " dtype=" << strata::to_string(dtype_of_v<T>) << " op=" << strata::to_string(op)
       << " nsrcs=" << n << " count=" << count << " alias=" << to_string(alias) << " offset=" << offset
       << (stores == Stores::Streamed ? " streamed" : "");
    return os.str();
  };
  // min/max and single sources never combine two NaNs: their NaN bits are exact too.
  const bool nan_exact = n == 1 || op == ReduceOp::Min || op == ReduceOp::Max;
  for (size_t i = 0; i < count; ++i) {
    if (!same(dst[i], want[i], nan_exact)) {
      return ::testing::AssertionFailure()
             << where() << ": element " << i << " is " << show(dst[i]) << ", expected " << show(want[i]);
    }
  }
  if (alias == Alias::None) {
    for (size_t i = 0; i < offset; ++i) {
      if (bits_of(separate[i]) != bits_of(sentinel<T>()))
        return ::testing::AssertionFailure() << where() << ": wrote before dst at -" << (offset - i);
    }
    for (size_t i = offset + count; i < separate.size(); ++i) {
      if (bits_of(separate[i]) != bits_of(sentinel<T>()))
        return ::testing::AssertionFailure() << where() << ": wrote past dst[count - 1] at +" << (i - offset - count);
    }
  }
  return ::testing::AssertionSuccess();
}

template <class T>
void check_all_cases(Isa isa) {
  std::mt19937_64 rng(0x5eed0000u + static_cast<unsigned>(dtype_of_v<T>) * 16 + static_cast<unsigned>(isa));
  for (ReduceOp op : kAllOps) {
    if (is_bitwise(op) && !std::is_integral_v<T>) continue;  // refused by validation
    for (int n : kSourceCounts) {
      for (size_t count : kCounts) {
        for (Alias alias : {Alias::None, Alias::First, Alias::Last}) {
          if (alias == Alias::Last && n == 1) continue;
          for (size_t offset : {size_t{0}, size_t{1}}) {
            ASSERT_TRUE(check_case<T>(isa, op, n, count, alias, offset, rng));
          }
        }
      }
    }
  }
  // Sources past 1 MiB take the prefetching loop.
  const size_t large = (size_t{1} << 20) / sizeof(T) + 33;
  ASSERT_TRUE(check_case<T>(isa, ReduceOp::Sum, 2, large, Alias::None, 1, rng));
  ASSERT_TRUE(check_case<T>(isa, ReduceOp::Max, 3, large, Alias::First, 0, rng));
  // Results past 8 MiB are streamed (non-temporal stores) from the first 64-byte aligned
  // element on: every destination alignment, in place too.
  const size_t huge = (size_t{8} << 20) / sizeof(T) + 37;
  // (offset 48 bytes: glibc's large blocks start 16 bytes into a page, so no head there)
  for (size_t offset : {size_t{0}, size_t{1}, size_t{5}, 48 / sizeof(T)})
    ASSERT_TRUE(check_case<T>(isa, ReduceOp::Sum, 2, huge, Alias::None, offset, rng));
  ASSERT_TRUE(check_case<T>(isa, ReduceOp::Min, 3, huge, Alias::First, 3, rng));
  // Streamed at every size (two-shot's reduced slice): counts too short to reach an aligned
  // element, and every destination alignment.
  for (size_t count : {size_t{1}, size_t{3}, size_t{17}, size_t{100}, size_t{4099}})
    for (size_t offset : {size_t{0}, size_t{1}, size_t{5}, 48 / sizeof(T)})
      ASSERT_TRUE(check_case<T>(isa, ReduceOp::Sum, 2, count, Alias::None, offset, rng, Stores::Streamed));
  ASSERT_TRUE(check_case<T>(isa, ReduceOp::Max, 3, 1000, Alias::First, 1, rng, Stores::Streamed));
}

template <class F>
void with_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::Int8: return f(int8_t{});
    case DataType::UInt8: return f(uint8_t{});
    case DataType::Int32: return f(int32_t{});
    case DataType::UInt32: return f(uint32_t{});
    case DataType::Int64: return f(int64_t{});
    case DataType::UInt64: return f(uint64_t{});
    case DataType::Float16: return f(float16_t{});
    case DataType::BFloat16: return f(bfloat16_t{});
    case DataType::Float32: return f(float{});
    case DataType::Float64: return f(double{});
  }
}

// ---- Tests -----------------------------------------------------------------------------------

class ReduceKernels : public ::testing::TestWithParam<std::tuple<Isa, DataType>> {};

// Every op x nsrcs {1,2,3,8} x counts x aliasing x alignment equals the sequential reference.
TEST_P(ReduceKernels, MatchesSequentialReference) {
  const auto [isa, dtype] = GetParam();
  if (!supported(isa)) GTEST_SKIP() << to_string(isa) << " is not supported on this CPU";
  with_type(dtype, [isa = isa](auto tag) { check_all_cases<decltype(tag)>(isa); });
}

INSTANTIATE_TEST_SUITE_P(Reduce, ReduceKernels,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas), ::testing::ValuesIn(kAllDtypes)),
                         [](const ::testing::TestParamInfo<ReduceKernels::ParamType>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  strata::to_string(std::get<1>(info.param));
                         });

class ReduceHalf : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!supported(GetParam())) GTEST_SKIP() << to_string(GetParam()) << " is not supported on this CPU";
  }
};

std::vector<uint16_t> all_patterns() {
  std::vector<uint16_t> v(65536);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

// Widening and rounding back, and rounding of arbitrary float32 values (x / d), on all 65536
// patterns: the SIMD conversions must equal to_float16/to_bfloat16 bit for bit, NaNs included.
template <class T>
void check_exhaustive(Isa isa) {
  const std::vector<uint16_t> pattern = all_patterns();
  std::vector<T> in(pattern.size()), out(pattern.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = T{pattern[i]};
  const void* src = in.data();
  for (int d : {1, 3, 7, 10, 1000, 65535}) {
    reduce(isa, dtype_of_v<T>, d == 1 ? ReduceOp::Sum : ReduceOp::Avg, out.data(), &src, 1, in.size(), d);
    for (size_t i = 0; i < in.size(); ++i) {
      const T want = ref_store<T>(ref_load(in[i]) / static_cast<float>(d));
      ASSERT_EQ(out[i].bits, want.bits) << to_string(isa) << " " << strata::to_string(dtype_of_v<T>) << " 0x"
                                        << std::hex << in[i].bits << " / " << std::dec << d;
    }
  }
  // Pairs: every pattern with a shifted partner, summed and multiplied in float32.
  std::vector<T> partner(in.size());
  for (size_t i = 0; i < in.size(); ++i) partner[i] = in[(i * 40503 + 12345) & 0xffff];
  const void* two[] = {in.data(), partner.data()};
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max}) {
    reduce(isa, dtype_of_v<T>, op, out.data(), two, 2, in.size(), 2);
    for (size_t i = 0; i < in.size(); ++i) {
      const T want = ref_store<T>(ref_op(op, ref_load(in[i]), ref_load(partner[i])));
      const bool both_nan = is_nan(in[i]) && is_nan(partner[i]);
      ASSERT_TRUE(same(out[i], want, !both_nan))
          << to_string(isa) << " " << strata::to_string(dtype_of_v<T>) << " " << strata::to_string(op) << " 0x"
          << std::hex << in[i].bits << ", 0x" << partner[i].bits << ": got 0x" << out[i].bits << ", expected 0x"
          << want.bits;
    }
  }
}

TEST_P(ReduceHalf, Float16ConversionsExhaustive) { check_exhaustive<float16_t>(GetParam()); }
TEST_P(ReduceHalf, BFloat16ConversionsExhaustive) { check_exhaustive<bfloat16_t>(GetParam()); }

// The AVX512_BF16 conversion flushes float32 subnormals, so a 16-lane vector holding one is
// rounded in integer arithmetic instead. Put a subnormal in the first lane of every group of 16
// and all 65536 patterns in the other lanes: the integer rounding path then sees every pattern,
// ties and NaNs included, on CPUs that have the instruction too.
TEST_P(ReduceHalf, BFloat16RoundingBesideSubnormals) {
  constexpr size_t kGroups = 65536 / 15 + 1;
  std::vector<bfloat16_t> in(16 * kGroups), partner(in.size()), out(in.size());
  for (size_t g = 0, next = 0; g < kGroups; ++g) {
    in[16 * g] = bfloat16_t{0x007f};       // largest subnormal: stays subnormal through x/10 and x+x
    partner[16 * g] = bfloat16_t{0x3f80};  // 1.0
    for (size_t lane = 1; lane < 16; ++lane, ++next) {
      in[16 * g + lane] = bfloat16_t{static_cast<uint16_t>(next)};
      partner[16 * g + lane] = bfloat16_t{static_cast<uint16_t>((next * 40503 + 12345) & 0xffff)};
    }
  }
  const Isa isa = GetParam();
  const void* one[] = {in.data()};
  for (int d : {1, 3, 10}) {
    reduce(isa, DataType::BFloat16, d == 1 ? ReduceOp::Sum : ReduceOp::Avg, out.data(), one, 1, in.size(), d);
    for (size_t i = 0; i < in.size(); ++i) {
      const bfloat16_t want = to_bfloat16(bf16_value(in[i]) / static_cast<float>(d));
      ASSERT_EQ(out[i].bits, want.bits) << to_string(isa) << " 0x" << std::hex << in[i].bits << " / " << std::dec << d;
    }
  }
  const void* two[] = {in.data(), partner.data()};
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod}) {
    reduce(isa, DataType::BFloat16, op, out.data(), two, 2, in.size(), 2);
    for (size_t i = 0; i < in.size(); ++i) {
      const bfloat16_t want = to_bfloat16(ref_op(op, bf16_value(in[i]), bf16_value(partner[i])));
      const bool both_nan = is_nan(in[i]) && is_nan(partner[i]);
      ASSERT_TRUE(same(out[i], want, !both_nan))
          << to_string(isa) << " " << strata::to_string(op) << " 0x" << std::hex << in[i].bits << ", 0x"
          << partner[i].bits << ": got 0x" << out[i].bits << ", expected 0x" << want.bits;
    }
  }
}

// Half inputs accumulate in float32 over all sources and round once: 2048 + 1 + 1 in float16
// is 2050 (rounding after each step would give 2048 twice).
TEST_P(ReduceHalf, AccumulatesInFloat32AndRoundsOnce) {
  for (size_t count : {size_t{1}, size_t{100}}) {
    std::vector<float16_t> big(count, to_float16(2048.0f)), one(count, to_float16(1.0f)), out(count);
    const void* srcs[] = {big.data(), one.data(), one.data()};
    reduce(GetParam(), DataType::Float16, ReduceOp::Sum, out.data(), srcs, 3, count, 3);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(f16_value(out[i]), 2050.0f) << "element " << i;
  }
  std::vector<bfloat16_t> big(70, to_bfloat16(256.0f)), one(70, to_bfloat16(1.0f)), out(70);
  const void* srcs[] = {big.data(), one.data(), one.data()};
  reduce(GetParam(), DataType::BFloat16, ReduceOp::Sum, out.data(), srcs, 3, 70, 3);
  for (size_t i = 0; i < 70; ++i) ASSERT_EQ(bf16_value(out[i]), 258.0f) << "element " << i;
}

// bfloat16 subnormals (float32 subnormals) survive: the AVX512_BF16 instruction alone would
// flush them to zero.
TEST_P(ReduceHalf, BFloat16SubnormalsKept) {
  std::vector<bfloat16_t> a(33, bfloat16_t{0x0001}), b(33, bfloat16_t{0x0002}), out(33);
  a[5] = bfloat16_t{0x8003};
  const void* srcs[] = {a.data(), b.data()};
  reduce(GetParam(), DataType::BFloat16, ReduceOp::Sum, out.data(), srcs, 2, a.size(), 2);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(out[i].bits, i == 5 ? 0x8001 : 0x0003) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Reduce, ReduceHalf, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(to_string(info.param)); });

TEST(ReduceIsa, NamesRoundTrip) {
  for (Isa isa : kAllIsas) {
    auto parsed = parse_isa(to_string(isa));
    ASSERT_TRUE(parsed.has_value()) << to_string(isa);
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(parse_isa("AVX512"), Isa::Avx512);
  EXPECT_FALSE(parse_isa("sse2").has_value());
  EXPECT_FALSE(parse_isa("").has_value());
  EXPECT_TRUE(supported(Isa::Scalar));
  EXPECT_TRUE(supported(best_supported()));
}

// The default entry point uses active() and gives the same bits as naming it.
TEST(ReduceIsa, DefaultEntryPointUsesActiveIsa) {
  EXPECT_STREQ(isa(), to_string(active()));
  std::mt19937_64 rng(7);
  std::vector<float> a(1000), b(1000), out1(1000), out2(1000);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = random_value<float>(rng, ReduceOp::Sum), b[i] = random_value<float>(rng, ReduceOp::Sum);
  const void* srcs[] = {a.data(), b.data()};
  reduce(DataType::Float32, ReduceOp::Sum, out1.data(), srcs, 2, a.size(), 2);
  reduce(active(), DataType::Float32, ReduceOp::Sum, out2.data(), srcs, 2, a.size(), 2);
  EXPECT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)), 0);
}

// STRATA_KERNELS picks the kernels: the named set when supported, otherwise the widest
// supported set below it; unset, empty, "auto" or unknown: the widest supported.
// ctest also runs this with STRATA_KERNELS=scalar|avx2|avx512|bogus (tests/common/CMakeLists.txt).
TEST(ReduceEnv, KernelsOverrideSelectsIsa) {
  const char* requested = std::getenv("STRATA_KERNELS");
  Isa expected = best_supported();
  if (requested) {
    if (auto want = parse_isa(requested)) {
      expected = *want;
      while (!supported(expected)) expected = static_cast<Isa>(static_cast<int>(expected) - 1);
    }
  }
  EXPECT_EQ(active(), expected) << "STRATA_KERNELS=" << (requested ? requested : "(unset)");
  EXPECT_STREQ(isa(), to_string(expected));
}

// Small copies use memcpy, large ones (>= 8 MiB) non-temporal stores with an aligned middle:
// every length and destination alignment must copy exactly the bytes asked for.
TEST(ReduceCopy, CopiesEveryLengthAndAlignment) {
  std::mt19937_64 rng(11);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{4097}, size_t{1} << 20,
                       (size_t{8} << 20) - 1, (size_t{8} << 20) + 77, (size_t{9} << 20) + 255}) {
    std::vector<unsigned char> src(bytes + 3);
    for (auto& c : src) c = static_cast<unsigned char>(rng());
    for (size_t offset : {size_t{0}, size_t{1}, size_t{33}}) {
      std::vector<unsigned char> dst(bytes + 64 + 16, 0xA5);
      unsigned char* out = dst.data() + offset;
      copy(out, src.data() + 3, bytes);
      ASSERT_EQ(std::memcmp(out, src.data() + 3, bytes), 0) << bytes << " bytes at offset " << offset;
      for (size_t i = 0; i < offset; ++i) ASSERT_EQ(dst[i], 0xA5) << bytes << " bytes: wrote before dst";
      for (size_t i = offset + bytes; i < dst.size(); ++i)
        ASSERT_EQ(dst[i], 0xA5) << bytes << " bytes: wrote past the end at +" << (i - offset - bytes);
    }
  }
}

}  // namespace
}  // namespace strata::kernels

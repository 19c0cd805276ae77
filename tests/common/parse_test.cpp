// common/parse.hpp: the one syntax of sizes, durations and integers (environment, CLI, bench).
#include "common/parse.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace strata {
namespace {

using namespace std::chrono_literals;

// The value of a successful parse, nullopt for an error: keeps the expectations one line each.
template <class T>
std::optional<T> ok(const Result<T>& r) {
  if (!r.is_ok()) return std::nullopt;
  return r.value();
}

TEST(ParseSize, UnitsAndPlainBytes) {
  EXPECT_EQ(ok(parse_size("4096")), size_t{4096});
  EXPECT_EQ(ok(parse_size("0")), size_t{0});
  EXPECT_EQ(ok(parse_size("512B")), size_t{512});
  EXPECT_EQ(ok(parse_size("64K")), size_t{64} << 10);
  EXPECT_EQ(ok(parse_size("64k")), size_t{64} << 10);
  EXPECT_EQ(ok(parse_size("1KiB")), size_t{1} << 10);
  EXPECT_EQ(ok(parse_size("16M")), size_t{16} << 20);
  EXPECT_EQ(ok(parse_size("16m")), size_t{16} << 20);
  EXPECT_EQ(ok(parse_size("16MiB")), size_t{16} << 20);
  EXPECT_EQ(ok(parse_size("2G")), size_t{2} << 30);
  EXPECT_EQ(ok(parse_size("2g")), size_t{2} << 30);
  EXPECT_EQ(ok(parse_size("3GiB")), size_t{3} << 30);
}

// nccl-tests' -b 1K is 1024 bytes; KB must not quietly mean 1000 in one place and 1024 in another.
TEST(ParseSize, KbMbGbAreBinaryToo) {
  EXPECT_EQ(ok(parse_size("1KB")), size_t{1024});
  EXPECT_EQ(ok(parse_size("8MB")), size_t{8} << 20);
  EXPECT_EQ(ok(parse_size("1GB")), size_t{1} << 30);
}

TEST(ParseSize, RejectsMalformed) {
  for (const char* bad : {"", "abc", "12X", "M", "1 M", " 1", "1.5M", "+1", "1KiBs", "1kb", "1T"})
    EXPECT_FALSE(parse_size(bad).is_ok()) << "'" << bad << "'";
}

TEST(ParseSize, RejectsNegativeAndOverflow) {
  EXPECT_FALSE(parse_size("-1").is_ok());
  EXPECT_FALSE(parse_size("99999999999999G").is_ok());
  EXPECT_FALSE(parse_size("99999999999999999999").is_ok());              // over 64 bits before any unit
  EXPECT_EQ(ok(parse_size("17179869183G")), size_t{17179869183} << 30);  // the largest that fits
  EXPECT_FALSE(parse_size("17179869184G").is_ok());
}

// The error names the text and what was expected, so `-b: ...` or `STRATA_X: ...` reads whole.
TEST(ParseSize, ErrorNamesTheTextAndTheUnits) {
  Result<size_t> r = parse_size("12X");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::InvalidArgument);
  EXPECT_NE(r.status().message().find("'12X'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("K = 1024"), std::string::npos) << r.status().message();
  Result<size_t> big = parse_size("99999999999999G");
  ASSERT_FALSE(big.is_ok());
  EXPECT_NE(big.status().message().find("64 bits"), std::string::npos) << big.status().message();
}

TEST(ParseDuration, UnitsAndPlainMilliseconds) {
  EXPECT_EQ(ok(parse_duration("1500")), 1500ms);
  EXPECT_EQ(ok(parse_duration("500ms")), 500ms);
  EXPECT_EQ(ok(parse_duration("2s")), 2000ms);
  EXPECT_EQ(ok(parse_duration("1.5s")), 1500ms);
  EXPECT_EQ(ok(parse_duration(".5s")), 500ms);
  EXPECT_EQ(ok(parse_duration("1m")), 60000ms);
  EXPECT_EQ(ok(parse_duration("2min")), 120000ms);
  EXPECT_EQ(ok(parse_duration("0")), 0ms);
}

// The command line reads a plain number as seconds (`--timeout 90`), the environment as ms.
TEST(ParseDuration, BareNumberInTheCallersUnit) {
  EXPECT_EQ(ok(parse_duration("90", BareDuration::Seconds)), 90000ms);
  EXPECT_EQ(ok(parse_duration("0.25", BareDuration::Seconds)), 250ms);
  EXPECT_EQ(ok(parse_duration("90", BareDuration::Milliseconds)), 90ms);
  EXPECT_EQ(ok(parse_duration("500ms", BareDuration::Seconds)), 500ms);  // a unit wins
}

TEST(ParseDuration, RejectsMalformed) {
  for (const char* bad : {"", "fast", "-1s", "5h", "5 s", " 5s", "+5s", "1.2.3s", ".s", "s", "1e3"})
    EXPECT_FALSE(parse_duration(bad).is_ok()) << "'" << bad << "'";
}

TEST(ParseDuration, RejectsNonFinite) {
  EXPECT_FALSE(parse_duration("nan").is_ok());
  EXPECT_FALSE(parse_duration("inf").is_ok());
  EXPECT_FALSE(parse_duration("1e300s").is_ok());
  EXPECT_FALSE(parse_duration("99999999999999999999s").is_ok());  // finite, but no timeout
}

TEST(ParseDuration, ErrorNamesTheTextAndTheUnits) {
  Result<std::chrono::milliseconds> r = parse_duration("soon");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::InvalidArgument);
  EXPECT_NE(r.status().message().find("'soon'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("ms, s"), std::string::npos) << r.status().message();
}

TEST(ParseInt, WholeStringDecimal) {
  EXPECT_EQ(ok(parse_int("42")), int64_t{42});
  EXPECT_EQ(ok(parse_int("-7")), int64_t{-7});
  EXPECT_EQ(ok(parse_int("0")), int64_t{0});
  for (const char* bad : {"", "x", "4x", " 4", "4 ", "+4", "0x10", "1.0", "99999999999999999999"})
    EXPECT_FALSE(parse_int(bad).is_ok()) << "'" << bad << "'";
}

TEST(ParseInt, RangeIsChecked) {
  EXPECT_EQ(ok(parse_int("1", 1, 8)), int64_t{1});
  EXPECT_EQ(ok(parse_int("8", 1, 8)), int64_t{8});
  Result<int64_t> low = parse_int("0", 1, 8);
  ASSERT_FALSE(low.is_ok());
  EXPECT_NE(low.status().message().find("from 1 to 8"), std::string::npos) << low.status().message();
  Result<int64_t> word = parse_int("two", 1, 8);
  ASSERT_FALSE(word.is_ok());
  EXPECT_NE(word.status().message().find("'two'"), std::string::npos) << word.status().message();
}

}  // namespace
}  // namespace strata

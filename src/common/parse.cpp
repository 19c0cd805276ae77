#include "common/parse.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>

namespace strata {
namespace {

Status not_a(std::string_view text, const char* expected) {
  return invalid_argument("'" + std::string(text) + "' is not " + expected);
}

constexpr const char* kSizeExpected =
    "a size: expected a number of bytes with an optional unit B, K, M or G (binary: K = 1024), "
    "e.g. 8, 4K, 16M, 1G";
constexpr const char* kDurationExpected =
    "a duration: expected a number with an optional unit ms, s or m (minutes), e.g. 500ms, 2s, 1.5s";

// Splits "123abc" into its leading digits and the rest; no sign, no blanks.
size_t digits_end(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  return i;
}

}  // namespace

Result<size_t> parse_size(std::string_view text) {
  size_t n = digits_end(text);
  if (n == 0) return not_a(text, kSizeExpected);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + n, v);
  if (ec != std::errc()) return not_a(text, "a size: it does not fit in 64 bits");
  std::string_view unit = text.substr(n);
  int shift;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K" || unit == "k" || unit == "KiB" || unit == "KB") shift = 10;
  else if (unit == "M" || unit == "m" || unit == "MiB" || unit == "MB") shift = 20;
  else if (unit == "G" || unit == "g" || unit == "GiB" || unit == "GB") shift = 30;
  else return not_a(text, kSizeExpected);
  if (v > (std::numeric_limits<size_t>::max() >> shift)) return not_a(text, "a size: it does not fit in 64 bits");
  return static_cast<size_t>(v) << shift;
}

Result<std::chrono::milliseconds> parse_duration(std::string_view text, BareDuration bare) {
  // Digits with at most one decimal point, then the unit: strtod would also take blanks,
  // signs, exponents, hex, "nan" and "inf", none of which a timeout is written with.
  size_t i = digits_end(text);
  size_t int_digits = i;
  size_t frac_digits = 0;
  if (i < text.size() && text[i] == '.') {
    size_t f = digits_end(text.substr(i + 1));
    frac_digits = f;
    i += 1 + f;
  }
  if (int_digits + frac_digits == 0) return not_a(text, kDurationExpected);
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + i, v);
  if (ec != std::errc() || !std::isfinite(v)) return not_a(text, kDurationExpected);
  std::string_view unit = text.substr(i);
  double ms;
  if (unit == "ms") ms = v;
  else if (unit == "s") ms = v * 1000;
  else if (unit == "m" || unit == "min") ms = v * 60000;
  else if (unit.empty()) ms = bare == BareDuration::Seconds ? v * 1000 : v;
  else return not_a(text, kDurationExpected);
  if (ms > 1e15) return not_a(text, "a duration: it is longer than 30,000 years");
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

Result<int64_t> parse_int(std::string_view text) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size())
    return not_a(text, "an integer: expected decimal digits with an optional leading '-'");
  return v;
}

Result<int64_t> parse_int(std::string_view text, int64_t lo, int64_t hi) {
  Result<int64_t> v = parse_int(text);
  if (!v.is_ok()) return v;
  if (*v < lo || *v > hi)
    return invalid_argument("'" + std::string(text) + "' is out of range: expected an integer from " +
                            std::to_string(lo) + " to " + std::to_string(hi));
  return v;
}

}  // namespace strata

#pragma once
// The one parser of the numbers people type: sizes, durations and integers, as the
// environment (common/env.cpp), the `strata` command line and the bench read them.
//
// Sizes are binary, as in nccl-tests' -b/-e: K, M and G (also k/m/g, KiB/MiB/GiB and
// KB/MB/GB) are powers of 1024. A decimal "KB" would make `-b 1KB` here measure a different
// size than the same flag of nccl-tests, so every spelling of the unit means 1024.
// A failed parse names the text and what was expected, so a caller only adds which
// setting it was ("STRATA_TIMEOUT: ...", "-b: ...").

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.hpp"

namespace strata {

/// Parses a byte count: "4096", "512B", "64K", "16MiB", "1GB" (binary units, see above).
/// No sign, no blanks, no fractions; a value that overflows 64 bits is an error.
Result<size_t> parse_size(std::string_view text);

/// How a duration without a unit is read: the environment counts milliseconds, the command
/// line (read by people) seconds.
enum class BareDuration { Milliseconds, Seconds };

/// Parses a duration: "500ms", "2s", "1.5s", "1m" or "2min" (minutes); a plain number is in
/// `bare` units. Negative, non-finite and absurdly long (over ~30,000 years) values are errors.
Result<std::chrono::milliseconds> parse_duration(std::string_view text, BareDuration bare = BareDuration::Milliseconds);

/// Parses a whole-string decimal integer with an optional leading '-' ("42", "-1").
Result<int64_t> parse_int(std::string_view text);

/// parse_int, and the value must lie in [lo, hi].
Result<int64_t> parse_int(std::string_view text, int64_t lo, int64_t hi);

}  // namespace strata

#pragma once
// The subcommands of the `strata` tool and the small helpers they share.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace strata::cli {

/// Exit status for a malformed command line (as in getopt-based tools).
inline constexpr int kUsageError = 2;

/// Each takes argv with argv[0] = the subcommand name and returns the exit status.
int run_main(int argc, char** argv);
int store_main(int argc, char** argv);
int info_main(int argc, char** argv);
int bench_main(int argc, char** argv);
/// `strata bench moe` (reached through bench_main; argv[0] = "moe").
int bench_moe_main(int argc, char** argv);

/// Matches option `arg` against `names` ("-n", "--np") in the forms "--np V", "--np=V" and,
/// for one-letter names, "-nV". On a match stores the value, advances `i` past what was
/// consumed and returns true; a missing value sets `error`.
bool take_option(int argc, char** argv, int& i, std::initializer_list<std::string_view> names, std::string& value,
                 std::string& error);
/// The job token in file `path`: its first line, trailing whitespace removed. Refuses an
/// empty token and warns (through print_error with `who`) when others may read the file.
Result<std::string> read_token_file(const std::string& path, std::string_view who);
/// The warning printed when a token is given on the command line, where every user of the
/// host can read it in /proc/PID/cmdline.
void warn_token_on_command_line(std::string_view who);
/// `bytes` random bytes from /dev/urandom, hex encoded.
Result<std::string> random_hex(size_t bytes);
/// "SIGKILL" for 9; "signal 99" for numbers the C library does not name.
std::string signal_name(int sig);
/// Writes "<prefix>: <msg>\n" to stderr in one write, so lines from several processes
/// sharing the terminal do not interleave mid-line.
void print_error(std::string_view prefix, std::string_view msg);
/// Writes all of `data` to `fd`, retrying short writes; gives up quietly on EPIPE and
/// other errors (a closed terminal must not stop the job).
void write_all(int fd, std::string_view data);

}  // namespace strata::cli

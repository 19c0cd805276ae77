#pragma once
// A neighbour process for `strata bench --neighbour` and its peers: load on the cores the ranks
// run on, so a sweep measures what a shared host does to the wait paths. "sleepy" wakes and
// sleeps often (as a test suite's processes do: the case that once cost every call a 1 ms
// futex timeout); "busy" only spins (the case the scheduler handles by time slices).

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace strata::bench {

/// What runs beside the benchmark.
enum class Neighbour { None, Sleepy, Busy };
/// "none", "sleepy", "busy".
const char* neighbour_name(Neighbour n);
/// Parses "none", "sleepy" or "busy".
std::optional<Neighbour> parse_neighbour(std::string_view s);

/// Each sleepy thread loops: spin kSleepyBusyUs, then sleep a uniformly drawn
/// kSleepyMinSleepUs..kSleepyMaxSleepUs (its own generator, so the threads drift apart).
inline constexpr int kSleepyBusyUs = 200;
inline constexpr int kSleepyMinSleepUs = 100;
inline constexpr int kSleepyMaxSleepUs = 500;

/// One line that says what `n` does with `threads` threads (for the logs and the table).
std::string neighbour_description(Neighbour n, int threads);

/// A started neighbour: a child process with one thread per core this process may run on.
/// It dies with the thread that started it (PR_SET_PDEATHSIG), so a killed benchmark leaves
/// nothing behind; stop() kills and reaps it.
class NeighbourProcess {
 public:
  NeighbourProcess() = default;
  NeighbourProcess(const NeighbourProcess&) = delete;
  NeighbourProcess& operator=(const NeighbourProcess&) = delete;
  ~NeighbourProcess() { stop(); }

  /// Forks the neighbour (call it while this process is single-threaded: the child starts
  /// threads). Returns "" or an error message; `n` == None starts nothing.
  std::string start(Neighbour n);
  /// Kills and reaps the neighbour, if one runs.
  void stop();
  /// Its pid, -1 when none runs.
  pid_t pid() const { return pid_; }
  /// Its thread count (0 when none runs).
  int threads() const { return threads_; }

 private:
  pid_t pid_ = -1;
  int threads_ = 0;
};

}  // namespace strata::bench

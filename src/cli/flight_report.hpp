#pragma once
// The launcher's side of the flight recorder: when `strata run` gets SIGUSR1 it forwards it to
// the ranks, each rank's library writes its recorder as marked lines on stderr
// ("strata-flight: ...", written by coll/flight.cpp), and this collects those lines and merges
// them into one report: for every rank its last completed and its pending operation, and
// which ranks each pending one waits for.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace strata::cli::launch {

/// Marker at the start of every line of a rank's dump (the same text as coll's kFlightMarker;
/// the CLI does not include coll internals).
inline constexpr const char* kFlightLineMarker = "strata-flight:";

/// One collection: the ranks asked, and what they answered.
class FlightReport {
 public:
  /// Global rank `rank` was asked and is expected to answer.
  void expect(int rank) { expected_.insert(rank); }
  /// Takes one line of a rank's stderr: true when it belongs to a dump (the launcher then
  /// does not relay it).
  bool take(const std::string& line);
  /// Whether every expected rank has sent its whole dump.
  bool complete() const;
  /// The report, one or more lines for every rank in `ranks` (global ranks, those that did
  /// not answer included).
  std::vector<std::string> render(const std::vector<int>& ranks) const;

 private:
  struct Op {
    uint32_t seq = 0;
    std::string kind, dtype, state;
    uint64_t count = 0;
    int root = -1;
    long long queued_ms = -1, started_ms = -1, done_ms = -1;
  };
  struct Comm {
    std::string id;
    int crank = 0, size = 0;
    std::vector<int> members;  // comm rank -> global rank
    std::vector<Op> ops;       // oldest first
  };
  struct Dump {
    bool ended = false;
    std::vector<Comm> comms;
  };
  /// The highest collective sequence number global rank `g` reached on communicator `id`;
  /// -1 when it answered but recorded none, -2 when it did not answer.
  long long progress(int g, const std::string& id) const;
  std::string line_of(int g, const Comm& c) const;

  std::set<int> expected_;
  std::map<int, Dump> dumps_;
};

/// Whether process `pid` catches `sig` (its SigCgt in /proc): only such ranks are sent
/// SIGUSR1, which would end a process that has no handler for it.
bool catches_signal(pid_t pid, int sig);

}  // namespace strata::cli::launch

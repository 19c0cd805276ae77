#pragma once
// Store keys of the recovery protocol, shared by the controller (`strata run --ft`) and the
// library. Everything lives under "strata/<job>/ft/".

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::recovery::keys {

inline std::string base(const std::string& job) { return "strata/" + job + "/ft/"; }
/// Set by the controller when the job enters epoch e: the ranks being replaced ("2,5"),
/// cumulative since the last completed recovery. Ranks wait on it: it is the revoke notice.
inline std::string epoch(const std::string& job, uint64_t e) { return base(job) + "epoch/" + std::to_string(e); }
/// The controllers' shared failure state "EPOCH FAILURES RANKS" (RANKS "-" when none),
/// advanced by compare-and-set (cli/ft_controller.hpp).
inline std::string state(const std::string& job) { return base(job) + "state"; }
/// An epoch notice that starts with this ends the job instead of replacing ranks: what
/// follows says why (a host lost with no spare host to take its ranks).
inline constexpr char kFatal = '!';
/// Controller's timestamps (CLOCK_REALTIME ns) for epoch e.
inline std::string detected(const std::string& job, uint64_t e) { return base(job) + "detected/" + std::to_string(e); }
inline std::string spawned(const std::string& job, uint64_t e) { return base(job) + "spawned/" + std::to_string(e); }
/// Written right before a deliberate failure (recovery::mark_failure).
inline std::string injected(const std::string& job, uint64_t e) { return base(job) + "injected/" + std::to_string(e); }
/// A rank's heartbeat counter; kExiting once it shuts down (no longer watched).
inline constexpr const char* kExiting = "exiting";
inline std::string heartbeat(const std::string& job, int rank) { return base(job) + "hb/" + std::to_string(rank); }
// A rank whose failure no controller announced names the peer it waited for ("<phase> <by>"),
// and says it is recovering itself ("<phase>"): a peer named but not recovering is stuck (in
// the program, a stopped spare) or left early (exit 0), which no heartbeat or exit reveals.
// The phase tells a failure while the job ran in epoch e (2e + 1) from a replacement that did
// not join the rebuild into epoch e (2e).
inline uint64_t running_phase(uint64_t epoch) { return 2 * epoch + 1; }
inline uint64_t rebuild_phase(uint64_t epoch) { return 2 * epoch; }
inline std::string suspect(const std::string& job, int rank) { return base(job) + "suspect/" + std::to_string(rank); }
inline std::string suspect_prefix(const std::string& job) { return base(job) + "suspect/"; }
inline std::string recovering_prefix(const std::string& job) { return base(job) + "recovering/"; }
inline std::string recovering(const std::string& job, int rank) {
  return recovering_prefix(job) + std::to_string(rank);
}
/// A replaced rank's world record in epoch e (host, pid, control block).
inline std::string join(const std::string& job, uint64_t e, int rank) {
  return base(job) + "join/" + std::to_string(e) + "/" + std::to_string(rank);
}
/// Arrival counter and completion flag of the rebuild of epoch e.
inline std::string arrived(const std::string& job, uint64_t e) { return base(job) + "arrived/" + std::to_string(e); }
inline std::string ready(const std::string& job, uint64_t e) { return base(job) + "ready/" + std::to_string(e); }

/// Hot spares (`strata run --ft --spares K`). Spare N sets `spare` to its pid when it waits in
/// strata::init(); the launcher hands it a rank by setting `assign` to "RANK EPOCH".
inline std::string spare(const std::string& job, int id) { return base(job) + "spare/" + std::to_string(id); }
inline std::string assign(const std::string& job, int id) { return base(job) + "assign/" + std::to_string(id); }
/// Spare N's beat while it waits: a counter it adds to every heartbeat interval, so that the
/// launcher hands no rank to a spare that is stopped or hung, and replaces such a spare.
inline std::string spare_beat(const std::string& job, int id) { return base(job) + "spare-beat/" + std::to_string(id); }

/// A notice's ranks may carry the host they move to ("2@h2,3@h2"): a whole host was lost
/// and its ranks start again on a spare host. parse_ranks ignores the hosts.
inline std::string with_host(int rank, const std::string& host) { return std::to_string(rank) + "@" + host; }

/// "2@h2,3@h2,5" -> {2: "h2", 3: "h2"}: the ranks that move to another host.
inline std::vector<std::pair<int, std::string>> parse_moves(const std::string& s) {
  std::vector<std::pair<int, std::string>> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    if (size_t at = item.find('@'); at != std::string::npos && at + 1 < item.size()) {
      try {
        out.emplace_back(std::stoi(item.substr(0, at)), item.substr(at + 1));
      } catch (...) {
      }
    }
    i = j + 1;
  }
  return out;
}

/// "2,5" -> {2, 5}; malformed entries are skipped.
inline std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    try {
      out.push_back(std::stoi(s.substr(i, j - i)));
    } catch (...) {
    }
    i = j + 1;
  }
  return out;
}

inline std::string format_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace strata::recovery::keys

#pragma once
// The failure-recovery controller of `strata run --ft`: the policy and the failure detector.
// The launcher owns the processes (spawn, kill, reap); this class decides what a failure
// means, announces epochs through the store (the revoke notice every rank waits on), and
// watches heartbeats so a hung or stopped rank is caught as well as one that exited.
//
// In a multi-node job every host's agent runs one for its own ranks. They share no state but
// the job's store: the epoch, the job-wide failure count and the ranks being replaced live
// in one key that an agent advances with compare-and-set, so two hosts that lose a rank at
// the same moment announce two consecutive epochs, the second one listing both ranks.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"
#include "recovery/keys.hpp"

namespace strata::cli {

struct FtOptions {
  int max_failures = 3;      // failures (ranks) replaced before giving up
  bool restart_all = false;  // baseline: restart every rank (torchrun-like)
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds heartbeat_timeout{1000};
  // A replacement started afresh must beat within this (Env::start_timeout_or_default()).
  std::chrono::milliseconds start_timeout{150000};
  int world_size = 0;  // every rank of the job, on every host
};

class FtController {
 public:
  /// Watches `ranks` (global ranks: those of this host) of job `job_id`.
  FtController(FtOptions opts, std::string job_id, std::vector<int> ranks)
      : opts_(opts), job_(std::move(job_id)), state_key_(recovery::keys::state(job_)), ranks_(std::move(ranks)) {}
  ~FtController();
  /// Stops the watcher; call before the store goes away (it would retry reaching it).
  void stop();

  /// Connects to the job's store and starts the heartbeat watcher: a thread with
  /// its own connection, so that reading every rank's beat never delays the launcher's
  /// reaction to an exit. It signals event_fd() when it finds a hung rank.
  /// `reconnect` bounds how long a request waits for a store that went away: across hosts,
  /// the agent timeout (a store silent that long is lost with its node), else the store
  /// client's default.
  Status start(const bootstrap::StoreAddress& addr, const std::string& token,
               std::optional<std::chrono::milliseconds> reconnect = std::nullopt);
  int event_fd() const { return event_fd_; }
  /// A rank found silent: its heartbeat stopped for longer than the timeout, or, replaced, its
  /// first beat did not come within start_grace().
  struct Hung {
    int rank;
    bool never_started;  // the process that was to be the rank never began as it
    bool spare;          // ... and it was a hot spare handed the rank (else started afresh)
  };
  /// Ranks found silent, each reported once per process (a report about a rank replaced
  /// meanwhile is dropped).
  std::vector<Hung> take_hung();
  /// Hot spares whose wait beat (keys::spare_beat) stopped for longer than the heartbeat
  /// timeout while they waited, each once.
  std::vector<int> take_hung_spares();
  /// Watches hot spare `spare`'s beat from its first one on, until forget_spare().
  void watch_spare(int spare);
  void forget_spare(int spare);
  /// False for a watched spare whose beat has stopped for longer than the heartbeat timeout.
  bool spare_alive(int spare);
  /// `rank` (of this host) was handed to a hot spare (`spare`) or started afresh: it is hung
  /// unless its first heartbeat comes within start_grace(spare).
  void expect_start(int rank, bool spare);
  /// A spare has paid its start-up and only joins: 2 x the heartbeat timeout, at least 2 s. A
  /// fresh process also starts the program (imports, its own set-up): the start timeout.
  std::chrono::milliseconds start_grace(bool spare) const {
    return spare ? std::max(2 * opts_.heartbeat_timeout, std::chrono::milliseconds(2000)) : opts_.start_timeout;
  }
  /// Ranks of this host that a peer named as the one it waited for when it saw a failure no
  /// controller announced, and that did not begin recovering themselves within a grace: stuck
  /// in the program (a heartbeat comes from the library's thread), a spare or replacement
  /// stopped before it beat, or a rank that exited with code 0 while the others needed it.
  /// Each (rank, the peer that named it) once per process.
  std::vector<std::pair<int, int>> take_suspected();
  /// The epoch in which every rank of the job is recovering although no controller announced
  /// a failure (a rank called abort(), or every rank recover()): a rebuild that replaces no
  /// rank lets them all go on. Once per epoch; nullopt when there is none.
  std::optional<uint64_t> take_rebuild();
  /// Announces the epoch after `e` with no rank to replace; false when the job moved on
  /// meanwhile (another host's agent did it, or a failure came).
  bool announce_rebuild(uint64_t e);

  /// Ranks (global) failed. Returns false when the job-wide failure budget is spent (the
  /// job must stop) or the store cannot be reached (`why` then says so); otherwise moves the
  /// job to a new epoch, publishes the notice and the caller starts replacements with epoch().
  /// `new_host`: the ranks start again on another host (a spare host took a lost host's).
  /// `before_notice` runs once the new epoch is known and before the notice goes out: hot
  /// spares handed their ranks there start joining before every survivor wakes on the notice
  /// and floods the store.
  bool on_failure(const std::vector<int>& ranks, std::string* why, const std::string& new_host = "",
                  const std::function<void()>& before_notice = {});
  /// Ends the job's recovery: announces an epoch whose notice is fatal (`why`), so that every
  /// rank's pending and later operations and its recover() fail with Unavailable naming it.
  /// Once per job: a notice another agent announced first stands.
  void announce_fatal(const std::string& why);
  /// Records that replacements were started (for the recovery report).
  void on_spawned();
  /// The controller's own store traffic for the current failure (from on_failure through
  /// on_spawned and handing ranks to spares): "N requests, B bytes", for the launcher's log.
  std::string failure_cost() const;
  /// Hands `rank` to hot spare `spare` in the current epoch (it waits in strata::init()).
  Status assign_spare(int spare, int rank);
  /// Whether hot spare `spare` has reached strata::init() and waits there.
  bool spare_waiting(int spare);
  /// Whether the rebuild of the job's newest epoch is complete (its ready flag is up).
  bool recovered();
  /// restart_all: the restarted job runs under a new id (nothing of the old one is reused).
  void set_job(std::string job_id);

  /// The epoch this agent announced last.
  uint64_t epoch() const { return epoch_; }
  /// Failures counted job-wide, as of this agent's last announcement.
  int failures() const { return failures_; }
  const FtOptions& options() const { return opts_; }

 private:
  struct Beat {
    std::string value;
    bool seen = false;      // a first beat arrived: the rank is up and watched
    bool reported = false;  // reported hung; not again until it is replaced
    uint64_t gen = 0;       // bumped per replacement
    std::chrono::steady_clock::time_point changed{};
    // Replaced: its first beat must come by then (expect_start), from a spare or not.
    std::optional<std::chrono::steady_clock::time_point> start_by;
    bool start_spare = false;
    // Named by a peer as the one it waited for (keys::suspect), in phase suspect_phase.
    uint64_t suspect_phase = UINT64_MAX;
    int suspected_by = -1;
    bool suspect_reported = false;
    std::chrono::steady_clock::time_point suspect_since{};
  };
  /// The job's failure state (one store key): newest epoch, failures so far, and the ranks
  /// being replaced since the last completed rebuild.
  struct JobState {
    uint64_t epoch = 0;
    int failures = 0;
    std::vector<int> pending;
    std::vector<std::pair<int, std::string>> moves;  // pending ranks that start on another host
    bool fatal = false;                              // a fatal notice was announced: nothing more is
  };
  /// Moves the shared state one epoch on with `change` applied, by compare-and-set; the new
  /// state, or nullopt (with `why`) when the store failed or `change` refused (returned false).
  std::optional<JobState> advance(const std::function<bool(JobState&)>& change, std::string* why);
  static JobState parse_state(const std::string& v);
  static std::string format_state(const JobState& st);
  /// The ranks being replaced as a notice lists them ("2,3@h2"; see recovery/keys.hpp).
  static std::string format_pending(const JobState& st);
  void reset_heartbeat(int rank);  // global rank; caller holds mu_
  void watch_loop();
  bool check_reports(const std::string& job);
  bool watch_spares(const std::string& job);  // samples the watched spares' beats; true: one hung
  /// Records the beat counter `value` read at `now` into `b` (a Beat or a SpareBeat); true,
  /// once, when it has not changed for longer than the heartbeat timeout. Caller holds mu_.
  template <class B>
  bool went_silent(B& b, const std::string& value, std::chrono::steady_clock::time_point now) {
    if (!b.seen || value != b.value) {
      b.value = value;
      b.seen = true;
      b.changed = now;
      return false;
    }
    if (b.reported || now - b.changed <= opts_.heartbeat_timeout) return false;
    b.reported = true;
    return true;
  }
  std::chrono::milliseconds tick_interval() const {
    // A quarter of the timeout catches a hang within 1.25x the timeout.
    return std::max(opts_.heartbeat_interval, opts_.heartbeat_timeout / 4);
  }

  FtOptions opts_;
  std::string job_;
  std::string state_key_;                          // under the first job id: --restart-all's new ids keep the count
  std::vector<int> ranks_;                         // watched, global
  std::unique_ptr<bootstrap::StoreClient> store_;  // the launcher thread's
  std::unique_ptr<bootstrap::StoreClient> watch_store_;  // the watcher's
  uint64_t epoch_ = 0;
  int failures_ = 0;
  bootstrap::StoreClient::Counters at_failure_;  // store_'s counters when the last failure came in

  std::mutex mu_;            // guards job_ (for the watcher), beats_, hung_, spares_, hung_spares_
  std::vector<Beat> beats_;  // per watched rank (ranks_ order)
  struct Found {
    int index;
    uint64_t gen;
    bool never_started, spare;
  };
  std::vector<Found> hung_;  // found by the watcher
  struct SpareBeat {
    std::string value;
    bool seen = false, reported = false;
    std::chrono::steady_clock::time_point changed{};
  };
  std::map<int, SpareBeat> spares_;  // watched hot spares, by id
  std::vector<int> hung_spares_;
  std::vector<std::pair<int, uint64_t>> suspected_;  // (index, gen) named by a peer, not recovering
  std::optional<uint64_t> rebuild_;                  // every rank recovering in this epoch
  uint64_t rebuild_seen_ = UINT64_MAX;               // the last such epoch, reported once
  std::thread watcher_;
  std::atomic<bool> stop_{false};
  int event_fd_ = -1;
};

}  // namespace strata::cli

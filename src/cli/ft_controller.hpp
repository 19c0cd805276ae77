#pragma once
// The failure-recovery controller of `strata run --ft`: the policy and the failure detector.
// The launcher owns the processes (spawn, kill, reap); this class decides what a failure
// means, announces epochs through the store (the revoke notice every rank waits on), and
// watches heartbeats so a hung or stopped rank is caught as well as one that exited.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"

namespace strata::cli {

struct FtOptions {
  int max_failures = 3;      // failures (ranks) replaced before giving up
  bool restart_all = false;  // baseline: restart every rank (torchrun-like)
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds heartbeat_timeout{1000};
};

class FtController {
 public:
  FtController(FtOptions opts, std::string job_id, int nranks) : opts_(opts), job_(std::move(job_id)), n_(nranks) {}
  ~FtController();
  /// Stops the watcher; call before the store goes away (it would retry reaching it).
  void stop();

  /// Connects to the launcher's own store and starts the heartbeat watcher: a thread with
  /// its own connection, so that reading every rank's beat never delays the launcher's
  /// reaction to an exit. It signals event_fd() when it finds a hung rank.
  Status start(const bootstrap::StoreAddress& addr, const std::string& token);
  int event_fd() const { return event_fd_; }
  /// Ranks whose heartbeat stopped for longer than the timeout, each reported once per
  /// process (a report about a rank replaced meanwhile is dropped).
  std::vector<int> take_hung();

  /// A rank failed (`why` says how). Returns false when the failure budget is spent (the
  /// job must stop); otherwise bumps the epoch, publishes the notice and the caller starts
  /// a replacement with epoch().
  bool on_failure(const std::vector<int>& ranks, const std::string& why);
  /// Records that replacements were started (for the recovery report).
  void on_spawned();
  /// The controller's own store traffic for the current failure (from on_failure through
  /// on_spawned and handing ranks to spares): "N requests, B bytes", for the launcher's log.
  std::string failure_cost() const;
  /// Hands `rank` to hot spare `spare` in the current epoch (it waits in strata::init()).
  Status assign_spare(int spare, int rank);
  /// Whether hot spare `spare` has reached strata::init() and waits there.
  bool spare_waiting(int spare);
  /// Whether the rebuild of the current epoch is complete (its ready flag is up).
  bool recovered();
  /// restart_all: the restarted job runs under a new id (nothing of the old one is reused).
  void set_job(std::string job_id);

  uint64_t epoch() const { return epoch_; }
  int failures() const { return failures_; }
  const FtOptions& options() const { return opts_; }

 private:
  struct Beat {
    std::string value;
    bool seen = false;      // a first beat arrived: the rank is up and watched
    bool reported = false;  // reported hung; not again until it is replaced
    uint64_t gen = 0;       // bumped per replacement
    std::chrono::steady_clock::time_point changed{};
  };
  void reset_heartbeat(int rank);  // caller holds mu_
  void watch_loop();
  std::chrono::milliseconds tick_interval() const {
    // A quarter of the timeout catches a hang within 1.25x the timeout.
    return std::max(opts_.heartbeat_interval, opts_.heartbeat_timeout / 4);
  }

  FtOptions opts_;
  std::string job_;
  int n_;
  std::unique_ptr<bootstrap::StoreClient> store_;        // the launcher thread's
  std::unique_ptr<bootstrap::StoreClient> watch_store_;  // the watcher's
  uint64_t epoch_ = 0;
  int failures_ = 0;
  std::set<int> pending_;                        // replaced since the last completed rebuild
  bootstrap::StoreClient::Counters at_failure_;  // store_'s counters when the last failure came in

  std::mutex mu_;  // guards job_ (for the watcher), beats_, hung_
  std::vector<Beat> beats_;
  std::vector<std::pair<int, uint64_t>> hung_;  // (rank, gen) found by the watcher
  std::thread watcher_;
  std::atomic<bool> stop_{false};
  int event_fd_ = -1;
};

}  // namespace strata::cli

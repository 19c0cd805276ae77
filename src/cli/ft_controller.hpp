#pragma once
// The failure-recovery controller of `strata run --ft`: the policy and the failure detector.
// The launcher owns the processes (spawn, kill, reap); this class decides what a failure
// means, announces epochs through the store (the revoke notice every rank waits on), and
// watches heartbeats so a hung or stopped rank is caught as well as one that exited.

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"

namespace strata::cli {

struct FtOptions {
  int max_failures = 3;                           // failures (ranks) replaced before giving up
  bool restart_all = false;                       // baseline: restart every rank (torchrun-like)
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds heartbeat_timeout{1000};
};

class FtController {
 public:
  FtController(FtOptions opts, std::string job_id, int nranks) : opts_(opts), job_(std::move(job_id)), n_(nranks) {}

  /// Connects to the launcher's own store.
  Status connect(const bootstrap::StoreAddress& addr, const std::string& token);

  /// A rank failed (`why` says how). Returns false when the failure budget is spent (the
  /// job must stop); otherwise bumps the epoch, publishes the notice and the caller starts
  /// a replacement with epoch().
  bool on_failure(const std::vector<int>& ranks, const std::string& why);
  /// Records that replacements were started (for the recovery report).
  void on_spawned();
  /// The replacement of `rank` started: forget its predecessor's heartbeats.
  void reset_heartbeat(int rank);

  /// Call every tick_interval(): ranks (among `running`) whose heartbeat stopped for
  /// longer than the timeout. Also notices completed rebuilds.
  std::vector<int> check(const std::vector<int>& running);
  /// Reading every rank's beat costs one store round trip each: a quarter of the timeout
  /// is often enough to catch a hang within 1.25x the timeout.
  std::chrono::milliseconds tick_interval() const {
    return std::max(opts_.heartbeat_interval, opts_.heartbeat_timeout / 4);
  }

  /// restart_all: the restarted job runs under a new id (nothing of the old one is reused).
  void set_job(std::string job_id) {
    job_ = std::move(job_id);
    beats_.assign(static_cast<size_t>(n_), Beat{});
  }
  uint64_t epoch() const { return epoch_; }
  int failures() const { return failures_; }
  const FtOptions& options() const { return opts_; }

 private:
  struct Beat {
    std::string value;
    bool seen = false;  // a first beat arrived: the rank is up and watched
    std::chrono::steady_clock::time_point changed{};
  };
  FtOptions opts_;
  std::string job_;
  int n_;
  std::unique_ptr<bootstrap::StoreClient> store_;
  uint64_t epoch_ = 0;
  int failures_ = 0;
  std::set<int> pending_;  // replaced since the last completed rebuild
  std::vector<Beat> beats_;
};

}  // namespace strata::cli

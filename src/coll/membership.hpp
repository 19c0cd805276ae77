#pragma once
// The narrow interface through which the recovery layer (src/recovery/) rebuilds a
// communicator and watches the job: what it may ask of a communicator (Membership) and of a
// rank's process context (ContextRef), and the state the context keeps on recovery's behalf.
//
// Recovery sits above the collectives and must never reach into their internals: it sees
// ranks, store records and control-block references, never CommImpl's fields. Both classes
// are thin, non-allocating views; their methods live in membership.cpp, the one place where
// the recovery hooks touch the internals.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <strata/recovery.hpp>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"
#include "common/deadline.hpp"
#include "common/env.hpp"
#include "common/status.hpp"
#include "memory/heap.hpp"

namespace strata::detail {

struct CommImpl;
struct ContextImpl;

/// A process-wide service the recovery layer attaches to a context (the failure monitor);
/// the context only owns it, so the collectives never depend on recovery.
struct ContextService {
  virtual ~ContextService() = default;
};

/// What this process knows about the job's failure epochs (all times CLOCK_REALTIME ns, so
/// they compare across processes). Owned by the context, written by the recovery layer.
struct EpochState {
  std::atomic<uint64_t> latest{0};  // newest epoch announced by the controller
  std::atomic<int64_t> seen_ns{0};  // when this process saw `latest` announced
  uint64_t joined = 0;              // epoch the world communicator was last built for
  std::mutex mu;
  recovery::Report report;  // the last recovery, for recovery::last_report
  /// The report's controller timestamps are read from the store when first asked for
  /// (last_report), not in the rebuild: from epoch `times_from` to report.epoch.
  uint64_t times_from = 0;
  bool times_pending = false;
  /// Raises `latest` to `e`, whose notice (the value of the epoch key) is `notice`, and wakes
  /// the threads in wait_newer.
  void announce(uint64_t e, std::string notice) {
    {
      std::lock_guard<std::mutex> g(mu);
      latest.store(e, std::memory_order_release);
      notices[e] = std::move(notice);
      // A rebuild reads only the newest epochs; keep a few in case several came at once.
      while (notices.size() > 8) notices.erase(notices.begin());
    }
    newer.notify_all();
  }
  /// The notice of epoch `e` as the monitor received it, if it did: the rebuild then needs
  /// no store request for it (at 64 ranks, 63 of them queued at the store at once).
  std::optional<std::string> notice(uint64_t e) {
    std::lock_guard<std::mutex> g(mu);
    auto it = notices.find(e);
    if (it == notices.end()) return std::nullopt;
    return it->second;
  }
  /// Waits until `latest` is past `e` or `d` expires; whether it is. A rank that saw a
  /// failure before the controller's notice sleeps here instead of polling: at 64 ranks
  /// on 2 cores, 63 survivors waking every millisecond slowed the controller they wait for.
  bool wait_newer(uint64_t e, Deadline d) {
    std::unique_lock<std::mutex> lk(mu);
    return newer.wait_until(lk, d.at(), [&] { return latest.load(std::memory_order_acquire) > e; });
  }

 private:
  std::condition_variable newer;
  std::map<uint64_t, std::string> notices;
};

/// A rank's record for the world communicator in the store: where its control block is.
struct WorldRecord {
  std::string host;
  long pid = 0;
  memory::SegRef ctrl{};
  uint64_t epoch = 0;  // the recovery epoch its process started in (0: with the job)
};
/// Reads a record written by Membership::world_record (or world_record in comm_impl.hpp).
Result<WorldRecord> parse_world_record(const std::string& v);
/// The store key `suffix` of job `job_id` (every key the library writes for a job).
std::string job_store_key(const std::string& job_id, const std::string& suffix);
/// The store key of rank `rank`'s world record in job `job_id`.
std::string world_record_key(const std::string& job_id, int rank);

/// What the recovery layer may use of a rank's process context: where the rank sits in the
/// job, the store, the failure epochs, the monitor slot and the revoke of every communicator.
/// Holds a reference to the context (the monitor thread keeps one only while it acts).
class ContextRef {
 public:
  /// A reference to `ctx` (kept alive while this ContextRef lives).
  explicit ContextRef(std::shared_ptr<ContextImpl> ctx);

  /// Where this rank sits in the job (rank, size, job id, host, store address, token).
  const bootstrap::JobInfo& job() const;
  /// The settings the context was built with.
  const Env& env() const;
  /// The job's store; null for a single rank without one.
  bootstrap::StoreClient* store() const;
  /// Key of global rank `rank`'s world record in the store.
  std::string world_key(int rank) const;
  /// The failure epochs this process has seen and the last recovery's report.
  EpochState& epochs() const;
  /// Whether a failure monitor is attached (the job runs under `strata run --ft`).
  bool has_monitor() const;
  /// Hands the failure monitor to the context, which keeps it until it is destroyed.
  void set_monitor(std::unique_ptr<ContextService> monitor) const;
  /// Fails every pending and later operation of every communicator of this process with
  /// `why` (sticky until the communicator is rebuilt).
  void revoke_all(const Status& why) const;
  /// The context itself, opaque here: to hand to coll's constructors or to keep a weak_ptr.
  const std::shared_ptr<ContextImpl>& impl() const { return ctx_; }

 private:
  std::shared_ptr<ContextImpl> ctx_;
};

/// What the recovery layer may do with one communicator: read its shape, drop and re-attach
/// members, reset and resume its synchronisation, revoke it. A non-owning view: the caller
/// keeps the communicator alive. Everything that changes the communicator needs the lock
/// that quiesce() returns.
class Membership {
 public:
  /// A view of `comm`, which must stay alive as long as the view is used.
  explicit Membership(const std::shared_ptr<CommImpl>& comm);

  /// This rank in the communicator.
  int rank() const;
  /// The number of members.
  int size() const;
  /// The communicator's name ("world" for the world communicator).
  const std::string& id() const;
  /// The default deadline of its operations.
  std::chrono::milliseconds timeout() const;
  /// Whether its members span hosts (its data then moves over the network transport).
  bool spans_hosts() const;
  /// Whether member r runs on this rank's host (always, within one host).
  bool same_host(int r) const;
  /// The host identity member r runs on.
  const std::string& host_of(int r) const;
  /// Member r runs on `host` from now on: its whole host was lost and every member there
  /// started again on a spare host (the host keeps its place among the communicator's hosts).
  void move_host(int r, const std::string& host);
  /// Global rank of member `r`.
  int global_rank(int r) const;
  /// The process context of this communicator.
  ContextRef context() const;

  /// Takes the communicator's execution lock, so nothing runs on it while the caller holds
  /// the returned lock, and fails every operation still queued for the copy engine with
  /// `why` (it belongs to an epoch that is over).
  [[nodiscard]] std::unique_lock<std::mutex> quiesce(const Status& why);
  /// Forgets member r: its control-block view and every heap mapping of its process (on
  /// this host; for a member on another host see reset_net_peer).
  void drop_peer(int r);
  /// Member r was replaced by a process started in recovery `epoch`: its
  /// transport endpoint and memory keys are dropped and made afresh on next use; the
  /// endpoints to the other members stay. No-op on a communicator within one host.
  void reset_net_peer(int r, uint64_t epoch);
  /// Member r is the process `pid` of its record on this host: its memory is taken from that
  /// process only.
  void expect_pid(int r, long pid);
  /// Maps the control block member r published at `ref` without attaching it yet: lets a
  /// rank that joins many peers wait for their fd servers in parallel. Safe from several
  /// threads at once.
  Status map_peer(int r, const memory::SegRef& ref, Deadline d);
  /// Takes [base, base + size) as the mapping of segment `seg` of member r's process `pid`,
  /// made beforehand (a hot spare's, while it waited): see memory::Heap::adopt_peer_segment.
  Status adopt_peer_segment(int r, uint32_t seg, char* base, size_t size, long pid);
  /// Attaches member r's (new) control block at `ref` and watches its (new) process.
  Status attach_peer(int r, const memory::SegRef& ref, Deadline d);
  /// Restarts this rank's sequence counters and its control block's signals at zero for
  /// recovery epoch `epoch` (which message tags across hosts carry), keeping
  /// its identity (and every peer's mapping of it) and what a slow peer may still be reading
  /// (descriptors, count vectors, message slots).
  void reset_sync_state(uint64_t epoch);
  /// Clears the abort flag and the sticky error: the communicator is usable again in the
  /// epoch it was rebuilt for.
  void clear_broken();
  /// Fails every pending and later operation of this communicator with `why` (sticky).
  void revoke(const Status& why);
  /// The peer named by the failure that broke this communicator (-1 when none or unbroken):
  /// recovery reports it to the controller when the controller saw nothing fail.
  int failed_peer();
  /// One barrier step across all members.
  Status sync(Deadline d, const char* what);
  /// Peer signals this rank has waited for in barrier steps so far (every collective's
  /// steps included): recovery counts its own cost from differences of it.
  uint64_t peer_waits() const;
  /// This rank's world record (host, pid, control block) for the store.
  Result<std::string> world_record() const;
  /// Decides single-copy (CMA) reads from this rank's own probe of every peer. For a
  /// replacement: the survivors keep the verdict they agreed on at setup.
  void probe_cma_alone();

 private:
  CommImpl* c_;
};

// Building a rank's context and its world communicator (context.cpp); the recovery layer's
// strata::init() (recovery/init.cpp) puts them together.

/// The process context of rank `job.rank`: connects to the store (or takes `store`, a
/// connection to job.store made beforehand) and creates the heap. `timeout` is the default
/// deadline of operations (0: the Env's).
Result<ContextRef> make_context(const Env& env, const bootstrap::JobInfo& job, std::chrono::milliseconds timeout,
                                std::unique_ptr<bootstrap::StoreClient> store = nullptr);
/// Builds the world communicator of a job in its first epoch: every rank publishes its
/// control block in the store and attaches every other rank's. When that fails once this
/// rank's block is published (within one host), `*published` is the communicator of that
/// block, so that a failure during setup can be recovered (rebuild) rather than end the rank.
Result<std::shared_ptr<CommImpl>> make_world(const std::shared_ptr<ContextImpl>& ctx,
                                             std::shared_ptr<CommImpl>* published = nullptr);
/// The world communicator of a rank started to replace a failed one: this rank's new control
/// block, no peer attached yet (the recovery layer's rebuild attaches them). `moved`: ranks
/// that start again on another host than their records say (a lost host's), with that host.
Result<std::shared_ptr<CommImpl>> new_world(const std::shared_ptr<ContextImpl>& ctx,
                                            const std::vector<std::pair<int, std::string>>& moved = {});

}  // namespace strata::detail

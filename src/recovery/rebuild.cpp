// Rebuilding the world communicator after a failure, without restarting the survivors.
//
// Survivors keep their process, heap, control block and every mapping of the other
// survivors. What touched a failed rank is dropped (its heap mappings, its pidfd) and
// re-attached to the replacement's new control block; every rank zeroes its own sync state.
// Across hosts the same holds per host, and a survivor on another host than the failed rank
// only renews its transport endpoint to it: the endpoints between survivors stay.
// The meeting point is the store: replacements publish their world record under the epoch,
// every rank bumps one arrival counter and the last one raises the epoch's "ready" flag, so
// a survivor does O(failed ranks) work whatever the job's size. A failure during the
// rebuild moves the job to a newer epoch; everyone notices while waiting and starts over
// with the (cumulative) set of ranks being replaced.

#include "recovery/rebuild.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coll/membership.hpp"
#include "common/log.hpp"
#include "recovery/keys.hpp"
#include "recovery/spare.hpp"

namespace strata {
namespace detail {
namespace {

constexpr auto kSlice = std::chrono::milliseconds(20);
// How long a rank that saw a failure itself waits for the controller's notice before it
// reports the peer it waited for (the controller acts on a report after a longer grace).
constexpr auto kReportAfter = std::chrono::milliseconds(250);

// Waits for every key of `keys` while the job stays in epoch `e`, in one store request per
// slice: their values, nullopt when a newer epoch was announced meanwhile, or Timeout at the
// deadline.
Result<std::optional<std::vector<std::string>>> wait_all_in_epoch(const ContextRef& ctx,
                                                                  const std::vector<std::string>& keys, uint64_t e,
                                                                  Deadline d, const std::string& what) {
  using Values = std::optional<std::vector<std::string>>;
  for (;;) {
    auto v = ctx.store()->get_many(keys, kSlice);
    if (v.is_ok()) return Values(std::move(v.value()));
    if (v.status().code() != Code::Timeout) return v.status();
    if (ctx.epochs().latest.load(std::memory_order_acquire) > e) return Values();
    if (d.expired())
      return timeout_error("recovery of epoch " + std::to_string(e) + " on rank " + std::to_string(ctx.job().rank) +
                           " timed out waiting for " + what + " (" + v.status().message() + ")");
  }
}

// wait_all_in_epoch for one key.
Result<std::optional<std::string>> wait_in_epoch(const ContextRef& ctx, const std::string& key, uint64_t e, Deadline d,
                                                 const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(auto v, wait_all_in_epoch(ctx, {key}, e, d, what));
  if (!v) return std::optional<std::string>();
  return std::optional<std::string>(std::move(v->front()));
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Tells the controller that this rank is recovering in `phase` (keys::running_phase or
// rebuild_phase) and which peers it waited for in vain: what no exit or heartbeat shows it.
void report_to_controller(bootstrap::StoreClient& store, const std::string& job, int me, uint64_t phase,
                          const std::vector<int>& named, const Deadline& d) {
  const std::string p = std::to_string(phase);
  (void)store.set(recovery::keys::recovering(job, me), p, d);
  for (int r : named) (void)store.set(recovery::keys::suspect(job, r), p + " " + std::to_string(me), d);
}

}  // namespace

Status rebuild_world(Membership& m, bool fresh, int suspect) {
  const ContextRef ctx = m.context();
  if (!ctx.has_monitor())
    return unavailable("recover() on rank " + std::to_string(m.rank()) +
                       ": this job does not run under a recovery controller (start it with `strata run --ft`)");
  if (m.id() != "world")
    return invalid_argument("recover() on rank " + std::to_string(m.rank()) + ": communicator '" + m.id() +
                            "' is a sub-communicator; recover the world communicator, then split again");
  EpochState& epochs = ctx.epochs();
  bootstrap::StoreClient& store = *ctx.store();  // the monitor runs only with a store
  const std::string& job = ctx.job().job_id;
  const int me = m.rank(), n = m.size();
  const Deadline d = Deadline::after(m.timeout());
  const int64_t start_ns = recovery::now_ns();
  const bootstrap::StoreClient::Counters store0 = store.counters();
  const uint64_t waits0 = m.peer_waits();
  const uint64_t prev_joined = fresh ? 0 : epochs.joined;
  std::vector<bool> attached(n, !fresh);
  uint32_t premapped = 0;
  attached[me] = true;
  bool reported = false;

  for (;;) {
    uint64_t e = epochs.latest.load(std::memory_order_acquire);
    if (!fresh && e == epochs.joined) {
      // The failure was seen locally (a pidfd, a deadline) before the controller's notice
      // arrived: wait for the notice. When none comes soon, the controller has seen nothing
      // (the peer is stuck in the program, or exited with code 0): tell it which peer this
      // rank waited for, and that this rank itself is recovering.
      if (!reported && !epochs.wait_newer(e, Deadline::after(kReportAfter))) {
        reported = true;
        std::vector<int> named;
        if (suspect >= 0 && suspect < n && suspect != me) named.push_back(suspect);
        report_to_controller(store, job, me, recovery::keys::running_phase(e), named, d);
        continue;
      }
      if (!epochs.wait_newer(e, d))
        return timeout_error("recover() on rank " + std::to_string(me) + ": no new epoch was announced within " +
                             std::to_string(m.timeout().count()) + " ms (is the controller alive?)");
      continue;
    }
    std::optional<std::string> notice = epochs.notice(e);
    if (!notice) {
      STRATA_ASSIGN_OR_RETURN(notice, wait_in_epoch(ctx, recovery::keys::epoch(job, e), e, d, "the epoch notice"));
      if (!notice) continue;
    }
    if (!notice->empty() && (*notice)[0] == recovery::keys::kFatal)
      return unavailable("recover() on rank " + std::to_string(me) + ": the job cannot recover: " + notice->substr(1));
    const std::vector<int> failed = recovery::keys::parse_ranks(*notice);
    // A lost host's ranks start again on a spare host, all of them (the host keeps its place
    // among the communicator's hosts, so nothing else about the layout changes).
    for (const auto& [r, host] : recovery::keys::parse_moves(*notice)) {
      // This rank's host was declared lost (its agent fell silent) while this process went
      // on: its rank starts again on the spare host, and this process must not rejoin as it.
      if (r == me && host != m.host_of(me))
        return aborted("recover() on rank " + std::to_string(me) + ": this host ('" + m.host_of(me) +
                       "') was declared lost in epoch " + std::to_string(e) + " and rank " + std::to_string(me) +
                       " starts again on host '" + host + "'; this process is no longer part of the job");
      if (r >= 0 && r < n && r != me) m.move_host(r, host);
    }
    STRATA_LOG(Info, "rank " << me << ": rebuilding the world communicator in epoch " << e << " (replacing " << *notice
                             << ")");
    m.reset_sync_state(e);
    for (int f : failed) {
      if (f == me || f < 0 || f >= n) continue;
      m.drop_peer(f);
      attached[f] = false;
    }
    if (contains(failed, me)) {
      STRATA_ASSIGN_OR_RETURN(std::string rec, m.world_record());
      STRATA_RETURN_IF_ERROR(store.set(ctx.world_key(m.global_rank(me)), rec));
      STRATA_RETURN_IF_ERROR(store.set(recovery::keys::join(job, e, me), rec));
    }

    // Records first, then the mappings in parallel: a replacement attaches every peer, and
    // each mapping waits for that peer's fd server to be scheduled, which on a busy host is
    // the bulk of its join. Survivors attach only the replaced ranks.
    // One store request for all of them (a replacement reads N - 1).
    std::vector<int> to_read;
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r) {
      if (attached[r]) continue;
      to_read.push_back(r);
      keys.push_back(contains(failed, r) ? recovery::keys::join(job, e, r) : ctx.world_key(m.global_rank(r)));
    }
    std::optional<std::vector<std::string>> values(std::in_place);
    if (!keys.empty()) {
      const std::string what = to_read.size() == 1 ? "rank " + std::to_string(to_read[0]) + " to join"
                                                   : std::to_string(to_read.size()) + " ranks to join";
      auto got = wait_all_in_epoch(ctx, keys, e, d, what);
      if (!got.is_ok()) {
        // A replacement that never joined (stopped before it beat, stuck before init()):
        // named to the controller, which replaces it once it has not begun recovering.
        if (got.status().code() == Code::Timeout) {
          const Deadline soon = Deadline::after(std::chrono::seconds(1));
          // Only those still missing: naming one that joined could have it taken for stuck.
          std::vector<int> missing;
          for (size_t i = 0; i < to_read.size(); ++i) {
            if (!contains(failed, to_read[i])) continue;
            auto there = store.try_get(keys[i], soon);
            if (there.is_ok() && !*there) missing.push_back(to_read[i]);
          }
          report_to_controller(store, job, me, recovery::keys::rebuild_phase(e), missing, soon);
        }
        return got.status();
      }
      values = std::move(got.value());
    }
    if (!values) continue;
    std::vector<int> to_attach;
    std::vector<WorldRecord> recs(static_cast<size_t>(n));
    for (size_t i = 0; i < to_read.size(); ++i) {
      const int r = to_read[i];
      auto parsed = parse_world_record((*values)[i]);
      if (!parsed.is_ok()) return parsed.status().with_context("the record of rank " + std::to_string(r) + ": ");
      recs[r] = std::move(parsed.value());
      if (recs[r].host != m.host_of(r))
        return unavailable("rank " + std::to_string(r) + " rejoined on host '" + recs[r].host + "' but ran on '" +
                           m.host_of(r) +
                           "'; a replacement runs on its predecessor's host, or the whole host's "
                           "ranks move to a spare host together");
      // Across hosts the transport reaches every member, this host's too (point-to-point
      // traffic): its endpoint is made afresh to the process the record names. The
      // endpoints between survivors stay.
      m.reset_net_peer(r, recs[r].epoch);
      if (!m.same_host(r)) {
        attached[r] = true;
        continue;
      }
      m.expect_pid(r, recs[r].pid);
      to_attach.push_back(r);
    }
    // A hot spare mapped most of these before the failure: its mappings of processes the
    // records still name need no fetch now.
    if (fresh) {
      for (const PrefetchedSegment& p : take_prefetched_segments()) {
        const bool wanted = p.rank >= 0 && p.rank < n && contains(to_attach, p.rank) && recs[p.rank].pid == p.pid &&
                            recs[p.rank].ctrl.seg == p.seg;
        if (!wanted) {
          ::munmap(p.base, p.size);
          continue;
        }
        if (m.adopt_peer_segment(p.rank, p.seg, p.base, p.size, p.pid).is_ok()) ++premapped;  // else fetched below
      }
    }
    bool moved = false;
    if (to_attach.size() > 1) {
      std::atomic<size_t> next{0};
      auto map_some = [&] {
        for (size_t i = next++; i < to_attach.size(); i = next++) {
          int r = to_attach[i];
          (void)m.map_peer(r, recs[r].ctrl, d);  // errors: attach_peer below meets them again
        }
      };
      std::vector<std::thread> workers;
      for (size_t t = 1; t < std::min<size_t>(8, to_attach.size()); ++t) workers.emplace_back(map_some);
      map_some();
      for (auto& w : workers) w.join();
    }
    for (int r : to_attach) {
      Status a = m.attach_peer(r, recs[r].ctrl, d);
      if (!a.is_ok()) {
        // A peer that cannot be reached now has most likely just failed too: its notice
        // (a newer epoch) is on the way. Only a deadline without one is an error.
        while (!moved && !d.expired()) {
          moved = epochs.latest.load(std::memory_order_acquire) > e;
          if (!moved) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (!moved) return a;
        break;
      }
      attached[r] = true;
    }
    if (moved) continue;

    // Every rank has zeroed its sync state and attached the new blocks before anyone
    // proceeds: the last arrival raises the flag.
    STRATA_ASSIGN_OR_RETURN(int64_t arrived, store.add(recovery::keys::arrived(job, e), 1));
    if (arrived == n) STRATA_RETURN_IF_ERROR(store.set(recovery::keys::ready(job, e), "1"));
    STRATA_ASSIGN_OR_RETURN(auto ready,
                            wait_in_epoch(ctx, recovery::keys::ready(job, e), e, d, "every rank to arrive"));
    if (!ready) continue;
    const int64_t joined_ns = recovery::now_ns();

    m.clear_broken();
    if (epochs.latest.load(std::memory_order_acquire) != e) {
      // Another failure was announced in the meantime: that revoke must stand.
      m.revoke(peer_failed("another failure was announced during recovery", -1));
      continue;
    }
    // No barrier over all N here: the ready flag already says every rank has reset its sync
    // state and attached the replacements, and a failure from now on surfaces in the
    // restore's agreement (recoverable like any other).
    epochs.joined = e;

    std::lock_guard<std::mutex> g(epochs.mu);
    recovery::Report& rep = epochs.report;
    rep = recovery::Report{};
    rep.epoch = e;
    rep.failed = failed;
    rep.replacement = contains(failed, me);
    rep.premapped = premapped;
    // Several epochs may have passed since the last rebuild (failures during this one):
    // the failure that started it is the first of them. Its timestamps are read when the
    // report is asked for: 3 store requests per epoch and rank, on nobody's critical path.
    epochs.times_from = prev_joined + 1;
    epochs.times_pending = true;
    rep.seen_ns = epochs.seen_ns.load();
    rep.rebuild_start_ns = start_ns;
    rep.joined_ns = joined_ns;
    rep.rebuilt_ns = recovery::now_ns();
    const bootstrap::StoreClient::Counters store1 = store.counters();
    rep.store_ops = store1.ops - store0.ops;
    rep.store_bytes = store1.bytes - store0.bytes;
    rep.peer_waits = m.peer_waits() - waits0;
    return Status::ok();
  }
}

}  // namespace detail

namespace {

detail::Membership membership_or_throw(const std::shared_ptr<detail::CommImpl>& impl) {
  if (!impl)
    throw Error(Code::InvalidArgument, "operation on an invalid (default-constructed or destroyed) communicator");
  return detail::Membership(impl);
}

}  // namespace

void Communicator::recover() {
  detail::Membership m = membership_or_throw(impl_);
  // Nothing runs on this communicator while it is rebuilt; what was queued before the
  // failure belongs to the old epoch and fails.
  // The peer whose failure (or silence) broke this communicator, for the controller if it
  // has not seen that peer fail.
  const int suspect = m.failed_peer();
  auto quiet =
      m.quiesce(peer_failed("operation issued before recovery on rank " + std::to_string(m.rank()) + " was discarded"));
  Status s = detail::rebuild_world(m, /*fresh=*/false, suspect);
  if (!s.is_ok()) throw Error(s.code(), s.message(), m.rank(), s.peer());
}

uint64_t Communicator::epoch() const { return membership_or_throw(impl_).context().epochs().joined; }

namespace recovery {

Report last_report(const Communicator& comm) {
  const detail::ContextRef ctx = membership_or_throw(comm.impl()).context();
  detail::EpochState& epochs = ctx.epochs();
  uint64_t from = 0, to = 0;
  {
    std::lock_guard<std::mutex> g(epochs.mu);
    if (!epochs.times_pending || !ctx.store()) return epochs.report;
    from = epochs.times_from;
    to = epochs.report.epoch;
  }
  auto get_ns = [&](const std::string& key) -> int64_t {
    auto v = ctx.store()->try_get(key);
    if (!v.is_ok() || !v.value()) return 0;
    try {
      return std::stoll(*v.value());
    } catch (...) {
      return 0;
    }
  };
  // The failure that started the rebuild is the first of the epochs it went through.
  int64_t injected = 0, detected = 0, spawned = 0;
  const std::string& job = ctx.job().job_id;
  for (uint64_t k = to; k >= from && k > 0; --k) {
    if (int64_t t = get_ns(keys::injected(job, k))) injected = t;
    if (int64_t t = get_ns(keys::detected(job, k))) detected = t;
    if (int64_t t = get_ns(keys::spawned(job, k))) spawned = t;
  }
  std::lock_guard<std::mutex> g(epochs.mu);
  if (epochs.times_pending && epochs.report.epoch == to) {
    epochs.report.injected_ns = injected;
    epochs.report.detected_ns = detected;
    epochs.report.spawned_ns = spawned;
    epochs.times_pending = false;
  }
  return epochs.report;
}

void mark_failure(const Communicator& comm) {
  const detail::ContextRef ctx = membership_or_throw(comm.impl()).context();
  if (!ctx.store()) return;
  uint64_t next = ctx.epochs().latest.load() + 1;
  (void)ctx.store()->set(keys::injected(ctx.job().job_id, next), std::to_string(now_ns()));
}

}  // namespace recovery
}  // namespace strata

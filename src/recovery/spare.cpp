// A hot spare's wait in strata::init(). The spare paid for its process start-up, its
// program's imports and the library's loading before any failure; what remains after the
// launcher picks it is what a replacement does today (context, monitor, the rebuild's join).
// The rank cannot come from the environment (it is unknown when the spare starts), so it
// comes through the store: the launcher writes "RANK EPOCH" under the spare's key.

#include "recovery/spare.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"
#include "coll/membership.hpp"
#include "common/log.hpp"
#include "memory/fd_channel.hpp"
#include "memory/heap.hpp"
#include "memory/segment.hpp"
#include "recovery/keys.hpp"

namespace strata::detail {
namespace {

// Each blocking get is bounded; between them nothing is checked but the loop goes on, so the
// slice only bounds how long one request is outstanding.
constexpr std::chrono::milliseconds kSlice{1000};
// The store lives in the launcher: when it stops answering the job is over, and the spare
// should not linger retrying.
constexpr std::chrono::milliseconds kReconnect{2000};

std::atomic<uint64_t> g_assigned_epoch{0};

std::mutex g_prefetched_mu;
std::vector<PrefetchedSegment> g_prefetched;

// Drops what was mapped of processes that have exited since: a mapping would keep a dead
// rank's memory allocated for as long as the spare waits. True when it dropped any.
bool drop_exited() {
  std::lock_guard<std::mutex> g(g_prefetched_mu);
  const size_t before = g_prefetched.size();
  std::erase_if(g_prefetched, [](const PrefetchedSegment& s) {
    if (::kill(static_cast<pid_t>(s.pid), 0) == 0 || errno != ESRCH) return false;
    ::munmap(s.base, s.size);
    return true;
  });
  return g_prefetched.size() != before;
}

// Fetches and maps every same-host rank's control-block segment not held yet, once
// all ranks have published their world records; false while some have not (the caller
// tries again later). A peer that cannot be reached, or whose process has exited (its
// replacement has not joined yet), is skipped: the rebuild fetches it as any replacement
// would. Stops early when `stop` is raised.
bool prefetch_peers(const Env& env, bootstrap::StoreClient& store, const std::string& who,
                    const std::atomic<bool>& stop) {
  const int n = *env.world_size;
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) keys.push_back(world_record_key(env.job_id, r));
  auto records = store.get_many(keys, std::chrono::milliseconds(0));
  if (!records.is_ok()) return records.status().code() != Code::Timeout;
  const std::string host = bootstrap::host_identity(env);
  const std::string dir = memory::fd_socket_dir(memory::HeapOptions::from_env(env).socket_dir);
  const Deadline d = Deadline::after(std::chrono::seconds(2));
  std::vector<bool> held(static_cast<size_t>(n), false);
  {
    std::lock_guard<std::mutex> g(g_prefetched_mu);
    for (const auto& s : g_prefetched) held[static_cast<size_t>(s.rank)] = true;
  }
  std::vector<PrefetchedSegment> got;
  for (int r = 0; r < n && !stop.load(std::memory_order_relaxed); ++r) {
    if (held[static_cast<size_t>(r)]) continue;
    auto w = parse_world_record(records.value()[static_cast<size_t>(r)]);
    if (!w.is_ok() || w.value().host != host) continue;
    if (::kill(static_cast<pid_t>(w.value().pid), 0) != 0 && errno == ESRCH) continue;
    auto path = memory::fd_socket_path(dir, env.job_id, r);
    if (!path.is_ok()) break;
    auto f = memory::fetch_segment_fd(*path, r, w.value().ctrl.seg, d, static_cast<pid_t>(w.value().pid));
    if (!f.is_ok()) {
      STRATA_LOG(Debug, who << ": prefetching rank " << r << "'s control block: " << f.status().message());
      continue;
    }
    auto mapped = memory::map_peer_segment(f.value().fd, f.value().size);
    ::close(f.value().fd);
    if (!mapped.is_ok()) continue;
    got.push_back({r, w.value().pid, w.value().ctrl.seg, mapped.value(), f.value().size});
  }
  std::lock_guard<std::mutex> g(g_prefetched_mu);
  for (auto& s : got) g_prefetched.push_back(s);
  return true;
}

// Prefetches on its own thread and store connection (the monitor's, idle until the spare
// has a rank), so that the wait for an assignment never waits for a fetch.
class Prefetcher {
 public:
  Prefetcher(const Env& env, bootstrap::StoreClient& store, std::string who)
      : thread_([this, &env, &store, who = std::move(who)] {
          // At normal priority: at nice 19 beside 64 busy ranks on 2 cores it had mapped a
          // third of the peers when a failure came 1 s after the job's start.
          bool done = false;
          while (!stop_.load()) {
            // Once every rank is up, and again for a rank replaced meanwhile (its record
            // names the new process once that has joined).
            if (drop_exited()) done = false;
            if (!done) done = prefetch_peers(env, store, who, stop_);
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait_for(lk, std::chrono::milliseconds(200), [this] { return stop_.load(); });
          }
        }) {}
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace

std::vector<PrefetchedSegment> take_prefetched_segments() {
  std::lock_guard<std::mutex> g(g_prefetched_mu);
  return std::exchange(g_prefetched, {});
}

uint64_t start_epoch() {
  const uint64_t e = g_assigned_epoch.load(std::memory_order_acquire);
  return e > 0 ? e : Env::get().epoch;
}

Result<std::optional<SpareAssignment>> wait_as_spare(const Env& env) {
  if (!env.spare) return std::optional<SpareAssignment>();
  const int id = *env.spare;
  const std::string who = "hot spare " + std::to_string(id) + " (STRATA_SPARE)";
  if (!env.ft || env.store.empty() || env.job_id.empty() || !env.world_size)
    return invalid_argument(who +
                            ": only `strata run --ft --spares K` starts spares; STRATA_FT, STRATA_STORE, "
                            "STRATA_JOB_ID and STRATA_WORLD_SIZE must be set with it");
  STRATA_ASSIGN_OR_RETURN(auto addr, bootstrap::StoreAddress::parse(env.store));
  const Deadline connect_by = Deadline::after(env.store_connect_timeout);
  STRATA_ASSIGN_OR_RETURN(auto client, bootstrap::StoreClient::connect(addr, env.job_token, connect_by));
  STRATA_ASSIGN_OR_RETURN(auto monitor, bootstrap::StoreClient::connect(addr, env.job_token, connect_by));
  client->set_reconnect_timeout(kReconnect);
  monitor->set_reconnect_timeout(kReconnect);
  STRATA_RETURN_IF_ERROR(client->set(recovery::keys::spare(env.job_id, id), std::to_string(::getpid())));
  const std::string key = recovery::keys::assign(env.job_id, id);
  auto prefetcher = std::make_unique<Prefetcher>(env, *monitor, who);
  const std::string beat = recovery::keys::spare_beat(env.job_id, id);
  const auto slice = std::clamp(env.heartbeat_interval, std::chrono::milliseconds(1), kSlice);
  for (;;) {
    // Beaten from the thread that will take the rank: a spare stopped or stuck here is
    // replaced, not handed a rank it would never take.
    (void)client->add(beat, 1);
    auto v = client->get(key, slice);
    if (v.status().code() == Code::Timeout) continue;
    if (!v.is_ok()) return v.status().with_context(who + ": the job's store went away before this spare was needed: ");
    prefetcher.reset();
    SpareAssignment a;
    a.store = std::move(client);
    a.monitor_store = std::move(monitor);
    std::istringstream in(v.value());
    if (!(in >> a.rank >> a.epoch) || a.rank < 0 || a.rank >= *env.world_size || a.epoch == 0)
      return invalid_argument(who + ": malformed assignment '" + v.value() + "' under " + key);
    g_assigned_epoch.store(a.epoch, std::memory_order_release);
    STRATA_LOG(Info, who << " takes rank " << a.rank << " in epoch " << a.epoch);
    return std::optional<SpareAssignment>(std::move(a));
  }
}

}  // namespace strata::detail

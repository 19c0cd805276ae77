// The per-process failure monitor of a job under `strata run --ft`: one thread that beats
// into the store (so the controller sees a hung or stopped process) and waits on the next
// epoch's notice (so a failure anywhere revokes this process's communicators within
// milliseconds, without waiting for an operation to time out).

#include "recovery/monitor.hpp"

#include <time.h>

#include <thread>

#include "bootstrap/store.hpp"
#include "coll/membership.hpp"
#include "common/log.hpp"
#include "recovery/keys.hpp"
#include "recovery/spare.hpp"

namespace strata {
namespace recovery {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool is_replacement() { return detail::start_epoch() > 0; }

}  // namespace recovery

namespace detail {
namespace {

// The thread's state is shared with the thread itself, so the thread may outlive the
// Monitor when it drops the context's last reference (then it detaches and ends alone).
struct MonitorLoop {
  std::weak_ptr<ContextImpl> ctx;
  std::unique_ptr<bootstrap::StoreClient> client;
  std::string job;
  int rank = 0;
  std::chrono::milliseconds interval{100};
  uint64_t next = 1;
  std::atomic<bool> stop{false};

  void run() {
    const std::string hb = recovery::keys::heartbeat(job, rank);
    while (!stop.load()) {
      // A store that went away means the job is ending; keep trying quietly until stopped.
      (void)client->add(hb, 1);
      auto v = client->get(recovery::keys::epoch(job, next), interval);
      if (v.is_ok()) {
        announce(next, v.value());
        ++next;
      } else if (v.status().code() != Code::Timeout) {
        std::this_thread::sleep_for(interval);
      }
    }
  }

  void announce(uint64_t e, const std::string& failed) {
    auto alive = ctx.lock();
    if (!alive) return;
    const ContextRef c(std::move(alive));
    c.epochs().seen_ns.store(recovery::now_ns(), std::memory_order_relaxed);
    c.epochs().announce(e, failed);
    if (!failed.empty() && failed[0] == recovery::keys::kFatal) {
      STRATA_LOG(Info, "rank " << rank << ": the job cannot recover: " << failed.substr(1));
      // Worded as recover()'s refusal (rebuild.cpp): a rank blocked on a live local peer
      // learns it here rather than in recover(), and reads the same sentence.
      c.revoke_all(
          unavailable("the job cannot recover: " + failed.substr(1) + " (seen by rank " + std::to_string(rank) + ")"));
      return;
    }
    auto ranks = recovery::keys::parse_ranks(failed);
    STRATA_LOG(Info,
               "rank " << rank << ": the controller announced epoch " << e << " (replacing rank(s) " << failed << ")");
    c.revoke_all(peer_failed("rank(s) " + failed + " failed and the job moved to epoch " + std::to_string(e) +
                                 " (seen by rank " + std::to_string(rank) + "); call recover()",
                             ranks.empty() ? -1 : ranks.front()));
  }
};

class Monitor final : public ContextService {
 public:
  explicit Monitor(std::shared_ptr<MonitorLoop> loop) : loop_(std::move(loop)) {
    thread_ = std::thread([l = loop_] { l->run(); });
  }
  ~Monitor() override {
    loop_->stop.store(true);
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
      return;
    }
    thread_.join();
    // The process is shutting down: its silence from now on is not a hang.
    (void)loop_->client->set(recovery::keys::heartbeat(loop_->job, loop_->rank), recovery::keys::kExiting);
  }

 private:
  std::shared_ptr<MonitorLoop> loop_;
  std::thread thread_;
};

}  // namespace

Status start_recovery_services(const ContextRef& ctx, std::unique_ptr<bootstrap::StoreClient> client) {
  const Env& env = ctx.env();
  if (!env.ft || !ctx.store()) return Status::ok();
  // A connection of its own: the monitor's long waits must not hold up the rank's requests.
  if (!client) {
    STRATA_ASSIGN_OR_RETURN(auto addr, bootstrap::StoreAddress::parse(ctx.job().store));
    STRATA_ASSIGN_OR_RETURN(
        client, bootstrap::StoreClient::connect(addr, ctx.job().token, Deadline::after(env.store_connect_timeout)));
  }
  client->set_reconnect_timeout(env.store_connect_timeout);
  const uint64_t epoch = start_epoch();
  EpochState& epochs = ctx.epochs();
  epochs.latest.store(epoch);
  epochs.joined = epoch;
  if (epoch > 0) epochs.seen_ns.store(recovery::now_ns());
  auto loop = std::make_shared<MonitorLoop>();
  loop->ctx = ctx.impl();
  loop->client = std::move(client);
  loop->job = ctx.job().job_id;
  loop->rank = ctx.job().rank;
  loop->interval = env.heartbeat_interval;
  loop->next = epoch + 1;
  ctx.set_monitor(std::make_unique<Monitor>(std::move(loop)));
  return Status::ok();
}

}  // namespace detail
}  // namespace strata

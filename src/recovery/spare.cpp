// A hot spare's wait in strata::init(). The spare paid for its process start-up, its
// program's imports and the library's loading before any failure; what remains after the
// launcher picks it is what a replacement does today (context, monitor, the rebuild's join).
// The rank cannot come from the environment (it is unknown when the spare starts), so it
// comes through the store: the launcher writes "RANK EPOCH" under the spare's key.

#include "recovery/spare.hpp"

#include <unistd.h>

#include <atomic>
#include <sstream>
#include <utility>

#include "bootstrap/store.hpp"
#include "common/log.hpp"
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

}  // namespace

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
  for (;;) {
    auto v = client->get(key, kSlice);
    if (v.status().code() == Code::Timeout) continue;
    if (!v.is_ok()) return v.status().with_context(who + ": the job's store went away before this spare was needed: ");
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

// strata::init(): joining the job. It lives in the recovery layer, above the collectives,
// because a rank started to replace a failed one does not build the world communicator from
// scratch: it meets the survivors in the newest epoch through the rebuild (rebuild.cpp).
// The collectives only provide the pieces (context, world communicator) and never call
// into recovery.

#include <strata/strata.hpp>

#include "bootstrap/job_info.hpp"
#include "coll/membership.hpp"
#include "common/env.hpp"
#include "common/status.hpp"
#include "recovery/keys.hpp"
#include "recovery/monitor.hpp"
#include "recovery/rebuild.hpp"
#include "recovery/spare.hpp"

namespace strata {
namespace detail {
namespace {

/// The world communicator of a replacement rank: its new control block, attached to the
/// survivors (who keep theirs) in the epoch the controller announced.
Result<std::shared_ptr<CommImpl>> join_world(const ContextRef& ctx) {
  // The notice of the epoch this process started in says which ranks start again on another
  // host (a lost host's, on a spare host): their old records name the lost one.
  const std::string& job = ctx.job().job_id;
  auto notice = ctx.store()->get(recovery::keys::epoch(job, start_epoch()), ctx.env().timeout);
  if (!notice.is_ok())
    return notice.status().with_context("rank " + std::to_string(ctx.job().rank) + " reading the notice of epoch " +
                                        std::to_string(start_epoch()) + ": ");
  STRATA_ASSIGN_OR_RETURN(auto c, new_world(ctx.impl(), recovery::keys::parse_moves(notice.value())));
  Membership m(c);
  // Nothing is queued on a new communicator yet; the lock is what the rebuild expects held.
  auto quiet = m.quiesce(aborted("operation queued before rank " + std::to_string(m.rank()) + " joined the job"));
  STRATA_RETURN_IF_ERROR(rebuild_world(m, /*fresh=*/true));
  m.probe_cma_alone();
  return c;
}

/// The world communicator of a rank of the first epoch. A failure announced while the ranks
/// are still meeting (a rank killed before its first step) does not end the others: as long
/// as this rank's block is published, it meets the replacement in the rebuild like any
/// survivor, and keeps its process.
Result<std::shared_ptr<CommImpl>> start_world(const ContextRef& ctx) {
  std::shared_ptr<CommImpl> published;
  auto w = make_world(ctx.impl(), &published);
  if (w.is_ok() || !published || !ctx.has_monitor()) return w;
  const Code code = w.status().code();
  if (code != Code::Aborted && code != Code::PeerFailed && code != Code::Timeout) return w;
  // The failure may have been seen here (a pidfd, an fd server gone) before the
  // controller's notice: rebuild_world waits for it, with the communicator's deadline.
  Membership m(published);
  auto quiet = m.quiesce(aborted("operation queued before rank " + std::to_string(m.rank()) + " joined the job"));
  if (Status s = rebuild_world(m, /*fresh=*/true); !s.is_ok())
    return s.with_context("after " + w.status().message() + ": ");
  m.probe_cma_alone();
  return published;
}

}  // namespace
}  // namespace detail

Communicator init(const InitOptions& opts) {
  const Env& env = Env::get();
  bootstrap::JobOverrides ov;
  ov.rank = opts.rank;
  // A hot spare stops here until a rank fails; it then goes on exactly as a replacement.
  std::optional<detail::SpareAssignment> spare = value_or_throw(detail::wait_as_spare(env));
  if (spare) ov.rank = spare->rank;
  ov.world_size = opts.size;
  ov.store = opts.store;
  ov.token = opts.token;
  ov.job_id = opts.job_id;
  ov.host_id = opts.host_id;
  const bootstrap::JobInfo job = value_or_throw(bootstrap::detect_job(env, ov));
  const int rank = job.rank;
  // A spare learns its epoch from its assignment, not from STRATA_EPOCH: the context records
  // it (the transport publishes this process's address under it, see world records).
  Env ctx_env = env;
  ctx_env.epoch = detail::start_epoch();
  // The spare's connections lead to the store and token it was started with; options that name
  // another store (or token) get connections of their own.
  const bool spare_store = spare && job.store == env.store && job.token == env.job_token;
  detail::ContextRef ctx = value_or_throw(
      detail::make_context(ctx_env, job, opts.timeout, spare_store ? std::move(spare->store) : nullptr), rank);
  throw_if_error(detail::start_recovery_services(ctx, spare_store ? std::move(spare->monitor_store) : nullptr), rank);
  if (detail::start_epoch() > 0 && job.world_size > 1)
    return Communicator(value_or_throw(detail::join_world(ctx), rank));
  return Communicator(value_or_throw(detail::start_world(ctx), rank));
}

}  // namespace strata

#pragma once
// The per-process failure monitor of a job under `strata run --ft` (monitor.cpp).

#include "coll/membership.hpp"
#include "common/status.hpp"

namespace strata::detail {

/// Starts the failure monitor when the job runs under a recovery controller (no-op
/// otherwise): heartbeats into the store, and a revoke of every communicator of `ctx` when
/// the controller announces a new epoch. The context owns the monitor from then on. The
/// monitor talks to the store over a connection of its own: `client` when given (made
/// beforehand to the job's store), else a new one.
Status start_recovery_services(const ContextRef& ctx, std::unique_ptr<bootstrap::StoreClient> client = nullptr);

}  // namespace strata::detail

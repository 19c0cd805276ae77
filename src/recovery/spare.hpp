#pragma once
// Hot spares of `strata run --ft --spares K` (spare.cpp): a process started ahead of any
// failure runs its program up to strata::init() and waits there for a rank.

#include <cstdint>
#include <optional>

#include "common/env.hpp"
#include "common/status.hpp"

namespace strata::detail {

/// The rank and epoch the launcher handed to a hot spare.
struct SpareAssignment {
  int rank = 0;
  uint64_t epoch = 0;
};

/// nullopt for a process that is no spare (no STRATA_SPARE). A spare registers in the store
/// and blocks until the launcher assigns it a failed rank; the wait ends with that rank, or
/// with an error when the job's store goes away (the job ended without needing the spare).
/// The launcher's death ends the spare too (PR_SET_PDEATHSIG, set by `strata run`).
Result<std::optional<SpareAssignment>> wait_as_spare(const Env& env);

/// The epoch this process joined the job in: STRATA_EPOCH, or the epoch of a spare's
/// assignment once it has one. Above 0 for a process that replaces a failed rank.
uint64_t start_epoch();

}  // namespace strata::detail

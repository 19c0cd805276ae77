#pragma once
// Hot spares of `strata run --ft --spares K` (spare.cpp): a process started ahead of any
// failure runs its program up to strata::init() and waits there for a rank.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "bootstrap/store.hpp"
#include "common/env.hpp"
#include "common/status.hpp"

namespace strata::detail {

/// The rank and epoch the launcher handed to a hot spare, and the store connections the spare
/// made while it waited (to STRATA_STORE with STRATA_JOB_TOKEN): the context's and the
/// monitor's. Made then, they are not made after the failure, when the store's one thread is
/// busiest (every survivor's rebuild at once: 10-20 ms per connection at 64 ranks on 2 cores).
struct SpareAssignment {
  int rank = 0;
  uint64_t epoch = 0;
  std::unique_ptr<bootstrap::StoreClient> store, monitor_store;
};

/// nullopt for a process that is no spare (no STRATA_SPARE). A spare registers in the store
/// and blocks until the launcher assigns it a failed rank; the wait ends with that rank, or
/// with an error when the job's store goes away (the job ended without needing the spare).
/// The launcher's death ends the spare too (PR_SET_PDEATHSIG, set by `strata run`).
Result<std::optional<SpareAssignment>> wait_as_spare(const Env& env);

/// A peer's control-block segment, fetched and mapped by a hot spare while it waited.
struct PrefetchedSegment {
  int rank = 0;
  long pid = 0;
  uint32_t seg = 0;
  char* base = nullptr;  // the mapping, owned by whoever took it
  size_t size = 0;
};

/// What the spare mapped in advance (empty in any other process, and after the first call).
/// A replacement's rebuild maps every peer's control-block segment, which populates the
/// page tables of all the pages the peer has touched (memory::map_peer_segment): 64 ranks
/// on 2 cores, 25-35 ms for 63 peers on the recovery's critical path. A spare does it before
/// any failure; the rebuild adopts the mappings of processes the records still name.
std::vector<PrefetchedSegment> take_prefetched_segments();

/// The epoch this process joined the job in: STRATA_EPOCH, or the epoch of a spare's
/// assignment once it has one. Above 0 for a process that replaces a failed rank.
uint64_t start_epoch();

}  // namespace strata::detail

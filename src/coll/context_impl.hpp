#pragma once
// One rank's process-level state behind every communicator and buffer it creates: where the
// rank sits in the job, the store, the heap, the transport between hosts, and what the
// recovery layer keeps per process (failure epochs and the monitor: their types are part of
// coll/membership.hpp, the interface the recovery layer uses).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"
#include "coll/membership.hpp"
#include "common/env.hpp"
#include "common/process.hpp"
#include "common/status.hpp"
#include "memory/heap.hpp"
#include "transport/net.hpp"

namespace strata::detail {

struct CommImpl;

/// One rank's process-level state, shared by all its communicators and buffers.
struct ContextImpl {
  bootstrap::JobInfo job;
  Env env;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<bootstrap::StoreClient> store;  // null for a single rank without a store
  std::unique_ptr<memory::Heap> heap;
  std::mutex mu;
  /// Control blocks of destroyed communicators, each freed once every peer has said it reads
  /// it no more (CtrlView::done_with).
  std::vector<void*> retired_ctrl;
  /// Frees the retired blocks that no peer reads any more. Caller holds `mu`.
  void reclaim_ctrl_blocks();
  // External buffers registered for single-copy (CMA) access: base -> bytes.
  std::vector<std::pair<uintptr_t, size_t>> registered;
  /// True when [p, p + bytes) lies inside one registered external buffer.
  bool is_registered(const void* p, size_t bytes);

  // Heap memory freed while async work queued before the free may still touch it (a Buffer
  // destroyed with an _async operation on it pending) goes back to the heap only once that
  // work finished, as torch's record_stream does: else the next alloc would hand it out and
  // the work would write into, or read from, its new owner.
  /// A ticket for async work about to be queued on any communicator of this context.
  uint64_t open_async();
  /// That work finished (or was dropped): frees what waited on it and on nothing later.
  void close_async(uint64_t ticket);
  /// Holds the free of `p` back while async work is open; false when there is none.
  bool defer_free(void* p, bool symmetric);

  // Failure handling: every live communicator, so a failure notice can revoke them all.
  std::vector<std::weak_ptr<CommImpl>> comms;
  EpochState epochs;
  std::unique_ptr<ContextService> monitor;  // null unless the job runs under `strata run --ft`
  /// Fails every pending and later operation of every communicator with `why` (sticky).
  void revoke_all(const Status& why);
  /// Key under the job's store namespace ("strata/<job>/<suffix>").
  std::string key(const std::string& suffix) const { return job_store_key(job.job_id, suffix); }
  std::vector<std::string> hosts;  // global rank -> host id (filled by make_world)
  /// fork_generation() when this context was made. A child forked after it sees another: its
  /// peers know only the parent, so the child must not act as that rank, nor tear down what
  /// the parent still uses.
  uint64_t fork_gen = 0;
  bool forked() const { return fork_gen != fork_generation(); }
  // Between hosts; created when the job spans hosts. Declared after heap: it unmaps the
  // heap's segments and removes its listener before the heap goes.
  std::unique_ptr<transport::Net> net;
  ~ContextImpl();

 private:
  struct HeldFree {
    uint64_t before;  // the first ticket handed out after the free
    void* p;
    bool symmetric;
  };
  std::mutex async_mu_;
  uint64_t async_next_ = 0;
  std::set<uint64_t> async_open_;  // tickets of queued or running async work
  std::vector<HeldFree> held_frees_;
};

}  // namespace strata::detail

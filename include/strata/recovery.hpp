#pragma once
// Checkpoint-free failure recovery for data-parallel jobs started with `strata run --ft`.
//
// When a rank fails, the controller replaces only that rank (same rank, new epoch) and every
// communicator of the job is revoked: pending and later operations fail fast with
// PeerFailed. Survivors call Communicator::recover(), the replacement's strata::init() meets
// them in the new epoch, and State::restore() copies the registered training state from a
// healthy replica to whoever lacks it. recovery::run() wraps a training loop in that
// protocol: an interrupted step is discarded everywhere and redone, so nothing is lost.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/strata.hpp>

namespace strata::recovery {

/// Timings of the last recovery this process took part in. Times are CLOCK_REALTIME in
/// nanoseconds (comparable across processes on a host); 0 means unknown.
struct Report {
  uint64_t epoch = 0;            ///< the epoch the job moved to
  std::vector<int> failed;       ///< world ranks replaced in this epoch
  bool replacement = false;      ///< this process is one of the replacements
  int64_t injected_ns = 0;       ///< when a deliberate failure was injected (mark_failure), if any
  int64_t detected_ns = 0;       ///< when the controller noticed the failure
  int64_t spawned_ns = 0;        ///< when the controller started the (first) replacement
  int64_t seen_ns = 0;           ///< when this rank saw the revoke (survivors) or started (replacements)
  int64_t rebuild_start_ns = 0;  ///< when this rank began to rebuild
  int64_t joined_ns = 0;         ///< when every rank had arrived in the epoch
  int64_t rebuilt_ns = 0;        ///< when the world communicator was usable again
  int64_t restored_ns = 0;       ///< when State::restore() finished on this rank
  uint64_t restored_bytes = 0;   ///< state bytes this rank sent or received in restore()
  // The cost of this recovery on this rank, counted (not timed) from the start of the rebuild
  // to the end of restore(): see docs/RECOVERY.md.
  uint64_t store_ops = 0;     ///< store requests answered (the monitor's one wait for the notice not included)
  uint64_t store_bytes = 0;   ///< their request and reply frames
  uint64_t peer_waits = 0;    ///< peer signals waited for (one per peer per barrier step) and state messages
  uint64_t agree_bytes = 0;   ///< bytes of the restore's agreement (who donates to whom) sent plus received
  uint32_t agree_rounds = 0;  ///< rounds of that agreement: 2 when some survivor was a step behind its group
  uint32_t premapped = 0;     ///< peers whose memory a hot spare had mapped before it took this rank
};

/// The report of the last recovery of `comm`'s job as seen by this process.
Report last_report(const Communicator& comm);

/// True in a process started by the controller to replace a failed rank.
bool is_replacement();

/// Records "a failure is being injected now" for the next epoch's Report::injected_ns. For
/// fault-injection tests and benchmarks, called right before the deliberate kill.
void mark_failure(const Communicator& comm);

/// CLOCK_REALTIME now, in nanoseconds (the clock of Report).
int64_t now_ns();

/// The training state a replacement needs, registered by name. Every member of a replica
/// group (ranks with equal `replica_group`; by default the whole communicator) must hold
/// identical state and register the same buffers in the same order.
class State {
 public:
  /// `comm` is the world communicator; ranks with the same `replica_group` are replicas.
  explicit State(Communicator& comm, int replica_group = 0);
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  /// Registers a buffer (parameters, optimizer state, data cursor, RNG state...). Heap
  /// buffers (comm.alloc) are transferred zero-copy.
  template <class T>
  void add(const std::string& name, std::span<T> data) {
    add_bytes(name, static_cast<void*>(data.data()), data.size_bytes());
  }
  void add_bytes(const std::string& name, void* data, size_t bytes);

  /// Completed steps; part of the state (the name "step" is reserved). restore() sends it
  /// after every buffer: a transfer cut short leaves the receiver's old step, never the new.
  uint64_t& step();

  /// Collective over the communicator, after a rebuild: every rank whose state is missing
  /// (a replacement) or behind (it did not apply the last step) receives every buffer from
  /// a healthy replica that applied the most steps. InvalidArgument when replicas
  /// registered different buffers; Unavailable when no healthy replica holds a group's state.
  void restore();

  /// Bytes registered, "step" included.
  size_t bytes() const;

  /// Test hook for fault injection (examples/train_dp --fail R:S:killdonor): called on a
  /// donor in restore() after each registered buffer it sent to `receiver`. The step is
  /// sent after all of them (it commits the transfer) and does not call the hook.
  void on_sent(std::function<void(const std::string& name, int receiver)> hook);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The two halves of a training step for run().
struct StepFunctions {
  /// Computes the gradients of step `step` and all-reduces them on the communicator. May
  /// throw PeerFailed/Aborted/Timeout; the step is then discarded and redone.
  std::function<void(uint64_t step)> compute;
  /// Applies the optimizer update. Called only once every rank has completed compute().
  std::function<void(uint64_t step)> apply;
};

/// Options of run().
struct RunOptions {
  int max_recoveries = 16;                          ///< give up (rethrow) after this many
  std::function<void()> on_failure;                 ///< a step failed; recovery starts
  std::function<void(const Report&)> on_recovered;  ///< state restored; training resumes
};

/// Runs steps state.step() .. total_steps-1 under the recovery protocol: compute, a commit
/// barrier, then apply. A failure revokes the step on every survivor; they recover(), the
/// replacement joins, restore() brings everyone to the same step, and training goes on.
/// A replacement calls this too (it starts with restore()).
void run(Communicator& comm, State& state, uint64_t total_steps, const StepFunctions& fns, const RunOptions& opts = {});

}  // namespace strata::recovery

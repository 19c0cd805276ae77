#pragma once
// Signals between ranks on one host: 32-bit counters in shared memory that one rank
// publishes and its peers wait on. Waiting spins briefly, yields, then sleeps on a futex so
// that oversubscribed hosts (more ranks than cores) keep making progress.

#include <atomic>
#include <cstdint>
#include <functional>

#include "common/deadline.hpp"
#include "common/status.hpp"

namespace strata::transport {

/// A published counter and the count of peers sleeping on it. Lives in shared memory; both
/// words are lock-free atomics, so they work across processes. Callers place it on its own
/// cache line (or on one it shares only with what it announces).
struct Signal {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

/// Counters wrap; compare as serial numbers.
inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

/// What a wait checks besides its condition.
struct WaitPolicy {
  Deadline deadline = Deadline::never();
  const std::atomic<bool>* abort = nullptr;  // set by Communicator::abort() or revocation
  /// Microseconds of pure spinning (CPU pause) before yielding the core, at most. Long when
  /// every rank has a core of its own (the peer is running and arrives soon), zero when the
  /// host is oversubscribed (the peer may need our core to arrive at all): then a wait polls a
  /// few times and goes straight to yielding. A thread whose
  /// spins keep running out (the peer was not running beside it) spins less, down to 1/256
  /// (every 256th wait spins in full, to notice when that has changed).
  uint32_t spin_us = 500;
  /// Microseconds of sched_yield polling after the spin, before sleeping on the futex.
  uint32_t yield_us = 200;
  /// Called about every millisecond while sleeping; a non-OK status ends the wait
  /// (peer liveness checks live here). May be empty.
  std::function<Status()> check;
};

/// Stores `v` and wakes sleepers, if any. The store and the check for sleepers are seq_cst
/// (a Dekker handshake with wait_reached): a waiter going to sleep either sees `v` or is woken.
void publish(Signal& s, uint32_t v);

/// Waits until reached(s.value, target). Returns Timeout, Aborted or whatever `check`
/// returned when the wait cannot complete. `what` names the wait in the error message.
Status wait_reached(const Signal& s, uint32_t target, const WaitPolicy& policy, const char* what);

/// Waits until `ready()` is true, for a condition over several signals (a receive from any
/// rank): spins and yields like wait_reached, then polls in naps growing to 1 ms, since no
/// single futex word announces the condition. Same errors as wait_reached.
Status wait_until(const std::function<bool()>& ready, const WaitPolicy& policy, const char* what);

}  // namespace strata::transport

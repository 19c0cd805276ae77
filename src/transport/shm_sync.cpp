#include "transport/shm_sync.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <ctime>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_CPU_RELAX() _mm_pause()
#else
#define STRATA_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace strata::transport {
namespace {

// Shared (not FUTEX_PRIVATE) futexes: the words live in memfd pages mapped by several
// processes, and the kernel keys shared futexes on the page, not the address.
long futex_wait(const std::atomic<uint32_t>* addr, uint32_t expected, long timeout_ns) {
  timespec ts{timeout_ns / 1000000000L, timeout_ns % 1000000000L};
  return syscall(SYS_futex, reinterpret_cast<const uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(const std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// How often in a row (net of successes) this thread's waits outlasted their spin phase, up to
// kMaxSpinHalvings; each halves the next spin. A spin that runs out means the peer was not
// running beside us: often it needs this very core (a neighbour took the other one, or the
// host is loaded), and every microsecond spun delays it by as much. A fixed 500 us spin then
// cost each wait exactly 500 us (issue 19: 2 waits per call, a 1 ms plateau). A wait that
// ends while spinning steps back toward the full spin, so ranks that do have cores of their
// own keep it. Every kProbeEvery-th wait spins the full budget whatever the count: short spins
// that keep missing (the peer arrives a little later than they last) would otherwise never
// learn that the host has become quiet again, and both ranks would stay on the futex path.
constexpr int kMaxSpinHalvings = 8;
constexpr uint32_t kProbeEvery = 256;
constexpr uint32_t kPollsBeforeYield = 4;
thread_local int t_missed_spins = 0;
thread_local uint32_t t_waits = 0;

}  // namespace

void publish(Signal& s, uint32_t v) {
  // seq_cst pairs with the sleeper's seq_cst increment + re-check (a Dekker handshake): either
  // the sleeper sees the new value, or we see its sleepers count and wake it.
  s.value.store(v, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&s.value);
}

Status wait_reached(const Signal& s, uint32_t target, const WaitPolicy& policy, const char* what) {
  // Spin, then yield, then sleep: the clock is read every 64 polls only (vDSO, ~30 ns here),
  // and not at all by a wait that ends within the first 64 (most waits of a small
  // collective: the peer's line arrives in about 0.3 us); the spin budget starts there.
  using Clock = std::chrono::steady_clock;
  Clock::time_point spin_until{};
  for (uint32_t polls = 0;; ++polls) {
    if (reached(s.value.load(std::memory_order_acquire), target)) {
      if (polls > 0 && t_missed_spins > 0 && policy.spin_us) --t_missed_spins;
      return Status::ok();
    }
    STRATA_CPU_RELAX();
    // No spin at all (an oversubscribed host): a few polls catch a peer running on the other
    // core, then the core goes to whoever needs it; 64 polls would be ~0.6 us lost per wait.
    if (policy.spin_us == 0 && polls == kPollsBeforeYield) break;
    if (polls % 64 != 63) continue;
    const auto now = Clock::now();
    if (polls == 63) {
      const int shift = ++t_waits % kProbeEvery == 0 ? 0 : t_missed_spins;
      spin_until = now + std::chrono::microseconds(policy.spin_us >> shift);
    } else if (now >= spin_until) {
      break;
    }
  }
  // A wait with no spin to shorten leaves the count to the thread's spinning waits.
  if (policy.spin_us && t_missed_spins < kMaxSpinHalvings) ++t_missed_spins;
  const auto yield_until = Clock::now() + std::chrono::microseconds(policy.yield_us);
  while (Clock::now() < yield_until) {
    for (int i = 0; i < 4; ++i) {
      if (reached(s.value.load(std::memory_order_acquire), target)) return Status::ok();
      STRATA_CPU_RELAX();
    }
    sched_yield();
  }
  auto& sleepers = const_cast<Signal&>(s).sleepers;
  int checks = 0;
  for (;;) {
    uint32_t v = s.value.load(std::memory_order_acquire);
    if (reached(v, target)) return Status::ok();
    if (policy.abort && policy.abort->load(std::memory_order_relaxed))
      return aborted(std::string(what) + ": communicator aborted");
    if (policy.deadline.expired()) return timeout_error(std::string(what) + ": timed out");
    if (policy.check && (++checks % 4 == 0 || checks == 1)) {
      Status st = policy.check();
      if (!st.is_ok()) return st;
    }
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    v = s.value.load(std::memory_order_seq_cst);
    if (!reached(v, target)) futex_wait(&s.value, v, 1000000L /* 1 ms: bounds abort/deadline latency */);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

Status wait_until(const std::function<bool()>& ready, const WaitPolicy& policy, const char* what) {
  if (ready()) return Status::ok();
  using Clock = std::chrono::steady_clock;
  const auto spin_until = Clock::now() + std::chrono::microseconds(policy.spin_us);
  const auto yield_until = spin_until + std::chrono::microseconds(policy.yield_us);
  while (Clock::now() < spin_until) {
    for (int i = 0; i < 16; ++i) STRATA_CPU_RELAX();
    if (ready()) return Status::ok();
  }
  while (Clock::now() < yield_until) {
    sched_yield();
    if (ready()) return Status::ok();
  }
  long nap_ns = 20000;
  auto next_check = Clock::now();
  for (;;) {
    if (ready()) return Status::ok();
    if (policy.abort && policy.abort->load(std::memory_order_relaxed))
      return aborted(std::string(what) + ": communicator aborted");
    if (policy.deadline.expired()) return timeout_error(std::string(what) + ": timed out");
    if (policy.check && Clock::now() >= next_check) {
      Status st = policy.check();
      if (!st.is_ok()) return st;
      next_check = Clock::now() + std::chrono::milliseconds(4);
    }
    timespec ts{0, nap_ns};
    nanosleep(&ts, nullptr);
    nap_ns = std::min(nap_ns * 2, 1000000L);  // 1 ms: bounds the latency once idle
  }
}

}  // namespace strata::transport

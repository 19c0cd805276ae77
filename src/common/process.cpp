#include "common/process.hpp"

#include <pthread.h>

#include <atomic>

namespace strata {
namespace {
std::atomic<uint64_t> g_generation{0};
// Registered when the library is loaded, before any state a child could inherit exists.
[[maybe_unused]] const int g_registered =
    ::pthread_atfork(nullptr, nullptr, [] { g_generation.fetch_add(1, std::memory_order_relaxed); });
std::atomic<InterruptCheck> g_interrupt_check{nullptr};
}  // namespace

uint64_t fork_generation() { return g_generation.load(std::memory_order_relaxed); }

void set_interrupt_check(InterruptCheck check) { g_interrupt_check.store(check, std::memory_order_release); }

bool interrupt_requested() {
  const InterruptCheck check = g_interrupt_check.load(std::memory_order_acquire);
  return check != nullptr && check();
}

}  // namespace strata

#pragma once
// The state behind a strata::Work: what the copy engine runs, and how the caller waits for it.

#include <condition_variable>
#include <functional>
#include <mutex>
#include <utility>

#include "common/process.hpp"
#include "common/status.hpp"

namespace strata::detail {

/// State of an asynchronous operation.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  int rank = -1;
  uint64_t fork_gen = fork_generation();   // a forked child waits for it in vain: refused
  std::function<Status()> run;             // engine-executed body
  std::function<Status(bool block)> poll;  // for sends: completes by observing the receiver
  std::function<void()> on_destroy;        // releases staging memory
  std::function<void()> on_finish;         // after the outcome is recorded (ContextImpl::close_async)
  ~WorkState() {
    if (on_finish) on_finish();  // never finished: what waited on it must not wait forever
    if (on_destroy) on_destroy();
  }
  /// Records the outcome and wakes every waiter.
  void finish(Status s) {
    {
      std::lock_guard<std::mutex> g(mu);
      status = std::move(s);
      done = true;
      cv.notify_all();
    }
    if (on_finish) std::exchange(on_finish, nullptr)();
  }
};

}  // namespace strata::detail

#pragma once
// The state behind a strata::Work: what the copy engine runs, and how the caller waits for it.

#include <condition_variable>
#include <functional>
#include <mutex>

#include "common/status.hpp"

namespace strata::detail {

/// State of an asynchronous operation.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  int rank = -1;
  std::function<Status()> run;             // engine-executed body
  std::function<Status(bool block)> poll;  // for sends: completes by observing the receiver
  std::function<void()> on_destroy;        // releases staging memory
  ~WorkState() {
    if (on_destroy) on_destroy();
  }
  /// Records the outcome and wakes every waiter.
  void finish(Status s) {
    std::lock_guard<std::mutex> g(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
};

}  // namespace strata::detail

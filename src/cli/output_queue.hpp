#pragma once
// The launcher's output to its own stdout and stderr, written by a thread of its own through
// a bounded queue. A terminal that is slow or paused (Ctrl-S, `| less` not scrolled) must
// neither block the launcher's loop (signals, heartbeats, failures go unnoticed) nor let a
// rank that prints without end grow the launcher's memory: what does not fit is dropped, and
// the caller counts and reports it.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/status.hpp"

namespace strata::cli::launch {

class OutputQueue {
 public:
  /// `limit`: bytes queued (and being written) at most, the launcher's own messages aside.
  explicit OutputQueue(size_t limit) : limit_(limit) {}
  /// Writes what is queued, then stops the thread (close()).
  ~OutputQueue();
  OutputQueue(const OutputQueue&) = delete;
  OutputQueue& operator=(const OutputQueue&) = delete;

  /// Starts the writer thread; until then (or if it cannot start) writes happen at once.
  Status start();
  /// Queues `data` for `fd`, in order with everything else; false (nothing queued) when
  /// it would pass the limit.
  bool push(int fd, std::string data);
  /// Queues `data` whatever the limit: the launcher's messages and drop reports, few and short.
  void push_always(int fd, std::string data);
  /// Writes everything queued and stops the thread. It waits as long as the reader takes,
  /// as any program writing to a pipe does: output the job produced is not thrown away at
  /// the end, and by then the ranks are gone, so nothing else waits on the launcher.
  void close();

 private:
  void run();

  const size_t limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::string>> queue_;
  size_t bytes_ = 0;  // queued plus the chunk being written
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace strata::cli::launch

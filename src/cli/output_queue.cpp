#include "cli/output_queue.hpp"

#include <system_error>

#include "cli/commands.hpp"

namespace strata::cli::launch {

OutputQueue::~OutputQueue() { close(); }

Status OutputQueue::start() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    return internal_error(std::string("output thread: ") + e.what());
  }
  return Status::ok();
}

bool OutputQueue::push(int fd, std::string data) {
  if (data.empty()) return true;
  if (!thread_.joinable()) {
    write_all(fd, data);
    return true;
  }
  {
    std::lock_guard lk(mu_);
    if (bytes_ + data.size() > limit_) return false;
    bytes_ += data.size();
    queue_.emplace_back(fd, std::move(data));
  }
  cv_.notify_one();
  return true;
}

void OutputQueue::push_always(int fd, std::string data) {
  if (data.empty()) return;
  if (!thread_.joinable()) {
    write_all(fd, data);
    return;
  }
  {
    std::lock_guard lk(mu_);
    bytes_ += data.size();
    queue_.emplace_back(fd, std::move(data));
  }
  cv_.notify_one();
}

void OutputQueue::close() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    closing_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void OutputQueue::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closing, and everything is written
    auto [fd, data] = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    // One write per chunk (write_all only loops on short writes): lines of different ranks
    // never interleave mid-line.
    write_all(fd, data);
    lk.lock();
    bytes_ -= data.size();
  }
}

}  // namespace strata::cli::launch

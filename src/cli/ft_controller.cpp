#include "cli/ft_controller.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include <strata/recovery.hpp>

#include "recovery/keys.hpp"

namespace strata::cli {

namespace keys = recovery::keys;
using Clock = std::chrono::steady_clock;

Status FtController::start(const bootstrap::StoreAddress& addr, const std::string& token) {
  auto deadline = Deadline::after(std::chrono::seconds(10));
  STRATA_ASSIGN_OR_RETURN(store_, bootstrap::StoreClient::connect(addr, token, deadline));
  STRATA_ASSIGN_OR_RETURN(watch_store_, bootstrap::StoreClient::connect(addr, token, deadline));
  // The store lives in this process: a broken connection means it is shutting down.
  watch_store_->set_reconnect_timeout(std::chrono::seconds(1));
  beats_.assign(static_cast<size_t>(n_), Beat{});
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return errno_status("eventfd", errno);
  watcher_ = std::thread([this] { watch_loop(); });
  return Status::ok();
}

void FtController::stop() {
  stop_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

FtController::~FtController() {
  stop();
  if (event_fd_ >= 0) ::close(event_fd_);
}

void FtController::watch_loop() {
  while (!stop_.load()) {
    std::this_thread::sleep_for(tick_interval());
    std::string job;
    {
      std::lock_guard<std::mutex> g(mu_);
      job = job_;
    }
    bool found = false;
    for (int r = 0; r < n_ && !stop_.load(); ++r) {
      auto v = watch_store_->try_get(keys::heartbeat(job, r));
      const auto now = Clock::now();
      std::lock_guard<std::mutex> g(mu_);
      Beat& b = beats_[static_cast<size_t>(r)];
      if (job != job_ || !v.is_ok() || !v.value() || *v.value() == keys::kExiting) continue;  // not up, or leaving
      if (!b.seen || *v.value() != b.value) {
        b.value = *v.value();
        b.seen = true;
        b.changed = now;
      } else if (!b.reported && now - b.changed > opts_.heartbeat_timeout) {
        b.reported = true;
        hung_.emplace_back(r, b.gen);
        found = true;
      }
    }
    if (found) {
      uint64_t one = 1;
      (void)!::write(event_fd_, &one, sizeof one);
    }
  }
}

std::vector<int> FtController::take_hung() {
  uint64_t drain;
  (void)!::read(event_fd_, &drain, sizeof drain);
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int> out;
  for (auto [r, gen] : hung_)
    if (beats_[static_cast<size_t>(r)].gen == gen) out.push_back(r);
  hung_.clear();
  // Completed rebuilds end the cumulative set of ranks being replaced.
  if (!pending_.empty()) {
    auto ready = store_->try_get(keys::ready(job_, epoch_));
    if (ready.is_ok() && ready.value()) pending_.clear();
  }
  return out;
}

bool FtController::on_failure(const std::vector<int>& ranks, const std::string& why) {
  (void)why;
  // Restarting everything is one event however many ranks went down with the first (the
  // others typically exit on seeing it); replacing counts every rank replaced.
  failures_ += opts_.restart_all ? 1 : static_cast<int>(ranks.size());
  if (failures_ > opts_.max_failures) return false;
  at_failure_ = store_->counters();
  const int64_t t = recovery::now_ns();
  ++epoch_;
  if (!pending_.empty()) {
    auto ready = store_->try_get(keys::ready(job_, epoch_ - 1));
    if (ready.is_ok() && ready.value()) pending_.clear();
  }
  pending_.insert(ranks.begin(), ranks.end());
  std::vector<int> list(pending_.begin(), pending_.end());
  // The timestamps first: a rank that wakes on the notice reads them in its report.
  (void)store_->set(keys::detected(job_, epoch_), std::to_string(t));
  (void)store_->set(keys::epoch(job_, epoch_), keys::format_ranks(list));
  std::lock_guard<std::mutex> g(mu_);
  for (int r : ranks) reset_heartbeat(r);
  return true;
}

void FtController::on_spawned() { (void)store_->set(keys::spawned(job_, epoch_), std::to_string(recovery::now_ns())); }

std::string FtController::failure_cost() const {
  const bootstrap::StoreClient::Counters now = store_->counters();
  return std::to_string(now.ops - at_failure_.ops) + " store requests, " +
         std::to_string(now.bytes - at_failure_.bytes) + " bytes";
}

Status FtController::assign_spare(int spare, int rank) {
  return store_->set(keys::assign(job_, spare), std::to_string(rank) + " " + std::to_string(epoch_));
}

bool FtController::spare_waiting(int spare) {
  auto v = store_->try_get(keys::spare(job_, spare));
  return v.is_ok() && v.value();
}

bool FtController::recovered() {
  auto ready = store_->try_get(keys::ready(job_, epoch_));
  return ready.is_ok() && ready.value();
}

void FtController::reset_heartbeat(int rank) {
  if (rank < 0 || rank >= n_) return;
  Beat& b = beats_[static_cast<size_t>(rank)];
  b = Beat{{}, false, false, b.gen + 1, {}};
  // The predecessor's counter must not count as the replacement's first beat: a slow start
  // would look like a hang.
  (void)store_->del(keys::heartbeat(job_, rank));
}

void FtController::set_job(std::string job_id) {
  std::lock_guard<std::mutex> g(mu_);
  job_ = std::move(job_id);
  for (auto& b : beats_) b = Beat{{}, false, false, b.gen + 1, {}};
}

}  // namespace strata::cli

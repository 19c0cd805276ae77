#include "cli/ft_controller.hpp"

#include <strata/recovery.hpp>

#include "recovery/keys.hpp"

namespace strata::cli {

namespace keys = recovery::keys;
using Clock = std::chrono::steady_clock;

Status FtController::connect(const bootstrap::StoreAddress& addr, const std::string& token) {
  STRATA_ASSIGN_OR_RETURN(store_, bootstrap::StoreClient::connect(addr, token, Deadline::after(std::chrono::seconds(10))));
  beats_.assign(static_cast<size_t>(n_), Beat{});
  return Status::ok();
}

bool FtController::on_failure(const std::vector<int>& ranks, const std::string& why) {
  (void)why;
  // Restarting everything is one event however many ranks went down with the first (the
  // others typically exit on seeing it); replacing counts every rank replaced.
  failures_ += opts_.restart_all ? 1 : static_cast<int>(ranks.size());
  if (failures_ > opts_.max_failures) return false;
  const int64_t t = recovery::now_ns();
  ++epoch_;
  pending_.insert(ranks.begin(), ranks.end());
  std::vector<int> list(pending_.begin(), pending_.end());
  // The timestamps first: a rank that wakes on the notice reads them in its report.
  (void)store_->set(keys::detected(job_, epoch_), std::to_string(t));
  (void)store_->set(keys::epoch(job_, epoch_), keys::format_ranks(list));
  for (int r : ranks) reset_heartbeat(r);
  return true;
}

void FtController::on_spawned() { (void)store_->set(keys::spawned(job_, epoch_), std::to_string(recovery::now_ns())); }

void FtController::reset_heartbeat(int rank) {
  if (rank < 0 || rank >= n_) return;
  beats_[static_cast<size_t>(rank)] = Beat{};
  // The predecessor's counter must not count as the replacement's first beat: a slow start
  // would look like a hang.
  (void)store_->del(keys::heartbeat(job_, rank));
}

std::vector<int> FtController::check(const std::vector<int>& running) {
  std::vector<int> hung;
  if (!store_) return hung;
  if (!pending_.empty()) {
    auto ready = store_->try_get(keys::ready(job_, epoch_));
    if (ready.is_ok() && ready.value()) pending_.clear();
  }
  const auto now = Clock::now();
  for (int r : running) {
    auto v = store_->try_get(keys::heartbeat(job_, r));
    if (!v.is_ok() || !v.value() || *v.value() == keys::kExiting) continue;  // not up yet, or leaving
    Beat& b = beats_[static_cast<size_t>(r)];
    if (!b.seen || *v.value() != b.value) {
      b.value = *v.value();
      b.seen = true;
      b.changed = now;
    } else if (now - b.changed > opts_.heartbeat_timeout) {
      hung.push_back(r);
    }
  }
  return hung;
}

}  // namespace strata::cli

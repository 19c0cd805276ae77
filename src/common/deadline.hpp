#pragma once
// A point in time after which a wait gives up. Every wait in Strata takes one.

#include <chrono>

namespace strata {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  /// Now + d; a d too long for the clock (milliseconds::max(), "wait forever") saturates to
  /// never() instead of wrapping into the past.
  static Deadline after(std::chrono::milliseconds d) {
    const Clock::time_point now = Clock::now();
    const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
    if (d >= room) return never();
    Deadline x(now + d);
    x.budget_ = d;
    return x;
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point t) : at_(t) {}
  /// The time this deadline was given when made by after() (for messages); max() otherwise.
  std::chrono::milliseconds budget() const { return budget_; }
  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  /// Time left, clamped at zero.
  std::chrono::milliseconds remaining() const {
    if (at_ == Clock::time_point::max()) return std::chrono::hours(24 * 365);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now());
    return left.count() < 0 ? std::chrono::milliseconds(0) : left;
  }

 private:
  Clock::time_point at_;
  std::chrono::milliseconds budget_ = std::chrono::milliseconds::max();
};

}  // namespace strata

#pragma once
// A point in time after which a wait gives up. Every wait in Strata takes one.

#include <chrono>

namespace strata {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  static Deadline after(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point t) : at_(t) {}
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
};

}  // namespace strata

#include "common/log.hpp"

#include <unistd.h>
#include <cstdio>

#include "common/env.hpp"

namespace strata::log {

namespace {
Level configured() {
  static const Level level = [] {
    const std::string& s = Env::get().log_level;
    if (s == "error") return Level::Error;
    if (s == "info") return Level::Info;
    if (s == "debug") return Level::Debug;
    return Level::Warn;
  }();
  return level;
}
}  // namespace

bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(configured()); }

void write(Level l, const std::string& msg) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::string line = "strata[" + std::to_string(getpid()) + "] " + names[static_cast<int>(l)] + ": " + msg + "\n";
  (void)!::write(2, line.data(), line.size());
}

}  // namespace strata::log

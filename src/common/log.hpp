#pragma once
// Minimal leveled logging to stderr; the level comes from Env (STRATA_LOG).

#include <sstream>
#include <string>

namespace strata::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

bool enabled(Level l);
void write(Level l, const std::string& msg);

}  // namespace strata::log

#define STRATA_LOG(level, expr)                                                \
  do {                                                                         \
    if (::strata::log::enabled(::strata::log::Level::level)) {                 \
      std::ostringstream strata_log_os_;                                       \
      strata_log_os_ << expr;                                                  \
      ::strata::log::write(::strata::log::Level::level, strata_log_os_.str()); \
    }                                                                          \
  } while (0)

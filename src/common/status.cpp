#include "common/status.hpp"

#include <cstring>

namespace strata {

std::string Status::to_string() const {
  if (is_ok()) return "Ok";
  return std::string(strata::to_string(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& prefix) const {
  if (is_ok()) return *this;
  return {code_, prefix + message_, peer_};
}

Status errno_status(const char* what, int err) {
  Code code = Code::Internal;
  if (err == ECONNREFUSED || err == ENOENT || err == EAGAIN || err == ECONNRESET || err == EPIPE)
    code = Code::Unavailable;
  if (err == EINVAL || err == EBADF || err == EFAULT) code = Code::InvalidArgument;
  if (err == ETIMEDOUT) code = Code::Timeout;
  return {code, std::string(what) + ": " + std::strerror(err)};
}

void throw_if_error(const Status& s, int rank) {
  if (s.is_ok()) return;
  throw Error(s.code(), s.message(), rank, s.peer());
}

}  // namespace strata

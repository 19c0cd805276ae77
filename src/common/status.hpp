#pragma once
// Errors as values inside the library: Status and Result<T>. The public API converts a
// failed Status into strata::Error at the boundary (see throw_if_error).

#include <strata/types.hpp>

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace strata {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message, int peer = -1) : code_(code), message_(std::move(message)), peer_(peer) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == Code::Ok; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  int peer() const { return peer_; }
  /// "PeerFailed: message" for logs.
  std::string to_string() const;
  /// Prepends context ("all_reduce: ") to the message, keeping the code.
  Status with_context(const std::string& prefix) const;

 private:
  Code code_ = Code::Ok;
  std::string message_;
  int peer_ = -1;
};

inline Status invalid_argument(std::string m) { return {Code::InvalidArgument, std::move(m)}; }
inline Status internal_error(std::string m) { return {Code::Internal, std::move(m)}; }
inline Status unavailable(std::string m) { return {Code::Unavailable, std::move(m)}; }
inline Status timeout_error(std::string m, int peer = -1) { return {Code::Timeout, std::move(m), peer}; }
inline Status peer_failed(std::string m, int peer = -1) { return {Code::PeerFailed, std::move(m), peer}; }
inline Status aborted(std::string m) { return {Code::Aborted, std::move(m)}; }
/// Status from errno with the failing call named.
Status errno_status(const char* what, int err);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                                     // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.is_ok()); }  // NOLINT
  bool is_ok() const { return status_.is_ok(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

/// Throws strata::Error for a failed status (public API boundary).
void throw_if_error(const Status& s, int rank = -1);
template <class T>
T value_or_throw(Result<T> r, int rank = -1) {
  throw_if_error(r.status(), rank);
  return std::move(r).value();
}

}  // namespace strata

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

#define STRATA_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::strata::Status strata_s_ = (expr);      \
    if (!strata_s_.is_ok()) return strata_s_; \
  } while (0)

#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define STRATA_ASSIGN_OR_RETURN(lhs, expr) STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(strata_r_, __LINE__), lhs, expr)

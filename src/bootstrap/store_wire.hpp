#pragma once
// Wire format and socket helpers shared by the store client and server (private to bootstrap).
//
// Every message is a frame: a u32 little-endian payload length, then the payload.
//   greeting (server, on accept) : u32 magic, u32 version, str server nonce, u64 incarnation
//   hello (client)               : u32 magic, u32 version, u64 client id, str client nonce,
//                                  str client proof
//   hello reply (server)         : u8 Ok, str server proof | u8 Error, str why
//   request                      : u8 op, u64 sequence, op fields (see Op)
//   reply                        : u8 ReplyCode, fields
// The token never crosses the wire: each side proves it knows it with an HMAC over both
// nonces (see proof()), so a capture of the traffic cannot be replayed and a server that
// does not know the token cannot pass itself off as the store.
// Strings are a u32 length followed by raw bytes, so keys and values may hold any byte.
// Integers are little-endian whatever the host, so a store may serve mixed machines.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "common/deadline.hpp"
#include "common/sha256.hpp"
#include "common/status.hpp"

namespace strata::bootstrap::wire {

inline constexpr uint32_t kMagic = 0x31525453;  // "STR1" on the wire
// 2: challenge-response instead of the token in clear, and the server's incarnation.
// 3: GetMany.
inline constexpr uint32_t kVersion = 3;
/// Bytes of each side's nonce.
inline constexpr size_t kNonceBytes = 32;
// Before the token is checked a peer may be anything (a port scanner, an HTTP client):
// keep what it can make the server buffer small.
inline constexpr uint32_t kMaxHelloBytes = 64 * 1024;
inline constexpr uint32_t kMaxFrameBytes = 1u << 30;

// Field layouts after the (op, sequence) header:
//   Set(str key, str value)                -> Ok
//   Get(str key, i64 timeout_ms)           -> Ok(str value) | Timeout(u32 n, str keys...)
//   TryGet(str key)                        -> Ok(str value) | NotFound
//   Wait(u32 n, str keys..., i64 timeout)  -> Ok | Timeout(u32 n, str missing keys...)
//   Add(str key, i64 delta)                -> Ok(i64 value) | Error(str)
//   CompareSet(str key, str exp, str des)  -> Ok(str value after)
//   Del(str key)                           -> Ok(u8 existed)
//   List(str prefix)                       -> Ok(u32 n, str keys...)
//   DeletePrefix(str prefix)               -> Ok(i64 count)
//   GetMany(u32 n, str keys..., i64 timeout) -> Ok(u32 n, str values...) | Timeout(u32 n, str missing keys...)
enum class Op : uint8_t { Set = 1, Get, TryGet, Wait, Add, CompareSet, Del, List, DeletePrefix, GetMany };
enum class ReplyCode : uint8_t { Ok = 0, NotFound, Timeout, Error };

/// Ops whose effect must not be applied twice when a request is re-sent after a broken
/// connection; the server remembers its last reply to each client for these.
inline bool is_mutating(Op op) {
  return op == Op::Set || op == Op::Add || op == Op::CompareSet || op == Op::Del || op == Op::DeletePrefix;
}

/// Builds one frame; the length prefix is filled in by frame().
class Writer {
 public:
  Writer() { buf_.assign(4, '\0'); }
  Writer& u8(uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) { return le(v, 4); }
  Writer& u64(uint64_t v) { return le(v, 8); }
  Writer& i64(int64_t v) { return le(static_cast<uint64_t>(v), 8); }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s.data(), s.size());
    return *this;
  }
  /// Finishes the writer: the frame, length prefix included. The writer is empty afterwards.
  std::string frame() {
    uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  Writer& le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  std::string buf_;
};

/// Reads fields from one payload. A short or malformed payload sets !ok() and yields zeros,
/// so callers check once at the end instead of after every field.
class Reader {
 public:
  explicit Reader(std::string_view payload) : rest_(payload) {}
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  int64_t i64() { return static_cast<int64_t>(le(8)); }
  std::string str() {
    uint32_t n = u32();
    if (!ok_ || rest_.size() < n) {
      ok_ = false;
      return {};
    }
    std::string s(rest_.substr(0, n));
    rest_.remove_prefix(n);
    return s;
  }
  /// An element count, checked against the bytes left (each element takes at least
  /// `min_item_bytes`), so a corrupt count cannot make the caller allocate gigabytes.
  uint32_t count(size_t min_item_bytes) {
    uint32_t n = u32();
    if (ok_ && size_t{n} * min_item_bytes > rest_.size()) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return rest_.empty(); }

 private:
  uint64_t le(int bytes) {
    if (!ok_ || rest_.size() < static_cast<size_t>(bytes)) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(rest_[i])} << (8 * i);
    rest_.remove_prefix(bytes);
    return v;
  }
  std::string_view rest_;
  bool ok_ = true;
};

/// Which side a proof comes from; part of the MAC, so a proof cannot be reflected back.
enum class Role : uint8_t { Client = 1, Server = 2 };

/// HMAC-SHA256(token, label || role || server nonce || client nonce || client id ||
/// incarnation): what each side sends to show it knows the token. Both nonces make it fresh
/// on every connection; the incarnation ties the server's proof to the store it speaks for.
inline std::string proof(std::string_view token, Role role, std::string_view server_nonce,
                         std::string_view client_nonce, uint64_t client_id, uint64_t incarnation) {
  Writer w;
  w.str("strata-store-auth").u8(static_cast<uint8_t>(role)).str(server_nonce).str(client_nonce);
  w.u64(client_id).u64(incarnation);
  std::string msg = w.frame();
  Digest256 d = hmac_sha256(token, msg);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

/// Compares two proofs in time independent of where they differ.
inline bool proofs_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

/// A request frame under construction, its (op, sequence) header written.
inline Writer request(Op op, uint64_t seq) {
  Writer w;
  w.u8(static_cast<uint8_t>(op)).u64(seq);
  return w;
}

inline uint32_t decode_length(const char* p) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return n;
}

/// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// Milliseconds for poll(): rounded up so a wait never ends just before its deadline.
inline int poll_timeout_ms(const Deadline& d) {
  auto left = d.at() - Deadline::Clock::now();
  if (left <= Deadline::Clock::duration::zero()) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;
  return ms > 60'000 ? 60'000 : static_cast<int>(ms);
}

/// Waits until `fd` is ready for `events`. Timeout when the deadline passes first.
inline Status wait_ready(int fd, short events, const Deadline& d) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, poll_timeout_ms(d));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("poll", errno);
    if (n > 0) return Status::ok();
    if (d.expired()) return timeout_error("deadline passed");
  }
}

/// Sends all of `data` on a non-blocking socket. Unavailable when the connection breaks.
inline Status send_all(int fd, std::string_view data, const Deadline& d) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      STRATA_RETURN_IF_ERROR(wait_ready(fd, POLLOUT, d));
      continue;
    }
    return unavailable(std::string("connection lost: ") + std::strerror(errno));
  }
  return Status::ok();
}

/// Reads exactly `n` bytes. Unavailable on EOF or a broken connection, Timeout at the deadline.
inline Status recv_exact(int fd, char* out, size_t n, const Deadline& d) {
  while (n > 0) {
    ssize_t r = ::recv(fd, out, n, 0);
    if (r > 0) {
      out += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return unavailable("connection closed by the store");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      STRATA_RETURN_IF_ERROR(wait_ready(fd, POLLIN, d));
      continue;
    }
    return unavailable(std::string("connection lost: ") + std::strerror(errno));
  }
  return Status::ok();
}

/// Reads one frame's payload into `payload`.
inline Status recv_frame(int fd, const Deadline& d, std::string& payload, uint32_t max_bytes = kMaxFrameBytes) {
  char hdr[4];
  STRATA_RETURN_IF_ERROR(recv_exact(fd, hdr, 4, d));
  uint32_t n = decode_length(hdr);
  if (n > max_bytes) return internal_error("store sent an oversized frame (" + std::to_string(n) + " bytes)");
  payload.assign(n, '\0');
  return recv_exact(fd, payload.data(), n, d);
}

/// Quotes a key for a message; bytes outside printable ASCII are shown as \xNN.
inline std::string quote_key(std::string_view k) {
  static const char* hex = "0123456789abcdef";
  std::string out = "'";
  for (unsigned char c : k) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  out.push_back('\'');
  return out;
}

}  // namespace strata::bootstrap::wire

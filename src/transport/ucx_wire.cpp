// Encoding and checks of the records the UCX transport exchanges through the store.

#include "transport/ucx_wire.hpp"

namespace strata::transport {

namespace {

/// The byte value of one hex digit, or -1.
int digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Decodes `hex` into bytes; `what` names the record in the error.
Result<std::string> from_hex(std::string_view hex, const std::string& what) {
  if (hex.size() % 2)
    return invalid_argument(what + " is " + std::to_string(hex.size()) + " hex digits long (an odd number)");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return invalid_argument(what + " holds a non-hex character at offset " + std::to_string(2 * i));
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

uint64_t read_le(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(b[at + i])} << (8 * i);
  return v;
}

}  // namespace

std::string to_hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[b[i] >> 4];
    s[2 * i + 1] = d[b[i] & 15];
  }
  return s;
}

std::string encode_rkey_record(uint64_t base, const void* packed, size_t packed_bytes) {
  unsigned char head[12];
  for (int i = 0; i < 8; ++i) head[i] = static_cast<unsigned char>(base >> (8 * i));
  const auto len = static_cast<uint32_t>(packed_bytes);
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<unsigned char>(len >> (8 * i));
  return to_hex(head, sizeof head) + to_hex(packed, packed_bytes);
}

Result<RkeyRecord> decode_rkey_record(std::string_view hex, int peer, uint32_t seg) {
  const std::string what =
      "ucx: the remote key record of segment " + std::to_string(seg) + " of world rank " + std::to_string(peer);
  if (hex.size() > 2 * (12 + kMaxUcxBlobBytes))
    return Status(Code::PeerFailed,
                  what + " is " + std::to_string(hex.size() / 2) + " bytes (at most " +
                      std::to_string(12 + kMaxUcxBlobBytes) + " accepted)",
                  peer);
  auto raw = from_hex(hex, what);
  if (!raw.is_ok()) return Status(Code::PeerFailed, raw.status().message(), peer);
  const std::string& b = raw.value();
  if (b.size() < 12)
    return Status(
        Code::PeerFailed,
        what + " is " + std::to_string(b.size()) + " bytes, shorter than its 12-byte header (base, key length)", peer);
  RkeyRecord rec;
  rec.base = read_le(b, 0, 8);
  const uint64_t len = read_le(b, 8, 4);
  if (len == 0 || len > kMaxUcxBlobBytes)
    return Status(Code::PeerFailed,
                  what + " declares a key length of " + std::to_string(len) + " bytes (1 to " +
                      std::to_string(kMaxUcxBlobBytes) + " accepted)",
                  peer);
  if (len != b.size() - 12)
    return Status(Code::PeerFailed,
                  what + " declares a key length of " + std::to_string(len) + " bytes but holds " +
                      std::to_string(b.size() - 12) + (len > b.size() - 12 ? " (truncated)" : " (trailing bytes)"),
                  peer);
  rec.packed = b.substr(12);
  return rec;
}

Result<std::string> decode_worker_address(std::string_view hex, int peer) {
  const std::string what = "ucx: the worker address of world rank " + std::to_string(peer);
  if (hex.empty()) return Status(Code::PeerFailed, what + " is empty", peer);
  if (hex.size() > 2 * kMaxUcxBlobBytes)
    return Status(Code::PeerFailed,
                  what + " is " + std::to_string(hex.size() / 2) + " bytes (at most " +
                      std::to_string(kMaxUcxBlobBytes) + " accepted)",
                  peer);
  auto raw = from_hex(hex, what);
  if (!raw.is_ok()) return Status(Code::PeerFailed, raw.status().message(), peer);
  return raw;
}

}  // namespace strata::transport

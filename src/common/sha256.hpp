#pragma once
// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written here so that the store can prove
// knowledge of the job token without sending it and without linking a crypto library for
// two functions. Not constant-time against cache attacks on the key schedule (there is no
// secret-indexed table: every step is additions, rotations and boolean functions).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace strata {

/// A SHA-256 digest.
using Digest256 = std::array<uint8_t, 32>;

/// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  /// Adds bytes to the message.
  void update(std::string_view data);
  /// Pads and returns the digest; the object must not be updated afterwards.
  Digest256 finish();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

/// SHA-256 of `data` in one call.
Digest256 sha256(std::string_view data);

/// HMAC-SHA256 of `message` under `key`.
Digest256 hmac_sha256(std::string_view key, std::string_view message);

/// Lower-case hex of a digest (tests and logs).
std::string to_hex(const Digest256& d);

/// Compares every byte, so the time taken does not tell a prober how much of a guess matched.
bool digests_equal(const Digest256& a, const Digest256& b);

/// `n` bytes from the kernel's CSPRNG (getrandom), for nonces and made-up tokens.
Result<std::string> random_bytes(size_t n);

}  // namespace strata

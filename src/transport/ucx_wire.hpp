#pragma once
// What one rank's UCX transport publishes in the store for its peers, and the checks a peer
// runs on it before UCX sees a byte: the hex text must decode, and a remote key record must
// hold exactly the key length it declares. UCX's own unpacking (ucp_ep_rkey_unpack,
// ucp_ep_create) takes no length, so a truncated or padded record handed to it would be
// read past its end. Kept apart from ucx.cpp so it builds and is tested without UCX.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace strata::transport {

/// Largest packed remote key or worker address accepted from a peer. UCX 1.13 packs a key
/// in tens of bytes per memory domain and an address in a few hundred per transport; the
/// bound only stops a corrupt record from making this rank allocate without limit.
inline constexpr size_t kMaxUcxBlobBytes = 64 * 1024;

/// Lower-case hex of `n` bytes at `p`.
std::string to_hex(const void* p, size_t n);

/// A peer's remote key record: the base address of its segment and its packed UCX key.
struct RkeyRecord {
  uint64_t base = 0;
  std::string packed;  // ucp_rkey_pack's bytes, exactly as many as the sender packed
};

/// The record of one segment, as published: hex of [u64 base][u32 key length][key bytes],
/// integers little-endian.
std::string encode_rkey_record(uint64_t base, const void* packed, size_t packed_bytes);

/// Decodes peer `peer`'s record of its segment `seg`. PeerFailed (the peer cannot be reached
/// through it), naming the peer, the segment and the field, when the text is not hex, shorter
/// than its header, or its key length is zero, over kMaxUcxBlobBytes or different from the
/// key bytes actually there.
Result<RkeyRecord> decode_rkey_record(std::string_view hex, int peer, uint32_t seg);

/// Decodes peer `peer`'s published worker address. PeerFailed, naming the peer, when it is
/// empty, not hex, or longer than kMaxUcxBlobBytes.
Result<std::string> decode_worker_address(std::string_view hex, int peer);

}  // namespace strata::transport

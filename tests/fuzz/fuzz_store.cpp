// libFuzzer target: the store server's protocol (src/bootstrap/store_server.cpp) fed arbitrary
// client bytes through StoreProtocolDriver: no sockets, the same hello, request, parking and
// replay code as a real server.
//
// The input is a script of steps, so that several connections interleave (a Get parked on one
// is woken by a Set on another) and both sides of authentication are reached:
//   0 c        open a connection (greeting only: what follows is pre-auth input)
//   1 c id     open and authenticate it with a valid hello for client id `id` (the fuzzer
//              cannot forge the HMAC; this is the way past the challenge)
//   2 c n n b  feed n (u16 little-endian) bytes b to connection c
//   3 c        the client of c hangs up
// (step byte modulo 4; c modulo the connections open). Whatever the input, the server must
// not crash, leak or read out of bounds, and everything it sends must be whole frames
// (FUZZ_VERBOSE=1 prints them).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"
#include "bootstrap/store_wire.hpp"

namespace {

using namespace strata::bootstrap;

const std::string kToken = "fuzz-token";
const std::string kNonce(wire::kNonceBytes, 'n');
constexpr uint64_t kIncarnation = 0x5eed;
constexpr size_t kMaxConns = 8;

/// The hello a real client sends after reading the greeting.
std::string valid_hello(uint64_t client_id) {
  const std::string client_nonce(wire::kNonceBytes, 'c');
  return wire::Writer()
      .u32(wire::kMagic)
      .u32(wire::kVersion)
      .u64(client_id)
      .str(client_nonce)
      .str(wire::proof(kToken, wire::Role::Client, kNonce, client_nonce, client_id, kIncarnation))
      .frame();
}

/// FUZZ_VERBOSE=1 prints the first byte (the reply code) of every frame the server sends.
bool verbose() {
  static const bool v = getenv("FUZZ_VERBOSE") != nullptr;
  return v;
}

/// Everything the server sent must split into whole frames.
void check_frames(uint64_t conn, const std::string& out) {
  size_t at = 0;
  while (at < out.size()) {
    if (out.size() - at < 4) abort();
    const uint32_t n = wire::decode_length(out.data() + at);
    if (verbose() && n > 0 && at + 4 < out.size())
      fprintf(stderr, "conn %llu: %u-byte frame, first byte %d\n", static_cast<unsigned long long>(conn), n,
              static_cast<uint8_t>(out[at + 4]));
    at += 4 + size_t{n};
  }
  if (at != out.size()) abort();
}

struct Input {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
};

}  // namespace

// The server logs each refused peer as a warning: at thousands of inputs a second that is
// most of the run. Errors still show (unless STRATA_LOG says otherwise).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("STRATA_LOG", "error", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StoreServerOptions opts;
  opts.hello_timeout = std::chrono::milliseconds(60'000);  // no wall-clock expiry mid-input
  opts.max_pending = 4;
  opts.max_conn_bytes = 1 << 20;
  opts.reply_cache_entries = 4;
  StoreProtocolDriver d(kToken, opts, kNonce, kIncarnation);
  std::vector<uint64_t> conns;
  Input in{data, size};
  while (!in.empty()) {
    const uint8_t step = in.u8() % 4;
    if (step <= 1) {
      if (conns.size() == kMaxConns) continue;
      const uint64_t id = d.open();
      conns.push_back(id);
      if (step == 1) d.feed(id, valid_hello(in.u8()));
    } else if (conns.empty()) {
      continue;
    } else if (step == 2) {
      const uint64_t id = conns[in.u8() % conns.size()];
      size_t len = in.u8();
      len |= size_t{in.u8()} << 8;
      if (len > in.n) len = in.n;
      d.feed(id, std::string_view(reinterpret_cast<const char*>(in.p), len));
      in.p += len;
      in.n -= len;
    } else {
      d.hang_up(conns[in.u8() % conns.size()]);
    }
    for (uint64_t id : conns) check_frames(id, d.take_output(id));
  }
  return 0;
}

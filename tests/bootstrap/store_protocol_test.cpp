// The store server's protocol through StoreProtocolDriver (no sockets): the path the fuzzer
// (tests/fuzz/fuzz_store.cpp) drives is the server's own, so requests behave as over TCP.

#include <gtest/gtest.h>

#include "bootstrap/store.hpp"
#include "bootstrap/store_wire.hpp"

namespace strata::bootstrap {
namespace {

const std::string kToken = "t0ken";
const std::string kNonce(wire::kNonceBytes, 's');

std::string hello(uint64_t client_id, const std::string& token) {
  const std::string cn(wire::kNonceBytes, 'c');
  return wire::Writer()
      .u32(wire::kMagic)
      .u32(wire::kVersion)
      .u64(client_id)
      .str(cn)
      .str(wire::proof(token, wire::Role::Client, kNonce, cn, client_id, 42))
      .frame();
}

/// The payloads of the frames in `out`.
std::vector<std::string> frames(const std::string& out) {
  std::vector<std::string> v;
  size_t at = 0;
  while (at + 4 <= out.size()) {
    uint32_t n = wire::decode_length(out.data() + at);
    v.push_back(out.substr(at + 4, n));
    at += 4 + n;
  }
  EXPECT_EQ(at, out.size());
  return v;
}

TEST(StoreProtocol, HelloThenRequestsAndAParkedGet) {
  StoreProtocolDriver d(kToken, StoreServerOptions{}, kNonce, 42);
  uint64_t a = d.open(), b = d.open();
  auto greet = frames(d.take_output(a));
  ASSERT_EQ(greet.size(), 1u);
  wire::Reader g(greet[0]);
  EXPECT_EQ(g.u32(), wire::kMagic);
  EXPECT_EQ(g.u32(), wire::kVersion);
  EXPECT_EQ(g.str(), kNonce);
  EXPECT_EQ(g.u64(), 42u);
  ASSERT_TRUE(d.feed(a, hello(1, kToken)));
  ASSERT_TRUE(d.feed(b, hello(2, kToken)));
  auto ok = frames(d.take_output(a));
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0][0], static_cast<char>(wire::ReplyCode::Ok));
  (void)d.take_output(b);
  // a waits for "k"; b sets it; a's reply carries the value.
  ASSERT_TRUE(d.feed(a, wire::request(wire::Op::Get, 1).str("k").i64(60'000).frame()));
  EXPECT_TRUE(d.take_output(a).empty());
  ASSERT_TRUE(d.feed(b, wire::request(wire::Op::Set, 1).str("k").str("v").frame()));
  auto got = frames(d.take_output(a));
  ASSERT_EQ(got.size(), 1u);
  wire::Reader r(got[0]);
  EXPECT_EQ(r.u8(), static_cast<uint8_t>(wire::ReplyCode::Ok));
  EXPECT_EQ(r.str(), "v");
  EXPECT_EQ(d.keys(), 1u);
}

TEST(StoreProtocol, WrongTokenAndGarbageAreRefusedBeforeAnyRequest) {
  StoreProtocolDriver d(kToken, StoreServerOptions{}, kNonce, 42);
  uint64_t a = d.open(), b = d.open();
  (void)d.take_output(a);
  (void)d.take_output(b);
  EXPECT_FALSE(d.feed(a, hello(1, "other") + wire::request(wire::Op::Set, 1).str("k").str("v").frame()));
  auto refused = frames(d.take_output(a));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("wrong job token"), std::string::npos);
  EXPECT_FALSE(d.feed(b, "GET / HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(d.closed(b));
  EXPECT_EQ(d.keys(), 0u);
}

}  // namespace
}  // namespace strata::bootstrap

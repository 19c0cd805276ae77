// SHA-256 against the FIPS 180-2 appendix vectors and HMAC-SHA256 against RFC 4231, so the
// store's challenge-response computes what any other implementation would.

#include "common/sha256.hpp"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(to_hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(to_hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalUpdatesMatchOneShotAtEveryBlockBoundary) {
  std::string msg;
  for (int i = 0; i < 200; ++i) msg.push_back(static_cast<char>(i * 7));
  for (size_t cut = 0; cut <= msg.size(); ++cut) {
    Sha256 s;
    s.update(std::string_view(msg).substr(0, cut));
    s.update(std::string_view(msg).substr(cut));
    EXPECT_EQ(to_hex(s.finish()), to_hex(sha256(msg))) << "split at " << cut;
  }
}

TEST(HmacSha256, Rfc4231Vectors) {
  // Test case 1.
  EXPECT_EQ(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2 (key shorter than the block).
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6 (key longer than the block: hashed first).
  EXPECT_EQ(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(unhex("4a"), "J");
}

TEST(HmacSha256, DigestsEqualComparesEveryByte) {
  Digest256 a = sha256("x"), b = a;
  EXPECT_TRUE(digests_equal(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(digests_equal(a, b));
}

TEST(RandomBytes, GivesTheRequestedLengthAndDiffers) {
  auto a = random_bytes(32), b = random_bytes(32);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace strata

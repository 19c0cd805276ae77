// What peers on other hosts send, checked before it is used (coll/descriptor.cpp,
// transport/ucx_wire.cpp): malformed, truncated or over-long input fails with an error
// naming the peer and the field, and well-formed input passes. The same parsers are fuzzed
// by tests/fuzz/fuzz_net_descriptor.cpp.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "coll/descriptor.hpp"
#include "coll/select.hpp"
#include "transport/ucx_wire.hpp"

namespace strata {
namespace {

using coll::Op;
using coll::OpDesc;
using coll::OpKind;

// ---- UCX remote key records and worker addresses -------------------------------------

std::string key_bytes(size_t n) {
  std::string k(n, '\0');
  for (size_t i = 0; i < n; ++i) k[i] = static_cast<char>(i * 7 + 1);
  return k;
}

/// The hex of [u64 base][u32 declared length][key bytes], the length free to lie.
std::string record_with_length(uint64_t base, uint32_t declared, const std::string& key) {
  std::string raw(12, '\0');
  for (int i = 0; i < 8; ++i) raw[i] = static_cast<char>(base >> (8 * i));
  for (int i = 0; i < 4; ++i) raw[8 + i] = static_cast<char>(declared >> (8 * i));
  raw += key;
  return transport::to_hex(raw.data(), raw.size());
}

void expect_peer_error(const Status& s, int peer, const std::vector<std::string>& words) {
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Code::PeerFailed) << s.to_string();
  EXPECT_EQ(s.peer(), peer) << s.to_string();
  for (const auto& w : words)
    EXPECT_NE(s.message().find(w), std::string::npos) << "no '" << w << "' in: " << s.message();
}

TEST(UcxRkeyRecord, RoundTrip) {
  const std::string key = key_bytes(45);
  const std::string hex = transport::encode_rkey_record(0x7f12'3456'7000, key.data(), key.size());
  auto rec = transport::decode_rkey_record(hex, 3, 11);
  ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
  EXPECT_EQ(rec->base, 0x7f12'3456'7000u);
  EXPECT_EQ(rec->packed, key);
}

TEST(UcxRkeyRecord, TruncatedKeyNamesPeerSegmentAndLength) {
  const std::string key = key_bytes(45);
  std::string hex = transport::encode_rkey_record(0x1000, key.data(), key.size());
  hex.resize(hex.size() - 10);  // the store value cut short: 5 key bytes missing
  expect_peer_error(transport::decode_rkey_record(hex, 3, 11).status(), 3,
                    {"world rank 3", "segment 11", "key length of 45", "holds 40", "truncated"});
}

TEST(UcxRkeyRecord, OverlongDeclaredLengthIsRefused) {
  const std::string key = key_bytes(16);
  expect_peer_error(transport::decode_rkey_record(record_with_length(0, 1u << 31, key), 6, 2).status(), 6,
                    {"world rank 6", "segment 2", "key length of 2147483648", "65536 accepted"});
  expect_peer_error(transport::decode_rkey_record(record_with_length(0, 17, key), 6, 2).status(), 6,
                    {"key length of 17", "holds 16", "truncated"});
  expect_peer_error(transport::decode_rkey_record(record_with_length(0, 15, key), 6, 2).status(), 6,
                    {"key length of 15", "holds 16", "trailing"});
  expect_peer_error(transport::decode_rkey_record(record_with_length(0, 0, ""), 6, 2).status(), 6, {"key length of 0"});
}

TEST(UcxRkeyRecord, ShortOrNonHexRecordIsRefused) {
  expect_peer_error(transport::decode_rkey_record("00112233", 1, 0).status(), 1, {"4 bytes", "12-byte header"});
  expect_peer_error(transport::decode_rkey_record("0011223", 1, 0).status(), 1, {"odd"});
  expect_peer_error(transport::decode_rkey_record(std::string(40, 'z'), 1, 0).status(), 1, {"non-hex", "offset 0"});
  expect_peer_error(transport::decode_rkey_record(std::string(2 * (12 + 65537), '0'), 1, 0).status(), 1, {"at most"});
}

TEST(UcxWorkerAddress, Checked) {
  auto ok = transport::decode_worker_address("00ff10", 4);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, std::string("\x00\xff\x10", 3));
  expect_peer_error(transport::decode_worker_address("", 4).status(), 4, {"worker address of world rank 4", "empty"});
  expect_peer_error(transport::decode_worker_address("0g", 4).status(), 4, {"non-hex"});
  expect_peer_error(transport::decode_worker_address(std::string(2 * 65536 + 2, 'a'), 4).status(), 4, {"at most"});
}

// ---- the first message of a cross-host collective ---------------------------------------

struct Call {
  Op op;
  OpDesc mine;
  int n = 4, me = 0;
};

Call all_reduce(int n, size_t count) {
  Call c;
  c.n = n;
  c.op.kind = OpKind::AllReduce;
  c.op.dtype = DataType::Float32;
  c.op.count = count;
  c.mine.seq = 12;
  c.mine.kind = static_cast<uint8_t>(OpKind::AllReduce);
  c.mine.dtype = static_cast<uint8_t>(DataType::Float32);
  c.mine.count = count;
  c.mine.algo = static_cast<uint8_t>(coll::Algo::NetDirect);
  return c;
}

/// The record a peer sends: its descriptor, then `vec`; exactly head bytes, so ASan sees any
/// read past it.
std::vector<char> record(const OpDesc& d, const std::vector<uint64_t>& vec = {}) {
  std::vector<char> b(sizeof d + vec.size() * 8);
  std::memcpy(b.data(), &d, sizeof d);
  if (!vec.empty()) std::memcpy(b.data() + sizeof d, vec.data(), vec.size() * 8);
  return b;
}

Status read(const Call& c, int r, const std::vector<char>& rec, size_t len, size_t eager = 0) {
  return detail::read_first_message(c.op, c.mine, c.me, c.n, r, rec.data(), len, eager).status();
}

void expect_invalid(const Status& s, int peer, const std::vector<std::string>& words) {
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Code::InvalidArgument) << s.to_string();
  EXPECT_EQ(s.peer(), peer) << s.to_string();
  for (const auto& w : words)
    EXPECT_NE(s.message().find(w), std::string::npos) << "no '" << w << "' in: " << s.message();
}

TEST(NetFirstMessage, MatchingDescriptorIsAccepted) {
  Call c = all_reduce(4, 100);
  OpDesc d = c.mine;
  d.flags = OpDesc::kHasOut | 16;  // output in the heap, offered for puts
  d.out_seg = 3;
  d.out_off = 1 << 20;
  auto rec = record(d);
  auto got = detail::read_first_message(c.op, c.mine, 0, 4, 2, rec.data(), rec.size(), 0);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->out_off, uint64_t{1} << 20);
  // Eager: the data follows the record.
  EXPECT_TRUE(read(c, 2, rec, rec.size() + 400, 400).is_ok());
}

TEST(NetFirstMessage, TruncatedOrOverlongMessageNamesThePeer) {
  Call c = all_reduce(4, 100);
  auto rec = record(c.mine);
  expect_invalid(read(c, 3, rec, 20), 3, {"rank 3 sent 20 bytes as its descriptor", "at least 48"});
  expect_invalid(read(c, 3, rec, 48 + 399, 400), 3, {"rank 3 sent 447 bytes", "expected 448"});
  expect_invalid(read(c, 1, rec, 48 + 8), 1, {"rank 1 sent 56 bytes", "expected 48"});
}

TEST(NetFirstMessage, FieldsOnlyThePeerKnowsAreChecked) {
  Call c = all_reduce(4, 100);
  OpDesc d = c.mine;
  d.flags = 0x400;
  expect_invalid(read(c, 2, record(d), 48), 2, {"rank 2's descriptor of operation #12", "unknown flags 1024"});
  d.flags = detail::kInHeap;  // an input offered by a rank that is no broadcast's root
  expect_invalid(read(c, 2, record(d), 48), 2, {"offers its input", "only a broadcast's root"});
  d.flags = 16;  // puts offered without an output
  expect_invalid(read(c, 2, record(d), 48), 2, {"offers its output for puts"});
  d.flags = OpDesc::kHasOut | 16;
  d.out_off = UINT64_MAX - 100;  // 400 bytes from there wrap around
  expect_invalid(read(c, 2, record(d), 48), 2, {"400-byte output at offset", "past the end"});
}

TEST(NetFirstMessage, HostMismatchNoticeIsAMismatchWhateverItsLength) {
  // The notice a rank sends after its host's ranks disagreed (coll/net/run.cpp, the host
  // round): its descriptor may equal this rank's and its length fit an eager message, but it
  // carries no data and must never pass for one.
  Call c = all_reduce(4, 4);
  OpDesc d = c.mine;
  d.flags = detail::kHostMismatch;
  d.in_seg = 2;
  d.in_off = 3;
  auto rec = record(d);
  rec.resize(48 + 16);
  expect_invalid(read(c, 2, rec, 64, 16), 2,
                 {"mismatch on operation #12", "rank 2's host called different operations", "(ranks 2 and 3)"});
  d.in_seg = static_cast<uint32_t>(-1);
  d.in_off = static_cast<uint64_t>(-1);
  expect_invalid(read(c, 3, record(d), 48), 3, {"rank 3's host called different operations; rank 0 called"});
}

TEST(NetFirstMessage, LateMismatchNoticeNamesWhoFoundItAndTheOperation) {
  // A rank that returned from operation #9 before the other hosts' descriptors arrived found
  // them mismatched as #12 started (up to CommImpl::kLateWindow operations later): #12 then
  // fails everywhere, whatever the rest of the notice.
  Call c = all_reduce(4, 4);
  OpDesc d = c.mine;
  d.flags = detail::kLateMismatch;
  d.in_seg = 1;
  d.in_off = 9;
  expect_invalid(read(c, 3, record(d), 48), 3,
                 {"mismatch on operation #12", "rank 1 found that operation #9 did not match", "rank 0 called"});
}

TEST(NetFirstMessage, CountVectorIsComparedAndBounded) {
  Call c;
  c.n = 3;
  c.me = 1;
  c.op.kind = OpKind::AllGatherV;
  c.op.dtype = DataType::Int32;
  c.op.counts = {1, 2, 3};
  c.mine.seq = 5;
  c.mine.kind = static_cast<uint8_t>(OpKind::AllGatherV);
  c.mine.dtype = static_cast<uint8_t>(DataType::Int32);
  ASSERT_EQ(detail::first_message_head(OpKind::AllGatherV, 3), 48u + 24u);
  EXPECT_TRUE(read(c, 2, record(c.mine, {1, 2, 3}), 72).is_ok());
  expect_invalid(read(c, 2, record(c.mine, {1, 9, 3}), 72), 2, {"counts[1] is 2 on rank 1 but 9 on rank 2"});
  // The vector cut off: named by length, never read past what arrived.
  expect_invalid(read(c, 0, record(c.mine, {1, 2, 3}), 60), 0, {"rank 0 sent 60 bytes", "expected 72"});
}

TEST(NetP2pHeader, AnnouncedSizeIsBounded) {
  detail::P2pHeader h{1, static_cast<uint32_t>(DataType::Float64), 1000};
  auto b = detail::p2p_data_bytes(h, 2);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*b, 8000u);
  h.count = uint64_t{1} << 62;
  auto over = detail::p2p_data_bytes(h, 2);
  expect_invalid(over.status(), 2, {"rank 2", "count 4611686018427387904", "64 bits"});
  h.count = 1;
  h.dtype = 99;
  expect_invalid(detail::p2p_data_bytes(h, 2).status(), 2, {"dtype 99"});
  EXPECT_NE(detail::p2p_describe("send", h).find("dtype=99"), std::string::npos);
}

}  // namespace
}  // namespace strata

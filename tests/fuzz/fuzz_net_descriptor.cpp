// libFuzzer target: what a rank on another host sends before any data moves, checked by
// pure functions before anything in it is used:
//   - the first message of a cross-host collective (coll/descriptor.cpp read_first_message:
//     descriptor, count vector, eager data length), against a call this rank made;
//   - the header of a cross-host send (p2p_data_bytes);
//   - the UCX records a peer publishes in the store (transport/ucx_wire.cpp: remote key
//     record, worker address).
// The first input byte picks the parser; the next bytes shape this rank's own call; the rest
// is the peer's message (FUZZ_VERBOSE=1 prints each verdict). Whatever the bytes, no crash, no out-of-bounds read, and
// an accepted message must be one this rank's call can run with.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "coll/descriptor.hpp"
#include "coll/select.hpp"
#include "transport/ucx_wire.hpp"

namespace {

using namespace strata;
using coll::Op;
using coll::OpDesc;
using coll::OpKind;

/// FUZZ_VERBOSE=1 prints each parser's verdict (to see what a seed or crash input does).
bool verbose() {
  static const bool v = getenv("FUZZ_VERBOSE") != nullptr;
  return v;
}

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{u8()} << (8 * i);
    return v;
  }
};

void first_message(Input& in) {
  // This rank's call: a kind that crosses hosts, n ranks, small counts.
  const OpKind kinds[] = {OpKind::AllReduce,  OpKind::Reduce,        OpKind::Broadcast,      OpKind::AllGather,
                          OpKind::AllGatherV, OpKind::ReduceScatter, OpKind::ReduceScatterV, OpKind::AllToAll,
                          OpKind::AllToAllV,  OpKind::Gather,        OpKind::Scatter,        OpKind::Barrier};
  Op op;
  op.kind = kinds[in.u8() % std::size(kinds)];
  op.dtype = static_cast<DataType>(in.u8() % 10);
  op.rop = static_cast<ReduceOp>(in.u8() % 4);
  const int n = 2 + in.u8() % 7;
  const int me = in.u8() % n;
  int r = in.u8() % n;
  if (r == me) r = (r + 1) % n;
  op.root = in.u8() % n;
  op.count = in.u8();
  for (int j = 0; j < n; ++j) {
    op.counts.push_back(in.u8() % 4);
    op.rcounts.push_back(in.u8() % 4);
  }
  OpDesc mine;
  mine.seq = 7;
  mine.kind = static_cast<uint8_t>(op.kind);
  mine.dtype = static_cast<uint8_t>(op.dtype);
  mine.rop = static_cast<uint8_t>(op.rop);
  mine.root = op.root;
  mine.count = coll::has_count(op.kind) ? op.count : 0;
  mine.algo = in.u8() % 7;
  const size_t eager = in.u8() % 2 ? op.count * dtype_size(op.dtype) : 0;
  // The message: its total length claimed by the transport, then the record bytes. The record
  // area holds exactly the head, as in first_round: a read past it is an ASan report.
  const size_t head = detail::first_message_head(op.kind, n);
  size_t len = in.u8() % 2 ? in.n + eager : (in.u8() | size_t{in.u8()} << 8);
  auto record = std::make_unique<char[]>(head);
  std::memset(record.get(), 0, head);
  std::memcpy(record.get(), in.p, std::min(head, in.n));
  auto d = detail::read_first_message(op, mine, me, n, r, record.get(), len, eager);
  if (verbose()) fprintf(stderr, "first message: %s\n", d.is_ok() ? "accepted" : d.status().to_string().c_str());
  if (d.is_ok()) {
    // Accepted: the same call, the length this rank expects, and only known flags.
    if (d->kind != mine.kind || d->seq != mine.seq || d->algo != mine.algo || len != head + eager) abort();
    if (d->flags & ~(uint32_t{31} | detail::kInHeap)) abort();
    // An input offered for reading only by a broadcast's root.
    if ((d->flags & detail::kInHeap) && (op.kind != coll::OpKind::Broadcast || r != d->root)) abort();
  } else if (d.status().code() != Code::InvalidArgument || d.status().peer() != r) {
    abort();  // a peer's bad message is the caller's InvalidArgument, naming that peer
  }
}

void p2p_header(Input& in) {
  detail::P2pHeader h;
  h.tag = static_cast<int32_t>(in.u64());
  h.dtype = static_cast<uint32_t>(in.u64());
  h.count = in.u64();
  auto b = detail::p2p_data_bytes(h, 3);
  if (verbose())
    fprintf(stderr, "p2p header: %s\n", b.is_ok() ? std::to_string(*b).c_str() : b.status().to_string().c_str());
  (void)detail::p2p_describe("send", h);
  if (b.is_ok() && h.count != 0 && *b / h.count != dtype_size(static_cast<DataType>(h.dtype))) abort();
}

void ucx_records(Input& in, bool rkey) {
  std::string_view text(reinterpret_cast<const char*>(in.p), in.n);
  if (rkey) {
    auto rec = transport::decode_rkey_record(text, 5, 9);
    if (verbose()) fprintf(stderr, "rkey record: %s\n", rec.is_ok() ? "accepted" : rec.status().to_string().c_str());
    if (rec.is_ok() && (rec->packed.empty() || rec->packed.size() > transport::kMaxUcxBlobBytes ||
                        text.size() != 2 * (12 + rec->packed.size())))
      abort();
    if (!rec.is_ok() && rec.status().code() != Code::PeerFailed) abort();
    // Round trip: what this rank publishes decodes to itself.
    if (rec.is_ok()) {
      auto again = transport::decode_rkey_record(
          transport::encode_rkey_record(rec->base, rec->packed.data(), rec->packed.size()), 5, 9);
      if (!again.is_ok() || again->packed != rec->packed || again->base != rec->base) abort();
    }
  } else {
    auto a = transport::decode_worker_address(text, 5);
    if (verbose()) fprintf(stderr, "worker address: %s\n", a.is_ok() ? "accepted" : a.status().to_string().c_str());
    if (a.is_ok() && (a->empty() || 2 * a->size() != text.size())) abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  switch (in.u8() % 4) {
    case 0: first_message(in); break;
    case 1: p2p_header(in); break;
    case 2: ucx_records(in, true); break;
    default: ucx_records(in, false); break;
  }
  return 0;
}

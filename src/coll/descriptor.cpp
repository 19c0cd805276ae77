// Checks of what peers send about their calls: nothing a peer wrote is used before it is
// compared with this rank's own call or bounded (see descriptor.hpp).

#include "coll/descriptor.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "coll/counts.hpp"
#include "coll/select.hpp"

namespace strata::detail {

using coll::has_count;
using coll::Op;
using coll::OpDesc;
using coll::OpKind;
using coll::reducing;

namespace {

// OpDesc flags a peer may set.
constexpr uint32_t kKnownFlags =
    OpDesc::kHasIn | OpDesc::kHasOut | OpDesc::kInCma | OpDesc::kOutCma | kOutHeap | kInHeap;

bool has_vec(OpKind k) { return k == OpKind::AllGatherV || k == OpKind::ReduceScatterV || k == OpKind::AllToAllV; }

}  // namespace

Status compare_descriptor(const Op& op, const OpDesc& mine, int me, const OpDesc& d, const uint64_t* vec, int r,
                          int n) {
  auto kind = static_cast<OpKind>(mine.kind);
  bool same = d.kind == mine.kind && d.seq == mine.seq;
  if (same && kind != OpKind::Barrier) same = d.dtype == mine.dtype;
  if (same && has_count(kind)) same = d.count == mine.count;
  if (same && reducing(kind)) same = d.rop == mine.rop;
  // Not rooted, `root` says who issued the call (kRootNone: the user; else split's or
  // alloc_symmetric's exchange).
  if (same) same = d.root == mine.root;
  // all_reduce has several algorithms with different steps; an inline operation takes one step
  // where the direct forms take two, so ranks that disagree must fail here, not wait.
  constexpr auto kInline = static_cast<uint8_t>(coll::Algo::Inline);
  if (same && (kind == OpKind::AllReduce || mine.algo == kInline || d.algo == kInline)) same = d.algo == mine.algo;
  std::string extra;
  if (same && vec && (kind == OpKind::AllGatherV || kind == OpKind::ReduceScatterV)) {
    for (int j = 0; j < n && same; ++j)
      if (vec[j] != op.counts[j]) {
        same = false;
        extra = " (counts[" + std::to_string(j) + "] is " + std::to_string(op.counts[j]) + " on rank " +
                std::to_string(me) + " but " + std::to_string(vec[j]) + " on rank " + std::to_string(r) + ")";
      }
  }
  if (same) return Status::ok();
  if (coll::refused(static_cast<OpKind>(d.kind), d.root) && d.seq == mine.seq) return refused_mismatch(mine, me, r);
  return Status(Code::InvalidArgument,
                "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                    " called " + coll::describe(mine) + " but rank " + std::to_string(r) + " called " +
                    coll::describe(d) + extra,
                r);
}

Status check_all_to_all_v_counts(const OpDesc& mine, int me, int n, const std::function<const uint64_t*(int)>& sends,
                                 const std::function<const uint64_t*(int)>& recvs) {
  for (int r = 0; r < n; ++r) {
    const uint64_t* s = sends(r);
    for (int j = 0; j < n; ++j) {
      const uint64_t expects = recvs(j)[r];
      if (s[j] == expects) continue;
      return Status(Code::InvalidArgument,
                    "collective mismatch on operation #" + std::to_string(mine.seq) + " (" + coll::describe(mine) +
                        "): rank " + std::to_string(r) + " sends " + std::to_string(s[j]) + " elements to rank " +
                        std::to_string(j) + ", which expects recv_counts[" + std::to_string(r) +
                        "]=" + std::to_string(expects) + (r == j ? " (its own block)" : "") + "; found by rank " +
                        std::to_string(me),
                    r == me ? j : r);
    }
  }
  return Status::ok();
}

Status compare_algorithm(const OpDesc& mine, int me, const OpDesc& d, int r) {
  if (d.kind != mine.kind || d.seq != mine.seq || d.algo == mine.algo) return Status::ok();
  return Status(Code::InvalidArgument,
                "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                    " runs " + coll::describe(mine) + " with the " +
                    coll::to_string(static_cast<coll::Algo>(mine.algo)) + " pattern but rank " + std::to_string(r) +
                    " with the " + coll::to_string(static_cast<coll::Algo>(d.algo)) +
                    " pattern (CollOptions::algorithm or the size differs between them)",
                r);
}

size_t longest_first_message(int n, int local_size) {
  return sizeof(OpDesc) +
         std::max(static_cast<size_t>(local_size) * coll::kEagerBytes, 2 * static_cast<size_t>(n) * sizeof(uint64_t));
}

size_t first_message_head(OpKind kind, int n) {
  return sizeof(OpDesc) + first_message_words(kind, n) * sizeof(uint64_t);
}

size_t first_message_words(OpKind kind, int n) {
  if (kind == OpKind::AllToAllV) return 2 * static_cast<size_t>(n);
  return has_vec(kind) ? static_cast<size_t>(n) : 0;
}

namespace {
constexpr const char* kRefusedWords = " refused its call there (its arguments were invalid; its own error names them)";
}  // namespace

Status refused_mismatch(const OpDesc& mine, int me, int r) {
  return Status(Code::InvalidArgument,
                "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(r) +
                    kRefusedWords + " while rank " + std::to_string(me) + " called " + coll::describe(mine) +
                    ", so it fails on every rank",
                r);
}

bool is_refusal(const Status& s) {
  return s.code() == Code::InvalidArgument && s.message().find(kRefusedWords) != std::string::npos;
}

Status late_mismatch(const OpDesc& mine, int me, int finder, uint64_t seq, int r) {
  return Status(Code::InvalidArgument,
                "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(finder) +
                    " found that operation #" + std::to_string(seq) +
                    " did not match on every rank (it had returned before the other hosts' descriptors arrived), "
                    "so this operation fails on every rank; rank " +
                    std::to_string(me) + " called " + coll::describe(mine),
                r);
}

Result<OpDesc> read_first_message(const Op& op, const OpDesc& mine, int me, int n, int r, const void* record,
                                  size_t len, size_t eager_bytes) {
  const auto kind = op.kind;
  const size_t head = first_message_head(kind, n);
  const std::string op_no = "operation #" + std::to_string(mine.seq);
  auto bad = [&](const std::string& m) { return Status(Code::InvalidArgument, m, r); };
  if (len < sizeof(OpDesc))
    return bad("rank " + std::to_string(r) + " sent " + std::to_string(len) + " bytes as its descriptor of " + op_no +
               " (expected at least " + std::to_string(sizeof(OpDesc)) + ")");
  OpDesc d;
  std::memcpy(&d, record, sizeof d);
  if (d.flags & kHostMismatch) {
    // The pair's numbers are only printed.
    const auto a = static_cast<int32_t>(d.in_seg), b = static_cast<int32_t>(d.in_off);
    // The error names the sender as the peer, as for any message; its text names who refused.
    if (b == kPairRefused && a >= 0 && a < n) return bad(refused_mismatch(mine, me, a).message());
    return bad("collective mismatch on " + op_no + ": ranks on rank " + std::to_string(r) +
               "'s host called different operations" +
               (a >= 0 && b >= 0 ? " (ranks " + std::to_string(a) + " and " + std::to_string(b) + ")" : std::string()) +
               "; rank " + std::to_string(me) + " called " + coll::describe(mine));
  }
  if (d.flags & kLateMismatch) return late_mismatch(mine, me, static_cast<int32_t>(d.in_seg), d.in_off, r);
  // The record area is only 8-byte aligned by convention: copy the counts out.
  std::vector<uint64_t> vec;
  if (len >= head && has_vec(kind)) {
    vec.resize(first_message_words(kind, n));
    std::memcpy(vec.data(), static_cast<const char*>(record) + sizeof(OpDesc), vec.size() * sizeof(uint64_t));
  }
  STRATA_RETURN_IF_ERROR(compare_algorithm(mine, me, d, r));
  STRATA_RETURN_IF_ERROR(compare_descriptor(op, mine, me, d, vec.empty() ? nullptr : vec.data(), r, n));
  const size_t want = head + eager_bytes;
  if (len != want)
    return bad("rank " + std::to_string(r) + " sent " + std::to_string(len) + " bytes for " + coll::describe(d) +
               " where rank " + std::to_string(me) + " expected " + std::to_string(want));
  // The call matches; what is left are the fields only the peer knows. Its output offset is
  // where this rank's puts land (offset + a block offset within the peer's output).
  if (d.flags & ~kKnownFlags)
    return bad("rank " + std::to_string(r) + "'s descriptor of " + op_no + " has unknown flags " +
               std::to_string(d.flags & ~kKnownFlags));
  if ((d.flags & kInHeap) && (kind != OpKind::Broadcast || r != d.root))
    return bad("rank " + std::to_string(r) + "'s descriptor of " + op_no + " offers its input (flags " +
               std::to_string(d.flags) + ") where only a broadcast's root may");
  if (d.flags & kOutHeap) {
    if (!(d.flags & OpDesc::kHasOut) || kind == OpKind::AllToAllV)
      return bad("rank " + std::to_string(r) + "'s descriptor of " + op_no + " offers its output for puts (flags " +
                 std::to_string(d.flags) + ") where " + coll::describe(d) + " has none to offer");
    const size_t out_bytes = coll::extent(op, r, n).out;
    if (d.out_off > UINT64_MAX - out_bytes)
      return bad("rank " + std::to_string(r) + "'s descriptor of " + op_no + " puts its " + std::to_string(out_bytes) +
                 "-byte output at offset " + std::to_string(d.out_off) + " of its segment " +
                 std::to_string(d.out_seg) + ", past the end of any address");
  }
  return d;
}

std::string p2p_describe(const char* name, const P2pHeader& h) {
  const bool known = h.dtype <= static_cast<uint32_t>(DataType::Float64);
  return std::string(name) + "(count=" + std::to_string(h.count) +
         ", dtype=" + (known ? to_string(static_cast<DataType>(h.dtype)) : std::to_string(h.dtype)) +
         ", tag=" + std::to_string(h.tag) + ")";
}

Result<size_t> p2p_data_bytes(const P2pHeader& h, int peer) {
  const size_t esz =
      h.dtype <= static_cast<uint32_t>(DataType::Float64) ? dtype_size(static_cast<DataType>(h.dtype)) : 0;
  if (esz == 0)
    return Status(Code::InvalidArgument,
                  "rank " + std::to_string(peer) + " sent a message header with dtype " + std::to_string(h.dtype) +
                      ", which is no Strata datatype",
                  peer);
  size_t bytes = 0;
  if (__builtin_mul_overflow(h.count, esz, &bytes))
    return Status(Code::InvalidArgument,
                  "rank " + std::to_string(peer) + " sent a message header announcing count " +
                      std::to_string(h.count) + " of " + to_string(static_cast<DataType>(h.dtype)) +
                      ", more bytes than fit in 64 bits",
                  peer);
  return bytes;
}

}  // namespace strata::detail

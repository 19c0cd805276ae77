#pragma once
// What the cross-host algorithms share: the message tags, the state of one operation while
// it runs on this rank (NetExec: its buffers, every member's descriptor, the transfers in
// flight), the direct reduce-scatter/all-gather steps that several patterns reuse, and each
// algorithm family's entry point (one file per family in coll/net/).

#include <vector>

#include "coll/comm_impl.hpp"
#include "coll/counts.hpp"
#include "coll/select.hpp"
#include "common/reduce.hpp"

namespace strata::detail::net {

using coll::kEagerBytes;
using coll::Op;
using coll::OpDesc;
using coll::OpKind;

// Tag layout: [63:62] the transport's (lanes), [61:48] communicator (claim_tag_base), [47:40] channel, [39:16]
// sequence, [15:12] recovery epoch (mod 16), [11:0] source (a communicator across hosts has at most kMaxNetRanks
// members).
enum Channel : uint64_t {
  kDesc = 0,
  kScatterReduce = 1,  // reduce-scatter phase of the direct patterns
  kGatherOut = 2,      // all-gather / final distribution phase
  kRoot = 3,           // to or from a root
  kAllToAll = 4,
  kRailReduce = 5,  // hierarchical: reduce-scatter along a rail
  kRailGather = 6,  // hierarchical: all-gather along a rail
  kP2pHeader = 0xfe,
  kP2pData = 0xff,
};

inline uint64_t make_tag(const CommImpl& c, uint64_t channel, uint32_t seq, int src) {
  static_assert(kMaxNetRanks <= 0x1000);
  return c.tag_base << 48 | (channel & 0xff) << 40 | uint64_t{seq & 0xffffffu} << 16 |
         uint64_t{c.tag_epoch & 0xfu} << 12 | (static_cast<uint64_t>(src) & 0xfff);
}

/// Everything one operation needs while it runs on this rank.
struct NetExec {
  NetExec(CommImpl& comm, const Op& o, Deadline d) : c(comm), op(o), deadline(d) {}
  CommImpl& c;
  const Op& op;
  Deadline deadline;
  uint32_t seq = 0;
  char* in = nullptr;
  char* out = nullptr;
  size_t esz = 0;
  std::vector<OpDesc> descs;    // every member's descriptor
  std::vector<char*> eager_in;  // eager operations: where the data rank r sent arrived
  std::vector<transport::TransferPtr> xs;
  // This rank needs no data from the other hosts and returns without waiting for their first
  // messages (CommImpl::LateCheck); decided in run() before the first round.
  bool defer = false;

  transport::Net& net() { return *c.net; }
  int g(int r) const { return c.members[r]; }

  // Data only, after the first round compared every descriptor: both sides know each
  // message's size, so the transport may stripe it (send_bulk).
  Status send(int r, uint64_t ch, const void* buf, size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(auto x, net().send_bulk(g(r), make_tag(c, ch, seq, c.rank), buf, bytes));
    if (ch != kDesc) c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
    xs.push_back(std::move(x));
    return Status::ok();
  }
  Status recv(int r, uint64_t ch, void* buf, size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(auto x, net().recv_bulk(g(r), make_tag(c, ch, seq, r), buf, bytes));
    xs.push_back(std::move(x));
    return Status::ok();
  }
  /// Data for rank r's output at element offset `dst_off`: a put where r's output is in its
  /// heap and puts are the data path, else a tag message. Both sides decide alike from r's
  /// descriptor (see expect()).
  Status deliver(int r, uint64_t ch, const void* src, size_t bytes, size_t dst_off_bytes) {
    const OpDesc& d = descs[r];
    if (net().use_put() && (d.flags & kOutHeap)) {
      STRATA_ASSIGN_OR_RETURN(
          auto x, net().put(g(r), make_tag(c, ch, seq, c.rank), src, bytes, {d.out_seg, d.out_off + dst_off_bytes}));
      c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
      xs.push_back(std::move(x));
      return Status::ok();
    }
    return send(r, ch, src, bytes);
  }
  Status expect(int r, uint64_t ch, void* dst, size_t bytes) {
    if (net().use_put() && (descs[c.rank].flags & kOutHeap)) return recv(r, ch, nullptr, 0);
    return recv(r, ch, dst, bytes);
  }
  Status wait(const char* /*what: the caller adds the operation's name*/) {
    std::vector<transport::TransferPtr> v;
    v.swap(xs);
    if (v.empty()) return Status::ok();
    Status s = net().wait(v, c.policy(deadline), "network transfer");
    if (!s.is_ok()) {
      const int gr = s.peer();
      // Name the peer by its rank in this communicator.
      int cr = -1;
      for (int r = 0; r < c.size && gr >= 0; ++r)
        if (c.members[r] == gr) cr = r;
      return Status(s.code(),
                    s.message() + " (rank " + std::to_string(c.rank) + ", operation #" + std::to_string(seq) + ")",
                    cr >= 0 ? cr : s.peer());
    }
    return s;
  }
};

/// The whole-communicator list of comm ranks 0..n-1, as a group for the direct steps.
std::vector<int> all_ranks(int n);
/// Balanced element counts of `count` elements cut into n slices (coll::balanced_slice).
std::vector<size_t> slice_counts(size_t count, int n, size_t esz);
/// An operation of the host's communicator (blocks `counts`), under this operation's deadline.
Op local_op(const NetExec& x, OpKind kind, const void* in, void* out, std::vector<size_t> counts, ReduceOp rop);
/// A rooted operation of the host's communicator, under this operation's deadline.
Op local_rooted(const NetExec& x, OpKind kind, const void* in, void* out, int local_root, ReduceOp rop);
/// Local index of comm rank r on its host (its rank in the host's communicator).
int local_index(const CommImpl& c, int r);
/// Block l of host h's share when an operation is cut across its ranks (element counts).
std::vector<size_t> host_slices(const NetExec& x, int h);

// direct.cpp: the direct pattern between all members (or a group of them).
/// Rank group[j] reduces block j of everyone's `src` (blocks at `displ` with `counts`,
/// element offsets) into its `dst`; `tmp` holds (n-1) * counts[me] elements.
Status direct_reduce_scatter(NetExec& x, const std::vector<int>& group, int me, const char* src,
                             const std::vector<size_t>& counts, const std::vector<size_t>& displ, char* dst, char* tmp,
                             uint64_t ch, int divisor);
/// The all-gather of blocks of `buf` within `group`; this rank's block is already in place.
Status direct_all_gather(NetExec& x, const std::vector<int>& group, int me, char* buf,
                         const std::vector<size_t>& counts, const std::vector<size_t>& displ, uint64_t ch);
/// all_reduce: direct reduce-scatter, then direct all-gather, between all members.
Status all_reduce_direct(NetExec& x);
Status reduce_scatter_direct(NetExec& x, const std::vector<size_t>& counts);
Status all_gather_direct(NetExec& x, const std::vector<size_t>& counts);

// hierarchical.cpp: an intra-host step over shared memory, the network between hosts.
Status all_reduce_hier(NetExec& x);
Status all_gather_hier(NetExec& x, const std::vector<size_t>& counts);
Status reduce_scatter_hier(NetExec& x, const std::vector<size_t>& counts);
Status broadcast_hier(NetExec& x);
Status reduce_hier(NetExec& x);

// all_to_all.cpp
/// all_to_all and all_to_all_v: every block straight from its sender to its receiver.
Status all_to_all(NetExec& x);

// rooted.cpp: the direct rooted collectives.
Status broadcast(NetExec& x);
Status reduce(NetExec& x);
Status gather(NetExec& x);
Status scatter(NetExec& x);

// eager.cpp: small operations whose data travels with the descriptor.
/// What an eager operation sends each member after its descriptor, and expects back.
struct Eager {
  std::vector<const char*> to;  // payload for rank r (nullptr: none)
  std::vector<size_t> to_bytes, from_bytes;
  std::vector<char*> into;  // where rank r's data lands: its place in the output, or nullptr
                            // for the receive area (data to combine; in-place all_to_all)
};
/// The eager form of `x.op` (selected as coll::Algo::NetEager).
Result<Eager> eager_plan(const NetExec& x);
/// Completes an eager operation from the data its first round brought.
Status finish_eager(NetExec& x);

// run.cpp
/// Runs `op` with the selected algorithm on a communicator that spans hosts.
Status run(CommImpl& c, Op& op, coll::Algo algo);

}  // namespace strata::detail::net

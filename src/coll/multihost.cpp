// Collectives and point-to-point on communicators that span hosts.
//
// Every operation starts with a descriptor exchange between all members (one small tag
// message per pair): it is the cross-host mismatch check, and every rank reaches the same
// verdict because every rank sees every descriptor. Then:
//  - all_reduce with the same number of ranks on every host is hierarchical: intra-host
//    reduce-scatter through the shared heap, an all-reduce of each rank's slice along its
//    rail (the ranks of equal local index on the other hosts) over the network, then an
//    intra-host all-gather. Each element crosses the network 2(H-1)/H times per rank of a
//    rail, not 2(n-1)/n times per rank.
//  - everything else, and all_reduce with uneven hosts, runs a direct pattern over the
//    network between all members: each transfer goes from the sender's buffer straight into
//    the receiver's (tag messages; puts into the receiver's registered heap where the
//    fabric does RMA natively). Temporaries only where data must be combined before it
//    lands (reductions) or where it would overwrite what peers still read (in place).

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "coll/comm_impl.hpp"
#include "coll/counts.hpp"
#include "common/reduce.hpp"

namespace strata::detail {

using coll::Op;
using coll::OpDesc;
using coll::OpKind;

namespace {

// Tag layout: [63:48] communicator hash, [47:40] channel, [39:16] sequence, [15:0] source.
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

// Set in a descriptor exchanged between hosts: the rank's output is in its heap at
// (out_seg, out_off), so peers may put into it.
constexpr uint32_t kOutHeap = 16;

uint64_t make_tag(const CommImpl& c, uint64_t channel, uint32_t seq, int src) {
  return c.tag_base << 48 | (channel & 0xff) << 40 | uint64_t{seq & 0xffffffu} << 16 |
         (static_cast<uint64_t>(src) & 0xffff);
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

  transport::Net& net() { return *c.net; }
  int g(int r) const { return c.members[r]; }

  Status send(int r, uint64_t ch, const void* buf, size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(auto x, net().send(g(r), make_tag(c, ch, seq, c.rank), buf, bytes));
    if (ch != kDesc) c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
    xs.push_back(std::move(x));
    return Status::ok();
  }
  Status recv(int r, uint64_t ch, void* buf, size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(auto x, net().recv(g(r), make_tag(c, ch, seq, r), buf, bytes));
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

/// The direct reduce-scatter: rank r reduces block r of everyone's `src` (blocks at `displ`
/// with `counts`, element offsets) into `dst`; `tmp` holds (n-1) * counts[me] elements.
/// Ranks are given as a list (`group`, comm ranks) so rails reuse it; `me` indexes group.
Status direct_reduce_scatter(NetExec& x, const std::vector<int>& group, int me, const char* src,
                             const std::vector<size_t>& counts, const std::vector<size_t>& displ, char* dst, char* tmp,
                             uint64_t ch, int divisor) {
  const int n = static_cast<int>(group.size());
  const size_t e = x.esz, mine = counts[me];
  for (int k = 1; k < n; ++k) {
    int j = (me + k) % n;
    if (mine) STRATA_RETURN_IF_ERROR(x.recv(group[j], ch, tmp + (k - 1) * mine * e, mine * e));
  }
  for (int k = 1; k < n; ++k) {
    int j = (me + k) % n;
    if (counts[j]) STRATA_RETURN_IF_ERROR(x.send(group[j], ch, src + displ[j] * e, counts[j] * e));
  }
  STRATA_RETURN_IF_ERROR(x.wait(coll::to_string(x.op.kind)));
  if (!mine) return Status::ok();
  // Sources in group order, so that every element is reduced in the same order on every
  // rank that reduces it (bit-identical results whoever computes them).
  std::vector<const void*> srcs(n);
  for (int j = 0; j < n; ++j) {
    int k = (j - me + n) % n;
    srcs[j] = k == 0 ? static_cast<const void*>(src + displ[me] * e) : tmp + (k - 1) * mine * e;
  }
  kernels::reduce(x.op.dtype, x.op.rop, dst, srcs.data(), n, mine, divisor);
  return Status::ok();
}

/// The direct all-gather of blocks (element counts/displacements) of `buf` within `group`;
/// this rank's block is already in place.
Status direct_all_gather(NetExec& x, const std::vector<int>& group, int me, char* buf,
                         const std::vector<size_t>& counts, const std::vector<size_t>& displ, uint64_t ch) {
  const int n = static_cast<int>(group.size());
  const size_t e = x.esz;
  for (int k = 1; k < n; ++k) {
    int j = (me + k) % n;
    if (counts[j]) STRATA_RETURN_IF_ERROR(x.recv(group[j], ch, buf + displ[j] * e, counts[j] * e));
  }
  for (int k = 1; k < n; ++k) {
    int j = (me + k) % n;
    if (counts[me]) STRATA_RETURN_IF_ERROR(x.send(group[j], ch, buf + displ[me] * e, counts[me] * e));
  }
  return x.wait(coll::to_string(x.op.kind));
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<size_t> slice_counts(size_t count, int n, size_t esz) {
  std::vector<size_t> c(n);
  for (int i = 0; i < n; ++i) {
    auto [lo, hi] = coll::balanced_slice(count, n, i, esz);
    c[i] = hi - lo;
  }
  return c;
}

Status all_reduce_direct(NetExec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  auto counts = slice_counts(x.op.count, n, e);
  auto displ = coll::prefix_sums(counts);
  STRATA_ASSIGN_OR_RETURN(void* tmp, x.c.scratch_block(2, std::max<size_t>(1, (n - 1) * counts[me] * e)));
  auto group = all_ranks(n);
  // In place, our sends read the blocks that the all-gather overwrites: the reduce-scatter
  // waits for its sends before the all-gather posts a receive.
  STRATA_RETURN_IF_ERROR(direct_reduce_scatter(x, group, me, x.in, counts, displ, x.out + displ[me] * e,
                                               static_cast<char*>(tmp), kScatterReduce, n));
  return direct_all_gather(x, group, me, x.out, counts, displ, kGatherOut);
}

/// Same number of ranks L on every host: intra-host reduce-scatter (shm), rail all-reduce of
/// the slice (net), intra-host all-gather (shm).
Status all_reduce_hier(NetExec& x) {
  CommImpl& c = x.c;
  CommImpl& lc = *c.local;
  const int L = lc.size, li = lc.rank, H = static_cast<int>(c.host_members.size());
  const size_t e = x.esz;
  auto counts = slice_counts(x.op.count, L, e);
  auto displ = coll::prefix_sums(counts);
  char* my_slice = x.out + displ[li] * e;
  // Avg: sum within the host, divide by the whole communicator on the rail.
  const ReduceOp local_op = x.op.rop == ReduceOp::Avg ? ReduceOp::Sum : x.op.rop;
  if (L > 1) {
    Op rs;
    rs.kind = OpKind::ReduceScatterV;
    rs.dtype = x.op.dtype;
    rs.rop = local_op;
    rs.in = x.in;
    rs.out = my_slice;
    rs.counts = counts;
    rs.opts.timeout = x.deadline.remaining() + std::chrono::milliseconds(1);
    STRATA_RETURN_IF_ERROR(run_collective(lc, rs).with_context("intra-host reduce-scatter: "));
  } else if (x.in != x.out && counts[0]) {
    kernels::copy(x.out, x.in, counts[0] * e);
  }
  // The rail: comm ranks of local index li on every host.
  std::vector<int> rail(H);
  for (int h = 0; h < H; ++h) rail[h] = c.host_members[h][li];
  const int hm = c.host_of[c.rank];
  auto rc = slice_counts(counts[li], H, e);
  auto rd = coll::prefix_sums(rc);
  STRATA_ASSIGN_OR_RETURN(void* tmp, c.scratch_block(2, std::max<size_t>(1, (H - 1) * rc[hm] * e)));
  STRATA_RETURN_IF_ERROR(direct_reduce_scatter(x, rail, hm, my_slice, rc, rd, my_slice + rd[hm] * e,
                                               static_cast<char*>(tmp), kRailReduce, c.size));
  STRATA_RETURN_IF_ERROR(direct_all_gather(x, rail, hm, my_slice, rc, rd, kRailGather));
  if (L > 1) {
    Op ag;
    ag.kind = OpKind::AllGatherV;
    ag.dtype = x.op.dtype;
    ag.in = my_slice;
    ag.out = x.out;
    ag.counts = counts;
    ag.opts.timeout = x.deadline.remaining() + std::chrono::milliseconds(1);
    STRATA_RETURN_IF_ERROR(run_collective(lc, ag).with_context("intra-host all-gather: "));
  }
  return Status::ok();
}

bool even_hosts(const CommImpl& c) {
  for (const auto& h : c.host_members)
    if (h.size() != c.host_members[0].size()) return false;
  return true;
}

/// Comm ranks are grouped by host: host h holds ranks h*L .. h*L+L-1 (the launcher's
/// placement). The hierarchical all_gather / reduce_scatter need it, so that each host's
/// blocks are contiguous for the intra-host step.
bool contiguous_hosts(const CommImpl& c) {
  const size_t L = c.host_members[0].size();
  for (size_t h = 0; h < c.host_members.size(); ++h)
    for (size_t l = 0; l < c.host_members[h].size(); ++l)
      if (c.host_members[h][l] != static_cast<int>(h * L + l)) return false;
  return true;
}

Op local_op(const NetExec& x, OpKind kind, const void* in, void* out, std::vector<size_t> counts, ReduceOp rop) {
  Op o;
  o.kind = kind;
  o.dtype = x.op.dtype;
  o.rop = rop;
  o.in = in;
  o.out = out;
  o.counts = std::move(counts);
  o.opts.timeout = x.deadline.remaining() + std::chrono::milliseconds(1);
  return o;
}

/// Rails first, then the host: every rank sends its block once to the rank of equal local
/// index on each other host, straight into that rank's output; then each host's L blocks
/// of every host are completed by one intra-host all-gather per host (in place, shm).
Status all_gather_hier(NetExec& x, const std::vector<size_t>& counts) {
  CommImpl& c = x.c;
  const int L = c.local->size, li = c.local->rank, H = static_cast<int>(c.host_members.size());
  const int me = c.rank, hm = c.host_of[me];
  const size_t e = x.esz;
  auto displ = coll::prefix_sums(counts);
  if (counts[me] && x.out + displ[me] * e != x.in) kernels::copy(x.out + displ[me] * e, x.in, counts[me] * e);
  for (int h = 0; h < H; ++h) {
    int r = c.host_members[h][li];
    if (h != hm && counts[r]) STRATA_RETURN_IF_ERROR(x.expect(r, kRailGather, x.out + displ[r] * e, counts[r] * e));
  }
  for (int h = 0; h < H; ++h) {
    int r = c.host_members[h][li];
    if (h != hm && counts[me])
      STRATA_RETURN_IF_ERROR(x.deliver(r, kRailGather, x.out + displ[me] * e, counts[me] * e, displ[me] * e));
  }
  STRATA_RETURN_IF_ERROR(x.wait(coll::to_string(x.op.kind)));
  for (int h = 0; h < H; ++h) {
    const int first = h * L;
    std::vector<size_t> hc(counts.begin() + first, counts.begin() + first + L);
    Op ag = local_op(x, OpKind::AllGatherV, x.out + displ[first + li] * e, x.out + displ[first] * e, std::move(hc),
                     ReduceOp::Sum);
    STRATA_RETURN_IF_ERROR(run_collective(*c.local, ag).with_context("intra-host all-gather: "));
  }
  return Status::ok();
}

/// The host first, then rails: for each host h, the local ranks reduce-scatter this host's
/// contributions to h's blocks (shm), so local rank l holds the host's partial of block
/// (h, l); partials go once along the rail to their owner, which reduces the H of them.
Status reduce_scatter_hier(NetExec& x, const std::vector<size_t>& counts) {
  CommImpl& c = x.c;
  const int L = c.local->size, li = c.local->rank, H = static_cast<int>(c.host_members.size());
  const int me = c.rank, hm = c.host_of[me];
  const size_t e = x.esz;
  auto displ = coll::prefix_sums(counts);
  std::vector<size_t> pc(H);  // partials this rank holds: block (h, li) of every host h
  for (int h = 0; h < H; ++h) pc[h] = counts[h * L + li];
  auto pd = coll::prefix_sums(pc);
  STRATA_ASSIGN_OR_RETURN(void* pv, c.scratch_block(1, std::max<size_t>(1, (pd[H - 1] + pc[H - 1]) * e)));
  STRATA_ASSIGN_OR_RETURN(void* rv, c.scratch_block(2, std::max<size_t>(1, (H - 1) * counts[me] * e)));
  char* part = static_cast<char*>(pv);
  char* recvd = static_cast<char*>(rv);
  const ReduceOp lop = x.op.rop == ReduceOp::Avg ? ReduceOp::Sum : x.op.rop;
  for (int h = 0; h < H; ++h) {
    const int first = h * L;
    std::vector<size_t> hc(counts.begin() + first, counts.begin() + first + L);
    Op rs = local_op(x, OpKind::ReduceScatterV, x.in + displ[first] * e, part + pd[h] * e, std::move(hc), lop);
    STRATA_RETURN_IF_ERROR(run_collective(*c.local, rs).with_context("intra-host reduce-scatter: "));
  }
  const size_t mine = counts[me];
  for (int k = 1; k < H; ++k) {
    int h = (hm + k) % H;
    if (mine) STRATA_RETURN_IF_ERROR(x.recv(c.host_members[h][li], kRailReduce, recvd + (k - 1) * mine * e, mine * e));
  }
  for (int k = 1; k < H; ++k) {
    int h = (hm + k) % H;
    if (pc[h]) STRATA_RETURN_IF_ERROR(x.send(c.host_members[h][li], kRailReduce, part + pd[h] * e, pc[h] * e));
  }
  STRATA_RETURN_IF_ERROR(x.wait(coll::to_string(x.op.kind)));
  if (!mine) return Status::ok();
  std::vector<const void*> srcs(H);
  for (int h = 0; h < H; ++h) {
    int k = (h - hm + H) % H;
    srcs[h] = k == 0 ? static_cast<const void*>(part + pd[hm] * e) : recvd + (k - 1) * mine * e;
  }
  kernels::reduce(x.op.dtype, x.op.rop, x.out, srcs.data(), H, mine, c.size);
  return Status::ok();
}

Status reduce_scatter(NetExec& x, const std::vector<size_t>& counts) {
  const int n = x.c.size, me = x.c.rank;
  auto displ = coll::prefix_sums(counts);
  STRATA_ASSIGN_OR_RETURN(void* tmp, x.c.scratch_block(2, std::max<size_t>(1, (n - 1) * counts[me] * x.esz)));
  return direct_reduce_scatter(x, all_ranks(n), me, x.in, counts, displ, x.out, static_cast<char*>(tmp), kScatterReduce,
                               n);
}

Status all_gather(NetExec& x, const std::vector<size_t>& counts) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  auto displ = coll::prefix_sums(counts);
  if (counts[me] && x.out + displ[me] * e != x.in) kernels::copy(x.out + displ[me] * e, x.in, counts[me] * e);
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    if (counts[r]) STRATA_RETURN_IF_ERROR(x.expect(r, kGatherOut, x.out + displ[r] * e, counts[r] * e));
  }
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    if (counts[me]) STRATA_RETURN_IF_ERROR(x.deliver(r, kGatherOut, x.in, counts[me] * e, displ[me] * e));
  }
  return x.wait("all_gather");
}

Status all_to_all(NetExec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  const bool v = x.op.kind == OpKind::AllToAllV;
  std::vector<size_t> sc(n, x.op.count), sd(n), rcnt(n, x.op.count), rd(n);
  if (v) {
    sc = x.op.counts;
    sd = x.op.sdispls;
    rcnt = x.op.rcounts;
    rd = x.op.rdispls;
  } else {
    for (int r = 0; r < n; ++r) sd[r] = rd[r] = r * x.op.count;
  }
  const size_t out_bytes = coll::max_end(rcnt, rd) * e;
  // In place, peers' blocks would overwrite ones we have not sent yet: land in a temporary.
  char* dst = x.out;
  if (x.in == x.out && out_bytes) {
    STRATA_ASSIGN_OR_RETURN(void* t, x.c.scratch_block(2, out_bytes));
    dst = static_cast<char*>(t);
    if (v) kernels::copy(dst, x.out, out_bytes);  // keep what no peer writes
  }
  // Peers on this host are served through shared memory (an all_to_all_v of the host's
  // communicator, reading their buffers directly), the others over the network.
  CommImpl& c = x.c;
  const int hm = c.host_of[me];
  const bool shm = c.local && c.local->size > 1;
  auto by_net = [&](int r) { return !shm || c.host_of[r] != hm; };
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    if (!rcnt[r] || !by_net(r)) continue;
    if (dst == x.out) STRATA_RETURN_IF_ERROR(x.expect(r, kAllToAll, dst + rd[r] * e, rcnt[r] * e));
    else STRATA_RETURN_IF_ERROR(x.recv(r, kAllToAll, dst + rd[r] * e, rcnt[r] * e));
  }
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    if (!sc[r] || !by_net(r)) continue;
    // A put lands at our block of r's output (all_to_all only: all_to_all_v displacements
    // are the receiver's, so those always go as tag messages; see kOutHeap).
    STRATA_RETURN_IF_ERROR(x.deliver(r, kAllToAll, x.in + sd[r] * e, sc[r] * e, v ? 0 : me * x.op.count * e));
  }
  Status local = Status::ok();
  if (shm) {
    const std::vector<int>& lm = c.host_members[hm];  // local rank -> comm rank
    const size_t L = lm.size();
    Op o = local_op(x, OpKind::AllToAllV, x.in, dst, std::vector<size_t>(L), ReduceOp::Sum);
    o.sdispls.resize(L);
    o.rcounts.resize(L);
    o.rdispls.resize(L);
    for (size_t j = 0; j < L; ++j) {
      o.counts[j] = sc[lm[j]];
      o.sdispls[j] = sd[lm[j]];
      o.rcounts[j] = rcnt[lm[j]];
      o.rdispls[j] = rd[lm[j]];
    }
    local = run_collective(*c.local, o).with_context("intra-host all_to_all: ");
  } else if (rcnt[me]) {
    kernels::copy(dst + rd[me] * e, x.in + sd[me] * e, rcnt[me] * e);
  }
  // The network transfers are waited for even when the host's part failed: no receive may
  // land in a buffer after the call returns.
  Status net = x.wait(coll::to_string(x.op.kind));
  STRATA_RETURN_IF_ERROR(local);
  STRATA_RETURN_IF_ERROR(net);
  if (dst != x.out) {
    kernels::copy(x.out, dst, out_bytes);
    x.c.temp_bytes.fetch_add(out_bytes, std::memory_order_relaxed);
  }
  return Status::ok();
}

Status broadcast(NetExec& x) {
  const int n = x.c.size, me = x.c.rank, root = x.op.root;
  const size_t bytes = x.op.count * x.esz;
  if (!bytes) return Status::ok();
  if (me == root) {
    if (x.out != x.in) kernels::copy(x.out, x.in, bytes);
    for (int k = 1; k < n; ++k) STRATA_RETURN_IF_ERROR(x.deliver((me + k) % n, kRoot, x.in, bytes, 0));
  } else {
    STRATA_RETURN_IF_ERROR(x.expect(root, kRoot, x.out, bytes));
  }
  return x.wait("broadcast");
}

/// Local index of comm rank r on its host (its rank in the host's communicator).
int local_index(const CommImpl& c, int r) {
  const auto& m = c.host_members[c.host_of[r]];
  return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
}

/// A rooted operation of the host's communicator, under this operation's deadline.
Op local_rooted(const NetExec& x, OpKind kind, const void* in, void* out, int local_root, ReduceOp rop) {
  Op o = local_op(x, kind, in, out, {}, rop);
  o.count = x.op.count;
  o.root = local_root;
  return o;
}

/// Block l of host h's share when an operation is cut across its ranks (element counts).
std::vector<size_t> host_slices(const NetExec& x, int h) {
  return slice_counts(x.op.count, static_cast<int>(x.c.host_members[h].size()), x.esz);
}

/// Scatter, then all-gather within each host: the root sends block l of the data to local
/// rank l of every other host, and each of those hosts completes it with an intra-host
/// all-gather (shm); the root's host broadcasts from the root. The data crosses to each host
/// once, not once per rank there, and over as many connections as that host has ranks.
Status broadcast_hier(NetExec& x) {
  CommImpl& c = x.c;
  const int me = c.rank, root = x.op.root, H = static_cast<int>(c.host_members.size());
  const int hm = c.host_of[me], hr = c.host_of[root];
  const size_t e = x.esz;
  if (!x.op.count) return Status::ok();
  const bool shm = c.local && c.local->size > 1;
  if (me == root) {
    if (x.out != x.in) kernels::copy(x.out, x.in, x.op.count * e);
    for (int h = 0; h < H; ++h) {
      if (h == hr) continue;
      auto counts = host_slices(x, h);
      auto displ = coll::prefix_sums(counts);
      for (size_t l = 0; l < counts.size(); ++l)
        if (counts[l])
          STRATA_RETURN_IF_ERROR(
              x.deliver(c.host_members[h][l], kRoot, x.in + displ[l] * e, counts[l] * e, displ[l] * e));
    }
    STRATA_RETURN_IF_ERROR(x.wait("broadcast"));
  }
  if (hm == hr) {
    if (!shm) return Status::ok();
    Op b = local_rooted(x, OpKind::Broadcast, x.out, x.out, local_index(c, root), ReduceOp::Sum);
    return run_collective(*c.local, b).with_context("intra-host broadcast: ");
  }
  auto counts = host_slices(x, hm);
  auto displ = coll::prefix_sums(counts);
  const int li = local_index(c, me);
  if (counts[li]) {
    STRATA_RETURN_IF_ERROR(x.expect(root, kRoot, x.out + displ[li] * e, counts[li] * e));
    STRATA_RETURN_IF_ERROR(x.wait("broadcast"));
  }
  if (!shm) return Status::ok();
  Op ag = local_op(x, OpKind::AllGatherV, x.out + displ[li] * e, x.out, counts, ReduceOp::Sum);
  return run_collective(*c.local, ag).with_context("intra-host all-gather: ");
}

/// The reverse of broadcast_hier: every other host reduce-scatters its contributions (shm)
/// and local rank l sends block l of the host's partial to the root; the root's host reduces
/// to the root (shm); the root combines the hosts' partials in host order.
Status reduce_hier(NetExec& x) {
  CommImpl& c = x.c;
  const int me = c.rank, root = x.op.root, H = static_cast<int>(c.host_members.size());
  const int hm = c.host_of[me], hr = c.host_of[root];
  const size_t e = x.esz, bytes = x.op.count * e;
  if (!bytes) return Status::ok();
  const bool shm = c.local && c.local->size > 1;
  // Avg: sum within and between hosts, divide by the whole communicator at the root.
  const ReduceOp lop = x.op.rop == ReduceOp::Avg ? ReduceOp::Sum : x.op.rop;
  if (hm != hr) {
    auto counts = host_slices(x, hm);
    auto displ = coll::prefix_sums(counts);
    const int li = local_index(c, me);
    STRATA_ASSIGN_OR_RETURN(void* p, c.scratch_block(1, std::max<size_t>(1, counts[li] * e)));
    char* part = static_cast<char*>(p);
    if (shm) {
      Op rs = local_op(x, OpKind::ReduceScatterV, x.in, part, counts, lop);
      STRATA_RETURN_IF_ERROR(run_collective(*c.local, rs).with_context("intra-host reduce-scatter: "));
    } else {
      part = x.in;
    }
    if (!counts[li]) return Status::ok();
    STRATA_RETURN_IF_ERROR(x.send(root, kRoot, part, counts[li] * e));
    return x.wait("reduce");
  }
  // The root's host partial goes straight into the root's output.
  if (shm) {
    Op r = local_rooted(x, OpKind::Reduce, x.in, me == root ? x.out : nullptr, local_index(c, root), lop);
    STRATA_RETURN_IF_ERROR(run_collective(*c.local, r).with_context("intra-host reduce: "));
  } else if (x.out != x.in) {
    kernels::copy(x.out, x.in, bytes);
  }
  if (me != root) return Status::ok();
  STRATA_ASSIGN_OR_RETURN(void* t, c.scratch_block(2, std::max<size_t>(1, (H - 1) * bytes)));
  char* recvd = static_cast<char*>(t);
  std::vector<const void*> srcs(H);
  for (int h = 0, k = 0; h < H; ++h) {
    if (h == hr) {
      srcs[h] = x.out;
      continue;
    }
    char* dst = recvd + k++ * bytes;
    srcs[h] = dst;
    auto counts = host_slices(x, h);
    auto displ = coll::prefix_sums(counts);
    for (size_t l = 0; l < counts.size(); ++l)
      if (counts[l]) STRATA_RETURN_IF_ERROR(x.recv(c.host_members[h][l], kRoot, dst + displ[l] * e, counts[l] * e));
  }
  STRATA_RETURN_IF_ERROR(x.wait("reduce"));
  kernels::reduce(x.op.dtype, x.op.rop, x.out, srcs.data(), H, x.op.count, c.size);
  return Status::ok();
}

Status reduce(NetExec& x) {
  const int n = x.c.size, me = x.c.rank, root = x.op.root;
  const size_t e = x.esz;
  auto counts = slice_counts(x.op.count, n, e);
  auto displ = coll::prefix_sums(counts);
  STRATA_ASSIGN_OR_RETURN(void* tmp, x.c.scratch_block(2, std::max<size_t>(1, (n - 1) * counts[me] * e)));
  char* part;
  if (me == root) {
    part = x.out + displ[me] * e;
  } else {
    STRATA_ASSIGN_OR_RETURN(void* p, x.c.scratch_block(1, std::max<size_t>(1, counts[me] * e)));
    part = static_cast<char*>(p);
  }
  STRATA_RETURN_IF_ERROR(direct_reduce_scatter(x, all_ranks(n), me, x.in, counts, displ, part, static_cast<char*>(tmp),
                                               kScatterReduce, n));
  if (me == root) {
    for (int r = 0; r < n; ++r)
      if (r != me && counts[r]) STRATA_RETURN_IF_ERROR(x.recv(r, kRoot, x.out + displ[r] * e, counts[r] * e));
  } else if (counts[me]) {
    STRATA_RETURN_IF_ERROR(x.send(root, kRoot, part, counts[me] * e));
  }
  return x.wait("reduce");
}

Status gather(NetExec& x) {
  const int n = x.c.size, me = x.c.rank, root = x.op.root;
  const size_t bytes = x.op.count * x.esz;
  if (!bytes) return Status::ok();
  if (me == root) {
    if (x.out + me * bytes != x.in) kernels::copy(x.out + me * bytes, x.in, bytes);
    for (int r = 0; r < n; ++r)
      if (r != me) STRATA_RETURN_IF_ERROR(x.expect(r, kRoot, x.out + r * bytes, bytes));
  } else {
    STRATA_RETURN_IF_ERROR(x.deliver(root, kRoot, x.in, bytes, me * bytes));
  }
  return x.wait("gather");
}

Status scatter(NetExec& x) {
  const int n = x.c.size, me = x.c.rank, root = x.op.root;
  const size_t bytes = x.op.count * x.esz;
  if (!bytes) return Status::ok();
  if (me == root) {
    if (x.in + me * bytes != x.out) kernels::copy(x.out, x.in + me * bytes, bytes);
    for (int r = 0; r < n; ++r)
      if (r != me) STRATA_RETURN_IF_ERROR(x.deliver(r, kRoot, x.in + r * bytes, bytes, 0));
  } else {
    STRATA_RETURN_IF_ERROR(x.expect(root, kRoot, x.out, bytes));
  }
  return x.wait("scatter");
}

/// Operations whose per-peer data is at most this big travel with their descriptor: one
/// network round instead of a descriptor exchange followed by data rounds. Measured at 2
/// hosts x 2 ranks (docs/PERFORMANCE_MULTIHOST.md): eager all_reduce wins up to 16 KiB,
/// beyond which the hierarchical pattern's smaller cross-host messages win.
constexpr size_t kEagerBytes = size_t{16} << 10;

/// The pattern an operation runs, published in OpDesc::algo (for all_reduce, 1 reads as
/// one_shot in coll::describe).
constexpr uint8_t kEagerPattern = 1, kDirectPattern = 2, kHostsPattern = 3;
const char* pattern_name(uint8_t a) {
  return a == kEagerPattern ? "eager" : a == kDirectPattern ? "direct" : a == kHostsPattern ? "through-hosts" : "?";
}
bool is_blocks(OpKind k) {
  return k == OpKind::AllGather || k == OpKind::AllGatherV || k == OpKind::ReduceScatter || k == OpKind::ReduceScatterV;
}

/// What an eager operation sends each member after its descriptor, and expects back.
struct Eager {
  std::vector<const char*> to;  // payload for rank r (nullptr: none)
  std::vector<size_t> to_bytes, from_bytes;
  std::vector<char*> into;  // where rank r's data lands: its place in the output, or nullptr
                            // for the receive area (data to combine; in-place all_to_all)
};

/// The eager form of `x.op`, or nothing when its messages are too big or its kind has none.
/// Decided from descriptor fields only: ranks that decide differently also publish different
/// descriptors, and the first round reports that as the mismatch it is.
std::optional<Eager> eager_plan(const NetExec& x) {
  const Op& op = x.op;
  const int n = x.c.size, me = x.c.rank, root = op.root;
  const size_t b = op.count * x.esz;
  if (!coll::has_count(op.kind) || b > kEagerBytes) return std::nullopt;
  Eager p;
  p.to.assign(n, nullptr);
  p.to_bytes.assign(n, 0);
  p.from_bytes.assign(n, 0);
  p.into.assign(n, nullptr);
  auto to = [&](int r, const char* src) {
    p.to[r] = src;
    p.to_bytes[r] = b;
  };
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    switch (op.kind) {
      case OpKind::AllReduce:
        if (op.opts.algorithm == Algorithm::TwoShot) return std::nullopt;
        to(r, x.in);
        p.from_bytes[r] = b;
        break;
      case OpKind::AllGather:
        to(r, x.in);
        p.from_bytes[r] = b;
        p.into[r] = x.out + r * b;
        break;
      case OpKind::AllToAll:
        to(r, x.in + r * b);
        p.from_bytes[r] = b;
        // In place, block r of the output is what we send to r: it cannot land there yet.
        p.into[r] = x.in == x.out ? nullptr : x.out + r * b;
        break;
      case OpKind::Broadcast:
      case OpKind::Scatter:
        if (me == root) {
          to(r, op.kind == OpKind::Scatter ? x.in + r * b : x.in);
        } else if (r == root) {
          p.from_bytes[r] = b;
          p.into[r] = x.out;
        }
        break;
      case OpKind::Reduce:
      case OpKind::Gather:
        if (me == root) {
          p.from_bytes[r] = b;
          if (op.kind == OpKind::Gather) p.into[r] = x.out + r * b;
        } else if (r == root) {
          to(r, x.in);
        }
        break;
      default: return std::nullopt;
    }
  }
  return p;
}

/// The first round of every operation: each member sends every other one message holding
/// its descriptor, then its count vector (v-collectives), then, for an eager operation, that
/// peer's data. It is the cross-host mismatch check (the form of check_descriptors in
/// algorithms.cpp), and every rank reaches the same verdict because every rank sees every
/// descriptor. Eager data that arrived is left at x.eager_in[r].
Status first_round(NetExec& x, const OpDesc& mine, const Eager* eager) {
  CommImpl& c = x.c;
  const int n = c.size, me = c.rank;
  const auto kind = x.op.kind;
  const bool has_vec = kind == OpKind::AllGatherV || kind == OpKind::ReduceScatterV || kind == OpKind::AllToAllV;
  const size_t head = sizeof(OpDesc) + (has_vec ? n * sizeof(uint64_t) : 0);
  std::vector<uint64_t> out_head(head / sizeof(uint64_t));
  std::memcpy(out_head.data(), &mine, sizeof mine);
  if (has_vec)
    for (int j = 0; j < n; ++j) out_head[sizeof(OpDesc) / sizeof(uint64_t) + j] = x.op.counts[j];
  // Each message is received in three parts: the record; the data, straight into its place
  // in the output (or into this receive area when it is to be combined first); and a spill
  // area with room for the largest first message of any operation, so that a peer that
  // called something else is read and named rather than cut off (only a mismatch reaches it).
  auto align = [](size_t v) { return (v + 63) & ~size_t{63}; };
  const size_t head_al = align(head),
               spill = align(std::max(sizeof(OpDesc) + kEagerBytes, head + n * sizeof(uint64_t)));
  size_t body_al = 0;
  if (eager)
    for (int r = 0; r < n; ++r)
      if (!eager->into[r]) body_al = std::max(body_al, align(eager->from_bytes[r]));
  STRATA_ASSIGN_OR_RETURN(void* rv, c.scratch_block(2, n * (head_al + body_al) + spill));
  char* heads = static_cast<char*>(rv);
  char* spill_at = heads + n * head_al;
  char* bodies = spill_at + spill;
  std::vector<transport::TransferPtr> rx(n);
  x.eager_in.assign(n, nullptr);
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    transport::Part parts[3] = {{heads + r * head_al, head}, {}, {spill_at, spill}};
    if (eager && eager->from_bytes[r]) {
      x.eager_in[r] = eager->into[r] ? eager->into[r] : bodies + r * body_al;
      parts[1] = {x.eager_in[r], eager->from_bytes[r]};
    }
    STRATA_ASSIGN_OR_RETURN(rx[r], x.net().recv_parts(x.g(r), make_tag(c, kDesc, x.seq, r), parts));
    x.xs.push_back(rx[r]);
  }
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    const bool data = eager && eager->to_bytes[r];
    STRATA_ASSIGN_OR_RETURN(auto t, x.net().send2(x.g(r), make_tag(c, kDesc, x.seq, me), out_head.data(), head,
                                                  data ? eager->to[r] : nullptr, data ? eager->to_bytes[r] : 0));
    if (data) c.direct_bytes.fetch_add(eager->to_bytes[r], std::memory_order_relaxed);
    x.xs.push_back(std::move(t));
  }
  Status ws = x.wait(coll::to_string(kind));
  if (!ws.is_ok()) {
    // A message too long for any first message of this operation: a different operation.
    if (ws.code() != Code::InvalidArgument) return ws;
    return Status(Code::InvalidArgument,
                  "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                      " called " + coll::describe(mine) + " but rank " + std::to_string(ws.peer()) +
                      " called an operation with a different descriptor (" + ws.message() + ")",
                  ws.peer());
  }
  x.descs.assign(n, OpDesc{});
  x.descs[me] = mine;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const size_t len = rx[r]->received;
    const char* m = heads + r * head_al;
    if (len < sizeof(OpDesc))
      return Status(Code::InvalidArgument,
                    "rank " + std::to_string(r) + " sent " + std::to_string(len) +
                        " bytes as its descriptor of operation #" + std::to_string(mine.seq) + " (expected at least " +
                        std::to_string(sizeof(OpDesc)) + ")",
                    r);
    OpDesc d;
    std::memcpy(&d, m, sizeof d);
    x.descs[r] = d;
    const auto* vec = len >= head && has_vec ? reinterpret_cast<const uint64_t*>(m + sizeof(OpDesc)) : nullptr;
    if (d.kind == mine.kind && d.seq == mine.seq && d.algo != mine.algo)
      return Status(Code::InvalidArgument,
                    "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                        " runs " + coll::describe(mine) + " with the " + pattern_name(mine.algo) +
                        " pattern but rank " + std::to_string(r) + " with the " + pattern_name(d.algo) +
                        " pattern (CollOptions::algorithm or the size differs between them)",
                    r);
    STRATA_RETURN_IF_ERROR(compare_descriptor(x.op, mine, me, d, vec, r, n));
    const size_t want = head + (eager ? eager->from_bytes[r] : 0);
    if (len != want)
      return Status(Code::InvalidArgument,
                    "rank " + std::to_string(r) + " sent " + std::to_string(len) + " bytes for " + coll::describe(d) +
                        " where rank " + std::to_string(me) + " expected " + std::to_string(want),
                    r);
  }
  return Status::ok();
}

/// Completes an eager operation from the data its first round brought.
Status finish_eager(NetExec& x) {
  CommImpl& c = x.c;
  const Op& op = x.op;
  const int n = c.size, me = c.rank, root = op.root;
  const size_t b = op.count * x.esz;
  if (!b) return Status::ok();
  auto land = [&](char* dst, int r) {
    if (x.eager_in[r] == dst) return;  // it arrived in place
    kernels::copy(dst, x.eager_in[r], b);
    c.temp_bytes.fetch_add(b, std::memory_order_relaxed);
  };
  auto reduce_all = [&] {
    // In rank order on every rank that reduces: bit-identical results everywhere.
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) srcs[r] = r == me ? static_cast<const void*>(x.in) : x.eager_in[r];
    kernels::reduce(op.dtype, op.rop, x.out, srcs.data(), n, op.count, n);
  };
  switch (op.kind) {
    case OpKind::AllReduce: reduce_all(); break;
    case OpKind::Reduce:
      if (me == root) reduce_all();
      break;
    case OpKind::AllGather:
    case OpKind::Gather:
      if (op.kind == OpKind::Gather && me != root) break;
      if (x.out + me * b != x.in) kernels::copy(x.out + me * b, x.in, b);
      for (int r = 0; r < n; ++r)
        if (r != me) land(x.out + r * b, r);
      break;
    case OpKind::AllToAll:
      if (x.out != x.in) kernels::copy(x.out + me * b, x.in + me * b, b);
      for (int r = 0; r < n; ++r)
        if (r != me) land(x.out + r * b, r);
      break;
    case OpKind::Broadcast:
      if (me != root) land(x.out, root);
      else if (x.out != x.in) kernels::copy(x.out, x.in, b);
      break;
    case OpKind::Scatter:
      if (me != root) land(x.out, root);
      else if (x.out != x.in + me * b) kernels::copy(x.out, x.in + me * b, b);
      break;
    default: return internal_error("finish_eager: no eager form");
  }
  return Status::ok();
}

}  // namespace

Status run_collective_net(CommImpl& c, Op& op) {
  auto timeout = op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout;
  NetExec x(c, op, Deadline::after(timeout));
  x.esz = dtype_size(op.dtype);
  // No staging: UCX moves data from and into any memory, heap or not.
  x.in = const_cast<char*>(static_cast<const char*>(op.in));
  x.out = static_cast<char*>(op.out);
  x.seq = ++c.seq;
  // Hierarchical where every host has the same number of ranks (rails of equal length);
  // uneven hosts take the direct patterns. Algorithm::OneShot/TwoShot ask for the direct one.
  const bool rails = even_hosts(c) && c.host_members.size() > 1 && c.local->size > 1 &&
                     op.opts.algorithm != Algorithm::OneShot && op.opts.algorithm != Algorithm::TwoShot;
  const bool hier = rails && op.kind == OpKind::AllReduce;
  const bool hier_blocks = rails && contiguous_hosts(c);
  // Rooted operations go through one rank per host wherever some host has several ranks.
  bool shared_host = false;
  for (const auto& h : c.host_members) shared_host = shared_host || h.size() > 1;
  const bool hosts = shared_host && c.host_members.size() > 1 && op.opts.algorithm != Algorithm::OneShot &&
                     op.opts.algorithm != Algorithm::TwoShot;

  OpDesc d{};
  d.seq = x.seq;
  d.kind = static_cast<uint8_t>(op.kind);
  d.dtype = static_cast<uint8_t>(op.dtype);
  d.rop = static_cast<uint8_t>(op.rop);
  d.root = op.root;
  d.count = coll::has_count(op.kind) ? op.count : 0;
  // Peers may put into our output only where it is what they write: the heap buffer itself,
  // not a temporary (in-place all_to_all), and at element offsets they can compute.
  const bool lands_in_out = !((op.kind == OpKind::AllToAll || op.kind == OpKind::AllToAllV) && op.in == op.out) &&
                            op.kind != OpKind::AllToAllV;
  if (op.out && lands_in_out)
    if (auto ref = c.ctx->heap->locate(op.out, 1)) {
      d.flags |= kOutHeap | OpDesc::kHasOut;
      d.out_seg = ref->seg;
      d.out_off = ref->offset;
    }
  const char* name = coll::to_string(op.kind);
  const std::optional<Eager> eager = eager_plan(x);
  // all_reduce publishes its pattern: eager (one-shot) or not, as the shm path does.
  // The pattern, which depends on CollOptions::algorithm too: ranks that would run different
  // patterns fail as a mismatch instead of waiting for messages that never come.
  const bool through_hosts = (op.kind == OpKind::AllReduce && hier) || (is_blocks(op.kind) && hier_blocks) ||
                             ((op.kind == OpKind::Broadcast || op.kind == OpKind::Reduce) && hosts);
  d.algo = eager ? kEagerPattern : through_hosts ? kHostsPattern : kDirectPattern;
  Status st = first_round(x, d, eager ? &*eager : nullptr);
  if (st.is_ok() && eager) {
    st = finish_eager(x);
  } else if (st.is_ok()) {
    switch (op.kind) {
      case OpKind::AllReduce: st = hier ? all_reduce_hier(x) : all_reduce_direct(x); break;
      case OpKind::Reduce: st = hosts ? reduce_hier(x) : reduce(x); break;
      case OpKind::Broadcast: st = hosts ? broadcast_hier(x) : broadcast(x); break;
      case OpKind::AllGather:
      case OpKind::AllGatherV: {
        auto counts = op.kind == OpKind::AllGather ? std::vector<size_t>(c.size, op.count) : op.counts;
        st = hier_blocks ? all_gather_hier(x, counts) : all_gather(x, counts);
        break;
      }
      case OpKind::ReduceScatter:
      case OpKind::ReduceScatterV: {
        auto counts = op.kind == OpKind::ReduceScatter ? std::vector<size_t>(c.size, op.count) : op.counts;
        st = hier_blocks ? reduce_scatter_hier(x, counts) : reduce_scatter(x, counts);
        break;
      }
      case OpKind::AllToAll:
      case OpKind::AllToAllV: st = all_to_all(x); break;
      case OpKind::Gather: st = gather(x); break;
      case OpKind::Scatter: st = scatter(x); break;
      case OpKind::Barrier: break;  // the descriptor exchange is an all-to-all handshake
      default: st = internal_error(std::string("not a collective: ") + name);
    }
  } else if (st.code() == Code::InvalidArgument) {
    // Every rank saw every descriptor: all fail this operation and the communicator stays usable.
    return st.with_context(std::string(name) + ": ");
  }
  if (!st.is_ok()) {
    Status full = st.with_context(std::string(name) + ": ");
    c.set_broken(full);
    if (c.local) c.local->set_broken(full);
    return full;
  }
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

// ---- point to point ------------------------------------------------------------------------

namespace {

struct P2pHeader {
  int32_t tag = 0;
  uint32_t dtype = 0;
  uint64_t count = 0;
};

std::string p2p_str(const char* name, const P2pHeader& h) {
  return std::string(name) + "(count=" + std::to_string(h.count) +
         ", dtype=" + to_string(static_cast<DataType>(h.dtype)) + ", tag=" + std::to_string(h.tag) + ")";
}

}  // namespace

Result<std::shared_ptr<WorkState>> post_send_net(CommImpl& c, const Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const int peer = op.peer;
  const uint32_t s = ++c.send_seq[peer];
  auto hdr = std::make_shared<P2pHeader>();
  hdr->tag = op.tag;
  hdr->dtype = static_cast<uint32_t>(op.dtype);
  hdr->count = op.count;
  const size_t bytes = op.count * dtype_size(op.dtype);
  const int g = c.members[peer];
  std::vector<transport::TransferPtr> xs;
  // Straight from the caller's buffer (heap or not): nothing is staged. A small message rides
  // with its header (one message); a larger one follows it, so that the receiver, having
  // checked the header, receives it in place.
  const bool eager = bytes <= kEagerBytes;
  STRATA_ASSIGN_OR_RETURN(auto h, c.net->send2(g, make_tag(c, kP2pHeader, s, c.rank), hdr.get(), sizeof *hdr,
                                               eager ? op.in : nullptr, eager ? bytes : 0));
  xs.push_back(std::move(h));
  if (!eager) {
    STRATA_ASSIGN_OR_RETURN(auto dx, c.net->send(g, make_tag(c, kP2pData, s, c.rank), op.in, bytes));
    xs.push_back(std::move(dx));
  }
  c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
  auto w = std::make_shared<WorkState>();
  w->rank = c.rank;
  auto self = c.shared_from_this();
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  w->poll = [self, xs, hdr, peer, d](bool block) -> Status {
    CommImpl& cc = *self;
    if (!block) {
      for (const auto& x : xs)
        if (!cc.net->test(*x)) return Status(Code::Unavailable, "pending");
      for (const auto& x : xs)
        if (!x->status.is_ok()) return x->status;
      return Status::ok();
    }
    Status st = cc.net->wait(xs, cc.policy(d), "send");
    if (!st.is_ok()) {
      Status full(st.code(),
                  st.message() + " on rank " + std::to_string(cc.rank) + " sending to rank " + std::to_string(peer),
                  peer);
      if (st.code() != Code::Timeout) cc.set_broken(full);
      return full;
    }
    return st;
  };
  return w;
}

Status recv_net(CommImpl& c, const Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const int peer = op.peer, g = c.members[peer];
  const uint32_t s = ++c.recv_seq[peer];
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  auto fail = [&](Status st) {
    Status full(st.code(),
                st.message() + " on rank " + std::to_string(c.rank) + " receiving from rank " + std::to_string(peer),
                peer);
    if (st.code() != Code::Timeout && st.code() != Code::InvalidArgument) c.set_broken(full);
    return full;
  };
  // The header, then the data of a small message (see post_send_net) straight into the
  // receive buffer; a spill area takes what a mismatching sender sent beyond that.
  const size_t want = op.count * dtype_size(op.dtype);
  P2pHeader h;
  auto spill = std::make_unique_for_overwrite<char[]>(kEagerBytes);
  const bool small = want <= kEagerBytes;
  const transport::Part parts[3] = {
      {&h, sizeof h}, {small ? op.out : nullptr, small ? want : 0}, {spill.get(), kEagerBytes}};
  STRATA_ASSIGN_OR_RETURN(auto hx, c.net->recv_parts(g, make_tag(c, kP2pHeader, s, peer), parts));
  Status st = c.net->wait({hx}, c.policy(d), "recv");
  if (!st.is_ok()) return fail(st);
  if (hx->received < sizeof(P2pHeader))
    return fail(Status(
        Code::InvalidArgument,
        "rank " + std::to_string(peer) + " sent a " + std::to_string(hx->received) + "-byte message header", peer));
  const bool match = h.tag == op.tag && h.dtype == static_cast<uint32_t>(op.dtype) && h.count == op.count;
  const size_t got =
      h.dtype <= static_cast<uint32_t>(DataType::Float64) ? h.count * dtype_size(static_cast<DataType>(h.dtype)) : 0;
  if (got <= kEagerBytes) {
    // The data came with the header: in place when it matches this receive.
    if (hx->received != sizeof h + got)
      return fail(Status(Code::InvalidArgument,
                         "rank " + std::to_string(peer) + " sent " + std::to_string(hx->received - sizeof h) +
                             " data bytes for " + p2p_str("send", h),
                         peer));
  } else {
    // On a mismatch the data is still taken (into a discard buffer), so the sender completes
    // and both sides stay in step for the next message.
    std::vector<char> discard(match ? 0 : got);
    STRATA_ASSIGN_OR_RETURN(
        auto dx, c.net->recv(g, make_tag(c, kP2pData, s, peer), match ? op.out : discard.data(), match ? want : got));
    st = c.net->wait({dx}, c.policy(d), "recv");
    if (!st.is_ok()) return fail(st);
  }
  if (!match) {
    P2pHeader mine{op.tag, static_cast<uint32_t>(op.dtype), op.count};
    return Status(Code::InvalidArgument,
                  "send/recv mismatch: rank " + std::to_string(c.rank) + " called " + p2p_str("recv", mine) +
                      " from rank " + std::to_string(peer) + " but rank " + std::to_string(peer) + " called " +
                      p2p_str("send", h),
                  peer);
  }
  c.direct_bytes.fetch_add(want, std::memory_order_relaxed);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

}  // namespace strata::detail

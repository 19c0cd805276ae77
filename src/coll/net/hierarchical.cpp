// The hierarchical patterns, for communicators whose hosts hold several ranks: an intra-host
// step through the shared heap (the host's own communicator), and only rails (the ranks of
// equal local index on each host) or one rank per host on the network. With the same number
// L of ranks on every host, each element of an all_reduce crosses the network 2(H-1)/H times
// per rank of a rail, not 2(n-1)/n times per rank.

#include <algorithm>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

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
  const ReduceOp host_rop = x.op.rop == ReduceOp::Avg ? ReduceOp::Sum : x.op.rop;
  if (L > 1) {
    Op rs = local_op(x, OpKind::ReduceScatterV, x.in, my_slice, counts, host_rop);
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
    Op ag = local_op(x, OpKind::AllGatherV, my_slice, x.out, counts, ReduceOp::Sum);
    STRATA_RETURN_IF_ERROR(run_collective(lc, ag).with_context("intra-host all-gather: "));
  }
  return Status::ok();
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

/// Scatter, then all-gather within each host: block l of the data goes to local rank l of
/// every other host, and each of those hosts completes it with an intra-host all-gather
/// (shm); the root's host broadcasts from the root. The data crosses to each host once, not
/// once per rank there, and over as many connections as that host has ranks. Where the root's
/// input is in its heap and every host has as many ranks, local rank l of the root's host
/// sends block l itself, read through its mapping of the root's heap: the data then leaves
/// from as many processes as connections (2 hosts x 2 ranks over TCP, 1 MiB: ~1.3x faster than
/// the root sending every block).
Status broadcast_hier(NetExec& x) {
  CommImpl& c = x.c;
  const int me = c.rank, root = x.op.root, H = static_cast<int>(c.host_members.size());
  const int hm = c.host_of[me], hr = c.host_of[root];
  const size_t e = x.esz;
  if (!x.op.count) return Status::ok();
  const bool shm = c.local && c.local->size > 1;
  const size_t L = c.host_members[hr].size();
  bool spread = (x.descs[root].flags & kInHeap) && L > 1;
  for (const auto& m : c.host_members) spread = spread && m.size() == L;
  if (spread && hm == hr) {
    const size_t li = static_cast<size_t>(local_index(c, me));
    const char* src = x.in;
    if (me != root) {
      const OpDesc& rd = x.descs[root];
      STRATA_ASSIGN_OR_RETURN(
          void* p, c.ctx->heap->peer_ptr(c.members[root], {rd.in_seg, rd.in_off}, x.op.count * e, x.deadline));
      src = static_cast<const char*>(p);
    } else if (x.out != x.in) {
      kernels::copy(x.out, x.in, x.op.count * e);
    }
    for (int h = 0; h < H; ++h) {
      if (h == hr) continue;
      auto counts = host_slices(x, h);
      auto displ = coll::prefix_sums(counts);
      if (counts[li])
        STRATA_RETURN_IF_ERROR(
            x.deliver(c.host_members[h][li], kRoot, src + displ[li] * e, counts[li] * e, displ[li] * e));
    }
    // Sent before the intra-host broadcast below, which the root cannot leave before every
    // rank of its host arrived: its input is read until then.
    STRATA_RETURN_IF_ERROR(x.wait("broadcast"));
  } else if (me == root) {
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
    const int from = spread ? c.host_members[hr][static_cast<size_t>(li)] : root;
    STRATA_RETURN_IF_ERROR(x.expect(from, kRoot, x.out + displ[li] * e, counts[li] * e));
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

}  // namespace strata::detail::net

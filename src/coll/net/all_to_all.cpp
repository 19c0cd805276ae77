// all_to_all and all_to_all_v across hosts: every block goes straight from its sender's
// input to its receiver's output.

#include <algorithm>
#include <cstring>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

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

}  // namespace strata::detail::net

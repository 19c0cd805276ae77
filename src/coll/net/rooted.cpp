// The direct rooted collectives across hosts: the root sends to or receives from every
// member; reduce is a direct reduce-scatter whose slices then go to the root.

#include <algorithm>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

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

}  // namespace strata::detail::net

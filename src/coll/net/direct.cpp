// The direct pattern across hosts: every transfer goes from the sender's buffer straight
// into the receiver's (tag messages; puts into the receiver's registered heap where the
// fabric does RMA natively). A reduction is a direct reduce-scatter, in group order on every
// rank, followed by a direct all-gather. The hierarchical patterns reuse both steps on rails.

#include <algorithm>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

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

Status reduce_scatter_direct(NetExec& x, const std::vector<size_t>& counts) {
  const int n = x.c.size, me = x.c.rank;
  auto displ = coll::prefix_sums(counts);
  STRATA_ASSIGN_OR_RETURN(void* tmp, x.c.scratch_block(2, std::max<size_t>(1, (n - 1) * counts[me] * x.esz)));
  return direct_reduce_scatter(x, all_ranks(n), me, x.in, counts, displ, x.out, static_cast<char*>(tmp), kScatterReduce,
                               n);
}

Status all_gather_direct(NetExec& x, const std::vector<size_t>& counts) {
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

}  // namespace strata::detail::net

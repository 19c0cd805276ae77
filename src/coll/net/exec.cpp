// Helpers the cross-host algorithm families share.

#include <algorithm>
#include <numeric>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

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

int local_index(const CommImpl& c, int r) {
  const auto& m = c.host_members[c.host_of[r]];
  return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
}

Op local_rooted(const NetExec& x, OpKind kind, const void* in, void* out, int local_root, ReduceOp rop) {
  Op o = local_op(x, kind, in, out, {}, rop);
  o.count = x.op.count;
  o.root = local_root;
  return o;
}

std::vector<size_t> host_slices(const NetExec& x, int h) {
  return slice_counts(x.op.count, static_cast<int>(x.c.host_members[h].size()), x.esz);
}

}  // namespace strata::detail::net

// Small operations across hosts: each member's data for each peer travels in one message
// with its descriptor (one network round), and is combined or landed when it arrives.

#include "coll/net/exec.hpp"

namespace strata::detail::net {

// Which operations are eager is decided in coll/select.cpp from descriptor fields only:
// ranks that decide differently also publish different descriptors, and the first round
// reports that as the mismatch it is.
Result<Eager> eager_plan(const NetExec& x) {
  const Op& op = x.op;
  const int n = x.c.size, me = x.c.rank, root = op.root;
  const size_t b = op.count * x.esz;
  if (b > kEagerBytes) return internal_error("eager_plan: " + std::to_string(b) + " bytes per peer is not eager");
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
      case OpKind::ReduceScatter:
        // Block r goes to rank r; the blocks for this rank are combined on arrival.
        to(r, x.in + r * b);
        p.from_bytes[r] = b;
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
      default: return internal_error(std::string("eager_plan: ") + coll::to_string(op.kind) + " has no eager form");
    }
  }
  return p;
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
  // In rank order on every rank that reduces: bit-identical results everywhere. This rank's
  // own part starts `own` bytes into its input (reduce_scatter: its block, which in place is
  // the output, each element read before it is written).
  auto reduce_all = [&](size_t own) {
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) srcs[r] = r == me ? static_cast<const void*>(x.in + own) : x.eager_in[r];
    kernels::reduce(op.dtype, op.rop, x.out, srcs.data(), n, op.count, n);
  };
  switch (op.kind) {
    case OpKind::AllReduce: reduce_all(0); break;
    case OpKind::ReduceScatter: reduce_all(static_cast<size_t>(me) * b); break;
    case OpKind::Reduce:
      if (me == root) reduce_all(0);
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

}  // namespace strata::detail::net

// The one-shot family of all_reduce: every rank reads every rank's whole input and reduces
// it, in rank order, so that all ranks get bit-identical results after one synchronisation.
// Inline is its smallest form: the input itself travels in the control block.

#include <cstring>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

/// Small all_reduce: the input is copied into this rank's slot next to the descriptor, one
/// arrival publishes both, and every rank reduces the peers' slots in rank order. Nothing
/// else: nobody reads the caller's buffers, so no closing synchronisation is needed.
Status all_reduce_inline(CommImpl& c, const Op& op, Deadline deadline) {
  const int n = c.size;
  const size_t bytes = op.count * dtype_size(op.dtype);
  const OpDesc d = next_desc(c, op, coll::Algo::Inline);
  OpSlot& mine = c.self.hdr()->slot(c.seq);
  if (bytes) std::memcpy(mine.data, op.in, bytes);
  mine.desc = d;
  STRATA_RETURN_IF_ERROR(c.sync(deadline, "all_reduce"));
  STRATA_RETURN_IF_ERROR(check_descriptors(c, op, d).with_context("all_reduce: "));
  Srcs srcs(n);
  for (int r = 0; r < n; ++r) srcs[r] = c.peers[r].hdr()->slot(c.seq).data;
  kernels::reduce(op.dtype, op.rop, op.out, srcs.data(), n, op.count, n);
  c.direct_bytes.fetch_add(bytes * static_cast<size_t>(n - 1), std::memory_order_relaxed);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

Status all_reduce_one_shot(Exec& x, void* tmp) {
  const int n = x.c.size;
  const size_t count = x.op.count, e = x.esz;
  Srcs srcs(n);
  // Every rank reduces in rank order, so all ranks get bit-identical floating results.
  for (int r = 0; r < n; ++r) {
    STRATA_ASSIGN_OR_RETURN(char* p, x.peer_in(r, 0, count * e));
    srcs[r] = p;
  }
  // In place, peers still read our buffer: reduce into a temporary, write after they finish.
  char* dst = x.in == x.out ? static_cast<char*>(tmp) : x.out;
  kernels::reduce(x.op.dtype, x.op.rop, dst, srcs.data(), n, count, divisor(x));
  STRATA_RETURN_IF_ERROR(x.sync("all_reduce"));
  if (dst != x.out) {
    kernels::copy(x.out, dst, count * e);
    x.c.temp_bytes.fetch_add(count * e, std::memory_order_relaxed);
  }
  return Status::ok();
}

}  // namespace strata::detail::shm

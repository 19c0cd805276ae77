// The one-shot family of all_reduce: every rank reads every rank's whole input and reduces
// it, in rank order, so that all ranks get bit-identical results after one synchronisation.
// Its smallest form, the input in the control block, is in inline.cpp.

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

Status all_reduce_one_shot(Exec& x, void* tmp) {
  const int n = x.c.size;
  const size_t count = x.op.count, e = x.esz;
  Srcs srcs(n);
  // Every rank reduces in rank order, so all ranks get bit-identical floating results.
  for (int r = 0; r < n; ++r) {
    STRATA_ASSIGN_OR_RETURN(char* p, x.peer_in(r, 0, count * e));
    srcs[r] = p;
  }
  // In place, peers still read our buffer (unless it rides in our slot, and run() then gives
  // no temporary): reduce into the temporary, write after they finish.
  char* dst = tmp ? static_cast<char*>(tmp) : x.out;
  kernels::reduce(x.op.dtype, x.op.rop, dst, srcs.data(), n, count, divisor(x));
  STRATA_RETURN_IF_ERROR(x.close());
  if (dst != x.out) {
    kernels::copy(x.out, dst, count * e);
    x.c.temp_bytes.fetch_add(count * e, std::memory_order_relaxed);
  }
  return Status::ok();
}

}  // namespace strata::detail::shm

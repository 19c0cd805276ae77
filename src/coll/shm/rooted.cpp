// The rooted collectives within a host: reduce (each rank reduces its slice of every input
// into the root's output), broadcast and scatter (each rank copies from the root), gather
// (each rank pushes its block into the root's output).

#include <vector>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

Status reduce(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  auto [lo, hi] = slice(x.op.count, n, me, e);
  if (hi > lo) {
    if (x.cma(x.op.root, OpDesc::kOutCma)) {
      // The root's output is external memory reached by CMA: reduce here, write once.
      std::vector<char> part((hi - lo) * e);
      STRATA_RETURN_IF_ERROR(reduce_range(x, part.data(), lo, hi));
      STRATA_RETURN_IF_ERROR(x.copy_to_out(x.op.root, lo * e, part.data(), part.size()));
    } else {
      STRATA_ASSIGN_OR_RETURN(char* dst, x.peer_out(x.op.root, lo * e, (hi - lo) * e));
      STRATA_RETURN_IF_ERROR(reduce_range(x, dst, lo, hi));
    }
  }
  return x.close(true);
}

Status broadcast(Exec& x) {
  const size_t bytes = x.op.count * x.esz;
  if (bytes) {
    STRATA_RETURN_IF_ERROR(x.copy_from(x.op.root, false, 0, x.out, bytes));
  }
  return x.close();
}

Status gather(Exec& x) {
  const size_t bytes = x.op.count * x.esz;
  if (bytes) {
    // Push: every rank writes its block straight into the root's output.
    STRATA_RETURN_IF_ERROR(x.copy_to_out(x.op.root, x.c.rank * bytes, x.in, bytes));
  }
  return x.close(true);
}

Status scatter(Exec& x) {
  const size_t bytes = x.op.count * x.esz;
  if (bytes) {
    STRATA_RETURN_IF_ERROR(x.copy_from(x.op.root, false, x.c.rank * bytes, x.out, bytes));
  }
  return x.close();
}

}  // namespace strata::detail::shm

// The reduction over every rank's input that the shared-memory algorithms build on.

#include <algorithm>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

namespace {
// CMA reads that feed a reduction land in chunks of this size (fits in L2 with its peers').
constexpr size_t kCmaChunkBytes = 256 * 1024;
}  // namespace

/// dst[lo, hi) <- the reduction of every rank's input over [lo, hi) (elements), peers in
/// rank order starting with this rank. Where a peer's input is reachable only by CMA, its
/// bytes land in a per-peer buffer first: that is done in chunks small enough to stay in
/// cache, so the landing copy costs little more than reading a mapped buffer.
Status reduce_range(Exec& x, char* dst, size_t lo, size_t hi, kernels::Stores stores) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  bool any_cma = false;
  for (int r = 0; r < n; ++r) any_cma = any_cma || x.cma(r, OpDesc::kInCma);
  const size_t step = any_cma ? std::max<size_t>(1, kCmaChunkBytes / e) : hi - lo;
  Srcs srcs(n);
  for (size_t a = lo; a < hi; a += step) {
    const size_t b = std::min(hi, a + step);
    for (int k = 0; k < n; ++k) {
      int r = (me + k) % n;
      STRATA_ASSIGN_OR_RETURN(char* p, x.peer_in(r, a * e, (b - a) * e));
      srcs[k] = p;
    }
    kernels::reduce(x.op.dtype, x.op.rop, dst + (a - lo) * e, srcs.data(), n, b - a, divisor(x), stores);
  }
  return Status::ok();
}

}  // namespace strata::detail::shm

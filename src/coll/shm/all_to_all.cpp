// all_to_all and all_to_all_v within a host: each rank copies its block straight out of
// every peer's input into its own output.

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

Status all_to_all(Exec& x, void* tmp) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  const bool v = x.op.kind == OpKind::AllToAllV;
  const size_t out_bytes = v ? coll::max_end(x.op.rcounts, x.op.rdispls) * e : n * x.op.count * e;
  // In place, peers read the blocks we would overwrite: land in a temporary first.
  char* dst = x.out;
  if (x.in == x.out && out_bytes) {
    dst = static_cast<char*>(tmp);
    kernels::copy(dst, x.out, out_bytes);
  }
  // A rank with an external input stages its blocks in rounds (pipe.cpp); the others' are
  // read whole in the first round, and so is this rank's own block.
  const int rounds = pipe_rounds(x);
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < n; ++k) {
      int r = (me + k) % n;
      size_t cnt, src_off, dst_off;
      if (v) {
        const uint64_t* pv = x.c.peers[r].vec();  // peer r's send counts and displacements
        cnt = x.op.rcounts[r];
        src_off = pv[n + me];
        dst_off = x.op.rdispls[r];
      } else {
        cnt = x.op.count;
        src_off = me * x.op.count;
        dst_off = r * x.op.count;
      }
      if (!cnt) continue;
      if (r != me && x.piped(r)) {
        STRATA_RETURN_IF_ERROR(copy_piped(x, r, round, cnt * e, dst + dst_off * e));
      } else if (round == 0) {
        if (r == me && x.piped_src) x.copy(dst + dst_off * e, x.piped_src + src_off * e, cnt * e);
        else STRATA_RETURN_IF_ERROR(x.copy_from(r, false, src_off * e, dst + dst_off * e, cnt * e));
      }
    }
    if (round + 1 < rounds) {
      // Every peer has read our previous round's slot: the barrier below it passed.
      if (x.piped(me)) fill_round(x, round + 1);
      STRATA_RETURN_IF_ERROR(x.sync());
    }
  }
  STRATA_RETURN_IF_ERROR(x.close());
  if (dst != x.out) {
    kernels::copy(x.out, dst, out_bytes);
    x.c.temp_bytes.fetch_add(out_bytes, std::memory_order_relaxed);
  }
  return Status::ok();
}

}  // namespace strata::detail::shm

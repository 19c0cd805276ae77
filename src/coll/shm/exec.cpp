// The reduction over every rank's input that the shared-memory algorithms build on.

#include <algorithm>
#include <bit>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

// The data a rank writes for its peers to read next (two-shot's reduced slice, when the
// call pulls) is written once and read once by another core.
// Whether writing it around the cache is faster depends on where the ranks run, not on the
// size alone: on the 2-vCPU machine of docs/PERFORMANCE.md streaming made 2-rank two-shot
// 1 MiB / 4 MiB 3x faster (91 -> 28 / 357 -> 110 us) on one VM, while on another the same
// change was slower at 4 MiB (the slice was still read from the shared cache). So each
// communicator times its first calls of each slice size both ways and keeps the faster; ranks
// decide alone, as the store mode changes no result.
TimedChoice::TimedChoice(CommImpl::Trials (&trials)[65], size_t bytes, int forced) {
  if (forced >= 0) {
    mode_ = forced;
    return;
  }
  trials_ = &trials[std::bit_width(bytes)];
  if (trials_->chosen >= 0) {
    mode_ = trials_->chosen;
    trials_ = nullptr;
    return;
  }
  // Modes alternate in pairs: a call right after one of the other mode finds the caches
  // holding that mode's buffers, and the first calls of a size pay for faults and growth, so
  // a lone call can be 1.5x its steady time (reduce_scatter of 1 MiB, 2 ranks, staged: 100 us
  // in strict alternation against 70 back to back, which made the slower mode win). Pairs
  // still spread a quiet or a busy moment over both modes, and the best of kTrials keeps the
  // warm second calls.
  mode_ = ((trials_->runs[0] + trials_->runs[1]) / 2) % 2;
  start_ = std::chrono::steady_clock::now();
}

void TimedChoice::done() {
  if (!trials_) return;
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  record(*trials_, mode_, ns);
  trials_ = nullptr;
}

void TimedChoice::record(CommImpl::Trials& t, int mode, int64_t ns) {
  t.best_ns[mode] = std::min(t.best_ns[mode], ns);
  ++t.runs[mode];
  const int64_t fast = std::min(t.best_ns[0], t.best_ns[1]), slow = std::max(t.best_ns[0], t.best_ns[1]);
  const bool all_tried = t.runs[0] >= CommImpl::Trials::kTrials && t.runs[1] >= CommImpl::Trials::kTrials;
  // Long calls, one way clearly slower, are decided once each way has had a warm call: each
  // further trial of the slow way costs a whole call's worth (2 ranks, external, 64 MiB:
  // 10 ms staged against 20 ms by CMA, so 8 trials each cost 80 ms), the noise of this
  // machine is small beside a call of half a millisecond, and it only ever slows a call, so
  // the best of two warm ones does not make a 25% gap. A strata bench of 32-64 MiB times a
  // handful of calls, which otherwise were trials of both ways.
  const bool early = t.runs[0] >= CommImpl::Trials::kEarlyTrials && t.runs[1] >= CommImpl::Trials::kEarlyTrials &&
                     fast >= kEarlyChoiceMinNs && slow - fast > fast / 4;
  if (all_tried || early) t.chosen = t.best_ns[1] < t.best_ns[0] ? 1 : 0;
}

size_t Exec::reduce_step(size_t whole) const {
  for (int r = 0; r < c.size; ++r)
    if (cma(r, OpDesc::kInCma)) return std::max<size_t>(1, kCmaChunkBytes / esz);
  return std::max<size_t>(1, whole);
}

/// dst[lo, hi) <- the reduction of every rank's input over [lo, hi) (elements), peers in
/// rank order starting with this rank. Where a peer's input is reachable only by CMA, its
/// bytes land in a per-peer buffer first: that is done in chunks small enough to stay in
/// cache, so the landing copy costs little more than reading a mapped buffer.
Status reduce_range(Exec& x, char* dst, size_t lo, size_t hi, kernels::Stores stores) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  const size_t step = x.reduce_step(hi - lo);
  stores = kernels::stores_for_whole(stores, (hi - lo) * e);
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

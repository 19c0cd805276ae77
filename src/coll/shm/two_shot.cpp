// The two-shot family: a direct reduce-scatter (rank i reduces slice i reading every peer's
// buffer and writes it once), then a direct all-gather. Slices are balanced and cache-line
// aligned; all_reduce is the two halves in a row.

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

namespace {
// In-place two-shot all_reduce gathers slices of at least this size with streaming stores.
constexpr size_t kUncachedMinBytes = size_t{1} << 20;
// An external output's reduced slice is written in pieces of this size (they stay in L2).
constexpr size_t kSharedPieceBytes = size_t{256} << 10;
}  // namespace

Status all_reduce_two_shot(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t count = x.op.count, e = x.esz;
  // Two-shot: reduce-scatter straight into each rank's own output slice, then all-gather.
  auto [lo, hi] = slice(count, n, me, e);
  if (hi > lo && !x.peer_view_out) {
    STRATA_RETURN_IF_ERROR(reduce_range(x, x.out + lo * e, lo, hi, x.shared_stores));
  } else if (hi > lo) {
    // An external output: the reduced slice goes to the heap scratch peers read and to the
    // output. Piece by piece, so that the copy reads the piece from the cache, not from
    // memory; a slice that leaves the cache anyway is copied out around it (no reads of the
    // output's lines first). 2 ranks, external: 2-16 MiB 9-19% and 32 / 64 MiB 13-22% faster
    // than reducing the whole slice into the scratch and copying it out afterwards.
    const size_t piece = std::max<size_t>(1, kSharedPieceBytes / e);
    for (size_t a = lo; a < hi; a += piece) {
      const size_t b = std::min(hi, a + piece);
      STRATA_RETURN_IF_ERROR(reduce_range(x, x.peer_view_out + a * e, a, b));
      if ((hi - lo) * e >= kernels::kStreamMinBytes)
        kernels::copy_uncached(x.out + a * e, x.peer_view_out + a * e, (b - a) * e);
      else kernels::copy(x.out + a * e, x.peer_view_out + a * e, (b - a) * e);
    }
    x.c.staged_bytes.fetch_add((hi - lo) * e, std::memory_order_relaxed);
  }
  STRATA_RETURN_IF_ERROR(x.sync("all_reduce"));
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    auto [rlo, rhi] = slice(count, n, r, e);
    if (rhi <= rlo) continue;
    const size_t bytes = (rhi - rlo) * e;
    // In place, rank r has just read these lines of our buffer (its input slice): claiming
    // them back one by one costs more than streaming around the cache (measured at 2 ranks:
    // 4 MiB 700 -> 490 us; below 1 MiB slices the cached copy wins).
    const bool uncached = x.in == x.out && bytes >= kUncachedMinBytes;
    STRATA_RETURN_IF_ERROR(x.copy_from(r, true, rlo * e, x.out + rlo * e, bytes, uncached));
  }
  return x.sync("all_reduce");
}

Status reduce_scatter(Exec& x, const std::vector<size_t>& counts) {
  const int me = x.c.rank;
  std::vector<size_t> displ = coll::prefix_sums(counts);
  size_t mine = counts[me];
  // In place, out is our own block of in, which no peer reads: safe to write directly.
  if (mine) STRATA_RETURN_IF_ERROR(reduce_range(x, x.out, displ[me], displ[me] + mine));
  return x.close("reduce_scatter");
}

Status all_gather(Exec& x, const std::vector<size_t>& counts) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  std::vector<size_t> displ = coll::prefix_sums(counts);
  // A rank with an external input stages it in rounds (pipe.cpp); the others' inputs are
  // read whole in the first round.
  const int rounds = pipe_rounds(x);
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < n; ++k) {
      int r = (me + k) % n;
      if (!counts[r]) continue;
      char* dst = x.out + displ[r] * e;
      if (x.piped(r)) {
        STRATA_RETURN_IF_ERROR(copy_piped(x, r, round, counts[r] * e, dst));
      } else if (round == 0) {
        STRATA_RETURN_IF_ERROR(x.copy_from(r, false, 0, dst, counts[r] * e));
      }
    }
    if (round + 1 < rounds) {
      // Every peer has read our previous round's slot: the barrier below it passed.
      if (x.piped(me)) fill_round(x, round + 1);
      STRATA_RETURN_IF_ERROR(x.sync("all_gather"));
    }
  }
  return x.close("all_gather");
}

}  // namespace strata::detail::shm

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
// Pushing, each piece is reduced into a buffer of this size and written to every output.
constexpr size_t kPushPieceBytes = size_t{64} << 10;
// Pushing out of place, outputs are written around the cache from this size (the buffer).
constexpr size_t kPushStreamMinBytes = size_t{32} << 20;

/// Whether every rank's output is its own heap buffer, which peers may write (not a scratch
/// view in front of an external buffer, nor a CMA one). Every rank sees the same descriptors.
bool outputs_writable(const Exec& x) {
  for (int r = 0; r < x.c.size; ++r) {
    const uint32_t f = x.desc(r).flags;
    if (!(f & OpDesc::kHasOut) || (f & (OpDesc::kOutCma | OpDesc::kOutViewOnly))) return false;
  }
  return true;
}

/// Two-shot with the all-gather folded into the reduction: this rank reduces its slice piece
/// by piece into a cached buffer and writes each piece into every rank's output. Memory sees
/// each input byte read once and each output byte written once (the pulling form reads the
/// reduced slices a second time), and one synchronisation goes. In place this is safe: the
/// bytes of slice i that this rank writes into rank r's buffer are read by no one but this
/// rank, and it has read them for this piece already.
Status all_reduce_push(Exec& x, size_t lo, size_t hi) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  // In place, the lines written are the ones just read for this piece, in this core's cache:
  // cached stores find them there (streaming was 0.8x at 16-256 MiB, 2 ranks). Out of place,
  // streaming wins once the host's buffers outgrow the cache (2 ranks, cached against
  // streamed: 16 MiB 1.36x, 32 MiB 0.93x, 64-256 MiB 0.68-0.75x).
  const int forced = x.c.ctx->env.two_shot_stores;
  const bool uncached = forced >= 0 ? forced == 1 : x.in != x.out && x.op.count * e >= kPushStreamMinBytes;
  const size_t piece = std::max<size_t>(1, kPushPieceBytes / e);
  std::vector<char>& buf = x.c.piece;
  if (buf.size() < piece * e) buf.resize(piece * e);
  std::vector<char*> outs(n);
  for (size_t a = lo; a < hi; a += piece) {
    const size_t b = std::min(hi, a + piece), bytes = (b - a) * e;
    STRATA_RETURN_IF_ERROR(reduce_range(x, buf.data(), a, b));
    for (int k = 0; k < n; ++k) {
      const int r = (me + k) % n;
      STRATA_ASSIGN_OR_RETURN(char* dst, x.peer_out(r, a * e, bytes));
      x.copy(dst, buf.data(), bytes, uncached);
    }
  }
  return Status::ok();
}
}  // namespace

Status all_reduce_two_shot(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t count = x.op.count, e = x.esz;
  // Two-shot: reduce-scatter straight into each rank's own output slice, then all-gather.
  auto [lo, hi] = slice(count, n, me, e);
  // Pushing beat pulling at every size where two-shot runs (2 ranks, heap, 512 KiB-16 MiB:
  // 1.1-1.6x out of place, 1.7-2.5x in place; 4 and 8 ranks 1.2-1.5x), so it is taken wherever
  // every output allows it, unless STRATA_TWO_SHOT_PUSH=pull.
  if (x.c.ctx->env.two_shot_push != 0 && outputs_writable(x)) {
    if (hi > lo) STRATA_RETURN_IF_ERROR(all_reduce_push(x, lo, hi));
    return x.sync("all_reduce");
  }
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

// The two-shot family: a direct reduce-scatter (rank i reduces slice i reading every peer's
// buffer and writes it once), then a direct all-gather. Slices are balanced and cache-line
// aligned; all_reduce is the two halves in a row. Where every rank's output is a heap buffer,
// all_reduce and all_gather push instead: each rank writes its reduced slice or its block
// into every rank's output, so that memory reads each byte once. Where some rank's buffer is
// external, all_reduce runs in rounds: a round's pieces staged for the peers (or read by
// CMA), each reduced piece written into every output (an external one through landing
// slots, or by CMA).

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

namespace {
// In-place two-shot all_reduce gathers slices of at least this size with streaming stores.
constexpr size_t kUncachedMinBytes = size_t{1} << 20;
// Pushing, data goes to the outputs in pieces of this size: each piece is read (or reduced)
// once and written to every output from the cache.
constexpr size_t kPushPieceBytes = size_t{64} << 10;
// Pushing, outputs are written around the cache once the host's buffers (every rank's input
// and output) exceed this: 2 ranks, cached against streamed, all_reduce out of place 16 / 32 /
// 64-256 MiB (64 / 128 / 256-1024 MiB of buffers) 1.36 / 0.93 / 0.68-0.75x, all_gather out of
// place 1-16 / 64-256 MiB (3-48 / 192-768) 1.25-2.6 / 0.64-0.74x, in place 16-64 / 128-256
// MiB (32-128 / 256-512) 0.80-0.91 / 1.08-1.16x.
constexpr size_t kPushStreamMinFootprint = size_t{128} << 20;
// Two-shot all_reduce in rounds (an external buffer somewhere) reduces this much of a slice
// per round with 2 ranks, less with more (each staged piece is one of n - 1), at least
// kRoundMinPieceBytes: the staged and landing pieces of a round stay in the cache.
constexpr size_t kRoundBytes = size_t{256} << 10;
constexpr size_t kRoundMinPieceBytes = size_t{64} << 10;
// all_gather pushes from this output size (below it, 64-256 KiB, pushing was 2-3% slower).
constexpr size_t kGatherPushMinBytes = size_t{1} << 20;

/// Whether this call pushes: every rank's output is its own heap buffer, which peers may
/// write (not landing slots in front of an external buffer, nor a CMA one), and no rank's
/// STRATA_PUSH says pull. Decided from the descriptors alone, which every rank sees alike:
/// a rank that pulled while the others pushed would count different synchronisations.
bool pushes(const Exec& x) {
  for (int r = 0; r < x.c.size; ++r) {
    const uint32_t f = x.desc(r).flags;
    if (!(f & OpDesc::kHasOut) || (f & (OpDesc::kOutCma | OpDesc::kOutLanding | OpDesc::kNoPush))) return false;
  }
  return true;
}

/// Whether pushing writes around the cache when the host's buffers total `footprint` bytes
/// (STRATA_TWO_SHOT_STORES forces either way).
bool push_uncached(const Exec& x, size_t footprint) {
  const int forced = x.c.ctx->env.two_shot_stores;
  return forced >= 0 ? forced == 1 : footprint > kPushStreamMinFootprint;
}

/// Every rank's output at `offset` <- `bytes` of `src` (this rank's), this rank's own first
/// (no copy when `src` is there already).
Status push_piece(Exec& x, const char* src, size_t offset, size_t bytes, bool uncached) {
  for (int k = 0; k < x.c.size; ++k) {
    STRATA_ASSIGN_OR_RETURN(char* dst, x.peer_out((x.c.rank + k) % x.c.size, offset, bytes));
    x.copy(dst, src, bytes, uncached);
  }
  return Status::ok();
}

/// Two-shot with the all-gather folded into the reduction: this rank reduces its slice piece
/// by piece and writes each piece into every rank's output from the cache. Memory sees each
/// input byte read once and each output byte written once (the pulling form reads the
/// reduced slices a second time), and one synchronisation goes. In place this is safe: the
/// bytes of slice i that this rank writes into rank r's buffer are read by no one but this
/// rank, and it has read them for this piece already.
Status all_reduce_push(Exec& x, size_t lo, size_t hi) {
  const size_t e = x.esz;
  // In place, the lines written are the ones just read for this piece, in this core's cache:
  // cached stores find them there (streaming was 0.8x at 16-256 MiB, 2 ranks), so only a
  // forced STRATA_TWO_SHOT_STORES streams then.
  const size_t footprint = x.in == x.out ? 0 : 2 * x.op.count * e * static_cast<size_t>(x.c.size);
  const bool uncached = push_uncached(x, footprint);
  const size_t piece = std::max<size_t>(1, kPushPieceBytes / e);
  std::vector<char>& buf = x.c.piece;
  if (buf.size() < piece * e) buf.resize(piece * e);
  for (size_t a = lo; a < hi; a += piece) {
    const size_t b = std::min(hi, a + piece);
    // With cached stores the piece is reduced straight into this rank's own output and copied
    // to the peers' from there: one pass over it fewer than through a separate buffer (2
    // ranks, heap, out of place 256 KiB / 1 MiB / 16 MiB 1.54 / 1.36 / 1.06x, in place 1.72 /
    // 1.80 / 1.24x). Streamed, the copies would read it back from memory.
    char* dst = uncached ? buf.data() : x.out + a * e;
    STRATA_RETURN_IF_ERROR(reduce_range(x, dst, a, b));
    if (!uncached) x.c.direct_bytes.fetch_add((b - a) * e, std::memory_order_relaxed);  // its own output's
    STRATA_RETURN_IF_ERROR(push_piece(x, dst, a * e, (b - a) * e, uncached));
  }
  return Status::ok();
}

/// Whether two-shot all_reduce runs in rounds: some rank's input or output is external (staged
/// in slots, or reached by CMA).
bool rounds(const Exec& x) {
  for (int r = 0; r < x.c.size; ++r)
    if (x.piped(r) || (x.desc(r).flags & (OpDesc::kOutLanding | OpDesc::kOutCma | OpDesc::kInCma))) return true;
  return false;
}

/// Whether rank r's output is external: reducers leave its pieces in its landing slots.
bool lands(const Exec& x, int r) { return (x.desc(r).flags & OpDesc::kOutLanding) != 0; }

/// Elements [a, b) of slice j that round k of `s` reduces (empty past the slice's end).
std::pair<size_t, size_t> piece_of(const Exec& x, const RoundShape& s, int j, int k) {
  const auto [lo, hi] = slice(x.op.count, x.c.size, j, x.esz);
  const size_t a = lo + std::min(hi - lo, static_cast<size_t>(k) * s.piece);
  return {a, std::min(hi, a + s.piece)};
}

/// Stages round k of this rank's input for its peers (a no-op past the last round).
void fill_rounds_input(Exec& x, const RoundShape& s, int k) {
  if (k >= s.rounds) return;
  const size_t e = x.esz;
  char* slot = x.in + static_cast<size_t>(k % 2) * s.slot;
  for (int j = 0; j < x.c.size; ++j) {
    if (j == x.c.rank) continue;
    const auto [a, b] = piece_of(x, s, j, k);
    if (b <= a) continue;
    kernels::copy(slot + static_cast<size_t>(j) * s.block, x.piped_src + a * e, (b - a) * e);
    x.c.staged_bytes.fetch_add((b - a) * e, std::memory_order_relaxed);
  }
}

/// Two-shot all_reduce where some rank's buffer is external (a buffer peers cannot map), in
/// rounds: round k reduces piece k of every slice. A rank with an external input staged piece
/// k of every peer's slice in its heap slots one round ahead; the reducer reads them there
/// while they are still in the cache, a CMA input by CMA, a heap input where it is. The
/// reduced piece goes to every output from the cache: straight into a heap output, into the
/// landing slots of a rank whose output is external (it copies it out after the round's
/// barrier), or by CMA into an external output so published. Memory then sees each input byte
/// read once and each output byte written once, as in pushing; the staging and landing copies
/// stay in the cache. One barrier per round, and none to close: after the last one no peer
/// reads or writes this rank's buffers, and a peer writes into its slots again only after the
/// next operation's first step.
Status all_reduce_rounds(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t count = x.op.count, e = x.esz;
  const RoundShape s = round_shape(x);
  const char* own = x.piped_src ? x.piped_src : x.in;
  const size_t footprint = own == x.out ? 0 : 2 * count * e * static_cast<size_t>(n);
  const bool uncached = push_uncached(x, footprint);
  std::vector<char>& buf = x.c.piece;
  if (buf.size() < s.piece * e) buf.resize(s.piece * e);
  Srcs srcs(n);
  for (int k = 0; k < s.rounds; ++k) {
    const size_t slot = static_cast<size_t>(k % 2) * s.slot;
    const auto [a, b] = piece_of(x, s, me, k);
    const size_t bytes = (b - a) * e;
    if (bytes) {
      for (int i = 0; i < n; ++i) {
        const int r = (me + i) % n;
        if (r == me) {
          srcs[i] = own + a * e;
          continue;
        }
        STRATA_ASSIGN_OR_RETURN(char* p,
                                x.peer_in(r, x.piped(r) ? slot + static_cast<size_t>(me) * s.block : a * e, bytes));
        srcs[i] = p;
      }
      // Reduced into this rank's own output where stores go through the cache, else into
      // the cached piece buffer: either way the copies below read it from the cache.
      char* piece = uncached ? buf.data() : x.out + a * e;
      kernels::reduce(x.op.dtype, x.op.rop, piece, srcs.data(), n, b - a, divisor(x), kernels::Stores::Auto);
      for (int i = 0; i < n; ++i) {
        const int t = (me + i) % n;
        if (t == me) {
          if (piece == x.out + a * e) x.c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
          else x.copy(x.out + a * e, piece, bytes, uncached);
        } else if (x.cma(t, OpDesc::kOutCma)) {
          STRATA_RETURN_IF_ERROR(x.copy_to_out(t, a * e, piece, bytes));
        } else if (lands(x, t)) {
          // Rank t counts the staging, when it copies the piece out.
          STRATA_ASSIGN_OR_RETURN(char* dst, x.peer_out(t, slot + static_cast<size_t>(me) * s.block, bytes));
          x.copy(dst, piece, bytes);
        } else {
          STRATA_ASSIGN_OR_RETURN(char* dst, x.peer_out(t, a * e, bytes));
          x.copy(dst, piece, bytes, uncached);
        }
      }
    }
    if (x.piped_src) fill_rounds_input(x, s, k + 1);
    STRATA_RETURN_IF_ERROR(x.sync());
    if (!lands(x, me)) continue;
    for (int i = 1; i < n; ++i) {
      const int r = (me + i) % n;
      const auto [ra, rb] = piece_of(x, s, r, k);
      if (rb <= ra) continue;
      const char* landed = x.landing + slot + static_cast<size_t>(r) * s.block;
      if (uncached) kernels::copy_uncached(x.out + ra * e, landed, (rb - ra) * e);
      else kernels::copy(x.out + ra * e, landed, (rb - ra) * e);
      x.c.staged_bytes.fetch_add((rb - ra) * e, std::memory_order_relaxed);
    }
  }
  return Status::ok();
}
}  // namespace

RoundShape round_shape(const Exec& x) {
  const int n = x.c.size;
  const size_t e = x.esz;
  RoundShape s;
  const size_t piece_bytes = std::max(kRoundMinPieceBytes, (kRoundBytes / static_cast<size_t>(n - 1)) & ~size_t{63});
  s.piece = std::max<size_t>(1, piece_bytes / e);
  s.block = (s.piece * e + 63) & ~size_t{63};
  s.slot = s.block * static_cast<size_t>(n);
  size_t largest = 0;
  for (int r = 0; r < n; ++r) {
    const auto [lo, hi] = slice(x.op.count, n, r, e);
    largest = std::max(largest, hi - lo);
  }
  s.rounds = largest ? static_cast<int>((largest + s.piece - 1) / s.piece) : 1;
  return s;
}

Result<char*> stage_rounds_input(Exec& x, const char* src) {
  const RoundShape s = round_shape(x);
  STRATA_ASSIGN_OR_RETURN(void* p, x.c.scratch_block(0, 2 * s.slot));
  x.piped_src = src;
  x.in = static_cast<char*>(p);
  fill_rounds_input(x, s, 0);
  return x.in;
}

Status all_reduce_two_shot(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t count = x.op.count, e = x.esz;
  // Two-shot: reduce-scatter straight into each rank's own output slice, then all-gather.
  auto [lo, hi] = slice(count, n, me, e);
  // Pushing beat pulling at every size where two-shot runs (2 ranks, heap, 512 KiB-16 MiB:
  // 1.1-1.6x out of place, 1.7-2.5x in place; 4 and 8 ranks 1.2-1.5x).
  // An external buffer anywhere: in rounds (its staged pieces are not where pushing reads).
  if (rounds(x)) {
    x.pushed = true;
    return all_reduce_rounds(x);
  }
  if (pushes(x)) {
    x.pushed = true;
    if (hi > lo) STRATA_RETURN_IF_ERROR(all_reduce_push(x, lo, hi));
    return x.close(true);
  }
  if (hi > lo) STRATA_RETURN_IF_ERROR(reduce_range(x, x.out + lo * e, lo, hi, x.shared_stores));
  STRATA_RETURN_IF_ERROR(x.sync());
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
  return x.close(true);
}

Status reduce_scatter(Exec& x, const std::vector<size_t>& counts) {
  const int me = x.c.rank;
  std::vector<size_t> displ = coll::prefix_sums(counts);
  size_t mine = counts[me];
  // In place, out is our own block of in, which no peer reads: safe to write directly.
  if (mine) STRATA_RETURN_IF_ERROR(reduce_range(x, x.out, displ[me], displ[me] + mine));
  return x.close();
}

Status all_gather(Exec& x, const std::vector<size_t>& counts) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  std::vector<size_t> displ = coll::prefix_sums(counts);
  // Pushing, this rank writes its block into every output, reading it once: memory sees 1/n
  // of the reads of pulling (2 ranks, heap: 1-16 MiB 1.2-1.6x, 256 MiB 1.3x). An external input
  // is read where it is (it may have been staged already, before the descriptors were seen).
  const size_t total = (displ[n - 1] + counts[n - 1]) * e;
  if (total >= kGatherPushMinBytes && pushes(x)) {
    x.pushed = true;
    const char* src = x.piped_src ? x.piped_src : x.in;
    const size_t bytes = counts[me] * e, at = displ[me] * e;
    const size_t inputs = x.in == x.out + at ? 0 : total;
    const bool uncached = push_uncached(x, total * static_cast<size_t>(n) + inputs);
    for (size_t a = 0; a < bytes; a += kPushPieceBytes)
      STRATA_RETURN_IF_ERROR(push_piece(x, src + a, at + a, std::min(kPushPieceBytes, bytes - a), uncached));
    return x.close(true);
  }
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
      STRATA_RETURN_IF_ERROR(x.sync());
    }
  }
  return x.close();
}

}  // namespace strata::detail::shm

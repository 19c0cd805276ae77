// An external input that peers must read, staged through the heap in rounds; and
// reduce_scatter(v), which reduces such inputs round by round.
//
// Staging a whole input first and letting peers read it afterwards costs two trips through
// memory for the staged bytes: written to the heap, evicted, read back by the peer. Staged a
// slot at a time (two slots in turn), each round's bytes are still in the cache when the
// peers read them. The price is one barrier step per round, which is why a round stages a
// quarter of a megabyte (128 KiB rounds and 1 MiB rounds were both slower). Measured at
// 2 ranks, external all_gather 4 / 16 MiB: 145 / 718-743 us against 164-178 / 1,256-1,319
// with CMA and 400 / 924 staged whole (docs/SEMANTICS.md); external reduce_scatter 4 MiB,
// each rank reducing round k of its block while the next is staged: 145-158 us against
// 349-380 staged whole.
//
// Which ranks pipe their input differs per rank (external or heap), so everything that
// decides the number of rounds is a function of what every rank knows after the descriptors
// are published: the kind, n, each rank's kInPiped flag and the counts.

#include <algorithm>
#include <atomic>

#include "coll/shm/exec.hpp"
#include "common/cpu_cache.hpp"

namespace strata::detail::shm {
namespace {

// One round stages this much of a rank's input, its blocks together: it stays in L2 with
// what the peers stage beside it.
constexpr size_t kRoundBytes = size_t{256} << 10;
// From this size on a block is staged whole, in one round: kernels::copy streams copies this
// large around the cache, so rounds would save no memory traffic and cost their barriers.
constexpr size_t kWholeMinBytes = size_t{16} << 20;
// reduce_scatter's blocks likewise from 8 MiB, where kernels::copy starts to stream: the
// reducing peer then reads the staged block from memory, which measured as fast as reading
// it round by round from the other core's cache (2 ranks, 16 MiB: 705 against 765 us).
constexpr size_t kWholeReduceMinBytes = size_t{8} << 20;

size_t align64(size_t v) { return (v + 63) & ~size_t{63}; }

bool reduces(OpKind k) { return k == OpKind::ReduceScatter || k == OpKind::ReduceScatterV; }

// The smallest block staged whole. Where one last-level cache serves every CPU of the host,
// a round's bytes are still in it when a peer on any core reads them, whatever the block's
// size, and rounds win at every size: 2 ranks on an Intel Xeon VM (one 480 MiB L3),
// external, staged, 32 / 64 MiB: all_gather 3.2 / 10.1 ms in rounds against 5.6 / 11.9
// whole, all_to_all 3.9 / 10.7 against 5.0 / 12.4, reduce_scatter 16 / 64 MiB 1.5 / 7.4
// against 1.8 / 9.6. The thresholds above (measured on an AMD EPYC VM) stand wherever sysfs
// does not show one cache for every CPU. The answer is the same on every rank of a host: it
// is read from the host's sysfs, not from the process's CPU affinity, and every rank computes
// every rank's rounds.
std::atomic<int> g_shared_llc_override{-1};

size_t whole_min_bytes(OpKind k) {
  const int o = g_shared_llc_override.load(std::memory_order_relaxed);
  if (o < 0 ? last_level_cache().shared : o != 0) return SIZE_MAX;
  return reduces(k) ? kWholeReduceMinBytes : kWholeMinBytes;
}

// all_gather stages one block that every peer reads; the others a block per reader.
bool per_reader(OpKind k) { return k != OpKind::AllGather && k != OpKind::AllGatherV; }

// Elements [lo, hi) of every input that rank j reduces in reduce_scatter(v). The counts of
// reduce_scatter_v agree on every rank: the descriptors were checked.
std::pair<size_t, size_t> reduced_block(const Exec& x, int j) {
  const Op& op = x.op;
  if (op.kind == OpKind::ReduceScatter) return {j * op.count, (j + 1) * op.count};
  size_t lo = 0;
  for (int i = 0; i < j; ++i) lo += op.counts[i];
  return {lo, lo + op.counts[j]};
}

}  // namespace

void override_shared_llc_for_tests(int shared) { g_shared_llc_override.store(shared, std::memory_order_relaxed); }

size_t piped_block(const Exec& x, int r, int j) {
  const Op& op = x.op;
  switch (op.kind) {
    case OpKind::AllGather: return op.count * x.esz;
    case OpKind::AllGatherV: return op.counts[r] * x.esz;
    case OpKind::AllToAll: return r == j ? 0 : op.count * x.esz;
    case OpKind::AllToAllV:
      if (r == j) return 0;
      // This rank's own counts come from its call: pipe_input runs before they are published.
      return (r == x.c.rank ? op.counts[j] : x.c.peers[r].vec()[j]) * x.esz;
    case OpKind::ReduceScatter:
    case OpKind::ReduceScatterV: {
      if (r == j) return 0;  // a rank reduces its own block from its own input
      auto [lo, hi] = reduced_block(x, j);
      return (hi - lo) * x.esz;
    }
    default: return 0;
  }
}

namespace {

size_t piped_largest(const Exec& x, int r) {
  if (!per_reader(x.op.kind)) return piped_block(x, r, 0);  // all_gather: the one block
  size_t m = 0;
  for (int j = 0; j < x.c.size; ++j) {
    // A reduction's rounds must line up on every rank, so its own block counts too.
    if (reduces(x.op.kind)) {
      const auto [lo, hi] = reduced_block(x, j);
      m = std::max(m, (hi - lo) * x.esz);
    } else {
      m = std::max(m, piped_block(x, r, j));
    }
  }
  return m;
}

}  // namespace

size_t own_displ(const Exec& x, int j) {
  switch (x.op.kind) {
    case OpKind::AllToAll: return j * x.op.count * x.esz;
    case OpKind::AllToAllV: return x.op.sdispls[j] * x.esz;
    case OpKind::ReduceScatter:
    case OpKind::ReduceScatterV: return reduced_block(x, j).first * x.esz;
    default: return 0;
  }
}

PipeShape pipe_shape(const Exec& x, int r) {
  const int n = x.c.size;
  const bool each = per_reader(x.op.kind);
  const size_t largest = piped_largest(x, r);
  PipeShape s;
  // all_gather: one block (the whole input) read by every peer; all_to_all: one per peer.
  // At least 64 KiB per block and round, so that many ranks do not mean many barriers.
  s.chunk = std::max<size_t>(size_t{64} << 10, (kRoundBytes / static_cast<size_t>(each ? n - 1 : 1)) & ~size_t{63});
  if (largest >= whole_min_bytes(x.op.kind)) {
    // One round, the blocks packed one after the other: a slot of n times the largest block
    // could be far more than the input (all_to_all_v with uneven counts).
    s.chunk = align64(largest);
    s.packed = true;
    s.slot = 0;
    for (int j = 0; j < (each ? n : 1); ++j) s.slot += align64(piped_block(x, r, j));
  } else {
    s.stride = std::min(s.chunk, align64(largest));
    s.slot = s.stride * static_cast<size_t>(each ? n : 1);
  }
  s.rounds = largest == 0 ? 1 : static_cast<int>((largest + s.chunk - 1) / s.chunk);
  return s;
}

namespace {

// Where block j lies in rank r's slot.
size_t block_at(const Exec& x, int r, int j, const PipeShape& s) {
  if (!per_reader(x.op.kind)) return 0;
  if (!s.packed) return static_cast<size_t>(j) * s.stride;
  size_t at = 0;
  for (int i = 0; i < j; ++i) at += align64(piped_block(x, r, i));
  return at;
}

}  // namespace

int pipe_rounds(const Exec& x) {
  int rounds = 1;
  for (int r = 0; r < x.c.size; ++r)
    if (x.piped(r)) rounds = std::max(rounds, pipe_shape(x, r).rounds);
  return rounds;
}

Result<char*> pipe_input(Exec& x, const char* src) {
  const PipeShape s = pipe_shape(x, x.c.rank);
  STRATA_ASSIGN_OR_RETURN(void* p, x.c.scratch_block(0, std::max<size_t>(64, s.rounds > 1 ? 2 * s.slot : s.slot)));
  x.piped_src = src;
  x.in = static_cast<char*>(p);
  fill_round(x, 0);
  return x.in;
}

void fill_round(Exec& x, int k) {
  const int n = x.c.size, me = x.c.rank;
  const PipeShape s = pipe_shape(x, me);
  if (k >= s.rounds) return;
  char* slot = x.in + static_cast<size_t>(k % 2) * s.slot;
  const size_t lo = static_cast<size_t>(k) * s.chunk;
  // all_gather stages one block, read by everyone; all_to_all the block of each peer j.
  const bool gather = !per_reader(x.op.kind);
  for (int j = 0; j < (gather ? 1 : n); ++j) {
    const size_t b = piped_block(x, me, j);
    if (lo >= b) continue;
    const size_t len = std::min(s.chunk, b - lo);
    kernels::copy(slot + block_at(x, me, j, s), x.piped_src + own_displ(x, j) + lo, len);
    x.c.staged_bytes.fetch_add(len, std::memory_order_relaxed);
  }
}

Status copy_piped(Exec& x, int r, int k, size_t bytes, char* dst) {
  const PipeShape s = pipe_shape(x, r);
  const size_t lo = static_cast<size_t>(k) * s.chunk;
  if (lo >= bytes) return Status::ok();
  const size_t at = static_cast<size_t>(k % 2) * s.slot + block_at(x, r, x.c.rank, s);
  return x.copy_from(r, false, at, dst + lo, std::min(s.chunk, bytes - lo));
}

bool any_piped(const Exec& x) {
  for (int r = 0; r < x.c.size; ++r)
    if (x.piped(r)) return true;
  return false;
}

// Round k reduces chunk k of this rank's block from every input: its own, each piped peer's
// slot (filled one round ahead), each other peer's buffer. The slot round k is read from is
// refilled, with round k + 2, at the end of round k + 1: after the barrier that ends round k,
// which every reader passes only once it has reduced round k.
Status reduce_scatter_piped(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  const PipeShape mine = pipe_shape(x, me);
  const size_t ce = mine.chunk / e;  // the same on every rank, and so are the rounds
  // Where each piped peer's slots hold the chunks of this rank's block.
  std::vector<size_t> slot(n), at(n);
  for (int r = 0; r < n; ++r) {
    if (r == me || !x.piped(r)) continue;
    const PipeShape s = pipe_shape(x, r);
    slot[r] = s.slot;
    at[r] = block_at(x, r, me, s);
  }
  const auto [lo, hi] = reduced_block(x, me);
  const char* own = x.piped_src ? x.piped_src : x.in;
  const size_t step = x.reduce_step(ce);
  const kernels::Stores stores = kernels::stores_for_whole(kernels::Stores::Auto, (hi - lo) * e);
  Srcs srcs(n);
  for (int k = 0; k < mine.rounds; ++k) {
    const size_t a = lo + std::min(hi - lo, static_cast<size_t>(k) * ce), b = std::min(hi, a + ce);
    // A round can be a whole block of 8 MiB and more: a CMA peer's is read in pieces.
    for (size_t s = a; s < b; s += step) {
      const size_t t = std::min(b, s + step);
      for (int i = 0; i < n; ++i) {
        const int r = (me + i) % n;
        if (r == me) {
          srcs[i] = own + s * e;
          continue;
        }
        const size_t off = x.piped(r) ? static_cast<size_t>(k % 2) * slot[r] + at[r] + (s - a) * e : s * e;
        STRATA_ASSIGN_OR_RETURN(char* p, x.peer_in(r, off, (t - s) * e));
        srcs[i] = p;
      }
      kernels::reduce(x.op.dtype, x.op.rop, x.out + (s - lo) * e, srcs.data(), n, t - s, divisor(x), stores);
    }
    if (x.piped_src) fill_round(x, k + 1);
    STRATA_RETURN_IF_ERROR(x.sync());
  }
  return Status::ok();
}

}  // namespace strata::detail::shm

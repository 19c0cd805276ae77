// The two-shot family: a direct reduce-scatter (rank i reduces slice i reading every peer's
// buffer and writes it once), then a direct all-gather. Slices are balanced and cache-line
// aligned; all_reduce is the two halves in a row.

#include <algorithm>
#include <bit>
#include <chrono>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

namespace {
// In-place two-shot all_reduce gathers slices of at least this size with streaming stores.
constexpr size_t kUncachedMinBytes = size_t{1} << 20;
}  // namespace

namespace {

// The reduced slice is written once and then read by every peer. Whether writing it around
// the cache is faster depends on where the ranks run, not on the size alone: on the 2-vCPU
// machine of docs/PERFORMANCE.md streaming made 2-rank two-shot 1 MiB / 4 MiB 3x faster
// (91 -> 28 / 357 -> 110 us) on one VM, while on another the same change was slower at 4 MiB
// (the slice was still read from the shared cache). So each communicator times its first calls
// of each slice size both ways and keeps the faster; ranks decide alone, as the store mode
// changes no result.
class StoreChoice {
 public:
  StoreChoice(CommImpl& c, size_t slice_bytes) {
    const int forced = c.ctx->env.two_shot_stores;
    if (forced >= 0) {
      mode_ = forced;
      return;
    }
    trials_ = &c.two_shot_stores[std::bit_width(slice_bytes)];
    if (trials_->chosen >= 0) {
      mode_ = trials_->chosen;
      trials_ = nullptr;
      return;
    }
    // Alternate, so that a quiet or a busy moment does not favour one mode.
    mode_ = trials_->runs[0] <= trials_->runs[1] ? 0 : 1;
    start_ = std::chrono::steady_clock::now();
  }
  kernels::Stores stores() const { return mode_ == 1 ? kernels::Stores::Streamed : kernels::Stores::Auto; }
  /// Records the time of a call that completed.
  void done() {
    if (!trials_) return;
    const int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
    CommImpl::StoreTrials& t = *trials_;
    t.best_ns[mode_] = std::min(t.best_ns[mode_], ns);
    if (++t.runs[mode_] >= CommImpl::StoreTrials::kTrials && t.runs[1 - mode_] >= CommImpl::StoreTrials::kTrials)
      t.chosen = t.best_ns[1] < t.best_ns[0] ? 1 : 0;
  }

 private:
  int mode_ = 0;
  CommImpl::StoreTrials* trials_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Status all_reduce_two_shot(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t count = x.op.count, e = x.esz;
  // Two-shot: reduce-scatter straight into each rank's own output slice, then all-gather.
  auto [lo, hi] = slice(count, n, me, e);
  StoreChoice choice(x.c, (hi - lo) * e);
  if (hi > lo) {
    char* shared = x.peer_view_out ? x.peer_view_out : x.out;
    STRATA_RETURN_IF_ERROR(reduce_range(x, shared + lo * e, lo, hi, choice.stores()));
    if (x.peer_view_out) {
      kernels::copy(x.out + lo * e, shared + lo * e, (hi - lo) * e);
      x.c.staged_bytes.fetch_add((hi - lo) * e, std::memory_order_relaxed);
    }
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
  STRATA_RETURN_IF_ERROR(x.sync("all_reduce"));
  choice.done();
  return Status::ok();
}

Status reduce_scatter(Exec& x, const std::vector<size_t>& counts) {
  const int me = x.c.rank;
  std::vector<size_t> displ = coll::prefix_sums(counts);
  size_t mine = counts[me];
  // In place, out is our own block of in, which no peer reads: safe to write directly.
  if (mine) STRATA_RETURN_IF_ERROR(reduce_range(x, x.out, displ[me], displ[me] + mine));
  return x.sync("reduce_scatter");
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
  return x.sync("all_gather");
}

}  // namespace strata::detail::shm

#pragma once
// The method of `strata bench`, shared with its Open MPI peer (bench/peers/mpi_bench.cpp) so
// both sides of every ratio are measured the same way: the sizes of a sweep and the timing
// loop (nccl-tests' "time a loop, divide", with the median over repeats).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

#include "cli/bench_args.hpp"

namespace strata::bench {

/// One size of a sweep.
struct SizePoint {
  size_t bytes;  // what the row reports (nccl-tests: total for the total-size collectives)
  size_t count;  // elements in `bytes`
  size_t c;      // count the call takes (per-rank block for the total-size collectives)
};

/// The sizes from -b to -e by -f for `n` ranks; sizes that round to the same call are one.
std::vector<SizePoint> sizes(const Options& o, int n);

/// The time of one size.
struct Timing {
  int iters = 0;
  std::vector<double> seconds;  // per repeat: loop time / iters, the slowest rank's
  double median = 0, min = 0, max = 0;
};

/// The median of `v` (0 for none).
double median_of(std::vector<double> v);

/// The method, shared by strata bench and the MPI peer: `warmup` untimed calls; one timed call
/// sizes the loop (unless --iters); then `repeats` times: barrier, time `iters` back-to-back
/// calls, divide. max_all(v, k) replaces v[0..k) by the maximum over ranks.
template <class Op, class Barrier, class MaxAll>
Timing measure(const Options& o, Op&& op, Barrier&& barrier, MaxAll&& max_all) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < o.warmup; ++i) op();
  Timing t;
  t.iters = o.iters;
  if (t.iters <= 0) {
    barrier();
    auto t0 = Clock::now();
    op();
    double one = std::chrono::duration<double>(Clock::now() - t0).count();
    max_all(&one, 1);
    double want = o.target_ms * 1e-3 / std::max(one, 1e-9);
    t.iters = static_cast<int>(std::clamp(std::ceil(want), 1.0, static_cast<double>(o.max_iters)));
  }
  t.seconds.assign(static_cast<size_t>(o.repeats), 0.0);
  for (int r = 0; r < o.repeats; ++r) {
    barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < t.iters; ++i) op();
    t.seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - t0).count() / t.iters;
  }
  max_all(t.seconds.data(), o.repeats);
  t.median = median_of(t.seconds);
  t.min = *std::min_element(t.seconds.begin(), t.seconds.end());
  t.max = *std::max_element(t.seconds.begin(), t.seconds.end());
  return t;
}

}  // namespace strata::bench

#pragma once
// Arithmetic on the count/displacement arrays of the v-collectives, shared by the
// collectives and the bindings that size buffers for them.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace strata::coll {

/// Displacements of blocks packed in order: d[0] = 0, d[i] = c[0] + ... + c[i-1].
inline std::vector<size_t> prefix_sums(const std::vector<size_t>& c) {
  std::vector<size_t> d(c.size(), 0);
  for (size_t i = 1; i < c.size(); ++i) d[i] = d[i - 1] + c[i - 1];
  return d;
}

/// Elements a buffer needs to hold every non-empty block [displs[i], displs[i] + counts[i]).
inline size_t max_end(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t m = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i]) m = std::max(m, displs[i] + counts[i]);
  return m;
}

/// Balanced, cache-line aligned slice `i` of `count` elements of `esz` bytes over `n` parts:
/// [first, second). Later slices may be shorter or empty.
inline std::pair<size_t, size_t> balanced_slice(size_t count, int n, int i, size_t esz) {
  size_t per_line = std::max<size_t>(1, 64 / esz);
  size_t chunk = (count + n - 1) / n;
  chunk = (chunk + per_line - 1) / per_line * per_line;
  size_t lo = std::min(count, chunk * i);
  size_t hi = std::min(count, lo + chunk);
  return {lo, hi};
}

}  // namespace strata::coll

#include "cli/bench_sweep.hpp"

namespace strata::bench {

std::vector<SizePoint> sizes(const Options& o, int n) {
  std::vector<SizePoint> out;
  size_t es = info(o.dtype).size;
  if (o.coll == Coll::Barrier) return {{0, 0, 0}};
  double s = static_cast<double>(o.min_bytes);
  while (s <= static_cast<double>(o.max_bytes) + 0.5) {
    size_t b = static_cast<size_t>(s);
    size_t c = info(o.coll).total_size ? std::max<size_t>(1, b / (es * n)) : std::max<size_t>(1, b / es);
    size_t count = info(o.coll).total_size ? c * n : c;
    if (out.empty() || out.back().c != c) out.push_back({count * es, count, c});
    s *= o.factor;
  }
  return out;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace strata::bench

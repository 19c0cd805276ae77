#pragma once
// What `strata bench moe` and its Open MPI peer (bench/peers/mpi_moe_bench.cpp) share, so both
// sides of every ratio are measured the same way: the cases, the routing and payloads (the same
// bits on both sides), the timing loop's statistics, the check of the result, the output rows.
// Header-only and free of libstrata symbols: the MPI peer does not link the library.
//
// Method: per iteration, barrier; dispatch; barrier; combine; barrier. Each phase's time is the
// slowest rank's (max over ranks), the figure is the median over the timed iterations, after
// warm-up iterations that touch every page once (MEASURED.md: first touch is what costs here).
// Bandwidth counts hidden x element size per selection (token, expert), as DeepEP does, per rank.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace strata::bench::moe {

struct Case {
  std::string phase;  // "prefill" or "decode"
  size_t tokens = 0;  // per rank
  size_t hidden = 0;
  int topk = 8;
  int experts = 64;
  size_t max_tokens = 0;  // the layer's M
  int warmup = 0, iters = 0;
};

/// Prefill: 4096 tokens/rank x hidden 4096; decode: 1, 32, 128 tokens/rank x hidden 7168;
/// top-8 of 64 experts, bfloat16. `quick` shrinks the iteration counts only.
inline std::vector<Case> cases(bool quick) {
  std::vector<Case> v;
  v.push_back({"prefill", 4096, 4096, 8, 64, 4096, quick ? 1 : 2, quick ? 3 : 9});
  for (size_t t : {1, 32, 128}) v.push_back({"decode", t, 7168, 8, 64, 128, quick ? 5 : 20, quick ? 20 : 100});
  return v;
}

inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf2f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// One rank's tokens: x [T][H] bfloat16, topk_idx [T][K] (K distinct experts, uniform),
/// topk_w [T][K] (positive, summing to 1 per token). Deterministic per (rank, case).
struct Inputs {
  std::vector<uint16_t> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
};

inline Inputs make_inputs(const Case& c, int rank) {
  uint64_t s = 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(rank) * 0x100000001b3ull) ^ (c.tokens << 20) ^ c.hidden;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  auto unit = [&] { return static_cast<float>(next() >> 40) / static_cast<float>(1 << 24); };
  Inputs in;
  in.x.resize(c.tokens * c.hidden);
  for (auto& v : in.x) v = f2bf(unit() * 2.0f - 1.0f);
  in.idx.resize(c.tokens * c.topk);
  in.w.resize(c.tokens * c.topk);
  std::vector<int64_t> perm(c.experts);
  for (size_t t = 0; t < c.tokens; ++t) {
    for (int e = 0; e < c.experts; ++e) perm[e] = e;
    float sum = 0;
    for (int k = 0; k < c.topk; ++k) {
      size_t j = k + next() % (c.experts - k);
      std::swap(perm[k], perm[j]);
      in.idx[t * c.topk + k] = perm[k];
      in.w[t * c.topk + k] = 0.1f + unit();
      sum += in.w[t * c.topk + k];
    }
    for (int k = 0; k < c.topk; ++k) in.w[t * c.topk + k] /= sum;
  }
  return in;
}

/// With identity experts, out[t] = x[t] * sum(w[t]) (= x[t]); checks a sample of entries.
inline bool check_identity(const Case& c, const Inputs& in, const uint16_t* out, std::string& why) {
  for (size_t t = 0; t < c.tokens; t += 1 + c.tokens / 64)
    for (size_t h = 0; h < c.hidden; h += 97) {
      float sw = 0;
      for (int k = 0; k < c.topk; ++k)
        if (in.idx[t * c.topk + k] >= 0) sw += in.w[t * c.topk + k];
      float want = bf2f(in.x[t * c.hidden + h]) * sw, got = bf2f(out[t * c.hidden + h]);
      if (std::fabs(got - want) > 0.02f * (std::fabs(want) + 0.05f)) {
        char b[160];
        std::snprintf(b, sizeof b, "token %zu h %zu: got %g, want %g", t, h, got, want);
        why = b;
        return false;
      }
    }
  return true;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// GB/s for `bytes` in `us` microseconds.
inline double gbs(double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0; }

inline std::string table_header() {
  char b[256];
  std::snprintf(b, sizeof b, "# %-8s %3s %7s %6s  %-16s %12s %12s %12s %9s %9s\n", "phase", "R", "tokens", "hidden",
                "method", "dispatch_us", "combine_us", "total_us", "disp_GB/s", "comb_GB/s");
  return b;
}

/// One result as a table row and as a JSON object (one line).
inline void format_row(const Case& c, int R, const std::string& method, double d_us, double c_us, std::string& row,
                       std::string& json) {
  const double bytes = static_cast<double>(c.tokens) * c.topk * c.hidden * 2;
  char b[512];
  std::snprintf(b, sizeof b, "  %-8s %3d %7zu %6zu  %-16s %12.1f %12.1f %12.1f %9.2f %9.2f\n", c.phase.c_str(), R,
                c.tokens, c.hidden, method.c_str(), d_us, c_us, d_us + c_us, gbs(bytes, d_us), gbs(bytes, c_us));
  row = b;
  std::snprintf(b, sizeof b,
                "{\"phase\": \"%s\", \"ranks\": %d, \"tokens\": %zu, \"hidden\": %zu, \"topk\": %d, \"experts\": %d, "
                "\"dtype\": \"bfloat16\", \"method\": \"%s\", \"dispatch_us\": %.3f, \"combine_us\": %.3f, "
                "\"dispatch_gbs\": %.4f, \"combine_gbs\": %.4f}\n",
                c.phase.c_str(), R, c.tokens, c.hidden, c.topk, c.experts, method.c_str(), d_us, c_us, gbs(bytes, d_us),
                gbs(bytes, c_us));
  json = b;
}

}  // namespace strata::bench::moe

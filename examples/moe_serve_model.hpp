#pragma once
// The model, request stream, options and statistics of examples/moe_serve.cpp, shared with its
// Open MPI peer bench/peers/mpi_moe_serve.cpp so both serve the same tokens through the same
// layers and report the same way. Header-only and free of libstrata symbols (the peer does not
// link the library); both targets build it with -O3 -ffp-contract=off so the arithmetic, and so
// the output bits, are the same on both sides.
//
// Model: L layers, each h += MoE(rmsnorm(h)) with
//   router   logits = x · Wr ([H][E]), softmax, top-k, weights renormalised over the k;
//   expert e y = relu(x · W1[e]) · W2[e] ([H][F], [F][H]), one bfloat16 row in, one out;
//   combine  out[t] = bf16(sum over k, in order, of w[t][k] * y[t][k]) in float32 —
//            what strata::moe::Buffer::combine computes, so a path that moves the rows right
//            gives the same bits whatever its schedule.
// Weights are synthetic, seeded per (layer, expert): a rank builds only its own experts.
// Each expert's output row depends only on its input row, so the row order a path delivers
// does not change the result.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace moe_serve {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// bfloat16 with round-to-nearest-even and quiet NaNs, bit for bit the library's conversion.
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

/// splitmix64: the synthetic weights and tokens, the same on every rank and in every build.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Uniform in [-1, 1) from a seed and an index.
inline float unit(uint64_t seed, uint64_t i) {
  return static_cast<float>(mix(seed * 0x100000001b3ull + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

struct Options {
  int layers = 4;
  size_t hidden = 256, ffn = 256;
  int experts = 8, topk = 2;
  size_t prompt = 64;        ///< prefill tokens per rank per request
  int decode_steps = 16;     ///< decode steps per request
  size_t decode_tokens = 4;  ///< tokens per rank per decode step
  int requests = 12, warmup = 1;
  std::string path = "all";  ///< moe_serve: strata | relay | all
  std::string json;          ///< append one JSON object per path to this file
  bool check = false;        ///< also compare with a single-process reference
  std::string expect;        ///< fail unless every path's checksum is this one (across hosts: k-order paths)
};

inline const char* kOptionsHelp =
    "  --layers N          MoE layers (4)\n"
    "  --hidden H          token row width (256)\n"
    "  --ffn F             expert inner width (256)\n"
    "  --experts E         experts in all, a multiple of the rank count (8)\n"
    "  --topk K            experts per token (2)\n"
    "  --prompt P          prefill tokens per rank per request (64)\n"
    "  --decode-steps D    decode steps per request (16)\n"
    "  --decode-tokens T   tokens per rank per decode step (4)\n"
    "  --requests N        timed requests (12)\n"
    "  --warmup N          untimed requests first (1)\n"
    "  --json FILE         append one JSON object per path to FILE\n"
    "  --check             also check every output against a single-process reference\n"
    "  --expect HEX        exit non-zero unless every path's checksum is HEX (across hosts: relay's;\n"
    "                      strata's sums per host there, checked by --check)\n";

/// Parses the options shared by both programs (and --path where `with_path`); on an error
/// returns false with `err` naming the option.
inline bool parse_options(int argc, char** argv, bool with_path, Options& o, std::string& err) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    if (a == "--check") {
      o.check = true;
      continue;
    }
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (i + 1 < argc) {
      v = argv[++i];
    } else {
      err = a + " needs a value";
      return false;
    }
    auto num = [&](long lo, long hi, long& out) {
      char* end = nullptr;
      out = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || out < lo || out > hi) {
        err = a + " takes an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'";
        return false;
      }
      return true;
    };
    long n = 0;
    if (a == "--layers") {
      if (!num(1, 1000, n)) return false;
      o.layers = static_cast<int>(n);
    } else if (a == "--hidden") {
      if (!num(1, 1 << 16, n)) return false;
      o.hidden = static_cast<size_t>(n);
    } else if (a == "--ffn") {
      if (!num(1, 1 << 16, n)) return false;
      o.ffn = static_cast<size_t>(n);
    } else if (a == "--experts") {
      if (!num(1, 4096, n)) return false;
      o.experts = static_cast<int>(n);
    } else if (a == "--topk") {
      if (!num(1, 4096, n)) return false;
      o.topk = static_cast<int>(n);
    } else if (a == "--prompt") {
      if (!num(1, 1 << 20, n)) return false;
      o.prompt = static_cast<size_t>(n);
    } else if (a == "--decode-steps") {
      if (!num(0, 1 << 20, n)) return false;
      o.decode_steps = static_cast<int>(n);
    } else if (a == "--decode-tokens") {
      if (!num(1, 1 << 20, n)) return false;
      o.decode_tokens = static_cast<size_t>(n);
    } else if (a == "--requests") {
      if (!num(1, 1 << 20, n)) return false;
      o.requests = static_cast<int>(n);
    } else if (a == "--warmup") {
      if (!num(0, 1 << 20, n)) return false;
      o.warmup = static_cast<int>(n);
    } else if (a == "--json") {
      o.json = v;
    } else if (a == "--expect") {
      o.expect = v;
    } else if (with_path && a == "--path") {
      if (v != "strata" && v != "relay" && v != "all") {
        err = "--path takes strata, relay or all, got '" + v + "'" +
              (v == "openmpi" ? " (the Open MPI path is bench/peers/mpi_moe_serve under mpirun)" : "");
        return false;
      }
      o.path = v;
    } else {
      err = "unknown option '" + a + "'";
      return false;
    }
  }
  if (o.topk > o.experts) {
    err = "--topk " + std::to_string(o.topk) + " exceeds --experts " + std::to_string(o.experts);
    return false;
  }
  if (o.decode_steps > 0 && o.decode_tokens > o.prompt) {
    err = "--decode-tokens " + std::to_string(o.decode_tokens) + " exceeds --prompt " + std::to_string(o.prompt) +
          " (the first decode step takes the last tokens of the prompt)";
    return false;
  }
  return true;
}

/// C[m][n] = A[m][k] · B[k][n], row-major float32. Row i of C depends only on row i of A, and
/// each element sums over k in order, whatever m is: the bits do not depend on the batch.
/// Out of line, as run_expert: compiled on its own, so both programs run the same machine code
/// (inlined, each caller's context made the compiler vectorise it differently: ~1.4x apart).
[[gnu::noinline]] inline void gemm(const float* A, const float* B, float* C, size_t m, size_t k, size_t n) {
  constexpr size_t kb = 128, nb = 512;  // a block of B stays in cache while the rows stream past
  std::fill(C, C + m * n, 0.0f);
  for (size_t k0 = 0; k0 < k; k0 += kb)
    for (size_t n0 = 0; n0 < n; n0 += nb) {
      const size_t k1 = std::min(k, k0 + kb), n1 = std::min(n, n0 + nb);
      for (size_t i = 0; i < m; ++i) {
        float* c = C + i * n;
        for (size_t p = k0; p < k1; ++p) {
          const float a = A[i * k + p];
          const float* b = B + p * n;
          for (size_t j = n0; j < n1; ++j) c[j] += a * b[j];
        }
      }
    }
}

/// The weights of one expert.
struct Expert {
  std::vector<float> w1, w2;  // [H][F], [F][H]
};

/// The model's weights as one rank holds them: every layer's router, and the experts
/// [first, first + count) of every layer.
class Model {
 public:
  Model(const Options& o, int first_expert, int expert_count)
      : o_(o), first_(first_expert), count_(expert_count), router_(o.layers), experts_(o.layers) {
    const size_t H = o.hidden, E = static_cast<size_t>(o.experts);
    const float sr = std::sqrt(3.0f / static_cast<float>(H));
    for (int l = 0; l < o.layers; ++l) {
      router_[l].resize(H * E);
      for (size_t i = 0; i < H * E; ++i) router_[l][i] = sr * unit(1000003ull * l + 17, i);
      experts_[l].resize(count_);
      for (int x = 0; x < count_; ++x) experts_[l][x] = make_expert(l, first_ + x);
    }
  }

  const Options& options() const { return o_; }

  /// Expert `e` of layer `l` seeded by (l, e): the same weights wherever it is built.
  Expert make_expert(int l, int e) const {
    const size_t H = o_.hidden, F = o_.ffn;
    const uint64_t seed = (static_cast<uint64_t>(l) << 32) + static_cast<uint64_t>(e) + 99;
    Expert x;
    x.w1.resize(H * F);
    x.w2.resize(F * H);
    const float s1 = std::sqrt(6.0f / static_cast<float>(H)), s2 = std::sqrt(3.0f / static_cast<float>(F));
    for (size_t i = 0; i < H * F; ++i) x.w1[i] = s1 * unit(2 * seed, i);
    for (size_t i = 0; i < F * H; ++i) x.w2[i] = s2 * unit(2 * seed + 1, i);
    return x;
  }

  /// A local expert (e in [first, first + count)).
  const Expert& expert(int l, int e) const { return experts_[l][e - first_]; }

  /// y = relu(x · W1) · W2 for n bfloat16 rows; in and out may be the same rows.
  [[gnu::noinline]] void run_expert(const Expert& x, const uint16_t* in, uint16_t* out, size_t n) {
    const size_t H = o_.hidden, F = o_.ffn;
    a_.resize(n * H);
    h_.resize(n * F);
    y_.resize(n * H);
    for (size_t i = 0; i < n * H; ++i) a_[i] = bf2f(in[i]);
    gemm(a_.data(), x.w1.data(), h_.data(), n, H, F);
    for (float& v : h_) v = v > 0.0f ? v : 0.0f;
    gemm(h_.data(), x.w2.data(), y_.data(), n, F, H);
    for (size_t i = 0; i < n * H; ++i) out[i] = f2bf(y_[i]);
  }

  /// x ([T][H] bfloat16) = rmsnorm(h) for T float32 rows.
  void rmsnorm(const std::vector<float>& h, size_t T, std::vector<uint16_t>& x) const {
    const size_t H = o_.hidden;
    x.resize(T * H);
    for (size_t t = 0; t < T; ++t) {
      float ss = 0;
      for (size_t i = 0; i < H; ++i) ss += h[t * H + i] * h[t * H + i];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + 1e-6f);
      for (size_t i = 0; i < H; ++i) x[t * H + i] = f2bf(h[t * H + i] * r);
    }
  }

  /// Router of layer l: softmax over experts, top-k (ties to the lower id), weights
  /// renormalised over the chosen k.
  void route(int l, const std::vector<uint16_t>& x, size_t T, std::vector<int64_t>& idx, std::vector<float>& w) {
    const size_t H = o_.hidden, E = static_cast<size_t>(o_.experts), K = static_cast<size_t>(o_.topk);
    a_.resize(T * H);
    for (size_t i = 0; i < T * H; ++i) a_[i] = bf2f(x[i]);
    logits_.resize(T * E);
    gemm(a_.data(), router_[l].data(), logits_.data(), T, H, E);
    idx.resize(T * K);
    w.resize(T * K);
    order_.resize(E);
    for (size_t t = 0; t < T; ++t) {
      float* g = &logits_[t * E];
      const float mx = *std::max_element(g, g + E);
      for (size_t e = 0; e < E; ++e) g[e] = std::exp(g[e] - mx);
      for (size_t e = 0; e < E; ++e) order_[e] = static_cast<int>(e);
      std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(K), order_.end(),
                        [&](int a, int b) { return g[a] > g[b] || (g[a] == g[b] && a < b); });
      float ks = 0;
      for (size_t k = 0; k < K; ++k) ks += g[order_[k]];
      for (size_t k = 0; k < K; ++k) {
        idx[t * K + k] = order_[k];
        w[t * K + k] = g[order_[k]] / ks;
      }
    }
  }

  /// One forward pass of T tokens: h ([T][H] float32) through every layer, in place.
  /// `moe(l, x, T, idx, w, out)` moves the rows to their experts and back: out ([T][H]
  /// bfloat16) = the combined expert outputs, as strata::moe::Buffer::combine defines them.
  template <class MoeFn>
  void forward(std::vector<float>& h, size_t T, MoeFn&& moe) {
    const size_t H = o_.hidden;
    out_.resize(T * H);
    for (int l = 0; l < o_.layers; ++l) {
      rmsnorm(h, T, x_);
      route(l, x_, T, idx_, w_);
      moe(l, x_, T, idx_, w_, out_);
      for (size_t i = 0; i < T * H; ++i) h[i] += bf2f(out_[i]);
    }
  }

  /// Which host each rank is on (hosts numbered by their first rank, as moe::Buffer orders
  /// them) and this rank's host: what the reference needs to sum in a Buffer's order across hosts.
  void set_hosts(std::vector<int> host_of, int mine) {
    host_of_ = std::move(host_of);
    my_host_ = mine;
  }

  /// The MoE of layer l computed in this process with every expert (built on demand): the
  /// reference the distributed paths must match bit for bit. by_host: the order of
  /// moe::Buffer's Prefill/Decode combine across hosts (this host's terms k ascending, then each
  /// other host's partial sum, k ascending and rounded to bfloat16, host ascending); otherwise
  /// k ascending (one host, Relay, Open MPI).
  void reference_moe(int l, const std::vector<uint16_t>& x, size_t T, const std::vector<int64_t>& idx,
                     const std::vector<float>& w, std::vector<uint16_t>& out, bool by_host = false) {
    const size_t H = o_.hidden, K = static_cast<size_t>(o_.topk);
    if (ref_experts_.size() != static_cast<size_t>(o_.layers)) ref_experts_.assign(o_.layers, {});
    auto& ex = ref_experts_[l];
    if (ex.empty())
      for (int e = 0; e < o_.experts; ++e) ex.push_back(make_expert(l, e));
    by_host = by_host && !host_of_.empty();
    const int hosts = by_host ? *std::max_element(host_of_.begin(), host_of_.end()) + 1 : 1;
    auto host_of_expert = [&](int64_t e) { return by_host ? host_of_[e / count_] : my_host_; };
    std::vector<uint16_t> y(H), part_bf(H);
    std::vector<float> acc(H), part(H);
    // acc (or part) += the terms of token t whose expert is on host hh, k ascending; false if none.
    auto terms = [&](size_t t, int hh, float* sum) {
      bool any = false;
      for (size_t k = 0; k < K; ++k) {
        const int64_t e = idx[t * K + k];
        if (e < 0 || host_of_expert(e) != hh) continue;
        run_expert(ex[e], &x[t * H], y.data(), 1);
        accumulate(sum, y.data(), w[t * K + k], H);
        any = true;
      }
      return any;
    };
    for (size_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      terms(t, my_host_, acc.data());
      for (int hh = 0; by_host && hh < hosts; ++hh) {
        if (hh == my_host_) continue;
        std::fill(part.begin(), part.end(), 0.0f);
        if (!terms(t, hh, part.data())) continue;
        for (size_t i = 0; i < H; ++i) part_bf[i] = f2bf(part[i]);
        accumulate(acc.data(), part_bf.data(), 1.0f, H);
      }
      for (size_t i = 0; i < H; ++i) out[t * H + i] = f2bf(acc[i]);
    }
  }

  /// acc += w * row, the loop of the library's combine (src/moe/kernels.cpp).
  static void accumulate(float* __restrict acc, const uint16_t* __restrict row, float w, size_t n) {
    for (size_t i = 0; i < n; ++i) acc[i] += w * bf2f(row[i]);
  }

 private:
  Options o_;
  int first_, count_;
  std::vector<std::vector<float>> router_;
  std::vector<std::vector<Expert>> experts_;
  std::vector<std::vector<Expert>> ref_experts_;
  std::vector<int> host_of_;  // empty: one host
  int my_host_ = 0;
  std::vector<float> a_, h_, y_, logits_;
  std::vector<int> order_;
  std::vector<uint16_t> x_, out_;
  std::vector<int64_t> idx_;
  std::vector<float> w_;
};

/// The request stream of one rank: the prompt of request r (P rows of H), the same for every
/// path; decode steps feed each step's outputs back as the next tokens.
inline void prompt(const Options& o, int rank, int request, std::vector<float>& h) {
  const size_t H = o.hidden;
  h.resize(o.prompt * H);
  const uint64_t seed = 7919ull * static_cast<uint64_t>(request) + 31ull * static_cast<uint64_t>(rank) + 5;
  for (size_t i = 0; i < h.size(); ++i) h[i] = unit(seed << 20, i);
}

/// The next decode step's tokens: the last n output rows of the previous step, scaled to unit
/// RMS (the residual stream would otherwise grow step after step).
inline void next_tokens(const Options& o, const std::vector<float>& out, size_t T, std::vector<float>& next) {
  const size_t H = o.hidden, n = o.decode_tokens;
  next.assign(out.begin() + static_cast<long>((T - n) * H), out.begin() + static_cast<long>(T * H));
  for (size_t t = 0; t < n; ++t) {
    float ss = 0;
    for (size_t i = 0; i < H; ++i) ss += next[t * H + i] * next[t * H + i];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + 1e-6f);
    for (size_t i = 0; i < H; ++i) next[t * H + i] *= r;
  }
}

/// FNV-1a over the bits of float rows: the checksum of a path's outputs.
inline void hash_into(uint64_t& hsh, const float* p, size_t n) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n * sizeof(float); ++i) hsh = (hsh ^ b[i]) * 0x100000001b3ull;
}
constexpr uint64_t kHashSeed = 0xcbf29ce484222325ull;

/// Combines the per-rank checksums (in rank order) into the job's.
inline uint64_t combine_hashes(const std::vector<uint64_t>& per_rank) {
  uint64_t h = kHashSeed;
  for (uint64_t v : per_rank) hash_into(h, reinterpret_cast<const float*>(&v), 2);
  return h;
}

inline std::string hex(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

/// Nearest-rank percentile (q in (0, 100]).
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t r = static_cast<size_t>(std::ceil(q / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(r, 1)) - 1];
}

/// Per path: each request's TTFT and each decode step's TPOT (ms, slowest rank's).
struct Samples {
  std::vector<double> ttft, tpot;
  uint64_t hash = kHashSeed;  // this rank's outputs
  bool ref_ok = true;         // every output matched the reference (with --check)
};

inline std::string header() {
  return "path        ranks  TTFT p50 ms  TTFT p99 ms  TPOT p50 ms  TPOT p99 ms  checksum\n";
}

/// One table row and one JSON line for a path.
/// combine: the order of the path's sums ("k": k ascending; "host": per host, moe::Buffer across
/// hosts), which decides which paths' checksums must agree.
inline void report(const Options& o, const std::string& path, int ranks, const Samples& s, uint64_t job_hash,
                   std::string& row, std::string& json, const char* combine = "k") {
  char b[512];
  const double t50 = percentile(s.ttft, 50), t99 = percentile(s.ttft, 99);
  const double p50 = percentile(s.tpot, 50), p99 = percentile(s.tpot, 99);
  std::snprintf(b, sizeof b, "%-10s %6d %12.3f %12.3f %12.4f %12.4f  %s\n", path.c_str(), ranks, t50, t99, p50, p99,
                hex(job_hash).c_str());
  row = b;
  std::snprintf(b, sizeof b,
                "{\"path\": \"%s\", \"ranks\": %d, \"layers\": %d, \"hidden\": %zu, \"ffn\": %zu, \"experts\": %d, "
                "\"topk\": %d, \"prompt\": %zu, \"decode_steps\": %d, \"decode_tokens\": %zu, \"requests\": %d, "
                "\"ttft_ms_p50\": %.6f, \"ttft_ms_p99\": %.6f, \"tpot_ms_p50\": %.6f, \"tpot_ms_p99\": %.6f, "
                "\"checksum\": \"%s\", \"combine\": \"%s\", \"checked\": %s}\n",
                path.c_str(), ranks, o.layers, o.hidden, o.ffn, o.experts, o.topk, o.prompt, o.decode_steps,
                o.decode_tokens, o.requests, t50, t99, p50, p99, hex(job_hash).c_str(), combine,
                o.check && s.ref_ok ? "true" : "false");
  json = b;
}

/// Serves one request on one path: prefill (timed as TTFT), then the decode steps (each timed
/// as a TPOT sample). `barrier()` lines the ranks up before each timed step; `moe_prefill`
/// and `moe_decode` are the path's MoE for the two phases. With `check`, every step's output
/// is compared with the reference computed here (summed per host when by_host).
template <class Barrier, class MoeP, class MoeD>
void serve_request(Model& m, int rank, int request, bool timed, Samples& s, Barrier&& barrier, MoeP&& moe_prefill,
                   MoeD&& moe_decode, bool by_host = false) {
  const Options& o = m.options();
  const size_t H = o.hidden;
  std::vector<float> h, ref, next;
  prompt(o, rank, request, h);
  auto check = [&](const std::vector<float>& in, const std::vector<float>& got, size_t T) {
    if (!o.check) return;
    ref = in;
    m.forward(ref, T,
              [&](int l, const std::vector<uint16_t>& x, size_t n, const std::vector<int64_t>& idx,
                  const std::vector<float>& w,
                  std::vector<uint16_t>& out) { m.reference_moe(l, x, n, idx, w, out, by_host); });
    if (std::memcmp(ref.data(), got.data(), T * H * sizeof(float)) != 0) s.ref_ok = false;
  };
  std::vector<float> in = o.check ? h : std::vector<float>{};
  barrier();
  auto t0 = Clock::now();
  m.forward(h, o.prompt, moe_prefill);
  const double ttft = ms_since(t0);
  if (timed) s.ttft.push_back(ttft);
  hash_into(s.hash, h.data(), h.size());
  check(in, h, o.prompt);
  size_t T = o.prompt;
  for (int d = 0; d < o.decode_steps; ++d) {
    next_tokens(o, h, T, next);
    T = o.decode_tokens;
    h = next;
    if (o.check) in = h;
    barrier();
    auto t1 = Clock::now();
    m.forward(h, T, moe_decode);
    const double tpot = ms_since(t1);
    if (timed) s.tpot.push_back(tpot);
    hash_into(s.hash, h.data(), h.size());
    check(in, h, T);
  }
}

}  // namespace moe_serve

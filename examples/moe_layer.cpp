// A mixture-of-experts feed-forward layer on CPU ranks with strata::moe:
//   router (x·Wr, softmax, top-k, weights renormalised) -> dispatch -> per-expert SwiGLU
//   (silu(x·W1) * (x·W3)) · W2 computed in place in the receive window -> combine.
// The output of every step is checked against a single-process reference that evaluates all
// experts for this rank's tokens in float32. One prefill batch, then decode steps of 1..128
// tokens per rank, for each schedule (Prefill, Decode, Relay), with per-phase latency.
//
//   strata run -n 2 ./build/examples/moe_layer [--tokens 2048] [--hidden 1024] [--ffn 512]
//                                               [--experts-per-rank 4] [--topk 2] [--steps 8]
//
// Matrix multiplies use OpenBLAS (cblas_sgemm) when the build found it, else a cache-blocked
// kernel below.

#include <strata/moe.hpp>
#include <strata/strata.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef STRATA_HAVE_CBLAS
#include <cblas.h>
#endif

namespace {

using strata::bfloat16_t;
using Clock = std::chrono::steady_clock;

/// C[m][n] = A[m][k] · B[k][n], row-major float32.
void gemm(const float* A, const float* B, float* C, size_t m, size_t k, size_t n) {
#ifdef STRATA_HAVE_CBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, A, static_cast<int>(k), B, static_cast<int>(n), 0.0f, C, static_cast<int>(n));
#else
  // Blocks of B (kb x nb) stay in cache while every row of A streams past them.
  constexpr size_t kb = 128, nb = 512;
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
#endif
}

struct Args {
  size_t tokens = 2048, hidden = 1024, ffn = 512;
  int experts_per_rank = 4, topk = 2, steps = 8;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    long v = std::atol(argv[i + 1]);
    if (k == "--tokens") a.tokens = static_cast<size_t>(v);
    else if (k == "--hidden") a.hidden = static_cast<size_t>(v);
    else if (k == "--ffn") a.ffn = static_cast<size_t>(v);
    else if (k == "--experts-per-rank") a.experts_per_rank = static_cast<int>(v);
    else if (k == "--topk") a.topk = static_cast<int>(v);
    else if (k == "--steps") a.steps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "moe_layer: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

/// The layer's weights; every rank builds all of them from one seed (the reference needs
/// every expert; the distributed path uses only the local ones).
struct Weights {
  size_t H, F;
  int E;
  std::vector<float> router;                   // [H][E]
  std::vector<std::vector<float>> w1, w3, w2;  // per expert [H][F], [H][F], [F][H]
  Weights(size_t h, size_t f, int e) : H(h), F(f), E(e), w1(e), w3(e), w2(e) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    router.resize(H * E);
    for (auto& v : router) v = n01(rng) / std::sqrt(static_cast<float>(H));
    for (int x = 0; x < E; ++x) {
      w1[x].resize(H * F);
      w3[x].resize(H * F);
      w2[x].resize(F * H);
      for (auto& v : w1[x]) v = n01(rng) / std::sqrt(static_cast<float>(H));
      for (auto& v : w3[x]) v = n01(rng) / std::sqrt(static_cast<float>(H));
      for (auto& v : w2[x]) v = n01(rng) / std::sqrt(static_cast<float>(F));
    }
  }
};

/// y[n][H] = (silu(a·W1) * (a·W3)) · W2 for a[n][H].
void swiglu(const Weights& W, int e, const float* a, float* y, size_t n, std::vector<float>& h1,
            std::vector<float>& h3) {
  h1.resize(n * W.F);
  h3.resize(n * W.F);
  gemm(a, W.w1[e].data(), h1.data(), n, W.H, W.F);
  gemm(a, W.w3[e].data(), h3.data(), n, W.H, W.F);
  for (size_t i = 0; i < n * W.F; ++i) h1[i] = h1[i] / (1.0f + std::exp(-h1[i])) * h3[i];
  gemm(h1.data(), W.w2[e].data(), y, n, W.F, W.H);
}

/// Router: softmax over experts, top-k, weights renormalised over the chosen k.
void route(const Weights& W, const std::vector<float>& xf, size_t T, int K, std::vector<int64_t>& idx,
           std::vector<float>& w) {
  std::vector<float> logits(T * W.E);
  gemm(xf.data(), W.router.data(), logits.data(), T, W.H, static_cast<size_t>(W.E));
  idx.resize(T * K);
  w.resize(T * K);
  std::vector<int> order(W.E);
  for (size_t t = 0; t < T; ++t) {
    float* l = &logits[t * W.E];
    float mx = *std::max_element(l, l + W.E), sum = 0;
    for (int e = 0; e < W.E; ++e) sum += (l[e] = std::exp(l[e] - mx));
    for (int e = 0; e < W.E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) { return l[a] > l[b]; });
    float ks = 0;
    for (int k = 0; k < K; ++k) ks += l[order[k]] / sum;
    for (int k = 0; k < K; ++k) {
      idx[t * K + k] = order[k];
      w[t * K + k] = l[order[k]] / sum / ks;
    }
  }
}

/// The whole layer in one process: every expert over the tokens routed to it, float32.
std::vector<float> reference(const Weights& W, const std::vector<float>& xf, size_t T, int K,
                             const std::vector<int64_t>& idx, const std::vector<float>& w) {
  std::vector<float> out(T * W.H, 0.0f), a, y, h1, h3;
  for (int e = 0; e < W.E; ++e) {
    std::vector<size_t> sel;  // (t, k) pairs routed to e
    for (size_t i = 0; i < T * K; ++i)
      if (idx[i] == e) sel.push_back(i);
    if (sel.empty()) continue;
    a.resize(sel.size() * W.H);
    y.resize(sel.size() * W.H);
    for (size_t j = 0; j < sel.size(); ++j) std::memcpy(&a[j * W.H], &xf[sel[j] / K * W.H], W.H * sizeof(float));
    swiglu(W, e, a.data(), y.data(), sel.size(), h1, h3);
    for (size_t j = 0; j < sel.size(); ++j)
      for (size_t h = 0; h < W.H; ++h) out[sel[j] / K * W.H + h] += w[sel[j]] * y[j * W.H + h];
  }
  return out;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Timing {
  double dispatch = 0, experts = 0, combine = 0;
};

/// One forward pass of `T` tokens through the distributed layer; returns the output in
/// float32 and the time of each phase on this rank.
std::vector<float> forward(strata::moe::Buffer& buf, const Weights& W, int rank, const std::vector<bfloat16_t>& x,
                           size_t T, const std::vector<int64_t>& idx, const std::vector<float>& w,
                           strata::moe::Schedule s, Timing& tm) {
  const size_t H = W.H;
  auto t0 = Clock::now();
  strata::moe::Dispatch d = buf.dispatch(x.data(), T, idx.data(), w.data(), s);
  tm.dispatch = ms_since(t0);

  auto t1 = Clock::now();
  std::vector<float> a, y, h1, h3;
  auto run_block = [&](int l, size_t first_row, size_t n) {
    if (n == 0) return;
    auto* rows = reinterpret_cast<bfloat16_t*>(d.window) + first_row * H;
    a.resize(n * H);
    y.resize(n * H);
    for (size_t i = 0; i < n * H; ++i) a[i] = strata::to_float(rows[i]);
    swiglu(W, rank * d.local_experts + l, a.data(), y.data(), n, h1, h3);
    for (size_t i = 0; i < n * H; ++i) rows[i] = strata::to_bfloat16(y[i]);  // in place: combine reads it there
  };
  for (int l = 0; l < d.local_experts; ++l) {
    if (d.masked()) {
      for (int src = 0; src < d.ranks; ++src) run_block(l, d.offset(l, src), d.count(l, src));
    } else {
      run_block(l, d.offset(l), d.count(l));  // one GEMM per expert over every source's rows
    }
  }
  tm.experts = ms_since(t1);

  auto t2 = Clock::now();
  std::vector<bfloat16_t> out(T * H);
  buf.combine(d.window, d.handle, out.data());
  tm.combine = ms_since(t2);
  std::vector<float> of(T * H);
  for (size_t i = 0; i < of.size(); ++i) of[i] = strata::to_float(out[i]);
  return of;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
#ifdef STRATA_HAVE_CBLAS
  openblas_set_num_threads(1);  // one core per rank
#endif
  strata::Communicator comm = strata::init();
  const int R = comm.size(), rank = comm.rank();
  const int E = args.experts_per_rank * R, K = args.topk;
  const size_t H = args.hidden, M = std::max<size_t>(args.tokens, 128);
  Weights W(H, args.ffn, E);
  strata::moe::Buffer buf(
      comm, {.num_experts = E, .hidden = H, .max_tokens = M, .topk = K, .dtype = strata::DataType::BFloat16});
  if (rank == 0)
    std::printf("moe_layer: %d ranks, %d experts (%d per rank), top-%d, hidden %zu, ffn %zu, bfloat16 tokens, %s\n", R,
                E, args.experts_per_rank, K, H, args.ffn,
#ifdef STRATA_HAVE_CBLAS
                "OpenBLAS sgemm"
#else
                "blocked sgemm"
#endif
    );
  if (rank == 0)
    std::printf("%-8s %-8s %7s %11s %11s %11s %11s %12s %9s\n", "phase", "schedule", "tok/rank", "dispatch_ms",
                "experts_ms", "combine_ms", "total_ms", "tokens/s", "max_err");

  std::vector<size_t> batches = {args.tokens};
  const size_t decode_sizes[] = {1, 8, 32, 128};
  for (int st = 0; st < args.steps; ++st) batches.push_back(decode_sizes[st % 4]);
  bool all_ok = true;
  for (size_t b = 0; b < batches.size(); ++b) {
    const size_t T = batches[b];
    std::mt19937 rng(static_cast<unsigned>(1000 * b + rank));
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<bfloat16_t> x(T * H);
    std::vector<float> xf(T * H);
    for (size_t i = 0; i < T * H; ++i) {
      x[i] = strata::to_bfloat16(n01(rng));
      xf[i] = strata::to_float(x[i]);
    }
    std::vector<int64_t> idx;
    std::vector<float> w;
    route(W, xf, T, K, idx, w);
    const std::vector<float> ref = reference(W, xf, T, K, idx, w);  // the check of every schedule
    for (strata::moe::Schedule s :
         {strata::moe::Schedule::Prefill, strata::moe::Schedule::Decode, strata::moe::Schedule::Relay}) {
      Timing tm;
      // The first batch of each schedule runs twice: the first pass touches its windows (the
      // first touch of a page is slow), the second is timed.
      if (b == 0) (void)forward(buf, W, rank, x, T, idx, w, s, tm);
      comm.barrier();
      std::vector<float> out = forward(buf, W, rank, x, T, idx, w, s, tm);
      double err = 0, scale = 1e-6;
      for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, static_cast<double>(std::fabs(out[i] - ref[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
      }
      double t[4] = {tm.dispatch, tm.experts, tm.combine, err / scale};
      comm.all_reduce(std::span<double>(t, 4), strata::ReduceOp::Max);
      bool ok = t[3] < 2e-2;  // bf16 activations and expert outputs: ~3 significant digits
      all_ok &= ok;
      if (rank == 0) {
        double total = t[0] + t[1] + t[2];
        std::printf("%-8s %-8s %7zu %11.3f %11.3f %11.3f %11.3f %12.0f %9.2e%s\n", b == 0 ? "prefill" : "decode",
                    strata::moe::to_string(s), T, t[0], t[1], t[2], total,
                    total > 0 ? static_cast<double>(T) * R / (total / 1e3) : 0.0, t[3], ok ? "" : "  MISMATCH");
      }
    }
  }
  if (rank == 0)
    std::printf("moe_layer: %s\n", all_ok ? "every output matches the single-process reference" : "MISMATCH");
  comm.barrier();
  return all_ok ? 0 : 1;
}

// The Open MPI peer of `strata bench moe`: MoE dispatch and combine the way Megatron's
// all-to-all token dispatcher does them, over MPI — permute rows by expert (hence by
// destination), MPI_Alltoall of the per-expert counts, MPI_Alltoallv of the rows, sort the
// received [source][expert] chunks into expert order; combine reverses it (chunks back to
// [source][expert], MPI_Alltoallv, unpermute with an fp32 weighted sum). Same cases, inputs,
// timing and output rows as strata (src/cli/bench_moe.hpp); buffers are allocated once per
// case, grown only when a batch needs more, and touched during warm-up.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 mpi_moe_bench [--quick] [--only decode] [--json f]

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli/bench_moe.hpp"

namespace {

using namespace strata::bench::moe;
using Clock = std::chrono::steady_clock;

// The same loop strata's combine runs (src/moe/kernels.cpp), so the reduction costs the same.
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void accumulate(float* __restrict acc, const uint16_t* __restrict row, float w, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += w * bf2f(row[i]);
}
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void store(uint16_t* __restrict out, const float* __restrict acc, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f2bf(acc[i]);
}

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Layer {
  const Case& c;
  int R, me, L;
  size_t rb;  // row bytes
  MPI_Datatype row_t;
  std::vector<uint16_t> send, recv, expert;
  std::vector<int> cnt, rcnt, sc, sd, rc, rd;
  std::vector<size_t> pos;  // [T*K]: row of (t, k) in the permuted order
  std::vector<float> acc;

  Layer(const Case& cs, int r, int m) : c(cs), R(r), me(m), L(cs.experts / r), rb(cs.hidden * 2) {
    MPI_Type_contiguous(static_cast<int>(c.hidden), MPI_UINT16_T, &row_t);
    MPI_Type_commit(&row_t);
    cnt.resize(c.experts);
    rcnt.resize(c.experts);
    sc.resize(R);
    sd.resize(R);
    rc.resize(R);
    rd.resize(R);
    pos.resize(c.tokens * c.topk);
    acc.resize(c.hidden);
  }
  ~Layer() { MPI_Type_free(&row_t); }

  static void grow(std::vector<uint16_t>& v, size_t n) {
    if (v.size() < n) v.resize(n + n / 4);
  }

  void dispatch(const Inputs& in) {
    const size_t T = c.tokens, K = c.topk, H = c.hidden;
    std::fill(cnt.begin(), cnt.end(), 0);
    for (size_t i = 0; i < T * K; ++i)
      if (in.idx[i] >= 0) ++cnt[in.idx[i]];
    std::vector<size_t> first(c.experts, 0);
    for (int e = 1; e < c.experts; ++e) first[e] = first[e - 1] + cnt[e - 1];
    grow(send, (first[c.experts - 1] + cnt[c.experts - 1]) * H);
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < K; ++k) {
        int64_t e = in.idx[t * K + k];
        if (e < 0) continue;
        size_t p = first[e]++;
        pos[t * K + k] = p;
        std::memcpy(&send[p * H], &in.x[t * H], rb);
      }
    MPI_Alltoall(cnt.data(), L, MPI_INT, rcnt.data(), L, MPI_INT, MPI_COMM_WORLD);
    int so = 0, ro = 0;
    for (int r = 0; r < R; ++r) {
      sc[r] = rc[r] = 0;
      for (int l = 0; l < L; ++l) {
        sc[r] += cnt[r * L + l];
        rc[r] += rcnt[r * L + l];
      }
      sd[r] = so;
      rd[r] = ro;
      so += sc[r];
      ro += rc[r];
    }
    grow(recv, static_cast<size_t>(ro) * H);
    grow(expert, static_cast<size_t>(ro) * H);
    MPI_Alltoallv(send.data(), sc.data(), sd.data(), row_t, recv.data(), rc.data(), rd.data(), row_t, MPI_COMM_WORLD);
    // [source][expert] chunks into [expert][source] order.
    size_t at = 0;
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < R; ++s) {
        size_t from = rd[s];
        for (int l2 = 0; l2 < l; ++l2) from += rcnt[s * L + l2];
        size_t n = rcnt[s * L + l];
        std::memcpy(&expert[at * H], &recv[from * H], n * rb);
        at += n;
      }
  }

  void combine(const Inputs& in, uint16_t* out) {
    const size_t T = c.tokens, K = c.topk, H = c.hidden;
    size_t at = 0;
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < R; ++s) {
        size_t to = rd[s];
        for (int l2 = 0; l2 < l; ++l2) to += rcnt[s * L + l2];
        size_t n = rcnt[s * L + l];
        std::memcpy(&recv[to * H], &expert[at * H], n * rb);
        at += n;
      }
    MPI_Alltoallv(recv.data(), rc.data(), rd.data(), row_t, send.data(), sc.data(), sd.data(), row_t, MPI_COMM_WORLD);
    for (size_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t k = 0; k < K; ++k)
        if (in.idx[t * K + k] >= 0) accumulate(acc.data(), &send[pos[t * K + k] * H], in.w[t * K + k], H);
      store(out + t * H, acc.data(), H);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int R = 1, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  bool quick = false;
  std::string only, json, label = "openmpi";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      size_t n = std::strlen(name);
      if (a == name && i + 1 < argc) return argv[++i];
      if (a.size() > n && a.compare(0, n, name) == 0 && a[n] == '=') return argv[i] + n + 1;
      return nullptr;
    };
    if (a == "--quick") {
      quick = true;
    } else if (const char* v = val("--only")) {
      only = v;
    } else if (const char* v2 = val("--json")) {
      json = v2;
    } else if (const char* v3 = val("--label")) {
      label = v3;
    } else {
      if (me == 0) std::fprintf(stderr, "mpi_moe_bench: unknown option '%s'\n", a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (me == 0) std::printf("# mpi_moe_bench (%s): %d ranks\n%s", label.c_str(), R, table_header().c_str());
  int rc = 0;
  for (const Case& c : cases(quick)) {
    if (!only.empty() && only != c.phase) continue;
    Inputs in = make_inputs(c, me);
    Layer layer(c, R, me);
    std::vector<uint16_t> out(c.tokens * c.hidden);
    std::vector<double> dt(c.iters), ct(c.iters);
    for (int i = 0; i < c.warmup + c.iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      layer.dispatch(in);
      double d_us = us_since(t0);
      MPI_Barrier(MPI_COMM_WORLD);
      auto t1 = Clock::now();
      layer.combine(in, out.data());
      double c_us = us_since(t1);
      if (i >= c.warmup) {
        dt[i - c.warmup] = d_us;
        ct[i - c.warmup] = c_us;
      }
    }
    std::string why;
    int bad = check_identity(c, in, out.data(), why) ? 0 : 1;
    if (bad) std::fprintf(stderr, "mpi_moe_bench: rank %d: wrong result: %s\n", me, why.c_str());
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, dt.data(), c.iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, ct.data(), c.iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (bad) rc = 1;
    if (me == 0) {
      std::string row, js;
      format_row(c, R, label, median(dt), median(ct), row, js);
      std::fputs(row.c_str(), stdout);
      std::fflush(stdout);
      if (!json.empty()) std::ofstream(json, std::ios::app) << js;
    }
  }
  MPI_Finalize();
  return rc;
}

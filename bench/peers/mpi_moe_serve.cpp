// The Open MPI peer of examples/moe_serve: the same model, request stream, timing and report
// (examples/moe_serve_model.hpp), with the MoE rows moved the way an expert-parallel stack on
// MPI moves them (Megatron's all-to-all dispatcher): permute the selected rows by expert (so by
// destination), MPI_Alltoall of the per-expert counts, MPI_Alltoallv of the packed rows, sort the
// received [source][expert] chunks into expert order, run the experts; then the reverse:
// chunks back to [source][expert], MPI_Alltoallv, and the fp32 weighted sum per token in the
// order k = 0..K-1 (the library's combine), so the outputs are bit-identical to strata's.
//
//   mpirun --oversubscribe -np 2 mpi_moe_serve [moe_serve's options but --path] [--expect HEX]

#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "moe_serve_model.hpp"

namespace {

using namespace moe_serve;

class MpiMoe {
 public:
  MpiMoe(Model& m, int R, int rank) : m_(m), R_(R), rank_(rank), L_(m.options().experts / R) {
    MPI_Type_contiguous(static_cast<int>(m.options().hidden), MPI_UINT16_T, &row_t_);
    MPI_Type_commit(&row_t_);
    const int E = m.options().experts;
    cnt_.resize(E);
    rcnt_.resize(E);
    sc_.resize(R);
    sd_.resize(R);
    rc_.resize(R);
    rd_.resize(R);
  }
  ~MpiMoe() { MPI_Type_free(&row_t_); }
  MpiMoe(const MpiMoe&) = delete;
  MpiMoe& operator=(const MpiMoe&) = delete;

  void operator()(int l, const std::vector<uint16_t>& x, size_t T, const std::vector<int64_t>& idx,
                  const std::vector<float>& w, std::vector<uint16_t>& out) {
    const Options& o = m_.options();
    const size_t K = static_cast<size_t>(o.topk), H = o.hidden, rb = H * sizeof(uint16_t);
    const int E = o.experts;
    // Permute: rows grouped by expert, hence by destination rank.
    std::fill(cnt_.begin(), cnt_.end(), 0);
    for (size_t i = 0; i < T * K; ++i)
      if (idx[i] >= 0) ++cnt_[idx[i]];
    std::vector<size_t> first(E, 0);
    for (int e = 1; e < E; ++e) first[e] = first[e - 1] + cnt_[e - 1];
    const size_t nsend = first[E - 1] + cnt_[E - 1];
    grow(send_, nsend * H);
    pos_.resize(T * K);
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < K; ++k) {
        const int64_t e = idx[t * K + k];
        if (e < 0) continue;
        const size_t p = first[e]++;
        pos_[t * K + k] = p;
        std::memcpy(&send_[p * H], &x[t * H], rb);
      }
    MPI_Alltoall(cnt_.data(), L_, MPI_INT, rcnt_.data(), L_, MPI_INT, MPI_COMM_WORLD);
    int so = 0, ro = 0;
    for (int r = 0; r < R_; ++r) {
      sc_[r] = rc_[r] = 0;
      for (int le = 0; le < L_; ++le) {
        sc_[r] += cnt_[r * L_ + le];
        rc_[r] += rcnt_[r * L_ + le];
      }
      sd_[r] = so;
      rd_[r] = ro;
      so += sc_[r];
      ro += rc_[r];
    }
    grow(recv_, static_cast<size_t>(ro) * H);
    grow(expert_, static_cast<size_t>(ro) * H);
    MPI_Alltoallv(send_.data(), sc_.data(), sd_.data(), row_t_, recv_.data(), rc_.data(), rd_.data(), row_t_,
                  MPI_COMM_WORLD);
    // [source][expert] chunks into [expert][source] order, then one matmul per expert.
    size_t at = 0;
    for (int le = 0; le < L_; ++le) {
      const size_t begin = at;
      for (int s = 0; s < R_; ++s) {
        const size_t n = rcnt_[s * L_ + le];
        std::memcpy(&expert_[at * H], &recv_[chunk(s, le) * H], n * rb);
        at += n;
      }
      if (at > begin)
        m_.run_expert(m_.expert(l, rank_ * L_ + le), &expert_[begin * H], &expert_[begin * H], at - begin);
    }
    // And back: expert order to [source][expert], MPI_Alltoallv, weighted sum per token.
    at = 0;
    for (int le = 0; le < L_; ++le)
      for (int s = 0; s < R_; ++s) {
        const size_t n = rcnt_[s * L_ + le];
        std::memcpy(&recv_[chunk(s, le) * H], &expert_[at * H], n * rb);
        at += n;
      }
    MPI_Alltoallv(recv_.data(), rc_.data(), rd_.data(), row_t_, send_.data(), sc_.data(), sd_.data(), row_t_,
                  MPI_COMM_WORLD);
    acc_.resize(H);
    for (size_t t = 0; t < T; ++t) {
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      for (size_t k = 0; k < K; ++k)
        if (idx[t * K + k] >= 0) Model::accumulate(acc_.data(), &send_[pos_[t * K + k] * H], w[t * K + k], H);
      for (size_t i = 0; i < H; ++i) out[t * H + i] = f2bf(acc_[i]);
    }
  }

 private:
  // Buffers are kept and grown only when a batch needs more (as a serving stack would).
  static void grow(std::vector<uint16_t>& v, size_t n) {
    if (v.size() < n) v.resize(n + n / 4);
  }
  /// First row of (source s, local expert le) in the received [source][expert] order.
  size_t chunk(int s, int le) const {
    size_t r = static_cast<size_t>(rd_[s]);
    for (int j = 0; j < le; ++j) r += static_cast<size_t>(rcnt_[s * L_ + j]);
    return r;
  }

  Model& m_;
  int R_, rank_, L_;
  MPI_Datatype row_t_;
  std::vector<uint16_t> send_, recv_, expert_;
  std::vector<int> cnt_, rcnt_, sc_, sd_, rc_, rd_;
  std::vector<size_t> pos_;
  std::vector<float> acc_;
};

/// Serves the stream; returns 1 on a mismatch (on every rank).
int serve(const Options& o, int R, int rank) {
  const int L = o.experts / R;
  Model m(o, rank * L, L);
  MpiMoe moe(m, R, rank);
  if (rank == 0)
    std::printf(
        "mpi_moe_serve: %d ranks, %d layers, %d experts, top-%d, hidden %zu, ffn %zu; %d requests (+%d "
        "warm-up) of %zu prompt tokens/rank + %d decode steps of %zu tokens/rank\n",
        R, o.layers, o.experts, o.topk, o.hidden, o.ffn, o.requests, o.warmup, o.prompt, o.decode_steps,
        o.decode_tokens);
  Samples s;
  for (int r = 0; r < o.warmup + o.requests; ++r)
    serve_request(
        m, rank, r, r >= o.warmup, s, [] { MPI_Barrier(MPI_COMM_WORLD); }, moe, moe);
  MPI_Allreduce(MPI_IN_PLACE, s.ttft.data(), static_cast<int>(s.ttft.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, s.tpot.data(), static_cast<int>(s.tpot.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  std::vector<uint64_t> all(R);
  MPI_Allgather(&s.hash, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  int bad = s.ref_ok ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    if (bad) std::fprintf(stderr, "mpi_moe_serve: openmpi: outputs differ from the reference\n");
    const uint64_t h = combine_hashes(all);
    std::string row, json;
    report(o, "openmpi", R, s, h, row, json);
    std::printf("%s%s", header().c_str(), row.c_str());
    if (!o.json.empty()) std::ofstream(o.json, std::ios::app) << json;
    if (!o.expect.empty() && hex(h) != o.expect) {
      std::fprintf(stderr, "mpi_moe_serve: MISMATCH: openmpi checksum %s, expected %s\n", hex(h).c_str(),
                   o.expect.c_str());
      bad = 1;
    }
    std::printf("mpi_moe_serve: %s%s\n", bad ? "MISMATCH" : "done",
                o.check && !bad ? " (outputs match the single-process reference)" : "");
    std::fflush(stdout);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int R = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Options o;
  std::string err;
  if (!parse_options(argc, argv, false, o, err) || o.experts % R != 0) {
    if (rank == 0)
      std::fprintf(stderr, "mpi_moe_serve: %s\n%s",
                   err.empty() ? "--experts must be a multiple of the rank count" : err.c_str(), kOptionsHelp);
    MPI_Finalize();
    return 2;
  }
  const int bad = serve(o, R, rank);  // its MPI datatype is freed before MPI_Finalize
  MPI_Finalize();
  return bad;
}

// Serving a small MoE model with expert parallelism over strata::moe: a stream of requests,
// each a prefill of --prompt tokens per rank then --decode-steps steps of --decode-tokens
// tokens per rank, through --layers layers of router -> dispatch -> experts -> combine
// (examples/moe_serve_model.hpp). Reports time to first token (TTFT: the prefill forward) and
// time per output token (TPOT: one decode step), p50 and p99 over the stream, per path:
//
//   strata   the Prefill schedule for prefill, the Decode schedule for decode (recommended)
//   relay    the Relay baseline (pack, all_to_all_v, unpack) for both
//
// The paths take turns request by request. Every path must produce the same bits (combine sums
// in float32 in a fixed order whatever the schedule): the program prints a checksum per path
// and exits non-zero when they differ, or with --check when an output differs from a
// single-process reference. The Open MPI path (MPI_Alltoallv of packed rows) is the peer
// bench/peers/mpi_moe_serve (mpirun), on the same model and stream; --expect compares checksums.
//
//   strata run -n 2 ./build/examples/moe_serve [--path strata|relay|all] [--layers 4] ...
//
// Ranks come from the communicator, so `strata run --nnodes` runs it as it is. Across hosts the
// strata path sums in another fixed order (each other host's terms arrive as one partial sum,
// rounded to bfloat16: moe::Buffer::combine), so its bits differ from relay's (k ascending, as
// Open MPI's): there relay must still match the others' k order, and strata is checked against
// the reference summed in its own order (--check).

#include <strata/moe.hpp>
#include <strata/strata.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "moe_serve_model.hpp"

namespace {

using namespace moe_serve;
using strata::moe::Schedule;

/// One path's MoE: dispatch with schedule `s`, the local experts in place in the receive
/// window (one matmul per expert over every source's rows), combine.
struct StrataMoe {
  strata::moe::Buffer& buf;
  Model& m;
  Schedule s;
  int rank;

  void operator()(int l, const std::vector<uint16_t>& x, size_t T, const std::vector<int64_t>& idx,
                  const std::vector<float>& w, std::vector<uint16_t>& out) {
    strata::moe::Dispatch d = buf.dispatch(x.data(), T, idx.data(), w.data(), s);
    const size_t H = d.hidden;
    auto run = [&](int e, size_t first_row, size_t n) {
      if (n == 0) return;
      auto* rows = reinterpret_cast<uint16_t*>(d.window) + first_row * H;
      m.run_expert(m.expert(l, e), rows, rows, n);  // in place: combine reads it there
    };
    for (int le = 0; le < d.local_experts; ++le) {
      const int e = rank * d.local_experts + le;
      if (d.masked()) {
        for (int src = 0; src < d.ranks; ++src) run(e, d.offset(le, src), d.count(le, src));
      } else {
        run(e, d.offset(le), d.count(le));
      }
    }
    buf.combine(d.window, d.handle, out.data());
  }
};

const char* kUsage =
    "usage: strata run -n R moe_serve [options]\n"
    "  --path strata|relay|all   strata: Prefill then Decode schedules; relay: the Relay baseline (all)\n";

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string err;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::printf("%s%s", kUsage, kOptionsHelp);
      return 0;
    }
  if (!parse_options(argc, argv, true, o, err)) {
    std::fprintf(stderr, "moe_serve: %s\n%s%s", err.c_str(), kUsage, kOptionsHelp);
    return 2;
  }
  try {
    strata::Communicator comm = strata::init();
    const int R = comm.size(), rank = comm.rank();
    if (o.experts % R != 0) {
      if (rank == 0) std::fprintf(stderr, "moe_serve: --experts %d is not a multiple of the %d ranks\n", o.experts, R);
      comm.barrier();  // the launcher stops the job at the first exit: rank 0 has said why by now
      return 2;
    }
    const int L = o.experts / R;
    Model m(o, rank * L, L);
    // Across hosts the reference needs each rank's host, numbered by first rank as the Buffer
    // numbers them; `strata run --nnodes` numbers ranks host by host, which this relies on.
    const bool spans = comm.local_size() != R;
    if (spans) {
      std::vector<int32_t> lr(R);
      const int32_t mine = comm.local_rank();
      comm.all_gather(&mine, lr.data(), 1, strata::DataType::Int32);
      std::vector<int> host_of(R);
      bool contiguous = lr[0] == 0;
      for (int r = 0, h = -1; r < R; ++r) {
        if (lr[r] == 0) ++h;
        else contiguous = contiguous && lr[r] == lr[r - 1] + 1;
        host_of[r] = h;
      }
      if (!contiguous && o.check) {
        if (rank == 0)
          std::fprintf(stderr,
                       "moe_serve: --check across hosts needs the ranks of each host numbered in a row "
                       "(as strata run --nnodes numbers them)\n");
        comm.barrier();
        return 2;
      }
      const int my_host = host_of[rank];
      m.set_hosts(std::move(host_of), my_host);
    }
    // Two buffers, as a serving stack keeps them: the prefill one sized for a prompt, the
    // decode one for a step (the Decode schedule's slots are [L][R][M][H], so M matters).
    strata::moe::Config pc{.num_experts = o.experts, .hidden = o.hidden, .max_tokens = o.prompt, .topk = o.topk};
    strata::moe::Config dc = pc;
    dc.max_tokens = o.decode_tokens;
    strata::moe::Buffer pbuf(comm, pc), dbuf(comm, dc);

    struct Path {
      std::string name;
      Schedule prefill, decode;
      bool by_host;  // sums per host (Prefill/Decode across hosts) rather than k ascending
      Samples s;
    };
    std::vector<Path> paths;
    if (o.path == "strata" || o.path == "all")
      paths.push_back({"strata", Schedule::Prefill, Schedule::Decode, spans, {}});
    if (o.path == "relay" || o.path == "all") paths.push_back({"relay", Schedule::Relay, Schedule::Relay, false, {}});
    if (rank == 0)
      std::printf(
          "moe_serve: %d ranks, %d layers, %d experts (%d per rank), top-%d, hidden %zu, ffn %zu; %d requests "
          "(+%d warm-up) of %zu prompt tokens/rank + %d decode steps of %zu tokens/rank\n",
          R, o.layers, o.experts, L, o.topk, o.hidden, o.ffn, o.requests, o.warmup, o.prompt, o.decode_steps,
          o.decode_tokens);

    for (int r = 0; r < o.warmup + o.requests; ++r)
      for (Path& p : paths)
        serve_request(
            m, rank, r, r >= o.warmup, p.s, [&] { comm.barrier(); }, StrataMoe{pbuf, m, p.prefill, rank},
            StrataMoe{dbuf, m, p.decode, rank}, p.by_host);

    int bad = 0;
    std::vector<uint64_t> job_hash;
    for (Path& p : paths) {
      comm.all_reduce(p.s.ttft, strata::ReduceOp::Max);  // each step: the slowest rank's time
      comm.all_reduce(p.s.tpot, strata::ReduceOp::Max);
      std::vector<uint64_t> all(R);
      comm.all_gather(&p.s.hash, all.data(), 1, strata::DataType::UInt64);
      job_hash.push_back(combine_hashes(all));
      int ref_bad = p.s.ref_ok ? 0 : 1;
      std::vector<int32_t> rb = {ref_bad};
      comm.all_reduce(rb, strata::ReduceOp::Max);
      if (rb[0]) {
        bad = 1;
        if (rank == 0) std::fprintf(stderr, "moe_serve: %s: outputs differ from the reference\n", p.name.c_str());
      }
    }
    if (rank == 0) {
      std::printf("%s", header().c_str());
      for (size_t i = 0; i < paths.size(); ++i) {
        std::string row, json;
        report(o, paths[i].name, R, paths[i].s, job_hash[i], row, json, paths[i].by_host ? "host" : "k");
        std::printf("%s", row.c_str());
        if (!o.json.empty()) std::ofstream(o.json, std::ios::app) << json;
        // Only paths that sum in the same order must give the same bits.
        size_t j = 0;
        while (paths[j].by_host != paths[i].by_host) ++j;
        if (job_hash[i] != job_hash[j]) {
          std::fprintf(stderr, "moe_serve: MISMATCH: %s checksum %s, %s checksum %s\n", paths[i].name.c_str(),
                       hex(job_hash[i]).c_str(), paths[j].name.c_str(), hex(job_hash[j]).c_str());
          bad = 1;
        }
        if (!o.expect.empty() && !paths[i].by_host && hex(job_hash[i]) != o.expect) {
          std::fprintf(stderr, "moe_serve: MISMATCH: %s checksum %s, expected %s\n", paths[i].name.c_str(),
                       hex(job_hash[i]).c_str(), o.expect.c_str());
          bad = 1;
        }
      }
      std::printf("moe_serve: %s%s\n",
                  bad                ? "MISMATCH"
                  : paths.size() < 2 ? "done"
                  : spans ? "across hosts: strata sums per host, relay k ascending (checksums differ by design)"
                          : "every path gives the same outputs",
                  o.check && !bad ? " (and matches the single-process reference)" : "");
      std::fflush(stdout);
    }
    std::vector<int32_t> b = {bad};
    comm.all_reduce(b, strata::ReduceOp::Max);
    return b[0] ? 1 : 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "moe_serve: %s\n", e.what());
    return 1;
  }
}

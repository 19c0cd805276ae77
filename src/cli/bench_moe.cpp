// `strata bench moe`: MoE dispatch and combine time and bandwidth for the Prefill and Decode
// schedules and the Relay baseline, on the cases of src/cli/bench_moe.hpp (shared with the Open
// MPI peer bench/peers/mpi_moe_bench.cpp). Experts are the identity (y is the window itself), so
// the figures are the communication alone; every run's output is checked.
//
//   strata bench moe -n 2 [--quick] [--only prefill|decode] [--json FILE]
//   strata run --nnodes 2 ... -- strata bench moe --as-rank [...]   (one job across hosts)
//
// Like `strata bench`, it starts its ranks through `strata run` on this binary; rank 0 writes
// the table to the inherited descriptors given by the hidden --worker-fds option. With
// --as-rank the process is one rank of a job someone else started (across hosts: `strata run
// --nnodes` on every host) and rank 0 writes to its stdout; when the job spans hosts, a
// "# bytes to other hosts" line per case and host follows the rows (moe::Buffer::traffic).

#include <fcntl.h>
#include <unistd.h>

#include <strata/moe.hpp>
#include <strata/strata.hpp>

#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli/bench_args.hpp"
#include "cli/bench_moe.hpp"
#include "cli/commands.hpp"
#include "common/parse.hpp"

namespace strata::cli {
namespace {

using namespace strata::bench::moe;
using Clock = std::chrono::steady_clock;

constexpr const char* kWho = "strata bench moe";

struct MoeOptions {
  int nranks = 0;
  bool quick = false;
  std::string only, json;
  int out_fd = -1, err_fd = -1;
  bool worker = false;
};

const char* kUsage =
    "usage: strata bench moe -n N [--quick] [--only prefill|decode] [--json FILE]\n"
    "  MoE dispatch/combine: Prefill and Decode schedules vs the Relay baseline, bfloat16, top-8 of 64\n"
    "  experts; prefill 4096 tokens/rank x hidden 4096, decode 1/32/128 tokens/rank x hidden 7168.\n"
    "  Times are medians over iterations of the slowest rank; GB/s counts hidden x 2 bytes per\n"
    "  (token, expert) selection per rank. Each case ends with a '# memcpy' line: every rank copying\n"
    "  the same bytes at once, in the same rotation, and each schedule's GB/s as a % of it.\n"
    "\n"
    "options:\n"
    "  -n, --np N              ranks on this host (1-4096)\n"
    "  --quick                 fewer iterations per case (the same sizes)\n"
    "  --only prefill|decode   run one of the two schedules' cases\n"
    "  --json FILE             append one JSON object per case and line to FILE\n"
    "  --as-rank               be one rank of a job someone else started (strata run --nnodes\n"
    "                          on every host); prints the bytes each host sends to the others\n"
    "  -h, --help              show this help\n";

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

/// Across hosts: one line per host and case with the bytes its ranks send to other hosts per
/// call, next to the deduplicated bound (one row per token and destination host) and to the
/// rows without deduplication (one per (token, expert) on another host, what Relay sends).
/// Hosts are blocks of local_size() consecutive ranks, as `strata run --nnodes` numbers them.
void report_traffic(Communicator& comm, const Case& c, const std::vector<moe::Schedule>& scheds,
                    const std::vector<double>& sent, int out_fd) {
  const int R = comm.size(), me = comm.rank(), per = comm.local_size();
  if (per == R || R % per != 0) return;  // one host, or hosts of uneven sizes (not reported)
  const int hosts = R / per;
  const size_t ns = scheds.size();
  std::vector<double> all(static_cast<size_t>(hosts) * ns * 4, 0.0);
  for (size_t i = 0; i < ns * 4; ++i) all[(me / per) * ns * 4 + i] = sent[i] / c.iters;
  comm.all_reduce(all, ReduceOp::Sum);
  if (me != 0) return;
  const double rb = static_cast<double>(c.hidden) * 2, mb = 1e6;
  for (int h = 0; h < hosts; ++h) {
    const double* v = &all[h * ns * 4];
    std::string line = "# bytes to other hosts per call, host " + std::to_string(h) + " (" + c.phase + ", " +
                       std::to_string(c.tokens) + " tokens/rank):";
    double bound = 0, undedup = 0;
    for (size_t k = 0; k < ns; ++k) {
      char b[160];
      std::snprintf(b, sizeof b, " %s %.2f+%.2f MB;", moe::to_string(scheds[k]), v[k * 4] / mb, v[k * 4 + 1] / mb);
      line += b;
      if (scheds[k] != moe::Schedule::Relay) bound = v[k * 4 + 2] * rb;
      undedup = v[k * 4 + 3] * rb;
    }
    char b[200];
    std::snprintf(b, sizeof b, " bound (one row per token and host) %.2f MB, one row per selection %.2f MB\n",
                  bound / mb, undedup / mb);
    write_all(out_fd, line + b);
  }
}

int worker(const MoeOptions& o) {
  Communicator comm = init();
  const int R = comm.size(), me = comm.rank();
  const int out_fd = o.out_fd >= 0 ? o.out_fd : STDOUT_FILENO;
  if (me == 0) write_all(out_fd, "# strata bench moe: " + std::to_string(R) + " ranks\n" + table_header());
  int rc = 0;
  for (const Case& c : cases(o.quick)) {
    if (!o.only.empty() && o.only != c.phase) continue;
    Inputs in = make_inputs(c, me);
    moe::Buffer buf(comm, {.num_experts = c.experts,
                           .hidden = c.hidden,
                           .max_tokens = c.max_tokens,
                           .topk = c.topk,
                           .dtype = DataType::BFloat16});
    std::vector<uint16_t> out(c.tokens * c.hidden);
    std::vector<moe::Schedule> scheds = {moe::Schedule::Prefill, moe::Schedule::Relay};
    if (c.phase == "decode") scheds.insert(scheds.begin(), moe::Schedule::Decode);
    // The schedules take turns iteration by iteration, so a burst of load from elsewhere on a
    // shared machine hits them alike and their ratios hold.
    const size_t ns = scheds.size();
    std::vector<std::vector<double>> dt(ns, std::vector<double>(c.iters)), ct = dt;
    std::vector<double> bad(ns, 0.0);
    // Per schedule, summed over the timed iterations: bytes to other hosts in dispatch and
    // combine, rows sent, (token, expert) pairs on other hosts.
    std::vector<double> sent(ns * 4, 0.0);
    // The reference: every rank memcpys the case's bytes (one row per selection) at once, in
    // the same rotation, so "% of memcpy" compares like with like on a machine shared with
    // other work. memcpy's own choice of stores applies (non-temporal at these sizes).
    const size_t sel_bytes = c.tokens * static_cast<size_t>(c.topk) * c.hidden * 2;
    std::vector<unsigned char> msrc(sel_bytes, 1), mdst(sel_bytes);
    std::vector<double> mt(c.iters);
    for (int i = 0; i < c.warmup + c.iters; ++i) {
      comm.barrier();
      auto tm = Clock::now();
      std::memcpy(mdst.data(), msrc.data(), sel_bytes);
      if (i >= c.warmup) mt[i - c.warmup] = us_since(tm);
      for (size_t k = 0; k < ns; ++k) {
        comm.barrier();
        auto t0 = Clock::now();
        const moe::Traffic t_before = buf.traffic();
        moe::Dispatch d = buf.dispatch(in.x.data(), c.tokens, in.idx.data(), in.w.data(), scheds[k]);
        double d_us = us_since(t0);
        comm.barrier();
        auto t1 = Clock::now();
        buf.combine(d.window, d.handle, out.data());
        double c_us = us_since(t1);
        if (i >= c.warmup) {
          dt[k][i - c.warmup] = d_us;
          ct[k][i - c.warmup] = c_us;
          const moe::Traffic t = buf.traffic();
          sent[k * 4 + 0] += static_cast<double>(t.dispatch_bytes - t_before.dispatch_bytes);
          sent[k * 4 + 1] += static_cast<double>(t.combine_bytes - t_before.combine_bytes);
          sent[k * 4 + 2] += static_cast<double>(t.rows_sent - t_before.rows_sent);
          sent[k * 4 + 3] += static_cast<double>(t.remote_selections - t_before.remote_selections);
        }
        std::string why;
        if (i + 1 == c.warmup + c.iters && !check_identity(c, in, out.data(), why)) {
          bad[k] = 1;
          print_error(kWho,
                      "rank " + std::to_string(me) + ": wrong result (" + moe::to_string(scheds[k]) + "): " + why);
        }
      }
    }
    comm.all_reduce(bad, ReduceOp::Max);
    comm.all_reduce(mt, ReduceOp::Max);
    const double m_us = median(mt);
    char mline[160];
    std::snprintf(mline, sizeof mline,
                  "# memcpy (every rank at once, %.1f MB each): %.1f us, %.2f GB/s; %% of it:", sel_bytes / 1e6, m_us,
                  gbs(static_cast<double>(sel_bytes), m_us));
    std::string pct = mline;
    for (size_t k = 0; k < ns; ++k) {
      comm.all_reduce(dt[k], ReduceOp::Max);
      comm.all_reduce(ct[k], ReduceOp::Max);
      if (bad[k]) rc = 1;
      if (me == 0) {
        std::string row, json;
        format_row(c, R, std::string("strata-") + moe::to_string(scheds[k]), median(dt[k]), median(ct[k]), row, json);
        write_all(out_fd, row);
        if (!o.json.empty()) {
          // The same object with the reference's figure added (the MPI peer has none).
          json.pop_back();  // '\n'
          json.pop_back();  // '}'
          char extra[96];
          std::snprintf(extra, sizeof extra, ", \"memcpy_us\": %.3f, \"memcpy_gbs\": %.4f}\n", m_us,
                        gbs(static_cast<double>(sel_bytes), m_us));
          std::ofstream f(o.json, std::ios::app);
          f << json << extra;
          if (!f.flush()) {
            print_error(kWho, "cannot append to --json " + o.json + ": " + std::strerror(errno));
            rc = 1;
          }
        }
        char b[96];
        std::snprintf(b, sizeof b, " %s dispatch %.0f%% combine %.0f%%;", moe::to_string(scheds[k]),
                      100.0 * m_us / median(dt[k]), 100.0 * m_us / median(ct[k]));
        pct += b;
      }
    }
    if (me == 0) write_all(out_fd, pct + "\n");
    report_traffic(comm, c, scheds, sent, out_fd);
  }
  comm.barrier();
  return rc;
}

}  // namespace

int bench_moe_main(int argc, char** argv) {
  MoeOptions o;
  std::vector<std::string> pass;  // what the ranks get
  for (int i = 1; i < argc;) {
    // take_option advances i past what it consumed; the flags advance it here.
    std::string v, err;
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      write_all(STDOUT_FILENO, kUsage);
      return 0;
    } else if (a == "--quick") {
      o.quick = true;
      pass.push_back(a);
      ++i;
    } else if (take_option(argc, argv, i, {"-n", "--np"}, v, err)) {
      auto n = parse_int(v);
      if (!n || *n < 1 || *n > 4096) {
        print_error(kWho, "-n needs a rank count, got '" + v + "'");
        return kUsageError;
      }
      o.nranks = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--only"}, v, err)) {
      if (v != "prefill" && v != "decode") {
        print_error(kWho, "--only takes prefill or decode, got '" + v + "'");
        return kUsageError;
      }
      o.only = v;
      pass.push_back("--only=" + v);
    } else if (take_option(argc, argv, i, {"--json"}, v, err)) {
      o.json = v;
      pass.push_back("--json=" + v);
    } else if (a == "--as-rank") {
      o.worker = true;
      ++i;
    } else if (take_option(argc, argv, i, {"--worker-fds"}, v, err)) {
      if (std::sscanf(v.c_str(), "%d,%d", &o.out_fd, &o.err_fd) != 2) {
        print_error(kWho, "bad --worker-fds");
        return kUsageError;
      }
      o.worker = true;
    } else {
      print_error(kWho, err.empty() ? "unknown option '" + a + "'" : err);
      write_all(STDERR_FILENO, kUsage);
      return kUsageError;
    }
    if (!err.empty()) {
      print_error(kWho, err);
      return kUsageError;
    }
  }
  if (o.worker) {
    try {
      return worker(o);
    } catch (const Error& e) {
      print_error(kWho, std::string(to_string(e.code())) + ": " + e.what());
      return 1;
    }
  }
  if (o.nranks == 0) {
    print_error(kWho, "-n is required");
    return kUsageError;
  }
  if (std::string why = bench::unwritable("--json", o.json); !why.empty()) {
    print_error(kWho, why);
    return kUsageError;
  }
  char exe[PATH_MAX];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    print_error(kWho, "cannot find this executable");
    return 1;
  }
  exe[len] = '\0';
  int out_fd = ::fcntl(STDOUT_FILENO, F_DUPFD, 10);
  int err_fd = ::fcntl(STDERR_FILENO, F_DUPFD, 10);
  std::vector<std::string> args = {"run",
                                   "-n",
                                   std::to_string(o.nranks),
                                   "--",
                                   exe,
                                   "bench",
                                   "moe",
                                   "--worker-fds=" + std::to_string(out_fd) + "," + std::to_string(err_fd)};
  args.insert(args.end(), pass.begin(), pass.end());
  std::vector<char*> run_argv;
  for (auto& a : args) run_argv.push_back(a.data());
  run_argv.push_back(nullptr);
  int rc = run_main(static_cast<int>(args.size()), run_argv.data());
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  return rc;
}

}  // namespace strata::cli

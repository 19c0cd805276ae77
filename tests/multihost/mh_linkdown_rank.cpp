// A rank for the link-down test: runs all_reduce in a loop, checking every result, until a
// collective fails; then says how and how long after the link went down (the harness writes
// that moment, epoch seconds, to CUT_FILE; all namespaces share the machine's clock).
//
//   mh_linkdown_rank CUT_FILE CUT_NODE
//
// Prints one verdict line, then waits 2 x the timeout before exiting with 1, so that the
// launcher stopping this host's ranks after the first exit does not hide a slower one:
//   LINKDOWN-OK   rank R: <Code> after N calls, T ms after the cut (bound B ms): ...
//   LINKDOWN-BAD  rank R: ... (wrong code, too late, wrong result, no failure at all)
// Ranks on CUT_NODE (the host that lost its link) may fail in any way; they print
// LINKDOWN-CUT.

#include <strata/strata.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace {

double epoch_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mh_linkdown_rank CUT_FILE CUT_NODE\n");
    return 2;
  }
  const std::string cut_file = argv[1];
  const int cut_node = std::atoi(argv[2]);
  const char* node_env = std::getenv("STRATA_NODE_RANK");  // set by `strata run --nnodes`
  const int node = node_env ? std::atoi(node_env) : -1;

  strata::Communicator comm = strata::init();
  const int rank = comm.rank(), n = comm.size();
  const auto timeout = comm.timeout();
  const double bound_ms = 2.0 * static_cast<double>(timeout.count());
  constexpr size_t kCount = 1 << 16;
  auto x = comm.alloc<float>(kCount);

  long calls = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(rank + 1 + (i & 7));
    try {
      comm.all_reduce(x, strata::ReduceOp::Sum);
    } catch (const strata::Error& e) {
      double at = epoch_now();
      double cut = 0;
      std::ifstream(cut_file) >> cut;
      double after_ms = cut > 0 ? (at - cut) * 1000 : -1;
      const char* code = strata::to_string(e.code());
      bool ok = cut > 0 && after_ms <= bound_ms &&
                (e.code() == strata::Code::PeerFailed || e.code() == strata::Code::Timeout);
      const char* verdict = node == cut_node ? "LINKDOWN-CUT" : ok ? "LINKDOWN-OK" : "LINKDOWN-BAD";
      std::printf("%s rank %d: %s after %ld calls, %.0f ms after the cut (bound %.0f ms): %s\n", verdict, rank, code,
                  calls, after_ms, bound_ms, e.what());
      std::fflush(stdout);
      std::this_thread::sleep_for(2 * timeout);
      return 1;
    }
    ++calls;
    // Each element is the sum over ranks of (r + 1 + (i & 7)).
    for (size_t i = 0; i < kCount; ++i) {
      float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i & 7));
      if (x[i] != want) {
        std::printf("LINKDOWN-BAD rank %d: call %ld: element %zu is %g, expected %g\n", rank, calls, i, x[i], want);
        return 1;
      }
    }
    if (std::chrono::steady_clock::now() > give_up) {
      std::printf("LINKDOWN-BAD rank %d: no collective failed within 60 s (%ld calls)\n", rank, calls);
      return 1;
    }
  }
}

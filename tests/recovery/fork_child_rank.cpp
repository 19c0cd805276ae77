// A rank for Recovery.ForkedChildOfAFailedRankDoesNotBlockItsReplacement: sums
// (rank + 1) * (step + 1) over 8 steps under recovery::run. In its original process rank 1
// forks a child that only sleeps (no exec, so it holds every socket the rank had, the heap's
// fd channel among them), writes the child's pid to DIR/1.child and dies by SIGKILL at step 3.
// Rank 0 prints "total T"; with 4 ranks T = 10 * (1 + ... + 8) = 360.
//
//   strata run --ft -n 4 fork_child_rank DIR

#include <strata/recovery.hpp>
#include <strata/strata.hpp>

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fork_child_rank DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    strata::Communicator comm = strata::init();
    const int rank = comm.rank();
    const bool replacement = strata::recovery::is_replacement();
    strata::Buffer<int64_t> value = comm.alloc<int64_t>(1);
    int64_t total = 0;
    strata::recovery::State state(comm);
    state.add("total", std::span<int64_t>(&total, 1));

    strata::recovery::StepFunctions fns;
    fns.compute = [&](uint64_t step) {
      if (!replacement && rank == 1 && step == 3) {
        pid_t child = ::fork();
        if (child == 0) {
          for (;;) ::pause();  // async-signal-safe only: the parent has threads
        }
        std::ofstream(dir + "/1.child") << child << "\n";
        strata::recovery::mark_failure(comm);
        ::raise(SIGKILL);
      }
      value[0] = static_cast<int64_t>(rank + 1) * static_cast<int64_t>(step + 1);
      comm.all_reduce(value.span(), strata::ReduceOp::Sum);
    };
    fns.apply = [&](uint64_t) { total += value[0]; };
    strata::recovery::run(comm, state, 8, fns);
    if (rank == 0) std::printf("total %lld\n", static_cast<long long>(total));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fork_child_rank: %s\n", e.what());
    return 1;
  }
}

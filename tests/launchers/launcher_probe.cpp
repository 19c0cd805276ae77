// The rank program of the launcher tests: joins the job from whatever launcher started it
// (Slurm, MPICH's mpiexec, Open MPI's mpirun, torchrun, strata run), checks the placement it
// was given against argv[1] (the expected size) and that an all_reduce over every rank adds up.
#include <strata/strata.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: launcher_probe EXPECTED_SIZE\n");
    return 2;
  }
  const int expected = std::atoi(argv[1]);
  try {
    strata::Communicator comm = strata::init();
    const int r = comm.rank(), n = comm.size();
    if (n != expected) {
      std::fprintf(stderr, "launcher_probe: rank %d sees %d ranks, expected %d\n", r, n, expected);
      return 1;
    }
    strata::Buffer<double> x = comm.alloc<double>(4096);
    for (double& v : x) v = r + 1;
    comm.all_reduce(x, strata::ReduceOp::Sum);
    const double want = n * (n + 1) / 2.0;
    for (double v : x) {
      if (v != want) {
        std::fprintf(stderr, "launcher_probe: rank %d: all_reduce gave %g, expected %g\n", r, v, want);
        return 1;
      }
    }
    comm.barrier();
    std::printf("launcher_probe: rank %d of %d (local %d) OK\n", r, n, comm.local_rank());
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launcher_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}

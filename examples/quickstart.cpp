// The C++ quick start of the README: run with `strata run -n 4 ./build/examples/quickstart`.
#include <strata/strata.hpp>

#include <cstdio>

int main() {
  strata::Communicator comm = strata::init();            // rank, size and store from the environment
  strata::Buffer<float> x = comm.alloc<float>(1 << 20);  // registered on allocation
  for (float& v : x) v = static_cast<float>(comm.rank());
  comm.all_reduce(x, strata::ReduceOp::Sum);  // in place, zero-copy

  strata::Buffer<float> all = comm.alloc<float>(4 * comm.size());
  strata::Work w = comm.all_gather_async(x.view(0, 4), all);  // nonblocking
  w.wait();                                                   // throws strata::Error on failure
  std::printf("rank %d of %d: x[0] = %g, all[4 * last] = %g\n", comm.rank(), comm.size(), x[0],
              all[4 * (comm.size() - 1)]);
  return 0;
}

// A rank for the flight-recorder tests of `strata run`: three all_reduces with every rank,
// then rank 1 skips the fourth and sleeps (alive, outside the library) while the others wait
// in it; with STRATA_TIMEOUT long, the job is stuck until someone asks why.

#include <unistd.h>

#include <cstdio>

#include <strata/strata.hpp>

int main() {
  strata::Communicator c = strata::init();
  auto a = c.alloc<float>(1024);
  for (int i = 0; i < 3; ++i) c.all_reduce(a, strata::ReduceOp::Sum);
  std::printf("rank %d: before #4\n", c.rank());
  std::fflush(stdout);
  if (c.rank() == 1) {
    for (;;) ::pause();
  }
  c.all_reduce(a, strata::ReduceOp::Sum);
  return 0;
}

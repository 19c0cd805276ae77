// all_reduce one-shot against two-shot with inputs as a training step leaves them: written by
// this rank just before each call, so they sit dirty in its own cache, not in the peers'.
// `strata bench` (like nccl-tests) never rewrites its inputs between calls, which leaves a
// peer's input in the reader's cache up to about 1 MiB and flatters one-shot (every rank
// reads every input). The selector's one-shot limit (STRATA_ONESHOT_MAX_BYTES) follows this.
//
//   strata run -n 2 build/bench/fresh_inputs_bench [SIZE...]   (default 64K 256K 512K 1M)
//
// Per size and algorithm: the median over 9 repeats of the mean time of the timed calls,
// with the inputs rewritten (fresh) and unchanged (as strata bench), heap buffers, fp32 sum,
// out of place; a barrier before each call keeps the ranks in step. Rank 0 prints.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "common/parse.hpp"

namespace {

double median_us(strata::Communicator& comm, strata::Buffer<float>& in, strata::Buffer<float>& out,
                 strata::Algorithm algo, bool fresh) {
  strata::CollOptions o;
  o.algorithm = algo;
  const size_t n = in.size();
  const int iters = n * sizeof(float) >= (size_t{8} << 20) ? 10 : 200;
  std::vector<double> repeats;
  for (int rep = 0; rep < 9; ++rep) {
    double total = 0;
    for (int i = 0; i < iters; ++i) {
      if (fresh) std::fill(in.data(), in.data() + n, static_cast<float>(i + comm.rank()));
      comm.barrier();
      const auto a = std::chrono::steady_clock::now();
      comm.all_reduce(in.span(), out.span(), strata::ReduceOp::Sum, o);
      total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    repeats.push_back(total / iters);
  }
  std::sort(repeats.begin(), repeats.end());
  return repeats[repeats.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    auto v = strata::parse_size(argv[i]);
    if (!v.is_ok()) {
      std::fprintf(stderr, "fresh_inputs_bench: size '%s': %s\n", argv[i], v.status().message().c_str());
      return 2;
    }
    sizes.push_back(v.value());
  }
  if (sizes.empty()) sizes = {64 << 10, 256 << 10, 512 << 10, 1 << 20};
  strata::Communicator comm = strata::init();
  if (comm.rank() == 0) std::printf("# %-10s %-9s %12s %12s\n", "bytes", "inputs", "one-shot us", "two-shot us");
  for (size_t bytes : sizes) {
    auto in = comm.alloc<float>(bytes / sizeof(float));
    auto out = comm.alloc<float>(bytes / sizeof(float));
    for (bool fresh : {true, false}) {
      const double one = median_us(comm, in, out, strata::Algorithm::OneShot, fresh);
      const double two = median_us(comm, in, out, strata::Algorithm::TwoShot, fresh);
      if (comm.rank() == 0)
        std::printf("  %-10zu %-9s %12.2f %12.2f\n", bytes, fresh ? "fresh" : "unchanged", one, two);
    }
  }
  return 0;
}

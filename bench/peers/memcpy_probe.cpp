// What this machine copies: memcpy of a warm 256 MiB buffer (pages touched beforehand) by one
// thread alone, then by 2 threads at once (each its own source and destination), and a
// 1 MiB in-cache copy. GB/s = bytes copied / time (1e9), median of the repeats; with 2 threads
// every repeat starts them together and reports each thread's rate and their sum.
//
//   memcpy_probe [--bytes 256M] [--threads 2] [--repeats 7] [--json FILE]

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_common.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using strata::bench::median_of;

struct Pair {
  char* src = nullptr;
  char* dst = nullptr;
};

Pair make_pair(size_t bytes) {
  Pair p{static_cast<char*>(std::aligned_alloc(4096, bytes)), static_cast<char*>(std::aligned_alloc(4096, bytes))};
  if (!p.src || !p.dst) {
    std::fprintf(stderr, "memcpy_probe: cannot allocate 2 x %zu bytes\n", bytes);
    std::exit(1);
  }
  std::memset(p.src, 1, bytes);  // first touch: slow here (~10 us per page), never timed
  std::memset(p.dst, 2, bytes);
  for (int i = 0; i < 2; ++i) std::memcpy(p.dst, p.src, bytes);
  return p;
}

// `threads` threads copy at once, `repeats` times; returns the GB/s of each thread per repeat.
std::vector<std::vector<double>> run(std::vector<Pair>& pairs, int threads, size_t bytes, int repeats, int copies) {
  std::vector<std::vector<double>> gbs(static_cast<size_t>(threads), std::vector<double>(repeats));
  std::barrier sync(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      Pair& p = pairs[static_cast<size_t>(t)];
      for (int r = 0; r < repeats; ++r) {
        sync.arrive_and_wait();
        auto t0 = Clock::now();
        for (int c = 0; c < copies; ++c) std::memcpy(p.dst, p.src, bytes);
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        gbs[static_cast<size_t>(t)][static_cast<size_t>(r)] = static_cast<double>(bytes) * copies / s / 1e9;
      }
    });
  }
  for (auto& th : ts) th.join();
  return gbs;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{256} << 20;
  int threads = 2, repeats = 7;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "memcpy_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--bytes") {
      auto b = strata::bench::parse_bytes(value());
      if (!b || *b < 4096) return std::fprintf(stderr, "memcpy_probe: bad --bytes\n"), 2;
      bytes = *b;
    } else if (a == "--threads") {
      threads = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--repeats") {
      repeats = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--json") {
      json = value();
    } else {
      std::fprintf(stderr, "usage: memcpy_probe [--bytes 256M] [--threads 2] [--repeats 7] [--json FILE]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }

  std::vector<Pair> pairs;
  for (int t = 0; t < threads; ++t) pairs.push_back(make_pair(bytes));
  auto one = run(pairs, 1, bytes, repeats, 2);
  double one_gbs = median_of(one[0]);
  auto many = run(pairs, threads, bytes, repeats, 2);
  std::vector<double> per_thread, totals(static_cast<size_t>(repeats), 0.0);
  for (int t = 0; t < threads; ++t) {
    per_thread.push_back(median_of(many[static_cast<size_t>(t)]));
    for (int r = 0; r < repeats; ++r)
      totals[static_cast<size_t>(r)] += many[static_cast<size_t>(t)][static_cast<size_t>(r)];
  }
  double total = median_of(totals);
  double mean_per_thread = total / threads;

  size_t small = size_t{1} << 20;
  std::vector<Pair> cache{make_pair(small)};
  auto hot = run(cache, 1, small, repeats, 200);
  double hot_gbs = median_of(hot[0]);

  std::printf("# memcpy probe: %s buffers, warm pages, GB/s = bytes copied / time, median of %d repeats\n",
              strata::bench::human_bytes(bytes).c_str(), repeats);
  std::printf("  1 thread alone              %8.2f GB/s\n", one_gbs);
  std::printf("  %d threads at once, each     ", threads);
  for (double g : per_thread) std::printf("%8.2f", g);
  std::printf(" GB/s\n  %d threads at once, total    %8.2f GB/s (%.2f per thread)\n", threads, total, mean_per_thread);
  std::printf("  1 MiB in cache, 1 thread    %8.2f GB/s\n", hot_gbs);

  if (!json.empty()) {
    std::string j = "{\n  \"format\": \"strata-bench/1\",\n  \"system\": \"memcpy\",\n  \"label\": \"memcpy\",\n";
    j += "  \"bytes\": " + std::to_string(bytes) + ",\n  \"repeats\": " + std::to_string(repeats) + ",\n";
    j += "  \"one_thread_gbs\": " + strata::bench::json_number(one_gbs) + ",\n";
    j += "  \"threads\": " + std::to_string(threads) + ",\n  \"per_thread_gbs\": [";
    for (size_t t = 0; t < per_thread.size(); ++t) j += (t ? ", " : "") + strata::bench::json_number(per_thread[t]);
    j += "],\n  \"per_thread_mean_gbs\": " + strata::bench::json_number(mean_per_thread) + ",\n";
    j += "  \"total_gbs\": " + strata::bench::json_number(total) + ",\n";
    j += "  \"in_cache_1mib_gbs\": " + strata::bench::json_number(hot_gbs) + "\n}\n";
    if (!strata::bench::write_file(json, j)) {
      std::fprintf(stderr, "memcpy_probe: cannot write %s\n", json.c_str());
      return 1;
    }
  }
  return 0;
}

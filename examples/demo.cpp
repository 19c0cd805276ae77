// `make demo`: every collective once on heap buffers, checked, with a short timing table.
// Run with `strata run -n 4 ./build/examples/demo`.

#include <strata/strata.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string name;
  size_t bytes;
  double usec;
  bool ok;
};

/// Median time of `iters` runs of fn, the maximum over ranks (what the slowest rank saw).
double time_it(strata::Communicator& comm, int iters, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  auto v = comm.alloc<double>(1);
  v[0] = t[t.size() / 2];
  comm.all_reduce(v, strata::ReduceOp::Max);
  return v[0];
}

bool all_ok(strata::Communicator& comm, bool ok) {
  auto v = comm.alloc<int32_t>(1);
  v[0] = ok ? 1 : 0;
  comm.all_reduce(v, strata::ReduceOp::Min);
  return v[0] == 1;
}

}  // namespace

int main() {
  strata::Communicator comm = strata::init();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 1 << 18;  // 1 MiB of float32 per rank
  const int iters = 10;
  std::vector<Row> rows;
  auto x = comm.alloc<float>(count);
  auto y = comm.alloc<float>(count * n);
  auto z = comm.alloc<float>(count * n);

  auto fill = [&] { std::fill(x.begin(), x.end(), static_cast<float>(me + 1)); };
  const float sum = static_cast<float>(n * (n + 1) / 2);

  {  // all_reduce: sum of 1..n everywhere
    double us = time_it(comm, iters, [&] {
      fill();
      comm.all_reduce(x, strata::ReduceOp::Sum);
    });
    rows.push_back({"all_reduce", count * 4, us, all_ok(comm, x[0] == sum && x[count - 1] == sum)});
  }
  {
    double us = time_it(comm, iters, [&] {
      fill();
      comm.reduce(x, y.view(0, count), strata::ReduceOp::Max, 0);
    });
    rows.push_back({"reduce", count * 4, us, all_ok(comm, me != 0 || y[count / 2] == static_cast<float>(n))});
  }
  {
    double us = time_it(comm, iters, [&] {
      std::fill(x.begin(), x.end(), me == 1 % n ? 42.0f : 0.0f);
      comm.broadcast(x, 1 % n);
    });
    rows.push_back({"broadcast", count * 4, us, all_ok(comm, x[7] == 42.0f)});
  }
  {
    double us = time_it(comm, iters, [&] {
      fill();
      comm.all_gather(x, y);
    });
    bool ok = true;
    for (int r = 0; r < n; ++r) ok &= y[r * count + 5] == static_cast<float>(r + 1);
    rows.push_back({"all_gather", count * 4 * n, us, all_ok(comm, ok)});
  }
  {
    std::vector<size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = count - 100 * r;
    double us = time_it(comm, iters, [&] {
      fill();
      comm.all_gather_v(x.data(), y.data(), counts.data(), strata::DataType::Float32);
    });
    rows.push_back({"all_gather_v", count * 4 * n, us, all_ok(comm, y[counts[0]] == 2.0f || n == 1)});
  }
  {
    double us = time_it(comm, iters, [&] {
      std::fill(y.begin(), y.end(), 1.0f);
      comm.reduce_scatter(y, x, strata::ReduceOp::Sum);
    });
    rows.push_back({"reduce_scatter", count * 4 * n, us, all_ok(comm, x[9] == static_cast<float>(n))});
  }
  {
    std::vector<size_t> counts(n, count);
    double us = time_it(comm, iters, [&] {
      std::fill(y.begin(), y.end(), 2.0f);
      comm.reduce_scatter_v(y.data(), x.data(), counts.data(), strata::DataType::Float32, strata::ReduceOp::Sum);
    });
    rows.push_back({"reduce_scatter_v", count * 4 * n, us, all_ok(comm, x[9] == 2.0f * n)});
  }
  {
    double us = time_it(comm, iters, [&] {
      for (int j = 0; j < n; ++j)
        std::fill(y.data() + j * count, y.data() + (j + 1) * count, static_cast<float>(me * 100 + j));
      comm.all_to_all(y, z);
    });
    bool ok = true;
    for (int j = 0; j < n; ++j) ok &= z[j * count + 1] == static_cast<float>(j * 100 + me);
    rows.push_back({"all_to_all", count * 4 * n, us, all_ok(comm, ok)});
  }
  {
    std::vector<size_t> sc(n, count / 2), sd(n), rc(n, count / 2), rd(n);
    for (int j = 0; j < n; ++j) sd[j] = rd[j] = j * count;
    double us = time_it(comm, iters, [&] {
      for (int j = 0; j < n; ++j)
        std::fill(y.data() + j * count, y.data() + (j + 1) * count, static_cast<float>(me * 100 + j));
      comm.all_to_all_v(y.data(), sc.data(), sd.data(), z.data(), rc.data(), rd.data(), strata::DataType::Float32);
    });
    bool ok = true;
    for (int j = 0; j < n; ++j) ok &= z[j * count + 3] == static_cast<float>(j * 100 + me);
    rows.push_back({"all_to_all_v", count * 2 * n, us, all_ok(comm, ok)});
  }
  {
    double us = time_it(comm, iters, [&] {
      fill();
      comm.gather(x, y, 0);
    });
    rows.push_back({"gather", count * 4 * n, us, all_ok(comm, me != 0 || y[(n - 1) * count] == static_cast<float>(n))});
  }
  {
    double us = time_it(comm, iters, [&] {
      if (me == 0)
        for (int j = 0; j < n; ++j) std::fill(y.data() + j * count, y.data() + (j + 1) * count, static_cast<float>(j));
      comm.scatter(y, x, 0);
    });
    rows.push_back({"scatter", count * 4 * n, us, all_ok(comm, x[11] == static_cast<float>(me))});
  }
  {
    double us = time_it(comm, iters, [&] { comm.barrier(); });
    rows.push_back({"barrier", 0, us, true});
  }
  {
    auto buf = comm.alloc<float>(count);
    double us = time_it(comm, iters, [&] {
      std::fill(x.begin(), x.end(), static_cast<float>(me));
      strata::Work s = comm.send_async(x, (me + 1) % n);
      comm.recv(buf, (me + n - 1) % n);
      s.wait();
    });
    rows.push_back({"send/recv ring", count * 4, us, all_ok(comm, buf[3] == static_cast<float>((me + n - 1) % n))});
  }
  {  // small all_reduce: latency path (one-shot)
    auto s = comm.alloc<float>(256);
    double us = time_it(comm, 200, [&] { comm.all_reduce(s, strata::ReduceOp::Sum); });
    rows.push_back({"all_reduce (1 KiB)", 1024, us, true});
  }
  strata::Stats st = comm.stats();

  if (me == 0) {
    std::printf("\nStrata demo: %d ranks, heap buffers (registered on allocation)\n\n", n);
    std::printf("%-20s %12s %12s %10s  %s\n", "collective", "bytes", "time (us)", "GB/s", "ok");
    bool all = true;
    for (auto& r : rows) {
      double gbs = r.usec > 0 ? r.bytes / r.usec / 1e3 : 0;
      std::printf("%-20s %12zu %12.1f %10.2f  %s\n", r.name.c_str(), r.bytes, r.usec, gbs, r.ok ? "ok" : "FAILED");
      all &= r.ok;
    }
    std::printf("\nbytes staged through internal buffers: %llu%s; moved directly between ranks' buffers: %llu\n",
                static_cast<unsigned long long>(st.staged_bytes), st.staged_bytes ? "" : " (zero-copy)",
                static_cast<unsigned long long>(st.direct_bytes));
    std::printf("%s\n", all ? "all collectives correct" : "SOME COLLECTIVES FAILED");
    return all ? 0 : 1;
  }
  return 0;
}

// One rank of a multi-host test job. Runs the collective matrix (or a fault scenario) through
// the public API, checks every result against a reference computed locally and exits
// non-zero with a message naming the rank, the operation, the index and both values.
//
// Placement comes from the environment like any Strata program (STRATA_RANK,
// STRATA_WORLD_SIZE, STRATA_STORE, STRATA_JOB_ID, STRATA_HOST_ID, STRATA_TIMEOUT, ...), so
// the same binary runs under tests/multihost/multihost_test.cpp (hosts faked with
// STRATA_HOST_ID), under `strata run`, or one agent per network namespace.
//
//   mh_rank [--large N] [--quick]   the matrix (all collectives, in and out of place,
//                                   counts 0 1 7 1031 N; all dtypes for all_reduce/all_gather,
//                                   every op for float32), p2p ring, split across hosts,
//                                   mismatch detection
//   mh_rank --fault VICTIM [--iters K] [--stop]
//                                   all_reduce loop; rank VICTIM SIGKILLs (--stop: SIGSTOPs)
//                                   itself after K iterations; the others must fail with
//                                   PeerFailed or Timeout within 2x STRATA_TIMEOUT (exit 0),
//                                   else exit 3. A stopped victim is left for the caller
//                                   to kill.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "common/elements.hpp"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

const DataType kAllTypes[] = {DataType::Int8,    DataType::UInt8,  DataType::Int32,   DataType::UInt32,
                              DataType::Int64,   DataType::UInt64, DataType::Float16, DataType::BFloat16,
                              DataType::Float32, DataType::Float64};
const ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};

size_t esize(DataType t) { return dtype_size(t); }
void put(DataType t, void* base, size_t i, double v) { test::store_element(t, base, i, v); }
double get(DataType t, const void* base, size_t i) { return test::load_element(t, base, i); }

/// Input of rank r at element i. Small non-negative integers: every reduction of up to 16
/// ranks is exact in every type (products stay within 2^16, sums within 200).
double val(int r, size_t i, ReduceOp op = ReduceOp::Sum) {
  if (op == ReduceOp::Prod) return 1 + static_cast<double>((r + i) % 2);
  return static_cast<double>((r * 3 + i * 7) % 11);
}

double fold(ReduceOp op, int n, const std::function<double(int)>& v) {
  double a = v(0);
  for (int r = 1; r < n; ++r) {
    double b = v(r);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: a += b; break;
      case ReduceOp::Prod: a *= b; break;
      case ReduceOp::Min: a = std::min(a, b); break;
      case ReduceOp::Max: a = std::max(a, b); break;
      // Bitwise ops on the integers the values are (whole numbers below 2^53).
      case ReduceOp::BAnd: a = static_cast<double>(static_cast<int64_t>(a) & static_cast<int64_t>(b)); break;
      case ReduceOp::BOr: a = static_cast<double>(static_cast<int64_t>(a) | static_cast<int64_t>(b)); break;
      case ReduceOp::BXor: a = static_cast<double>(static_cast<int64_t>(a) ^ static_cast<int64_t>(b)); break;
    }
  }
  return op == ReduceOp::Avg ? a / n : a;
}

/// A heap buffer (or, with external = true, plain memory) freed on scope exit.
struct Buf {
  Communicator* c = nullptr;
  void* p = nullptr;
  std::vector<char> ext;
  Buf(Communicator& comm, size_t bytes, bool external = false) : c(&comm) {
    if (external) {
      ext.resize(std::max<size_t>(bytes, 1));
      p = ext.data();
    } else {
      p = comm.alloc_bytes(std::max<size_t>(bytes, 1));
    }
  }
  ~Buf() {
    if (ext.empty()) c->free_bytes(p);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  char* at(size_t byte_off) const { return static_cast<char*>(p) + byte_off; }
};

struct Runner {
  Communicator& c;
  int n, me;
  long checks = 0;
  int failures = 0;

  std::string label(const char* what, DataType t, ReduceOp op, size_t count, bool inplace, bool ext) {
    return std::string(what) + "(dtype=" + to_string(t) + ", op=" + to_string(op) + ", count=" + std::to_string(count) +
           (inplace ? ", in place" : ", out of place") + (ext ? ", external buffers" : "") + ")";
  }

  /// Compares `count` elements of `buf` from `from` with expect(i).
  void check(const std::string& what, DataType t, const void* buf, size_t from, size_t count,
             const std::function<double(size_t)>& expect) {
    ++checks;
    for (size_t i = 0; i < count; ++i) {
      double want = expect(i);
      // The reference as stored in the type (half types round; Avg divides).
      alignas(8) char tmp[8];
      put(t, tmp, 0, want);
      double stored = get(t, tmp, 0);
      double got = get(t, buf, from + i);
      double tol = t == DataType::Float16 || t == DataType::BFloat16 ? 1e-2 * std::max(1.0, std::fabs(stored))
                   : t == DataType::Float32                          ? 1e-6 * std::max(1.0, std::fabs(stored))
                                                                     : 1e-12;
      if (std::fabs(got - stored) > tol) {
        std::fprintf(stderr, "mh_rank: rank %d: %s: index %zu: got %g, expected %g\n", me, what.c_str(), i, got,
                     stored);
        if (++failures > 20) {
          std::fprintf(stderr, "mh_rank: rank %d: too many mismatches, stopping\n", me);
          std::exit(1);
        }
        return;
      }
    }
  }

  void all_reduce(DataType t, ReduceOp op, size_t count, bool inplace, bool ext = false) {
    const size_t e = esize(t);
    Buf in(c, count * e, ext), out(c, count * e, ext);
    void* dst = inplace ? in.p : out.p;
    for (size_t i = 0; i < count; ++i) put(t, in.p, i, val(me, i, op));
    c.all_reduce(in.p, dst, count, t, op);
    check(label("all_reduce", t, op, count, inplace, ext), t, dst, 0, count,
          [&](size_t i) { return fold(op, n, [&](int r) { return val(r, i, op); }); });
  }

  void reduce(DataType t, ReduceOp op, size_t count, bool inplace) {
    const size_t e = esize(t);
    const int root = static_cast<int>(count % n);
    Buf in(c, count * e), out(c, count * e);
    void* dst = inplace ? in.p : out.p;
    for (size_t i = 0; i < count; ++i) put(t, in.p, i, val(me, i, op));
    c.reduce(in.p, dst, count, t, op, root);
    if (me == root)
      check(label("reduce", t, op, count, inplace, false), t, dst, 0, count,
            [&](size_t i) { return fold(op, n, [&](int r) { return val(r, i, op); }); });
  }

  void reduce_scatter(DataType t, ReduceOp op, size_t count, bool inplace, bool v) {
    const size_t e = esize(t);
    std::vector<size_t> counts(n), displ(n);
    for (int r = 0; r < n; ++r) counts[r] = v ? count + r % 3 : count;
    for (int r = 1; r < n; ++r) displ[r] = displ[r - 1] + counts[r - 1];
    const size_t total = displ[n - 1] + counts[n - 1];
    Buf in(c, total * e), out(c, counts[me] * e);
    for (size_t i = 0; i < total; ++i) put(t, in.p, i, val(me, i, op));
    void* dst = inplace ? in.at(displ[me] * e) : out.p;
    if (v) c.reduce_scatter_v(in.p, dst, counts.data(), t, op);
    else c.reduce_scatter(in.p, dst, count, t, op);
    check(label(v ? "reduce_scatter_v" : "reduce_scatter", t, op, count, inplace, false), t, dst, 0, counts[me],
          [&](size_t i) { return fold(op, n, [&](int r) { return val(r, displ[me] + i, op); }); });
  }

  void all_gather(DataType t, size_t count, bool inplace, bool v, bool ext = false) {
    const size_t e = esize(t);
    std::vector<size_t> counts(n), displ(n);
    for (int r = 0; r < n; ++r) counts[r] = v ? count + (r * 5) % 4 : count;
    for (int r = 1; r < n; ++r) displ[r] = displ[r - 1] + counts[r - 1];
    const size_t total = displ[n - 1] + counts[n - 1];
    Buf in(c, counts[me] * e, ext), out(c, total * e, ext);
    char* src = inplace ? out.at(displ[me] * e) : static_cast<char*>(in.p);
    for (size_t i = 0; i < counts[me]; ++i) put(t, src, i, val(me, i));
    if (v) c.all_gather_v(src, out.p, counts.data(), t);
    else c.all_gather(src, out.p, count, t);
    for (int r = 0; r < n; ++r)
      check(label(v ? "all_gather_v" : "all_gather", t, ReduceOp::Sum, count, inplace, ext) + " block " +
                std::to_string(r),
            t, out.p, displ[r], counts[r], [&](size_t i) { return val(r, i); });
  }

  void all_to_all(DataType t, size_t count, bool inplace, bool v) {
    const size_t e = esize(t);
    // v: rank a sends count + (a + b) % 3 elements to rank b (symmetric, so the receiver
    // knows it), blocks one element apart.
    auto cnt = [&](int a, int b) { return v ? count + (a + b) % 3 : count; };
    auto displs = [&](int a) {
      std::vector<size_t> d(n);
      for (int j = 1; j < n; ++j) d[j] = d[j - 1] + cnt(a, j - 1) + (v ? 1 : 0);
      return d;
    };
    std::vector<size_t> sc(n), rc(n);
    for (int j = 0; j < n; ++j) sc[j] = rc[j] = cnt(me, j);
    std::vector<size_t> sd = displs(me), rd = sd;
    const size_t total = sd[n - 1] + sc[n - 1] + 1;
    Buf in(c, total * e), out(c, total * e);
    for (size_t i = 0; i < total; ++i) put(t, in.p, i, val(me, i));
    void* dst = inplace ? in.p : out.p;
    if (v) c.all_to_all_v(in.p, sc.data(), sd.data(), dst, rc.data(), rd.data(), t);
    else c.all_to_all(in.p, dst, count, t);
    for (int j = 0; j < n; ++j) {
      // Rank j's block for us starts at j's send displacement for us.
      size_t from_j = displs(j)[me];
      check(label(v ? "all_to_all_v" : "all_to_all", t, ReduceOp::Sum, count, inplace, false) + " from rank " +
                std::to_string(j),
            t, dst, rd[j], rc[j], [&](size_t i) { return val(j, from_j + i); });
    }
  }

  void broadcast(DataType t, size_t count, bool inplace) {
    const size_t e = esize(t);
    const int root = n - 1;
    Buf in(c, count * e), out(c, count * e);
    for (size_t i = 0; i < count; ++i) put(t, in.p, i, me == root ? val(root, i) : -1);
    void* dst = inplace ? in.p : out.p;
    c.broadcast(in.p, dst, count, t, root);
    check(label("broadcast", t, ReduceOp::Sum, count, inplace, false), t, dst, 0, count,
          [&](size_t i) { return val(root, i); });
  }

  void gather_scatter(DataType t, size_t count, bool inplace) {
    const size_t e = esize(t);
    const int root = 1 % n;
    {
      Buf in(c, count * e), out(c, n * count * e);
      char* src = inplace && me == root ? out.at(root * count * e) : static_cast<char*>(in.p);
      for (size_t i = 0; i < count; ++i) put(t, src, i, val(me, i));
      c.gather(src, out.p, count, t, root);
      if (me == root)
        for (int r = 0; r < n; ++r)
          check(label("gather", t, ReduceOp::Sum, count, inplace, false) + " block " + std::to_string(r), t, out.p,
                r * count, count, [&](size_t i) { return val(r, i); });
    }
    {
      Buf in(c, n * count * e), out(c, count * e);
      for (size_t i = 0; i < n * count; ++i) put(t, in.p, i, val(me, i));
      void* dst = inplace && me == root ? in.at(root * count * e) : out.p;
      c.scatter(in.p, dst, count, t, root);
      check(label("scatter", t, ReduceOp::Sum, count, inplace, false), t, dst, 0, count,
            [&](size_t i) { return val(root, me * count + i); });
    }
  }

  void p2p_ring(size_t count) {
    const int to = (me + 1) % n, from = (me + n - 1) % n;
    std::vector<float> mine(count), got(count);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(val(me, i));
    Work w = c.send_async(mine.data(), count, DataType::Float32, to, 7);
    c.recv(got.data(), count, DataType::Float32, from, 7);
    w.wait();
    check("send/recv ring count=" + std::to_string(count), DataType::Float32, got.data(), 0, count,
          [&](size_t i) { return val(from, i); });
  }

  /// MPI's Irecv / Isend / Barrier / Waitall, first on the world communicator as its first
  /// operation (no endpoint between the hosts made yet), then on a fresh communicator each
  /// round: the sends were posted before the barrier, and a rank whose own wait is within its
  /// host (the barrier's first step) must still move them (and the connection they make), or
  /// its peer on another host, waiting for them inside its receive, never reaches the barrier.
  void p2p_then_barrier(size_t count, int rounds) {
    const int to = (me + 1) % n, from = (me + n - 1) % n;
    std::vector<float> mine(count), got(count);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(val(me, i));
    for (int k = 0; k < rounds; ++k) {
      Communicator fresh = k == 0 ? c : c.split(0, me);
      std::fill(got.begin(), got.end(), -1.0f);
      Work r = fresh.recv_async(got.data(), count, DataType::Float32, from, 3);
      Work w = fresh.send_async(mine.data(), count, DataType::Float32, to, 3);
      fresh.barrier();
      w.wait();
      r.wait();
      check("recv_async/send_async/barrier round " + std::to_string(k) + " count=" + std::to_string(count),
            DataType::Float32, got.data(), 0, count, [&](size_t i) { return val(from, i); });
      if (k > 0) fresh.destroy();
    }
  }

  void mismatch() {
    // Ranks that disagree must all fail with InvalidArgument, and the communicator must stay
    // usable. Small operations travel with their descriptor (eager), larger ones exchange
    // descriptors first: a disagreement within either form and across the two is caught.
    const size_t big = size_t{1} << 16;  // 256 KiB of float32: not eager
    Buf b(c, big * 4), o(c, big * 4 * n);
    auto expect_mismatch = [&](const char* what, const std::function<void()>& call) {
      bool threw = false;
      try {
        call();
      } catch (const Error& err) {
        threw = err.code() == Code::InvalidArgument && std::string(err.what()).find("mismatch") != std::string::npos;
        if (!threw) std::fprintf(stderr, "mh_rank: rank %d: %s gave %s\n", me, what, err.what());
      }
      ++checks;
      if (!threw) {
        std::fprintf(stderr, "mh_rank: rank %d: %s across ranks was not reported\n", me, what);
        ++failures;
      }
      all_reduce(DataType::Float32, ReduceOp::Sum, 7, false);
    };
    expect_mismatch("a count mismatch",
                    [&] { c.all_reduce(b.p, b.p, me == 0 ? 8 : 9, DataType::Float32, ReduceOp::Sum); });
    expect_mismatch("a small against a large count",
                    [&] { c.all_reduce(b.p, b.p, me == n - 1 ? 8 : big, DataType::Float32, ReduceOp::Sum); });
    // Point to point: rank 0 expects a small message where its predecessor sends a large one
    // (and the others a large one where a small one comes): the receivers fail with
    // InvalidArgument, the senders complete, and the pair stays in step.
    {
      const int to = (me + 1) % n, from = (me + n - 1) % n;
      const size_t send_count = me == 0 ? 8 : big, recv_count = me == 0 ? 8 : big;
      std::vector<float> mine(big, 1.0f), got(big);
      Work w = c.send_async(mine.data(), send_count, DataType::Float32, to, 3);
      bool threw = false;
      try {
        c.recv(got.data(), recv_count, DataType::Float32, from, 3);
      } catch (const Error& err) {
        threw = err.code() == Code::InvalidArgument && std::string(err.what()).find("mismatch") != std::string::npos;
        if (!threw) std::fprintf(stderr, "mh_rank: rank %d: p2p mismatch gave %s\n", me, err.what());
      }
      w.wait();
      const bool should = me == 0 || from == 0;
      ++checks;
      if (threw != should) {
        std::fprintf(stderr, "mh_rank: rank %d: p2p size mismatch %s\n", me,
                     should ? "was not reported" : "reported where sizes agree");
        ++failures;
      }
      p2p_ring(7);
    }
    // CollOptions::algorithm picks the pattern where the hosts allow a choice (all_reduce:
    // the same number of ranks on every host; broadcast: a host with several ranks): ranks
    // that disagree fail instead of waiting for messages that never come.
    int most = c.local_size(), least = c.local_size();
    c.all_reduce(&most, &most, 1, DataType::Int32, ReduceOp::Max);
    c.all_reduce(&least, &least, 1, DataType::Int32, ReduceOp::Min);
    const bool hosts_shared = most > 1 && n > most;
    if (hosts_shared && most == least)
      expect_mismatch("an all_reduce algorithm mismatch", [&] {
        CollOptions o;
        o.algorithm = me == 0 ? Algorithm::TwoShot : Algorithm::Auto;
        c.all_reduce(b.p, b.p, big, DataType::Float32, ReduceOp::Sum, o);
      });
    if (hosts_shared)
      expect_mismatch("a broadcast algorithm mismatch", [&] {
        CollOptions o;
        o.algorithm = me == n - 1 ? Algorithm::OneShot : Algorithm::Auto;
        c.broadcast(b.p, b.p, big, DataType::Float32, 0, o);
      });
    // Hosts that agree within but differ between them, where one host's call meets its rails
    // only (all_reduce, coll/net/run.cpp's host round) and the other's every member.
    int first_host = c.local_size();  // rank 0's host holds ranks 0 .. first_host - 1
    c.broadcast(&first_host, &first_host, 1, DataType::Int32, 0);
    expect_mismatch("an all_reduce on the first host against an all_to_all on the others", [&] {
      if (me < first_host) c.all_reduce(b.p, b.p, 4 * n, DataType::Float32, ReduceOp::Sum);
      else c.all_to_all(b.p, o.p, 4, DataType::Float32);
    });
    expect_mismatch("a large all_reduce on the first host against a large all_gather on the others", [&] {
      if (me < first_host) c.all_reduce(b.p, b.p, big, DataType::Float32, ReduceOp::Sum);
      else c.all_gather(b.p, o.p, big, DataType::Float32);
    });
    expect_mismatch("an all_gather against an all_to_all", [&] {
      if (me == 0) c.all_gather(b.p, o.p, 16, DataType::Float32);
      else c.all_to_all(o.p, b.p, 4, DataType::Float32);
    });
    // Large all_to_all(v) (not eager: descriptors first, then blocks straight into the
    // receivers' outputs): a disagreement in count, kind or form must fail every rank before
    // a block moves, so the all_reduce after each case and the exchanges below stay exact.
    const size_t q = big / n;  // floats per peer: 64 KiB and more, not eager
    expect_mismatch("a large all_to_all count mismatch",
                    [&] { c.all_to_all(o.p, b.p, me == n - 1 ? q : q - 1, DataType::Float32); });
    expect_mismatch("a large all_gather against a large all_to_all", [&] {
      if (me == 0) c.all_gather(b.p, o.p, q, DataType::Float32);
      else c.all_to_all(o.p, b.p, q, DataType::Float32);
    });
    expect_mismatch("a small all_to_all against a large one",
                    [&] { c.all_to_all(o.p, b.p, me == 1 % n ? 4 : q, DataType::Float32); });
    expect_mismatch("a large all_to_all against a large all_to_all_v", [&] {
      std::vector<size_t> sc(n, q), sd(n), rc(n, q), rd(n);
      for (int r = 0; r < n; ++r) sd[r] = rd[r] = r * q;
      if (me == 0) c.all_to_all_v(o.p, sc.data(), sd.data(), b.p, rc.data(), rd.data(), DataType::Float32);
      else c.all_to_all(o.p, b.p, q, DataType::Float32);
    });
    all_to_all(DataType::Float32, q, false, false);
    all_to_all(DataType::Float32, q, true, true);
  }

  void split() {
    // Two groups that each span hosts (even / odd world ranks), and the group of each host.
    Communicator s = c.split(me % 2, me);
    Runner sr{s, s.size(), s.rank()};
    for (size_t count : {size_t{0}, size_t{7}, size_t{1031}}) {
      sr.all_reduce(DataType::Float32, ReduceOp::Sum, count, false);
      sr.all_gather(DataType::Int32, count, true, false);
      sr.reduce_scatter(DataType::Float64, ReduceOp::Max, count, false, false);
    }
    sr.p2p_ring(100);
    checks += sr.checks;
    failures += sr.failures;
    Communicator h = c.split(0, c.local_rank() * 1000 + me);  // everyone, reordered by local rank
    Runner hr{h, h.size(), h.rank()};
    hr.all_reduce(DataType::Float32, ReduceOp::Sum, 1031, true);
    hr.all_to_all(DataType::Int32, 7, false, true);
    checks += hr.checks;
    failures += hr.failures;
  }

  void async_overlap(size_t count) {
    // Two operations in flight on the copy engine, then a blocking one behind them.
    const DataType f = DataType::Float32;
    Buf a(c, count * 4), g_in(c, count * 4), g_out(c, n * count * 4);
    for (size_t i = 0; i < count; ++i) {
      put(f, a.p, i, val(me, i));
      put(f, g_in.p, i, val(me, i + 1));
    }
    Work w1 = c.all_reduce_async(a.p, a.p, count, f, ReduceOp::Max);
    Work w2 = c.all_gather_async(g_in.p, g_out.p, count, f);
    all_reduce(DataType::Int32, ReduceOp::Sum, count, false);
    w1.wait();
    w2.wait();
    check("all_reduce_async(max)", f, a.p, 0, count,
          [&](size_t i) { return fold(ReduceOp::Max, n, [&](int r) { return val(r, i); }); });
    for (int r = 0; r < n; ++r)
      check("all_gather_async block " + std::to_string(r), f, g_out.p, r * count, count,
            [&](size_t i) { return val(r, i + 1); });
  }

  void matrix(size_t large, bool quick) {
    std::vector<size_t> counts = {0, 1, 7, 1031, large};
    for (bool ip : {false, true}) {
      for (size_t count : counts) {
        for (DataType t : kAllTypes) {
          if (quick && t != DataType::Float32 && t != DataType::BFloat16 && t != DataType::Int64) continue;
          all_reduce(t, ReduceOp::Sum, count, ip);
          all_gather(t, count, ip, false);
        }
        for (ReduceOp op : kAllOps) {
          all_reduce(DataType::Float32, op, count, ip);
          reduce(DataType::Float32, op, count, ip);
          reduce_scatter(DataType::Float32, op, count, ip, false);
        }
        const DataType f = DataType::Float32;
        reduce_scatter(f, ReduceOp::Sum, count, ip, true);
        all_gather(f, count, ip, true);
        all_to_all(f, count, ip, false);
        all_to_all(f, count, ip, true);
        broadcast(f, count, ip);
        gather_scatter(f, count, ip);
      }
    }
    // Non-heap memory goes straight through the transport too.
    all_reduce(DataType::Float32, ReduceOp::Sum, large, false, true);
    all_gather(DataType::Float32, 1031, false, false, true);
    c.barrier();
    for (size_t count : {size_t{0}, size_t{1}, size_t{1031}, large}) p2p_ring(count);
    async_overlap(1031);
    async_overlap(large);
    mismatch();
    split();
  }
};

int fault(Communicator& c, int victim, int iters, bool stop) {
  auto buf = c.alloc<float>(1 << 18);
  std::fill(buf.begin(), buf.end(), 1.0f);
  const auto timeout = c.timeout();
  auto t_op = Clock::now();
  try {
    for (int i = 0;; ++i) {
      if (c.rank() == victim && i == iters) raise(stop ? SIGSTOP : SIGKILL);
      t_op = Clock::now();
      c.all_reduce(buf, ReduceOp::Sum);
    }
  } catch (const Error& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_op).count();
    std::printf("mh_rank: rank %d: FAULT code=%s ms=%lld: %s\n", c.rank(), to_string(e.code()),
                static_cast<long long>(ms), e.what());
    bool ok = (e.code() == Code::PeerFailed || e.code() == Code::Timeout) && ms < 2 * timeout.count();
    return ok ? 0 : 3;
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t large = size_t{1} << 18;
  bool quick = false;
  int victim = -1, iters = 20;
  bool stop = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--large" && i + 1 < argc) large = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--quick") quick = true;
    else if (a == "--fault" && i + 1 < argc) victim = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--stop") stop = true;
    else {
      std::fprintf(stderr, "usage: %s [--large N] [--quick] | --fault VICTIM [--iters K] [--stop]\n", argv[0]);
      return 2;
    }
  }
  try {
    Communicator c = init();
    if (victim >= 0) return fault(c, victim, iters, stop);
    auto t0 = Clock::now();
    Runner run{c, c.size(), c.rank()};
    run.p2p_then_barrier(1000, 6);  // first: its first round is the job's first operation
    run.matrix(large, quick);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("mh_rank: rank %d of %d (local %d of %d): %ld checks, %d failed, %.2f s\n", c.rank(), c.size(),
                c.local_rank(), c.local_size(), run.checks, run.failures, s);
    return run.failures ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "mh_rank: error: %s\n", e.what());
    return 2;
  }
}

// The collective matrix: every collective × rank layout × dtype × op × count × algorithm ×
// in/out of place × heap/external buffers, checked against references computed here,
// independently of the library. Threads as ranks (Team); a team per layout lives for the
// whole binary. Layouts are one host (shared memory) or several hosts faked with host ids in
// this process (UCX over loopback TCP), so that the sanitizer runs reach the cross-host
// patterns too.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <ostream>
#include <sstream>

#include "coll/harness.hpp"
#include "common/elements.hpp"

namespace strata::test {
namespace {

enum class Kind {
  AllReduce,
  Reduce,
  Broadcast,
  AllGather,
  AllGatherV,
  ReduceScatter,
  ReduceScatterV,
  AllToAll,
  AllToAllV,
  Gather,
  Scatter
};
const char* kind_name(Kind k) {
  static const char* names[] = {"AllReduce",      "Reduce",   "Broadcast", "AllGather", "AllGatherV", "ReduceScatter",
                                "ReduceScatterV", "AllToAll", "AllToAllV", "Gather",    "Scatter"};
  return names[static_cast<int>(k)];
}
bool is_reducing(Kind k) {
  return k == Kind::AllReduce || k == Kind::Reduce || k == Kind::ReduceScatter || k == Kind::ReduceScatterV;
}

const DataType kAllTypes[] = {DataType::Int8,    DataType::UInt8,  DataType::Int32,   DataType::UInt32,
                              DataType::Int64,   DataType::UInt64, DataType::Float16, DataType::BFloat16,
                              DataType::Float32, DataType::Float64};
const ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};
const Algorithm kAllAlgorithms[] = {Algorithm::Auto, Algorithm::OneShot, Algorithm::TwoShot};
const char* algorithm_name(Algorithm a) {
  return a == Algorithm::Auto ? "auto" : a == Algorithm::OneShot ? "oneshot" : "twoshot";
}

bool quick() { return std::getenv("STRATA_TEST_QUICK") != nullptr; }

// ---- values and references, independent of the library ---------------------------------

/// The input element `i` of rank `r` (small values so sums and products stay exact).
int64_t gen(int r, size_t i, ReduceOp op, uint64_t salt) {
  uint64_t h = (static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ salt;
  h ^= h >> 29;
  if (op == ReduceOp::Prod) {
    static const int64_t prod_vals[] = {1, 2, -1, 1};
    return prod_vals[h % 4];
  }
  return static_cast<int64_t>(h % 13) - 6;
}

/// Element storage as raw bytes of the dtype, and conversions with doubles/int64.
size_t esz(DataType t) { return dtype_size(t); }
void put(DataType t, void* base, size_t i, int64_t v) {
  const bool floating =
      t == DataType::Float16 || t == DataType::BFloat16 || t == DataType::Float32 || t == DataType::Float64;
  // Floats carry quarters to exercise fractions.
  store_element(t, base, i, floating ? static_cast<double>(v) * 0.25 : static_cast<double>(v));
}
/// Reads element i as double (floats) or as the integer's value.
double get(DataType t, const void* base, size_t i) { return load_element(t, base, i); }

/// The value an input element holds once stored in dtype t (what the library sees).
double stored(DataType t, int64_t v) {
  unsigned char tmp[8];
  put(t, tmp, 0, v);
  return get(t, tmp, 0);
}

/// Integer reduction in the type's own modular arithmetic.
double int_reduce(DataType t, ReduceOp op, const std::vector<int64_t>& vals) {
  const int bits = static_cast<int>(esz(t)) * 8;
  const bool is_signed = t == DataType::Int8 || t == DataType::Int32 || t == DataType::Int64;
  auto wrap = [&](uint64_t u) -> double {
    if (bits < 64) u &= (uint64_t{1} << bits) - 1;
    if (is_signed) {
      int64_t s = (bits < 64 && (u >> (bits - 1)) & 1) ? static_cast<int64_t>(u) - (int64_t{1} << bits)
                                                       : static_cast<int64_t>(u);
      return static_cast<double>(s);
    }
    return static_cast<double>(u);
  };
  if (op == ReduceOp::Min || op == ReduceOp::Max) {
    double best = wrap(static_cast<uint64_t>(vals[0]));
    for (int64_t v : vals) {
      double x = wrap(static_cast<uint64_t>(v));
      best = op == ReduceOp::Min ? std::min(best, x) : std::max(best, x);
    }
    return best;
  }
  uint64_t acc = op == ReduceOp::Prod ? 1 : 0;
  for (int64_t v : vals) acc = op == ReduceOp::Prod ? acc * static_cast<uint64_t>(v) : acc + static_cast<uint64_t>(v);
  return wrap(acc);
}

double float_reduce(DataType t, ReduceOp op, const std::vector<int64_t>& vals) {
  double acc = stored(t, vals[0]);
  for (size_t k = 1; k < vals.size(); ++k) {
    double x = stored(t, vals[k]);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += x; break;
      case ReduceOp::Prod: acc *= x; break;
      case ReduceOp::Min: acc = std::min(acc, x); break;
      case ReduceOp::Max: acc = std::max(acc, x); break;
      default: break;  // bitwise ops are not in this matrix (semantics_test covers them)
    }
  }
  if (op == ReduceOp::Avg) acc /= static_cast<double>(vals.size());
  return acc;
}

double reference(DataType t, ReduceOp op, const std::vector<int64_t>& vals) {
  return is_floating(t) ? float_reduce(t, op, vals) : int_reduce(t, op, vals);
}

/// Tolerance for a floating result: one rounding of the type plus float32 accumulation.
double tolerance(DataType t, double ref, int n) {
  double eps = t == DataType::Float16    ? 1.0 / 1024
               : t == DataType::BFloat16 ? 1.0 / 128
               : t == DataType::Float32  ? 1.2e-7
                                         : 2.3e-16;
  return std::abs(ref) * eps * (1 + n * 1e-3) + 1e-30;
}

// ---- buffers ---------------------------------------------------------------------------

/// Where a test buffer lives: the registered heap, ordinary memory (staged), or ordinary
/// memory registered with register_buffer (single-copy CMA).
enum class Where { Heap, External, Registered };
const char* where_name(Where w) { return w == Where::Heap ? "heap" : w == Where::External ? "external" : "registered"; }

struct Mem {
  Communicator* comm = nullptr;
  void* p = nullptr;
  std::vector<unsigned char> ext;
  Registration reg;
  Mem(Communicator& c, size_t bytes, Where where) : comm(&c) {
    if (where == Where::Heap) {
      p = c.alloc_bytes(bytes ? bytes : 1);
    } else {
      ext.resize(bytes + 64);
      p = ext.data();
      if (where == Where::Registered) reg = c.register_buffer(p, bytes + 64);
    }
  }
  ~Mem() {
    if (ext.empty() && p) comm->free_bytes(p);
  }
  Mem(const Mem&) = delete;
};

struct Case {
  Kind kind;
  DataType dt;
  ReduceOp op;
  size_t count;
  bool inplace;
  Where heap;
  Algorithm algo = Algorithm::Auto;
  std::string str() const {
    std::ostringstream os;
    os << kind_name(kind) << " dtype=" << to_string(dt) << " op=" << to_string(op) << " count=" << count
       << (inplace ? " in-place" : " out-of-place") << " " << where_name(heap) << " algorithm=" << algorithm_name(algo);
    return os.str();
  }
};

/// Compares element i of `got` with `want`; on mismatch reports the rank, index and values.
bool expect_elem(const Case& cs, int rank, const void* got, size_t i, double want, int n, std::string& err) {
  double g = get(cs.dt, got, i);
  bool ok = is_floating(cs.dt) ? std::abs(g - want) <= tolerance(cs.dt, want, n) || (std::isnan(g) && std::isnan(want))
                               : g == want;
  if (!ok && err.empty()) {
    std::ostringstream os;
    os << cs.str() << ": rank " << rank << " index " << i << " got " << g << " want " << want;
    err = os.str();
  }
  return ok;
}

/// Runs one case on one rank; returns an error text (empty when correct).
std::string run_case(Communicator& c, const Case& cs) {
  const int n = c.size(), me = c.rank();
  const DataType dt = cs.dt;
  const size_t e = esz(dt), cnt = cs.count;
  const CollOptions o{.algorithm = cs.algo};
  const uint64_t salt = cnt * 131 + static_cast<uint64_t>(cs.kind) * 7 + static_cast<uint64_t>(cs.op);
  std::string err;
  std::vector<int64_t> vals(n);
  auto vals_at = [&](size_t idx) -> const std::vector<int64_t>& {
    for (int r = 0; r < n; ++r) vals[r] = gen(r, idx, cs.op, salt);
    return vals;
  };
  const int root = static_cast<int>((cnt + 1) % n);
  switch (cs.kind) {
    case Kind::AllReduce:
    case Kind::Reduce: {
      Mem in(c, cnt * e, cs.heap), out(c, cnt * e, cs.heap);
      void* src = in.p;
      void* dst = cs.inplace ? in.p : out.p;
      for (size_t i = 0; i < cnt; ++i) put(dt, src, i, gen(me, i, cs.op, salt));
      if (cs.kind == Kind::AllReduce) c.all_reduce(src, dst, cnt, dt, cs.op, o);
      else c.reduce(src, dst, cnt, dt, cs.op, root, o);
      if (cs.kind == Kind::AllReduce || me == root)
        for (size_t i = 0; i < cnt && err.empty(); ++i)
          expect_elem(cs, me, dst, i, reference(dt, cs.op, vals_at(i)), n, err);
      break;
    }
    case Kind::Broadcast: {
      Mem in(c, cnt * e, cs.heap), out(c, cnt * e, cs.heap);
      void* src = in.p;
      void* dst = cs.inplace ? in.p : out.p;
      if (me == root)
        for (size_t i = 0; i < cnt; ++i) put(dt, src, i, gen(root, i, cs.op, salt));
      c.broadcast(src, dst, cnt, dt, root, o);
      for (size_t i = 0; i < cnt && err.empty(); ++i)
        expect_elem(cs, me, dst, i, stored(dt, gen(root, i, cs.op, salt)), n, err);
      break;
    }
    case Kind::AllGather:
    case Kind::AllGatherV: {
      std::vector<size_t> counts(n, cnt), displ(n, 0);
      if (cs.kind == Kind::AllGatherV)
        for (int r = 0; r < n; ++r) counts[r] = cnt ? cnt + static_cast<size_t>(r) : static_cast<size_t>(r % 2);
      for (int r = 1; r < n; ++r) displ[r] = displ[r - 1] + counts[r - 1];
      size_t total = displ[n - 1] + counts[n - 1];
      Mem in(c, counts[me] * e, cs.heap), out(c, total * e, cs.heap);
      void* src = cs.inplace ? static_cast<char*>(out.p) + displ[me] * e : in.p;
      for (size_t i = 0; i < counts[me]; ++i) put(dt, src, i, gen(me, i, cs.op, salt));
      if (cs.kind == Kind::AllGather) c.all_gather(src, out.p, cnt, dt, o);
      else c.all_gather_v(src, out.p, counts.data(), dt, o);
      for (int r = 0; r < n && err.empty(); ++r)
        for (size_t i = 0; i < counts[r] && err.empty(); ++i)
          expect_elem(cs, me, out.p, displ[r] + i, stored(dt, gen(r, i, cs.op, salt)), n, err);
      break;
    }
    case Kind::ReduceScatter:
    case Kind::ReduceScatterV: {
      std::vector<size_t> counts(n, cnt), displ(n, 0);
      if (cs.kind == Kind::ReduceScatterV)
        for (int r = 0; r < n; ++r) counts[r] = cnt ? cnt + static_cast<size_t>(n - r) : static_cast<size_t>(r % 2);
      for (int r = 1; r < n; ++r) displ[r] = displ[r - 1] + counts[r - 1];
      size_t total = displ[n - 1] + counts[n - 1];
      Mem in(c, total * e, cs.heap), out(c, counts[me] * e, cs.heap);
      for (size_t i = 0; i < total; ++i) put(dt, in.p, i, gen(me, i, cs.op, salt));
      void* dst = cs.inplace ? static_cast<char*>(in.p) + displ[me] * e : out.p;
      if (cs.kind == Kind::ReduceScatter) c.reduce_scatter(in.p, dst, cnt, dt, cs.op, o);
      else c.reduce_scatter_v(in.p, dst, counts.data(), dt, cs.op, o);
      for (size_t i = 0; i < counts[me] && err.empty(); ++i)
        expect_elem(cs, me, dst, i, reference(dt, cs.op, vals_at(displ[me] + i)), n, err);
      break;
    }
    case Kind::AllToAll:
    case Kind::AllToAllV: {
      // Element i of the block rank s sends to rank d encodes (s, d, i).
      auto code = [&](int s, int d, size_t i) { return gen(s * 64 + d, i, cs.op, salt); };
      std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
      size_t sp = 0, rp = 0;
      for (int j = 0; j < n; ++j) {
        sc[j] = cs.kind == Kind::AllToAll ? cnt : cnt + static_cast<size_t>((me + j) % 3);
        rc[j] = cs.kind == Kind::AllToAll ? cnt : cnt + static_cast<size_t>((j + me) % 3);
        // v: a one-element gap between blocks checks displacements (in place: same layout).
        sd[j] = sp;
        rd[j] = cs.inplace ? sp : rp;
        sp += sc[j] + (cs.kind == Kind::AllToAllV ? 1 : 0);
        rp += rc[j] + (cs.kind == Kind::AllToAllV ? 1 : 0);
      }
      size_t out_elems = cs.inplace ? sp : rp;
      Mem in(c, sp * e, cs.heap), out(c, out_elems * e, cs.heap);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < sc[j]; ++i) put(dt, in.p, sd[j] + i, code(me, j, i));
      void* dst = cs.inplace ? in.p : out.p;
      if (cs.kind == Kind::AllToAll) c.all_to_all(in.p, dst, cnt, dt, o);
      else c.all_to_all_v(in.p, sc.data(), sd.data(), dst, rc.data(), rd.data(), dt, o);
      for (int j = 0; j < n && err.empty(); ++j)
        for (size_t i = 0; i < rc[j] && err.empty(); ++i)
          expect_elem(cs, me, dst, rd[j] + i, stored(dt, code(j, me, i)), n, err);
      break;
    }
    case Kind::Gather: {
      Mem in(c, cnt * e, cs.heap), out(c, n * cnt * e, cs.heap);
      void* src = (cs.inplace && me == root) ? static_cast<char*>(out.p) + me * cnt * e : in.p;
      for (size_t i = 0; i < cnt; ++i) put(dt, src, i, gen(me, i, cs.op, salt));
      c.gather(src, out.p, cnt, dt, root, o);
      if (me == root)
        for (int r = 0; r < n && err.empty(); ++r)
          for (size_t i = 0; i < cnt && err.empty(); ++i)
            expect_elem(cs, me, out.p, r * cnt + i, stored(dt, gen(r, i, cs.op, salt)), n, err);
      break;
    }
    case Kind::Scatter: {
      Mem in(c, n * cnt * e, cs.heap), out(c, cnt * e, cs.heap);
      if (me == root)
        for (size_t i = 0; i < n * cnt; ++i) put(dt, in.p, i, gen(root, i, cs.op, salt));
      void* dst = (cs.inplace && me == root) ? static_cast<char*>(in.p) + me * cnt * e : out.p;
      c.scatter(in.p, dst, cnt, dt, root, o);
      for (size_t i = 0; i < cnt && err.empty(); ++i)
        expect_elem(cs, me, dst, i, stored(dt, gen(root, me * cnt + i, cs.op, salt)), n, err);
      break;
    }
  }
  return err;
}

void run_on_team(Team& team, const Case& cs) {
  std::mutex mu;
  std::vector<std::string> errors;
  auto failures = team.run([&](Communicator& c) {
    std::string e = run_case(c, cs);
    if (!e.empty()) {
      std::lock_guard<std::mutex> g(mu);
      errors.push_back(e);
    }
  });
  for (auto& f : failures) ADD_FAILURE() << cs.str() << " world=" << team.size() << ": " << f;
  for (auto& e : errors) ADD_FAILURE() << "world=" << team.size() << ": " << e;
}

void run_on_team(int world, const Case& cs) { run_on_team(Team::get(world), cs); }

/// Where the ranks of a team are: `hosts` hosts of `per_host` ranks each, rank r on host
/// r / per_host. One host: shared memory only; more: UCX between hosts.
struct Layout {
  int hosts;
  int per_host;
  int world() const { return hosts * per_host; }
  std::string name() const {
    return hosts == 1 ? "w" + std::to_string(per_host) : "h" + std::to_string(hosts) + "x" + std::to_string(per_host);
  }
  friend std::ostream& operator<<(std::ostream& os, const Layout& l) { return os << l.name(); }
};

using Param = std::tuple<Kind, Layout, DataType, ReduceOp, size_t, Algorithm>;

class CollMatrix : public ::testing::TestWithParam<Param> {};

TEST_P(CollMatrix, MatchesIndependentReference) {
  auto [kind, layout, dt, op, count, algo] = GetParam();
  Team& team = Team::get(layout.hosts, layout.per_host);
  if (op == ReduceOp::Avg && !is_floating(dt)) {
    // Not a reduction the library defines: every rank must refuse it, and the team stays usable.
    std::atomic<int> refused{0};
    auto failures = team.run([&](Communicator& c) {
      try {
        run_case(c, {kind, dt, op, count, false, Where::Heap, algo});
      } catch (const Error& e) {
        if (e.code() == Code::InvalidArgument) ++refused;
      }
    });
    EXPECT_TRUE(failures.empty()) << failures.front();
    EXPECT_EQ(refused.load(), team.size()) << "avg on " << to_string(dt) << " was not refused by every rank";
    return;
  }
  for (bool inplace : {false, true})
    for (Where w : {Where::Heap, Where::External, Where::Registered})
      run_on_team(team, {kind, dt, op, count, inplace, w, algo});
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  auto [kind, layout, dt, op, count, algo] = info.param;
  return std::string(kind_name(kind)) + "_" + layout.name() + "_" + to_string(dt) + "_" + to_string(op) + "_c" +
         std::to_string(count) + "_" + algorithm_name(algo);
}

const Kind kAllKinds[] = {Kind::AllReduce,  Kind::Reduce,        Kind::Broadcast,      Kind::AllGather,
                          Kind::AllGatherV, Kind::ReduceScatter, Kind::ReduceScatterV, Kind::AllToAll,
                          Kind::AllToAllV,  Kind::Gather,        Kind::Scatter};
/// The reducing collectives besides all_reduce (whose algorithm axis is wider), and the rest.
const Kind kOtherReducingKinds[] = {Kind::Reduce, Kind::ReduceScatter, Kind::ReduceScatterV};
const Kind kMovingKinds[] = {Kind::Broadcast, Kind::AllGather, Kind::AllGatherV, Kind::AllToAll,
                             Kind::AllToAllV, Kind::Gather,    Kind::Scatter};

// One host. Under Auto, all_reduce of at most 512 bytes (4 KiB past 2 ranks) is the inline
// path and the rest of these sizes one-shot or, the wider types on many ranks, two-shot
// (bytes x ranks past 16 KiB); OneShot and TwoShot force theirs at every size (two-shot also with
// fewer elements than ranks). The other collectives have one shared-memory algorithm each.
const Layout kOneHost[] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 8}};
const size_t kCounts[] = {0, 1, 7, 1031};

// Several hosts. Up to 16 KiB per message goes eager; the larger count takes the direct or
// (hosts of equal size, several ranks each) hierarchical pattern for the wider types, and
// OneShot/TwoShot ask for the direct pattern (TwoShot also turns eager all_reduce off).
// Fewer types: the transport, not the arithmetic, differs from the one-host cases.
const Layout kHosts[] = {{2, 1}, {2, 2}, {3, 2}};
const DataType kHostTypes[] = {DataType::Int8, DataType::BFloat16, DataType::Int32, DataType::Float64};
const size_t kHostCounts[] = {0, 1, 7, 1031, 5003};
const Algorithm kHostAlgorithms[] = {Algorithm::Auto, Algorithm::OneShot};

using ::testing::Combine;
using ::testing::Values;
using ::testing::ValuesIn;

INSTANTIATE_TEST_SUITE_P(OneHostAllReduce, CollMatrix,
                         Combine(Values(Kind::AllReduce), ValuesIn(kOneHost), ValuesIn(kAllTypes), ValuesIn(kAllOps),
                                 ValuesIn(kCounts), ValuesIn(kAllAlgorithms)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(OneHostReducing, CollMatrix,
                         Combine(ValuesIn(kOtherReducingKinds), ValuesIn(kOneHost), ValuesIn(kAllTypes),
                                 ValuesIn(kAllOps), ValuesIn(kCounts), Values(Algorithm::Auto)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(OneHostMoving, CollMatrix,
                         Combine(ValuesIn(kMovingKinds), ValuesIn(kOneHost), ValuesIn(kAllTypes), Values(ReduceOp::Sum),
                                 ValuesIn(kCounts), Values(Algorithm::Auto)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(HostsAllReduce, CollMatrix,
                         Combine(Values(Kind::AllReduce), ValuesIn(kHosts), ValuesIn(kHostTypes), ValuesIn(kAllOps),
                                 ValuesIn(kHostCounts), ValuesIn(kAllAlgorithms)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(HostsReducing, CollMatrix,
                         Combine(ValuesIn(kOtherReducingKinds), ValuesIn(kHosts), ValuesIn(kHostTypes),
                                 ValuesIn(kAllOps), ValuesIn(kHostCounts), ValuesIn(kHostAlgorithms)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(HostsMoving, CollMatrix,
                         Combine(ValuesIn(kMovingKinds), ValuesIn(kHosts), ValuesIn(kHostTypes), Values(ReduceOp::Sum),
                                 ValuesIn(kHostCounts), ValuesIn(kHostAlgorithms)),
                         param_name);

// Large counts: an odd count near 1M for every collective, a few types and ops.
using LargeParam = std::tuple<Kind, int>;
class CollLarge : public ::testing::TestWithParam<LargeParam> {};

TEST_P(CollLarge, OddCountNearOneMillion) {
  auto [kind, world] = GetParam();
  const size_t count = quick() ? 100003 : 1000003;
  for (bool inplace : {false, true})
    for (Where w : {Where::Heap, Where::External})
      run_on_team(world, {kind, DataType::Float32, ReduceOp::Sum, count, inplace, w});
  run_on_team(world, {kind, DataType::BFloat16, ReduceOp::Sum, count, false, Where::Heap});
  run_on_team(world, {kind, DataType::Int32, is_reducing(kind) ? ReduceOp::Max : ReduceOp::Sum, count, true,
                      Where::Registered});
}

INSTANTIATE_TEST_SUITE_P(All, CollLarge, ::testing::Combine(::testing::ValuesIn(kAllKinds), ::testing::Values(2, 3, 8)),
                         [](const ::testing::TestParamInfo<LargeParam>& info) {
                           return std::string(kind_name(std::get<0>(info.param))) + "_w" +
                                  std::to_string(std::get<1>(info.param));
                         });

// 16M elements (64 MiB of float32 per rank) for the bandwidth-bound collectives.
TEST(CollHuge, SixteenMillionElements) {
  // Sanitizer runs (STRATA_TEST_QUICK) keep the shape but not the size.
  const size_t count = quick() ? size_t{1} << 20 : size_t{16} << 20;
  run_on_team(2, {Kind::AllReduce, DataType::Float32, ReduceOp::Sum, count, true, Where::Heap});
  run_on_team(4, {Kind::AllReduce, DataType::BFloat16, ReduceOp::Sum, count, false, Where::Heap});
  run_on_team(2, {Kind::AllGather, DataType::Float32, ReduceOp::Sum, count / 2, false, Where::Heap});
  run_on_team(2, {Kind::ReduceScatter, DataType::Float32, ReduceOp::Sum, count / 2, false, Where::External});
}

}  // namespace
}  // namespace strata::test

// Fork-per-rank: collectives across real processes, and peers that die (SIGKILL) or hang
// (SIGSTOP) in the middle of a collective.

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>

#include "bootstrap/store.hpp"
#include "coll/comm_impl.hpp"
#include "coll/context_impl.hpp"
#include "coll/counts.hpp"
#include "coll/harness.hpp"
#include "common/reduce.hpp"

namespace strata::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using coll::OpKind;
using detail::CommImpl;

std::set<std::string> dev_shm() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    // Only names that could be ours: other programs on the machine use /dev/shm too.
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).find("strata") != std::string::npos) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

TEST(Forked, CollectivesAcrossProcesses) {
  auto results = run_forked(4, 10000ms, [](Communicator& c, std::string& report) {
    auto a = c.alloc<float>(1 << 20);
    std::fill(a.begin(), a.end(), static_cast<float>(c.rank() + 1));
    c.all_reduce(a, ReduceOp::Sum);
    auto g = c.alloc<int32_t>(4 * 3);
    std::vector<int32_t> mine = {c.rank(), c.rank() * 10, c.rank() * 100};
    c.all_gather(mine, g);
    if (a[12345] != 10.0f || g[3 * 3 + 2] != 300) {
      report = "wrong: " + std::to_string(a[12345]) + " " + std::to_string(g[11]);
      return 1;
    }
    // Nothing staged: heap buffers are read where they are, and the small vector's 12 bytes
    // travel in the control block (inline all_gather).
    report = "staged " + std::to_string(c.stats().staged_bytes) + " bytes";
    return c.stats().staged_bytes == 0 ? 0 : 2;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

// Registered buffers: a broadcast's root input is read by CMA, nothing staged. all_gather
// stages its input once, a round at a time while the peers read the previous one
// (coll/shm/pipe.cpp), and two-shot all_reduce, in rounds too (coll/shm/two_shot.cpp), only
// the slices peers read, and copies the peers' reduced slices out of its landing slots: both
// faster than CMA reads.
TEST(Forked, RegisteredBuffersMoveByCmaOrAreStagedOnce) {
  auto results = run_forked(3, 10000ms, [](Communicator& c, std::string& report) {
    const size_t n = 100000;
    std::vector<float> in(n, static_cast<float>(c.rank() + 1)), out(n * c.size());
    Registration r1 = c.register_buffer(in.data(), in.size() * sizeof(float));
    Registration r2 = c.register_buffer(out.data(), out.size() * sizeof(float));
    c.all_gather(in, out);
    c.all_reduce(in, ReduceOp::Sum);
    const Stats s = c.stats();
    std::vector<float> b(n, static_cast<float>(c.rank() + 10));
    Registration r3 = c.register_buffer(b.data(), b.size() * sizeof(float));
    c.broadcast(b, 1);
    const Stats s2 = c.stats();
    if (in[n - 1] != 6.0f || out[2 * n + 7] != 3.0f || out[n + 5] != 2.0f || b[n - 1] != 11.0f) {
      report = "wrong values";
      return 1;
    }
    report = "staged=" + std::to_string(s.staged_bytes) + " cma=" + std::to_string(s.cma_bytes) +
             "; broadcast: staged=" + std::to_string(s2.staged_bytes - s.staged_bytes) +
             " cma=" + std::to_string(s2.cma_bytes - s.cma_bytes);
    const size_t bytes = n * sizeof(float);
    const auto [lo, hi] = coll::balanced_slice(n, c.size(), c.rank(), sizeof(float));
    const size_t own = (hi - lo) * sizeof(float);
    return s.staged_bytes == bytes + 2 * (bytes - own) && s.cma_bytes == 0 && s2.staged_bytes == s.staged_bytes &&
                   s2.cma_bytes - s.cma_bytes == (c.rank() == 1 ? 0 : bytes)
               ? 0
               : 2;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

TEST(Forked, SmallRegisteredBuffersAreStagedNotCma) {
  // Below STRATA_CMA_REGISTERED_MIN_BYTES (256 KiB) one CMA system call costs more than the
  // staging copy (issue 19: registered 4 KiB all_reduce 5.9 us against 1.2 us staged).
  auto results = run_forked(2, 10000ms, [](Communicator& c, std::string& report) {
    const size_t n = 4096 / sizeof(float);
    std::vector<float> in(n, static_cast<float>(c.rank() + 1)), out(n * c.size());
    Registration r1 = c.register_buffer(in.data(), in.size() * sizeof(float));
    Registration r2 = c.register_buffer(out.data(), out.size() * sizeof(float));
    c.all_gather(in, out);            // peers read `in`: staged
    c.all_reduce(in, ReduceOp::Sum);  // in place, one-shot: staged
    Stats s = c.stats();
    if (in[n - 1] != 3.0f || out[n + 7] != 2.0f) {
      report = "wrong values";
      return 1;
    }
    report = "staged=" + std::to_string(s.staged_bytes) + " cma=" + std::to_string(s.cma_bytes);
    return s.staged_bytes > 0 && s.cma_bytes == 0 ? 0 : 2;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

TEST(Forked, LargeExternalBuffersMoveByCmaWithoutRegistration) {
  auto results = run_forked(2, 10000ms, [](Communicator& c, std::string& report) {
    const size_t n = (size_t{1} << 20) / sizeof(float);  // STRATA_CMA_MIN_BYTES by default
    std::vector<float> in(n, static_cast<float>(c.rank() + 1)), out(n * c.size()), small(16, 1.0f);
    c.all_gather(in, out);            // `in` staged in rounds; `out` is written by its owner
    c.all_to_all(out, out);           // in place: read by CMA, landed in a temporary
    c.all_reduce(in, ReduceOp::Sum);  // in place, two-shot: only the slices peers read are staged
    c.broadcast(small, 0);            // small: the root's input is staged
    Stats s = c.stats();
    // out after all_to_all: block j holds rank j's block c.rank() of the all_gather result,
    // i.e. rank c.rank()'s input.
    if (in[n - 1] != 3.0f || out[7] != static_cast<float>(c.rank() + 1) ||
        out[n + 7] != static_cast<float>(c.rank() + 1)) {
      report = "wrong values";
      return 1;
    }
    report = "staged=" + std::to_string(s.staged_bytes) + " cma=" + std::to_string(s.cma_bytes);
    // all_gather stages its input once; all_reduce the peer's input slice and its own reduced
    // slice (the buffer once: faster than CMA for both); of the broadcast only the root's
    // input is read.
    const size_t staged = 2 * n * sizeof(float) + (c.rank() == 0 ? small.size() * sizeof(float) : 0);
    return s.staged_bytes == staged && s.cma_bytes > 0 ? 0 : 2;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

/// Whether `routes` (one letter per call: 's' the first way, 'c' the second) is how
/// TimedChoice runs a size's first calls: both ways in pairs (s s c c s s ...) for 2 x kTrials
/// calls, or fewer (at least 2 x kEarlyTrials) when the calls were long and one way clearly
/// slower; then one way for good.
bool tried_in_pairs_then_kept_one(const std::string& routes) {
  const size_t most = 2 * CommImpl::Trials::kTrials, least = 2 * CommImpl::Trials::kEarlyTrials;
  for (size_t p = least; p <= most && p <= routes.size(); ++p) {
    bool ok = true;
    for (size_t k = 0; k < p && ok; ++k) ok = routes[k] == ((k / 2) % 2 ? 'c' : 's');
    for (size_t k = p; k < routes.size() && ok; ++k) ok = routes[k] == routes[p];
    if (ok) return true;
  }
  return false;
}

// all_to_all, all_gather and reduce_scatter out of place let peers read an external input
// either way, staged in rounds or by CMA (a CMA read is a block's only copy where staging
// makes two): the first calls of a size try both, kTrials each in pairs, then the faster
// stays; STRATA_{ALL_TO_ALL,ALL_GATHER,REDUCE_SCATTER}_CMA forces one. Every call's data is
// checked, whichever way it went.
void external_input_tries_staged_and_cma(OpKind kind) {
  auto results = run_forked(3, 20000ms, [kind](Communicator& c, std::string& report) {
    const int n = c.size(), me = c.rank();
    const int trials = 2 * CommImpl::Trials::kTrials;
    auto value = [](int from, int to, size_t i, int call) {
      return static_cast<float>(from * 100 + to * 10 + call) + static_cast<float>(i % 7);
    };
    // The input holds one block of `q` floats per rank (all_gather: one block in all).
    const size_t in_blocks = kind == OpKind::AllGather ? 1 : static_cast<size_t>(n);
    const size_t out_blocks = kind == OpKind::ReduceScatter ? 1 : static_cast<size_t>(n);
    // One call; returns the route this rank's input took: 'c' (read by CMA), 's' (staged).
    // While every rank tries the same way (the first 2 x kTrials calls of a size), what it
    // read by CMA tells the peers' route too; after them each rank keeps what it measured,
    // so the ranks may differ.
    auto call = [&](std::vector<float>& in, std::vector<float>& out, size_t q, int k, std::string& err) {
      for (size_t b = 0; b < in_blocks; ++b)
        for (size_t i = 0; i < q; ++i) in[b * q + i] = value(me, static_cast<int>(b), i, k);
      const Stats s0 = c.stats();
      if (kind == OpKind::AllToAll) c.all_to_all(in.data(), out.data(), q, DataType::Float32);
      else if (kind == OpKind::AllGather) c.all_gather(in.data(), out.data(), q, DataType::Float32);
      else c.reduce_scatter(in.data(), out.data(), q, DataType::Float32, ReduceOp::Sum);
      const Stats s1 = c.stats();
      for (size_t b = 0; b < out_blocks && err.empty(); ++b)
        for (size_t i = 0; i < q; i += 4099) {
          float want = 0;
          if (kind == OpKind::AllToAll) want = value(static_cast<int>(b), me, i, k);
          else if (kind == OpKind::AllGather) want = value(static_cast<int>(b), 0, i, k);
          else
            for (int r = 0; r < n; ++r) want += value(r, me, i, k);
          if (out[b * q + i] != want) err = "call " + std::to_string(k) + ": wrong block " + std::to_string(b);
        }
      const uint64_t cma = s1.cma_bytes - s0.cma_bytes, staged = s1.staged_bytes - s0.staged_bytes;
      const char route = staged == 0 ? 'c' : 's';
      // Every rank surely still tries until each way had kEarlyTrials; from then one that
      // times long calls may decide alone (TimedChoice), and the ranks' ways may differ.
      const bool trial = k < 2 * CommImpl::Trials::kEarlyTrials || k >= 100;
      if (trial && cma != (route == 'c' ? (n - 1) * q * sizeof(float) : 0) && err.empty())
        err = "call " + std::to_string(k) + ": cma=" + std::to_string(cma) + " staged=" + std::to_string(staged);
      return route;
    };
    std::string routes, err;
    // Unregistered, blocks of 512 KiB: trials, then the choice.
    const size_t q = (size_t{512} << 10) / sizeof(float);
    std::vector<float> in(q * in_blocks), out(q * out_blocks);
    for (int k = 0; k < trials + 3; ++k) routes += call(in, out, q, k, err);
    if (!err.empty()) return report = err, 1;
    report = "routes " + routes;
    if (!tried_in_pairs_then_kept_one(routes)) return 2;
    // Forced, registered, blocks of 32 KiB.
    const size_t q2 = (size_t{32} << 10) / sizeof(float);
    std::vector<float> in2(q2 * in_blocks), out2(q2 * out_blocks);
    Registration reg = c.register_buffer(in2.data(), in2.size() * sizeof(float));
    Env& env = c.impl()->ctx->env;
    int& mode = kind == OpKind::AllToAll    ? env.all_to_all_cma
                : kind == OpKind::AllGather ? env.all_gather_cma
                                            : env.reduce_scatter_cma;
    std::string forced;
    mode = 1;
    forced += call(in2, out2, q2, 100, err);
    mode = 0;
    forced += call(in2, out2, q2, 101, err);
    mode = -1;
    if (!err.empty()) return report = err, 1;
    report += "; forced cma, staged: " + forced;
    return forced == "cs" ? 0 : 2;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

TEST(Forked, ExternalAllToAllTriesStagedAndCmaThenKeepsOne) { external_input_tries_staged_and_cma(OpKind::AllToAll); }
TEST(Forked, ExternalAllGatherTriesStagedAndCmaThenKeepsOne) { external_input_tries_staged_and_cma(OpKind::AllGather); }
TEST(Forked, ExternalReduceScatterTriesStagedAndCmaThenKeepsOne) {
  external_input_tries_staged_and_cma(OpKind::ReduceScatter);
}

// The external input and output of an out-of-place two-shot all_reduce are staged in heap
// slots and landing slots, or read and written by the peers with CMA (coll/shm/run.cpp,
// two_shot.cpp): each rank chooses for its own buffers, so the two meet in one call. Three
// ranks, 300,007 floats (slices of several rounds, the last partial): forced per rank (rank r
// takes CMA when bit r of the pattern is set), every element checked, and what each rank moved
// by CMA is its slice twice (read from the input, written into the output) per peer that took
// CMA; then, on their own, the first 2 x kTrials calls of a size try both ways in pairs.
TEST(Forked, ExternalAllReduceBuffersTakeHeapSlotsOrCma) {
  auto results = run_forked(3, 30000ms, [](Communicator& c, std::string& report) {
    const int n = c.size(), me = c.rank();
    const size_t count = 300007;
    auto value = [](int r, size_t i, int k) { return static_cast<float>((r + 1) * 3 + static_cast<int>(i % 509) + k); };
    std::vector<float> in(count), out(count);
    const auto [lo, hi] = coll::balanced_slice(count, n, me, sizeof(float));
    const size_t own = (hi - lo) * sizeof(float);
    const CollOptions two_shot{.algorithm = Algorithm::TwoShot};
    // One call; returns how many peers took CMA, as seen from what this rank moved by CMA.
    auto call = [&](int k, std::string& err) -> size_t {
      for (size_t i = 0; i < count; ++i) in[i] = value(me, i, k);
      std::fill(out.begin(), out.end(), -1.0f);
      const Stats s0 = c.stats();
      c.all_reduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum, two_shot);
      const uint64_t cma = c.stats().cma_bytes - s0.cma_bytes;
      for (size_t i = 0; i < count && err.empty(); ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += value(r, i, k);
        if (out[i] != want) err = "call " + std::to_string(k) + ": element " + std::to_string(i) + " wrong";
      }
      if (cma % (2 * own) != 0 && err.empty()) err = "call " + std::to_string(k) + ": cma=" + std::to_string(cma);
      return cma / (2 * own);
    };
    Env& env = c.impl()->ctx->env;
    std::string err;
    for (int pattern = 0; pattern < 8; ++pattern) {
      env.all_reduce_cma = (pattern >> me) & 1;
      size_t want = 0;
      for (int r = 0; r < n; ++r) want += r != me && ((pattern >> r) & 1);
      const size_t got = call(pattern, err);
      if (err.empty() && got != want)
        err = "pattern " + std::to_string(pattern) + ": reached " + std::to_string(got) + " peers by CMA, not " +
              std::to_string(want);
    }
    if (!err.empty()) return report = err, 1;
    env.all_reduce_cma = -1;
    const int trials = CommImpl::Trials::kTrials;
    std::string routes;
    for (int k = 0; k < 2 * trials + 3; ++k) routes += call(100 + k, err) ? 'c' : 's';
    if (!err.empty()) return report = err, 1;
    report = "routes " + routes;
    return tried_in_pairs_then_kept_one(routes) ? 0 : 2;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

// A reduction whose peer inputs are read by CMA works in pieces of kCmaChunkBytes; from
// kernels::kStreamMinBytes of result every piece is written around the cache, as one call
// over the whole result would be. Results past that size (each rank's block or slice),
// ending mid-piece and mid-vector, must be exact in every element.
TEST(Forked, CmaReductionsOfLargeResultsAreExactInEveryElement) {
  auto results = run_forked(3, 30000ms, [](Communicator& c, std::string& report) {
    const int n = c.size(), me = c.rank();
    // Each rank's block (reduce_scatter) and slice (all_reduce) just past the threshold.
    const size_t q = kernels::kStreamMinBytes / sizeof(float) + 4099;
    auto value = [](int r, size_t i) { return static_cast<float>(r + 1) * 0.5f + static_cast<float>(i % 1021); };
    std::vector<float> in(q * static_cast<size_t>(n)), out(q);
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(me, i);
    Registration reg = c.register_buffer(in.data(), in.size() * sizeof(float));
    c.impl()->ctx->env.reduce_scatter_cma = 1;
    const Stats s0 = c.stats();
    c.reduce_scatter(in.data(), out.data(), q, DataType::Float32, ReduceOp::Sum);
    if (c.stats().cma_bytes == s0.cma_bytes) return report = "reduce_scatter read nothing by CMA", 2;
    for (size_t i = 0; i < q; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, static_cast<size_t>(me) * q + i);
      if (out[i] != want) return report = "reduce_scatter: element " + std::to_string(i) + " wrong", 1;
    }
    // reduce: every rank reduces its slice of the registered inputs into the root's output.
    std::vector<float> sum(me == 0 ? in.size() : 0);
    const Stats s1 = c.stats();
    c.reduce(in.data(), sum.data(), in.size(), DataType::Float32, ReduceOp::Sum, 0);
    if (c.stats().cma_bytes == s1.cma_bytes) return report = "reduce read nothing by CMA", 2;
    for (size_t i = 0; i < sum.size(); ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, i);
      if (sum[i] != want) return report = "reduce: element " + std::to_string(i) + " wrong", 1;
    }
    return 0;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

/// Ranks loop on large all_reduces; the parent signals rank 1 mid-way. The others must fail
/// with PeerFailed or Timeout within twice the timeout and exit cleanly.
void peer_dies_or_hangs(int sig, const std::vector<Code>& allowed) {
  const auto timeout = 1000ms;
  auto before = dev_shm();
  auto results = run_forked(
      3, timeout,
      [&](Communicator& c, std::string& report) {
        auto a = c.alloc<float>(1 << 20);
        auto t_fail = Clock::now();
        try {
          for (int i = 0; i < 1000000; ++i) {
            t_fail = Clock::now();
            c.all_reduce(a, ReduceOp::Sum);
          }
        } catch (const Error& e) {
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_fail).count();
          report = std::to_string(static_cast<int>(e.code())) + " " + std::to_string(ms) + " " + e.what();
          return 0;
        }
        report = "finished without error";
        return 1;
      },
      [&](const std::vector<int>& pids) {
        std::this_thread::sleep_for(300ms);  // well inside the loop
        kill(pids[1], sig);
        if (sig == SIGSTOP) {
          std::this_thread::sleep_for(timeout * 3);
          kill(pids[1], SIGKILL);
        }
      });
  for (int r : {0, 2}) {
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
    int code = -1;
    long ms = -1;
    ASSERT_EQ(sscanf(results[r].output.c_str(), "%d %ld", &code, &ms), 2) << results[r].output;
    bool ok = false;
    for (Code a : allowed) ok |= code == static_cast<int>(a);
    EXPECT_TRUE(ok) << "rank " << r << ": " << results[r].output;
    EXPECT_LT(ms, 2 * timeout.count()) << "rank " << r << " noticed late: " << results[r].output;
    EXPECT_NE(results[r].output.find("rank 1"), std::string::npos) << results[r].output;
  }
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(dev_shm(), before) << "something was left in /dev/shm";
}

TEST(Faults, PeerSigkilledMidCollective) { peer_dies_or_hangs(SIGKILL, {Code::PeerFailed, Code::Timeout}); }

TEST(Faults, PeerSigstoppedMidCollective) { peer_dies_or_hangs(SIGSTOP, {Code::Timeout, Code::PeerFailed}); }

/// A rank waiting in init() for a peer that never comes, whose store then goes away: init
/// fails at its own deadline, not after the store client's much longer reconnect timeout
/// (the wait's hint requests between its slices were not bounded by it).
TEST(Faults, InitEndsAtItsDeadlineWhenTheStoreGoesAway) {
  auto server = bootstrap::StoreServer::start("127.0.0.1", 0, "gone-token");
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  InitOptions o;
  o.rank = 1;
  o.size = 2;
  o.store = "127.0.0.1:" + std::to_string((*server)->port());
  o.token = "gone-token";
  o.job_id = "store-gone-" + std::to_string(::getpid());
  o.timeout = 3s;
  std::string error;
  const auto start = Clock::now();
  std::thread t([&] {
    try {
      Communicator c = strata::init(o);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(1s);
  (*server)->stop();
  t.join();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  EXPECT_NE(error.find("rank 1 waiting for"), std::string::npos) << error;
  EXPECT_LT(took, 8000) << "init's 3 s deadline was stretched: " << error;
}

}  // namespace
}  // namespace strata::test

namespace strata::test {
namespace {

/// Issue 20 item 1: rank 1 skips the fifth all_reduce and stays alive (outside the library).
/// The others time out; their errors name rank 1, the operation number, and what rank 1 did
/// last (read from its control block: its flight recorder's current and last operation).
TEST(FlightRecorder, TimeoutNamesTheMissingRankAndItsLastOperation) {
  // Joining and the first operations get time to spare on a loaded machine; the operation
  // that waits for rank 1 has a short deadline of its own.
  const auto timeout = 800ms;
  CollOptions short_wait;
  short_wait.timeout = timeout;
  auto results = run_forked(3, 4 * timeout, [&](Communicator& c, std::string& report) {
    auto a = c.alloc<float>(1024);
    for (int i = 0; i < 4; ++i) c.all_reduce(a, ReduceOp::Sum);
    if (c.rank() == 1) {
      std::this_thread::sleep_for(timeout * 3);  // skipped #5, alive
      report = "slept";
      return 0;
    }
    try {
      c.all_reduce(a, ReduceOp::Sum, short_wait);
      report = "all_reduce #5 finished without rank 1";
      return 1;
    } catch (const Error& e) {
      report = std::to_string(static_cast<int>(e.code())) + " " + e.what();
      // Stay until the other waiter has timed out too (an exit would be its PeerFailed).
      std::this_thread::sleep_for(timeout * 2);
      return 0;
    }
  });
  ASSERT_EQ(results[1].exit_code, 0) << results[1].output;
  for (int r : {0, 2}) {
    const std::string& m = results[r].output;
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << m;
    EXPECT_EQ(m.rfind(std::to_string(static_cast<int>(Code::Timeout)) + " ", 0), 0u) << m;
    EXPECT_NE(m.find("timed out on rank " + std::to_string(r) + " waiting for rank 1 (operation #5"), std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 1's last operation: #4 all_reduce float32 x1024 done"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing pending"), std::string::npos) << m;
  }
}

/// The peer is not idle but inside another operation: a receive from a rank that never
/// sends. The error says what it is in, and since when.
TEST(FlightRecorder, TimeoutNamesThePeersPendingOperation) {
  const auto timeout = 800ms;
  CollOptions short_wait;
  short_wait.timeout = timeout;
  auto results = run_forked(3, 4 * timeout, [&](Communicator& c, std::string& report) {
    auto a = c.alloc<float>(16);
    c.all_reduce(a, ReduceOp::Sum);
    if (c.rank() == 1) {
      std::vector<int32_t> buf(4);
      CollOptions o;
      o.timeout = timeout * 3;  // still waiting when the others give up
      try {
        c.recv(buf.data(), buf.size(), DataType::Int32, 2, 7, o);
      } catch (const Error&) {
      }
      report = "recv over";
      return 0;
    }
    try {
      c.all_reduce(a, ReduceOp::Sum, short_wait);
      report = "finished";
      return 1;
    } catch (const Error& e) {
      report = e.what();
      std::this_thread::sleep_for(timeout * 2);  // as above: no exit while the other waits
      return 0;
    }
  });
  for (int r : {0, 2}) {
    const std::string& m = results[r].output;
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("waiting for rank 1 (operation #2"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 is in #1 recv int32 x4 from rank 2, started "), std::string::npos) << m;
    EXPECT_NE(m.find("(before it: #1 all_reduce float32 x16 done)"), std::string::npos) << m;
  }
}

/// abort() writes the rank's recent operations to stderr (a few lines) before it fails them.
TEST(FlightRecorder, AbortDumpsTheRecorderToStderr) {
  auto results = run_forked(2, 5000ms, [&](Communicator& c, std::string& report) {
    auto a = c.alloc<float>(16);
    c.all_reduce(a, ReduceOp::Sum);
    c.barrier();
    if (c.rank() == 1) return 0;
    FILE* f = std::tmpfile();
    if (!f) return 2;
    const int saved = ::dup(STDERR_FILENO);
    ::dup2(::fileno(f), STDERR_FILENO);
    c.abort();
    ::dup2(saved, STDERR_FILENO);
    std::rewind(f);
    char buf[4096];
    report.assign(buf, std::fread(buf, 1, sizeof buf, f));
    std::fclose(f);
    return 0;
  });
  ASSERT_EQ(results[0].exit_code, 0) << results[0].output;
  const std::string& m = results[0].output;
  EXPECT_NE(
      m.find("strata: rank 0 aborted; flight recorder of communicator 'world' (rank 0 of 2), last 2 operation(s):"),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("#1 all_reduce float32 x16 done"), std::string::npos) << m;
  EXPECT_NE(m.find("#2 barrier done"), std::string::npos) << m;
}

}  // namespace
}  // namespace strata::test

// Masking a failed expert rank (Config::mask_failed_ranks, issue 17 item 2): 4 processes, rank 2
// SIGKILLs itself before a dispatch or between dispatch and combine. The survivors' calls must
// complete without error, the combined rows must equal a reference computed here with rank 2's
// experts dropped (renormalised or not), the dropped selections must be reported per token, and
// ordinary collectives must fail (PeerFailed) so that the application knows to recover().

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <strata/moe.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "coll/harness.hpp"

namespace strata::test {
namespace {

using moe::Schedule;
using namespace std::chrono_literals;

constexpr int kR = 4, kE = 8, kK = 3, kL = kE / kR, kDead = 2;
constexpr size_t kH = 32, kM = 24;

struct Inputs {
  size_t T = 0;
  std::vector<float> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
};

/// Reproducible per (rank, call); some -1 selections, and many on rank 2's experts.
Inputs make_inputs(int rank, int call) {
  std::mt19937_64 rng(static_cast<uint64_t>(rank) * 7919u + static_cast<uint64_t>(call) * 104729u + 3u);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), wd(0.05f, 1.0f), u01(0.0f, 1.0f);
  Inputs in;
  in.T = kM - static_cast<size_t>(rank + call) % 4;
  in.x.resize(in.T * kH);
  for (auto& v : in.x) v = val(rng);
  in.idx.resize(in.T * kK);
  in.w.resize(in.T * kK);
  std::vector<int64_t> perm(kE);
  for (size_t t = 0; t < in.T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < kK; ++k) {
      in.idx[t * kK + k] = u01(rng) < 0.1f ? -1 : perm[k];
      in.w[t * kK + k] = wd(rng);
    }
  }
  return in;
}

bool masked(int64_t e, bool rank2_dead) { return rank2_dead && e >= 0 && e / kL == kDead; }

/// Identity experts: out[t] = sum of kept w'_k * x[t], k ascending, in float32.
std::vector<float> reference(const Inputs& in, bool rank2_dead, bool renorm) {
  std::vector<float> out(in.T * kH, 0.0f);
  for (size_t t = 0; t < in.T; ++t) {
    float all = 0.0f, kept = 0.0f;
    bool lost = false;
    for (int k = 0; k < kK; ++k) {
      int64_t e = in.idx[t * kK + k];
      if (e < 0) continue;
      all += in.w[t * kK + k];
      if (masked(e, rank2_dead)) lost = true;
      else kept += in.w[t * kK + k];
    }
    float scale = renorm && lost ? (kept != 0.0f ? all / kept : 0.0f) : 1.0f;
    for (int k = 0; k < kK; ++k) {
      int64_t e = in.idx[t * kK + k];
      if (e < 0 || masked(e, rank2_dead)) continue;
      for (size_t h = 0; h < kH; ++h) out[t * kH + h] += in.w[t * kK + k] * scale * in.x[t * kH + h];
    }
  }
  return out;
}

std::vector<uint32_t> expected_dropped(const Inputs& in, bool rank2_dead) {
  std::vector<uint32_t> d(in.T, 0);
  for (size_t t = 0; t < in.T; ++t)
    for (int k = 0; k < kK; ++k) d[t] += masked(in.idx[t * kK + k], rank2_dead);
  return d;
}

void check_out(const Inputs& in, const std::vector<float>& out, bool dead, bool renorm, const std::string& at) {
  auto want = reference(in, dead, renorm);
  for (size_t i = 0; i < want.size(); ++i)
    STRATA_TEST_REQUIRE(std::fabs(out[i] - want[i]) <= 1e-5f * (1.0f + std::fabs(want[i])),
                        at << "out[" << i / kH << "][" << i % kH << "] = " << out[i] << ", want " << want[i]);
}

/// One dispatch + combine on a rank that expects rank 2 dead before the call (or alive).
void full_call(moe::Buffer& b, int rank, int call, Schedule s, bool dead) {
  const std::string at = std::string("[") + moe::to_string(s) + " call " + std::to_string(call) + " renorm " +
                         std::to_string(b.config().renormalize) + " rank " + std::to_string(rank) + "] ";
  Inputs in = make_inputs(rank, call);
  auto d = b.dispatch(in.x.data(), in.T, in.idx.data(), in.w.data(), s);
  auto want_drop = expected_dropped(in, dead);
  STRATA_TEST_REQUIRE(d.dropped == want_drop,
                      at << "Dispatch::dropped differs from the selections of rank 2's experts");
  STRATA_TEST_REQUIRE(d.failed_ranks == (dead ? std::vector<int>{kDead} : std::vector<int>{}), at << "failed_ranks");
  if (dead)
    for (int l = 0; l < kL; ++l) STRATA_TEST_REQUIRE(d.count(l, kDead) == 0, at << "count(" << l << ", 2) != 0");
  std::vector<float> out(in.T * kH, -7.0f);
  b.combine(d.window, d.handle, out.data());
  STRATA_TEST_REQUIRE(d.handle.dropped() == want_drop, at << "Handle::dropped after combine");
  check_out(in, out, dead, b.config().renormalize, at);
}

moe::Config config(bool renorm) {
  moe::Config c{.num_experts = kE, .hidden = kH, .max_tokens = kM, .topk = kK, .dtype = DataType::Float32};
  c.mask_failed_ranks = true;
  c.renormalize = renorm;
  return c;
}

/// The rank's checks after the death: ordinary collectives fail, Relay fails, and the masked
/// Prefill/Decode calls keep working on both buffers.
void after_death(Communicator& c, moe::Buffer& off, moe::Buffer& on, int first_call) {
  int n = first_call;
  for (int i = 0; i < 2; ++i)
    for (moe::Buffer* b : {&off, &on})
      for (Schedule s : {Schedule::Prefill, Schedule::Decode}) full_call(*b, c.rank(), n++, s, true);
  bool threw = false;
  try {
    c.barrier();
  } catch (const Error& e) {
    threw = true;
    STRATA_TEST_REQUIRE(e.code() == Code::PeerFailed, "barrier after the death: " << e.what());
  }
  STRATA_TEST_REQUIRE(threw, "barrier after the death did not fail");
  threw = false;
  try {
    Inputs in = make_inputs(c.rank(), n);
    (void)off.dispatch(in.x.data(), in.T, in.idx.data(), in.w.data(), Schedule::Relay);
  } catch (const Error& e) {
    threw = true;
    STRATA_TEST_REQUIRE(e.code() == Code::PeerFailed, "relay after the death: " << e.what());
  }
  STRATA_TEST_REQUIRE(threw, "relay after the death did not fail");
}

void expect_survivors_ok(const std::vector<ChildResult>& results) {
  ASSERT_EQ(results.size(), static_cast<size_t>(kR));
  for (int r = 0; r < kR; ++r) {
    if (r == kDead) {
      EXPECT_EQ(results[r].signal, SIGKILL) << results[r].output;
      continue;
    }
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
  }
}

/// Runs `body` on kR forked ranks (rank kDead kills itself inside it); a survivor whose body
/// throws reports the message, and every survivor must finish cleanly.
void run_survivors(const std::function<void(Communicator&)>& body) {
  auto results = run_forked(kR, 10000ms, [&body](Communicator& c, std::string& report) {
    try {
      body(c);
    } catch (const std::exception& e) {
      report = e.what();
      return 1;
    }
    return 0;
  });
  expect_survivors_ok(results);
}

TEST(MoeMask, RankKilledBeforeDispatch) {
  run_survivors([](Communicator& c) {
    moe::Buffer off(c, config(false)), on(c, config(true));
    // Windows are made while everyone is alive (they cannot grow while a rank is masked).
    int n = 0;
    for (moe::Buffer* b : {&off, &on})
      for (Schedule s : {Schedule::Prefill, Schedule::Decode}) full_call(*b, c.rank(), n++, s, false);
    if (c.rank() == kDead) ::raise(SIGKILL);
    // Dead before the dispatch: the barrier returns once rank 2's pidfd shows the exit.
    bool threw = false;
    try {
      c.barrier();
    } catch (const Error& e) {
      threw = e.code() == Code::PeerFailed;
    }
    STRATA_TEST_REQUIRE(threw, "the barrier did not fail with PeerFailed after rank 2's death");
    after_death(c, off, on, n);
  });
}

/// Rank 2 takes part in a dispatch and dies before combine: the survivors' dispatch reports
/// nothing dropped, their combine drops rank 2's selections and the handle says so.
void killed_mid(Schedule mid) {
  run_survivors([mid](Communicator& c) {
    moe::Buffer off(c, config(false)), on(c, config(true));
    int n = 0;
    for (moe::Buffer* b : {&off, &on})
      for (Schedule s : {Schedule::Prefill, Schedule::Decode}) full_call(*b, c.rank(), n++, s, false);
    for (moe::Buffer* b : {&off, &on}) {
      Inputs in = make_inputs(c.rank(), n);
      const std::string at = std::string("[mid ") + moe::to_string(mid) + " renorm " +
                             std::to_string(b->config().renormalize) + " rank " + std::to_string(c.rank()) + "] ";
      auto d = b->dispatch(in.x.data(), in.T, in.idx.data(), in.w.data(), mid);
      if (b == &on && c.rank() == kDead) ::raise(SIGKILL);
      std::vector<float> out(in.T * kH, -7.0f);
      const bool dead = b == &on;
      STRATA_TEST_REQUIRE(d.dropped == std::vector<uint32_t>(in.T, 0),
                          at << "dropped at dispatch with every rank alive");
      b->combine(d.window, d.handle, out.data());
      STRATA_TEST_REQUIRE(d.handle.dropped() == expected_dropped(in, dead), at << "Handle::dropped after combine");
      check_out(in, out, dead, b->config().renormalize, at);
      ++n;
    }
    after_death(c, off, on, n);
  });
}

TEST(MoeMask, RankKilledBetweenPrefillDispatchAndCombine) { killed_mid(Schedule::Prefill); }
TEST(MoeMask, RankKilledBetweenDecodeDispatchAndCombine) { killed_mid(Schedule::Decode); }

// Masking ends waits on a peer only when its process has exited: a stopped (live) peer still
// ends the survivors' calls with Timeout within the deadline.
TEST(MoeMask, StoppedPeerStillTimesOut) {
  const auto timeout = 1000ms;
  using Clock = std::chrono::steady_clock;
  const std::string marker = "/tmp/strata-moe-mask-stop-" + std::to_string(getpid()) + "-";
  auto results = run_forked(
      kR, timeout,
      [&](Communicator& c, std::string& report) {
        moe::Buffer b(c, config(false));
        auto t_fail = Clock::now();
        try {
          for (int i = 0; i < 1000000; ++i) {
            t_fail = Clock::now();
            full_call(b, c.rank(), 0, i % 2 ? Schedule::Decode : Schedule::Prefill, false);
            if (i == 1) std::fclose(std::fopen((marker + std::to_string(c.rank())).c_str(), "w"));
          }
        } catch (const Error& e) {
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_fail).count();
          report = std::to_string(static_cast<int>(e.code())) + " " + std::to_string(ms) + " " + e.what();
          return 0;
        } catch (const std::exception& e) {
          report = e.what();
          return 1;
        }
        report = "finished without error";
        return 1;
      },
      [&](const std::vector<int>& pids) {
        auto all_started = [&] {
          for (int r = 0; r < kR; ++r)
            if (access((marker + std::to_string(r)).c_str(), F_OK) != 0) return false;
          return true;
        };
        for (int i = 0; i < 3000 && !all_started(); ++i) std::this_thread::sleep_for(10ms);
        kill(pids[1], SIGSTOP);
        std::this_thread::sleep_for(4 * timeout);
        kill(pids[1], SIGKILL);
      });
  for (int r = 0; r < kR; ++r) unlink((marker + std::to_string(r)).c_str());
  for (int r : {0, 2, 3}) {
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
    int code = -1;
    long ms = -1;
    ASSERT_EQ(sscanf(results[r].output.c_str(), "%d %ld", &code, &ms), 2) << results[r].output;
    EXPECT_EQ(code, static_cast<int>(Code::Timeout)) << "rank " << r << ": " << results[r].output;
    EXPECT_LT(ms, 3 * timeout.count()) << "rank " << r << ": " << results[r].output;
  }
}

}  // namespace
}  // namespace strata::test

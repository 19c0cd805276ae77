// The flight recorder through `strata run` (issue 20 item 1): SIGUSR1 to the launcher of a
// stuck job prints one merged report, a line for every rank, and the job keeps running.

#include <sys/wait.h>

#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

/// Whether the child `pid` has not exited (without reaping it: CliProcess does that).
bool still_running(pid_t pid) {
  siginfo_t si{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return si.si_pid == 0;
}

/// The lines of `err` that report on `rank`.
std::vector<std::string> report_lines(const std::string& err, int rank) {
  std::vector<std::string> got;
  const std::string head = "  rank " + std::to_string(rank) + " ";
  const std::string head2 = "  rank " + std::to_string(rank) + ":";
  for (const auto& l : lines_of(err))
    if (l.rfind(head, 0) == 0 || l.rfind(head2, 0) == 0) got.push_back(l);
  return got;
}

TEST(FlightRecorder, SigusrToTheLauncherOfAStuckJobReportsEveryRankAndTheJobRuns) {
  STRATA_REQUIRE_BIN();
  CliProcess p({"run", "-n", "3", "--", STRATA_STUCK_RANK}, {"STRATA_TIMEOUT=60s"});
  auto deadline = Clock::now() + 20s;
  auto all_before = [&] {
    for (int r = 0; r < 3; ++r)
      if (!contains(p.out(), "[" + std::to_string(r) + "] rank " + std::to_string(r) + ": before #4")) return false;
    return true;
  };
  while (!all_before() && Clock::now() < deadline && still_running(p.pid())) p.pump(20ms);
  ASSERT_TRUE(all_before()) << p.out() << p.err();
  p.pump(300ms);  // ranks 0 and 2 are now inside all_reduce #4, rank 1 sleeps

  ASSERT_EQ(::kill(p.pid(), SIGUSR1), 0);
  deadline = Clock::now() + 10s;
  while (!contains(p.err(), "flight recorder report") && Clock::now() < deadline) p.pump(20ms);
  p.pump(100ms);
  const std::string err = p.err();
  ASSERT_TRUE(contains(err, "flight recorder report (3 rank(s)):")) << err;
  EXPECT_TRUE(contains(err, "received SIGUSR1; asking 3 rank(s) for their flight recorder")) << err;
  EXPECT_FALSE(contains(err, "strata-flight:")) << "the raw dump lines must not be relayed: " << err;
  for (int r = 0; r < 3; ++r) {
    auto lines = report_lines(err, r);
    ASSERT_EQ(lines.size(), 1u) << "rank " << r << ":\n" << err;
    const std::string& l = lines[0];
    EXPECT_TRUE(contains(l, "[world]: last completed #3 all_reduce float32 x1024")) << l;
    if (r == 1) {
      EXPECT_TRUE(contains(l, "nothing pending")) << l;
    } else {
      EXPECT_TRUE(contains(l, "pending #4 all_reduce float32 x1024 started")) << l;
      EXPECT_TRUE(contains(l, "waiting for rank 1 (at #3)")) << l;
      EXPECT_FALSE(contains(l, "rank 0 (")) << l;
      EXPECT_FALSE(contains(l, "rank 2 (")) << l;
    }
  }
  // A question, not a stop: nothing exited, and the launcher still runs.
  EXPECT_TRUE(still_running(p.pid())) << err;
  EXPECT_FALSE(contains(err, "exited")) << err;
  EXPECT_FALSE(contains(err, "forwarding")) << err;

  ASSERT_EQ(::kill(p.pid(), SIGTERM), 0);
  auto r = p.finish(10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
}

TEST(FlightRecorder, RanksWithoutAHandlerAreNotSentSigusr1) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  CliProcess p({"run", "-n", "2", "--", "sh", "-c", "echo $$ > " + dir.path() + "/$STRATA_RANK.pid; sleep 30"});
  auto deadline = Clock::now() + 10s;
  while (dir.pids(".pid").size() < 2 && Clock::now() < deadline) p.pump(20ms);
  ASSERT_EQ(dir.pids(".pid").size(), 2u);
  ASSERT_EQ(::kill(p.pid(), SIGUSR1), 0);
  deadline = Clock::now() + 10s;
  while (!contains(p.err(), "flight recorder report") && Clock::now() < deadline) p.pump(20ms);
  p.pump(100ms);
  const std::string err = p.err();
  EXPECT_TRUE(contains(err, "asking 0 rank(s) for their flight recorder (2 without a SIGUSR1 handler not asked)"))
      << err;
  EXPECT_TRUE(contains(err, "  rank 0: no answer (not asked")) << err;
  EXPECT_TRUE(contains(err, "  rank 1: no answer (not asked")) << err;
  // A shell has no SIGUSR1 handler: had it been sent the signal, it would have died.
  EXPECT_TRUE(still_running(p.pid())) << err;
  EXPECT_EQ(survivors(dir.pids(".pid"), 0ms).size(), 2u) << err;
  ASSERT_EQ(::kill(p.pid(), SIGTERM), 0);
  auto r = p.finish(10s);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
}

}  // namespace
}  // namespace strata::cli_test

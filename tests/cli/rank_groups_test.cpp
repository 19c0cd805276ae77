// The launcher's process-group helpers (src/cli/rank_groups.cpp): a kill that waits with a
// deadline and names what stays, the group kill that reaches an exited rank's children, and
// the guard that kills the groups when the launcher dies.

#include "cli/rank_groups.hpp"

#include <sys/prctl.h>

#include "cli/cli_test_util.hpp"

namespace strata::cli::launch {
namespace {

using cli_test::Clock;
using cli_test::process_alive;
using namespace std::chrono_literals;

// Reads one pid from `fd` (written by a forked helper), or 0.
pid_t read_pid(int fd) {
  pid_t p = 0;
  if (::read(fd, &p, sizeof p) != sizeof p) return 0;
  return p;
}

// A process that leads its own group and ignores SIGTERM; its pid.
pid_t start_term_ignoring_group() {
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::signal(SIGTERM, SIG_IGN);
    pid_t self = ::getpid();
    (void)!::write(ready[1], &self, sizeof self);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  EXPECT_EQ(read_pid(ready[0]), pid);
  ::close(ready[0]);
  return pid;
}

// The bound of issue 18 item 11: a group that does not empty (here: SIGTERM ignored; in a
// job, a process in uninterruptible sleep after SIGKILL) ends the wait at the deadline with
// the pid and its state, instead of hanging the launcher.
TEST(RankGroups, KillAndWaitReportsAProcessThatStaysInsteadOfHanging) {
  pid_t pid = start_term_ignoring_group();
  auto t0 = Clock::now();
  Status s = kill_group_and_wait(pid, SIGTERM, Deadline::after(300ms));
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(s.code(), Code::Timeout) << s.to_string();
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 3.0);
  EXPECT_NE(s.message().find("pid " + std::to_string(pid) + " in state S (sleeping)"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("after SIGTERM"), std::string::npos) << s.message();

  Status k = kill_group_and_wait(pid, SIGKILL, Deadline::after(5s));
  EXPECT_TRUE(k.is_ok()) << k.to_string();
  errno = 0;
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1) << "the leader should have been reaped";
  EXPECT_EQ(errno, ECHILD);
}

// A rank that exited leaves its forked child in its group: the group kill still reaches it.
TEST(RankGroups, KillAndWaitReachesTheChildrenOfAnExitedLeader) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t leader = ::fork();
  if (leader == 0) {
    ::setpgid(0, 0);
    pid_t child = ::fork();
    if (child == 0) {
      for (;;) ::pause();
    }
    (void)!::write(pipefd[1], &child, sizeof child);
    ::_exit(0);
  }
  ::close(pipefd[1]);
  pid_t child = read_pid(pipefd[0]);
  ::close(pipefd[0]);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(leader, nullptr, 0), leader);
  ASSERT_TRUE(process_alive(child));
  Status s = kill_group_and_wait(leader, SIGKILL, Deadline::after(5s));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_FALSE(process_alive(child)) << "the exited leader's child survived";
  EXPECT_TRUE(group_members(leader).empty() || group_members(leader)[0].state == 'Z');
}

// A "launcher" that starts the guard and a rank group, then dies by SIGKILL: the guard kills
// the group.
TEST(RankGroups, GuardKillsTheGroupsWhenTheLauncherDies) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t launcher = ::fork();
  if (launcher == 0) {
    auto guard = JobGuard::start();
    if (!guard.is_ok()) ::_exit(1);
    pid_t rank = ::fork();
    if (rank == 0) {
      // Exec, as a rank does: the guard's pipe is close-on-exec, a forked copy would hold it.
      ::setpgid(0, 0);
      ::execl("/bin/sleep", "sleep", "300", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(rank, rank);
    (*guard)->watch(rank);
    (void)!::write(pipefd[1], &rank, sizeof rank);
    for (;;) ::pause();
  }
  ::close(pipefd[1]);
  pid_t rank = read_pid(pipefd[0]);
  ::close(pipefd[0]);
  ASSERT_GT(rank, 0);
  ASSERT_TRUE(process_alive(rank));
  ASSERT_EQ(::kill(launcher, SIGKILL), 0);
  ASSERT_EQ(::waitpid(launcher, nullptr, 0), launcher);
  EXPECT_TRUE(cli_test::survivors({rank}, 3s).empty()) << "the guard did not kill the rank's group";
}

// Disarmed (the launcher left in order), the guard kills nothing.
TEST(RankGroups, DisarmedGuardKillsNothing) {
  pid_t pid = start_term_ignoring_group();
  {
    auto guard = JobGuard::start();
    ASSERT_TRUE(guard.is_ok()) << guard.status().to_string();
    (*guard)->watch(pid);
    (*guard)->disarm();
    pid_t g = (*guard)->pid();
    int st = 0;
    ASSERT_EQ(::waitpid(g, &st, 0), g);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  EXPECT_TRUE(process_alive(pid));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace strata::cli::launch

// Ranks on several "hosts" of one machine: each rank process gets its own STRATA_HOST_ID, so
// ranks with different ids cannot share memory and must go through UCX (over loopback TCP,
// STRATA_UCX_TLS=tcp,self unless the environment says otherwise). Every rank runs
// tests/multihost/mh_rank, which checks the results itself.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"
#include "coll/harness.hpp"

namespace strata::test {
namespace {

using namespace std::chrono_literals;

struct RankOutcome {
  int exit_code = -1;
  int signal = 0;
  std::string output;
};

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    s.append(buf, static_cast<size_t>(k));
  }
  return s;
}

/// Runs mh_rank once per entry of `hosts` (rank r on host hosts[r]) and waits for all;
/// kills every rank still running after `wall`, and rank `stopped` (if >= 0) as soon as all
/// the others have exited.
std::vector<RankOutcome> run_job(const std::vector<std::string>& hosts, const std::vector<std::string>& args,
                                 const std::string& timeout, std::chrono::seconds wall,
                                 const std::vector<std::pair<std::string, std::string>>& env = {}, int stopped = -1,
                                 const char* program = STRATA_MH_RANK) {
  const std::string token = "mh-token";
  // The store runs in a process of its own so that this one has no thread when it forks the
  // ranks (what the sanitizers, TSan above all, require of fork).
  test::ForkedStore server(token);
  const std::string store = server.address();
  const std::string job = "mh-" + std::to_string(getpid()) + "-" +
                          std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  const int n = static_cast<int>(hosts.size());
  std::vector<pid_t> pids(n);
  std::vector<int> fds(n);
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p)) throw std::runtime_error("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[0]);
      close(p[1]);
      server.close_in_child();
      setenv("STRATA_RANK", std::to_string(r).c_str(), 1);
      setenv("STRATA_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("STRATA_STORE", store.c_str(), 1);
      setenv("STRATA_JOB_TOKEN", token.c_str(), 1);
      setenv("STRATA_JOB_ID", job.c_str(), 1);
      setenv("STRATA_HOST_ID", hosts[r].c_str(), 1);
      setenv("STRATA_TIMEOUT", timeout.c_str(), 1);
      setenv("STRATA_UCX_TLS", "tcp,self", 0);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(program));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(program, argv.data());
      _exit(127);
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    auto until = std::chrono::steady_clock::now() + wall;
    while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
    if (!done)
      for (pid_t p : pids) kill(p, SIGKILL);
  });
  std::vector<RankOutcome> out(n);
  std::vector<int> order;
  for (int r = 0; r < n; ++r)
    if (r != stopped) order.push_back(r);
  if (stopped >= 0) order.push_back(stopped);
  for (int r : order) {
    if (r == stopped) kill(pids[r], SIGKILL);
    out[r].output = read_all(fds[r]);
    close(fds[r]);
    int st = 0;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(st)) out[r].exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) out[r].signal = WTERMSIG(st);
  }
  done = true;
  watchdog.join();
  return out;
}

void expect_all_pass(const std::vector<RankOutcome>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << " (signal " << res[r].signal << "):\n" << res[r].output;
    // Each rank's summary (how many checks it made) goes to the log.
    std::cout << res[r].output;
  }
}

// The collective matrix, p2p, split across hosts and mismatch detection.
TEST(MultiHost, MatrixTwoHostsTwoRanksEach) {
  expect_all_pass(run_job({"h0", "h0", "h1", "h1"}, {"--large", STRATA_MH_LARGE}, "20s", 240s));
}

// Uneven hosts (1, 2, 2): no rails of equal length, so all_reduce takes the direct path.
TEST(MultiHost, MatrixThreeUnevenHosts) {
  expect_all_pass(run_job({"h0", "h1", "h1", "h2", "h2"}, {"--quick", "--large", "65536"}, "20s", 240s));
}

// Hosts interleaved in rank order: the hierarchical path must follow hosts, not rank blocks.
TEST(MultiHost, MatrixInterleavedHosts) {
  expect_all_pass(run_job({"a", "b", "a", "b"}, {"--quick", "--large", "8192"}, "20s", 240s));
}

// One-sided puts into the receivers' registered heap buffers (the RDMA data path; UCX
// emulates it over TCP here), forced on.
TEST(MultiHost, MatrixPutDataPath) {
  expect_all_pass(
      run_job({"h0", "h0", "h1", "h1"}, {"--quick", "--large", "8192"}, "20s", 240s, {{"STRATA_UCX_DATAPATH", "put"}}));
}

// moe::Buffer across hosts (tests/multihost/mh_moe_rank.cpp): Prefill, Decode and Relay, every
// payload type, skewed routing, ranks without tokens, the max_tokens error; and hosts
// interleaved in rank order (gates and the reference's host order follow hosts, not ranks).
TEST(MultiHost, MoeTwoHostsTwoRanksEach) {
  expect_all_pass(run_job({"h0", "h0", "h1", "h1"}, {}, "20s", 240s, {}, -1, STRATA_MH_MOE_RANK));
}

// The same with one-sided puts as the data path (forced; UCX emulates them over TCP here):
// each gate's staging block and each source's partial block are placed once, at init.
TEST(MultiHost, MoePutDataPath) {
  expect_all_pass(run_job({"h0", "h0", "h1", "h1"}, {"--quick"}, "20s", 240s, {{"STRATA_UCX_DATAPATH", "put"}}, -1,
                          STRATA_MH_MOE_RANK));
}

TEST(MultiHost, MoeInterleavedAndUnevenHosts) {
  expect_all_pass(run_job({"a", "b", "a", "b"}, {"--quick"}, "20s", 240s, {}, -1, STRATA_MH_MOE_RANK));
  expect_all_pass(run_job({"h0", "h1", "h1", "h2", "h2", "h2"}, {"--quick"}, "20s", 240s, {}, -1, STRATA_MH_MOE_RANK));
}

// moe::Buffer across hosts: a rank on the other host is SIGKILLed between a dispatch and
// its combine; every other rank (its host's peers included, which wait on its signals, and
// the ranks whose rows it gates) fails with PeerFailed or Timeout within twice the timeout.
TEST(MultiHost, MoePeerOnOtherHostKilled) {
  auto res = run_job({"h0", "h0", "h1", "h1"}, {"--fault", "3", "--iters", "6"}, "2s", 60s, {}, -1, STRATA_MH_MOE_RANK);
  EXPECT_EQ(res[3].signal, SIGKILL) << res[3].output;
  for (int r : {0, 1, 2}) {
    std::cout << res[r].output;
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
    EXPECT_NE(res[r].output.find("FAULT"), std::string::npos) << res[r].output;
  }
}

// A rank on the other host is SIGKILLed mid-loop: every other rank fails with PeerFailed or
// Timeout within twice the timeout (mh_rank measures and checks it) and nothing hangs.
TEST(MultiHost, PeerOnOtherHostKilled) {
  auto res = run_job({"h0", "h0", "h1", "h1"}, {"--fault", "3", "--iters", "10"}, "2s", 60s);
  EXPECT_EQ(res[3].signal, SIGKILL) << res[3].output;
  for (int r : {0, 1, 2}) {
    std::cout << res[r].output;
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
    EXPECT_NE(res[r].output.find("FAULT"), std::string::npos) << res[r].output;
  }
}

// A rank on the other host hangs (SIGSTOP): no endpoint error comes, so the others fail with
// Timeout (or PeerFailed) within twice the timeout.
TEST(MultiHost, PeerOnOtherHostStopped) {
  auto res = run_job({"h0", "h0", "h1", "h1"}, {"--fault", "3", "--iters", "10", "--stop"}, "1500ms", 60s, {}, 3);
  for (int r : {0, 1, 2}) {
    std::cout << res[r].output;
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
    EXPECT_NE(res[r].output.find("FAULT"), std::string::npos) << res[r].output;
  }
}

}  // namespace
}  // namespace strata::test

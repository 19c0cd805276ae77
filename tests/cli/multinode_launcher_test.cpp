// `strata run --nnodes` with every agent on this host (loopback store, a distinct
// STRATA_HOST_ID per agent), so it runs anywhere, without root; the same between network
// namespaces is in tests/multihost. Checks rank numbering by node order, the reports and
// exit statuses on every node, and how fast a vanished agent or store is noticed.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <climits>
#include <memory>
#include <regex>
#include <set>

#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

// A port free on 127.0.0.1 right now; node 0 binds it a moment later.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

std::string hostname_short() {
  char name[HOST_NAME_MAX + 1] = {};
  ::gethostname(name, sizeof name - 1);
  std::string s = name;
  if (auto dot = s.find('.'); dot != std::string::npos && dot > 0) s.resize(dot);
  return s;
}

/// One agent per node of a job on 127.0.0.1.
class Job {
 public:
  Job(std::vector<int> counts, std::vector<std::string> program, std::vector<std::string> extra_env = {},
      std::vector<std::string> run_opts = {})
      : store_("127.0.0.1:" + std::to_string(free_port())) {
    for (size_t i = 0; i < counts.size(); ++i) {
      std::vector<std::string> args{
          "run",  "--nnodes", std::to_string(counts.size()), "--node-rank", std::to_string(i), "--store",
          store_, "-n",       std::to_string(counts[i])};
      args.insert(args.end(), run_opts.begin(), run_opts.end());
      args.push_back("--");
      args.insert(args.end(), program.begin(), program.end());
      std::vector<std::string> env{"STRATA_JOB_TOKEN=multinode-test-token", "STRATA_HOST_ID=node-" + std::to_string(i)};
      env.insert(env.end(), extra_env.begin(), extra_env.end());
      agents_.push_back(std::make_unique<CliProcess>(args, env));
    }
  }
  CliProcess& agent(size_t i) { return *agents_[i]; }
  std::vector<Outcome> finish(std::chrono::milliseconds limit) {
    std::vector<Outcome> out;
    for (auto& a : agents_) out.push_back(a->finish(limit));
    return out;
  }
  const std::string& store() const { return store_; }

 private:
  std::string store_;
  std::vector<std::unique_ptr<CliProcess>> agents_;
};

std::string dump(const std::vector<Outcome>& o) {
  std::string s;
  for (size_t i = 0; i < o.size(); ++i)
    s += "--- node " + std::to_string(i) + ": exit " + std::to_string(o[i].exit_code) + "\n" + o[i].out + o[i].err;
  return s;
}

TEST(MultiNodeLauncherTest, RanksAreNumberedByNodeOrderWithUnevenCountsAndPrefixedHostRank) {
  STRATA_REQUIRE_BIN();
  const std::string script =
      "echo \"$STRATA_RANK|$STRATA_WORLD_SIZE|$STRATA_LOCAL_RANK|$STRATA_LOCAL_SIZE|$STRATA_NODE_RANK|"
      "$STRATA_NNODES|$STRATA_HOST_ID|$STRATA_STORE|$RANK|$WORLD_SIZE|$GROUP_RANK|$MASTER_ADDR\"";
  Job job({1, 2, 2}, {"sh", "-c", script});
  auto o = job.finish(30s);
  ASSERT_EQ(o.size(), 3u);
  const std::string host = hostname_short();
  // node: its global ranks
  const std::vector<std::vector<int>> want = {{0}, {1, 2}, {3, 4}};
  for (int n = 0; n < 3; ++n) {
    EXPECT_EQ(o[n].exit_code, 0) << dump(o);
    auto lines = lines_of(o[n].out);
    std::set<std::string> got(lines.begin(), lines.end()), expected;
    for (size_t l = 0; l < want[n].size(); ++l) {
      int r = want[n][l];
      expected.insert("[" + host + ":" + std::to_string(r) + "] " + std::to_string(r) + "|5|" + std::to_string(l) +
                      "|" + std::to_string(want[n].size()) + "|" + std::to_string(n) + "|3|node-" + std::to_string(n) +
                      "|" + job.store() + "|" + std::to_string(r) + "|5|" + std::to_string(n) + "|127.0.0.1");
    }
    EXPECT_EQ(got, expected) << dump(o);
  }
}

TEST(MultiNodeLauncherTest, RanksOnDifferentNodesMeetThroughNodeZerosStore) {
  STRATA_REQUIRE_BIN();
  Job job({2, 1}, {STRATA_RANK_HELPER});
  auto o = job.finish(30s);
  const std::string host = hostname_short();
  for (auto& x : o) EXPECT_EQ(x.exit_code, 0) << dump(o);
  EXPECT_TRUE(contains(o[0].out, "[" + host + ":0] rank 0: all 3 ranks met")) << dump(o);
  EXPECT_TRUE(contains(o[0].out, "[" + host + ":1] rank 1: all 3 ranks met")) << dump(o);
  EXPECT_TRUE(contains(o[1].out, "[" + host + ":2] rank 2: all 3 ranks met")) << dump(o);
}

TEST(MultiNodeLauncherTest, FailedRankStopsEveryNodeAndEveryAgentExitsWithItsCode) {
  STRATA_REQUIRE_BIN();
  auto start = Clock::now();
  Job job({2, 2}, {"sh", "-c", "sleep 0.5; [ \"$STRATA_RANK\" = 2 ] && exit 5; exec sleep 60"});
  auto o = job.finish(30s);
  double took = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& x : o) EXPECT_EQ(x.exit_code, 5) << dump(o);
  EXPECT_LT(took, 5.0) << dump(o);
  EXPECT_TRUE(
      std::regex_search(o[1].err, std::regex("rank 2 on .* exited with code 5; stopping the other 1 rank\\(s\\) "
                                             "and the ranks on every other node")))
      << dump(o);
  EXPECT_TRUE(std::regex_search(o[0].err, std::regex("the job failed on node 1 \\(.*\\): rank 2 on .* exited with code "
                                                     "5; stopping the 2 rank\\(s\\) on ")))
      << dump(o);
}

TEST(MultiNodeLauncherTest, SigtermToOneAgentStopsTheRanksOfEveryNode) {
  STRATA_REQUIRE_BIN();
  Job job({1, 2}, {"sleep", "60"});
  job.agent(1).pump(1500ms);
  ::kill(job.agent(1).pid(), SIGTERM);
  auto sent = Clock::now();
  auto o = job.finish(20s);
  double took = std::chrono::duration<double>(Clock::now() - sent).count();
  EXPECT_EQ(o[1].exit_code, 128 + SIGTERM) << dump(o);
  EXPECT_EQ(o[0].exit_code, 128 + SIGTERM) << dump(o);
  EXPECT_LT(took, 3.0) << dump(o);
  EXPECT_TRUE(std::regex_search(o[0].err, std::regex("the job failed on node 1 \\(.*\\): the agent on .* received "
                                                     "SIGTERM; stopping the 1 rank\\(s\\) on ")))
      << dump(o);
}

TEST(MultiNodeLauncherTest, AgentKilledIsNoticedByNodeZeroWithinTwiceTheAgentTimeout) {
  STRATA_REQUIRE_BIN();
  Job job({1, 1}, {"sleep", "60"}, {"STRATA_AGENT_TIMEOUT=1s"});
  job.agent(0).pump(1500ms);  // both agents are up and their ranks run
  ::kill(job.agent(1).pid(), SIGKILL);
  auto killed = Clock::now();
  auto o0 = job.agent(0).finish(20s);
  double took = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_EQ(o0.exit_code, 1) << o0.err;
  EXPECT_LT(took, 2.0) << o0.err;
  EXPECT_TRUE(std::regex_search(o0.err, std::regex("the job failed on node 1 \\(.*\\): the agent of node 1 \\(.*\\) "
                                                   "sent no heartbeat for [0-9.]+ s")))
      << o0.err;
}

TEST(MultiNodeLauncherTest, NodeZeroKilledIsNoticedByTheOthersWithinTwiceTheAgentTimeout) {
  STRATA_REQUIRE_BIN();
  Job job({1, 1}, {"sleep", "60"}, {"STRATA_AGENT_TIMEOUT=1s"});
  job.agent(1).pump(1500ms);
  ::kill(job.agent(0).pid(), SIGKILL);
  auto killed = Clock::now();
  auto o1 = job.agent(1).finish(20s);
  double took = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_EQ(o1.exit_code, 1) << o1.err;
  EXPECT_LT(took, 2.0) << o1.err;
  EXPECT_TRUE(contains(o1.err, "lost the store of node 0 at " + job.store())) << o1.err;
}

TEST(MultiNodeLauncherTest, SecondAgentWithTheSameNodeRankIsRefused) {
  STRATA_REQUIRE_BIN();
  Job job({1, 1}, {"sleep", "3"});
  job.agent(0).pump(500ms);
  auto dup = run_cli({"run", "--nnodes", "2", "--node-rank", "1", "--store", job.store(), "-n", "1", "true"},
                     {"STRATA_JOB_TOKEN=multinode-test-token"}, 20s);
  auto o = job.finish(20s);
  // Whichever of the two registered first keeps node 1; the other is refused.
  const Outcome& refused = dup.exit_code != 0 ? dup : o[1];
  EXPECT_NE(refused.exit_code, 0) << dup.err << dump(o);
  EXPECT_TRUE(contains(refused.err, "node rank 1 is already taken by host")) << refused.err;
}

TEST(MultiNodeLauncherTest, HeartbeatLongerThanHalfTheAgentTimeoutIsRefused) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "--nnodes", "2", "--node-rank", "0", "--store", "127.0.0.1:" + std::to_string(free_port()),
                    "-n", "1", "true"},
                   {"STRATA_JOB_TOKEN=t", "STRATA_AGENT_TIMEOUT=1s", "STRATA_AGENT_HEARTBEAT=600ms"}, 20s);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "STRATA_AGENT_HEARTBEAT (0.6 s) must be at most half the agent timeout (1 s")) << r.err;
  EXPECT_LT(r.seconds, 5.0);
}

TEST(MultiNodeLauncherTest, MissingNodeIsNamedWhenTheRendezvousTimesOut) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "--nnodes", "3", "--node-rank", "0", "--store", "127.0.0.1:" + std::to_string(free_port()),
                    "--rdzv-timeout", "1", "-n", "1", "true"},
                   {"STRATA_JOB_TOKEN=t"}, 20s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "node(s) 1, 2 of 3 did not join within 1 s")) << r.err;
  EXPECT_LT(r.seconds, 5.0);
}

TEST(MultiNodeLauncherTest, UnreachableStoreAndForeignAddressAreClearErrors) {
  STRATA_REQUIRE_BIN();
  auto far = run_cli({"run", "--nnodes", "2", "--node-rank", "1", "--store", "127.0.0.1:" + std::to_string(free_port()),
                      "--rdzv-timeout", "1", "-n", "1", "true"},
                     {"STRATA_JOB_TOKEN=t"}, 20s);
  EXPECT_EQ(far.exit_code, 1) << far.err;
  EXPECT_TRUE(contains(far.err, "cannot reach the store of node 0 at 127.0.0.1:")) << far.err;
  EXPECT_TRUE(contains(far.err, "within 1 s: cannot reach store at")) << far.err;
  // Only the whole wait's length is given: the client's own count covers its last slice.
  EXPECT_FALSE(contains(far.err, "tried for")) << far.err;
  // 192.0.2.1 (TEST-NET-1) is no address of this host: binding it fails, nothing is sent.
  auto foreign = run_cli({"run", "--nnodes", "2", "--node-rank", "0", "--store", "192.0.2.1:29999", "-n", "1", "true"},
                         {"STRATA_JOB_TOKEN=t"}, 20s);
  EXPECT_EQ(foreign.exit_code, 1) << foreign.err;
  EXPECT_TRUE(contains(foreign.err, "must be an address of this host")) << foreign.err;
}

TEST(MultiNodeLauncherTest, UsageErrorsExitWithTwoAndSayWhatIsWrong) {
  STRATA_REQUIRE_BIN();
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const Case cases[] = {
      {{"run", "--nnodes", "2", "--node-rank", "2", "--store", "h:1", "-n", "1", "true"},
       "--node-rank 2 must be below --nnodes 2"},
      {{"run", "--nnodes", "2", "--node-rank", "0", "-n", "1", "true"}, "missing --store ADDR:PORT"},
      {{"run", "--nnodes", "2", "--store", "h:1", "-n", "1", "true"}, "missing --node-rank I (0 to 1)"},
      {{"run", "--node-rank", "0", "-n", "1", "true"}, "need --nnodes H"},
      {{"run", "--nnodes", "0", "-n", "1", "true"}, "--nnodes must be a number of nodes >= 1"},
      {{"run", "--nnodes", "2", "--node-rank", "0", "--store", "h", "-n", "1", "true"}, "is not host:port"},
      {{"run", "--nnodes", "2", "--node-rank", "0", "--store", "h:0", "-n", "1", "true"}, "port must be 1-65535"},
      {{"run", "--nnodes", "2", "--node-rank", "0", "--store", "h:1", "--port", "5", "-n", "1", "true"},
       "give the port in --store"},
      {{"run", "--nnodes", "2", "--node-rank", "0", "--store", "h:1", "-n", "1", "true"},
       "a multi-node job needs a token shared by all nodes"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args, {"STRATA_JOB_TOKEN="});
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.message)) << "want '" << c.message << "' in:\n" << r.err;
  }
}

}  // namespace
}  // namespace strata::cli_test

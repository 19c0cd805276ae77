// The job token on the command line of `strata run` and `strata store` (issue 18 items 3
// and 4): --token-file works, the ranks get the token in their environment and never on a
// command line, --token warns, empty tokens are refused, and stores listen only where asked.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "bootstrap/store.hpp"
#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

constexpr const char* kToken = "c0ffee-token-7d41a9";

std::string write_token_file(const std::string& token, const char* name = "token") {
  std::string path = ::testing::TempDir() + "/strata_" + name + "_" + std::to_string(::getpid());
  std::ofstream(path) << token << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

// A port nothing listens on now (picked by binding port 0 on loopback).
int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Lines of /proc/net/tcp text that listen (state 0A) on `port`, as "ADDRHEX:PORTHEX".
std::vector<std::string> listeners(const std::string& proc_net_tcp, int port) {
  std::ostringstream hex;
  hex << std::uppercase << std::hex << std::setw(4) << std::setfill('0') << port;
  std::vector<std::string> out;
  for (std::string line : lines_of(proc_net_tcp)) {
    if (line.starts_with("[")) line = line.substr(line.find("] ") + 2);  // a rank's output prefix
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 4) == hex.str()) out.push_back(local);
  }
  return out;
}

// The rank checks its own and its launcher's command line for the token it was given, and
// compares the token with the file's (named in $TOKEN_FILE, so the script holds no token).
const char kCheckRank[] =
    "if cat /proc/$$/cmdline /proc/$PPID/cmdline | tr '\\0' ' ' | grep -qF \"$STRATA_JOB_TOKEN\"; then echo LEAK; "
    "else echo CLEAN; fi; [ -n \"$STRATA_JOB_TOKEN\" ] && echo HAS_TOKEN; "
    "[ -n \"$TOKEN_FILE\" ] && [ \"$STRATA_JOB_TOKEN\" = \"$(cat $TOKEN_FILE)\" ] && echo SAME_TOKEN; true";

TEST(CliToken, TokenFileReachesTheRanksByEnvironmentNeverByCommandLine) {
  STRATA_REQUIRE_BIN();
  std::string file = write_token_file(kToken);
  std::string store = "127.0.0.1:" + std::to_string(free_tcp_port());
  auto r = run_cli({"run", "--nnodes", "1", "--node-rank", "0", "--store", store, "--token-file", file, "-n", "2", "--",
                    "sh", "-c", kCheckRank},
                   {"STRATA_JOB_TOKEN=", "TOKEN_FILE=" + file}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(contains(r.out, "LEAK")) << r.out;
  // Multi-node output is prefixed "[host:rank] ".
  EXPECT_TRUE(contains(r.out, ":0] CLEAN") && contains(r.out, ":1] CLEAN")) << r.out;
  EXPECT_TRUE(contains(r.out, ":0] SAME_TOKEN") && contains(r.out, ":1] SAME_TOKEN")) << r.out;
  EXPECT_FALSE(contains(r.err, "warning")) << r.err;
  std::remove(file.c_str());
}

TEST(CliToken, SingleHostRanksGetAMadeUpTokenOffTheirCommandLine) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "--", "sh", "-c", kCheckRank}, {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] CLEAN") && contains(r.out, "[1] CLEAN")) << r.out;
  EXPECT_TRUE(contains(r.out, "[0] HAS_TOKEN")) << r.out;
}

TEST(CliToken, TokenOnTheCommandLineWarns) {
  STRATA_REQUIRE_BIN();
  std::string store = "127.0.0.1:" + std::to_string(free_tcp_port());
  auto r = run_cli(
      {"run", "--nnodes", "1", "--node-rank", "0", "--store", store, "--token", kToken, "-n", "1", "--", "true"}, {},
      30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "warning: --token puts the job token on the command line")) << r.err;
}

TEST(CliToken, EmptyTokensAreRefusedNamingTheOption) {
  STRATA_REQUIRE_BIN();
  auto a = run_cli({"store", "--token", ""}, {}, 10s);
  EXPECT_EQ(a.exit_code, 2);
  EXPECT_TRUE(contains(a.err, "--token is empty")) << a.err;
  std::string empty = write_token_file("", "empty");
  auto b = run_cli({"store", "--token-file", empty}, {}, 10s);
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_TRUE(contains(b.err, "--token-file " + empty + ": the token is empty")) << b.err;
  auto c = run_cli({"run", "--nnodes", "2", "--node-rank", "0", "--store", "127.0.0.1:1", "-n", "1", "--", "true"},
                   {"STRATA_JOB_TOKEN="}, 10s);
  EXPECT_EQ(c.exit_code, 2);
  EXPECT_TRUE(contains(c.err, "STRATA_JOB_TOKEN")) << c.err;
  std::remove(empty.c_str());
}

TEST(CliStoreDefaults, StandaloneStoreListensOnLoopbackByDefaultWithATokenFile) {
  STRATA_REQUIRE_BIN();
  std::string file = write_token_file(kToken);
  int port = free_tcp_port();
  CliProcess p({"store", "--port", std::to_string(port), "--token-file", file});
  auto deadline = Clock::now() + 10s;
  while (!contains(p.out(), "STRATA_STORE=") && Clock::now() < deadline) p.pump(20ms);
  p.pump(50ms);
  EXPECT_TRUE(contains(p.out(), "STRATA_STORE=127.0.0.1:" + std::to_string(port))) << p.out();
  EXPECT_FALSE(contains(p.out(), kToken)) << "a token from a file is not printed";
  std::ifstream tcp("/proc/net/tcp");
  std::string text((std::istreambuf_iterator<char>(tcp)), std::istreambuf_iterator<char>());
  auto l = listeners(text, port);
  ASSERT_EQ(l.size(), 1u) << text;
  EXPECT_EQ(l[0].substr(0, 8), "0100007F") << "the store must listen on 127.0.0.1 only";
  auto client =
      bootstrap::StoreClient::connect({"127.0.0.1", static_cast<uint16_t>(port)}, kToken, Deadline::after(5s));
  EXPECT_TRUE(client.is_ok()) << client.status().to_string();
  ::kill(p.pid(), SIGTERM);
  auto r = p.finish(5s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::remove(file.c_str());
}

TEST(CliStoreDefaults, NodeZeroListensOnlyOnTheAddressANameResolvesTo) {
  STRATA_REQUIRE_BIN();
  std::string file = write_token_file(kToken);
  int port = free_tcp_port();
  auto r = run_cli({"run", "--nnodes", "1", "--node-rank", "0", "--store", "localhost:" + std::to_string(port),
                    "--token-file", file, "-n", "1", "--", "cat", "/proc/net/tcp"},
                   {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto l = listeners(r.out, port);
  ASSERT_EQ(l.size(), 1u) << r.out;
  EXPECT_EQ(l[0].substr(0, 8), "0100007F") << "--store localhost:P must not listen on every interface";
  std::remove(file.c_str());
}

}  // namespace
}  // namespace strata::cli_test

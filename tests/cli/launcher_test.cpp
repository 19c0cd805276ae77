// `strata run` and `strata store` as a user runs them: the real binary, real ranks (sh),
// real signals. Each failure test checks the exit status, the message, the time taken and
// that no rank (or anything a rank started) outlives the launcher.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include "bootstrap/store.hpp"
#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

TEST(LauncherTest, PrefixesEveryStdoutLineWithTheRank) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "3", "--", "sh", "-c", "echo hi $STRATA_RANK"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  std::set<std::string> got(lines.begin(), lines.end());
  EXPECT_EQ(got, (std::set<std::string>{"[0] hi 0", "[1] hi 1", "[2] hi 2"})) << r.out;
  EXPECT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(LauncherTest, StderrStaysOnStderrAndPartialLastLinesAreFlushed) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "sh", "-c", "echo out $STRATA_RANK; echo err $STRATA_RANK >&2; printf tail"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"[0] out 0", "[1] out 1", "[0] tail", "[1] tail"})
    EXPECT_TRUE(contains(r.out, want)) << r.out;
  for (const char* want : {"[0] err 0", "[1] err 1"}) EXPECT_TRUE(contains(r.err, want)) << r.err;
  EXPECT_FALSE(contains(r.out, "err")) << r.out;
  EXPECT_FALSE(contains(r.err, "out")) << r.err;
}

TEST(LauncherTest, RanksGetStoreTokenAndPlacementReplacingInheritedValues) {
  STRATA_REQUIRE_BIN();
  const std::string script =
      "echo \"$STRATA_RANK|$STRATA_WORLD_SIZE|$STRATA_LOCAL_RANK|$STRATA_LOCAL_SIZE|$STRATA_STORE|"
      "$STRATA_JOB_TOKEN|$STRATA_JOB_ID|$UNRELATED\"";
  auto r = run_cli({"run", "-n", "4", "--", "sh", "-c", script},
                   {"STRATA_RANK=99", "STRATA_JOB_TOKEN=outer-token", "UNRELATED=kept"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  std::set<std::string> tokens, stores, ids;
  for (const auto& line : lines) {
    // "[R] R|4|R|4|127.0.0.1:P|token|id|kept"
    std::vector<std::string> f;
    std::string rest = line.substr(line.find("] ") + 2);
    for (size_t pos; (pos = rest.find('|')) != std::string::npos; rest.erase(0, pos + 1))
      f.push_back(rest.substr(0, pos));
    f.push_back(rest);
    ASSERT_EQ(f.size(), 8u) << line;
    std::string rank = line.substr(1, line.find(']') - 1);
    EXPECT_EQ(f[0], rank) << line;
    EXPECT_EQ(f[1], "4");
    EXPECT_EQ(f[2], rank);
    EXPECT_EQ(f[3], "4");
    EXPECT_TRUE(f[4].starts_with("127.0.0.1:")) << line;
    EXPECT_EQ(f[5].size(), 32u) << "token should be 16 random bytes in hex: " << line;
    EXPECT_EQ(f[5].find_first_not_of("0123456789abcdef"), std::string::npos) << line;
    EXPECT_NE(f[5], "outer-token");
    EXPECT_FALSE(f[6].empty());
    EXPECT_EQ(f[7], "kept");
    tokens.insert(f[5]);
    stores.insert(f[4]);
    ids.insert(f[6]);
  }
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_EQ(stores.size(), 1u);
  EXPECT_EQ(ids.size(), 1u);
}

TEST(LauncherTest, RanksRendezvousThroughTheLaunchersStore) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "4", "--", STRATA_RANK_HELPER});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(contains(r.out, "[" + std::to_string(i) + "] rank " + std::to_string(i) + ": all 4 ranks met"))
        << r.out << r.err;
}

// A rank that exits 0 without ever joining (it never called init): the others would wait for
// its world record until STRATA_TIMEOUT; the launcher notes the exit in the store and they
// fail at once, naming it.
TEST(LauncherTest, RankThatExitsBeforeJoiningFailsTheOthersAtOnce) {
  STRATA_REQUIRE_BIN();
  // `strata bench --as-rank` calls strata::init() like any program.
  auto r = run_cli(
      {"run", "-n", "3", "--", "sh", "-c",
       "if [ $STRATA_RANK = 2 ]; then exit 0; fi; exec " + strata_bin() + " bench all_reduce --as-rank -b 8 -e 8 -q"},
      {"STRATA_TIMEOUT=120s"}, 60s);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_LT(r.seconds, 30.0) << "the ranks waited for their deadline";
  EXPECT_TRUE(contains(r.out + r.err, "rank 2 exited with code 0 (pid ")) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "it never joined the job")) << r.out << r.err;
}

// Ranks started with different world sizes are named as such, not as a corrupt control block.
TEST(LauncherTest, RanksWithDifferentWorldSizesAreNamed) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "--", "sh", "-c",
                    "if [ $STRATA_RANK = 1 ]; then export STRATA_WORLD_SIZE=3 WORLD_SIZE=3; fi; exec " + strata_bin() +
                        " bench all_reduce --as-rank -b 8 -e 8 -q"},
                   {"STRATA_TIMEOUT=20s"}, 60s);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "rank 1 was started with a communicator of 3 ranks and rank 0 with 2"))
      << r.out << r.err;
}

TEST(LauncherTest, FailingRankStopsTheJobPromptlyAndNamesRankAndCode) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  auto r = run_cli(
      {"run", "-n", "3", "--", "sh", "-c",
       "if [ $STRATA_RANK = 1 ]; then exit 3; fi; echo $$ > " + dir.path() + "/$STRATA_RANK.pid; exec sleep 30"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_LT(r.seconds, 10.0) << "launcher should not wait for the sleeping ranks";
  EXPECT_TRUE(contains(r.err, "strata run: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, ") exited with code 3")) << r.err;
  EXPECT_TRUE(survivors(dir.pids(".pid"), 2s).empty()) << "a rank outlived the launcher";
}

TEST(LauncherTest, RankKilledBySignalIsReportedWithTheSignalName) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "--", "sh", "-c", "if [ $STRATA_RANK = 0 ]; then kill -9 $$; fi; exec sleep 30"});
  EXPECT_EQ(r.exit_code, 128 + 9) << r.err;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.err, "rank 0 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 9 (SIGKILL)")) << r.err;
}

TEST(LauncherTest, RankIgnoringSigtermIsKilledAfterTheGraceTime) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string& d = dir.path();
  // Rank 1 fails only once rank 0 ignores SIGTERM, so the escalation is what ends rank 0.
  auto r = run_cli({"run", "-n", "2", "--", "sh", "-c",
                    "if [ $STRATA_RANK = 1 ]; then while [ ! -f " + d +
                        "/0.ready ]; do sleep 0.02; done; exit 1; fi; "
                        "trap '' TERM; echo $$ > " +
                        d + "/0.pid; touch " + d +
                        "/0.ready; "
                        "while :; do sleep 0.1; done"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_GE(r.seconds, 1.5) << r.err;
  EXPECT_LT(r.seconds, 10.0) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "did not exit after SIGTERM; sending SIGKILL")) << r.err;
  EXPECT_TRUE(survivors(dir.pids(".pid"), 2s).empty());
}

TEST(LauncherTest, SigtermToTheLauncherTerminatesEveryRankAndWhatTheyStarted) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string& d = dir.path();
  CliProcess p({"run", "-n", "3", "--", "sh", "-c",
                "echo $$ > " + d + "/$STRATA_RANK.pid; sleep 30 & echo $! > " + d + "/$STRATA_RANK.child; wait"});
  auto deadline = Clock::now() + 10s;
  while (dir.pids(".child").size() < 3 && Clock::now() < deadline) p.pump(20ms);
  std::vector<pid_t> pids = dir.pids(".pid"), children = dir.pids(".child");
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(children.size(), 3u);
  pids.insert(pids.end(), children.begin(), children.end());
  EXPECT_TRUE(survivors(pids, 0ms).size() == 6u) << "all ranks and their children should be running";

  ASSERT_EQ(::kill(p.pid(), SIGTERM), 0);
  auto r = p.finish(10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(contains(r.err, "received SIGTERM; forwarding it to 3 rank(s)")) << r.err;
  EXPECT_TRUE(survivors(pids, 2s).empty()) << "a rank or its child survived SIGTERM to the launcher";
}

TEST(LauncherTest, RanksDieWhenTheLauncherIsKilled) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string& d = dir.path();
  CliProcess p({"run", "-n", "2", "--", "sh", "-c", "echo $$ > " + d + "/$STRATA_RANK.pid; exec sleep 30"});
  auto deadline = Clock::now() + 10s;
  while (dir.pids(".pid").size() < 2 && Clock::now() < deadline) p.pump(20ms);
  auto pids = dir.pids(".pid");
  ASSERT_EQ(pids.size(), 2u);
  // SIGKILL leaves the launcher no chance to forward anything: PR_SET_PDEATHSIG must act.
  ASSERT_EQ(::kill(p.pid(), SIGKILL), 0);
  auto r = p.finish(10s);
  EXPECT_EQ(r.term_signal, SIGKILL);
  EXPECT_TRUE(survivors(pids, 3s).empty()) << "a rank outlived its SIGKILLed launcher";
}

// Processes whose environment holds `marker` (a variable only this job's processes inherit)
// and that are still running (zombies have finished).
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    pid_t pid = std::stoi(name);
    if (env.find(marker) != std::string::npos && process_alive(pid)) out.push_back(pid);
  }
  return out;
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) out.insert(e.path().filename().string());
  return out;
}

TEST(LauncherTest, NothingOfTheJobOutlivesASigkilledLauncher) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string& d = dir.path();
  const std::string marker = "STRATA_TEST_JOB_MARKER=" + std::to_string(::getpid()) + "-" +
                             std::to_string(Clock::now().time_since_epoch().count());
  const auto shm_before = dev_shm_entries();
  // Each rank forks a sleeping child: PR_SET_PDEATHSIG reaches the rank, not the child.
  CliProcess p({"run", "-n", "2", "--", "sh", "-c",
                "echo $$ > " + d + "/$STRATA_RANK.pid; sleep 300 & echo $! > " + d + "/$STRATA_RANK.child; wait"},
               {marker});
  auto deadline = Clock::now() + 10s;
  while (dir.pids(".child").size() < 2 && Clock::now() < deadline) p.pump(20ms);
  std::vector<pid_t> pids = dir.pids(".pid"), children = dir.pids(".child");
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(children.size(), 2u);
  pids.insert(pids.end(), children.begin(), children.end());
  ASSERT_EQ(survivors(pids, 0ms).size(), 4u) << "the ranks and their children should be running";

  ASSERT_EQ(::kill(p.pid(), SIGKILL), 0);
  auto r = p.finish(10s);
  EXPECT_EQ(r.term_signal, SIGKILL);
  auto left = survivors(pids, 2s);
  EXPECT_TRUE(left.empty()) << "a rank or a child it forked outlived the SIGKILLed launcher";
  EXPECT_TRUE(processes_with(marker).empty()) << "a process of the job is still running";
  for (pid_t q : left) ::kill(q, SIGKILL);
  for (const auto& e : dev_shm_entries())
    EXPECT_TRUE(shm_before.count(e) || !contains(e, "strata")) << "left in /dev/shm: " << e;
}

long vm_rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// A rank printing 200 MB without a newline to a terminal that does not read: the launcher
// keeps relaying (the rank is not held back), drops what the terminal cannot take, says how
// much, cuts the endless line, and its memory stays bounded.
TEST(LauncherTest, OutputFasterThanTheTerminalIsDroppedCountedAndBounded) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string done = dir.path() + "/done";
  constexpr long kBytes = 200'000'000;
  CliProcess p({"run", "-n", "1", "--", "sh", "-c",
                "head -c " + std::to_string(kBytes) + " /dev/zero | tr '\\000' x; touch " + done});
  // Nothing is read from the launcher's stdout until the rank is done: the pipe fills and
  // stays full, as a paused terminal.
  auto deadline = Clock::now() + 10s;
  std::string comm;
  while (Clock::now() < deadline) {
    std::ifstream f("/proc/" + std::to_string(p.pid()) + "/comm");
    if (std::getline(f, comm) && comm == "strata") break;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(comm, "strata");
  const long base = vm_rss_kib(p.pid());
  long peak = base;
  deadline = Clock::now() + 60s;
  while (!std::filesystem::exists(done) && Clock::now() < deadline) {
    peak = std::max(peak, vm_rss_kib(p.pid()));
    std::this_thread::sleep_for(10ms);
  }
  peak = std::max(peak, vm_rss_kib(p.pid()));
  ASSERT_TRUE(std::filesystem::exists(done)) << "the rank was held back by the paused terminal";
#if defined(__SANITIZE_ADDRESS__)
  // ASan keeps freed blocks in its quarantine (256 MiB by default), so the launcher's resident
  // size says nothing about its own buffering there; the main tree checks the bound.
  (void)peak;
#else
  EXPECT_LT(peak - base, 64 * 1024) << "launcher VmRSS grew from " << base << " KiB to " << peak << " KiB";
#endif

  auto r = p.finish(60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.out.size(), 64u << 20);
  long relayed = 0, dropped = 0;
  static const std::string kNote = " bytes dropped (output faster than the terminal)";
  for (const auto& line : lines_of(r.out)) {
    ASSERT_TRUE(line.starts_with("[0] ")) << line.substr(0, 80);
    if (contains(line, kNote)) {
      dropped += std::stol(line.substr(std::string("[0] ... ").size()));
      continue;
    }
    EXPECT_LE(line.size(), 4 + 64 * 1024u) << "a line without end must be cut";
    relayed += static_cast<long>(line.size() - 4);
  }
  EXPECT_GT(dropped, 0) << "the drop count must be printed";
  EXPECT_EQ(relayed + dropped, kBytes) << "every byte is either relayed or counted as dropped";
}

TEST(LauncherTest, SecondCtrlCKillsRanksThatIgnoreTheFirst) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string& d = dir.path();
  CliProcess p({"run", "-n", "2", "--", "sh", "-c",
                "trap '' INT; echo $$ > " + d + "/$STRATA_RANK.pid; while :; do sleep 0.1; done"});
  auto deadline = Clock::now() + 10s;
  while (dir.pids(".pid").size() < 2 && Clock::now() < deadline) p.pump(20ms);
  auto pids = dir.pids(".pid");
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(p.pid(), SIGINT), 0);
  p.pump(300ms);
  EXPECT_EQ(survivors(pids, 0ms).size(), 2u) << "the first SIGINT is only forwarded";
  ASSERT_EQ(::kill(p.pid(), SIGINT), 0);
  auto r = p.finish(5s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_TRUE(contains(r.err, "again; killing the ranks")) << r.err;
  EXPECT_TRUE(survivors(pids, 2s).empty());
}

TEST(LauncherTest, TimeoutStopsTheJobWithStatus124) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "--timeout", "500ms", "--", "sleep", "30"});
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_TRUE(contains(r.err, "did not finish within --timeout 500ms")) << r.err;
}

TEST(LauncherTest, ExitStatusIsZeroWhenEveryRankSucceeds) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n5", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST(LauncherTest, EverySpellingOfTheRankCountWorks) {
  STRATA_REQUIRE_BIN();
  // "-np" is an option of its own, not "-n" with the value "p".
  for (std::vector<std::string> args : {std::vector<std::string>{"run", "-np", "2", "true"},
                                        {"run", "-np=2", "true"},
                                        {"run", "--np=2", "true"},
                                        {"run", "--nproc", "2", "true"},
                                        {"run", "-n2", "true"}}) {
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << args[1] << ": " << r.err;
  }
}

TEST(LauncherTest, TokenGivenTwoWaysIsAUsageError) {
  STRATA_REQUIRE_BIN();
  const std::string file = "/tmp/strata-token-" + std::to_string(::getpid());
  std::ofstream(file) << "abc123\n";
  ::chmod(file.c_str(), 0600);
  for (std::vector<std::string> args :
       {std::vector<std::string>{"store", "--token", "x", "--token-file", file},
        {"store", "--token-file", file, "--token", "x"},
        {"run", "--nnodes", "1", "--token-file", file, "--token", "x", "-n", "1", "true"}}) {
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "--token and --token-file both give the job token")) << r.err;
  }
  ::unlink(file.c_str());
}

TEST(LauncherTest, UsageErrorsExitWithTwoAndSayWhatIsWrong) {
  STRATA_REQUIRE_BIN();
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const Case cases[] = {
      {{"run", "-n", "0", "true"}, "-n must be a number of ranks from 1 to 65536, got '0'"},
      {{"run", "-n", "99999", "true"}, "-n must be a number of ranks from 1 to 65536, got '99999'"},
      {{"run", "-n", "x", "true"}, "got 'x'"},
      {{"run", "-n", "2"}, "missing the program to run"},
      {{"run", "true"}, "missing -n N"},
      {{"run", "-n"}, "option -n needs a value"},
      {{"run", "--bogus", "-n", "2", "true"}, "unknown option '--bogus'"},
      {{"run", "-n", "2", "--timeout", "soon", "true"}, "--timeout must be a positive duration"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{}, "usage: strata <command>"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.message)) << "want '" << c.message << "' in:\n" << r.err;
  }
}

TEST(LauncherTest, HelpGoesToStdoutWithStatusZero) {
  STRATA_REQUIRE_BIN();
  auto top = run_cli({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  for (const char* cmd : {"run", "store", "info"}) EXPECT_TRUE(contains(top.out, std::string("  ") + cmd)) << top.out;
  auto run = run_cli({"run", "--help"});
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_TRUE(contains(run.out, "usage: strata run -n N")) << run.out;
}

TEST(LauncherTest, MissingProgramIsReportedBeforeAnyRankStarts) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "--", "strata-no-such-program-xyz"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_TRUE(contains(r.err, "strata-no-such-program-xyz: command not found")) << r.err;
  // A path says which of its problems it has.
  const std::string plain = "/tmp/strata-not-executable-" + std::to_string(::getpid());
  std::ofstream(plain) << "echo hi\n";
  ::chmod(plain.c_str(), 0644);
  for (const auto& [path, says] : {std::pair<std::string, std::string>{"/strata-no-such-file", "no such file"},
                                   {plain, "is not executable"},
                                   {"/tmp", "is a directory"}}) {
    auto p = run_cli({"run", "-n", "2", "--", path});
    EXPECT_EQ(p.exit_code, 127) << path;
    EXPECT_TRUE(contains(p.err, path + ": " + says)) << p.err;
  }
  ::unlink(plain.c_str());
}

TEST(CliStoreTest, StandaloneStoreServesClientsUntilSigterm) {
  STRATA_REQUIRE_BIN();
  CliProcess p({"store", "--host", "127.0.0.1", "--port", "0", "--token", "standalone-token"});
  auto deadline = Clock::now() + 10s;
  while (!contains(p.out(), "STRATA_STORE=") && Clock::now() < deadline) p.pump(20ms);
  p.pump(50ms);  // the rest of the line
  auto pos = p.out().find("STRATA_STORE=");
  ASSERT_NE(pos, std::string::npos) << p.out();
  std::string addr_text = p.out().substr(pos + 13, p.out().find('\n', pos) - pos - 13);
  auto addr = bootstrap::StoreAddress::parse(addr_text);
  ASSERT_TRUE(addr.is_ok()) << addr_text;
  EXPECT_EQ(addr->host, "127.0.0.1");

  auto client = bootstrap::StoreClient::connect(*addr, "standalone-token", Deadline::after(5s));
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->set("k", "v").is_ok());
  EXPECT_EQ((*client)->get("k", 1s).value(), "v");
  auto refused = bootstrap::StoreClient::connect(*addr, "other", Deadline::after(5s));
  EXPECT_EQ(refused.status().code(), Code::InvalidArgument);

  ASSERT_EQ(::kill(p.pid(), SIGTERM), 0);
  auto r = p.finish(5s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A spare host waits for a failure as long as the job runs, but not for a job that never
// registers at its store: it gives up after the rendezvous timeout, naming the store.
TEST(CliStoreTest, SpareHostAtAStoreWithoutAJobGivesUp) {
  STRATA_REQUIRE_BIN();
  CliProcess store({"store", "--host", "127.0.0.1", "--port", "0", "--token", "spare-token"});
  auto deadline = Clock::now() + 10s;
  while (!contains(store.out(), "STRATA_STORE=") && Clock::now() < deadline) store.pump(20ms);
  store.pump(50ms);
  auto pos = store.out().find("STRATA_STORE=");
  ASSERT_NE(pos, std::string::npos) << store.out();
  const std::string addr = store.out().substr(pos + 13, store.out().find('\n', pos) - pos - 13);
  const auto t0 = Clock::now();
  auto r = run_cli({"run", "--ft", "--spare", "--store", addr, "--rdzv-timeout", "1s", "-n", "1", "--", "true"},
                   {"STRATA_JOB_TOKEN=spare-token"}, 30s);
  const auto took = Clock::now() - t0;
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "no job registered at the store " + addr)) << r.err;
  EXPECT_LT(took, 15s);
  ASSERT_EQ(::kill(store.pid(), SIGTERM), 0);
  (void)store.finish(5s);
}

}  // namespace
}  // namespace strata::cli_test

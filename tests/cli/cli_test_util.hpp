#pragma once
// Runs the real `strata` binary (path in STRATA_BIN, set by strata_add_test) as a child
// process with captured stdout and stderr, and helpers to inspect processes it left.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace strata::cli_test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline std::string strata_bin() {
  const char* p = std::getenv("STRATA_BIN");  // test harness setting, not a library one
  return p ? p : "";
}

#define STRATA_REQUIRE_BIN()                                                               \
  do {                                                                                     \
    if (::strata::cli_test::strata_bin().empty()) GTEST_SKIP() << "STRATA_BIN is not set"; \
  } while (0)

struct Outcome {
  int exit_code = -1;   // -1 when killed by a signal
  int term_signal = 0;  // the signal that killed it, 0 otherwise
  bool timed_out = false;
  std::string out, err;
  double seconds = 0;
};

/// A started `strata` process whose output is being captured.
class CliProcess {
 public:
  /// `env` entries "NAME=value" replace or extend the test's environment.
  CliProcess(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    start_ = Clock::now();
    std::vector<std::string> argv_s{strata_bin()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      std::string entry = *e;
      std::string name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const auto& x : env)
        if (x.substr(0, x.find('=')) == name) replaced = true;
      if (!replaced) env_s.push_back(entry);
    }
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }
  ~CliProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return outcome_.out; }
  const std::string& err() const { return outcome_.err; }

  /// Collects output for `for_how_long` (or until both pipes close).
  void pump(std::chrono::milliseconds for_how_long) { read_until(Clock::now() + for_how_long); }

  /// Reads output until both pipes close, then reaps; SIGKILL after `limit`.
  Outcome finish(std::chrono::milliseconds limit) {
    auto deadline = Clock::now() + limit;
    read_until(deadline);
    int status = 0;
    for (;;) {
      pid_t p = ::waitpid(pid_, &status, WNOHANG);
      if (p == pid_) break;
      if (Clock::now() >= deadline) {
        outcome_.timed_out = true;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    reaped_ = true;
    outcome_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (WIFEXITED(status)) outcome_.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) outcome_.term_signal = WTERMSIG(status);
    return outcome_;
  }

 private:
  void read_until(Clock::time_point deadline) {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<std::string*> sinks;
      std::vector<int*> owners;
      if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0}), sinks.push_back(&outcome_.out), owners.push_back(&out_fd_);
      if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0}), sinks.push_back(&outcome_.err), owners.push_back(&err_fd_);
      if (fds.empty()) return;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return;
      if (::poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        char buf[4096];
        ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
        if (r > 0) {
          sinks[i]->append(buf, static_cast<size_t>(r));
        } else if (r == 0 || errno != EINTR) {
          ::close(*owners[i]);
          *owners[i] = -1;
        }
      }
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool reaped_ = false;
  Clock::time_point start_;
  Outcome outcome_;
};

/// Runs `strata args...` to completion (SIGKILL after `limit`).
inline Outcome run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                       std::chrono::milliseconds limit = 30s) {
  CliProcess p(args, env);
  return p.finish(limit);
}

inline std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// True while `pid` exists and is not a zombie (a zombie has finished running; whether its
/// parent reaped it yet is not the launcher's business).
inline bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  if (!stat || !std::getline(stat, content)) return false;
  auto close = content.rfind(')');
  return close == std::string::npos || close + 2 >= content.size() || content[close + 2] != 'Z';
}

/// Waits up to `limit` for every pid to be gone; returns those still alive.
inline std::vector<pid_t> survivors(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  for (;;) {
    std::vector<pid_t> alive;
    for (pid_t p : pids)
      if (process_alive(p)) alive.push_back(p);
    if (alive.empty() || Clock::now() >= deadline) return alive;
    std::this_thread::sleep_for(20ms);
  }
}

/// A fresh directory, removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "strata-cli-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  /// Pids written one per file "<name>" by the ranks.
  std::vector<pid_t> pids(const std::string& suffix) const {
    std::vector<pid_t> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      if (e.path().extension() != suffix) continue;
      std::ifstream f(e.path());
      pid_t p = 0;
      if (f >> p && p > 0) out.push_back(p);
    }
    return out;
  }
  size_t count(const std::string& suffix) const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      if (e.path().extension() == suffix) ++n;
    return n;
  }

 private:
  std::string path_;
};

}  // namespace strata::cli_test

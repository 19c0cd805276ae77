#pragma once
// The two test harnesses of DESIGN §7:
//  - Team: threads as ranks in one process, kept alive across test cases (fast, for the
//    parameterised matrix);
//  - run_forked: one process per rank, for faults (SIGKILL, SIGSTOP) and shared memory
//    across processes.

#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/strata.hpp>

/// In a rank body: throws std::runtime_error with the streamed `msg` unless `cond` holds
/// (run_forked bodies catch it and report the message to the parent).
#define STRATA_TEST_REQUIRE(cond, msg)    \
  do {                                    \
    if (!(cond)) {                        \
      std::ostringstream m_;              \
      m_ << msg;                          \
      throw std::runtime_error(m_.str()); \
    }                                     \
  } while (0)

namespace strata::test {

/// A job id no other test in this machine uses.
std::string unique_job_id(const char* tag);

/// N threads, each holding the world communicator of one rank of a private job.
class Team {
 public:
  /// A team of `n` ranks, created on first use and kept for the life of the test binary.
  static Team& get(int n);
  /// A team of `hosts` x `per_host` ranks where rank r claims host r / per_host
  /// (InitOptions::host_id), so that ranks on different "hosts" meet through UCX over
  /// loopback TCP; created on first use and kept like get(n). hosts == 1 is get(per_host).
  static Team& get(int hosts, int per_host);
  explicit Team(int n, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));
  /// One rank per entry of `host_ids`, rank r on host host_ids[r]; an empty id is the
  /// machine's own host.
  explicit Team(const std::vector<std::string>& host_ids,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));
  ~Team();
  int size() const { return n_; }
  /// Runs fn on every rank at once; returns the failures ("rank r: message"), empty when all
  /// ranks returned normally.
  std::vector<std::string> run(const std::function<void(Communicator&)>& fn);

  struct Impl;

 private:
  int n_;
  std::unique_ptr<Impl> impl_;
};

/// Result of one forked rank.
/// A rendezvous store served by a child process, so that the caller stays single-threaded
/// and may go on forking ranks (what the sanitizers, TSan above all, require of fork).
class ForkedStore {
 public:
  /// Starts the store; std::runtime_error when it does not come up.
  explicit ForkedStore(const std::string& token);
  /// Stops the store process and reaps it.
  ~ForkedStore();
  ForkedStore(const ForkedStore&) = delete;
  ForkedStore& operator=(const ForkedStore&) = delete;
  /// "127.0.0.1:port".
  const std::string& address() const { return address_; }
  /// In a forked rank: drop the descriptor that keeps the store alive (it stops when the
  /// owner alone closes it).
  void close_in_child() const;

 private:
  void stop();
  int pid_ = -1;
  int stop_fd_ = -1;
  std::string address_;
};

struct ChildResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // what the child wrote to its report pipe
};

/// Forks a store process and `n` rank processes; rank r runs body(comm, report) where report
/// is a string the child fills and the parent gets back. The child exits with body's return
/// value (or 100 + Code on an uncaught strata::Error). `control(pids)` runs in the parent
/// while the ranks run (to kill or stop one of them). Waits for every rank.
std::vector<ChildResult> run_forked(int n, std::chrono::milliseconds timeout,
                                    const std::function<int(Communicator&, std::string& report)>& body,
                                    const std::function<void(const std::vector<int>& pids)>& control = {});

}  // namespace strata::test

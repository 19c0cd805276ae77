#include "coll/harness.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "bootstrap/store.hpp"
#include "common/deadline.hpp"

namespace strata::test {

std::string unique_job_id(const char* tag) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return std::string("t-") + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(rd());
}

namespace {
/// What rank r of an n-rank test job passes to init().
InitOptions rank_options(int r, int n, const std::string& store, const std::string& token, const std::string& job,
                         std::chrono::milliseconds timeout, const std::string& host_id = {}) {
  InitOptions o;
  o.host_id = host_id;
  o.rank = r;
  o.size = n;
  o.store = store;
  o.token = token;
  o.job_id = job;
  o.timeout = timeout;
  return o;
}
}  // namespace

struct Team::Impl {
  std::unique_ptr<bootstrap::StoreServer> server;
  std::vector<std::thread> threads;
  std::vector<Communicator> comms;
  std::mutex mu;
  std::condition_variable cv;
  const std::function<void(Communicator&)>* task = nullptr;
  uint64_t generation = 0;
  int remaining = 0;
  bool stop = false;
  std::vector<std::string> failures;
};

Team& Team::get(int n) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Team>> teams;
  std::lock_guard<std::mutex> g(mu);
  auto& t = teams[n];
  if (!t) t = std::make_unique<Team>(n);
  return *t;
}

Team& Team::get(int hosts, int per_host) {
  if (hosts == 1) return get(per_host);
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<Team>> teams;
  std::lock_guard<std::mutex> g(mu);
  auto& t = teams[{hosts, per_host}];
  if (!t) {
    // Ranks in one process reach each other over loopback TCP (the test machine has no other
    // network); the environment may still choose otherwise.
    setenv("STRATA_UCX_TLS", "tcp,self", 0);
    std::vector<std::string> ids;
    for (int r = 0; r < hosts * per_host; ++r) ids.push_back("team-h" + std::to_string(r / per_host));
    t = std::make_unique<Team>(ids);
  }
  return *t;
}

Team::Team(int n, std::chrono::milliseconds timeout) : Team(std::vector<std::string>(n), timeout) {}

Team::Team(const std::vector<std::string>& host_ids, std::chrono::milliseconds timeout)
    : n_(static_cast<int>(host_ids.size())), impl_(std::make_unique<Impl>()) {
  const int n = n_;
  const std::string token = "team-token";
  impl_->server = bootstrap::StoreServer::start("127.0.0.1", 0, token).value();
  const std::string store = "127.0.0.1:" + std::to_string(impl_->server->port());
  const std::string job = unique_job_id("team");
  impl_->comms.resize(n);
  std::vector<std::string> errors(n);
  {
    std::vector<std::thread> starters;
    for (int r = 0; r < n; ++r)
      starters.emplace_back([&, r] {
        try {
          impl_->comms[r] = strata::init(rank_options(r, n, store, token, job, timeout, host_ids[r]));
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : starters) t.join();
  }
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty())
      throw std::runtime_error("Team init failed on rank " + std::to_string(r) + ": " + errors[r]);
  for (int r = 0; r < n; ++r)
    impl_->threads.emplace_back([this, r] {
      uint64_t seen = 0;
      for (;;) {
        const std::function<void(Communicator&)>* task;
        {
          std::unique_lock<std::mutex> lk(impl_->mu);
          impl_->cv.wait(lk, [&] { return impl_->stop || impl_->generation != seen; });
          if (impl_->stop) return;
          seen = impl_->generation;
          task = impl_->task;
        }
        std::string failure;
        try {
          (*task)(impl_->comms[r]);
        } catch (const std::exception& e) {
          failure = "rank " + std::to_string(r) + ": " + e.what();
        }
        std::lock_guard<std::mutex> g(impl_->mu);
        if (!failure.empty()) impl_->failures.push_back(failure);
        if (--impl_->remaining == 0) impl_->cv.notify_all();
      }
    });
}

Team::~Team() {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads) t.join();
  impl_->comms.clear();
}

std::vector<std::string> Team::run(const std::function<void(Communicator&)>& fn) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->task = &fn;
  impl_->failures.clear();
  impl_->remaining = n_;
  ++impl_->generation;
  impl_->cv.notify_all();
  impl_->cv.wait(lk, [&] { return impl_->remaining == 0; });
  return impl_->failures;
}

namespace {

bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    s.append(buf, static_cast<size_t>(r));
  }
  return s;
}

}  // namespace

ForkedStore::ForkedStore(const std::string& token) {
  int port_pipe[2], stop_pipe[2];
  if (pipe(port_pipe) || pipe(stop_pipe)) throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ == 0) {
    close(port_pipe[0]);
    close(stop_pipe[1]);
    auto server = bootstrap::StoreServer::start("127.0.0.1", 0, token);
    uint16_t port = server.is_ok() ? server.value()->port() : 0;
    write_all(port_pipe[1], &port, sizeof port);
    char c;
    while (::read(stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  close(port_pipe[1]);
  close(stop_pipe[0]);
  stop_fd_ = stop_pipe[1];
  uint16_t port = 0;
  bool ok = ::read(port_pipe[0], &port, sizeof port) == sizeof port && port != 0;
  close(port_pipe[0]);
  if (!ok) {
    stop();
    throw std::runtime_error("store process did not start");
  }
  address_ = "127.0.0.1:" + std::to_string(port);
}

ForkedStore::~ForkedStore() { stop(); }

void ForkedStore::stop() {
  if (stop_fd_ >= 0) close(stop_fd_);
  stop_fd_ = -1;
  if (pid_ > 0) {
    int st;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
}

void ForkedStore::close_in_child() const { close(stop_fd_); }

std::vector<ChildResult> run_forked(int n, std::chrono::milliseconds timeout,
                                    const std::function<int(Communicator&, std::string&)>& body,
                                    const std::function<void(const std::vector<int>&)>& control) {
  const std::string token = "forked-token";
  const std::string job = unique_job_id("fork");
  // The store lives in its own process so this (single-threaded) parent can fork safely.
  ForkedStore server(token);
  const std::string& store = server.address();

  std::vector<int> pids(n), report_fds(n);
  for (int r = 0; r < n; ++r) {
    int rp[2];
    if (pipe(rp)) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      close(rp[0]);
      server.close_in_child();
      std::string report;
      int code = 0;
      try {
        Communicator comm = init(rank_options(r, n, store, token, job, timeout));
        code = body(comm, report);
      } catch (const Error& e) {
        report += std::string("error: ") + e.what();
        code = 100 + static_cast<int>(e.code());
      } catch (const std::exception& e) {
        report += std::string("exception: ") + e.what();
        code = 99;
      }
      write_all(rp[1], report.data(), report.size());
      close(rp[1]);
      _exit(code);
    }
    close(rp[1]);
    pids[r] = pid;
    report_fds[r] = rp[0];
  }
  if (control) control(pids);
  std::vector<ChildResult> results(n);
  for (int r = 0; r < n; ++r) {
    results[r].output = read_all(report_fds[r]);
    close(report_fds[r]);
    int status = 0;
    while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
  }
  return results;
}

}  // namespace strata::test

#include "cli/bench_neighbour.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>
#include <vector>

namespace strata::bench {
namespace {

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void spin_for_ns(int64_t ns) {
  const int64_t until = now_ns() + ns;
  while (now_ns() < until) {
  }
}

[[noreturn]] void neighbour_loop(Neighbour n, unsigned seed) {
  if (n == Neighbour::Busy)
    for (;;) spin_for_ns(int64_t{1} << 40);
  std::minstd_rand rng(seed);
  std::uniform_int_distribution<int> sleep_us(kSleepyMinSleepUs, kSleepyMaxSleepUs);
  for (;;) {
    spin_for_ns(int64_t{kSleepyBusyUs} * 1000);
    timespec ts{0, static_cast<long>(sleep_us(rng)) * 1000};
    ::nanosleep(&ts, nullptr);
  }
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

const char* neighbour_name(Neighbour n) {
  switch (n) {
    case Neighbour::Sleepy: return "sleepy";
    case Neighbour::Busy: return "busy";
    default: return "none";
  }
}

std::optional<Neighbour> parse_neighbour(std::string_view s) {
  if (s == "none") return Neighbour::None;
  if (s == "sleepy") return Neighbour::Sleepy;
  if (s == "busy") return Neighbour::Busy;
  return std::nullopt;
}

std::string neighbour_description(Neighbour n, int threads) {
  std::string t = std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
  if (n == Neighbour::Sleepy)
    return "sleepy, " + t + ", each: busy " + std::to_string(kSleepyBusyUs) + " us, then sleep " +
           std::to_string(kSleepyMinSleepUs) + "-" + std::to_string(kSleepyMaxSleepUs) + " us";
  if (n == Neighbour::Busy) return "busy, " + t + ", each spinning";
  return "none";
}

std::string NeighbourProcess::start(Neighbour n) {
  stop();
  if (n == Neighbour::None) return "";
  const int threads = usable_cores();
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return std::string("cannot start the neighbour: fork: ") + std::strerror(errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);  // the parent died before the line above
    std::vector<std::thread> ts;
    for (int i = 1; i < threads; ++i) ts.emplace_back([n, i] { neighbour_loop(n, 7919u * static_cast<unsigned>(i)); });
    neighbour_loop(n, 1);
  }
  pid_ = pid;
  threads_ = threads;
  return "";
}

void NeighbourProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  threads_ = 0;
}

}  // namespace strata::bench

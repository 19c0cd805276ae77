#include "cli/rank_groups.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace strata::cli::launch {

namespace {

// Groups a guard remembers; --ft replacements add one per failure, and a host runs far fewer
// ranks than this.
constexpr size_t kGuardCapacity = 1 << 16;
// Messages to the guard, one int32 each: a pgid (> 0) to watch, its negation to forget, or
// kDisarm.
constexpr int32_t kDisarm = 0;

// State letter and process group of `pid` from /proc/PID/stat, or false when it is gone.
bool read_stat(pid_t pid, char& state, pid_t& ppid, pid_t& pgrp) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return false;
  // "pid (comm) S ppid pgrp ...": comm may hold spaces and parentheses, so parse after the last ')'.
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  state = line[close + 2];
  long ppid_long = 0, group = 0;
  if (std::sscanf(line.c_str() + close + 3, "%ld %ld", &ppid_long, &group) != 2) return false;
  ppid = static_cast<pid_t>(ppid_long);
  pgrp = static_cast<pid_t>(group);
  return true;
}

// Reaps every child of ours in group `pgid` that has exited.
void reap_group(pid_t pgid) {
  while (::waitpid(-pgid, nullptr, WNOHANG) > 0) {
  }
}

[[noreturn]] void guard_main(int rfd) {
  // Its own group: a Ctrl-C at the terminal or a kill of the launcher's group must not take
  // the guard with the launcher, as the guard is what cleans up after it.
  ::setpgid(0, 0);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NAME, "strata-guard");
  // Only the pipe and stderr: a guard holding the launcher's stdout (or anything else it
  // had open) would keep a reader of that pipe waiting after the launcher is gone.
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, STDIN_FILENO);
    ::dup2(devnull, STDOUT_FILENO);
  }
  if (rfd != 3) {
    ::dup2(rfd, 3);
    rfd = 3;
  }
  ::close_range(4, ~0U, 0);

  auto* groups = static_cast<pid_t*>(std::calloc(kGuardCapacity, sizeof(pid_t)));
  size_t count = 0;
  int32_t buf[1024];
  for (;;) {
    ssize_t n = ::read(rfd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the launcher is gone without disarming us
    // Each message is one 4-byte write, which a pipe delivers whole.
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(int32_t); ++i) {
      if (buf[i] == kDisarm) ::_exit(0);
      if (!groups) continue;
      if (buf[i] > 0) {
        if (count < kGuardCapacity) groups[count++] = static_cast<pid_t>(buf[i]);
        continue;
      }
      for (size_t k = 0; k < count; ++k)
        if (groups[k] == -buf[i]) {
          groups[k] = groups[--count];
          break;
        }
    }
  }
  int killed = 0;
  for (size_t i = 0; i < count; ++i)
    if (::kill(-groups[i], SIGKILL) == 0) ++killed;
  if (killed > 0) {
    std::string msg =
        "strata run: the launcher died; killed what was left of " + std::to_string(killed) + " rank process group(s)\n";
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
  }
  ::_exit(0);
}

}  // namespace

std::vector<GroupMember> group_members(pid_t pgid) {
  std::vector<GroupMember> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char state = '?';
    pid_t ppid = 0, pgrp = 0;
    if (read_stat(static_cast<pid_t>(pid), state, ppid, pgrp) && pgrp == pgid)
      out.push_back({static_cast<pid_t>(pid), state, ppid});
  }
  ::closedir(d);
  return out;
}

const char* process_state_name(char state) {
  switch (state) {
    case 'R': return "R (running)";
    case 'S': return "S (sleeping)";
    case 'D': return "D (uninterruptible sleep: in a kernel call that ignores signals)";
    case 'T': return "T (stopped)";
    case 't': return "t (stopped by a tracer)";
    case 'Z': return "Z (zombie)";
    case 'X': return "X (dead)";
    case 'I': return "I (idle)";
    default: return "unknown";
  }
}

Status kill_group_and_wait(pid_t pgid, int sig, Deadline deadline) {
  if (pgid <= 0) return invalid_argument("process group " + std::to_string(pgid));
  const auto start = Deadline::Clock::now();
  ::kill(-pgid, sig);
  for (;;) {
    reap_group(pgid);
    if (::kill(-pgid, 0) != 0 && errno == ESRCH) return Status::ok();
    // Still a member: alive, or a zombie of a parent other than us (gone for our purpose).
    // A zombie of ours is not gone until reaped: a leader whose other threads are still
    // exiting shows Z before waitpid can take it, and a caller expects it reaped on return.
    const pid_t self = ::getpid();
    std::vector<GroupMember> live;
    for (const auto& m : group_members(pgid))
      if ((m.state != 'Z' && m.state != 'X') || m.ppid == self) live.push_back(m);
    if (live.empty()) return Status::ok();
    if (deadline.expired()) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start);
      std::string who;
      for (const auto& m : live)
        who += (who.empty() ? "" : ", ") + std::string("pid ") + std::to_string(m.pid) + " in state " +
               process_state_name(m.state);
      return timeout_error("process group " + std::to_string(pgid) + " still holds " + who + " " +
                           std::to_string(waited.count()) + " ms after SIG" + ::sigabbrev_np(sig));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<std::unique_ptr<JobGuard>> JobGuard::start() {
  int p[2];
  // Close-on-exec: a rank holding the write end would keep the guard from ever seeing EOF.
  if (::pipe2(p, O_CLOEXEC) != 0) return errno_status("pipe2", errno);
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(p[0]), ::close(p[1]);
    return errno_status("fork", e);
  }
  if (pid == 0) {
    ::close(p[1]);
    guard_main(p[0]);
  }
  ::close(p[0]);
  return std::unique_ptr<JobGuard>(new JobGuard(p[1], pid));
}

JobGuard::~JobGuard() { disarm(); }

void JobGuard::watch(pid_t pgid) {
  if (fd_ < 0 || pgid <= 0) return;
  int32_t v = static_cast<int32_t>(pgid);
  // A 4-byte write to a pipe is atomic; the guard reads at once, so the pipe never fills.
  while (::write(fd_, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

void JobGuard::forget(pid_t pgid) {
  if (fd_ < 0 || pgid <= 0) return;
  int32_t v = -static_cast<int32_t>(pgid);
  while (::write(fd_, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

void JobGuard::disarm() {
  if (fd_ < 0) return;
  int32_t v = kDisarm;
  while (::write(fd_, &v, sizeof v) < 0 && errno == EINTR) {
  }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace strata::cli::launch

#pragma once
// The ranks' process groups: killing one and waiting, with a deadline, until nothing of it is
// left (a rank's own children included), and the guard process that kills every group when
// the launcher dies without doing it itself (SIGKILL, a crash).
//
// Each rank leads a process group of its own (launcher.cpp), so a group holds the rank and
// whatever it forked. PR_SET_PDEATHSIG reaches only the rank; its children (a data loader,
// a `sleep &` of a shell) need the group kill, and a forked child still holds the rank's
// sockets (the heap's fd channel), which its replacement must bind again under --ft.

#include <sys/types.h>

#include <memory>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"

namespace strata::cli::launch {

/// One process of a group, as /proc shows it.
struct GroupMember {
  pid_t pid = 0;
  char state = '?';  // the state letter of /proc/PID/stat: R, S, D, T, t, Z...
  pid_t ppid = 0;
};

/// The processes whose process group is `pgid` (zombies included).
std::vector<GroupMember> group_members(pid_t pgid);

/// "D (uninterruptible sleep)" for 'D', and so on, for messages.
const char* process_state_name(char state);

/// Sends `sig` to process group `pgid`, then waits until no live process is left in it,
/// reaping those that are our children (the leader; orphans, as the launcher is their
/// subreaper). Zombies that others must reap count as gone: they hold no resources.
/// Timeout, naming each process still there and its state (a process in uninterruptible
/// sleep, D, does not die before the kernel call it is in returns), when `deadline` passes.
Status kill_group_and_wait(pid_t pgid, int sig, Deadline deadline);

/// A process that outlives the launcher only to SIGKILL the ranks' process groups when the
/// launcher dies without disarming it. The launcher holds the write end of a pipe; the guard
/// sees EOF when the launcher exits for any reason, and kills every group it was told about
/// unless it was disarmed first.
class JobGuard {
 public:
  /// Forks the guard. Call while the process has a single thread (before the store starts):
  /// the guard then runs ordinary code until it exits.
  static Result<std::unique_ptr<JobGuard>> start();
  /// Disarms the guard (the launcher is leaving in order and stopped the groups itself).
  ~JobGuard();
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

  /// The guard is to kill process group `pgid` if the launcher dies.
  void watch(pid_t pgid);
  /// Group `pgid` is gone (seen empty): the guard must not signal its id, which others may reuse.
  void forget(pid_t pgid);
  /// The guard exits without killing anything; later watch() calls are ignored.
  void disarm();
  /// The guard's pid (a child of the launcher, reaped with the others).
  pid_t pid() const { return pid_; }

 private:
  JobGuard(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  int fd_ = -1;  // write end of the pipe the guard reads
  pid_t pid_ = -1;
};

}  // namespace strata::cli::launch

// Cross-memory attach: single-copy reads and writes of another process's memory.

#include <sys/uio.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "memory/heap.hpp"

namespace strata::memory {

namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

enum class Direction { Read, Write };

Status cma_transfer(Direction dir, pid_t pid, char* remote, char* local, size_t bytes) {
  const char* what = dir == Direction::Read ? "cma_read" : "cma_write";
  size_t done = 0;
  while (done < bytes) {
    iovec l{local + done, bytes - done};
    iovec r{remote + done, bytes - done};
    const ssize_t n =
        dir == Direction::Read ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n < 0 ? errno : EFAULT;  // no progress and no error: treat as a bad range
    if (err == EINTR) continue;
    const std::string range = std::to_string(bytes) + " bytes at " + hex(remote) + " in process " +
                              std::to_string(pid) + " (" + std::to_string(done) + " done)";
    if (err == ESRCH)
      return peer_failed(std::string(what) + ": process " + std::to_string(pid) + " is gone (" + range + ")");
    if (err == EPERM)
      return unavailable(std::string(what) + ": not permitted on " + range +
                         " (ptrace restrictions; set STRATA_CMA=0 to stage through shared memory)");
    if (err == EFAULT)
      return invalid_argument(std::string(what) + ": address outside the process's mapped memory: " + range);
    return errno_status(what, err).with_context(range + ": ");
  }
  return Status::ok();
}

}  // namespace

bool cma_probe(pid_t pid, const void* remote, size_t bytes) {
  if (bytes == 0 || pid <= 0) return false;
  // First and last byte: permission and both ends of the range, without a buffer of `bytes`.
  char sink[2];
  const char* r = static_cast<const char*>(remote);
  iovec l{sink, bytes == 1 ? size_t{1} : size_t{2}};
  iovec rv[2] = {{const_cast<char*>(r), 1}, {const_cast<char*>(r + bytes - 1), 1}};
  const ssize_t want = bytes == 1 ? 1 : 2;
  return process_vm_readv(pid, &l, 1, rv, bytes == 1 ? 1 : 2, 0) == want;
}

Status cma_read(pid_t pid, const void* remote, void* local, size_t bytes) {
  return cma_transfer(Direction::Read, pid, const_cast<char*>(static_cast<const char*>(remote)),
                      static_cast<char*>(local), bytes);
}

Status cma_write(pid_t pid, void* remote, const void* local, size_t bytes) {
  return cma_transfer(Direction::Write, pid, static_cast<char*>(remote),
                      const_cast<char*>(static_cast<const char*>(local)), bytes);
}

}  // namespace strata::memory

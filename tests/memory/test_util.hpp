#pragma once
// Helpers shared by the memory tests.

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "memory/fd_channel.hpp"
#include "memory/heap.hpp"

namespace strata::memory::testing {

/// A job key no other test (in this process or a concurrent run) uses, so abstract socket
/// names never collide.
inline std::string unique_key(const char* tag) {
  static std::atomic<int> counter{0};
  return std::string(tag) + "-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

/// The fd socket path of `rank` under `key` in the default socket directory.
inline std::string socket_path(const std::string& key, int rank) {
  auto p = fd_socket_path(fd_socket_dir(""), key, rank);
  return p.is_ok() ? *p : std::string();
}

/// Small segments keep the tests fast and the limits reachable.
inline HeapOptions small_options() {
  HeapOptions o;
  o.segment_size = size_t{4} << 20;
  o.max_size = size_t{64} << 20;
  o.symmetric_size = size_t{4} << 20;
  return o;
}

inline std::unique_ptr<Heap> make_heap(const std::string& key, int rank, HeapOptions o = small_options()) {
  auto h = Heap::create(o, key, rank);
  if (!h.is_ok()) return nullptr;
  return std::move(h).value();
}

inline Deadline soon(int ms = 5000) { return Deadline::after(std::chrono::milliseconds(ms)); }

/// Runs fn in a forked child and returns its pid; the child exits with fn's result without
/// running any destructor of the parent's state (_exit).
inline pid_t spawn(const std::function<int()>& fn) {
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  return pid;
}

/// Exit code of a child, or 128 + signal.
inline int reap(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

inline bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

inline bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

/// Byte i of a block written by rank r: distinct per rank and position.
inline unsigned char pattern(int r, size_t i) { return static_cast<unsigned char>(r * 37 + i * 7 + 1); }

}  // namespace strata::memory::testing

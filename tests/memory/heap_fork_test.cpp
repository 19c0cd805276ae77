// Peer access with a process per rank, and what is left behind when a rank is killed.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>

#include "memory/heap.hpp"
#include "memory/test_util.hpp"
#include "test_status.hpp"

namespace strata::memory {
namespace {

using testing::make_heap;
using testing::pattern;
using testing::read_all;
using testing::reap;
using testing::socket_path;
using testing::soon;
using testing::spawn;
using testing::unique_key;
using testing::write_all;

constexpr size_t kBlock = 256 * 1024;

struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() { EXPECT_EQ(pipe2(fd, O_CLOEXEC), 0); }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) close(f);
  }
  int r() const { return fd[0]; }
  int w() const { return fd[1]; }
  // The parent closes the ends it does not use, so that a child's death reads as EOF
  // instead of a hang.
  void close_end(int i) {
    close(fd[i]);
    fd[i] = -1;
  }
};

std::set<std::string> listing(const char* dir, const char* containing) {
  std::set<std::string> out;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (containing == nullptr || n.find(containing) != std::string::npos) out.insert(n);
    }
    closedir(d);
  }
  return out;
}

// Kills and reaps a child on scope exit, so a failed assertion never leaves it running.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      reap(pid);
    }
  }
};

// Whether a socket bound at `path` is open in some process (the kernel lists it).
bool socket_listed(const std::string& path) {
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line))
    if (line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0) return true;
  return false;
}

// The child reports one of these as its exit code, so a failure says which step failed.
enum ChildStep : int { kChildOk = 0, kChildHeap = 10, kChildRead, kChildPeerPtr, kChildPid, kChildAlloc, kChildWrite };

TEST(HeapFork, ChildWritesIntoParentBlockAndParentReadsChildBlock) {
  const std::string key = unique_key("fork");
  Pipe to_child, to_parent;
  // Forked before the parent's heap exists, so the child cannot reach the parent's memory
  // through an inherited mapping: only through peer_ptr.
  const pid_t parent = getpid();
  const pid_t child = spawn([&]() -> int {
    auto h = make_heap(key, 1);
    if (!h) return kChildHeap;
    SegRef ref;
    if (!read_all(to_child.r(), &ref, sizeof(ref))) return kChildRead;
    auto v = h->peer_ptr(0, ref, kBlock, soon());
    if (!v.is_ok()) return kChildPeerPtr;
    if (h->peer_pid(0) != parent) return kChildPid;
    auto* q = static_cast<unsigned char*>(*v);
    for (size_t i = 0; i < kBlock; ++i) q[i] = pattern(1, i);
    auto own = h->alloc(kBlock);
    if (!own.is_ok()) return kChildAlloc;
    for (size_t i = 0; i < kBlock; ++i) static_cast<unsigned char*>(*own)[i] = pattern(5, i);
    SegRef mine = *h->locate(*own, kBlock);
    if (!write_all(to_parent.w(), &mine, sizeof(mine))) return kChildWrite;
    char done = 0;
    // Stays alive (serving its fd) until the parent has mapped its block.
    if (!read_all(to_child.r(), &done, 1)) return kChildRead;
    return kChildOk;
  });
  ASSERT_GT(child, 0);
  to_child.close_end(0);
  to_parent.close_end(1);

  auto h = make_heap(key, 0);
  ASSERT_TRUE(h);
  auto p = h->alloc(kBlock);
  STRATA_ASSERT_OK(p);
  std::memset(*p, 0, kBlock);
  const SegRef ref = *h->locate(*p, kBlock);
  ASSERT_TRUE(write_all(to_child.w(), &ref, sizeof(ref)));
  SegRef theirs;
  const bool got = read_all(to_parent.r(), &theirs, sizeof(theirs));
  if (!got) {
    ASSERT_EQ(reap(child), 0) << "child failed before replying (exit code = ChildStep)";
  }
  auto* mine = static_cast<unsigned char*>(*p);
  for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(mine[i], pattern(1, i)) << "parent reading the child's write at " << i;
  auto v = h->peer_ptr(1, theirs, kBlock, soon());
  STRATA_ASSERT_OK(v);
  for (size_t i = 0; i < kBlock; ++i)
    ASSERT_EQ(static_cast<unsigned char*>(*v)[i], pattern(5, i)) << "parent reading the child's block at " << i;
  EXPECT_EQ(h->peer_pid(1), child);
  const char done = 1;
  ASSERT_TRUE(write_all(to_child.w(), &done, 1));
  EXPECT_EQ(reap(child), kChildOk) << "exit code = ChildStep";
}

TEST(HeapFork, KilledRankLeavesNothingBehind) {
  const std::string key = unique_key("kill");
  const auto shm_before = listing("/dev/shm", nullptr);
  const auto tmp_before = listing("/tmp", "strata-heap");
  Pipe to_parent;
  const pid_t child = spawn([&]() -> int {
    auto h = make_heap(key, 1);
    if (!h) return kChildHeap;
    auto a = h->alloc(kBlock);
    auto b = h->alloc(8u << 20);  // a dedicated segment as well
    auto c = h->alloc_symmetric(4096);
    if (!a.is_ok() || !b.is_ok() || !c.is_ok()) return kChildAlloc;
    std::memset(*a, 9, kBlock);
    SegRef ref = *h->locate(*a, kBlock);
    if (!write_all(to_parent.w(), &ref, sizeof(ref))) return kChildWrite;
    for (;;) pause();
  });
  ASSERT_GT(child, 0);
  ChildGuard guard{child};
  to_parent.close_end(1);
  SegRef ref;
  if (!read_all(to_parent.r(), &ref, sizeof(ref))) {
    FAIL() << "child failed before replying, exit code (ChildStep) " << reap(child);
  }

  auto h = make_heap(key, 0);
  ASSERT_TRUE(h);
  auto v = h->peer_ptr(1, ref, kBlock, soon());
  STRATA_ASSERT_OK(v);
  EXPECT_EQ(static_cast<unsigned char*>(*v)[kBlock - 1], 9);

  // Every segment the child holds is an anonymous memfd: no path on any filesystem.
  int memfds = 0;
  const std::string fd_dir = "/proc/" + std::to_string(child) + "/fd";
  for (const std::string& n : listing(fd_dir.c_str(), nullptr)) {
    char target[512] = {};
    const ssize_t len = readlink((fd_dir + "/" + n).c_str(), target, sizeof(target) - 1);
    if (len <= 0) continue;
    const std::string t(target, static_cast<size_t>(len));
    if (t.find("strata-heap") != std::string::npos) {
      EXPECT_EQ(t.rfind("/memfd:strata-heap-r1-s", 0), 0u) << t;
      ++memfds;
    }
  }
  EXPECT_EQ(memfds, 3) << "two regular segments and the symmetric arena";
  EXPECT_TRUE(socket_listed(socket_path(key, 1)));

  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_EQ(reap(child), 128 + SIGKILL);
  guard.pid = -1;

  EXPECT_EQ(listing("/dev/shm", nullptr), shm_before) << "/dev/shm changed";
  EXPECT_EQ(listing("/tmp", "strata-heap"), tmp_before);
  EXPECT_FALSE(socket_listed(socket_path(key, 1))) << "the socket must close with the process";
  // What this rank had mapped stays valid until dropped; new segments are unreachable.
  EXPECT_EQ(static_cast<unsigned char*>(*v)[0], 9);
  auto gone = h->peer_ptr(1, SegRef{2, 0}, 64, Deadline::after(std::chrono::milliseconds(100)));
  EXPECT_FALSE(gone.is_ok());
  EXPECT_EQ(gone.status().peer(), 1);
  h->drop_peer(1);
  EXPECT_EQ(h->peer_pid(1), 0);
}

TEST(HeapFork, HeapCopyDestroyedInAForkedChildLeavesTheParentServing) {
  // The child's copy shares the server's eventfd with the parent; destroying it there must
  // not stop the parent's server thread.
  const std::string key = unique_key("forkcopy");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  const pid_t child = spawn([&]() -> int {
    h0.reset();
    h1.reset();
    return 0;
  });
  ASSERT_GT(child, 0);
  ASSERT_EQ(reap(child), 0);
  auto p = h0->alloc(4096);  // a segment created after the fork: only the server can hand it out
  STRATA_ASSERT_OK(p);
  auto v = h1->peer_ptr(0, *h0->locate(*p, 4096), 4096, soon(2000));
  STRATA_EXPECT_OK(v);
}

}  // namespace
}  // namespace strata::memory

// Who may use a heap's fd channel. Another user (here `nobody`, in forked children that drop
// root's ids) can neither take a rank's socket name, nor connect to a live job, nor pass its
// own socket off as a rank's; a directory prepared by someone else is refused; a process of
// the same user that is not the rank the store names is refused by the client. The job
// carries on in every case. The tests that switch users need root and skip without it.

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>

#include "memory/fd_channel.hpp"
#include "memory/heap.hpp"
#include "memory/test_util.hpp"
#include "test_status.hpp"

namespace strata::memory {
namespace {

using testing::make_heap;
using testing::reap;
using testing::small_options;
using testing::socket_path;
using testing::soon;
using testing::spawn;
using testing::unique_key;

struct Nobody {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string skip;  // why the test cannot become nobody
};

Nobody find_nobody() {
  Nobody n;
  if (geteuid() != 0) {
    n.skip = "needs root to switch a child to user nobody";
    return n;
  }
  const passwd* pw = getpwnam("nobody");
  if (pw == nullptr) {
    n.skip = "there is no user 'nobody' on this host";
    return n;
  }
  n.uid = pw->pw_uid;
  n.gid = pw->pw_gid;
  return n;
}

// In a forked child: become nobody for good (groups, gid, then uid).
bool become(const Nobody& n) { return setgroups(0, nullptr) == 0 && setgid(n.gid) == 0 && setuid(n.uid) == 0; }

sockaddr_un address_of(const std::string& path, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

// errno of binding a listening socket at `path` (0: it worked; the socket stays open).
int try_listen(const std::string& path) {
  socklen_t len = 0;
  const sockaddr_un a = address_of(path, &len);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 || listen(fd, 8) != 0) return errno;
  return 0;
}

// errno of connecting to `path` (0: connected).
int try_connect(const std::string& path) {
  socklen_t len = 0;
  const sockaddr_un a = address_of(path, &len);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&a), len) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

// Forks a child that runs `body(report)`, where report(value) sends one T to the parent (and
// returns false when it could not); the child may stay alive afterwards. The parent waits for
// the value: true with `*out` set, false when the child ended without reporting.
template <class T, class Body>
bool spawn_reporting(Body body, T* out, pid_t* pid) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  *pid = spawn([&] {
    close(fds[0]);
    auto report = [&](const T& v) { return write(fds[1], &v, sizeof(T)) == static_cast<ssize_t>(sizeof(T)); };
    return body(report);
  });
  close(fds[1]);
  const bool got = read(fds[0], out, sizeof(T)) == static_cast<ssize_t>(sizeof(T));
  close(fds[0]);
  return got;
}

// Rank 1 reads a block rank 0 wrote, through the fd channel: the job works.
void expect_job_works(Heap& h0, Heap& h1, unsigned char value) {
  auto p = h0.alloc(4096);
  STRATA_ASSERT_OK(p);
  std::memset(*p, value, 4096);
  auto v = h1.peer_ptr(0, *h0.locate(*p, 4096), 4096, soon());
  STRATA_ASSERT_OK(v);
  for (size_t i = 0; i < 4096; ++i)
    ASSERT_EQ(static_cast<unsigned char*>(*v)[i], value) << "rank 1 reading rank 0's block at " << i;
}

// A directory under /tmp of this test's own, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/strata-fdauth-XXXXXX";
    const char* p = mkdtemp(tmpl);
    path = p != nullptr ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

TEST(FdAuth, AnotherUserCannotTakeTheNameNorConnect) {
  const Nobody nobody = find_nobody();
  if (!nobody.skip.empty()) GTEST_SKIP() << nobody.skip;
  const std::string key = unique_key("squat");
  auto h0 = make_heap(key, 0);
  ASSERT_TRUE(h0);
  const std::string rank0 = socket_path(key, 0);
  const std::string rank1 = socket_path(key, 1);

  // Before rank 1 starts, nobody tries to bind its name; while rank 0 runs, nobody tries to
  // connect to it. The child reports both errnos.
  struct Errnos {
    int bind = -1, connect = -1;
  } results;
  pid_t child = -1;
  ASSERT_TRUE(spawn_reporting(
      [&](auto report) {
        if (!become(nobody)) return 90;
        return report(Errnos{try_listen(rank1), try_connect(rank0)}) ? 0 : 91;
      },
      &results, &child));
  ASSERT_EQ(reap(child), 0);
  EXPECT_EQ(results.bind, EACCES) << "nobody bound rank 1's socket name: " << std::strerror(results.bind);
  EXPECT_EQ(results.connect, EACCES) << "nobody connected to rank 0's socket: " << std::strerror(results.connect);

  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h1) << "rank 1 could not start after the squat attempt";
  expect_job_works(*h0, *h1, 0x5a);
}

TEST(FdAuth, ADirectoryOfAnotherUserIsRefused) {
  const Nobody nobody = find_nobody();
  if (!nobody.skip.empty()) GTEST_SKIP() << nobody.skip;
  TempDir base;
  ASSERT_FALSE(base.path.empty());
  ASSERT_EQ(chmod(base.path.c_str(), 0777), 0);
  // nobody prepares the directory a job will use, open to everyone, hoping to see its sockets.
  const std::string dir = base.path + "/sockets";
  const pid_t child = spawn([&] {
    if (!become(nobody)) return 90;
    return mkdir(dir.c_str(), 0777) == 0 && chmod(dir.c_str(), 0777) == 0 ? 0 : 91;
  });
  ASSERT_EQ(reap(child), 0);

  HeapOptions o = small_options();
  o.socket_dir = dir;
  auto h = Heap::create(o, unique_key("dir"), 0);
  ASSERT_FALSE(h.is_ok()) << "a heap served its memory from a directory another user controls";
  EXPECT_EQ(h.status().code(), Code::InvalidArgument);
  EXPECT_NE(h.status().message().find(dir), std::string::npos) << h.status().message();
  EXPECT_NE(h.status().message().find("belongs to uid " + std::to_string(nobody.uid)), std::string::npos)
      << h.status().message();
  EXPECT_NE(h.status().message().find("STRATA_SOCKET_DIR"), std::string::npos) << h.status().message();
}

TEST(FdAuth, AnOpenOrLinkedDirectoryIsRefused) {
  TempDir base;
  ASSERT_FALSE(base.path.empty());
  HeapOptions o = small_options();

  o.socket_dir = base.path + "/open";
  ASSERT_EQ(mkdir(o.socket_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(o.socket_dir.c_str(), 0755), 0);
  auto open = Heap::create(o, unique_key("dir"), 0);
  ASSERT_FALSE(open.is_ok());
  EXPECT_NE(open.status().message().find("has mode 0755"), std::string::npos) << open.status().message();

  o.socket_dir = base.path + "/link";
  ASSERT_EQ(symlink("/tmp", o.socket_dir.c_str()), 0);
  auto linked = Heap::create(o, unique_key("dir"), 0);
  ASSERT_FALSE(linked.is_ok());
  EXPECT_NE(linked.status().message().find("symbolic link"), std::string::npos) << linked.status().message();

  // A directory of its own is made private and used; the job's directory goes at the end.
  o.socket_dir = base.path + "/mine";
  const std::string key = unique_key("dir");
  {
    auto h0 = Heap::create(o, key, 0);
    auto h1 = Heap::create(o, key, 1);
    STRATA_ASSERT_OK(h0);
    STRATA_ASSERT_OK(h1);
    struct stat st {};
    ASSERT_EQ(stat(o.socket_dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_TRUE(std::filesystem::exists(o.socket_dir + "/" + key + "/1"));
    expect_job_works(**h0, **h1, 0x33);
  }
  EXPECT_FALSE(std::filesystem::exists(o.socket_dir + "/" + key)) << "the job's socket directory was left behind";
}

TEST(FdAuth, AServerOfAnotherUserIsNotBelieved) {
  const Nobody nobody = find_nobody();
  if (!nobody.skip.empty()) GTEST_SKIP() << nobody.skip;
  // nobody serves a socket of its own at a path it controls and hands out a descriptor of
  // its choosing; the client is pointed there (as a job would be by a shared
  // STRATA_SOCKET_DIR) and must refuse before it takes any descriptor.
  TempDir base;
  ASSERT_FALSE(base.path.empty());
  ASSERT_EQ(chmod(base.path.c_str(), 0777), 0);
  const std::string path = base.path + "/impostor";
  char ok = 0;
  pid_t child = -1;
  ASSERT_TRUE(spawn_reporting(
      [&](auto report) {
        if (!become(nobody)) return 90;
        if (try_listen(path) != 0) return 91;
        // The listening socket stays open in this process (try_listen keeps it): answer nothing.
        if (!report(char{1})) return 92;
        pause();
        return 0;
      },
      &ok, &child));
  auto f = fetch_segment_fd(path, 0, 1, soon(2000));
  kill(child, SIGKILL);
  reap(child);
  ASSERT_FALSE(f.is_ok()) << "took a descriptor from another user's server";
  EXPECT_EQ(f.status().code(), Code::PeerFailed);
  EXPECT_NE(f.status().message().find("uid " + std::to_string(nobody.uid)), std::string::npos) << f.status().message();
}

TEST(FdAuth, ThePidTheStorePublishedIsRequired) {
  const std::string key = unique_key("pid");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto p = h0->alloc(4096);
  STRATA_ASSERT_OK(p);
  const SegRef ref = *h0->locate(*p, 4096);

  // Rank 1 was told rank 0 is another process: the server in this one is not believed.
  h1->expect_peer_pid(0, getpid() + 100000);
  auto refused = h1->peer_ptr(0, ref, 4096, soon(1000));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), Code::PeerFailed);
  EXPECT_EQ(refused.status().peer(), 0);
  EXPECT_NE(refused.status().message().find("is served by pid " + std::to_string(getpid())), std::string::npos)
      << refused.status().message();

  // Told the right pid (or nothing after drop_peer), it maps.
  h1->drop_peer(0);
  h1->expect_peer_pid(0, getpid());
  expect_job_works(*h0, *h1, 0x71);
}

TEST(FdAuth, AKilledRanksSocketIsTakenOverAndALiveOneIsNot) {
  const std::string key = unique_key("takeover");
  // Rank 1 in a child, SIGKILLed: its socket file stays behind with nobody listening.
  char ok = 0;
  pid_t child = -1;
  ASSERT_TRUE(spawn_reporting(
      [&](auto report) {
        auto h = make_heap(key, 1);
        if (!report(static_cast<char>(h ? 1 : 0))) return 91;
        pause();
        return 0;
      },
      &ok, &child));
  ASSERT_EQ(ok, 1);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  reap(child);
  ASSERT_TRUE(std::filesystem::exists(socket_path(key, 1)));

  auto h0 = make_heap(key, 0);
  auto h1 = Heap::create(small_options(), key, 1);
  STRATA_ASSERT_OK(h1) << "the replacement of a killed rank must take its socket over";
  ASSERT_TRUE(h0);
  expect_job_works(*h0, **h1, 0x42);

  auto twin = Heap::create(small_options(), key, 1);
  ASSERT_FALSE(twin.is_ok()) << "a second live heap took rank 1's socket";
  EXPECT_EQ(twin.status().code(), Code::Unavailable);
  EXPECT_NE(twin.status().message().find("already in use"), std::string::npos) << twin.status().message();
  expect_job_works(*h0, **h1, 0x43);
}

TEST(FdAuth, SocketPathsStayInTheirDirectory) {
  auto p = fd_socket_path("/tmp/s", "../../etc/x y", 3);
  STRATA_ASSERT_OK(p);
  EXPECT_EQ(*p, "/tmp/s/%2e.%2f..%2fetc%2fx%20y/3") << "one component, never . or ..";
  auto dot = fd_socket_path("/tmp/s/", ".", 0);
  STRATA_ASSERT_OK(dot);
  EXPECT_EQ(*dot, "/tmp/s/%2e/0");
  auto relative = fd_socket_path("tmp/s", "k", 0);
  ASSERT_FALSE(relative.is_ok());
  EXPECT_NE(relative.status().message().find("absolute"), std::string::npos);
  auto longer = fd_socket_path("/tmp/" + std::string(100, 'd'), "k", 0);
  ASSERT_FALSE(longer.is_ok());
  EXPECT_EQ(longer.status().code(), Code::InvalidArgument);
  EXPECT_NE(longer.status().message().find("STRATA_SOCKET_DIR"), std::string::npos) << longer.status().message();
}

}  // namespace
}  // namespace strata::memory

namespace strata::memory {
namespace {

// A peer whose published process is gone never listens again: the fetch says so at once
// instead of retrying until the deadline (a replacement would otherwise sit out the whole
// timeout on a rank that is itself about to be replaced).
TEST(FdAuth, APeerWhoseProcessIsGoneFailsAtOnce) {
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  reap(dead);
  const std::string path = socket_path(unique_key("gone"), 0);
  auto t0 = std::chrono::steady_clock::now();
  auto f = fetch_segment_fd(path, 0, 1, soon(10000), dead);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::PeerFailed) << f.status().to_string();
  EXPECT_NE(f.status().message().find("pid " + std::to_string(dead) + ") is gone"), std::string::npos)
      << f.status().message();
  EXPECT_LT(took, 5.0) << "waited for a process that no longer exists";
}

}  // namespace
}  // namespace strata::memory

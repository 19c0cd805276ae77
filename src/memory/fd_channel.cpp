#include "memory/fd_channel.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.hpp"

namespace strata::memory {

namespace {

// Connections a server keeps open at once; a local job has a few dozen peers at most, so
// hitting this means something connects in a loop without closing.
constexpr size_t kMaxClients = 1024;

struct UniqueFd {
  int fd = -1;
  explicit UniqueFd(int f = -1) : fd(f) {}
  UniqueFd(UniqueFd&& o) noexcept : fd(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~UniqueFd() { reset(); }
  int release() { return std::exchange(fd, -1); }
  void reset(int f = -1) {
    if (fd >= 0) close(fd);
    fd = f;
  }
};

Result<sockaddr_un> unix_address(const std::string& path, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() + 1 > sizeof(addr.sun_path))
    return invalid_argument("socket path " + path + " is " + std::to_string(path.size()) + " bytes; at most " +
                            std::to_string(sizeof(addr.sun_path) - 1) +
                            " fit (set a shorter STRATA_SOCKET_DIR or job key)");
  std::memcpy(addr.sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return addr;
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string("/") : path.substr(0, slash);
}

// True when `path` exists as a directory of this user's that nobody else may enter.
bool is_private_dir(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 0077) == 0;
}

// True when a process listens on the socket file at `addr` (a connect gets through).
bool someone_listens(const sockaddr_un& addr, socklen_t len) {
  UniqueFd probe(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (probe.fd < 0) return true;  // cannot tell: do not remove anything
  if (connect(probe.fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) return true;
  return errno != ECONNREFUSED && errno != ENOENT;
}

// Waits for `events` on fd until the deadline; ppoll's nanosecond timeout avoids spinning
// through the last partial millisecond.
Status wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    timespec ts{};
    timespec* tsp = nullptr;
    if (deadline.at() != Deadline::Clock::time_point::max()) {
      auto left = deadline.at() - Deadline::Clock::now();
      if (left.count() < 0) left = left.zero();
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      ts.tv_sec = static_cast<time_t>(ns / 1000000000);
      ts.tv_nsec = static_cast<long>(ns % 1000000000);
      tsp = &ts;
    }
    const int n = ppoll(&p, 1, tsp, nullptr);
    if (n > 0) return Status::ok();
    if (n < 0 && errno != EINTR) return errno_status("poll", errno);
    if (n == 0 && deadline.expired()) return timeout_error("deadline expired");
  }
}

}  // namespace

std::string fd_socket_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  return "/tmp/strata-" + std::to_string(geteuid());
}

Result<std::string> fd_job_dir(const std::string& dir, const std::string& job_key) {
  if (dir.empty() || dir[0] != '/')
    return invalid_argument("socket directory '" + dir + "' (STRATA_SOCKET_DIR) must be an absolute path");
  if (job_key.empty()) return invalid_argument("heap socket: the job key is empty");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key;
  for (const char c : job_key) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '-' || c == '_' || (c == '.' && !key.empty())) {
      key += c;
    } else {
      key += '%';
      key += kHex[u >> 4];
      key += kHex[u & 15];
    }
  }
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path + "/" + key;
}

Result<std::string> fd_socket_path(const std::string& dir, const std::string& job_key, int rank) {
  STRATA_ASSIGN_OR_RETURN(std::string path, fd_job_dir(dir, job_key));
  path += "/" + std::to_string(rank);
  if (path.size() + 1 > sizeof(sockaddr_un{}.sun_path))
    return invalid_argument("heap socket path " + path + " is " + std::to_string(path.size()) + " bytes; at most " +
                            std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                            " fit (set a shorter STRATA_SOCKET_DIR or STRATA_JOB_ID)");
  return path;
}

void remove_job_sockets(const std::string& dir, const std::string& job_key, const std::vector<int>& ranks) {
  auto job_dir = fd_job_dir(fd_socket_dir(dir), job_key);
  if (!job_dir.is_ok() || !is_private_dir(*job_dir)) return;
  for (const int r : ranks) {
    // Only a socket: nothing else in there is ours to remove.
    struct stat st {};
    const std::string path = *job_dir + "/" + std::to_string(r);
    if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
  }
  (void)rmdir(job_dir->c_str());
}

Status ensure_private_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return invalid_argument("cannot create the socket directory " + path + ": " + std::strerror(errno) +
                            " (set STRATA_SOCKET_DIR to a directory of yours)");
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return invalid_argument("socket directory " + path + ": " + std::strerror(errno));
  std::string wrong;
  if (!S_ISDIR(st.st_mode)) {
    wrong = S_ISLNK(st.st_mode) ? "is a symbolic link" : "is not a directory";
  } else if (st.st_uid != geteuid()) {
    wrong =
        "belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " + std::to_string(geteuid()) + ")";
  } else if ((st.st_mode & 0077) != 0) {
    std::ostringstream mode;
    mode << std::oct << (st.st_mode & 0777);
    wrong = "has mode 0" + mode.str() + "; other users must have no access (0700)";
  }
  if (!wrong.empty())
    return invalid_argument("socket directory " + path + " " + wrong +
                            ": the heap sockets would be open to others. Remove it or set STRATA_SOCKET_DIR to a "
                            "private directory");
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// Server

namespace {
// The socket paths this process serves: a second heap of the same job and rank in this process
// (an earlier init()'s, kept alive by its memory) gets an error that says so. Never destroyed:
// a heap can go after main() returns (the last reference dropped by a copy engine's thread),
// when a static set would already be gone.
struct Served {
  std::mutex mu;
  std::set<std::string> paths;
};
Served& served() {
  static Served* s = new Served;
  return *s;
}
}  // namespace

struct FdServer::Impl {
  std::string name;     // the socket's path
  bool served = false;  // listed in served()
  int rank = -1;
  Lookup lookup;
  int listen_fd = -1;
  int stop_fd = -1;
  std::thread thread;
  // The socket file as bound, so that only this server's own file is removed: a
  // replacement of this rank may have bound the path again meanwhile.
  dev_t dev = 0;
  ino_t ino = 0;

  ~Impl() {
    if (served) {
      std::lock_guard<std::mutex> g(memory::served().mu);
      memory::served().paths.erase(name);
    }
    if (thread.joinable()) {
      const uint64_t one = 1;
      (void)!write(stop_fd, &one, sizeof(one));
      thread.join();
    }
    if (listen_fd >= 0) {
      close(listen_fd);
      struct stat st {};
      if (ino != 0 && lstat(name.c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino) unlink(name.c_str());
      // The job's directory goes with its last socket; any other still in it keeps it.
      (void)rmdir(parent_of(name).c_str());
    }
    if (stop_fd >= 0) close(stop_fd);
  }

  void run();
  void accept_all(std::vector<int>& clients);
  // False when the client is to be closed.
  bool serve_one(int client);
};

void FdServer::Impl::run() {
  std::vector<int> clients;
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({stop_fd, POLLIN, 0});
    pfds.push_back({listen_fd, POLLIN, 0});
    for (int c : clients) pfds.push_back({c, POLLIN, 0});
    const int n = poll(pfds.data(), pfds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Leaving would make every later peer access time out far from the cause.
      STRATA_LOG(Error, "heap fd server " << name << ": poll: " << std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (pfds[0].revents != 0) break;
    std::vector<int> keep;
    keep.reserve(clients.size());
    for (size_t i = 0; i < clients.size(); ++i) {
      const short ev = pfds[i + 2].revents;
      if (ev == 0 || serve_one(clients[i])) {
        keep.push_back(clients[i]);
      } else {
        close(clients[i]);
      }
    }
    clients.swap(keep);
    if (pfds[1].revents != 0) accept_all(clients);
  }
  for (int c : clients) close(c);
}

void FdServer::Impl::accept_all(std::vector<int>& clients) {
  for (;;) {
    const int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        STRATA_LOG(Warn, "heap fd server " << name << ": accept: " << std::strerror(errno));
      return;
    }
    // The directory keeps other users out already; this check holds even when someone
    // points STRATA_SOCKET_DIR at a shared directory, and the fd grants read/write on this
    // rank's memory.
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || (cred.uid != geteuid() && cred.uid != 0)) {
      STRATA_LOG(Warn, "heap fd server " << name << ": refused pid " << cred.pid << " uid " << cred.uid
                                         << " (not this job's user)");
      close(c);
      continue;
    }
    if (clients.size() >= kMaxClients) {
      STRATA_LOG(Warn,
                 "heap fd server " << name << ": " << kMaxClients << " connections open; refusing pid " << cred.pid);
      close(c);
      continue;
    }
    clients.push_back(c);
  }
}

bool FdServer::Impl::serve_one(int client) {
  FdRequest req;
  const ssize_t n = recv(client, &req, sizeof(req), MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n != static_cast<ssize_t>(sizeof(req)) || req.magic != kFdRequestMagic) return false;

  const SegmentFd s = lookup(req.seg);
  FdReply rep;
  rep.status = s.status;
  rep.size = s.size;
  rep.pid = static_cast<int32_t>(getpid());
  rep.rank = rank;
  iovec iov{&rep, sizeof(rep)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  if (s.status == kFdOk) {
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &s.fd, sizeof(int));
  }
  // One small reply per request never fills the socket buffer of a client that reads its
  // answers; one that does not read is dropped rather than allowed to block the server.
  return sendmsg(client, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(rep));
}

FdServer::FdServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FdServer::~FdServer() = default;

Result<std::unique_ptr<FdServer>> FdServer::start(const std::string& path, int rank, Lookup lookup) {
  socklen_t len = 0;
  STRATA_ASSIGN_OR_RETURN(sockaddr_un addr, unix_address(path, &len));
  const std::string job_dir = parent_of(path);
  STRATA_RETURN_IF_ERROR(ensure_private_dir(parent_of(job_dir)));
  STRATA_RETURN_IF_ERROR(ensure_private_dir(job_dir));
  auto impl = std::make_unique<Impl>();
  impl->name = path;
  impl->rank = rank;
  impl->lookup = std::move(lookup);
  impl->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (impl->listen_fd < 0) return errno_status("socket", errno);
  for (int attempt = 0;; ++attempt) {
    if (bind(impl->listen_fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) break;
    const int err = errno;
    if (err != EADDRINUSE) return errno_status("bind", err).with_context("heap socket " + path + ": ");
    // A file nobody listens on is what a killed process leaves: its replacement takes the
    // path over. A live listener is another heap of the same job key and rank.
    {
      std::lock_guard<std::mutex> g(served().mu);
      if (served().paths.count(path))
        return unavailable("heap socket " + path + " is already in use by this process: it still serves the heap " +
                           "of an earlier init() as rank " + std::to_string(rank) +
                           " (its communicator was destroyed, but memory allocated from it is still alive: in " +
                           "Python, arrays from comm.empty()/zeros()); free it before joining again");
    }
    if (attempt > 0 || someone_listens(addr, len))
      return unavailable("heap socket " + path + " is already in use: another heap serves rank " +
                         std::to_string(rank) + " of this job key");
    if (unlink(path.c_str()) != 0 && errno != ENOENT)
      return errno_status("unlink", errno).with_context("stale heap socket " + path + ": ");
  }
  {
    std::lock_guard<std::mutex> g(served().mu);
    served().paths.insert(path);
    impl->served = true;
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    impl->dev = st.st_dev;
    impl->ino = st.st_ino;
  }
  if (listen(impl->listen_fd, 128) != 0) return errno_status("listen", errno);
  impl->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->stop_fd < 0) return errno_status("eventfd", errno);
  try {
    impl->thread = std::thread([p = impl.get()] { p->run(); });
  } catch (const std::system_error& e) {
    return internal_error(std::string("heap fd server: cannot start its thread: ") + e.what());
  }
  return std::unique_ptr<FdServer>(new FdServer(std::move(impl)));
}

// ---------------------------------------------------------------------------------------
// Client

Result<FetchedFd> fetch_segment_fd(const std::string& path, int peer, uint32_t seg, Deadline deadline,
                                   pid_t expected_pid) {
  const std::string where = "peer rank " + std::to_string(peer) + " at socket " + path;
  socklen_t len = 0;
  STRATA_ASSIGN_OR_RETURN(sockaddr_un addr, unix_address(path, &len));

  UniqueFd sock;
  auto backoff = std::chrono::milliseconds(1);
  const auto start = Deadline::Clock::now();
  for (;;) {
    sock = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (sock.fd < 0) return errno_status("socket", errno);
    if (connect(sock.fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) break;
    const int err = errno;
    sock.reset();
    // Refused or missing: nobody listens yet (the peer is still starting) or any more (it
    // exited). EAGAIN: its backlog is full.
    if (err == EACCES || err == EPERM)
      return Status(Code::Unavailable,
                    "cannot connect to " + where + ": " + std::strerror(err) +
                        " (the socket or its directory belongs to another user?)",
                    peer);
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR)
      return Status(Code::Unavailable, "cannot connect to " + where + ": " + std::strerror(err), peer);
    // A peer known by its pid that no longer exists will never listen again: waiting for it
    // until the deadline would hold up a recovery that is about to replace it too.
    if (expected_pid != 0 && (err == ECONNREFUSED || err == ENOENT) && ::kill(expected_pid, 0) != 0 && errno == ESRCH)
      return Status(Code::PeerFailed, where + ": its process (pid " + std::to_string(expected_pid) + ") is gone", peer);
    if (deadline.expired()) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start);
      return Status(Code::Timeout,
                    "cannot reach " + where + " after " + std::to_string(waited.count()) + " ms (" +
                        std::strerror(err) + "): is the peer running and using the same job key?",
                    peer);
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::milliseconds>(backoff, deadline.remaining() + std::chrono::milliseconds(1)));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
  }

  // Who answers, before anything is asked or accepted: SO_PEERCRED of a connected socket
  // names the process that listens.
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(sock.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0)
    return Status(Code::Unavailable, "cannot identify " + where + ": " + std::strerror(errno), peer);
  if (cred.uid != geteuid())
    return Status(Code::PeerFailed,
                  where + " is served by pid " + std::to_string(cred.pid) + " of uid " + std::to_string(cred.uid) +
                      ", not by this user (uid " + std::to_string(geteuid()) + "): refused",
                  peer);
  if (expected_pid != 0 && cred.pid != expected_pid)
    return Status(Code::PeerFailed,
                  where + " is served by pid " + std::to_string(cred.pid) + " but rank " + std::to_string(peer) +
                      " is pid " + std::to_string(expected_pid) + " (replaced, or not of this job): refused",
                  peer);

  FdRequest req;
  req.seg = seg;
  for (;;) {
    const ssize_t n = send(sock.fd, &req, sizeof(req), MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(req))) break;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      Status w = wait_fd(sock.fd, POLLOUT, deadline);
      if (!w.is_ok()) return Status(w.code(), "sending a request to " + where + ": " + w.message(), peer);
      continue;
    }
    return Status(Code::Unavailable, "sending a request to " + where + ": " + std::strerror(errno), peer);
  }

  FdReply rep;
  std::vector<UniqueFd> fds;
  for (;;) {
    Status w = wait_fd(sock.fd, POLLIN, deadline);
    if (!w.is_ok())
      return Status(w.code(), "waiting for segment " + std::to_string(seg) + " from " + where + ": " + w.message(),
                    peer);
    iovec iov{&rep, sizeof(rep)};
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    const ssize_t n = recvmsg(sock.fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return Status(Code::Unavailable, "receiving from " + where + ": " + std::strerror(errno), peer);
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f = -1;
        std::memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        fds.emplace_back(f);
      }
    }
    if (n == 0)
      return Status(Code::Unavailable, where + " closed the connection before answering (has it exited?)", peer);
    if (n != static_cast<ssize_t>(sizeof(rep)) || rep.magic != kFdReplyMagic || (msg.msg_flags & MSG_CTRUNC))
      return Status(Code::Internal, "malformed reply (" + std::to_string(n) + " bytes) from " + where, peer);
    break;
  }
  if (rep.rank != peer) return Status(Code::Internal, where + " answered as rank " + std::to_string(rep.rank), peer);
  if (rep.pid != cred.pid)
    return Status(Code::PeerFailed,
                  where + " claims pid " + std::to_string(rep.pid) + " but is pid " + std::to_string(cred.pid), peer);
  if (rep.status == kFdNoSegment)
    return Status(Code::InvalidArgument, where + " has no segment " + std::to_string(seg), peer);
  if (rep.status == kFdNotYet)
    return Status(Code::Unavailable,
                  where + " has not created segment " + std::to_string(seg) + " (its symmetric arena) yet", peer);
  if (rep.status != kFdOk || fds.size() != 1)
    return Status(Code::Internal,
                  "reply from " + where + " has status " + std::to_string(rep.status) + " and " +
                      std::to_string(fds.size()) + " fds",
                  peer);
  return FetchedFd{fds[0].release(), static_cast<size_t>(rep.size), static_cast<pid_t>(rep.pid)};
}

}  // namespace strata::memory

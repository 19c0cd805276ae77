#pragma once
// Handing segment fds to local peers: a server thread per heap on a Unix socket, and the
// client call a peer makes on its first access to a segment.
//
// Protocol (SOCK_SEQPACKET, one request and one reply per message, any number per
// connection): the request is a FdRequest; the reply is a FdReply, carrying the segment's fd
// as SCM_RIGHTS when status is kFdOk.
//
// Who may talk to whom. A segment fd grants read/write on a rank's memory, so the socket is a
// file in a directory only this user can enter (<socket dir>/<job key>/<rank>, both 0700 and
// checked to be ours): another user can neither bind the name first nor connect. An abstract
// name would have no permissions at all, and its owner would be whoever bound it first. On
// top of that both ends check SO_PEERCRED: the server answers its own uid only (and root),
// the client takes a descriptor only from a server of its own uid and, when it knows it, the
// pid the store published for that rank. Between processes of one uid a pid check adds no
// protection (each may ptrace the other); it catches a stale or foreign server of the job.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"

namespace strata::memory {

inline constexpr uint32_t kFdRequestMagic = 0x53545251;  // "STRQ"
inline constexpr uint32_t kFdReplyMagic = 0x53545250;    // "STRP"

struct FdRequest {
  uint32_t magic = kFdRequestMagic;
  uint32_t seg = 0;
};

enum FdReplyStatus : uint32_t {
  kFdOk = 0,
  kFdNoSegment = 1,  // the owner has no such segment
  kFdNotYet = 2,     // a segment that will exist (the symmetric arena before its first use)
};

struct FdReply {
  uint32_t magic = kFdReplyMagic;
  uint32_t status = kFdOk;
  uint64_t size = 0;
  int32_t pid = 0;
  int32_t rank = -1;
};

/// The directory of this user's heap sockets: `dir` when not empty (STRATA_SOCKET_DIR),
/// else /tmp/strata-<euid>.
std::string fd_socket_dir(const std::string& dir);
/// "<dir>/<job key>/<rank>", the job key's characters outside [A-Za-z0-9._-] escaped as %XX
/// so that no key can leave the directory. InvalidArgument when the path does not fit in a
/// sockaddr_un, naming STRATA_SOCKET_DIR and the job key.
Result<std::string> fd_socket_path(const std::string& dir, const std::string& job_key, int rank);
/// "<dir>/<job key>", the directory of one job's sockets (the key escaped as above).
Result<std::string> fd_job_dir(const std::string& dir, const std::string& job_key);
/// Removes the socket files of `ranks` (killed ranks cannot remove their own) and the job's
/// directory once it is empty, when that directory is a private one of this user's. `dir` as
/// in fd_socket_dir. For a launcher, once every rank it started is gone: other hosts' ranks
/// may share the directory (network namespaces on one machine).
void remove_job_sockets(const std::string& dir, const std::string& job_key, const std::vector<int>& ranks);
/// Creates `path` (mode 0700) when missing and checks that it is a directory, not a link,
/// owned by this user and closed to everybody else; InvalidArgument naming the path and
/// what is wrong otherwise (someone else may have created it to capture the sockets).
Status ensure_private_dir(const std::string& path);

struct SegmentFd {
  uint32_t status = kFdNoSegment;
  int fd = -1;  // still owned by the heap; the server only sends a duplicate
  size_t size = 0;
};

class FdServer {
 public:
  /// Called on the server thread; must not block.
  using Lookup = std::function<SegmentFd(uint32_t seg)>;
  /// Makes the socket's directories (ensure_private_dir), binds the socket at `path` and
  /// starts the thread. A socket file nobody listens on (left by a killed process) is
  /// replaced; one somebody listens on is Unavailable: another process or heap already
  /// serves this job key and rank.
  static Result<std::unique_ptr<FdServer>> start(const std::string& path, int rank, Lookup lookup);
  /// Stops and joins the thread, closes every socket, removes the socket file (when it is
  /// still this server's) and the job's directory once it is empty.
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  struct Impl;

 private:
  explicit FdServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct FetchedFd {
  int fd = -1;  // the caller owns it
  size_t size = 0;
  pid_t pid = 0;
};

/// Asks `peer`'s server (at socket `path`) for segment `seg`. Connecting is retried with
/// backoff until the deadline, as the peer may not have started its server yet. The server
/// must run as this process's user and, when `expected_pid` is not 0, be that process:
/// PeerFailed otherwise, before any descriptor is accepted.
Result<FetchedFd> fetch_segment_fd(const std::string& path, int peer, uint32_t seg, Deadline deadline,
                                   pid_t expected_pid = 0);

}  // namespace strata::memory

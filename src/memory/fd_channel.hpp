#pragma once
// Handing segment fds to local peers: a server thread per heap on an abstract Unix socket,
// and the client call a peer makes on its first access to a segment.
//
// Protocol (SOCK_SEQPACKET, one request and one reply per message, any number per
// connection): the request is a FdRequest; the reply is a FdReply, carrying the segment's fd
// as SCM_RIGHTS when status is kFdOk. The server only answers processes of its own uid.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

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

/// "strata.<job_key>.<rank>", the abstract socket name without its leading NUL.
std::string fd_socket_name(const std::string& job_key, int rank);
/// "@strata.<job_key>.<rank>", as ss(8) shows abstract names, for messages.
std::string fd_socket_display(const std::string& name);

struct SegmentFd {
  uint32_t status = kFdNoSegment;
  int fd = -1;  // still owned by the heap; the server only sends a duplicate
  size_t size = 0;
};

class FdServer {
 public:
  /// Called on the server thread; must not block.
  using Lookup = std::function<SegmentFd(uint32_t seg)>;
  /// Binds the socket (Unavailable when the name is taken: another process or heap already
  /// serves this job key and rank) and starts the thread.
  static Result<std::unique_ptr<FdServer>> start(const std::string& name, int rank, Lookup lookup);
  /// Stops and joins the thread, closes every socket.
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

/// Asks `peer`'s server (at socket `name`) for segment `seg`. Connecting is retried with
/// backoff until the deadline, as the peer may not have started its server yet.
Result<FetchedFd> fetch_segment_fd(const std::string& name, int peer, uint32_t seg, Deadline deadline);

}  // namespace strata::memory

#pragma once
// Messages between ranks on different hosts. The collective layer sees peers (global ranks),
// 64-bit tags and buffers only; the implementation (UCX) owns endpoints, registrations and
// progress. A transfer is posted, then waited on together with others under one deadline,
// the communicator's abort flag and its liveness check (the same WaitPolicy as shm waits).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/env.hpp"
#include "common/status.hpp"
#include "transport/shm_sync.hpp"

namespace strata::memory {
class Heap;
}
namespace strata::bootstrap {
class StoreClient;
}

namespace strata::transport {

/// Tags are the callers' except the top two bits, where the transport puts the lane (one of
/// up to kMaxLanes connections to a peer) of each piece of a transfer it stripes
/// (send_bulk): callers leave them clear.
inline constexpr int kMaxLanes = Env::kMaxUcxLanes;
static_assert(kMaxLanes <= 4);
inline constexpr int kLaneShift = 62;
inline constexpr uint64_t kTransportTagBits = uint64_t{3} << kLaneShift;

/// One posted transfer. Filled by the transport as it completes; the owner waits on it
/// through Net::wait. Never destroyed by the transport while in flight: an abandoned
/// (timed out, aborted) transfer is cancelled and its storage kept until UCX lets go.
struct Transfer {
  int peer = -1;  // global rank
  bool is_recv = false;
  bool exact = true;  // receives: a message shorter than `bytes` is an error
  size_t bytes = 0;   // posted size
  std::atomic<bool> done{false};
  Status status;                   // valid once done
  size_t received = 0;             // receives: bytes that arrived
  void* handle = nullptr;          // transport-private (UCX request) while in flight
  int stage = 0;                   // transport-private (multi-step transfers such as put + notify)
  Transfer* whole = nullptr;       // transport-private: the striped transfer this one is a piece of
  std::shared_ptr<Transfer> self;  // keeps the object alive while the transport holds it
};
using TransferPtr = std::shared_ptr<Transfer>;

/// A piece of a message: a buffer and its size.
struct Part {
  void* p = nullptr;
  size_t bytes = 0;
};

/// Where data goes when it is put one-sided: a peer's heap (segment id, offset).
struct RemoteRef {
  uint32_t seg = 0;
  uint64_t offset = 0;
};

class Net {
 public:
  virtual ~Net() = default;
  /// Short name of the data path in use ("tag" or "put") and the transports UCX chose.
  virtual std::string describe() const = 0;
  /// True when one-sided puts are the data path (native RMA fabric, or forced by the Env).
  virtual bool use_put() const = 0;

  /// Sends `bytes` at `buf` to global rank `peer`; matched at the receiver by `tag`.
  virtual Result<TransferPtr> send(int peer, uint64_t tag, const void* buf, size_t bytes) = 0;
  /// Sends one message made of `head` then `body` (gathered by the transport, not copied
  /// here first): a small record and the user data it describes.
  virtual Result<TransferPtr> send2(int peer, uint64_t tag, const void* head, size_t head_bytes, const void* body,
                                    size_t body_bytes) = 0;
  /// Receives a message with `tag` from `peer` straight into `buf` (at most `bytes`).
  virtual Result<TransferPtr> recv(int peer, uint64_t tag, void* buf, size_t bytes) = 0;
  /// A send whose size the receiver knows exactly (the operation's descriptors were compared
  /// first): the transport may cut it into pieces spread over several connections to `peer`
  /// (STRATA_UCX_LANES). Received only by recv_bulk with the same `bytes`; never mixed with
  /// send/recv on one tag.
  virtual Result<TransferPtr> send_bulk(int peer, uint64_t tag, const void* buf, size_t bytes) {
    return send(peer, tag, buf, bytes);
  }
  /// The receiving side of send_bulk: exactly `bytes` into `buf`.
  virtual Result<TransferPtr> recv_bulk(int peer, uint64_t tag, void* buf, size_t bytes) {
    return recv(peer, tag, buf, bytes);
  }
  /// Receives one message with `tag` from `peer` scattered over `parts` in order (at most
  /// 3), e.g. a record, then the user buffer its data belongs in, then a spill area. A
  /// shorter message is not an error: Transfer::received tells its length.
  virtual Result<TransferPtr> recv_parts(int peer, uint64_t tag, std::span<const Part> parts) = 0;
  /// Writes `bytes` from `buf` (in our heap) into `peer`'s heap at `dst`, then sends a
  /// zero-byte message with `tag` once the data is visible there: the receiver waits for
  /// that message (recv with bytes = 0), so puts and tag messages complete alike.
  virtual Result<TransferPtr> put(int peer, uint64_t tag, const void* buf, size_t bytes, RemoteRef dst) = 0;

  /// Waits for every transfer. On failure the unfinished ones are cancelled and the first
  /// error is returned: PeerFailed (endpoint error or the policy's check), Timeout, Aborted,
  /// InvalidArgument (a message longer than its receive buffer).
  virtual Status wait(const std::vector<TransferPtr>& xs, const WaitPolicy& policy, const char* what) = 0;
  /// Cancels every unfinished receive among `xs`, for a call that fails before it waited for
  /// them: no message may land later in a buffer its caller reuses. Unfinished sends go on
  /// (they only read).
  virtual void cancel(const std::vector<TransferPtr>& xs) = 0;
  /// Drives progress once and reports whether `x` has finished (for Work::test).
  virtual bool test(const Transfer& x) = 0;
  /// Drives progress once, unless another thread is doing so: a posted send of this rank must
  /// move while the rank waits for something else (a barrier within its host), or a peer
  /// that waits for it in turn never completes.
  virtual void progress() = 0;
  /// Drives progress once and reports whether a message with exactly `tag` from `peer` has
  /// arrived and waits for its receive (it stays queued: a later recv takes it).
  virtual bool probe(int peer, uint64_t tag) = 0;
  /// How many connections to `peer` are open (lanes made so far).
  virtual int connections(int peer) const = 0;
  /// Whether an endpoint error was seen for `peer` (it died or its link broke).
  virtual bool peer_failed(int peer) const = 0;
  /// Forgets everything about `peer` (its endpoint, its memory keys, its failure): it was
  /// replaced by a new process started in recovery epoch `gen`, whose address and keys are
  /// published under that epoch. The next transfer with it connects afresh; the endpoints
  /// to every other peer stay as they are.
  virtual void reset_peer(int peer, uint64_t gen) = 0;
};

/// The UCX transport of one rank: UCP context + worker, worker addresses and rkeys exchanged
/// through the store under "strata/<job>/ucx/". Every segment of `heap` is mapped for RMA
/// when it is created. Unavailable when the build has no UCX.
/// The STRATA_UCX_* settings come from `env`.
Result<std::unique_ptr<Net>> make_ucx_net(const std::string& job_id, int rank, int world_size,
                                          std::shared_ptr<bootstrap::StoreClient> store, memory::Heap& heap,
                                          std::chrono::milliseconds timeout, const Env& env);

/// One line for `strata info`: the UCX version, the data path `auto` would pick here and the
/// STRATA_UCX_* settings; "no (...)" in a build without UCX.
std::string ucx_summary(const Env& env);

}  // namespace strata::transport

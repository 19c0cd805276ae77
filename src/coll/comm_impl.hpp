#pragma once
// Internals behind strata::Communicator: the per-rank context (store, heap, job placement),
// the per-communicator state (control blocks in shared memory, sequence, abort flag, copy
// engine), and the shared-memory control block layout.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <strata/recovery.hpp>
#include <strata/strata.hpp>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"
#include "coll/op.hpp"
#include "common/env.hpp"
#include "common/status.hpp"
#include "memory/heap.hpp"
#include "transport/net.hpp"
#include "transport/shm_sync.hpp"

namespace strata::detail {

struct CommImpl;

/// A process-wide service the recovery layer attaches to a context (the failure monitor);
/// the context only owns it, so the collectives never depend on recovery.
struct ContextService {
  virtual ~ContextService() = default;
};

/// What this process knows about the job's failure epochs (all times CLOCK_REALTIME ns, so
/// they compare across processes).
struct EpochState {
  std::atomic<uint64_t> latest{0};  // newest epoch announced by the controller
  std::atomic<int64_t> seen_ns{0};  // when this process saw `latest` announced
  uint64_t joined = 0;              // epoch the world communicator was last built for
  std::mutex mu;
  recovery::Report report;  // the last recovery, for recovery::last_report
};

/// One rank's process-level state, shared by all its communicators and buffers.
struct ContextImpl {
  bootstrap::JobInfo job;
  Env env;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<bootstrap::StoreClient> store;  // null for a single rank without a store
  std::unique_ptr<memory::Heap> heap;
  std::mutex mu;
  std::vector<std::pair<void*, bool>> retired_ctrl;  // control blocks of destroyed comms
  // External buffers registered for single-copy (CMA) access: base -> bytes.
  std::vector<std::pair<uintptr_t, size_t>> registered;
  /// True when [p, p + bytes) lies inside one registered external buffer.
  bool is_registered(const void* p, size_t bytes);

  // Failure handling: every live communicator, so a failure notice can revoke them all.
  std::vector<std::weak_ptr<CommImpl>> comms;
  EpochState epochs;
  std::unique_ptr<ContextService> monitor;  // null unless the job runs under `strata run --ft`
  /// Fails every pending and later operation of every communicator with `why` (sticky).
  void revoke_all(const Status& why);
  /// Key under the job's store namespace ("strata/<job>/<suffix>").
  std::string key(const std::string& suffix) const { return "strata/" + job.job_id + "/" + suffix; }
  std::vector<std::string> hosts;  // global rank -> host id (filled by make_world)
  // Between hosts; created when the job spans hosts. Declared after heap: it unmaps the
  // heap's segments and removes its listener before the heap goes.
  std::unique_ptr<transport::Net> net;
  ~ContextImpl();
};

inline constexpr uint64_t kCtrlMagic = 0x3143544152545353ull;  // "SSTRATC1"
inline constexpr uint32_t kP2pDepth = 8;

struct P2pSlot {
  uint32_t seq = 0;
  int32_t tag = 0;
  uint8_t dtype = 0;
  uint8_t pad[7] = {};
  uint64_t count = 0;
  uint32_t seg = 0;
  uint32_t flags = 0;
  uint64_t off = 0;
};

/// Largest all_reduce input (bytes per rank) that travels inline in the control block
/// (all_reduce_inline in algorithms.cpp: one cache-line handshake, no heap buffer read).
inline constexpr size_t kInlineBytes = 512;

/// One operation's synchronisation word, descriptor and, for inline all_reduce, input. Two
/// per rank, used by alternate sequence numbers. `ready` carries the rank's sync steps
/// (CommImpl::phase) during the operation; the first step publishes the descriptor. Slot
/// s % 2 is rewritten only at operation s + 2, after every peer has passed the first step of
/// s + 1, so no peer still reads it; and a rank waiting on a peer's slot for s is never
/// overtaken by that peer's writes for s + 2.
struct alignas(64) OpSlot {
  transport::Signal ready;
  coll::OpDesc desc;
  // The first 8 bytes share the cache line of `ready` and the descriptor: a peer's 8-byte
  // all_reduce costs one miss.
  unsigned char data[8 + kInlineBytes];
};
static_assert(offsetof(OpSlot, data) == 56, "ready + descriptor + 8 data bytes fill one cache line");

struct alignas(64) CtrlHeader {
  uint64_t magic = 0;
  int32_t rank = 0;
  int32_t size = 0;
  int32_t pid = 0;
  uint64_t self_addr = 0;  // the block's address in its owner's address space (CMA probe)
  uint32_t cma_ok = 0;     // owner could read every peer with process_vm_readv
  OpSlot slots[2];
  OpSlot& slot(uint32_t seq) { return slots[seq & 1]; }
};

/// Typed view of a control block: header, then 4n size_t (v-collective arrays), then the
/// point-to-point area (per peer: posted signal, done signal, error word, ring of slots).
class CtrlView {
 public:
  CtrlView() = default;
  CtrlView(void* base, int n) : base_(static_cast<char*>(base)), n_(n) {}
  static size_t bytes(int n) { return p2p_offset(n) + static_cast<size_t>(n) * per_peer(); }
  CtrlHeader* hdr() const { return reinterpret_cast<CtrlHeader*>(base_); }
  uint64_t* vec() const { return reinterpret_cast<uint64_t*>(base_ + sizeof(CtrlHeader)); }
  transport::Signal& send_posted(int peer) const { return *reinterpret_cast<transport::Signal*>(peer_area(peer)); }
  transport::Signal& recv_done(int peer) const { return *reinterpret_cast<transport::Signal*>(peer_area(peer) + 64); }
  std::atomic<uint32_t>& recv_error(int peer) const {
    return *reinterpret_cast<std::atomic<uint32_t>*>(peer_area(peer) + 128);
  }
  P2pSlot& slot(int peer, uint32_t seq) const {
    return reinterpret_cast<P2pSlot*>(peer_area(peer) + 192)[seq % kP2pDepth];
  }
  void* base() const { return base_; }

 private:
  static size_t align64(size_t v) { return (v + 63) & ~size_t{63}; }
  static size_t p2p_offset(int n) {
    return align64(sizeof(CtrlHeader) + 4 * sizeof(uint64_t) * static_cast<size_t>(n));
  }
  static size_t per_peer() { return align64(192 + kP2pDepth * sizeof(P2pSlot)); }
  char* peer_area(int peer) const { return base_ + p2p_offset(n_) + static_cast<size_t>(peer) * per_peer(); }
  char* base_ = nullptr;
  int n_ = 0;
};

/// State of an asynchronous operation.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  int rank = -1;
  std::function<Status()> run;             // engine-executed body
  std::function<Status(bool block)> poll;  // for sends: completes by observing the receiver
  std::function<void()> on_destroy;        // releases staging memory
  ~WorkState() {
    if (on_destroy) on_destroy();
  }
  void finish(Status s) {
    std::lock_guard<std::mutex> g(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
};

/// A communicator's state. Members are global ranks. Either all of them are on this host
/// (control blocks in the shared heap, `net` null), or they span hosts: then `net` moves data
/// between ranks, `local` is the shm communicator of the members on this host, and the
/// control-block fields (self, peers, phase) are unused.
struct CommImpl : std::enable_shared_from_this<CommImpl> {
  std::shared_ptr<ContextImpl> ctx;
  std::string id;
  std::vector<int> members;  // comm rank -> global rank
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};

  CtrlView self;
  std::vector<CtrlView> peers;  // indexed by comm rank (self included)
  std::vector<int> pids;        // per comm rank
  std::vector<int> pidfds;      // per comm rank, -1 when same process or unavailable
  void* ctrl_mem = nullptr;

  uint32_t seq = 0;                // collectives executed
  uint32_t phase = 0;              // sync steps published
  std::vector<uint32_t> send_seq;  // per peer
  std::vector<uint32_t> recv_seq;  // per peer
  int split_count = 0;

  std::atomic<bool> abort_flag{false};
  std::mutex err_mu;
  Status sticky;                       // set when the communicator is broken (timeout, peer failure, abort)
  std::atomic<bool> is_broken{false};  // lets the hot path skip err_mu

  std::atomic<uint64_t> ops{0}, staged_bytes{0}, direct_bytes{0}, cma_bytes{0}, temp_bytes{0};
  bool cma_all = false;
  bool oversubscribed = false;  // more members than cores this process may use              // every member can
                                // CMA-read every other member
  std::vector<std::vector<char>> cma_tmp;  // per peer: landing space for CMA reads that feed a reduction

  // Scratch heap blocks used to stage external buffers and for in-place temporaries.
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  Scratch scratch[3];

  // Spanning hosts.
  transport::Net* net = nullptr;               // owned by ctx
  std::shared_ptr<CommImpl> local;             // members on this host, ordered by comm rank
  std::vector<int> host_of;                    // comm rank -> host index (hosts ordered by first comm rank)
  std::vector<int> local_of;                   // comm rank -> index among its host's members
  std::vector<std::vector<int>> host_members;  // host index -> comm ranks
  uint64_t tag_base = 0;                       // communicator id hash, top 16 bits of every tag

  // Copy engine.
  std::mutex exec_mu;
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<std::shared_ptr<WorkState>> queue;
  std::thread engine;
  bool stopping = false;
  bool destroyed = false;

  ~CommImpl();

  Status broken() {
    if (!is_broken.load(std::memory_order_acquire)) return Status::ok();
    std::lock_guard<std::mutex> g(err_mu);
    return sticky;
  }
  void set_broken(const Status& s);
  transport::WaitPolicy policy(Deadline d);
  Status check_peers();
  /// One barrier step across all members. The first step of operation `seq` is its
  /// arrival: the caller has filled this rank's slot, and the step delivers every member's.
  Status sync(Deadline d, const char* what);
  Result<void*> scratch_block(int which, size_t bytes);
  void shutdown();

  // Rebuild hooks for the recovery layer (context.cpp). Callers hold exec_mu, so nothing
  // else runs on this communicator meanwhile.
  /// Zeroes this rank's sequence counters and its control block's sync state, keeping its
  /// identity (and every peer's mapping of it).
  void reset_sync_state();
  /// Maps member r's (new) control block and watches its (new) process.
  Status attach_peer(int r, const memory::SegRef& ref, Deadline d);
  /// Clears the abort flag and the sticky error: the communicator is usable again.
  void clear_broken();
};

/// Builds the world communicator of an initialised context. A replacement rank (epoch > 0)
/// joins the survivors through the recovery layer's rebuild instead.
Result<std::shared_ptr<CommImpl>> make_world(const std::shared_ptr<ContextImpl>& ctx);
/// This rank's record in the store for the world communicator: host, pid, control block.
std::string world_record(const ContextImpl& ctx, const memory::SegRef& ctrl);
struct WorldRecord {
  std::string host;
  long pid = 0;
  memory::SegRef ctrl{};
};
Result<WorldRecord> parse_world_record(const std::string& v);
/// Allocates and initialises this rank's control block for a communicator of n ranks.
Result<void*> new_ctrl_block(ContextImpl& ctx, int rank, int n);
/// The communicator object without any peer attached (the rebuild attaches them).
std::shared_ptr<CommImpl> new_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id, std::vector<int> members,
                                   int rank, void* ctrl_mem);

// Implemented by the recovery layer (src/recovery/).
/// Starts the failure monitor when the job runs under a recovery controller (no-op otherwise).
Status start_recovery_services(const std::shared_ptr<ContextImpl>& ctx);
/// Rebuilds the world communicator in the newest epoch: survivors keep everything that did
/// not touch a failed rank; `fresh` is a replacement joining for the first time.
Status rebuild_world(CommImpl& c, bool fresh);
/// Creates a communicator over `members` (global ranks) given every member's control block.
Result<std::shared_ptr<CommImpl>> make_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                            std::vector<int> members, int rank, void* ctrl_mem,
                                            const std::vector<memory::SegRef>& ctrl_refs, Deadline d);

/// Creates a communicator over `members` that span hosts. `local_ctrl` is this rank's control
/// block for the communicator of its host's members, `local_refs` those of every member on
/// this host in comm-rank order.
Result<std::shared_ptr<CommImpl>> make_net_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                                std::vector<int> members, int rank, void* local_ctrl,
                                                const std::vector<memory::SegRef>& local_refs, Deadline d);

/// Runs one collective (blocking, on the calling thread) with the algorithm that
/// coll/select.cpp chooses (coll/run.cpp). Validation already done.
Status run_collective(CommImpl& c, coll::Op& op);
/// Compares peer r's descriptor `d` (and its count vector `vec` for v-collectives, when
/// known) with this rank's (`me`, `mine`, `op`) in a communicator of n ranks: ok, or
/// InvalidArgument naming both ranks and both calls.
Status compare_descriptor(const coll::Op& op, const coll::OpDesc& mine, int me, const coll::OpDesc& d,
                          const uint64_t* vec, int r, int n);
/// Point-to-point on a communicator that spans hosts: the send is posted now and completes
/// through the returned work's poll; the receive lands straight in the caller's buffer.
Result<std::shared_ptr<WorkState>> post_send_net(CommImpl& c, const coll::Op& op);
Status recv_net(CommImpl& c, const coll::Op& op);
/// Validates a collective's arguments for this rank; InvalidArgument names what is wrong.
Status validate(const CommImpl& c, const coll::Op& op);

}  // namespace strata::detail

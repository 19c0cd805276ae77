#pragma once
// Internals behind strata::Communicator: the per-communicator state (members, control blocks,
// sequence numbers, sticky failure, copy engine) and the functions that build communicators
// and run operations on them. The process context, the control-block layout and the state of
// an asynchronous operation have headers of their own, included here so that code which
// includes this header sees all of them.

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>

#include "coll/context_impl.hpp"
#include "coll/ctrl_block.hpp"
#include "coll/descriptor.hpp"
#include "coll/flight.hpp"
#include "coll/membership.hpp"
#include "coll/op.hpp"
#include "coll/work_state.hpp"
#include "common/deadline.hpp"
#include "common/status.hpp"
#include "memory/heap.hpp"
#include "transport/net.hpp"
#include "transport/shm_sync.hpp"

namespace strata::detail {

/// A communicator's state. Members are global ranks. Either all of them are on this host
/// (control blocks in the shared heap, `net` null), or they span hosts: then `net` moves data
/// between ranks, `local` is the shm communicator of the members on this host, and the
/// control-block fields (self, peers, phase) are unused.
///
/// Declaration order matters for destruction: `ctx` goes last (the heap outlives the
/// scratch blocks and the control block the destructor hands back), and the engine thread
/// has been joined by the destructor before any member goes.
/// Members a communicator across hosts may have: the source rank takes 12 bits of a message
/// tag (coll/net/exec.hpp).
inline constexpr int kMaxNetRanks = 4096;

struct CommImpl : std::enable_shared_from_this<CommImpl> {
  // ---- group and peers: who the members are and how this rank reaches them -----------------
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

  // ---- sequencing: every member counts the same operations in the same order ---------------
  uint32_t seq = 0;                // collectives executed
  uint32_t phase = 0;              // sync steps published
  std::vector<uint32_t> send_seq;  // per peer
  std::vector<uint32_t> recv_seq;  // per peer
  // Whether a send was refused by its receive: read in the send's slot, until the slot is
  // reused by a later send or restarted for a new epoch, which first move the verdict into the
  // send's own cell (a Work may be waited for long after). 0: still in the slot, 1: taken, 2:
  // refused. Per peer, the cells of the sends whose slots hold them; all under p2p_mu.
  struct SendVerdict {
    uint32_t seq = 0;
    std::shared_ptr<std::atomic<int>> cell;
  };
  std::vector<std::array<SendVerdict, kP2pDepth>> send_verdicts;
  std::mutex p2p_mu;
  /// Moves the verdict of the send whose slot `v` names into its cell, if the slot is still
  /// its. Caller holds p2p_mu.
  void settle_verdict(int peer, const SendVerdict& v);
  // Receives from this rank itself queued on the copy engine and not finished: a blocking
  // send to itself completes only through one of them (communicator.cpp).
  std::atomic<int> self_recvs_queued{0};
  int any_source_next = 0;  // where a receive from any rank starts its scan
  // Across hosts, a receive from any rank must read a header to learn its tag; one whose tag
  // did not match waits here (per peer) for the receive that takes it (coll/net/p2p.cpp).
  struct StashedHeader {
    bool full = false;
    P2pHeader h;
    size_t received = 0;     // bytes of the header's message (header + data of a small one)
    std::vector<char> data;  // kEagerBytes once used: the data that rode with the header
  };
  std::vector<StashedHeader> net_stash;  // per peer; empty until a receive from any rank
  int split_count = 0;
  // moe::Buffers made on this communicator (collective, same order everywhere): each takes
  // the next number, which keeps the message tags of two live Buffers apart across hosts.
  uint32_t moe_buffers = 0;

  // ---- failure and wait policy: failures are sticky; every wait polls the abort flag -------
  std::atomic<bool> abort_flag{false};
  std::mutex err_mu;
  Status sticky;                       // set when the communicator is broken (timeout, peer failure, abort)
  std::atomic<bool> is_broken{false};  // lets the hot path skip err_mu
  // Set by Communicator::abort() only: waits that outlive a peer's death (moe masking) must
  // still end on a user abort, which a sticky PeerFailed would otherwise hide.
  std::atomic<bool> user_aborted{false};

  // ---- flight recorder (coll/flight.hpp) ---------------------------------------------------
  FlightRecorder flight;                   // the last STRATA_FLIGHT_RECORDER operations
  std::atomic<bool> flight_dumped{false};  // the ring went to stderr when the communicator broke
  std::vector<uint32_t> peer_flight_len;   // per comm rank: entries of its ring we have mapped (0: none)

  // ---- counters (Communicator::stats) ------------------------------------------------------
  std::atomic<uint64_t> ops{0}, staged_bytes{0}, direct_bytes{0}, cma_bytes{0}, temp_bytes{0};
  std::atomic<uint64_t> peer_waits{0};     // peer signals waited for in sync() (recovery's cost accounting)
  std::atomic<uint64_t> desc_messages{0};  // first-round messages sent to other members across hosts

  // ---- single copy and scratch --------------------------------------------------------------
  bool cma_all = false;                    // every member can CMA-read every other member
  bool oversubscribed = false;             // more members than cores this process may use
  std::vector<std::vector<char>> cma_tmp;  // per peer: landing space for CMA reads that feed a reduction
  std::vector<char> piece;                 // two-shot all_reduce pushing: one reduced piece, in cache

  // A choice between two ways of running a call that changes no result, learned per size
  // (log2 of its bytes): each mode is tried kTrials times, then the faster one stays; a call
  // long and clearly slower one way is decided after kEarlyTrials (TimedChoice,
  // coll/shm/exec.cpp).
  struct Trials {
    static constexpr int kTrials = 8;
    static constexpr int kEarlyTrials = 2;
    int runs[2] = {0, 0};                         // calls timed per mode
    int64_t best_ns[2] = {INT64_MAX, INT64_MAX};  // the fastest of them
    int chosen = -1;                              // the mode kept, once both were tried
  };
  Trials two_shot_stores[65];  // two-shot's reduced slice: 0 cached, 1 streamed stores
  // An external input of an out-of-place all_to_all, all_gather, reduce_scatter (and v-forms):
  // 0 staged in rounds, 1 read by CMA. One set per kind: what a CMA read saves differs.
  Trials all_to_all_cma[65];
  Trials all_gather_cma[65];
  Trials reduce_scatter_cma[65];
  // The external buffers of an out-of-place two-shot all_reduce: 0 staged in heap slots and
  // landing slots, 1 read and written by the peers by CMA.
  Trials all_reduce_cma[65];

  // Scratch heap blocks used to stage external buffers and for in-place temporaries.
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  Scratch scratch[3];

  // ---- spanning hosts -----------------------------------------------------------------------
  transport::Net* net = nullptr;               // owned by ctx
  std::vector<char> host_record;               // this rank's record of the host round (coll/net/run.cpp)
  std::shared_ptr<CommImpl> local;             // members on this host, ordered by comm rank
  std::vector<int> host_of;                    // comm rank -> host index (hosts ordered by first comm rank)
  std::vector<int> local_of;                   // comm rank -> index among its host's members
  std::vector<std::vector<int>> host_members;  // host index -> comm ranks
  uint64_t tag_base = 0;                       // unique in the job (claimed in the store), bits 61..48 of every tag
  // The recovery epoch this communicator was last rebuilt in, in every tag (4 bits): a message
  // a survivor sent in an interrupted epoch can never match a receive of the next one.
  uint32_t tag_epoch = 0;
  // How often reset_sync_state() restarted the message numbers: a send posted before a
  // rebuild must not settle (coll/communicator.cpp, send_done) the slot of a newer message that
  // carries its number.
  std::atomic<uint64_t> sync_resets{0};
  // First messages from other hosts that this rank did not wait for: the operation needed no
  // data from them (the root's host of an eager broadcast or scatter, the other ranks of an
  // eager gather or reduce), so it returned once its own messages were sent. Each such
  // operation leaves a record, read and checked later (coll/net/run.cpp, check_late): all of
  // them when an operation starts that waits for the other hosts anyway, the oldest when
  // kLateWindow are pending. So a root streams up to kLateWindow operations ahead of the
  // slowest host instead of one, and at most that many records' messages are outstanding.
  struct LateCheck {
    coll::Op op;                             // the operation (its buffers are not used)
    coll::OpDesc mine;                       // this rank's descriptor of it
    bool rails = false;                      // its rail round (else the all-pairs round)
    std::vector<int> from;                   // comm rank each receive is from
    std::vector<transport::TransferPtr> rx;  // the receives, into `area`
    std::vector<size_t> at;                  // where each one's record is in `area`
    std::vector<char> sent, got;             // per comm rank, for a mismatch's settling
    std::vector<char> area;                  // not resized while pending
  };
  static constexpr size_t kLateWindow = 16;
  std::deque<LateCheck> late;                 // oldest first
  std::vector<std::vector<char>> late_spare;  // areas of checked records, for the next ones
  /// Cancels the late receives (the communicator is rebuilt or destroyed).
  void drop_late();

  // ---- copy engine: one thread runs the _async work in order --------------------------------
  std::mutex exec_mu;  // held while an operation runs, by the engine or by a blocking caller
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<std::shared_ptr<WorkState>> queue;
  std::thread engine;
  bool stopping = false;
  bool destroyed = false;

  ~CommImpl();

  // ---- failure -------------------------------------------------------------------------------
  /// The sticky error, or ok while the communicator is usable.
  Status broken() {
    if (!is_broken.load(std::memory_order_acquire)) return Status::ok();
    std::lock_guard<std::mutex> g(err_mu);
    return sticky;
  }
  /// Makes `s` the sticky error (the first one stays).
  void set_broken(const Status& s);
  /// What Communicator::abort() does, with `why` (Aborted) as the error: every pending and
  /// later operation fails with it, here and on this rank's part of a hierarchical one.
  void abort(const Status& why);
  /// How this rank waits until `d`: spin then sleep, polling the abort flag and the peers.
  transport::WaitPolicy policy(Deadline d);
  /// PeerFailed when a member's process on this host has exited (its pidfd); Aborted when the
  /// program was interrupted (interrupt_requested(): a signal handler of the binding raised).
  Status check_peers();
  /// PeerFailed when member r's process on this host has exited.
  Status check_peer(int r);
  /// Whether member r's process on this host has exited (its pidfd is readable).
  bool exited(int r) const;

  // ---- operations ----------------------------------------------------------------------------
  /// One barrier step across all members. The first step of operation `seq` is its
  /// arrival: the caller has filled this rank's slot, and the step delivers every member's.
  Status sync(Deadline d, const char* what);
  /// Scratch block `which`, grown to at least `bytes`.
  Result<void*> scratch_block(int which, size_t bytes);
  /// Stops the copy engine (waits for the operation it runs).
  void shutdown();

  // ---- rebuild hooks (context.cpp), used by the recovery layer through coll/membership.hpp --
  // Callers hold exec_mu, so nothing else runs on this communicator meanwhile.
  /// Zeroes this rank's sequence counters and its control block's sync state, keeping its
  /// identity (and every peer's mapping of it).
  void reset_sync_state(uint64_t epoch);
  /// Maps member r's (new) control block and watches its (new) process.
  Status attach_peer(int r, const memory::SegRef& ref, Deadline d);
  /// Clears the abort flag and the sticky error: the communicator is usable again.
  void clear_broken();
};

/// This rank's record in the store for the world communicator: host, pid, control block
/// (parse_world_record in coll/membership.hpp reads it).
std::string world_record(const ContextImpl& ctx, const memory::SegRef& ctrl);
/// Key of global rank `rank`'s world record in the store.
std::string world_key(const ContextImpl& ctx, int rank);
/// Allocates and initialises this rank's control block for a communicator of n ranks.
Result<void*> new_ctrl_block(ContextImpl& ctx, int rank, int n);
/// The communicator object without any peer attached (the rebuild attaches them).
std::shared_ptr<CommImpl> new_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id, std::vector<int> members,
                                   int rank, void* ctrl_mem);
/// Whether this rank can read every peer's control block with process_vm_readv (and the Env
/// allows single-copy reads at all).
bool probe_cma(const CommImpl& c);
/// Creates a communicator over `members` (global ranks) given every member's control block.
Result<std::shared_ptr<CommImpl>> make_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                            std::vector<int> members, int rank, void* ctrl_mem,
                                            const std::vector<memory::SegRef>& ctrl_refs, Deadline d);

/// Creates a communicator over `members` that span hosts. `local_ctrl` is this rank's control
/// block for the communicator of its host's members, `local_refs` those of every member on
/// this host in comm-rank order. Without `local_refs` (a rank that replaces a failed one) the
/// members on this host are attached later, one by one (attach_peer).
Result<std::shared_ptr<CommImpl>> make_net_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                                std::vector<int> members, int rank, void* local_ctrl,
                                                const std::vector<memory::SegRef>* local_refs, Deadline d);

/// Runs one collective (blocking, on the calling thread) with the algorithm that
/// coll/select.cpp chooses (coll/run.cpp). Validation already done. `queued`: the flight
/// recorder's handle of _async work (recorded when it was queued), or 0.
Status run_collective(CommImpl& c, coll::Op& op, uint64_t queued = 0);
/// Point-to-point on a communicator that spans hosts: the send is posted now and completes
/// through the returned work's poll; the receive lands straight in the caller's buffer.
Result<std::shared_ptr<WorkState>> post_send_net(CommImpl& c, const coll::Op& op);
Status recv_net(CommImpl& c, const coll::Op& op);
/// A receive from any rank on a communicator that spans hosts (same matching rule as on
/// one host); `*source` is the sender's comm rank.
Status recv_any_net(CommImpl& c, const coll::Op& op, int* source);
/// Validates a collective's arguments for this rank; InvalidArgument names what is wrong.
Status validate(const CommImpl& c, const coll::Op& op);

}  // namespace strata::detail

// Public API glue: argument checks, the copy engine (async work), point-to-point,
// split, symmetric allocation, and conversion of Status into strata::Error.

#include <unistd.h>

#include <cstring>
#include <limits>

#include "coll/comm_impl.hpp"
#include "common/log.hpp"
#include "common/reduce.hpp"

namespace strata {
namespace detail {

using coll::Op;
using coll::OpKind;

void heap_free(const std::shared_ptr<ContextImpl>& ctx, void* p, bool symmetric) noexcept {
  if (!ctx || !p) return;
  if (ctx->defer_free(p, symmetric)) return;
  Status s = symmetric ? ctx->heap->free_symmetric(p) : ctx->heap->free(p);
  if (!s.is_ok()) STRATA_LOG(Warn, "freeing a heap buffer: " << s.to_string());
}

void throw_invalid(const std::string& message) { throw Error(Code::InvalidArgument, message); }

namespace {

void engine_loop(CommImpl* c, std::weak_ptr<CommImpl> self) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(c->q_mu);
      c->q_cv.wait(lk, [&] { return c->stopping || !c->queue.empty(); });
      if (c->queue.empty()) return;
    }
    std::shared_ptr<WorkState> w;
    Status s;
    {
      // The engine takes work only while holding exec_mu, so a blocking call that finds the
      // queue empty under exec_mu knows nothing is in flight ahead of it.
      std::lock_guard<std::mutex> ex(c->exec_mu);
      {
        std::lock_guard<std::mutex> g(c->q_mu);
        w = c->queue.front();
        c->queue.pop_front();
      }
      s = w->run();
    }
    w->finish(std::move(s));
    // Dropping the work here may drop the communicator's last reference (a refusal or a Work
    // nobody holds); the destructor then runs on this thread, detaches it, and `c` is gone.
    w.reset();
    if (self.expired()) return;
  }
}

std::shared_ptr<WorkState> submit(CommImpl& c, std::function<Status()> fn) {
  auto w = std::make_shared<WorkState>();
  w->rank = c.rank;
  w->run = std::move(fn);
  w->on_finish = [ctx = c.ctx, t = c.ctx->open_async()] { ctx->close_async(t); };
  {
    std::lock_guard<std::mutex> g(c.q_mu);
    if (!c.engine.joinable()) c.engine = std::thread(engine_loop, &c, c.weak_from_this());
    c.queue.push_back(w);
  }
  c.q_cv.notify_one();
  return w;
}

/// Runs `fn` after everything queued before it, on this thread when nothing is queued.
Status execute(CommImpl& c, const std::function<Status()>& fn) {
  {
    std::unique_lock<std::mutex> ex(c.exec_mu);
    bool empty;
    {
      std::lock_guard<std::mutex> g(c.q_mu);
      empty = c.queue.empty();
    }
    if (empty) return fn();
  }
  auto w = submit(c, fn);
  std::unique_lock<std::mutex> lk(w->mu);
  w->cv.wait(lk, [&] { return w->done; });
  return w->status;
}

Status usable(const CommImpl& c) {
  if (c.destroyed) return invalid_argument("communicator was destroyed");
  if (c.ctx->forked())
    return invalid_argument("communicator '" + c.id + "' used in a process forked from the rank that made it: " +
                            "its peers know only the parent, so a forked child cannot take part in its operations");
  return Status::ok();
}

/// validate(), refusing the call in the order of operations when it fails.
Status validated(const std::shared_ptr<CommImpl>& impl, const Op& op) {
  Status v = validate(*impl, op);
  if (!v.is_ok()) refuse_call(impl);
  return v;
}

// ---- point to point ------------------------------------------------------------------------

/// The peer of a receive from any rank (Communicator::recv_any).
constexpr int kAnySource = -1;

Status check_p2p(const CommImpl& c, const Op& op, const char* name) {
  STRATA_RETURN_IF_ERROR(usable(c));
  const bool any = op.kind == OpKind::Recv && op.peer == kAnySource;
  if (!any && (op.peer < 0 || op.peer >= c.size))
    return invalid_argument(std::string(name) + ": peer " + std::to_string(op.peer) +
                            " is out of range for a communicator of " + std::to_string(c.size) + " ranks");
  if (static_cast<unsigned>(op.dtype) > static_cast<unsigned>(DataType::Float64))
    return invalid_argument(std::string(name) + ": invalid dtype");
  size_t e = dtype_size(op.dtype);
  if (op.count > (size_t{1} << 62) / e)
    return invalid_argument(std::string(name) + ": count " + std::to_string(op.count) + " overflows the byte size");
  const void* buf = op.kind == OpKind::Send ? op.in : op.out;
  if (op.count && !buf) return invalid_argument(std::string(name) + ": buffer is null");
  if (op.count) {
    auto* heap = c.ctx->heap.get();
    const memory::Heap* owner = memory::Heap::find_owner(buf);
    if (!heap->locate(buf, op.count * e) && owner && owner != heap)
      return invalid_argument(std::string(name) + ": buffer belongs to the heap of another communicator (rank " +
                              std::to_string(owner->rank()) + ")");
  }
  return Status::ok();
}

std::string p2p_desc(const char* name, uint64_t count, uint8_t dtype, int tag) {
  return std::string(name) + "(count=" + std::to_string(count) + ", dtype=" + to_string(static_cast<DataType>(dtype)) +
         ", tag=" + std::to_string(tag) + ")";
}

/// Settles a posted message for the receiver (kP2pClaimed) or the sender (kP2pWithdrawn),
/// unless it was settled before (P2pSlot::claim). Returns how it is settled now.
uint32_t settle(P2pSlot& slot, uint32_t to) {
  uint32_t now = 0;
  return std::atomic_ref<uint32_t>(slot.claim).compare_exchange_strong(now, to, std::memory_order_acq_rel) ? to : now;
}

/// Completion of a posted send: the receiver acknowledged sequence `s`, posted while the
/// message numbers had been restarted `resets` times (CommImpl::sync_resets). `verdict` is
/// the send's cell (CommImpl::SendVerdict).
Status send_done(CommImpl& c, int peer, uint32_t s, uint64_t resets, uint32_t peer_resets, Deadline d, bool block,
                 const std::atomic<int>& verdict) {
  const CtrlView& rv = c.peers[peer];
  transport::Signal& done = rv.recv_done(c.rank);
  // Past its deadline a send fails however its Work is asked (test(), wait_for() poll): the
  // blocking path then sees the deadline expired at once, and withdraws the message.
  if (block || (d.expired() && !transport::reached(done.value.load(std::memory_order_acquire), s))) {
    Status st = c.broken();
    const bool was_broken = !st.is_ok();
    if (!was_broken) st = transport::wait_reached(done, s, c.policy(d), "send");
    const bool delivered = transport::reached(done.value.load(std::memory_order_acquire), s);
    // Nothing to withdraw for a send of an epoch that is over, or one delivered before the
    // communicator broke.
    if (!st.is_ok() && (c.sync_resets.load(std::memory_order_acquire) != resets || (delivered && was_broken)))
      return st;
    if (!st.is_ok() && !delivered) {
      // This call fails, and its caller may reuse the buffer at once: the message is withdrawn,
      // so that a receive that comes later fails instead of copying whatever is there by then.
      // Unless the receiver claimed it first: then it is copying now, and the send completes.
      P2pSlot& slot = c.self.slot(peer, s);
      if (slot.seq != s) return st;  // taken and its slot reused: it was delivered
      if (settle(slot, kP2pWithdrawn) == kP2pWithdrawn) {
        if (was_broken) return st;
        std::string msg = st.message() + " on rank " + std::to_string(c.rank) + " waiting for rank " +
                          std::to_string(peer) + " to receive (send #" + std::to_string(s) +
                          "; withdrawn: its receive fails)";
        if (std::string a = peer_activity(c, peer); !a.empty()) msg += "; " + a;
        Status full(st.code(), std::move(msg), peer);
        // Revoked as after any timeout: this pair's messages are out of step from here.
        c.set_broken(full);
        return full;
      }
      // The receiver's copy is under way: its acknowledgment follows. Only the receiver's own
      // death cuts that wait short (not abort(), nor another rank's failure: either would hand
      // the buffer back while the copy still reads it).
      transport::WaitPolicy p = c.policy(Deadline::after(c.timeout));
      p.abort = nullptr;
      // Nor does an acknowledgement the receiver wiped when it restarted its signals for a
      // new epoch ever come: that restart means its receive (and the copy) is over.
      bool moved_on = false;
      p.check = [&c, &rv, &moved_on, peer, peer_resets] {
        if (std::atomic_ref<uint32_t>(rv.hdr()->resets).load(std::memory_order_acquire) != peer_resets) {
          moved_on = true;
          return Status(Code::Aborted, "moved on");
        }
        return c.check_peer(peer);
      };
      Status w = transport::wait_reached(done, s, p, "send");
      if (moved_on) return st;
      if (!w.is_ok())
        return Status(w.code(),
                      w.message() + " on rank " + std::to_string(c.rank) + ": rank " + std::to_string(peer) +
                          " began receiving send #" + std::to_string(s) + " and did not finish",
                      peer);
    }
  } else if (!transport::reached(done.value.load(std::memory_order_acquire), s)) {
    return Status(Code::Unavailable, "pending");
  }
  bool refused = false;
  {
    std::lock_guard<std::mutex> g(c.p2p_mu);
    // Still 0: the slot is still this send's (a reuse or restart moves the verdict first).
    if (const int v = verdict.load(std::memory_order_relaxed); v != 0) {
      refused = v == 2;
    } else {
      const P2pSlot& sl = c.self.slot(peer, s);
      refused =
          std::atomic_ref<uint32_t>(const_cast<uint32_t&>(sl.claim)).load(std::memory_order_acquire) == kP2pRefused;
    }
  }
  if (refused)
    return Status(Code::InvalidArgument,
                  "send/recv mismatch: rank " + std::to_string(peer) + " posted a receive that does not match rank " +
                      std::to_string(c.rank) + "'s send #" + std::to_string(s) + " (see the error on rank " +
                      std::to_string(peer) + ")",
                  peer);
  return Status::ok();
}

struct StagedSend {
  std::shared_ptr<ContextImpl> ctx;
  void* block = nullptr;
};

Result<std::shared_ptr<WorkState>> post_send(CommImpl& c, const Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const size_t bytes = op.count * dtype_size(op.dtype);
  const int peer = op.peer;
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  memory::Heap& heap = *c.ctx->heap;
  const void* src = op.in;
  void* staged = nullptr;
  std::optional<memory::SegRef> ref;
  if (bytes) {
    ref = heap.locate(src, bytes);
    if (!ref) {
      STRATA_ASSIGN_OR_RETURN(staged, heap.alloc(bytes));
      kernels::copy(staged, src, bytes);
      c.staged_bytes.fetch_add(bytes, std::memory_order_relaxed);
      ref = heap.locate(staged, bytes);
    }
  }
  uint32_t s = ++c.send_seq[peer];
  if (s > kP2pDepth) {
    // The ring holds kP2pDepth messages per pair; wait for the receiver to free our slot.
    Status st = transport::wait_reached(c.peers[peer].recv_done(c.rank), s - kP2pDepth, c.policy(d), "send");
    if (!st.is_ok()) {
      if (staged) (void)heap.free(staged);
      --c.send_seq[peer];  // nothing was posted
      std::string msg = st.message() + " on rank " + std::to_string(c.rank) + " waiting for rank " +
                        std::to_string(peer) + " to receive one of the " + std::to_string(kP2pDepth) +
                        " sends already posted to it (send #" + std::to_string(s) + " needs a free place)";
      if (std::string a = peer_activity(c, peer); !a.empty()) msg += "; " + a;
      Status full(st.code(), std::move(msg), peer);
      c.set_broken(full);
      return full;
    }
  }
  P2pSlot& sl = c.self.slot(peer, s);
  auto verdict = std::make_shared<std::atomic<int>>(0);
  {
    // The send that had this slot (s - kP2pDepth) was taken, as waited for above: its verdict
    // moves to its Work's cell before the slot is rewritten.
    std::lock_guard<std::mutex> g(c.p2p_mu);
    CommImpl::SendVerdict& prev = c.send_verdicts[peer][s % kP2pDepth];
    c.settle_verdict(peer, prev);
    prev = {s, verdict};
    sl.seq = s;
    sl.tag = op.tag;
    sl.dtype = static_cast<uint8_t>(op.dtype);
    sl.count = op.count;
    sl.seg = ref ? ref->seg : 0;
    sl.off = ref ? ref->offset : 0;
    sl.claim = 0;  // published with the rest by the release below
  }
  transport::publish(c.self.send_posted(peer), s);

  auto w = std::make_shared<WorkState>();
  w->rank = c.rank;
  auto self = c.shared_from_this();
  const uint64_t resets = c.sync_resets.load(std::memory_order_acquire);
  const uint32_t peer_resets = std::atomic_ref<uint32_t>(c.peers[peer].hdr()->resets).load(std::memory_order_acquire);
  w->poll = [self, peer, s, resets, peer_resets, d, verdict](bool block) {
    return send_done(*self, peer, s, resets, peer_resets, d, block, *verdict);
  };
  if (staged) {
    auto ctx = c.ctx;
    // Freed when the Work goes away; by then the receiver has copied (or the job failed).
    w->on_destroy = [ctx, staged, self, peer, s, peer_resets] {
      // Delivered, withdrawn, or its receiver restarted for a new epoch (after its receive).
      if (transport::reached(self->peers[peer].recv_done(self->rank).value.load(), s) ||
          std::atomic_ref<uint32_t>(self->self.slot(peer, s).claim).load(std::memory_order_acquire) == kP2pWithdrawn ||
          std::atomic_ref<uint32_t>(self->peers[peer].hdr()->resets).load(std::memory_order_acquire) != peer_resets)
        (void)ctx->heap->free(staged);
      // Otherwise the receiver may still read it: leak rather than corrupt.
    };
  }
  c.direct_bytes.fetch_add(staged ? 0 : bytes, std::memory_order_relaxed);
  return w;
}

/// Takes message `r` from `peer`, already posted: checks it against the receive, copies it,
/// and acknowledges it (a mismatch is acknowledged too, so that the sender completes).
Status take_message(CommImpl& c, const Op& op, int peer, uint32_t r, Deadline d) {
  const CtrlView& sv = c.peers[peer];
  if (settle(sv.slot(c.rank, r), kP2pClaimed) != kP2pClaimed) {
    // The sender's send failed (timed out, or its communicator was aborted) before this
    // receive came: its buffer is the caller's again, so nothing is copied. The message's
    // number is used up on both sides, so this pair stays in step.
    return Status(Code::Aborted,
                  "recv on rank " + std::to_string(c.rank) + ": rank " + std::to_string(peer) + "'s send #" +
                      std::to_string(r) +
                      " failed on its side (a timeout, abort(), or an earlier failure there) before this receive "
                      "took it",
                  peer);
  }
  // A claimed message that is not taken is still acknowledged, as an error, so that the sender
  // completes rather than wait for it.
  auto refuse = [&] {
    std::atomic_ref<uint32_t>(sv.slot(c.rank, r).claim).store(kP2pRefused, std::memory_order_relaxed);
    transport::publish(c.self.recv_done(peer), r);
  };
  P2pSlot sl = sv.slot(c.rank, r);
  if (sl.tag != op.tag || sl.dtype != static_cast<uint8_t>(op.dtype) || sl.count != op.count) {
    refuse();
    return Status(Code::InvalidArgument,
                  "send/recv mismatch: rank " + std::to_string(c.rank) + " called " +
                      p2p_desc("recv", op.count, static_cast<uint8_t>(op.dtype), op.tag) + " from rank " +
                      std::to_string(peer) + " but rank " + std::to_string(peer) + " called " +
                      p2p_desc("send", sl.count, sl.dtype, sl.tag),
                  peer);
  }
  const size_t bytes = op.count * dtype_size(op.dtype);
  if (bytes) {
    auto src = c.ctx->heap->peer_ptr(c.members[peer], {sl.seg, sl.off}, bytes, d);
    if (!src.is_ok()) {
      refuse();
      return src.status();
    }
    kernels::copy(op.out, src.value(), bytes);
    c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  transport::publish(c.self.recv_done(peer), r);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

/// Whether this rank's next message to itself is posted. A blocking receive runs after every
/// call issued before it, and sends are posted when called: if it is not posted by then, no
/// call of this rank will post it while the receive waits.
bool self_message_posted(const CommImpl& c) {
  return transport::reached(c.peers[c.rank].send_posted(c.rank).value.load(std::memory_order_acquire),
                            c.recv_seq[c.rank] + 1);
}

Status do_recv(CommImpl& c, const Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const int peer = op.peer;
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  uint32_t r = ++c.recv_seq[peer];
  const CtrlView& sv = c.peers[peer];
  Status st = transport::wait_reached(sv.send_posted(c.rank), r, c.policy(d), "recv");
  if (!st.is_ok()) {
    std::string msg = st.message() + " on rank " + std::to_string(c.rank) + " waiting for a send from rank " +
                      std::to_string(peer) + " (receive #" + std::to_string(r) + ")";
    if (std::string a = peer_activity(c, peer); !a.empty()) msg += "; " + a;
    Status full(st.code(), std::move(msg), peer);
    if (st.code() == Code::Timeout) {
      // Nothing was taken: the number goes back, and the same receive may be called again
      // (the monitored barrier of the torch backend polls ranks this way).
      --c.recv_seq[peer];
      flight_dump_stderr(c, "timed out");
    } else {
      c.set_broken(full);
    }
    return full;
  }
  return take_message(c, op, peer, r, d);
}

/// A receive from any rank: the first rank whose oldest unreceived message carries the
/// receive's tag. Only each sender's oldest message is a candidate, so every sender's
/// messages are still received in the order it sent them. Ranks are scanned from the one
/// after the last match, so a busy sender cannot starve the others.
Status do_recv_any(CommImpl& c, const Op& op, int* source) {
  STRATA_RETURN_IF_ERROR(c.broken());
  if (c.net) return recv_any_net(c, op, source);
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  int found = -1;
  auto ready = [&] {
    for (int i = 0; i < c.size; ++i) {
      const int p = (c.any_source_next + i) % c.size;
      const uint32_t r = c.recv_seq[p] + 1;
      if (!transport::reached(c.peers[p].send_posted(c.rank).value.load(std::memory_order_acquire), r)) continue;
      if (c.peers[p].slot(c.rank, r).tag != op.tag) continue;
      found = p;
      return true;
    }
    return false;
  };
  Status st = transport::wait_until(ready, c.policy(d), "recv from any source");
  if (!st.is_ok()) {
    Status full(st.code(), st.message() + " on rank " + std::to_string(c.rank) + " waiting for a send with tag " +
                               std::to_string(op.tag) + " from any rank");
    if (st.code() != Code::Timeout) c.set_broken(full);  // a timeout took nothing
    return full;
  }
  c.any_source_next = (found + 1) % c.size;
  *source = found;
  return take_message(c, op, found, ++c.recv_seq[found], d);
}

}  // namespace

/// A collective this rank refuses (its arguments are invalid) still takes its place in the
/// order of operations: a barrier marked as refused (coll::kRootRefused) runs behind the work
/// queued before it, and every peer fails its matching call naming this rank, at once, instead
/// of waiting for it until the timeout. The caller gets its own error now; the barrier's result
/// (a mismatch, or ok where every rank refused the same call) is of no further use to it.
void refuse_call(const std::shared_ptr<CommImpl>& impl) {
  if (!impl || !usable(*impl).is_ok() || impl->size == 1) return;
  CommImpl& c = *impl;
  Op op;
  op.kind = OpKind::Barrier;
  op.root = coll::kRootRefused;
  const uint64_t q = flight_queue(c, op);
  (void)submit(c, [impl, op, q]() mutable { return run_collective(*impl, op, q); });
}

void throw_invalid_on(const std::shared_ptr<CommImpl>& comm, const std::string& message) {
  if (!comm) throw Error(Code::InvalidArgument, message);
  refuse_call(comm);
  throw Error(Code::InvalidArgument, on_rank(message, comm->rank), comm->rank);
}

std::string on_rank(const std::string& message, int rank) {
  const std::string::size_type colon = message.find(':');
  const std::string where = " on rank " + std::to_string(rank);
  // Only a call's name goes before the rank ("all_gather: ..."); any other text keeps its words.
  if (colon == std::string::npos || colon == 0 || message.find(' ') < colon)
    return message + " (" + where.substr(1) + ")";
  return message.substr(0, colon) + where + message.substr(colon);
}

}  // namespace detail

// ---- Work ------------------------------------------------------------------------------------

namespace {
void complete_poll(detail::WorkState& w, bool block) {
  std::lock_guard<std::mutex> g(w.mu);
  if (w.done || !w.poll) return;
  Status s = w.poll(block);
  if (!block && s.code() == Code::Unavailable && s.message() == "pending") return;
  w.status = std::move(s);
  w.done = true;
  w.cv.notify_all();
}
}  // namespace

namespace {
/// Unfinished work runs in the process that started it: in a child forked since, nothing would
/// ever finish it.
void refuse_in_child(const detail::WorkState& s) {
  if (!s.done && s.fork_gen != fork_generation())
    throw Error(Code::InvalidArgument,
                "Work waited for in a process forked after the operation started: it runs in the parent, so "
                "it would never complete here",
                s.rank);
}
}  // namespace

void Work::wait() {
  if (!state_) return;
  if (state_->poll) complete_poll(*state_, true);
  std::unique_lock<std::mutex> lk(state_->mu);
  refuse_in_child(*state_);
  state_->cv.wait(lk, [&] { return state_->done; });
  throw_if_error(state_->status, state_->rank);
}

bool Work::wait_for(std::chrono::milliseconds d) {
  if (!state_) return true;
  const auto until = Deadline::after(d).at();  // saturates: milliseconds::max() waits forever
  if (state_->poll) {
    while (!completed() && std::chrono::steady_clock::now() < until) {
      complete_poll(*state_, false);
      if (!completed()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  std::unique_lock<std::mutex> lk(state_->mu);
  refuse_in_child(*state_);
  if (!state_->cv.wait_until(lk, until, [&] { return state_->done; })) return false;
  throw_if_error(state_->status, state_->rank);
  return true;
}

bool Work::test() {
  if (!state_) return true;
  if (state_->poll) complete_poll(*state_, false);
  std::lock_guard<std::mutex> g(state_->mu);
  refuse_in_child(*state_);
  if (!state_->done) return false;
  throw_if_error(state_->status, state_->rank);
  return true;
}

Code Work::status() const {
  if (!state_) return Code::Ok;
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->done ? state_->status.code() : Code::Ok;
}

bool Work::completed() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->done;
}

// ---- Registration ----------------------------------------------------------------------------

Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    Registration old(std::move(*this));  // unregisters what we held
    comm_ = std::move(o.comm_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = o.bytes_;
  }
  return *this;
}

Registration::~Registration() {
  if (!comm_ || !ptr_) return;
  auto& ctx = *comm_->ctx;
  std::lock_guard<std::mutex> g(ctx.mu);
  for (auto it = ctx.registered.begin(); it != ctx.registered.end(); ++it)
    if (it->first == reinterpret_cast<uintptr_t>(ptr_) && it->second == bytes_) {
      ctx.registered.erase(it);
      break;
    }
}

// ---- Communicator ----------------------------------------------------------------------------

namespace {
detail::CommImpl& need_impl(const std::shared_ptr<detail::CommImpl>& p) {
  if (!p) throw Error(Code::InvalidArgument, "operation on an empty (invalid) Communicator");
  return *p;
}
}  // namespace

int Communicator::rank() const { return need_impl(impl_).rank; }
int Communicator::size() const { return need_impl(impl_).size; }
int Communicator::local_rank() const {
  auto& c = need_impl(impl_);
  return c.local ? c.local->rank : c.rank;
}
int Communicator::local_size() const {
  auto& c = need_impl(impl_);
  return c.local ? c.local->size : c.size;
}
int Communicator::global_rank(int r) const {
  auto& c = need_impl(impl_);
  if (r < 0 || r >= c.size)
    throw Error(Code::InvalidArgument, "global_rank: rank " + std::to_string(r) + " out of range");
  return c.members[r];
}
std::chrono::milliseconds Communicator::timeout() const { return need_impl(impl_).timeout; }
Stats Communicator::stats() const {
  auto& c = need_impl(impl_);
  return {c.ops.load(), c.staged_bytes.load(), c.direct_bytes.load(), c.cma_bytes.load(), c.temp_bytes.load()};
}
std::shared_ptr<detail::ContextImpl> Communicator::context() const { return need_impl(impl_).ctx; }

size_t Communicator::bytes_of(size_t count, size_t elem_size, const char* what) const {
  if (elem_size && count > std::numeric_limits<size_t>::max() / elem_size)
    throw Error(Code::InvalidArgument,
                std::string(what) + ": " + std::to_string(count) + " elements of " + std::to_string(elem_size) +
                    " bytes overflow the byte size",
                impl_ ? impl_->rank : -1);
  return count * elem_size;
}

void* Communicator::alloc_bytes(size_t bytes, size_t alignment) {
  auto& c = need_impl(impl_);
  return value_or_throw(c.ctx->heap->alloc(bytes, alignment), c.rank);
}

void Communicator::free_bytes(void* p) {
  auto& c = need_impl(impl_);
  throw_if_error(c.ctx->heap->free(p), c.rank);
}

bool Communicator::is_heap(const void* p, size_t bytes) const {
  return need_impl(impl_).ctx->heap->locate(p, bytes ? bytes : 1).has_value();
}

Registration Communicator::register_buffer(void* ptr, size_t bytes) {
  auto& c = need_impl(impl_);
  if (!ptr && bytes) throw Error(Code::InvalidArgument, "register_buffer: ptr is null", c.rank);
  if (bytes > UINTPTR_MAX - reinterpret_cast<uintptr_t>(ptr))
    throw Error(Code::InvalidArgument,
                "register_buffer on rank " + std::to_string(c.rank) + ": " + std::to_string(bytes) + " bytes from " +
                    std::to_string(reinterpret_cast<uintptr_t>(ptr)) + " run past the end of memory",
                c.rank);
  if (c.ctx->heap->locate(ptr, bytes ? bytes : 1))
    throw Error(Code::InvalidArgument, "register_buffer: memory is already in the registered heap", c.rank);
  {
    std::lock_guard<std::mutex> g(c.ctx->mu);
    c.ctx->registered.emplace_back(reinterpret_cast<uintptr_t>(ptr), bytes);
  }
  return Registration(impl_, ptr, bytes);
}

namespace {

using coll::Op;
using coll::OpKind;

/// Posts a send, recorded by the flight recorder from now until the receiver has it.
Result<std::shared_ptr<detail::WorkState>> posted_send(detail::CommImpl& c, const Op& op) {
  const uint64_t h = detail::flight_begin(c, op, c.send_seq[op.peer] + 1);
  auto w = c.net ? detail::post_send_net(c, op) : detail::post_send(c, op);
  if (!w.is_ok()) {
    detail::flight_end(c, h, w.status());
    return w;
  }
  if (h && w.value()->poll) {
    auto self = c.shared_from_this();
    w.value()->poll = [self, h, inner = std::move(w.value()->poll)](bool block) {
      Status s = inner(block);
      if (block || s.code() != Code::Unavailable || s.message() != "pending") detail::flight_end(*self, h, s);
      return s;
    };
  }
  return w;
}

/// A receive, recorded (under exec_mu, like a collective); `queued` as in run_collective.
Status recorded_recv(detail::CommImpl& c, const Op& op, uint64_t queued) {
  const uint64_t h = detail::flight_begin(c, op, c.recv_seq[op.peer] + 1, queued);
  Status st = c.net ? detail::recv_net(c, op) : detail::do_recv(c, op);
  detail::flight_end(c, h, st);
  return st;
}

void run_blocking(const std::shared_ptr<detail::CommImpl>& impl, Op op) {
  auto& c = need_impl(impl);
  throw_if_error(detail::usable(c), c.rank);
  if (op.kind == OpKind::Send || op.kind == OpKind::Recv) {
    throw_if_error(detail::check_p2p(c, op, coll::to_string(op.kind)), c.rank);
    if (op.kind == OpKind::Send) {
      // Within a host a send completes when it is received, and its receive would have to
      // be issued while this call blocks the caller: only a receive queued before it
      // (recv_async) can take the message. (Across hosts a small send completes on its own.)
      if (!c.net && op.peer == c.rank && c.self_recvs_queued.load(std::memory_order_acquire) == 0)
        throw Error(Code::InvalidArgument,
                    "send: peer " + std::to_string(op.peer) +
                        " is this rank itself, and no receive from itself is queued, so the send could never "
                        "complete; use send_async() and then recv(), or recv_async() before send()",
                    c.rank, op.peer);
      auto w = value_or_throw(posted_send(c, op), c.rank);
      Work(w).wait();
      return;
    }
    throw_if_error(detail::execute(c,
                                   [&] {
                                     if (!c.net && op.peer == c.rank && !detail::self_message_posted(c))
                                       return strata::invalid_argument(
                                           "recv: peer " + std::to_string(op.peer) +
                                           " is this rank itself, and no send to itself is pending, so the "
                                           "receive could never complete; post the send first with send_async()");
                                     return recorded_recv(c, op, 0);
                                   }),
                   c.rank);
    return;
  }
  throw_if_error(detail::validated(impl, op), c.rank);
  throw_if_error(detail::execute(c, [&] { return detail::run_collective(c, op); }), c.rank);
}

Work run_async(const std::shared_ptr<detail::CommImpl>& impl, Op op) {
  auto& c = need_impl(impl);
  throw_if_error(detail::usable(c), c.rank);
  if (op.kind == OpKind::Send) {
    throw_if_error(detail::check_p2p(c, op, "send"), c.rank);
    // Posting happens now, so a later receive (ours or the peer's) can never wait behind it.
    return Work(value_or_throw(posted_send(c, op), c.rank));
  }
  if (op.kind == OpKind::Recv) {
    throw_if_error(detail::check_p2p(c, op, "recv"), c.rank);
    auto keep = impl;
    const uint64_t q = detail::flight_queue(c, op);
    const bool self = op.peer == c.rank;
    if (self) c.self_recvs_queued.fetch_add(1, std::memory_order_acq_rel);
    return Work(detail::submit(c, [keep, op, q, self]() mutable {
      Status st = recorded_recv(*keep, op, q);
      if (self) keep->self_recvs_queued.fetch_sub(1, std::memory_order_acq_rel);
      return st;
    }));
  }
  throw_if_error(detail::validated(impl, op), c.rank);
  auto keep = impl;
  const uint64_t q = detail::flight_queue(c, op);
  return Work(detail::submit(c, [keep, op, q]() mutable { return detail::run_collective(*keep, op, q); }));
}

Op make(OpKind k, const void* in, void* out, size_t count, DataType dt, const CollOptions& o) {
  Op op;
  op.kind = k;
  op.in = in;
  op.out = out;
  op.count = count;
  op.dtype = dt;
  op.opts = o;
  return op;
}

std::vector<size_t> vec_of(const size_t* p, int n) {
  if (!p) return {};
  return std::vector<size_t>(p, p + n);
}

}  // namespace

// Each collective's Op is built by one function, used by the blocking call and its _async twin.

namespace {

Op reducing_op(OpKind k, const void* in, void* out, size_t count, DataType dt, ReduceOp op, const CollOptions& o) {
  Op x = make(k, in, out, count, dt, o);
  x.rop = op;
  return x;
}

Op rooted_op(OpKind k, const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o) {
  Op x = make(k, in, out, count, dt, o);
  x.root = root;
  return x;
}

Op reduce_op(const void* in, void* out, size_t count, DataType dt, ReduceOp op, int root, const CollOptions& o) {
  Op x = reducing_op(OpKind::Reduce, in, out, count, dt, op, o);
  x.root = root;
  return x;
}

Op vector_op(OpKind k, const void* in, void* out, const size_t* counts, int n, DataType dt, ReduceOp op,
             const CollOptions& o) {
  Op x = make(k, in, out, 0, dt, o);
  x.counts = vec_of(counts, n);
  x.rop = op;
  return x;
}

Op all_to_all_v_op(const void* in, const size_t* send_counts, const size_t* send_displs, void* out,
                   const size_t* recv_counts, const size_t* recv_displs, int n, DataType dt, const CollOptions& o) {
  Op x = make(OpKind::AllToAllV, in, out, 0, dt, o);
  x.counts = vec_of(send_counts, n);
  x.sdispls = vec_of(send_displs, n);
  x.rcounts = vec_of(recv_counts, n);
  x.rdispls = vec_of(recv_displs, n);
  return x;
}

Op p2p_op(OpKind k, const void* in, void* out, size_t count, DataType dt, int peer, int tag, const CollOptions& o) {
  Op x = make(k, in, out, count, dt, o);
  x.peer = peer;
  x.tag = tag;
  return x;
}

}  // namespace

void Communicator::all_reduce(const void* in, void* out, size_t count, DataType dt, ReduceOp op, const CollOptions& o) {
  run_blocking(impl_, reducing_op(OpKind::AllReduce, in, out, count, dt, op, o));
}
Work Communicator::all_reduce_async(const void* in, void* out, size_t count, DataType dt, ReduceOp op,
                                    const CollOptions& o) {
  return run_async(impl_, reducing_op(OpKind::AllReduce, in, out, count, dt, op, o));
}

void Communicator::reduce(const void* in, void* out, size_t count, DataType dt, ReduceOp op, int root,
                          const CollOptions& o) {
  run_blocking(impl_, reduce_op(in, out, count, dt, op, root, o));
}
Work Communicator::reduce_async(const void* in, void* out, size_t count, DataType dt, ReduceOp op, int root,
                                const CollOptions& o) {
  return run_async(impl_, reduce_op(in, out, count, dt, op, root, o));
}

void Communicator::broadcast(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o) {
  run_blocking(impl_, rooted_op(OpKind::Broadcast, in, out, count, dt, root, o));
}
Work Communicator::broadcast_async(const void* in, void* out, size_t count, DataType dt, int root,
                                   const CollOptions& o) {
  return run_async(impl_, rooted_op(OpKind::Broadcast, in, out, count, dt, root, o));
}

void Communicator::all_gather(const void* in, void* out, size_t count, DataType dt, const CollOptions& o) {
  run_blocking(impl_, make(OpKind::AllGather, in, out, count, dt, o));
}
Work Communicator::all_gather_async(const void* in, void* out, size_t count, DataType dt, const CollOptions& o) {
  return run_async(impl_, make(OpKind::AllGather, in, out, count, dt, o));
}

void Communicator::all_gather_v(const void* in, void* out, const size_t* counts, DataType dt, const CollOptions& o) {
  run_blocking(impl_, vector_op(OpKind::AllGatherV, in, out, counts, size(), dt, ReduceOp::Sum, o));
}
Work Communicator::all_gather_v_async(const void* in, void* out, const size_t* counts, DataType dt,
                                      const CollOptions& o) {
  return run_async(impl_, vector_op(OpKind::AllGatherV, in, out, counts, size(), dt, ReduceOp::Sum, o));
}

void Communicator::reduce_scatter(const void* in, void* out, size_t count, DataType dt, ReduceOp op,
                                  const CollOptions& o) {
  run_blocking(impl_, reducing_op(OpKind::ReduceScatter, in, out, count, dt, op, o));
}
Work Communicator::reduce_scatter_async(const void* in, void* out, size_t count, DataType dt, ReduceOp op,
                                        const CollOptions& o) {
  return run_async(impl_, reducing_op(OpKind::ReduceScatter, in, out, count, dt, op, o));
}

void Communicator::reduce_scatter_v(const void* in, void* out, const size_t* counts, DataType dt, ReduceOp op,
                                    const CollOptions& o) {
  run_blocking(impl_, vector_op(OpKind::ReduceScatterV, in, out, counts, size(), dt, op, o));
}
Work Communicator::reduce_scatter_v_async(const void* in, void* out, const size_t* counts, DataType dt, ReduceOp op,
                                          const CollOptions& o) {
  return run_async(impl_, vector_op(OpKind::ReduceScatterV, in, out, counts, size(), dt, op, o));
}

void Communicator::all_to_all(const void* in, void* out, size_t count, DataType dt, const CollOptions& o) {
  run_blocking(impl_, make(OpKind::AllToAll, in, out, count, dt, o));
}
Work Communicator::all_to_all_async(const void* in, void* out, size_t count, DataType dt, const CollOptions& o) {
  return run_async(impl_, make(OpKind::AllToAll, in, out, count, dt, o));
}

void Communicator::all_to_all_v(const void* in, const size_t* send_counts, const size_t* send_displs, void* out,
                                const size_t* recv_counts, const size_t* recv_displs, DataType dt,
                                const CollOptions& o) {
  run_blocking(impl_, all_to_all_v_op(in, send_counts, send_displs, out, recv_counts, recv_displs, size(), dt, o));
}
Work Communicator::all_to_all_v_async(const void* in, const size_t* send_counts, const size_t* send_displs, void* out,
                                      const size_t* recv_counts, const size_t* recv_displs, DataType dt,
                                      const CollOptions& o) {
  return run_async(impl_, all_to_all_v_op(in, send_counts, send_displs, out, recv_counts, recv_displs, size(), dt, o));
}

void Communicator::gather(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o) {
  run_blocking(impl_, rooted_op(OpKind::Gather, in, out, count, dt, root, o));
}
Work Communicator::gather_async(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o) {
  return run_async(impl_, rooted_op(OpKind::Gather, in, out, count, dt, root, o));
}

void Communicator::scatter(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o) {
  run_blocking(impl_, rooted_op(OpKind::Scatter, in, out, count, dt, root, o));
}
Work Communicator::scatter_async(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o) {
  return run_async(impl_, rooted_op(OpKind::Scatter, in, out, count, dt, root, o));
}

void Communicator::barrier(const CollOptions& o) {
  run_blocking(impl_, make(OpKind::Barrier, nullptr, nullptr, 0, DataType::UInt8, o));
}
Work Communicator::barrier_async(const CollOptions& o) {
  return run_async(impl_, make(OpKind::Barrier, nullptr, nullptr, 0, DataType::UInt8, o));
}

void Communicator::send(const void* buf, size_t count, DataType dt, int peer, int tag, const CollOptions& o) {
  run_blocking(impl_, p2p_op(OpKind::Send, buf, nullptr, count, dt, peer, tag, o));
}
Work Communicator::send_async(const void* buf, size_t count, DataType dt, int peer, int tag, const CollOptions& o) {
  return run_async(impl_, p2p_op(OpKind::Send, buf, nullptr, count, dt, peer, tag, o));
}

void Communicator::recv(void* buf, size_t count, DataType dt, int peer, int tag, const CollOptions& o) {
  if (peer == detail::kAnySource)
    throw Error(Code::InvalidArgument, "recv: peer -1 is out of range; recv_any() receives from any rank",
                need_impl(impl_).rank);
  run_blocking(impl_, p2p_op(OpKind::Recv, nullptr, buf, count, dt, peer, tag, o));
}
int Communicator::recv_any(void* buf, size_t count, DataType dt, int tag, const CollOptions& o) {
  auto& c = need_impl(impl_);
  Op op = p2p_op(OpKind::Recv, nullptr, buf, count, dt, detail::kAnySource, tag, o);
  throw_if_error(detail::check_p2p(c, op, "recv_any"), c.rank);
  int source = -1;
  throw_if_error(detail::execute(c, [&] { return detail::do_recv_any(c, op, &source); }), c.rank);
  return source;
}
Work Communicator::recv_async(void* buf, size_t count, DataType dt, int peer, int tag, const CollOptions& o) {
  if (peer == detail::kAnySource)
    throw Error(Code::InvalidArgument, "recv_async: peer -1 is out of range; recv_any() receives from any rank",
                need_impl(impl_).rank);
  return run_async(impl_, p2p_op(OpKind::Recv, nullptr, buf, count, dt, peer, tag, o));
}

// ---- split, symmetric allocation, lifetime ---------------------------------------------------

namespace {

/// All-gather of a small fixed-size record through the heap, for the call `issuer` names
/// (coll::kRootSplitExchange, kRootSymmetricExchange: errors here and on peers name it).
template <class T>
std::vector<T> gather_records(const std::shared_ptr<detail::CommImpl>& impl, const T& mine, int issuer) {
  auto& c = *impl;
  auto& heap = *c.ctx->heap;
  void* in = value_or_throw(heap.alloc(sizeof(T)), c.rank);
  void* out = value_or_throw(heap.alloc(sizeof(T) * c.size), c.rank);
  struct Free {
    memory::Heap& heap;
    void *in, *out;
    ~Free() { (void)heap.free(in), (void)heap.free(out); }
  } free_both{heap, in, out};
  std::memcpy(in, &mine, sizeof(T));
  std::vector<T> all(c.size);
  try {
    coll::Op op = make(OpKind::AllGather, in, out, sizeof(T), DataType::UInt8, {});
    op.root = issuer;  // a peer's all_gather of the same size is a mismatch (coll/op.hpp)
    run_blocking(impl, op);
  } catch (const Error& e) {
    throw Error(e.code(),
                std::string(coll::exchange_of(OpKind::AllGather, issuer)) +
                    " (its exchange among the ranks, an all_gather of " + std::to_string(sizeof(T)) +
                    " bytes per rank): " + e.what(),
                e.rank(), e.peer());
  }
  std::memcpy(all.data(), out, sizeof(T) * c.size);
  return all;
}

}  // namespace

Communicator Communicator::split(int color, int key) const {
  auto& c = need_impl(impl_);
  struct Entry {
    int32_t color, key;
  };
  auto entries = gather_records(impl_, Entry{color < 0 ? -1 : color, key}, coll::kRootSplitExchange);
  std::vector<int> order;  // parent ranks of our new group
  for (int r = 0; r < c.size; ++r)
    if (color >= 0 && entries[r].color == color) order.push_back(r);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return entries[a].key < entries[b].key; });
  int new_rank = -1;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] == c.rank) new_rank = static_cast<int>(i);
  const int n = static_cast<int>(order.size());

  // A group whose members are all on one host meets through the shared heap; one that spans
  // hosts gets a control block for the part of it on this host. Every rank of the parent
  // takes part in the one exchange of block references below.
  const auto& ctx = *c.ctx;
  auto host_of = [&](int parent_rank) -> const std::string& { return ctx.hosts[c.members[parent_rank]]; };
  bool spans = false;
  std::vector<int> local_order;  // parent ranks of our group on this host, in new-rank order
  for (int r : order) {
    if (host_of(r) != host_of(order[0])) spans = true;
    if (host_of(r) == ctx.job.host_id) local_order.push_back(r);
  }
  int local_rank = -1;
  for (size_t i = 0; i < local_order.size(); ++i)
    if (local_order[i] == c.rank) local_rank = static_cast<int>(i);

  void* ctrl = nullptr;
  memory::SegRef ref{};
  if (color >= 0) {
    ctrl =
        spans ? value_or_throw(detail::new_ctrl_block(*c.ctx, local_rank, static_cast<int>(local_order.size())), c.rank)
              : value_or_throw(detail::new_ctrl_block(*c.ctx, new_rank, n), c.rank);
    ref = *c.ctx->heap->locate(ctrl, 1);
  }
  auto refs_all = gather_records(impl_, ref, coll::kRootSplitExchange);
  int split_no = c.split_count++;
  if (color < 0) return Communicator();

  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[i] = c.members[order[i]];
  std::string id = c.id + "/" + std::to_string(split_no) + ":" + std::to_string(color);
  const Deadline d = Deadline::after(c.timeout);
  if (spans) {
    std::vector<memory::SegRef> lrefs(local_order.size());
    for (size_t i = 0; i < local_order.size(); ++i) lrefs[i] = refs_all[local_order[i]];
    return Communicator(value_or_throw(
        detail::make_net_comm(c.ctx, std::move(id), std::move(members), new_rank, ctrl, &lrefs, d), c.rank));
  }
  std::vector<memory::SegRef> refs(n);
  for (int i = 0; i < n; ++i) refs[i] = refs_all[order[i]];
  auto res = detail::make_comm(c.ctx, std::move(id), std::move(members), new_rank, ctrl, refs, d);
  return Communicator(value_or_throw(std::move(res), c.rank));
}

void* Communicator::alloc_symmetric_bytes(size_t bytes) {
  auto& c = need_impl(impl_);
  // A rank whose allocation fails still takes part in the exchange, so that every rank
  // fails this call (not the next one, against an exchange the others are still waiting in).
  constexpr uint64_t kFailed = ~uint64_t{0};
  Result<void*> got = c.ctx->heap->alloc_symmetric(bytes);
  void* p = got.is_ok() ? got.value() : nullptr;
  struct Rec {
    uint64_t bytes, offset;
  };
  auto ref = p ? c.ctx->heap->locate(p, 1) : std::nullopt;
  const uint64_t mine = ref ? ref->offset : kFailed;
  std::vector<Rec> all;
  try {
    all = gather_records(impl_, Rec{bytes, mine}, coll::kRootSymmetricExchange);
  } catch (...) {
    if (p) (void)c.ctx->heap->free_symmetric(p);
    throw;
  }
  if (!got.is_ok()) throw_if_error(got.status(), c.rank);
  for (int r = 0; r < c.size; ++r) {
    if (all[r].offset == kFailed) {
      (void)c.ctx->heap->free_symmetric(p);
      throw Error(Code::Unavailable,
                  "alloc_symmetric: rank " + std::to_string(r) + " could not allocate " + std::to_string(all[r].bytes) +
                      " bytes (see its error), so no rank keeps this allocation",
                  c.rank, r);
    }
    if (all[r].bytes != bytes || all[r].offset != mine) {
      (void)c.ctx->heap->free_symmetric(p);
      throw Error(Code::InvalidArgument,
                  "alloc_symmetric: rank " + std::to_string(c.rank) + " allocated " + std::to_string(bytes) +
                      " bytes at offset " + std::to_string(mine) + " but rank " + std::to_string(r) + " allocated " +
                      std::to_string(all[r].bytes) + " bytes at offset " + std::to_string(all[r].offset) +
                      " (symmetric allocations must be made in the same order)",
                  c.rank, r);
    }
  }
  return p;
}

void Communicator::abort() {
  auto& c = need_impl(impl_);
  c.abort(aborted("abort() was called on rank " + std::to_string(c.rank)));
}

void Communicator::destroy() {
  if (!impl_) return;
  impl_->shutdown();
  impl_->destroyed = true;
  impl_.reset();
}

}  // namespace strata

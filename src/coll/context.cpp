// Joining a job: the per-rank context (store, heap), communicator construction, and the
// hooks a rebuild uses (reset_sync_state, attach_peer, clear_broken; see coll/membership.hpp).

#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "coll/comm_impl.hpp"
#include "common/log.hpp"
#include "common/parse.hpp"

namespace strata::detail {

ContextImpl::~ContextImpl() {
  if (!forked()) return;
  // A forked child's copy: the monitor's thread is the parent's (there is none to join), and
  // the heap's listener and the transport's endpoints are the parent's to close.
  (void)monitor.release();
  (void)net.release();
  (void)heap.release();
}

void ContextImpl::reclaim_ctrl_blocks() {
  std::erase_if(retired_ctrl, [this](void* mem) {
    const auto* h = static_cast<const CtrlHeader*>(mem);
    const CtrlView v(mem, h->size);
    for (int r = 0; r < h->size; ++r)
      if (r != h->rank && v.done_with(r).load(std::memory_order_acquire) == 0) return false;
    (void)heap->free(mem);
    return true;
  });
}

uint64_t ContextImpl::open_async() {
  std::lock_guard<std::mutex> g(async_mu_);
  async_open_.insert(async_next_);
  return async_next_++;
}

void ContextImpl::close_async(uint64_t ticket) {
  std::vector<HeldFree> ready;
  {
    std::lock_guard<std::mutex> g(async_mu_);
    async_open_.erase(ticket);
    // Every ticket below the oldest open one is finished.
    const uint64_t oldest = async_open_.empty() ? async_next_ : *async_open_.begin();
    auto keep =
        std::partition(held_frees_.begin(), held_frees_.end(), [&](const HeldFree& f) { return f.before > oldest; });
    ready.assign(keep, held_frees_.end());
    held_frees_.erase(keep, held_frees_.end());
  }
  for (const HeldFree& f : ready) {
    Status s = f.symmetric ? heap->free_symmetric(f.p) : heap->free(f.p);
    if (!s.is_ok()) STRATA_LOG(Warn, "freeing a heap buffer after the async work on it: " << s.to_string());
  }
}

bool ContextImpl::defer_free(void* p, bool symmetric) {
  std::lock_guard<std::mutex> g(async_mu_);
  if (async_open_.empty()) return false;
  held_frees_.push_back({async_next_, p, symmetric});
  return true;
}

bool ContextImpl::is_registered(const void* p, size_t bytes) {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(mu);
  for (auto [base, len] : registered)
    if (a >= base && a + bytes <= base + len) return true;
  return false;
}

void ContextImpl::revoke_all(const Status& why) {
  std::vector<std::shared_ptr<CommImpl>> live;
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto& w : comms)
      if (auto c = w.lock()) live.push_back(std::move(c));
  }
  for (auto& c : live) {
    c->set_broken(why);
    c->abort_flag.store(true, std::memory_order_release);
  }
}

namespace {

int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : static_cast<int>(fd);
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

std::string world_key(const ContextImpl& ctx, int rank) { return world_record_key(ctx.job.job_id, rank); }

namespace {

/// The records of `ranks` (world_key + `suffix`) in one store request, not one per rank: a
/// replacement joining a job of N ranks otherwise waits N - 1 store round trips, each for the
/// store's thread to be scheduled on a busy host. A timeout names the missing keys, which
/// end in the ranks that never published `what` names.
/// The wait goes in slices of a second: between two, one request lists the ranks the launcher
/// saw exit (exited_key), and one of `ranks` among them, which will never publish, ends the
/// wait at once with its fate instead of at the deadline.
Result<std::vector<std::string>> read_records(ContextImpl& ctx, const std::vector<int>& ranks,
                                              const std::string& suffix, const std::string& what) {
  std::vector<std::string> keys;
  keys.reserve(ranks.size());
  for (int r : ranks) keys.push_back(world_key(ctx, r) + suffix);
  const std::string waiting = "rank " + std::to_string(ctx.job.rank) + " waiting for " + what + ": ";
  const Deadline until = Deadline::after(ctx.timeout);
  for (;;) {
    const auto slice = std::min(until.remaining(), std::chrono::milliseconds(1000));
    auto v = ctx.store->get_many(keys, slice);
    if (v.is_ok()) return v;
    if (v.status().code() != Code::Timeout) return v.status().with_context(waiting);
    if (until.expired()) {
      // The last slice's message, with the whole wait's length.
      const std::string& m = v.status().message();
      const size_t at = m.find(" waiting for");
      return Status(Code::Timeout, waiting + "timed out after " + std::to_string(ctx.timeout.count()) + " ms" +
                                       (at == std::string::npos ? ": " + m : m.substr(at)));
    }
    // Bounded by the wait's deadline: a store gone away must not hold the wait past it.
    auto gone = ctx.store->list(bootstrap::exited_prefix(ctx.job.job_id), until);
    if (!gone.is_ok()) continue;  // a hint only: the wait goes on
    for (const std::string& k : *gone) {
      const auto r = parse_int(std::string_view(k).substr(k.rfind('/') + 1), 0, ctx.job.world_size - 1);
      if (!r.is_ok()) continue;
      const auto at = std::find(ranks.begin(), ranks.end(), static_cast<int>(r.value()));
      if (at == ranks.end()) continue;
      // One that published before it exited is not what this wait misses.
      auto published = ctx.store->try_get(keys[static_cast<size_t>(at - ranks.begin())], until);
      if (!published.is_ok() || *published) continue;
      auto how = ctx.store->try_get(k, until);
      return Status(Code::Unavailable,
                    waiting + "rank " + std::to_string(r.value()) + " " + (how.is_ok() && *how ? **how : "exited") +
                        " before it published it: it never joined the job (does every rank call strata::init()?)",
                    static_cast<int>(r.value()));
    }
  }
}

}  // namespace

void CommImpl::set_broken(const Status& s) {
  bool first = false;
  {
    std::lock_guard<std::mutex> g(err_mu);
    if (sticky.is_ok()) {
      sticky = Status(s.code(), "communicator is unusable after an earlier failure: " + s.message(), s.peer());
      first = true;
    }
    is_broken.store(true, std::memory_order_release);
  }
  // A hang or an abort is when the user asks what this rank was doing: say it once.
  if (first && (s.code() == Code::Timeout || s.code() == Code::Aborted) && !flight_dumped.exchange(true))
    flight_dump_stderr(*this, s.code() == Code::Timeout ? "timed out" : "aborted");
}

transport::WaitPolicy CommImpl::policy(Deadline d) {
  transport::WaitPolicy p;
  p.deadline = d;
  p.abort = &abort_flag;
  p.spin_us = oversubscribed ? 0 : ctx->env.spin_us;
  p.yield_us = oversubscribed ? 2000 : 200;
  p.check = [this] { return check_peers(); };
  return p;
}

void CommImpl::drop_late() {
  // An expired deadline: what has arrived is taken, the rest cancelled, so that nothing lands
  // in an area after this.
  transport::WaitPolicy p;
  p.deadline = Deadline::after(std::chrono::milliseconds(0));
  for (LateCheck& l : late)
    if (!l.rx.empty()) (void)net->wait(l.rx, p, "late descriptors");
  late.clear();
}

void CommImpl::abort(const Status& why) {
  for (CommImpl* c : {this, local.get()}) {
    if (!c) continue;
    c->user_aborted.store(true);
    c->abort_flag.store(true);
    c->set_broken(why);
  }
}

Status CommImpl::check_peers() {
  // A wait within the host may stand between this rank and the progress its posted sends to
  // other hosts need (send_async, then a barrier): whoever waits drives the transport too.
  if (ctx->net) ctx->net->progress();
  if (interrupt_requested()) {
    // Interrupted (Ctrl-C in Python): the call stops wherever it is in its steps, so the
    // communicator cannot go on, as after abort().
    Status why = aborted("interrupted by a signal on rank " + std::to_string(rank));
    abort(why);
    return why;
  }
  // Every rank that has exited is named: a survivor that failed because of the first one
  // may have exited too by the time this rank looks, and naming only the lowest rank would
  // blame it.
  std::string who;
  int first = -1, dead = 0;
  for (int r = 0; r < size; ++r) {
    if (!exited(r)) continue;
    who += std::string(dead++ ? " and " : "") + "rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) + ")";
    if (first < 0) first = r;
  }
  if (!dead) return Status::ok();
  return peer_failed(who + " exited", first);
}

Status CommImpl::check_peer(int r) {
  if (!exited(r)) return Status::ok();
  return peer_failed("rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) + ") exited", r);
}

bool CommImpl::exited(int r) const {
  if (pidfds[r] < 0) return false;
  pollfd p{pidfds[r], POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

Status CommImpl::sync(Deadline d, const char* what) {
  ++phase;
  transport::publish(self.hdr()->slot(seq).ready, phase);
  auto pol = policy(d);
  peer_waits.fetch_add(static_cast<uint64_t>(size - 1), std::memory_order_relaxed);
  for (int k = 1; k < size; ++k) {
    int r = (rank + k) % size;
    Status s = transport::wait_reached(peers[r].hdr()->slot(seq).ready, phase, pol, what);
    if (!s.is_ok()) {
      std::string msg = s.message() + " on rank " + std::to_string(rank) + " waiting for rank " + std::to_string(r) +
                        " (operation #" + std::to_string(seq) + ", timeout " +
                        (d.budget() == std::chrono::milliseconds::max() ? std::string("none")
                                                                        : std::to_string(d.budget().count()) + " ms") +
                        ")";
      if (s.code() == Code::Timeout || s.code() == Code::PeerFailed) {
        std::string peer = peer_activity(*this, r);
        if (!peer.empty()) msg += "; " + peer;
      }
      Status full(s.code(), std::move(msg), s.peer() >= 0 ? s.peer() : r);
      set_broken(full);
      return full;
    }
  }
  return Status::ok();
}

Result<void*> CommImpl::scratch_block(int which, size_t bytes) {
  Scratch& s = scratch[which];
  if (s.bytes >= bytes && s.p) return s.p;
  // Grow geometrically so a sweep of sizes reuses the same (already touched) pages.
  const size_t want = std::max(bytes, s.bytes * 2);
  if (s.p) (void)ctx->heap->free(s.p);
  s.p = nullptr;
  s.bytes = 0;
  STRATA_ASSIGN_OR_RETURN(void* p, ctx->heap->alloc(want));
  s.p = p;
  s.bytes = want;
  return p;
}

void CommImpl::shutdown() {
  if (ctx->forked()) {  // the engine thread is the parent's (and q_mu may be held there)
    if (engine.joinable()) engine.detach();
    return;
  }
  {
    std::lock_guard<std::mutex> g(q_mu);
    stopping = true;
  }
  q_cv.notify_all();
  if (!engine.joinable()) return;
  // The engine thread may drop the last reference itself (a finished Work held it).
  if (engine.get_id() == std::this_thread::get_id()) engine.detach();
  else engine.join();
}

CommImpl::~CommImpl() {
  shutdown();
  // A forked child's copy: the control blocks and scratch are the parent's, still in use.
  if (ctx->forked()) return;
  drop_late();
  for (int fd : pidfds)
    if (fd >= 0) ::close(fd);
  for (auto& s : scratch)
    if (s.p) (void)ctx->heap->free(s.p);
  // Done with the peers' blocks; ours stays allocated until every peer is done with it: a
  // slow peer may still read our last phase word.
  for (int r = 0; r < size; ++r)
    if (r != rank && r < static_cast<int>(peers.size()) && peers[r].base())
      peers[r].done_with(rank).store(1, std::memory_order_release);
  std::lock_guard<std::mutex> g(ctx->mu);
  if (ctrl_mem) ctx->retired_ctrl.push_back(ctrl_mem);
  ctx->reclaim_ctrl_blocks();
}

void CommImpl::settle_verdict(int peer, const SendVerdict& v) {
  if (!v.cell || v.cell->load(std::memory_order_relaxed) != 0) return;
  const P2pSlot& sl = self.slot(peer, v.seq);
  if (sl.seq != v.seq) return;
  const uint32_t claim = std::atomic_ref<uint32_t>(const_cast<uint32_t&>(sl.claim)).load(std::memory_order_acquire);
  v.cell->store(claim == kP2pRefused ? 2 : 1, std::memory_order_relaxed);
}

void CommImpl::reset_sync_state(uint64_t epoch) {
  seq = 0;
  phase = 0;
  std::fill(send_seq.begin(), send_seq.end(), 0);
  std::fill(recv_seq.begin(), recv_seq.end(), 0);
  {
    std::lock_guard<std::mutex> g(p2p_mu);
    for (int r = 0; r < static_cast<int>(send_verdicts.size()); ++r)
      for (SendVerdict& v : send_verdicts[r]) {
        if (!net) settle_verdict(r, v);  // the slots keep their messages; the numbers restart
        v = SendVerdict();
      }
  }
  sync_resets.fetch_add(1, std::memory_order_acq_rel);
  tag_epoch = static_cast<uint32_t>(epoch & 0xf);
  if (net) {
    drop_late();
    // No block of its own: the members on this host meet through `local`'s.
    any_source_next = 0;
    for (auto& st : net_stash) st = StashedHeader();
    if (local) local->reset_sync_state(epoch);
    return;
  }
  // Only the counters restart. A slow survivor may still be inside the old epoch's last
  // operation, reading this block's descriptors, count vectors and message slots after its
  // wait for them succeeded: zeroing those under it turned its clean PeerFailed into a false
  // "collective mismatch" (a zero descriptor) or a read of segment 0 at offset 0. Nothing
  // of the new epoch reads a descriptor or slot before the signal that follows its rewrite.
  CtrlHeader* h = self.hdr();
  for (OpSlot& sl : h->slots) transport::publish(sl.ready, 0);
  for (int r = 0; r < size; ++r) {
    transport::publish(self.send_posted(r), 0);
    transport::publish(self.recv_done(r), 0);
  }
  std::atomic_ref<uint32_t>(h->resets).fetch_add(1, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

Status CommImpl::attach_peer(int r, const memory::SegRef& ref, Deadline d) {
  if (net) {
    // A member on this host: its block is one of `local`'s; liveness is watched here too.
    STRATA_RETURN_IF_ERROR(local->attach_peer(local_of[r], ref, d));
    if (pidfds[r] >= 0) ::close(pidfds[r]);
    pids[r] = local->pids[local_of[r]];
    pidfds[r] = open_pidfd(pids[r]);
    return Status::ok();
  }
  const size_t bytes = CtrlView::bytes(size);
  auto p = ctx->heap->peer_ptr(members[r], ref, bytes, d);
  if (!p.is_ok()) return p.status().with_context("mapping the control block of rank " + std::to_string(r) + ": ");
  CtrlView v(p.value(), size);
  CtrlHeader* h = v.hdr();
  // The size first: ranks started with different world sizes (STRATA_WORLD_SIZE, WORLD_SIZE)
  // are a launch error to name as such, not a corrupt block.
  if (h->magic == kCtrlMagic && h->size != size)
    return invalid_argument("rank " + std::to_string(r) + " was started with a communicator of " +
                            std::to_string(h->size) + " ranks and rank " + std::to_string(rank) + " with " +
                            std::to_string(size) +
                            " (do STRATA_WORLD_SIZE, WORLD_SIZE or the launcher's -n differ between ranks?)");
  if (h->magic != kCtrlMagic || h->rank != r)
    return internal_error("control block of rank " + std::to_string(r) +
                          " is not initialised or comes from a build with another layout (magic " +
                          std::to_string(h->magic) + ", rank " + std::to_string(h->rank) + ")");
  peers[r] = v;
  // A replacement of r reads this block from now on, whatever its predecessor said.
  self.done_with(r).store(0, std::memory_order_release);
  // The peer's flight-recorder ring follows its block: map that far too, or never read it.
  peer_flight_len[r] = 0;
  if (const uint32_t len = h->flight_len; len > 0 && len <= (1u << 20) && (len & (len - 1)) == 0)
    if (ctx->heap->peer_ptr(members[r], ref, CtrlView::bytes_with_flight(size, len), d).is_ok())
      peer_flight_len[r] = len;
  if (pidfds[r] >= 0) ::close(pidfds[r]);
  pidfds[r] = -1;
  pids[r] = h->pid;
  if (h->pid != static_cast<int>(getpid())) pidfds[r] = open_pidfd(h->pid);
  return Status::ok();
}

void CommImpl::clear_broken() {
  std::lock_guard<std::mutex> g(err_mu);
  sticky = Status::ok();
  is_broken.store(false, std::memory_order_release);
  abort_flag.store(false, std::memory_order_release);
  user_aborted.store(false, std::memory_order_release);
}

/// Whether `ranks` processes share this host's cores (the wait policy then yields at once):
/// STRATA_OVERSUBSCRIBED when set, else more ranks than this process may run on. Ranks of
/// other "hosts" that share the cores (network namespaces, containers) are not visible
/// here; such set-ups say so with STRATA_OVERSUBSCRIBED=1.
static bool oversubscribed(const Env& env, int ranks) {
  if (env.oversubscribed >= 0) return env.oversubscribed == 1;
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return ranks > cpus;
}

/// The fields every communicator has, registered with the context so that a failure
/// notice revokes it too; the shm and the network constructors add their own parts.
static std::shared_ptr<CommImpl> base_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                           std::vector<int> members, int rank) {
  auto c = std::make_shared<CommImpl>();
  c->ctx = ctx;
  c->id = std::move(id);
  c->members = std::move(members);
  c->rank = rank;
  c->size = static_cast<int>(c->members.size());
  c->timeout = ctx->timeout;
  c->pids.assign(c->size, 0);
  c->pids[rank] = static_cast<int>(getpid());
  c->pidfds.assign(c->size, -1);
  c->send_seq.assign(c->size, 0);
  c->recv_seq.assign(c->size, 0);
  c->send_verdicts.assign(c->size, {});
  c->peer_flight_len.assign(c->size, 0);
  std::lock_guard<std::mutex> g(ctx->mu);
  // Drop entries of communicators that are gone, so a job that splits often stays small.
  std::erase_if(ctx->comms, [](const std::weak_ptr<CommImpl>& w) { return w.expired(); });
  ctx->comms.push_back(c);
  return c;
}

std::shared_ptr<CommImpl> new_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id, std::vector<int> members,
                                   int rank, void* ctrl_mem) {
  auto c = base_comm(ctx, std::move(id), std::move(members), rank);
  c->ctrl_mem = ctrl_mem;
  c->self = CtrlView(ctrl_mem, c->size);
  // The ring lies after the control block (new_ctrl_block sized it), where peers read it.
  c->flight.init(c->self.hdr()->flight_len, c->self.flight());
  c->peers.resize(c->size);
  c->peers[rank] = c->self;
  c->cma_tmp.resize(c->size);
  c->oversubscribed = oversubscribed(ctx->env, c->size);
  return c;
}

bool probe_cma(const CommImpl& c) {
  bool ok = c.ctx->env.cma;
  for (int r = 0; r < c.size && ok; ++r) {
    if (r == c.rank) continue;
    CtrlHeader* h = c.peers[r].hdr();
    ok = memory::cma_probe(h->pid, reinterpret_cast<const void*>(h->self_addr), sizeof(CtrlHeader));
  }
  return ok;
}

namespace {

// Attaches every peer's control block to `c` and meets them: what make_comm does once the
// communicator exists.
Status connect_comm(CommImpl& c, const std::vector<memory::SegRef>& ctrl_refs, Deadline d) {
  for (int r = 0; r < c.size; ++r)
    if (r != c.rank) STRATA_RETURN_IF_ERROR(c.attach_peer(r, ctrl_refs[r], d));
  // Everyone has mapped everyone before any operation publishes into the blocks.
  STRATA_RETURN_IF_ERROR(c.sync(d, "communicator setup"));
  // CMA probe: can we read each peer's control block through process_vm_readv? The verdict
  // must be the same on every rank (a rank decides alone whether to publish a registered
  // buffer for CMA), so each publishes its result and all take the AND.
  c.self.hdr()->cma_ok = probe_cma(c) ? 1 : 0;
  STRATA_RETURN_IF_ERROR(c.sync(d, "communicator setup"));
  c.cma_all = true;
  for (int r = 0; r < c.size; ++r) c.cma_all = c.cma_all && c.peers[r].hdr()->cma_ok;
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<CommImpl>> make_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                            std::vector<int> members, int rank, void* ctrl_mem,
                                            const std::vector<memory::SegRef>& ctrl_refs, Deadline d) {
  auto c = new_comm(ctx, std::move(id), std::move(members), rank, ctrl_mem);
  STRATA_RETURN_IF_ERROR(connect_comm(*c, ctrl_refs, d));
  return c;
}

Result<void*> new_ctrl_block(ContextImpl& ctx, int rank, int n) {
  {
    std::lock_guard<std::mutex> g(ctx.mu);
    ctx.reclaim_ctrl_blocks();
  }
  const uint32_t flight = flight_entries(ctx.env.flight_recorder);
  size_t bytes = CtrlView::bytes_with_flight(n, flight);
  STRATA_ASSIGN_OR_RETURN(void* mem, ctx.heap->alloc(bytes));
  std::memset(mem, 0, bytes);
  auto* h = new (mem) CtrlHeader();
  h->flight_len = flight;
  FlightEntry* ring = CtrlView(mem, n).flight();
  for (uint32_t i = 0; i < flight; ++i) new (ring + i) FlightEntry();
  h->rank = rank;
  h->size = n;
  h->pid = static_cast<int>(getpid());
  h->self_addr = reinterpret_cast<uint64_t>(mem);
  h->magic = kCtrlMagic;
  return mem;
}

std::string world_record(const ContextImpl& ctx, const memory::SegRef& ctrl) {
  std::ostringstream os;
  // The epoch last: the transport of a peer on another host finds this process's address
  // under it (a replacement's predecessor published under an older one).
  os << ctx.job.host_id << "\n" << getpid() << "\n" << ctrl.seg << "\n" << ctrl.offset << "\n" << ctx.env.epoch;
  return os.str();
}

namespace {

constexpr uint64_t kTagBases = uint64_t{1} << 14;  // bits 61..48 of a tag

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48);
}

/// The communicator's tag base, unique in the job: two communicators whose members meet
/// across hosts must never share one, or their messages would match each other's receives.
/// Claimed in the store by id, from the id's hash on (the next free one on a collision):
/// every member, the replacement of a failed one included, gets the same answer.
Result<uint64_t> claim_tag_base(ContextImpl& ctx, const std::string& id) {
  const uint64_t h = fnv1a(id);
  for (uint64_t i = 0; i < kTagBases; ++i) {
    const uint64_t b = (h + i) % kTagBases;
    const std::string key = "strata/" + ctx.job.job_id + "/tagbase/" + std::to_string(b);
    STRATA_ASSIGN_OR_RETURN(std::string owner, ctx.store->compare_set(key, "", id));
    if (owner == id) return b;
  }
  return unavailable("communicator '" + id + "': the job already has " + std::to_string(kTagBases) +
                     " communicators across hosts, the most it can tell apart");
}

Status ensure_net(ContextImpl& ctx) {
  std::lock_guard<std::mutex> g(ctx.mu);
  if (ctx.net) return Status::ok();
#if STRATA_HAVE_UCX
  STRATA_ASSIGN_OR_RETURN(ctx.net, transport::make_ucx_net(ctx.job.job_id, ctx.job.rank, ctx.job.world_size, ctx.store,
                                                           *ctx.heap, ctx.timeout, ctx.env));
  return Status::ok();
#else
  return unavailable(
      "ranks on different hosts need the UCX transport, which this build does not have "
      "(install libucx-dev and rebuild with -DSTRATA_WITH_UCX=ON)");
#endif
}

}  // namespace

Result<std::shared_ptr<CommImpl>> make_net_comm(const std::shared_ptr<ContextImpl>& ctx, std::string id,
                                                std::vector<int> members, int rank, void* local_ctrl,
                                                const std::vector<memory::SegRef>* local_refs, Deadline d) {
  if (members.size() > static_cast<size_t>(kMaxNetRanks))
    return invalid_argument("communicator '" + id + "' has " + std::to_string(members.size()) +
                            " members across hosts; at most " + std::to_string(kMaxNetRanks) + " are supported");
  STRATA_RETURN_IF_ERROR(ensure_net(*ctx));
  auto c = base_comm(ctx, std::move(id), std::move(members), rank);
  c->net = ctx->net.get();
  static_assert(((kTagBases - 1) << 48 & transport::kTransportTagBits) == 0);
  STRATA_ASSIGN_OR_RETURN(c->tag_base, claim_tag_base(*ctx, c->id));
  c->flight.init(ctx->env.flight_recorder);  // no block of its own: process memory
  c->host_of.assign(c->size, -1);
  c->local_of.assign(c->size, -1);
  std::vector<std::string> names;
  for (int r = 0; r < c->size; ++r) {
    const std::string& h = ctx->hosts[c->members[r]];
    int idx = -1;
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == h) idx = static_cast<int>(i);
    if (idx < 0) {
      idx = static_cast<int>(names.size());
      names.push_back(h);
      c->host_members.emplace_back();
    }
    c->host_of[r] = idx;
    c->local_of[r] = static_cast<int>(c->host_members[idx].size());
    c->host_members[idx].push_back(r);
  }
  const auto& mine = c->host_members[c->host_of[rank]];
  std::vector<int> local_globals;
  for (int r : mine) local_globals.push_back(c->members[r]);
  if (local_refs) {
    auto local =
        make_comm(ctx, c->id + "/host", std::move(local_globals), c->local_of[rank], local_ctrl, *local_refs, d);
    if (!local.is_ok()) return local.status().with_context("intra-host part of communicator '" + c->id + "': ");
    c->local = std::move(local).value();
  } else {
    c->local = new_comm(ctx, c->id + "/host", std::move(local_globals), c->local_of[rank], local_ctrl);
  }
  c->oversubscribed = oversubscribed(ctx->env, c->local->size);
  // Liveness of the members on this host by pidfd; those on other hosts by their endpoints.
  for (size_t i = 0; i < mine.size(); ++i) {
    c->pids[mine[i]] = c->local->pids[i];
    if (mine[i] != rank && c->local->pids[i] > 0) c->pidfds[mine[i]] = open_pidfd(c->local->pids[i]);
  }
  return c;
}

namespace {
/// A job whose id came from its store alone (JobInfo::id_from_store) shares that id with every
/// earlier job on the store (two mpiexec runs against one `strata store`): without more, the
/// second would read the first one's records. So each run gets a generation of the id: rank 0
/// opens a new one, recording the run's size; every other rank waits until a generation newer
/// than the last it joined is open and joins the newest, unless that one is of another size or
/// already has all its ranks (then the next). Runs one after the other thus meet in their own
/// generation, whichever of their ranks comes first, also when their sizes differ. A run whose
/// rank 0 opened a generation and died before the others came leaves it open, and a later run
/// of the same size whose rank comes before its own rank 0 may join it and fail (naming the
/// gone rank): STRATA_JOB_ID per job avoids that.
Status join_run_generation(ContextImpl& ctx) {
  bootstrap::JobInfo& job = ctx.job;
  const std::string base = "strata/" + job.job_id + "/run/";
  const std::string size = std::to_string(job.world_size);
  auto waiting = [&](const Status& w) {
    return w.with_context("init on rank " + std::to_string(job.rank) + ": waiting for rank 0 of this job (its id " +
                          job.job_id + " comes from the store address and token; set STRATA_JOB_ID to name it): ");
  };
  int64_t g = 0;
  if (job.rank == 0) {
    STRATA_ASSIGN_OR_RETURN(g, ctx.store->add(base + "newest", 1));
    STRATA_RETURN_IF_ERROR(ctx.store->set(base + "open/" + std::to_string(g), size));
  } else {
    const std::string joined = base + "joined/" + std::to_string(job.rank);
    STRATA_ASSIGN_OR_RETURN(auto last, ctx.store->try_get(joined));
    int64_t next = 1;
    if (last && !last->empty()) {
      STRATA_ASSIGN_OR_RETURN(int64_t l, parse_int(*last));
      next = l + 1;
    }
    const Deadline d = Deadline::after(ctx.timeout);
    for (;;) {
      if (Status w = ctx.store->wait({base + "open/" + std::to_string(next)}, d.remaining()); !w.is_ok())
        return waiting(w);
      STRATA_ASSIGN_OR_RETURN(g, ctx.store->add(base + "newest", 0, d));
      STRATA_ASSIGN_OR_RETURN(auto opened, ctx.store->get(base + "open/" + std::to_string(g), d.remaining()));
      if (opened == size) {
        STRATA_ASSIGN_OR_RETURN(int64_t in, ctx.store->add(base + "members/" + std::to_string(g), 1, d));
        if (in < job.world_size) break;
      }
      next = g + 1;  // another run's generation: wait for this run's rank 0
    }
    STRATA_RETURN_IF_ERROR(ctx.store->set(joined, std::to_string(g)));
  }
  job.job_id += "-" + std::to_string(g);
  job.id_from_store = false;
  return Status::ok();
}
}  // namespace

Result<ContextRef> make_context(const Env& env, const bootstrap::JobInfo& job, std::chrono::milliseconds timeout,
                                std::unique_ptr<bootstrap::StoreClient> store) {
  auto ctx = std::make_shared<ContextImpl>();
  ctx->fork_gen = fork_generation();
  ctx->env = env;
  ctx->job = job;
  ctx->timeout = timeout.count() > 0 ? timeout : env.timeout;
  if (store && !job.store.empty()) {
    ctx->store = std::shared_ptr<bootstrap::StoreClient>(std::move(store));
    ctx->store->set_reconnect_timeout(env.store_connect_timeout);
  } else if (!job.store.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto addr, bootstrap::StoreAddress::parse(job.store));
    STRATA_ASSIGN_OR_RETURN(
        auto client, bootstrap::StoreClient::connect(addr, job.token, Deadline::after(env.store_connect_timeout)));
    ctx->store = std::shared_ptr<bootstrap::StoreClient>(std::move(client));
    ctx->store->set_reconnect_timeout(env.store_connect_timeout);
  } else if (job.world_size > 1) {
    return invalid_argument("init: a job of " + std::to_string(job.world_size) +
                            " ranks needs a store (STRATA_STORE or MASTER_ADDR/MASTER_PORT)");
  }
  if (ctx->job.id_from_store && ctx->store) STRATA_RETURN_IF_ERROR(join_run_generation(*ctx));
  STRATA_ASSIGN_OR_RETURN(ctx->heap,
                          memory::Heap::create(memory::HeapOptions::from_env(env), ctx->job.job_id, job.rank));
  flight_watch(ctx);
  return ContextRef(std::move(ctx));
}

Result<std::shared_ptr<CommImpl>> new_world(const std::shared_ptr<ContextImpl>& ctx,
                                            const std::vector<std::pair<int, std::string>>& moved) {
  const int n = ctx->job.world_size, me = ctx->job.rank;
  std::vector<int> members(n);
  for (int r = 0; r < n; ++r) members[r] = r;
  // Where every rank lives: the job's records (a replaced rank's predecessor ran on the same
  // host, so an older record says as much as a new one), but for the ranks of a lost host.
  ctx->hosts.assign(n, ctx->job.host_id);
  std::vector<int> to_read;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    auto m = std::find_if(moved.begin(), moved.end(), [r](const auto& mv) { return mv.first == r; });
    if (m != moved.end()) ctx->hosts[r] = m->second;
    else to_read.push_back(r);
  }
  STRATA_ASSIGN_OR_RETURN(auto records, read_records(*ctx, to_read, "", "the world record"));
  for (size_t i = 0; i < to_read.size(); ++i) {
    auto w = parse_world_record(records[i]);
    if (!w.is_ok()) return w.status().with_context("the world record of rank " + std::to_string(to_read[i]) + ": ");
    ctx->hosts[to_read[i]] = w.value().host;
  }
  const bool spans =
      std::any_of(ctx->hosts.begin(), ctx->hosts.end(), [&](const std::string& h) { return h != ctx->job.host_id; });
  if (!spans) {
    STRATA_ASSIGN_OR_RETURN(void* ctrl, new_ctrl_block(*ctx, me, n));
    if (!ctx->heap->locate(ctrl, 1)) return internal_error("control block is not in the heap");
    return new_comm(ctx, "world", std::move(members), me, ctrl);
  }
  int local_n = 0, li = 0;
  for (int r = 0; r < n; ++r) {
    if (ctx->hosts[r] != ctx->job.host_id) continue;
    if (r == me) li = local_n;
    ++local_n;
  }
  STRATA_ASSIGN_OR_RETURN(void* lctrl, new_ctrl_block(*ctx, li, local_n));
  if (!ctx->heap->locate(lctrl, 1)) return internal_error("control block is not in the heap");
  return make_net_comm(ctx, "world", std::move(members), me, lctrl, nullptr, Deadline::after(ctx->timeout));
}

Result<std::shared_ptr<CommImpl>> make_world(const std::shared_ptr<ContextImpl>& ctx,
                                             std::shared_ptr<CommImpl>* published) {
  const int n = ctx->job.world_size, me = ctx->job.rank;
  Deadline d = Deadline::after(ctx->timeout);
  STRATA_ASSIGN_OR_RETURN(void* ctrl, new_ctrl_block(*ctx, me, n));
  auto ref = ctx->heap->locate(ctrl, 1);
  if (!ref) return internal_error("control block is not in the heap");
  std::vector<int> members(n);
  for (int r = 0; r < n; ++r) members[r] = r;
  std::vector<memory::SegRef> refs(n);
  refs[me] = *ref;
  ctx->hosts.assign(n, ctx->job.host_id);
  std::vector<uint64_t> epochs(n, 0);
  bool spans = false;
  if (n > 1) {
    STRATA_RETURN_IF_ERROR(ctx->store->set(world_key(*ctx, me), world_record(*ctx, *ref)));
    std::vector<int> others;
    for (int r = 0; r < n; ++r)
      if (r != me) others.push_back(r);
    STRATA_ASSIGN_OR_RETURN(auto records, read_records(*ctx, others, "", "the world record (joining the job)"));
    for (size_t i = 0; i < others.size(); ++i) {
      const int r = others[i];
      auto parsed = parse_world_record(records[i]);
      if (!parsed.is_ok()) return parsed.status().with_context("the world record of rank " + std::to_string(r) + ": ");
      const WorldRecord& w = parsed.value();
      refs[r] = w.ctrl;
      ctx->hosts[r] = w.host;
      epochs[r] = w.epoch;
      if (w.host != ctx->job.host_id) {
        spans = true;
      } else {
        // The fd server that hands out r's memory must be the process r published (a pid
        // means something on this host only).
        ctx->heap->expect_peer_pid(r, static_cast<pid_t>(w.pid));
      }
    }
  }
  if (!spans) {
    auto c = new_comm(ctx, "world", std::move(members), me, ctrl);
    if (published) *published = c;
    // A failure announced before `c` was registered did not revoke it: a record read above
    // may be a replacement's, which meets the survivors in the rebuild, not here.
    if (ctx->epochs.latest.load(std::memory_order_acquire) > ctx->epochs.joined)
      return aborted("a failure was announced while rank " + std::to_string(me) + " was joining the job");
    STRATA_RETURN_IF_ERROR(connect_comm(*c, refs, d));
    return c;
  }
  if (Status s = ensure_net(*ctx); !s.is_ok()) {
    int other = 0;
    while (ctx->hosts[other] == ctx->job.host_id) ++other;
    return s.with_context("rank " + std::to_string(other) + " is on host '" + ctx->hosts[other] + "' and rank " +
                          std::to_string(me) + " on '" + ctx->job.host_id + "': ");
  }
  // A peer that is itself a replacement published its transport address under its epoch.
  for (int r = 0; r < n; ++r)
    if (r != me && epochs[r] > 0) ctx->net->reset_peer(r, epochs[r]);
  // Across hosts: the world-sized block is not needed; the ranks of this host meet through a
  // block sized for them, announced under a second key.
  (void)ctx->heap->free(ctrl);
  std::vector<int> local;
  for (int r = 0; r < n; ++r)
    if (ctx->hosts[r] == ctx->job.host_id) local.push_back(r);
  const int li = static_cast<int>(std::find(local.begin(), local.end(), me) - local.begin());
  STRATA_ASSIGN_OR_RETURN(void* lctrl, new_ctrl_block(*ctx, li, static_cast<int>(local.size())));
  auto lref = ctx->heap->locate(lctrl, 1);
  std::vector<memory::SegRef> lrefs(local.size());
  lrefs[li] = *lref;
  STRATA_RETURN_IF_ERROR(
      ctx->store->set(world_key(*ctx, me) + "/host", std::to_string(lref->seg) + " " + std::to_string(lref->offset)));
  // The record a rebuild reads names the block that is in use (a reader that still finds the
  // first version here takes only its host and pid).
  STRATA_RETURN_IF_ERROR(ctx->store->set(world_key(*ctx, me), world_record(*ctx, *lref)));
  std::vector<int> neighbours;
  for (size_t i = 0; i < local.size(); ++i)
    if (static_cast<int>(i) != li) neighbours.push_back(local[i]);
  STRATA_ASSIGN_OR_RETURN(auto blocks, read_records(*ctx, neighbours, "/host", "the host block (same host)"));
  for (size_t i = 0, j = 0; i < local.size(); ++i) {
    if (static_cast<int>(i) == li) continue;
    std::istringstream is(blocks[j++]);
    is >> lrefs[i].seg >> lrefs[i].offset;
  }
  return make_net_comm(ctx, "world", std::move(members), me, lctrl, &lrefs, d);
}

}  // namespace strata::detail

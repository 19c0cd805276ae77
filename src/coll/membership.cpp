// The recovery layer's view of a communicator and of its process context: each method is
// one step of the rebuild protocol (recovery/rebuild.cpp) expressed on the internals.

#include "coll/membership.hpp"

#include <unistd.h>

#include <sstream>

#include "coll/comm_impl.hpp"

namespace strata::detail {

Result<WorldRecord> parse_world_record(const std::string& v) {
  WorldRecord w;
  std::istringstream is(v);
  std::getline(is, w.host);
  if (!(is >> w.pid >> w.ctrl.seg >> w.ctrl.offset)) return internal_error("malformed world record '" + v + "'");
  if (!(is >> w.epoch)) w.epoch = 0;  // written before records carried it
  return w;
}

std::string job_store_key(const std::string& job_id, const std::string& suffix) {
  return "strata/" + job_id + "/" + suffix;
}

std::string world_record_key(const std::string& job_id, int rank) {
  return job_store_key(job_id, "world/" + std::to_string(rank));
}

// ---- ContextRef ------------------------------------------------------------------------------

ContextRef::ContextRef(std::shared_ptr<ContextImpl> ctx) : ctx_(std::move(ctx)) {}

const bootstrap::JobInfo& ContextRef::job() const { return ctx_->job; }

const Env& ContextRef::env() const { return ctx_->env; }

bootstrap::StoreClient* ContextRef::store() const { return ctx_->store.get(); }

std::string ContextRef::world_key(int rank) const { return detail::world_key(*ctx_, rank); }

EpochState& ContextRef::epochs() const { return ctx_->epochs; }

bool ContextRef::has_monitor() const { return ctx_->monitor != nullptr; }

void ContextRef::set_monitor(std::unique_ptr<ContextService> monitor) const { ctx_->monitor = std::move(monitor); }

void ContextRef::revoke_all(const Status& why) const { ctx_->revoke_all(why); }

// ---- Membership ------------------------------------------------------------------------------

Membership::Membership(const std::shared_ptr<CommImpl>& comm) : c_(comm.get()) {}

int Membership::rank() const { return c_->rank; }

int Membership::size() const { return c_->size; }

const std::string& Membership::id() const { return c_->id; }

std::chrono::milliseconds Membership::timeout() const { return c_->timeout; }

bool Membership::spans_hosts() const { return c_->net != nullptr; }

int Membership::global_rank(int r) const { return c_->members[r]; }

ContextRef Membership::context() const { return ContextRef(c_->ctx); }

std::unique_lock<std::mutex> Membership::quiesce(const Status& why) {
  // The engine takes work only under exec_mu, so once we hold it nothing is in flight and
  // whatever is still queued never starts.
  std::unique_lock<std::mutex> ex(c_->exec_mu);
  std::deque<std::shared_ptr<WorkState>> stale;
  {
    std::lock_guard<std::mutex> g(c_->q_mu);
    stale.swap(c_->queue);
  }
  for (auto& w : stale) w->finish(why);
  return ex;
}

void Membership::drop_peer(int r) {
  if (c_->net) {
    // Across hosts: a member on this host has a block in `local`; one elsewhere only an
    // endpoint, which reset_net_peer renews once the replacement's record is known.
    if (!same_host(r)) return;
    c_->local->peers[c_->local_of[r]] = CtrlView();
    if (c_->pidfds[r] >= 0) ::close(c_->pidfds[r]);
    c_->pidfds[r] = -1;
  } else {
    c_->peers[r] = CtrlView();
  }
  c_->ctx->heap->drop_peer(c_->members[r]);
}

void Membership::reset_net_peer(int r, uint64_t epoch) {
  if (c_->net) c_->net->reset_peer(c_->members[r], epoch);
}

bool Membership::same_host(int r) const { return !c_->net || c_->host_of[r] == c_->host_of[c_->rank]; }

const std::string& Membership::host_of(int r) const { return c_->ctx->hosts[c_->members[r]]; }

void Membership::move_host(int r, const std::string& host) { c_->ctx->hosts[c_->members[r]] = host; }

void Membership::expect_pid(int r, long pid) {
  c_->ctx->heap->expect_peer_pid(c_->members[r], static_cast<pid_t>(pid));
}

Status Membership::adopt_peer_segment(int r, uint32_t seg, char* base, size_t size, long pid) {
  return c_->ctx->heap->adopt_peer_segment(c_->members[r], seg, base, size, static_cast<pid_t>(pid));
}

Status Membership::map_peer(int r, const memory::SegRef& ref, Deadline d) {
  const int blocks_of = c_->net ? c_->local->size : c_->size;  // across hosts, `local`'s blocks
  return c_->ctx->heap->peer_ptr(c_->members[r], ref, CtrlView::bytes(blocks_of), d).status();
}

Status Membership::attach_peer(int r, const memory::SegRef& ref, Deadline d) { return c_->attach_peer(r, ref, d); }

void Membership::reset_sync_state(uint64_t epoch) { c_->reset_sync_state(epoch); }

void Membership::clear_broken() {
  c_->clear_broken();
  if (c_->local) c_->local->clear_broken();
}

int Membership::failed_peer() { return c_->broken().peer(); }

void Membership::revoke(const Status& why) {
  for (CommImpl* c : {c_, c_->local.get()}) {
    if (!c) continue;
    c->set_broken(why);
    c->abort_flag.store(true);
  }
}

Status Membership::sync(Deadline d, const char* what) { return c_->sync(d, what); }

uint64_t Membership::peer_waits() const { return c_->peer_waits.load(std::memory_order_relaxed); }

Result<std::string> Membership::world_record() const {
  auto ref = c_->ctx->heap->locate(c_->net ? c_->local->ctrl_mem : c_->ctrl_mem, 1);
  if (!ref) return internal_error("control block is not in the heap");
  return detail::world_record(*c_->ctx, *ref);
}

void Membership::probe_cma_alone() {
  CommImpl& c = c_->net ? *c_->local : *c_;  // across hosts: the members on this host
  c.self.hdr()->cma_ok = probe_cma(c) ? 1 : 0;
  c.cma_all = c.self.hdr()->cma_ok != 0;
}

}  // namespace strata::detail

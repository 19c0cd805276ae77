// moe::Buffer (DESIGN §5): construction and teardown of its control block, the argument checks,
// what every schedule does first (plan the rows, start the call, make the handle) and the entry
// points that route to the schedule (prefill.cpp, decode.cpp, relay.cpp; the window transport
// that Prefill and Decode share is windows.cpp). The layout is described in schedule.hpp.

#include <poll.h>

#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

#include "moe/schedule.hpp"

namespace strata::moe {

const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::Prefill: return "prefill";
    case Schedule::Decode: return "decode";
    case Schedule::Relay: return "relay";
  }
  return "?";
}

std::vector<uint32_t> Handle::dropped() const {
  std::vector<uint32_t> out;
  if (!state) return out;
  const size_t T = state->num_tokens, K = T ? state->lost.size() / T : 0;
  out.assign(T, 0);
  for (size_t t = 0; t < T; ++t)
    for (size_t k = 0; k < K; ++k) out[t] += state->lost[t * K + k];
  return out;
}

size_t Dispatch::count(int l) const {
  size_t n = 0;
  for (int s = 0; s < ranks; ++s) n += count(l, s);
  return n;
}

namespace detail {

Status Local::ensure(Communicator& comm, size_t want) {
  if (want <= bytes && p) return Status::ok();
  release(comm);
  size_t n = std::max<size_t>(want + want / 4, 4096);
  try {
    p = comm.alloc_bytes(n);
  } catch (const Error& e) {
    return from_error(e);
  }
  bytes = n;
  return Status::ok();
}

void Local::release(Communicator& comm) {
  if (p) {
    try {
      comm.free_bytes(p);
    } catch (...) {
    }
  }
  p = nullptr;
  bytes = 0;
}

Status BufferImpl::wait_sig(const Signal& s, uint32_t target, Deadline d, int peer, const char* what) {
  transport::WaitPolicy p = c->policy(d);
  // Only `this` captured (the policy's own check is check_peers): fits std::function's
  // inline storage, so a dispatch's waits allocate nothing.
  p.check = [this] {
    Status m = schedule_mismatch();
    return m.is_ok() ? c->check_peers() : m;
  };
  Status st = transport::wait_reached(s, target, p, what);
  if (st.is_ok()) return st;
  return wait_failed(st, peer);
}

Status BufferImpl::wait_failed(const Status& st, int peer) {
  if (Status m = schedule_mismatch(); !m.is_ok()) {
    c->set_broken(m);
    return m;
  }
  Status full(st.code(),
              std::string("moe ") + st.message() + where() + " waiting for rank " + std::to_string(peer) +
                  " (timeout " + std::to_string(c->timeout.count()) + " ms)",
              st.peer() >= 0 ? st.peer() : peer);
  c->set_broken(full);
  return full;
}

Status BufferImpl::masked_check(int peer) {
  if (c->user_aborted.load(std::memory_order_acquire)) return aborted("abort() was called");
  // Revocation after a death (and our own marking below) leave PeerFailed: the call goes on.
  Status b = c->broken();
  if (!b.is_ok() && b.code() != Code::PeerFailed) return b;
  int fd = c->pidfds[peer];
  pollfd p{fd, POLLIN, 0};
  if (fd >= 0 && ::poll(&p, 1, 0) > 0) {
    dead[peer] = 1;
    Status st = peer_failed("rank " + std::to_string(peer) + " (pid " + std::to_string(c->pids[peer]) +
                                ") exited; moe masks its experts" + where(),
                            peer);
    c->set_broken(st);  // other collectives must fail until recover()
    return st;
  }
  return Status::ok();
}

Result<bool> BufferImpl::wait_live(const Signal& s, uint32_t target, Deadline d, int peer, const char* what) {
  if (!cfg.mask_failed_ranks) {
    STRATA_RETURN_IF_ERROR(wait_sig(s, target, d, peer, what));
    return true;
  }
  if (!dead[peer]) {
    transport::WaitPolicy p = c->policy(d);
    p.abort = nullptr;  // masked_check tells a user abort from a revocation
    p.check = [this, peer] {
      Status m = schedule_mismatch();
      return m.is_ok() ? masked_check(peer) : m;
    };
    Status st = transport::wait_reached(s, target, p, what);
    if (st.is_ok()) return true;
    if (!dead[peer]) return wait_failed(st, peer);
  }
  // A dead process's memory is frozen and still mapped: every survivor reads the same value.
  return transport::reached(s.value.load(std::memory_order_acquire), target);
}

Status BufferImpl::usable() const {
  Status b = c->broken();
  if (!b.is_ok() && cfg.mask_failed_ranks && b.code() == Code::PeerFailed &&
      !c->user_aborted.load(std::memory_order_acquire))
    return Status::ok();
  return b;
}

Status BufferImpl::needs_all(const std::string& what) const {
  std::string ranks;
  for (int r = 0; r < R; ++r)
    if (dead[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return peer_failed(
      "moe::dispatch: " + what + " needs every rank but rank(s) " + ranks + " failed" + where() + "; call recover()",
      -1);
}

Result<std::vector<std::byte*>> BufferImpl::peers_of(void* local, size_t bytes, Deadline d) {
  memory::Heap& heap = *c->ctx->heap;
  auto ref = heap.locate(local, bytes);
  if (!ref) return internal_error("moe: a symmetric window is not in the heap");
  std::vector<std::byte*> out(R, nullptr);  // ranks on other hosts: none
  for (int r : shm_ranks) {
    STRATA_ASSIGN_OR_RETURN(void* p, heap.peer_ptr(c->members[r], *ref, bytes, d));
    out[r] = static_cast<std::byte*>(p);
  }
  return out;
}

Result<void*> BufferImpl::sym_alloc(size_t bytes) {
  try {
    return comm.alloc_symmetric_bytes(bytes);
  } catch (const Error& e) {
    return from_error(e);
  }
}

namespace {
/// Why `cfg` cannot make a Buffer over R ranks, or "".
std::string config_error(const Config& cfg, int R, bool spans_hosts) {
  if (cfg.num_experts <= 0 || cfg.num_experts % R != 0)
    return "num_experts = " + std::to_string(cfg.num_experts) + " is not a positive multiple of the " +
           std::to_string(R) + " ranks";
  if (cfg.topk < 1 || cfg.topk > cfg.num_experts)
    return "topk = " + std::to_string(cfg.topk) + " is outside [1, num_experts = " + std::to_string(cfg.num_experts) +
           "]";
  if (cfg.hidden == 0) return "hidden is 0";
  if (cfg.max_tokens == 0) return "max_tokens is 0";
  if (cfg.expert_alignment == 0) return "expert_alignment is 0";
  if (cfg.dtype != DataType::BFloat16 && cfg.dtype != DataType::Float16 && cfg.dtype != DataType::Float32)
    return std::string("dtype ") + strata::to_string(cfg.dtype) + " is not bfloat16, float16 or float32";
  // The largest window (Decode's [L][R][M][H], as many rows as Prefill's worst case) must be a
  // size at all: a product that wraps would allocate a small window and write past it.
  size_t bytes = 0;
  size_t factor = 0;
  const size_t experts = static_cast<size_t>(cfg.num_experts);
  if (__builtin_mul_overflow(cfg.hidden, dtype_size(cfg.dtype), &bytes) ||
      __builtin_mul_overflow(bytes, cfg.max_tokens, &bytes) || __builtin_mul_overflow(bytes, experts, &bytes) ||
      __builtin_add_overflow(static_cast<size_t>(cfg.topk), cfg.expert_alignment, &factor) ||
      __builtin_mul_overflow(bytes, factor, &bytes))
    return "hidden = " + std::to_string(cfg.hidden) + ", max_tokens = " + std::to_string(cfg.max_tokens) +
           " and num_experts = " + std::to_string(cfg.num_experts) + " make windows larger than memory can address";
  if (spans_hosts && cfg.mask_failed_ranks)
    return "mask_failed_ranks is not supported on a communicator that spans hosts";
  return "";
}

/// The fields every rank's Config must agree on, in the order they are compared.
constexpr const char* kConfigFields[] = {"num_experts", "hidden",           "max_tokens",        "topk",
                                         "dtype",       "expert_alignment", "mask_failed_ranks", "renormalize"};
constexpr size_t kConfigWords = 1 + std::size(kConfigFields);  // a validity word, then the fields

std::string field_value(size_t i, uint64_t v) {
  if (std::string_view(kConfigFields[i]) == "dtype") return strata::to_string(static_cast<DataType>(v));
  return std::to_string(v);
}

/// Building a Buffer is collective, so its checks are too: every rank shows the others its
/// config and whether it is valid before any window exists (an all_gather on the communicator).
/// A rank whose config is invalid fails with its own message, the others naming it; configs
/// that differ (a row size that matches but a dtype that does not, a different max_tokens) fail
/// everywhere, naming both ranks, instead of landing rows in windows laid out differently. The
/// survivors' rejoin after recover() runs it too, meeting the replacement's constructor.
Status agree_config(Communicator& comm, const Config& cfg) {
  const int R = comm.size(), me = comm.rank();
  const std::string mine = config_error(cfg, R, comm.impl()->net != nullptr);
  const uint64_t fields[kConfigWords] = {mine.empty() ? 1u : 0u,
                                         static_cast<uint64_t>(static_cast<int64_t>(cfg.num_experts)),
                                         cfg.hidden,
                                         cfg.max_tokens,
                                         static_cast<uint64_t>(static_cast<int64_t>(cfg.topk)),
                                         static_cast<uint64_t>(cfg.dtype),
                                         cfg.expert_alignment,
                                         cfg.mask_failed_ranks ? 1u : 0u,
                                         cfg.renormalize ? 1u : 0u};
  std::vector<uint64_t> all(kConfigWords * static_cast<size_t>(R));
  try {
    comm.all_gather(std::span<const uint64_t>(fields), std::span<uint64_t>(all));
  } catch (const Error& e) {
    return from_error(e);
  }
  auto bad = [&](const std::string& m, int peer) {
    return Status(Code::InvalidArgument, "moe::Buffer: " + m + " on rank " + std::to_string(me), peer);
  };
  if (!mine.empty()) return bad(mine, -1);
  for (int r = 0; r < R; ++r)
    if (all[r * kConfigWords] == 0)
      return bad("rank " + std::to_string(r) + "'s config is invalid (its own error names why), so no Buffer is made",
                 r);
  for (int r = 1; r < R; ++r)
    for (size_t i = 0; i < std::size(kConfigFields); ++i) {
      const uint64_t a = all[1 + i], b = all[r * kConfigWords + 1 + i];
      if (a != b)
        return Status(Code::InvalidArgument,
                      "moe::Buffer: the ranks' configs differ: " + std::string(kConfigFields[i]) + " is " +
                          field_value(i, a) + " on rank 0 but " + field_value(i, b) + " on rank " + std::to_string(r) +
                          " (seen on rank " + std::to_string(me) + ")",
                      r == me ? 0 : r);
    }
  return Status::ok();
}
}  // namespace

Status BufferImpl::init() {
  // Local state first: every rank has the same config here (the constructor compared them), so
  // a size that cannot be allocated fails on every rank before any collective step.
  try {
    acc.resize(H);
    cnt.resize(E);
  } catch (const std::exception&) {
    return invalid_argument("moe::Buffer: hidden = " + std::to_string(H) + " is too large to allocate its accumulator" +
                            where());
  }
  init_hosts();
  ctrl_bytes = sizeof(CtrlHead) + kLine * static_cast<size_t>(R) + round_up(sizeof(uint64_t) * E, kLine) +
               sizeof(uint64_t) * R * L;
  STRATA_ASSIGN_OR_RETURN(ctrl, sym_alloc(ctrl_bytes));
  // The arena recycles blocks: an earlier Buffer's signals may still be in there.
  std::memset(ctrl, 0, ctrl_bytes);
  STRATA_ASSIGN_OR_RETURN(auto pc, peers_of(ctrl, ctrl_bytes, deadline()));
  peer_ctrl.resize(R);
  for (int r = 0; r < R; ++r) peer_ctrl[r] = reinterpret_cast<char*>(pc[r]);  // null: other host
  try {
    comm.barrier();  // nobody reads a control block before its owner cleared it
  } catch (const Error& e) {
    return from_error(e);
  }
  STRATA_RETURN_IF_ERROR(relay_cnt.ensure(comm, 2 * sizeof(uint64_t) * E));
  if (xhost && c->net->use_put()) STRATA_RETURN_IF_ERROR(init_puts());
  epoch = comm.epoch();
  dead.assign(R, 0);
  return Status::ok();
}

Status BufferImpl::rejoin() {
  memory::Heap& heap = *c->ctx->heap;
  // The replacement's new Buffer starts from nothing: free every symmetric block of ours so
  // every rank makes them again together, in the same order (alloc_symmetric checks that the
  // offsets agree), then run the replacement's init() with it.
  if (dwin) (void)heap.free_symmetric(dwin);
  if (pwin) (void)heap.free_symmetric(pwin);
  if (ctrl) (void)heap.free_symmetric(ctrl);
  dwin = pwin = ctrl = nullptr;
  pwin_rows = 0;
  peer_dwin.clear();
  peer_pwin.clear();
  peer_ctrl.clear();
  seq = 0;
  released_pub = 0;
  dispatched = false;
  combined = Combine::None;
  STRATA_RETURN_IF_ERROR(agree_config(comm, cfg));
  return init();
}

BufferImpl::~BufferImpl() {
  if (!c) return;
  // Peers may still read our windows in their combine; freed blocks are recycled, so wait
  // for them (unless the communicator is already broken: then nobody reads anymore).
  if (!c->is_broken.load() && static_cast<int>(peer_ctrl.size()) == R &&
      epoch == comm.epoch()) {  // init got that far, and peer_ctrl still maps live peers
    publish_released(seq);
    Deadline d = deadline();
    for (int r : shm_ranks)
      if (!wait_sig(head(r)->released, seq, d, r, "destroy").is_ok()) break;
  }
  memory::Heap& heap = *c->ctx->heap;
  if (dwin) (void)heap.free_symmetric(dwin);
  if (pwin) (void)heap.free_symmetric(pwin);
  if (ctrl) (void)heap.free_symmetric(ctrl);
  for (Local* l : {&send_stage, &recv_stage, &relay_win, &relay_cnt}) l->release(comm);
  for (Inbound& in : inbound) in.stage.release(comm), in.back.release(comm);
  for (Outbound& o : outbound) o.stage.release(comm), o.partial.release(comm);
}

void BufferImpl::publish_released(uint32_t s) {
  if (released_pub == s) return;
  released_pub = s;
  transport::publish(head(me)->released, s);
}

// ---- argument checks and planning ------------------------------------------------------------

Status BufferImpl::validate(const void* x, size_t T, const int64_t* idx, const float* w) const {
  const std::string on = " on rank " + std::to_string(me);
  if (T > M)
    return invalid_argument("moe::dispatch: num_tokens = " + std::to_string(T) + on +
                            " exceeds max_tokens = " + std::to_string(M));
  if (T && (!x || !idx || !w))
    return invalid_argument(std::string("moe::dispatch: ") +
                            (!x     ? "x"
                             : !idx ? "topk_idx"
                                    : "topk_w") +
                            " is null" + on + " with num_tokens = " + std::to_string(T));
  for (size_t t = 0; t < T; ++t) {
    const int64_t* row = idx + t * K;
    for (int k = 0; k < K; ++k) {
      int64_t e = row[k];
      if (e < -1 || e >= E)
        return invalid_argument("moe::dispatch: topk_idx[" + std::to_string(t) + "][" + std::to_string(k) +
                                "] = " + std::to_string(e) + on + " is outside [-1, " + std::to_string(E) + ")");
      if (e < 0) continue;
      for (int k2 = 0; k2 < k; ++k2)
        if (row[k2] == e)
          return invalid_argument("moe::dispatch: expert " + std::to_string(e) + " appears twice in topk_idx row " +
                                  std::to_string(t) + " (k = " + std::to_string(k2) + " and " + std::to_string(k) +
                                  ")" + on);
    }
  }
  return Status::ok();
}

const int64_t* BufferImpl::mask_dead(size_t T, const int64_t* idx, HandleState& h) {
  if (!any_dead()) return idx;
  masked_idx.assign(idx, idx + T * K);
  for (size_t i = 0; i < T * K; ++i)
    if (idx[i] >= 0 && dead[idx[i] / L]) {
      masked_idx[i] = -1;
      h.lost[i] = 1;
    }
  return masked_idx.data();
}

void BufferImpl::plan(size_t T, const int64_t* idx) {
  std::fill(cnt.begin(), cnt.end(), 0u);
  rank_in_expert.resize(T * K);
  for (size_t i = 0; i < T * K; ++i) {
    int64_t e = idx[i];
    if (e >= 0) rank_in_expert[i] = cnt[e]++;
  }
}

Status BufferImpl::schedule_mismatch() const {
  // Before the first call (init's own collectives) the peers' heads are not mapped yet.
  if (seq == 0 || peer_ctrl.size() != static_cast<size_t>(R)) return Status::ok();
  for (int r : shm_ranks) {
    if (r == me) continue;
    const uint64_t v = head(r)->call.load(std::memory_order_acquire);
    const auto theirs = static_cast<Schedule>(v & 0x7f);
    if (static_cast<uint32_t>(v >> 8) != seq || theirs == calling) continue;
    // A rank that refused its call (Python could not even read its schedule) runs it as
    // Prefill: what its peers need to hear is the refusal.
    if (v & 0x80) return refused_by(r, kRefusedRows);
    return Status(Code::InvalidArgument,
                  std::string("moe::dispatch: schedule mismatch: rank ") + std::to_string(me) + " called it with " +
                      to_string(calling) + " but rank " + std::to_string(r) + " with " + to_string(theirs) +
                      " (every rank must use the same schedule in a call)" + where(),
                  r);
  }
  return Status::ok();
}

Status BufferImpl::from_error(const Error& e) const {
  if (Status m = schedule_mismatch(); !m.is_ok()) return m;
  return detail::from_error(e);
}

Status BufferImpl::begin(Deadline d, bool wait_readers, Schedule s) {
  if (epoch != comm.epoch()) {
    STRATA_RETURN_IF_ERROR(c->broken());
    STRATA_RETURN_IF_ERROR(rejoin());
  }
  STRATA_RETURN_IF_ERROR(usable());
  if (cfg.mask_failed_ranks)  // drop at the source what is known dead now (a user abort ends here too)
    for (int r = 0; r < R; ++r)
      if (!dead[r]) {
        Status st = masked_check(r);
        if (!st.is_ok() && !dead[r]) return st;
      }
  ++seq;
  calling = s;
  head(me)->call.store(static_cast<uint64_t>(seq) << 8 | (refusing ? 0x80u : 0u) | static_cast<uint64_t>(s),
                       std::memory_order_release);
  publish_released(seq - 1);
  if (wait_readers)
    for (int r : shm_ranks) {  // only ranks of this host write into its windows
      // A dead rank reads nothing anymore.
      STRATA_ASSIGN_OR_RETURN(bool live, wait_live(head(r)->released, seq - 1, d, r, "dispatch"));
      (void)live;
    }
  return Status::ok();
}

std::shared_ptr<HandleState> BufferImpl::new_handle(Schedule s, size_t T, const float* w) {
  auto h = std::make_shared<HandleState>();
  h->owner = this;
  h->seq = seq;
  h->epoch = epoch;
  h->schedule = s;
  h->num_tokens = T;
  h->dest.assign(T * K, -1);
  h->row.assign(T * K, 0);
  h->w.assign(w, w + T * K);
  h->lost.assign(T * K, 0);
  return h;
}

Dispatch BufferImpl::result(Schedule s, std::shared_ptr<HandleState> h, std::byte* window) const {
  Dispatch out;
  out.schedule = s;
  out.local_experts = L;
  out.ranks = R;
  out.hidden = H;
  out.max_tokens = M;
  out.elem_size = esz;
  out.num_tokens = h->num_tokens;
  out.total_rows = h->total_rows;
  out.window = window;
  out.counts = h->counts;
  out.offsets = h->offsets;
  out.dtype_ = cfg.dtype;
  for (int r = 0; r < R; ++r)
    if (dead[r]) out.failed_ranks.push_back(r);
  out.handle.state = std::move(h);
  out.dropped = out.handle.dropped();
  return out;
}

// ---- routing to the schedule ------------------------------------------------------------------

void BufferImpl::refuse(Schedule s) {
  if (R == 1 || static_cast<unsigned>(s) > static_cast<unsigned>(Schedule::Relay) || !usable().is_ok()) return;
  refusing = true;
  (void)dispatch(nullptr, 0, nullptr, nullptr, s);
  refusing = false;
}

Status BufferImpl::refused_by(int r, uint64_t count, const char* call) const {
  if (count != kRefusedRows) return Status::ok();
  return Status(Code::InvalidArgument,
                std::string("moe::") + call + ": rank " + std::to_string(r) +
                    " refused its call (its arguments were invalid; its own error names them), so it fails on "
                    "every rank" +
                    where(),
                r);
}

Result<Dispatch> BufferImpl::dispatch(const void* x, size_t T, const int64_t* idx, const float* w, Schedule s) {
  if (Status v = validate(x, T, idx, w); !v.is_ok()) {
    refuse(s);
    return v;
  }
  if (s == Schedule::Prefill || s == Schedule::Decode || s == Schedule::Relay) {
    dispatched = false;
    combined = Combine::None;
    Result<Dispatch> r = s == Schedule::Prefill  ? prefill(x, T, idx, w)
                         : s == Schedule::Decode ? decode(x, T, idx, w)
                                                 : relay(x, T, idx, w);
    if (r.is_ok() && !refusing) {
      dispatched = true;
      dispatched_schedule = s;
    }
    return r;
  }
  return invalid_argument("moe::dispatch: unknown schedule " + std::to_string(static_cast<int>(s)) + " on rank " +
                          std::to_string(me));
}

void BufferImpl::refuse_combine() {
  const bool relay = dispatched_schedule == Schedule::Relay;
  // No combine of the peers to meet: the dispatch failed here (a refusal or a failed peer fails
  // it everywhere), this rank already joined or refused it, or the communicator moved to a new
  // epoch that this Buffer has not rejoined (its first collective there is the peers' rejoin).
  if (R == 1 || !dispatched || combined != Combine::None || epoch != comm.epoch() ||
      !(relay ? c->broken() : usable()).is_ok())
    return;
  combined = Combine::Failed;
  if (relay) {  // its combine is one all_to_all_v of the communicator
    strata::detail::refuse_call(comm.impl());
    return;
  }
  YLine& yl = head(me)->y;
  yl.seg = 0;
  yl.off = 0;
  yl.bytes = kRefusedRows;
  transport::publish(yl.ready, seq);
}

Status BufferImpl::combine(const void* y, const HandleState& h, void* out) {
  auto refused = [&](const std::string& m) {
    refuse_combine();
    return invalid_argument("moe::combine: " + m + where());
  };
  if (h.owner != this) return refused("the handle comes from another moe::Buffer");
  if (h.epoch != epoch || epoch != comm.epoch()) return refused("the handle is from before recover(); dispatch again");
  if (h.seq != seq)
    return refused("the handle is from dispatch #" + std::to_string(h.seq) + " but the buffer's latest dispatch is #" +
                   std::to_string(seq) + " (windows are reused by every dispatch)");
  if (h.num_tokens && !out) return refused("out is null");
  if (h.total_rows && !y) return refused("y is null");
  if (combined == Combine::Failed)
    return invalid_argument("moe::combine: the combine of dispatch #" + std::to_string(seq) +
                            " failed or was refused on this rank, and the peers have moved on; dispatch again" +
                            where());
  STRATA_RETURN_IF_ERROR(h.schedule == Schedule::Relay ? c->broken() : usable());
  combined = Combine::Joined;
  Status st = h.schedule == Schedule::Relay ? combine_relay(h, y, out) : combine_windows(y, h, out);
  if (!st.is_ok()) combined = Combine::Failed;
  return st;
}

}  // namespace detail

// ---- public API ------------------------------------------------------------------------------

Buffer::Buffer(Communicator comm, const Config& cfg) {
  if (!comm.valid()) throw Error(Code::InvalidArgument, "moe::Buffer: the communicator is invalid");
  const int R = comm.size(), me = comm.rank();
  throw_if_error(detail::agree_config(comm, cfg), me);
  impl_ = std::make_unique<detail::BufferImpl>();
  auto& b = *impl_;
  b.comm = comm;
  b.c = comm.impl().get();
  b.cfg = cfg;
  b.R = R;
  b.me = me;
  b.E = cfg.num_experts;
  b.L = cfg.num_experts / R;
  b.K = cfg.topk;
  b.H = cfg.hidden;
  b.M = cfg.max_tokens;
  b.esz = dtype_size(cfg.dtype);
  b.row_bytes = b.H * b.esz;
  b.align = cfg.expert_alignment;
  b.tag_id = b.c->moe_buffers++;
  throw_if_error(b.init(), me);
}

Buffer::~Buffer() = default;
Buffer::Buffer(Buffer&&) noexcept = default;
Buffer& Buffer::operator=(Buffer&&) noexcept = default;

const Config& Buffer::config() const { return impl_->cfg; }

Traffic Buffer::traffic() const {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  return impl_->traffic;
}

Dispatch Buffer::dispatch(const void* x, size_t num_tokens, const int64_t* topk_idx, const float* topk_w, Schedule s) {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  return value_or_throw(impl_->dispatch(x, num_tokens, topk_idx, topk_w, s), impl_->me);
}

void Buffer::combine(const void* y, const Handle& h, void* out) {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  if (!h.state) {
    impl_->refuse_combine();
    throw Error(Code::InvalidArgument, "moe::combine: empty handle on rank " + std::to_string(impl_->me), impl_->me);
  }
  throw_if_error(impl_->combine(y, *h.state, out), impl_->me);
}

void Buffer::refuse_combine() {
  if (impl_) impl_->refuse_combine();
}

void Buffer::refuse_dispatch(Schedule s) {
  if (impl_) impl_->refuse(s);
}

void Buffer::check_typed(DataType t, size_t x, size_t idx, size_t w, Schedule s) const {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  auto& b = *impl_;
  auto bad = [&](const std::string& m) {
    b.refuse(s);
    throw Error(Code::InvalidArgument, "moe::dispatch: " + m + " on rank " + std::to_string(b.me), b.me);
  };
  if (t != b.cfg.dtype)
    bad(std::string("x has element type ") + strata::to_string(t) + " but the buffer was made for " +
        strata::to_string(b.cfg.dtype));
  if (x % b.H != 0) bad("x has " + std::to_string(x) + " elements, not a multiple of hidden = " + std::to_string(b.H));
  size_t T = x / b.H;
  if (idx != T * b.K)
    bad("topk_idx has " + std::to_string(idx) + " elements, needs num_tokens * topk = " + std::to_string(T * b.K));
  if (w != T * b.K)
    bad("topk_w has " + std::to_string(w) + " elements, needs num_tokens * topk = " + std::to_string(T * b.K));
}

void Buffer::check_typed_combine(DataType t, size_t y, const Handle& h, size_t out) const {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  auto& b = *impl_;
  auto bad = [&](const std::string& m) {
    b.refuse_combine();
    throw Error(Code::InvalidArgument, "moe::combine: " + m + " on rank " + std::to_string(b.me), b.me);
  };
  if (t != b.cfg.dtype)
    bad(std::string("element type ") + strata::to_string(t) + " does not match the buffer's " +
        strata::to_string(b.cfg.dtype));
  if (!h.state) bad("empty handle");
  if (y < h.state->total_rows * b.H)
    bad("y has " + std::to_string(y) +
        " elements, needs total_rows * hidden = " + std::to_string(h.state->total_rows * b.H));
  if (out < h.state->num_tokens * b.H)
    bad("out has " + std::to_string(out) +
        " elements, needs num_tokens * hidden = " + std::to_string(h.state->num_tokens * b.H));
}

}  // namespace strata::moe

// MoE dispatch and combine over the shared heap (DESIGN §5).
//
// Every rank owns, in its symmetric arena (same offset on every rank, so a peer's copy is
// found without a handshake):
//   - a control block: `released`, `counts_ready`, `y` (signal + where the expert outputs
//     are), one `sent_to[d]` signal per destination, and its count row [E];
//   - the Prefill window (compact rows, grown collectively when a batch needs more) and the
//     Decode window ([L][R][M][H], made on the first Decode call).
// All signals carry the call's sequence number, so nothing is ever reset between calls.
//
// One call, seen from rank s:
//   dispatch: publish released = seq-1 (s no longer reads anything of earlier calls), wait
//     until every rank has done so (nobody still reads a window we are about to overwrite),
//     [Prefill: publish the count row, read everyone's], write each row straight into the
//     destination's window, publish sent_to[d] = seq, wait for sent_to[s] = seq from every
//     source.
//   combine: publish where y is and y = seq, read each (t, k) row from the expert rank's y
//     in place, reduce in float32, publish released = seq.
// The Relay schedule is the buffer-centric baseline and moves data only through the
// communicator's all_to_all(v); it shares nothing with the windows but `released`.

#include <strata/moe.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "coll/comm_impl.hpp"
#include "coll/counts.hpp"
#include "common/reduce.hpp"
#include "moe/kernels.hpp"

namespace strata::moe {

const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::Prefill: return "prefill";
    case Schedule::Decode: return "decode";
    case Schedule::Relay: return "relay";
  }
  return "?";
}

size_t Dispatch::count(int l) const {
  size_t n = 0;
  for (int s = 0; s < ranks; ++s) n += count(l, s);
  return n;
}

namespace detail {

using strata::detail::CommImpl;
using transport::Signal;

struct HandleState {
  const BufferImpl* owner = nullptr;
  uint32_t seq = 0;
  Schedule schedule = Schedule::Prefill;
  size_t num_tokens = 0;
  size_t total_rows = 0;        // rows of this rank's layout (what y must hold)
  std::vector<int32_t> dest;    // [T*K]: rank holding row (t, k), -1 = no expert
  std::vector<uint64_t> row;    // [T*K]: its row in dest's layout (Relay: in the returned rows)
  std::vector<float> w;         // [T*K]
  std::vector<uint64_t> counts, offsets;  // [L][R] of this rank's layout
  // Relay only: rows per rank sent in dispatch and received back in combine, and back.
  std::vector<size_t> send_rows, send_displ, recv_rows, recv_displ;
};

namespace {

struct alignas(64) YLine {
  Signal ready;
  uint32_t seg = 0;
  uint64_t off = 0;
  uint64_t bytes = 0;
};

struct CtrlHead {
  alignas(64) Signal released;
  alignas(64) Signal counts_ready;
  alignas(64) YLine y;
};

constexpr size_t kLine = 64;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

Status from_error(const Error& e) { return Status(e.code(), e.what(), e.peer()); }

/// A block of this rank's heap that grows (geometrically) and is otherwise kept: the first
/// touch of a page is what costs here (MEASURED.md).
struct Local {
  void* p = nullptr;
  size_t bytes = 0;
  Status ensure(Communicator& comm, size_t want) {
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
  void release(Communicator& comm) {
    if (p) {
      try {
        comm.free_bytes(p);
      } catch (...) {
      }
    }
    p = nullptr;
    bytes = 0;
  }
  std::byte* b() const { return static_cast<std::byte*>(p); }
};

}  // namespace

struct BufferImpl {
  Communicator comm;
  CommImpl* c = nullptr;
  Config cfg;
  int R = 1, me = 0, E = 0, L = 0, K = 0;
  size_t H = 0, M = 0, esz = 0, row_bytes = 0, align = 1;
  uint32_t seq = 0;
  uint32_t released_pub = 0;

  void* ctrl = nullptr;
  size_t ctrl_bytes = 0;
  std::vector<char*> peer_ctrl;
  void* pwin = nullptr;
  size_t pwin_rows = 0;
  std::vector<std::byte*> peer_pwin;
  void* dwin = nullptr;
  std::vector<std::byte*> peer_dwin;

  Local send_stage, recv_stage, relay_win, relay_cnt;
  std::vector<float> acc;
  std::vector<uint32_t> cnt;   // [E] this call's rows per expert
  std::vector<uint32_t> rank_in_expert;  // [T*K]
  std::vector<uint64_t> matrix;  // [R][E] (Prefill)

  CtrlHead* head(int r) const { return reinterpret_cast<CtrlHead*>(peer_ctrl[r]); }
  Signal& sent_to(int r, int d) const {
    return *reinterpret_cast<Signal*>(peer_ctrl[r] + sizeof(CtrlHead) + kLine * static_cast<size_t>(d));
  }
  uint64_t* count_row(int r) const {
    return reinterpret_cast<uint64_t*>(peer_ctrl[r] + sizeof(CtrlHead) + kLine * static_cast<size_t>(R));
  }
  Deadline deadline() const { return Deadline::after(c->timeout); }
  std::string where() const { return " on rank " + std::to_string(me) + " (moe call #" + std::to_string(seq) + ")"; }

  Status wait_sig(const Signal& s, uint32_t target, Deadline d, int peer, const char* what) {
    Status st = transport::wait_reached(s, target, c->policy(d), what);
    if (st.is_ok()) return st;
    Status full(st.code(),
                std::string("moe ") + st.message() + where() + " waiting for rank " + std::to_string(peer) +
                    " (timeout " + std::to_string(c->timeout.count()) + " ms)",
                st.peer() >= 0 ? st.peer() : peer);
    c->set_broken(full);
    return full;
  }

  Result<std::vector<std::byte*>> peers_of(void* local, size_t bytes, Deadline d) {
    memory::Heap& heap = *c->ctx->heap;
    auto ref = heap.locate(local, bytes);
    if (!ref) return internal_error("moe: a symmetric window is not in the heap");
    std::vector<std::byte*> out(R);
    for (int r = 0; r < R; ++r) {
      STRATA_ASSIGN_OR_RETURN(void* p, heap.peer_ptr(c->members[r], *ref, bytes, d));
      out[r] = static_cast<std::byte*>(p);
    }
    return out;
  }

  Result<void*> sym_alloc(size_t bytes) {
    try {
      return comm.alloc_symmetric_bytes(bytes);
    } catch (const Error& e) {
      return from_error(e);
    }
  }

  Status init() {
    ctrl_bytes = sizeof(CtrlHead) + kLine * static_cast<size_t>(R) + round_up(sizeof(uint64_t) * E, kLine);
    STRATA_ASSIGN_OR_RETURN(ctrl, sym_alloc(ctrl_bytes));
    // The arena recycles blocks: an earlier Buffer's signals may still be in there.
    std::memset(ctrl, 0, ctrl_bytes);
    STRATA_ASSIGN_OR_RETURN(auto pc, peers_of(ctrl, ctrl_bytes, deadline()));
    peer_ctrl.resize(R);
    for (int r = 0; r < R; ++r) peer_ctrl[r] = reinterpret_cast<char*>(pc[r]);
    try {
      comm.barrier();  // nobody reads a control block before its owner cleared it
    } catch (const Error& e) {
      return from_error(e);
    }
    STRATA_RETURN_IF_ERROR(relay_cnt.ensure(comm, 2 * sizeof(uint64_t) * E));
    acc.resize(H);
    cnt.resize(E);
    return Status::ok();
  }

  ~BufferImpl() {
    if (!c) return;
    // Peers may still read our windows in their combine; freed blocks are recycled, so wait
    // for them (unless the communicator is already broken: then nobody reads anymore).
    if (!c->is_broken.load() && static_cast<int>(peer_ctrl.size()) == R) {  // init got that far
      publish_released(seq);
      Deadline d = deadline();
      for (int r = 0; r < R; ++r)
        if (!wait_sig(head(r)->released, seq, d, r, "destroy").is_ok()) break;
    }
    memory::Heap& heap = *c->ctx->heap;
    if (dwin) (void)heap.free_symmetric(dwin);
    if (pwin) (void)heap.free_symmetric(pwin);
    if (ctrl) (void)heap.free_symmetric(ctrl);
    for (Local* l : {&send_stage, &recv_stage, &relay_win, &relay_cnt}) l->release(comm);
  }

  void publish_released(uint32_t s) {
    if (released_pub == s) return;
    released_pub = s;
    transport::publish(head(me)->released, s);
  }

  // ---- argument checks -----------------------------------------------------------------------

  Status validate(const void* x, size_t T, const int64_t* idx, const float* w) const {
    const std::string on = " on rank " + std::to_string(me);
    if (T > M)
      return invalid_argument("moe::dispatch: num_tokens = " + std::to_string(T) + on + " exceeds max_tokens = " +
                              std::to_string(M));
    if (T && (!x || !idx || !w))
      return invalid_argument(std::string("moe::dispatch: ") + (!x ? "x" : !idx ? "topk_idx" : "topk_w") +
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

  /// cnt[e] = rows for expert e; rank_in_expert[t*K+k] = rank of token t among those rows.
  void plan(size_t T, const int64_t* idx) {
    std::fill(cnt.begin(), cnt.end(), 0u);
    rank_in_expert.resize(T * K);
    for (size_t i = 0; i < T * K; ++i) {
      int64_t e = idx[i];
      if (e >= 0) rank_in_expert[i] = cnt[e]++;
    }
  }

  /// Starts a call: nothing of call seq-1 is read by this rank anymore; with `wait_readers`,
  /// waits until that holds on every rank (our next writes land in windows they read).
  Status begin(Deadline d, bool wait_readers) {
    STRATA_RETURN_IF_ERROR(c->broken());
    ++seq;
    publish_released(seq - 1);
    if (wait_readers)
      for (int r = 0; r < R; ++r) STRATA_RETURN_IF_ERROR(wait_sig(head(r)->released, seq - 1, d, r, "dispatch"));
    return Status::ok();
  }

  std::shared_ptr<HandleState> new_handle(Schedule s, size_t T, const float* w) {
    auto h = std::make_shared<HandleState>();
    h->owner = this;
    h->seq = seq;
    h->schedule = s;
    h->num_tokens = T;
    h->dest.assign(T * K, -1);
    h->row.assign(T * K, 0);
    h->w.assign(w, w + T * K);
    return h;
  }

  Dispatch result(Schedule s, std::shared_ptr<HandleState> h, std::byte* window) const {
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
    out.handle.state = std::move(h);
    return out;
  }

  Status send_rows_to(size_t T, const std::byte* xb, const int64_t* idx, const std::vector<std::byte*>& win,
                      const std::vector<uint64_t>& first_row, HandleState& h) {
    for (size_t t = 0; t < T; ++t) {
      const std::byte* src = xb + t * row_bytes;
      for (int k = 0; k < K; ++k) {
        size_t i = t * K + k;
        int64_t e = idx[i];
        if (e < 0) continue;
        int d = static_cast<int>(e / L);
        uint64_t r = first_row[e] + rank_in_expert[i];
        strata::kernels::copy(win[d] + r * row_bytes, src, row_bytes);
        h.dest[i] = d;
        h.row[i] = r;
      }
    }
    return Status::ok();
  }

  Status finish_sends(Deadline d) {
    for (int r = 0; r < R; ++r) transport::publish(sent_to(me, (me + r) % R), seq);
    for (int k = 0; k < R; ++k) {
      int s = (me + R - k) % R;
      STRATA_RETURN_IF_ERROR(wait_sig(sent_to(s, me), seq, d, s, "dispatch"));
    }
    return Status::ok();
  }

  // ---- Prefill -----------------------------------------------------------------------------

  Status grow_prefill(size_t rows, Deadline d) {
    // Every rank sees the same count matrix, so every rank takes this branch together.
    if (pwin) (void)c->ctx->heap->free_symmetric(pwin);
    pwin = nullptr;
    pwin_rows = 0;
    size_t want = rows + rows / 4;
    STRATA_ASSIGN_OR_RETURN(pwin, sym_alloc(want * row_bytes));
    pwin_rows = want;
    STRATA_ASSIGN_OR_RETURN(peer_pwin, peers_of(pwin, want * row_bytes, d));
    return Status::ok();
  }

  /// Compact layout of rank d given the count matrix: first row of (expert l, source s).
  void compact_layout(int d, const uint64_t* mat, std::vector<uint64_t>& offsets, size_t& total) const {
    offsets.assign(static_cast<size_t>(L) * R, 0);
    size_t row = 0;
    for (int l = 0; l < L; ++l) {
      row = round_up(row, align);
      int e = d * L + l;
      for (int s = 0; s < R; ++s) {
        offsets[static_cast<size_t>(l) * R + s] = row;
        row += mat[static_cast<size_t>(s) * E + e];
      }
    }
    total = row;
  }

  Result<Dispatch> prefill(const void* x, size_t T, const int64_t* idx, const float* w) {
    Deadline d = deadline();
    STRATA_RETURN_IF_ERROR(begin(d, true));
    plan(T, idx);
    uint64_t* mine = count_row(me);
    for (int e = 0; e < E; ++e) mine[e] = cnt[e];
    transport::publish(head(me)->counts_ready, seq);
    matrix.resize(static_cast<size_t>(R) * E);
    for (int k = 0; k < R; ++k) {
      int r = (me + k) % R;
      STRATA_RETURN_IF_ERROR(wait_sig(head(r)->counts_ready, seq, d, r, "dispatch (count exchange)"));
      std::memcpy(&matrix[static_cast<size_t>(r) * E], count_row(r), sizeof(uint64_t) * E);
    }
    // Where our rows for each expert start, and how large the largest window must be.
    std::vector<uint64_t> first_row(E), offs;
    size_t need = 0;
    auto h = new_handle(Schedule::Prefill, T, w);
    for (int dst = 0; dst < R; ++dst) {
      size_t total = 0;
      compact_layout(dst, matrix.data(), offs, total);
      need = std::max(need, total);
      for (int l = 0; l < L; ++l) first_row[dst * L + l] = offs[static_cast<size_t>(l) * R + me];
      if (dst == me) {
        h->total_rows = total;
        h->offsets = offs;
      }
    }
    if (need > pwin_rows) STRATA_RETURN_IF_ERROR(grow_prefill(need, d));
    STRATA_RETURN_IF_ERROR(send_rows_to(T, static_cast<const std::byte*>(x), idx, peer_pwin, first_row, *h));
    STRATA_RETURN_IF_ERROR(finish_sends(d));
    h->counts.resize(static_cast<size_t>(L) * R);
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < R; ++s) h->counts[static_cast<size_t>(l) * R + s] = matrix[static_cast<size_t>(s) * E + me * L + l];
    return result(Schedule::Prefill, std::move(h), static_cast<std::byte*>(pwin));
  }

  // ---- Decode ------------------------------------------------------------------------------

  Result<Dispatch> decode(const void* x, size_t T, const int64_t* idx, const float* w) {
    Deadline d = deadline();
    STRATA_RETURN_IF_ERROR(begin(d, true));
    const size_t rows = static_cast<size_t>(L) * R * M;
    if (!dwin) {  // first Decode call, on every rank at once
      STRATA_ASSIGN_OR_RETURN(dwin, sym_alloc(rows * row_bytes));
      STRATA_ASSIGN_OR_RETURN(peer_dwin, peers_of(dwin, rows * row_bytes, d));
    }
    plan(T, idx);
    uint64_t* mine = count_row(me);
    for (int e = 0; e < E; ++e) mine[e] = cnt[e];  // released with sent_to below
    std::vector<uint64_t> first_row(E);
    for (int e = 0; e < E; ++e) first_row[e] = (static_cast<size_t>(e % L) * R + me) * M;
    auto h = new_handle(Schedule::Decode, T, w);
    h->total_rows = rows;
    STRATA_RETURN_IF_ERROR(send_rows_to(T, static_cast<const std::byte*>(x), idx, peer_dwin, first_row, *h));
    STRATA_RETURN_IF_ERROR(finish_sends(d));
    h->counts.resize(static_cast<size_t>(L) * R);
    h->offsets.resize(static_cast<size_t>(L) * R);
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < R; ++s) {
        h->counts[static_cast<size_t>(l) * R + s] = count_row(s)[me * L + l];
        h->offsets[static_cast<size_t>(l) * R + s] = (static_cast<size_t>(l) * R + s) * M;
      }
    return result(Schedule::Decode, std::move(h), static_cast<std::byte*>(dwin));
  }

  // ---- Relay (baseline) --------------------------------------------------------------------

  Status a2av(const void* in, const std::vector<size_t>& sc, const std::vector<size_t>& sd, void* out,
              const std::vector<size_t>& rc, const std::vector<size_t>& rd) {
    auto el = [&](const std::vector<size_t>& v) {
      std::vector<size_t> o(v.size());
      for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * H;
      return o;
    };
    auto sce = el(sc), sde = el(sd), rce = el(rc), rde = el(rd);
    try {
      comm.all_to_all_v(in, sce.data(), sde.data(), out, rce.data(), rde.data(), cfg.dtype);
    } catch (const Error& e) {
      return from_error(e);
    }
    return Status::ok();
  }

  Result<Dispatch> relay(const void* x, size_t T, const int64_t* idx, const float* w) {
    Deadline d = deadline();
    STRATA_RETURN_IF_ERROR(begin(d, false));
    plan(T, idx);
    auto h = new_handle(Schedule::Relay, T, w);
    // Permute: rows sorted by global expert id, which groups them by destination rank.
    std::vector<uint64_t> first(E, 0);
    for (int e = 1; e < E; ++e) first[e] = first[e - 1] + cnt[e - 1];
    const size_t sent = E ? first[E - 1] + cnt[E - 1] : 0;
    STRATA_RETURN_IF_ERROR(send_stage.ensure(comm, sent * row_bytes));
    const auto* xb = static_cast<const std::byte*>(x);
    for (size_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        size_t i = t * K + k;
        int64_t e = idx[i];
        if (e < 0) continue;
        uint64_t pos = first[e] + rank_in_expert[i];
        strata::kernels::copy(send_stage.b() + pos * row_bytes, xb + t * row_bytes, row_bytes);
        h->dest[i] = static_cast<int32_t>(e / L);
        h->row[i] = pos;
      }
    // Counts: [d][l] to rank d; back comes [s][l] = rows of our expert l from rank s.
    auto* cs = static_cast<uint64_t*>(relay_cnt.p);
    auto* cr = cs + E;
    for (int e = 0; e < E; ++e) cs[e] = cnt[e];
    try {
      comm.all_to_all(cs, cr, static_cast<size_t>(L), DataType::UInt64);
    } catch (const Error& e) {
      return from_error(e);
    }
    h->send_rows.assign(R, 0);
    h->recv_rows.assign(R, 0);
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < L; ++l) {
        h->send_rows[r] += cnt[r * L + l];
        h->recv_rows[r] += cr[r * L + l];
      }
    h->send_displ = coll::prefix_sums(h->send_rows);
    h->recv_displ = coll::prefix_sums(h->recv_rows);
    const size_t received = h->recv_displ[R - 1] + h->recv_rows[R - 1];
    STRATA_RETURN_IF_ERROR(recv_stage.ensure(comm, received * row_bytes));
    STRATA_RETURN_IF_ERROR(a2av(send_stage.p, h->send_rows, h->send_displ, recv_stage.p, h->recv_rows, h->recv_displ));
    // Unpermute: [source][expert] chunks into [expert][source] order.
    std::vector<uint64_t> mat(static_cast<size_t>(R) * E, 0);
    for (int s = 0; s < R; ++s)
      for (int l = 0; l < L; ++l) mat[static_cast<size_t>(s) * E + me * L + l] = cr[s * L + l];
    compact_layout(me, mat.data(), h->offsets, h->total_rows);
    STRATA_RETURN_IF_ERROR(relay_win.ensure(comm, h->total_rows * row_bytes));
    h->counts.resize(static_cast<size_t>(L) * R);
    for (int s = 0; s < R; ++s) {
      size_t at = h->recv_displ[s];
      for (int l = 0; l < L; ++l) {
        size_t n = cr[s * L + l];
        h->counts[static_cast<size_t>(l) * R + s] = n;
        strata::kernels::copy(relay_win.b() + h->offsets[static_cast<size_t>(l) * R + s] * row_bytes,
                      recv_stage.b() + at * row_bytes, n * row_bytes);
        at += n;
      }
    }
    return result(Schedule::Relay, std::move(h), relay_win.b());
  }

  Result<Dispatch> dispatch(const void* x, size_t T, const int64_t* idx, const float* w, Schedule s) {
    STRATA_RETURN_IF_ERROR(validate(x, T, idx, w));
    switch (s) {
      case Schedule::Prefill: return prefill(x, T, idx, w);
      case Schedule::Decode: return decode(x, T, idx, w);
      case Schedule::Relay: return relay(x, T, idx, w);
    }
    return invalid_argument("moe::dispatch: unknown schedule " + std::to_string(static_cast<int>(s)) +
                            " on rank " + std::to_string(me));
  }

  // ---- combine -----------------------------------------------------------------------------

  /// out[t] = sum_k w * row(t, k), rows found by `row_of`.
  template <class RowOf>
  void reduce_tokens(const HandleState& h, void* out, RowOf&& row_of) {
    auto* ob = static_cast<std::byte*>(out);
    for (size_t t = 0; t < h.num_tokens; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int k = 0; k < K; ++k) {
        size_t i = t * K + k;
        if (h.dest[i] < 0) continue;
        kernels::accumulate(cfg.dtype, acc.data(), row_of(i), h.w[i], H);
      }
      kernels::store(cfg.dtype, ob + t * row_bytes, acc.data(), H);
    }
  }

  Status combine_relay(const HandleState& h, const void* y, void* out) {
    // Permute back: [expert][source] rows into [source][expert] chunks, return them, reduce.
    const auto* yb = static_cast<const std::byte*>(y);
    for (int s = 0; s < R; ++s) {
      size_t at = h.recv_displ[s];
      for (int l = 0; l < L; ++l) {
        size_t n = h.counts[static_cast<size_t>(l) * R + s];
        strata::kernels::copy(recv_stage.b() + at * row_bytes, yb + h.offsets[static_cast<size_t>(l) * R + s] * row_bytes,
                      n * row_bytes);
        at += n;
      }
    }
    STRATA_RETURN_IF_ERROR(a2av(recv_stage.p, h.recv_rows, h.recv_displ, send_stage.p, h.send_rows, h.send_displ));
    reduce_tokens(h, out, [&](size_t i) { return send_stage.b() + h.row[i] * row_bytes; });
    publish_released(seq);
    return Status::ok();
  }

  Status combine(const void* y, const HandleState& h, void* out) {
    if (h.owner != this)
      return invalid_argument("moe::combine: the handle comes from another moe::Buffer" + where());
    if (h.seq != seq)
      return invalid_argument("moe::combine: the handle is from dispatch #" + std::to_string(h.seq) +
                              " but the buffer's latest dispatch is #" + std::to_string(seq) +
                              " (windows are reused by every dispatch)" + where());
    if (h.num_tokens && !out) return invalid_argument("moe::combine: out is null" + where());
    if (h.total_rows && !y) return invalid_argument("moe::combine: y is null" + where());
    STRATA_RETURN_IF_ERROR(c->broken());
    if (h.schedule == Schedule::Relay) return combine_relay(h, y, out);

    Deadline d = deadline();
    const bool masked = h.schedule == Schedule::Decode;
    auto* window = static_cast<std::byte*>(masked ? dwin : pwin);
    const size_t y_bytes = h.total_rows * row_bytes;
    memory::Heap& heap = *c->ctx->heap;
    bool in_window = y == window;
    std::optional<memory::SegRef> ref;
    if (!in_window && y_bytes) ref = heap.locate(y, y_bytes);
    if (!in_window && !ref) {
      // Not readable by peers: bring the rows in use into the window (it is ours until the
      // next dispatch).
      for (size_t b = 0; b < h.counts.size(); ++b)
        if (h.counts[b])
          std::memmove(window + h.offsets[b] * row_bytes, static_cast<const std::byte*>(y) + h.offsets[b] * row_bytes,
                       h.counts[b] * row_bytes);
      c->staged_bytes.fetch_add(y_bytes, std::memory_order_relaxed);
      in_window = true;
    }
    YLine& yl = head(me)->y;
    yl.seg = in_window ? 0 : ref->seg;
    yl.off = in_window ? 0 : ref->offset;
    yl.bytes = in_window ? 0 : y_bytes;
    transport::publish(yl.ready, seq);

    std::vector<const std::byte*> ys(R);
    for (int k = 0; k < R; ++k) {
      int r = (me + k) % R;
      STRATA_RETURN_IF_ERROR(wait_sig(head(r)->y.ready, seq, d, r, "combine"));
      const YLine& py = head(r)->y;
      if (py.bytes == 0) {
        const auto& win = masked ? peer_dwin : peer_pwin;
        ys[r] = win.empty() ? nullptr : win[r];  // no window yet: no rows anywhere
      } else {
        STRATA_ASSIGN_OR_RETURN(void* p, heap.peer_ptr(c->members[r], {py.seg, py.off}, py.bytes, d));
        ys[r] = static_cast<const std::byte*>(p);
      }
    }
    reduce_tokens(h, out, [&](size_t i) { return ys[h.dest[i]] + h.row[i] * row_bytes; });
    publish_released(seq);
    if (!in_window) {
      // y is the caller's: it may be reused once we return, so every reader must be done.
      for (int r = 0; r < R; ++r) STRATA_RETURN_IF_ERROR(wait_sig(head(r)->released, seq, d, r, "combine"));
    }
    return Status::ok();
  }
};

}  // namespace detail

// ---- public API ------------------------------------------------------------------------------

Buffer::Buffer(Communicator comm, const Config& cfg) {
  if (!comm.valid()) throw Error(Code::InvalidArgument, "moe::Buffer: the communicator is invalid");
  const int R = comm.size(), me = comm.rank();
  auto bad = [&](const std::string& m) {
    throw Error(Code::InvalidArgument, "moe::Buffer: " + m + " on rank " + std::to_string(me), me);
  };
  if (cfg.num_experts <= 0 || cfg.num_experts % R != 0)
    bad("num_experts = " + std::to_string(cfg.num_experts) + " is not a positive multiple of the " +
        std::to_string(R) + " ranks");
  if (cfg.topk < 1 || cfg.topk > cfg.num_experts)
    bad("topk = " + std::to_string(cfg.topk) + " is outside [1, num_experts = " + std::to_string(cfg.num_experts) + "]");
  if (cfg.hidden == 0) bad("hidden is 0");
  if (cfg.max_tokens == 0) bad("max_tokens is 0");
  if (cfg.expert_alignment == 0) bad("expert_alignment is 0");
  if (cfg.dtype != DataType::BFloat16 && cfg.dtype != DataType::Float16 && cfg.dtype != DataType::Float32)
    bad(std::string("dtype ") + strata::to_string(cfg.dtype) + " is not bfloat16, float16 or float32");

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
  throw_if_error(b.init(), me);
}

Buffer::~Buffer() = default;
Buffer::Buffer(Buffer&&) noexcept = default;
Buffer& Buffer::operator=(Buffer&&) noexcept = default;

const Config& Buffer::config() const { return impl_->cfg; }

Dispatch Buffer::dispatch(const void* x, size_t num_tokens, const int64_t* topk_idx, const float* topk_w,
                          Schedule s) {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  return value_or_throw(impl_->dispatch(x, num_tokens, topk_idx, topk_w, s), impl_->me);
}

void Buffer::combine(const void* y, const Handle& h, void* out) {
  if (!impl_) throw Error(Code::InvalidArgument, "moe::Buffer: used after move");
  if (!h.state) throw Error(Code::InvalidArgument, "moe::combine: empty handle", impl_->me);
  throw_if_error(impl_->combine(y, *h.state, out), impl_->me);
}

void Buffer::check_typed(DataType t, size_t x, size_t idx, size_t w) const {
  const auto& b = *impl_;
  auto bad = [&](const std::string& m) {
    throw Error(Code::InvalidArgument, "moe::dispatch: " + m + " on rank " + std::to_string(b.me), b.me);
  };
  if (t != b.cfg.dtype)
    bad(std::string("x has element type ") + strata::to_string(t) + " but the buffer was made for " +
        strata::to_string(b.cfg.dtype));
  if (x % b.H != 0) bad("x has " + std::to_string(x) + " elements, not a multiple of hidden = " + std::to_string(b.H));
  size_t T = x / b.H;
  if (idx != T * b.K) bad("topk_idx has " + std::to_string(idx) + " elements, needs num_tokens * topk = " + std::to_string(T * b.K));
  if (w != T * b.K) bad("topk_w has " + std::to_string(w) + " elements, needs num_tokens * topk = " + std::to_string(T * b.K));
}

void Buffer::check_typed_combine(DataType t, size_t y, const Handle& h, size_t out) const {
  const auto& b = *impl_;
  auto bad = [&](const std::string& m) {
    throw Error(Code::InvalidArgument, "moe::combine: " + m + " on rank " + std::to_string(b.me), b.me);
  };
  if (t != b.cfg.dtype)
    bad(std::string("element type ") + strata::to_string(t) + " does not match the buffer's " +
        strata::to_string(b.cfg.dtype));
  if (!h.state) bad("empty handle");
  if (y < h.state->total_rows * b.H)
    bad("y has " + std::to_string(y) + " elements, needs total_rows * hidden = " + std::to_string(h.state->total_rows * b.H));
  if (out < h.state->num_tokens * b.H)
    bad("out has " + std::to_string(out) + " elements, needs num_tokens * hidden = " + std::to_string(h.state->num_tokens * b.H));
}

}  // namespace strata::moe

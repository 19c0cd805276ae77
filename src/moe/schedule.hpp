#pragma once
// What the files of the MoE engine share (DESIGN §5): the per-call handle, the control block
// every rank keeps in its symmetric arena, and BufferImpl, whose member functions are defined
// where their schedule lives:
//   buffer.cpp   construction, argument checks, planning, the entry points (dispatch, combine)
//   windows.cpp  direct writes into peers' windows and the in-place combine (Prefill, Decode)
//   prefill.cpp  count exchange, compact layout, growing the window
//   decode.cpp   the fixed [L][R][M] layout
//   relay.cpp    the all_to_all(v) baseline, dispatch and combine
//   xhost.cpp    Prefill and Decode between hosts (deduplicated rows through gate ranks)
//
// Every rank owns, in its symmetric arena (same offset on every rank, so a peer's copy is
// found without a handshake):
//   - a control block: `released`, `counts_ready`, `y` (signal + where the expert outputs
//     are), one `sent_to[d]` signal per destination, its count row [E] and, for rows that
//     came from other hosts, the counts [R][L] their gate placed here (Decode);
//   - the Prefill window (compact rows, grown collectively when a batch needs more) and the
//     Decode window ([L][R][M][H], made on the first Decode call).
// All signals carry the call's sequence number, so nothing is ever reset between calls.
// On a communicator that spans hosts, "every rank" above means every rank of this host
// (`shm_ranks`): only they map each other's arenas; other hosts are reached by messages.

#include <strata/moe.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coll/comm_impl.hpp"
#include "moe/kernels.hpp"

namespace strata::moe::detail {

using strata::detail::CommImpl;
using transport::Signal;

/// What combine needs to know about one dispatch (behind moe::Handle).
struct HandleState {
  const BufferImpl* owner = nullptr;
  uint32_t seq = 0;
  uint64_t epoch = 0;  // the Buffer's epoch at dispatch: peer pointers of older ones are gone
  Schedule schedule = Schedule::Prefill;
  size_t num_tokens = 0;
  size_t total_rows = 0;      // rows of this rank's layout (what y must hold)
  std::vector<int32_t> dest;  // [T*K]: rank holding row (t, k), -1 = no expert
  std::vector<uint64_t> row;  // [T*K]: its row in dest's layout (Relay: in the returned rows)
  std::vector<float> w;       // [T*K]
  // [T*K]: 1 = selection dropped because its rank failed (masking). combine() adds those of
  // ranks that died before publishing their outputs, hence mutable.
  mutable std::vector<uint8_t> lost;
  std::vector<uint64_t> counts, offsets;  // [L][R] of this rank's layout
  // Spanning hosts (Prefill, Decode): per (token, host) the token's position in the message
  // to that host (kNone: not sent there), and the tokens sent to each host.
  std::vector<uint32_t> xpos;    // [T][hosts]
  std::vector<uint32_t> xcount;  // [hosts]
  // Relay only: rows per rank sent in dispatch and received back in combine, and back.
  std::vector<size_t> send_rows, send_displ, recv_rows, recv_displ;
};

/// The control block's `y` line: the expert outputs are ready, and where they lie (bytes 0:
/// in the owner's window of the schedule).
struct alignas(64) YLine {
  Signal ready;
  uint32_t seg = 0;
  uint64_t off = 0;
  uint64_t bytes = 0;
};

/// Start of the control block; `sent_to[R]` and the count row follow it.
struct CtrlHead {
  /// (call number << 8) | 0x80 if refused | schedule of the dispatch its owner is in: a peer
  /// that waits for it in vain learns from it that the two called different schedules.
  alignas(64) std::atomic<uint64_t> call{0};
  alignas(64) Signal released;
  alignas(64) Signal counts_ready;
  alignas(64) YLine y;
};

/// Bytes of a call's rows from which dispatch and combine write with streaming stores: well
/// past the last-level cache, where claiming each destination line first costs more than
/// writing around the cache (the threshold of strata::kernels::copy).
inline constexpr size_t kStreamOutBytes = size_t{8} << 20;

/// "Not sent to that host" in HandleState::xpos.
inline constexpr uint32_t kNone = 0xffffffffu;

/// One cache line per signal, so that writers of different signals never share a line.
inline constexpr size_t kLine = 64;

/// `v` rounded up to a multiple of `a`.
inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/// The Status of a caught Error (the engine works in Status; the public API throws).
inline Status from_error(const Error& e) { return Status(e.code(), e.what(), e.peer()); }

/// A block of this rank's heap that grows (geometrically) and is otherwise kept: the first
/// touch of a page is what costs here (MEASURED.md).
struct Local {
  void* p = nullptr;
  size_t bytes = 0;
  /// At least `want` bytes in `p` (contents not kept when it grows).
  Status ensure(Communicator& comm, size_t want);
  /// Frees the block (errors ignored: called on teardown).
  void release(Communicator& comm);
  /// `p` as bytes.
  std::byte* b() const { return static_cast<std::byte*>(p); }
};

/// One selection of a token that came from another host: where its gate placed the row.
struct Placed {
  int32_t dest = 0;  // comm rank (on this host)
  float w = 0.0f;
  uint64_t row = 0;  // row in dest's window
};

/// A remote source whose rows this rank places on its host (this rank is its gate).
struct Inbound {
  int src = -1;
  Local stage;                  // the dispatch message as it arrived
  transport::TransferPtr recv;  // its receive (this call)
  size_t n = 0;                 // tokens in the message
  std::vector<uint32_t> first;  // [n + 1]: token j's selections are sel[first[j], first[j+1])
  std::vector<Placed> sel;
  Local back;                        // combine: one partial row per token, sent back to src
  transport::RemoteRef src_partial;  // puts: where src takes our partial rows
};

/// Another host, seen from this rank as a source.
struct Outbound {
  int host = 0;
  int gate = 0;                     // comm rank on `host` that places our rows there
  Local stage;                      // the dispatch message: record then rows
  Local partial;                    // combine: the partial rows that come back
  transport::RemoteRef gate_stage;  // puts: where the gate takes our message
};

/// The state of one moe::Buffer on this rank.
struct BufferImpl {
  Communicator comm;
  CommImpl* c = nullptr;
  Config cfg;
  int R = 1, me = 0, E = 0, L = 0, K = 0;
  size_t H = 0, M = 0, esz = 0, row_bytes = 0, align = 1;
  uint32_t seq = 0;
  uint32_t released_pub = 0;
  // The communicator's epoch when the peer pointers below were resolved. Every pointer into a
  // peer's mapping is valid for that epoch only: recover() unmaps a replaced rank's heap
  // (drop_peer), so a call in a newer epoch resolves them again first (issue 18 item 8).
  uint64_t epoch = 0;
  // Masking: dead[r] once member r's process has exited (seen by a wait on r); cleared when
  // the Buffer rejoins after recover().
  std::vector<uint8_t> dead;

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
  std::vector<uint32_t> cnt;             // [E] this call's rows per expert
  std::vector<uint32_t> rank_in_expert;  // [T*K]
  std::vector<uint64_t> matrix;          // [R][E] (Prefill)
  std::vector<int64_t> masked_idx;       // [T*K] topk_idx less the dead ranks' experts

  // ---- spanning hosts (xhost.cpp) ------------------------------------------------------------
  bool xhost = false;          // the communicator spans hosts
  std::vector<int> shm_ranks;  // ranks whose arenas this rank maps: all, or those of its host
  std::vector<int> host_of;    // comm rank -> host (all 0 within one host)
  int hosts = 1, my_host = 0;
  uint32_t tag_id = 0;   // this Buffer's number on the communicator (its message tags)
  bool use_put = false;  // rows between hosts go as one-sided puts (the transport's data path)
  std::vector<Inbound> inbound;
  std::vector<Outbound> outbound;  // one per other host, ascending host order
  Traffic traffic;

  /// Rank r's control block head.
  CtrlHead* head(int r) const { return reinterpret_cast<CtrlHead*>(peer_ctrl[r]); }
  /// Rank r's "my rows for d are written" signal.
  Signal& sent_to(int r, int d) const {
    return *reinterpret_cast<Signal*>(peer_ctrl[r] + sizeof(CtrlHead) + kLine * static_cast<size_t>(d));
  }
  /// Rank r's count row [E].
  uint64_t* count_row(int r) const {
    return reinterpret_cast<uint64_t*>(peer_ctrl[r] + sizeof(CtrlHead) + kLine * static_cast<size_t>(R));
  }
  /// Rank r's counts [R][L] of rows placed there for sources on other hosts (by their gates).
  uint64_t* in_counts(int r) const {
    return reinterpret_cast<uint64_t*>(peer_ctrl[r] + sizeof(CtrlHead) + kLine * static_cast<size_t>(R) +
                                       round_up(sizeof(uint64_t) * E, kLine));
  }
  /// Whether comm rank r shares this rank's host.
  bool on_my_host(int r) const { return host_of[r] == my_host; }
  /// The deadline of a wait starting now.
  Deadline deadline() const { return Deadline::after(c->timeout); }
  /// " on rank r (moe call #n)", for error messages.
  std::string where() const { return " on rank " + std::to_string(me) + " (moe call #" + std::to_string(seq) + ")"; }

  // ---- buffer.cpp ----------------------------------------------------------------------------

  /// Waits until `s` reaches `target`; a failure breaks the communicator (peers are out of step).
  Status wait_sig(const Signal& s, uint32_t target, Deadline d, int peer, const char* what);
  /// `st`, a failed wait on `peer`, with this call's context; marks the communicator broken.
  Status wait_failed(const Status& st, int peer);
  /// Masking off: wait_sig, true. On: waits until `s` reaches `target` or peer `peer` has
  /// exited; then re-reads the (frozen) signal: false when it never got there, so every
  /// survivor decides alike. A user abort, a timeout or a sticky error other than
  /// PeerFailed still ends the wait with that error.
  Result<bool> wait_live(const Signal& s, uint32_t target, Deadline d, int peer, const char* what);
  /// What ends a masked wait on `peer` besides its signal (see wait_live).
  Status masked_check(int peer);
  /// Whether some rank is known dead.
  bool any_dead() const { return std::find(dead.begin(), dead.end(), 1) != dead.end(); }
  /// The communicator's sticky error, except a PeerFailed when masking (the call goes on).
  Status usable() const;
  /// PeerFailed naming the masked ranks: `what` needs every rank (a window must grow).
  Status needs_all(const std::string& what) const;
  /// Every rank's address of the symmetric block `local`.
  Result<std::vector<std::byte*>> peers_of(void* local, size_t bytes, Deadline d);
  /// A symmetric block (collective).
  Result<void*> sym_alloc(size_t bytes);
  /// Makes the control block and the Relay count block (collective).
  Status init();
  /// After recover() (collective): drops every pointer into peers' mappings, frees the control
  /// block and the windows, restarts the call count and runs init() again. Survivors run it
  /// on their first call in a new epoch; it pairs with init() in the replacement's new Buffer.
  /// Windows are made again, collectively, when a call needs them.
  Status rejoin();
  ~BufferImpl();
  /// Publishes `released = s` unless already done.
  void publish_released(uint32_t s);
  /// Argument checks of dispatch.
  Status validate(const void* x, size_t T, const int64_t* idx, const float* w) const;
  /// A published count in the place of a dispatch this rank refused (its arguments were
  /// invalid): the rank takes part in schedule `s` with no tokens and publishes this instead
  /// of its counts, so that every peer fails the call naming it instead of waiting for it.
  static constexpr uint64_t kRefusedRows = ~uint64_t{0};
  /// Set while this rank runs such a call (refuse).
  bool refusing = false;
  /// Runs schedule `s` as a refused call (see kRefusedRows); its own result is of no use.
  void refuse(Schedule s);
  /// InvalidArgument naming rank r, whose count (or y line's bytes, in combine) `count` is
  /// kRefusedRows, else ok. `call` is "dispatch" or "combine".
  Status refused_by(int r, uint64_t count, const char* call = "dispatch") const;
  /// This rank's part in the latest dispatch and its combine (reset by every dispatch, so
  /// nothing compares call numbers that wrap): whether the dispatch succeeded here, with which
  /// schedule (the one the peers' combine runs), and whether this rank joined its combine, or
  /// saw it fail or refused it (then it is not run again: the peers have moved on, and a
  /// retry would meet their next call).
  bool dispatched = false;
  Schedule dispatched_schedule = Schedule::Prefill;
  enum class Combine { None, Joined, Failed } combined = Combine::None;
  /// Takes this rank's place in the combine of the latest dispatch, which it refuses (its
  /// arguments are invalid): a y line marked kRefusedRows (windows) or a refused collective
  /// (Relay), so that the peers fail naming this rank before they read anything, instead of
  /// waiting for it. Nothing when this rank already joined that combine.
  void refuse_combine();
  /// Writes this call's E counts (cnt, or kRefusedRows while refusing) to `row`.
  void put_counts(uint64_t* row) const {
    for (int e = 0; e < E; ++e) row[e] = refusing ? kRefusedRows : cnt[e];
  }
  /// `idx` with the selections of dead ranks' experts replaced by -1 (marked lost in `h`);
  /// `idx` itself when no rank is known dead.
  const int64_t* mask_dead(size_t T, const int64_t* idx, HandleState& h);
  /// cnt[e] = rows for expert e; rank_in_expert[t*K+k] = rank of token t among those rows.
  void plan(size_t T, const int64_t* idx);
  /// Starts a call: nothing of call seq-1 is read by this rank anymore; with `wait_readers`,
  /// waits until that holds on every rank (our next writes land in windows they read).
  Status begin(Deadline d, bool wait_readers, Schedule s);
  /// The schedule of this rank's current dispatch (set by begin).
  Schedule calling = Schedule::Prefill;
  /// InvalidArgument naming a rank of this host that is in this call with another schedule,
  /// else ok. Each schedule waits for what only its own kind publishes, so a mismatch shows
  /// only as a wait that does not end: the waits check this, and so do failed collectives.
  Status schedule_mismatch() const;
  /// A failed collective of this call as a Status: the schedule mismatch if there is one.
  Status from_error(const Error& e) const;
  /// A handle for this call with the weights copied and no rows placed yet.
  std::shared_ptr<HandleState> new_handle(Schedule s, size_t T, const float* w);
  /// The Dispatch returned to the caller: `h`'s layout over `window`.
  Dispatch result(Schedule s, std::shared_ptr<HandleState> h, std::byte* window) const;
  /// Checks the arguments and runs schedule `s`.
  Result<Dispatch> dispatch(const void* x, size_t T, const int64_t* idx, const float* w, Schedule s);
  /// Checks the handle and runs the combine of its schedule.
  Status combine(const void* y, const HandleState& h, void* out);

  // ---- windows.cpp -----------------------------------------------------------------------------

  /// Writes each row (t, k) into its destination's window at first_row[e] + rank_in_expert.
  /// Across hosts only the rows for this host's ranks (the others are xdispatch's).
  Status send_rows_to(size_t T, const std::byte* xb, const int64_t* idx, const std::vector<std::byte*>& win,
                      const std::vector<uint64_t>& first_row, HandleState& h);
  /// Publishes sent_to[d] = seq to every d and waits for every source's sent_to[me].
  Status finish_sends(Deadline d);
  /// Combine of Prefill and Decode: read each row from the expert rank's y in place.
  Status combine_windows(const void* y, const HandleState& h, void* out);

  // ---- prefill.cpp -----------------------------------------------------------------------------

  /// Replaces the Prefill window by one of at least `rows` rows (collective: every rank sees
  /// the same count matrix).
  Status grow_prefill(size_t rows, Deadline d);
  /// Compact layout of rank d given the count matrix [R][E]: first row of (expert l, source s),
  /// each expert's rows aligned to `align`. Relay gives experts the same layout.
  void compact_layout(int d, const uint64_t* mat, std::vector<uint64_t>& offsets, size_t& total) const;
  /// Dispatch into compact windows sized by a count exchange.
  Result<Dispatch> prefill(const void* x, size_t T, const int64_t* idx, const float* w);

  // ---- decode.cpp ------------------------------------------------------------------------------

  /// Dispatch into the fixed [L][R][M] window: no count exchange before the writes.
  Result<Dispatch> decode(const void* x, size_t T, const int64_t* idx, const float* w);

  // ---- xhost.cpp -------------------------------------------------------------------------------

  /// Hosts, gates and the ranks this one maps (init; also within one host).
  void init_hosts();
  /// Puts as the data path (collective, in init): every gate's staging block and every
  /// source's partial block made once at their largest size and their places exchanged.
  Status init_puts();
  /// Bytes of a dispatch message of n tokens: header, records, rows (rows 64-byte aligned).
  size_t msg_bytes(size_t n) const;
  /// Tag of a message from comm rank `src`: this Buffer, direction (0 dispatch, 1 combine), call.
  uint64_t tag(int dir, int src) const;
  /// Waits for network transfers; a failure names this call and breaks the communicator.
  Status net_wait(std::vector<transport::TransferPtr>& xs, Deadline d, const char* what);
  /// The cross-host part of dispatch: sends each token once per other host it selects,
  /// receives the rows of the sources this rank gates and places them into the windows of
  /// this host's experts: row first_row(s, e) + (rank of the token among s's rows for e).
  /// `win`: the schedule's windows of this host's ranks; `my_first`: first_row(me, e) for
  /// every e (read for this host's experts). Decode also writes in_counts.
  Status xdispatch(size_t T, const std::byte* xb, const int64_t* idx, HandleState& h,
                   const std::vector<std::byte*>& win, size_t win_rows, bool decode,
                   const std::vector<uint64_t>& my_first, const std::function<uint64_t(int src, int64_t e)>& first_row,
                   Deadline d);
  /// The cross-host part of combine and the reduction of every token (order: see moe.hpp).
  /// `ys`: every rank of this host's expert outputs.
  Status xcombine(const HandleState& h, const std::vector<const std::byte*>& ys, void* out, Deadline d);
  /// Counts Relay's rows to ranks on other hosts (sent: rows per destination rank).
  void count_relay(const std::vector<size_t>& rows_to, bool dispatch);

  // ---- relay.cpp -------------------------------------------------------------------------------

  /// all_to_all_v of rows counted in rows of H elements.
  Status a2av(const void* in, const std::vector<size_t>& sc, const std::vector<size_t>& sd, void* out,
              const std::vector<size_t>& rc, const std::vector<size_t>& rd);
  /// Dispatch through the communicator's all_to_all(v) (the buffer-centric baseline).
  Result<Dispatch> relay(const void* x, size_t T, const int64_t* idx, const float* w);
  /// Combine of Relay: rows go back by all_to_all_v, then reduce.
  Status combine_relay(const HandleState& h, const void* y, void* out);

  /// out[t] = sum_k w * row(t, k), rows found by `row_of`; float32 accumulation in the order
  /// k = 0..K-1 whatever the schedule, so every schedule gives the same bits.
  /// Selections marked lost are skipped; with Config::renormalize a token that lost some
  /// scales the rest by (sum of all its weights) / (sum of the remaining), and a token that
  /// lost none keeps the same bits.
  template <class RowOf>
  void reduce_tokens(const HandleState& h, void* out, RowOf&& row_of) {
    auto* ob = static_cast<std::byte*>(out);
    const bool any_lost = std::find(h.lost.begin(), h.lost.end(), 1) != h.lost.end();
    // An output much larger than the cache is written around it (nothing here reads it again).
    const bool stream = h.num_tokens * row_bytes >= kStreamOutBytes;
    std::vector<const void*> rows(static_cast<size_t>(K));
    std::vector<float> ws(static_cast<size_t>(K));
    for (size_t t = 0; t < h.num_tokens; ++t) {
      float scale = 1.0f;
      if (any_lost && cfg.renormalize) {
        float all = 0.0f, kept = 0.0f;
        bool lost_one = false;
        for (int k = 0; k < K; ++k) {
          size_t i = t * K + k;
          if (h.lost[i]) lost_one = true, all += h.w[i];
          else if (h.dest[i] >= 0) all += h.w[i], kept += h.w[i];
        }
        if (lost_one) scale = kept != 0.0f ? all / kept : 0.0f;
      }
      int n = 0;
      for (int k = 0; k < K; ++k) {
        size_t i = t * K + k;
        if (h.dest[i] < 0 || (any_lost && h.lost[i])) continue;
        rows[n] = row_of(i);
        ws[n++] = scale == 1.0f ? h.w[i] : h.w[i] * scale;
      }
      kernels::weighted_sum(cfg.dtype, ob + t * row_bytes, rows.data(), ws.data(), n, H, stream);
    }
    if (stream) kernels::stream_fence();
  }
};

}  // namespace strata::moe::detail

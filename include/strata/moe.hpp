#pragma once
// Expert-parallel MoE dispatch and combine without relay buffers (DESIGN §5).
//
// A moe::Buffer owns windows in the symmetric heap of an expert-parallel communicator of R
// ranks. dispatch() writes every selected token row straight into the window of the rank
// that owns the expert; combine() reads the expert outputs in place from the peers' windows
// and reduces them with the routing weights. Only counts and flags travel besides the rows.
// On a communicator that spans hosts the same holds within each host; between hosts a token
// travels once per destination host (with its expert list) and comes back once per host as
// that host's partial sum (DESIGN §5, "Across hosts").

#include <strata/strata.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace strata::moe {

/// Shape of one MoE layer on an expert-parallel communicator.
struct Config {
  int num_experts = 0;                  ///< E, a multiple of the communicator size R; expert e lives on rank e / (E/R)
  size_t hidden = 0;                    ///< H, elements per token row
  size_t max_tokens = 0;                ///< M, most tokens one rank dispatches in one call
  int topk = 1;                         ///< K, experts per token (1 <= K <= E)
  DataType dtype = DataType::BFloat16;  ///< payload type: BFloat16, Float16 or Float32
  size_t expert_alignment = 1;          ///< Prefill/Relay: each expert's range starts at a multiple of this many rows
  /// Prefill/Decode: when a peer's process on this host exits, drop the selections of its
  /// experts and complete the call on the survivors (no error) instead of failing it with
  /// PeerFailed. The communicator still breaks, so other collectives fail until recover().
  /// Within one host only: a Buffer on a communicator that spans hosts refuses it.
  bool mask_failed_ranks = false;
  /// With masking: a token that lost selections scales its remaining weights by
  /// (sum of its weights) / (sum of the remaining ones). Off: the lost share is just missing.
  bool renormalize = false;
};

/// How dispatch moves the rows.
enum class Schedule : uint8_t {
  Prefill,  ///< exchange counts, then write rows into contiguous per-expert ranges (throughput)
  Decode,   ///< fixed [L][R][M][H] slots, no count exchange (latency)
  Relay,    ///< baseline: pack by destination, all_to_all_v, unpack into expert order
};

/// "prefill", "decode", "relay".
const char* to_string(Schedule s);

namespace detail {
struct BufferImpl;
struct HandleState;
}  // namespace detail

/// What this rank sent to other hosts, summed over the calls of a Buffer (Buffer::traffic).
/// Zero on a communicator within one host. Relay counts what its all_to_all_v sends to ranks
/// on other hosts (one row per (token, expert), no deduplication).
struct Traffic {
  uint64_t dispatch_bytes = 0;     ///< dispatch: rows and routing records to other hosts
  uint64_t combine_bytes = 0;      ///< combine: rows back to other hosts (partial sums)
  uint64_t record_bytes = 0;       ///< of dispatch_bytes: per-token routing records and headers
  uint64_t rows_sent = 0;          ///< token rows sent to other hosts in dispatch
  uint64_t remote_selections = 0;  ///< (token, expert) pairs on other hosts: rows without deduplication
  uint64_t calls = 0;              ///< dispatch calls counted
};

/// What combine() needs to bring the expert outputs of one dispatch back to their tokens.
struct Handle {
  std::shared_ptr<const detail::HandleState> state;
  /// Per token: selections dropped because their expert's rank had failed (masking). Known
  /// at dispatch; after combine() it also counts those lost to a rank that died before
  /// publishing its outputs. Empty handle: empty.
  std::vector<uint32_t> dropped() const;
};

/// Rows received by this rank for its local experts. Views into the Buffer's windows: valid
/// until the next dispatch() on the same Buffer.
///
/// Compact layout (Prefill, Relay): expert l has count(l) contiguous rows starting at row
/// offset(l), ordered by (source rank, source token). Masked layout (Decode): expert l owns
/// R blocks of max_tokens rows; block s holds count(l, s) rows from rank s, in token order.
struct Dispatch {
  Schedule schedule = Schedule::Prefill;
  Handle handle;                  ///< pass to combine()
  int local_experts = 0;          ///< L = E / R
  int ranks = 0;                  ///< R
  size_t hidden = 0;              ///< H
  size_t max_tokens = 0;          ///< M
  size_t elem_size = 0;           ///< bytes per element
  size_t num_tokens = 0;          ///< tokens this rank dispatched (rows of combine's out)
  size_t total_rows = 0;          ///< rows of the whole layout (what y must hold), padding included
  std::byte* window = nullptr;    ///< row 0 of the layout
  std::vector<uint64_t> counts;   ///< [L][R]: rows of expert l from rank s
  std::vector<uint64_t> offsets;  ///< [L][R]: first row of expert l's rows from rank s
  std::vector<uint32_t> dropped;  ///< [num_tokens]: selections masked at dispatch (failed ranks)
  std::vector<int> failed_ranks;  ///< ranks masked in this call (their counts read 0)

  /// True for the Decode (masked [L][R][M][H]) layout.
  bool masked() const { return schedule == Schedule::Decode; }
  /// Rows received for local expert l (from every source).
  size_t count(int l) const;
  /// Rows received for local expert l from rank `src`.
  size_t count(int l, int src) const { return counts[static_cast<size_t>(l) * ranks + src]; }
  /// Row index (in the layout) of expert l's first row from rank `src`.
  size_t offset(int l, int src = 0) const { return offsets[static_cast<size_t>(l) * ranks + src]; }
  /// Address of expert l's first row (compact: count(l) rows follow; masked: R blocks of M rows).
  void* expert_x(int l) const { return window + offset(l) * hidden * elem_size; }
  /// Typed view of expert_x(l); T must match the Buffer's dtype.
  template <class T>
  T* expert_x_as(int l) const {
    if (dtype_of_v<T> != dtype_)
      strata::detail::throw_invalid("Dispatch::expert_x_as: element type " +
                                    std::string(strata::to_string(dtype_of_v<T>)) + " does not match the buffer's " +
                                    strata::to_string(dtype_));
    return reinterpret_cast<T*>(expert_x(l));
  }
  DataType dtype_ = DataType::BFloat16;
};

/// Dispatch/combine engine of one MoE layer. Construction and destruction are collective over
/// the communicator; dispatch() and combine() are collective too, and every rank must call
/// them in the same order with the same schedule. Windows are allocated once (the Prefill
/// window grows, collectively, when a batch needs more rows) and reused by every call.
/// Not thread-safe: one thread per rank drives a Buffer.
class Buffer {
 public:
  /// Throws InvalidArgument for E % R != 0, K outside [1, E], H or M zero, or a dtype other
  /// than BFloat16/Float16/Float32.
  Buffer(Communicator comm, const Config& cfg);
  ~Buffer();
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Config& config() const;

  /// Bytes and rows this rank sent to other hosts so far (see Traffic).
  Traffic traffic() const;

  /// Sends row t of x ([num_tokens][H], the Buffer's dtype) to the experts topk_idx[t][k]
  /// ([num_tokens][K]; -1 = no expert). topk_w ([num_tokens][K]) is kept for combine.
  /// InvalidArgument for num_tokens > M, an expert id outside [-1, E), or an expert named
  /// twice in one row. A peer that dies or stalls fails the call (PeerFailed, Timeout),
  /// unless Config::mask_failed_ranks: then a dead peer's experts are masked (see Dispatch::
  /// dropped); a call that must grow a window while a rank is masked still fails (PeerFailed).
  Dispatch dispatch(const void* x, size_t num_tokens, const int64_t* topk_idx, const float* topk_w, Schedule s);

  /// Typed form: num_tokens = x.size() / H; checks the element type and the shapes.
  template <class T>
  Dispatch dispatch(std::span<const T> x, std::span<const int64_t> topk_idx, std::span<const float> topk_w,
                    Schedule s) {
    check_typed(dtype_of_v<T>, x.size(), topk_idx.size(), topk_w.size(), s);
    return dispatch(x.data(), x.size() / config().hidden, topk_idx.data(), topk_w.data(), s);
  }

  /// out[t] = sum over k with topk_idx[t][k] >= 0 of topk_w[t][k] * y[slot(t, k)], in
  /// float32 in the order k = 0..K-1, rounded once to the dtype. Prefill and Decode on a
  /// communicator that spans hosts: the terms of this rank's host first (k ascending), then,
  /// host by host in ascending host order, each other host's partial sum of its terms (fp32,
  /// k ascending, rounded once to the dtype to travel back), rounded once at the end. y holds the expert outputs in
  /// the layout of the dispatch (d.total_rows rows; the window itself, written in place, is
  /// the fast path). y elsewhere in the registered heap is read in place, and this call then
  /// returns only once every peer has read it; y outside the heap is copied into the window.
  /// out has num_tokens rows of H. Argument errors refuse the call (refuse_combine): the
  /// matching combine of the ranks on this host (Relay: on every host) fails naming this rank;
  /// across hosts a Prefill or Decode combine of the other hosts times out. After a failed
  /// combine, dispatch again.
  void combine(const void* y, const Handle& h, void* out);

  /// Typed form of combine().
  template <class T>
  void combine(std::span<const T> y, const Handle& h, std::span<T> out) {
    check_typed_combine(dtype_of_v<T>, y.size(), h, out.size());
    combine(y.data(), h, out.data());
  }

  /// For a binding whose own argument checks refuse a dispatch on this rank: takes part in
  /// schedule `s` with no tokens, marked as refused, so that the other ranks' matching calls
  /// fail naming this rank instead of waiting for it (dispatch() does this for its own checks).
  void refuse_dispatch(Schedule s);
  /// The same for combine: takes this rank's place in the combine of the latest dispatch
  /// (combine() does this for its own checks). Nothing when this rank already joined it.
  void refuse_combine();

 private:
  void check_typed(DataType t, size_t x, size_t idx, size_t w, Schedule s) const;
  void check_typed_combine(DataType t, size_t y, const Handle& h, size_t out) const;
  std::unique_ptr<detail::BufferImpl> impl_;
};

}  // namespace strata::moe

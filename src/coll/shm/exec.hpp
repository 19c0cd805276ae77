#pragma once
// What the shared-memory algorithms share: the state of one collective while it runs on
// this rank (Exec: its effective buffers, how to reach every peer's), the source list of a
// reduction, and each algorithm family's entry point (one file per family in coll/shm/).

#include <chrono>
#include <utility>
#include <vector>

#include "coll/comm_impl.hpp"
#include "coll/counts.hpp"
#include "coll/select.hpp"
#include "common/reduce.hpp"

namespace strata::detail::shm {

using coll::Op;
using coll::OpDesc;
using coll::OpKind;

/// Everything one collective needs while it runs on this rank.
struct Exec {
  CommImpl& c;
  const Op& op;
  Deadline deadline;
  char* in = nullptr;  // this rank's effective (heap) buffers
  char* out = nullptr;
  // Two-shot all_reduce of an external output: the heap slots where peers leave this rank's
  // reduced pieces (two_shot.cpp); `out` is then the external buffer itself.
  char* landing = nullptr;
  size_t esz = 0;
  // How this rank writes its reduced slice, which peers read next, in two-shot all_reduce
  // when it pulls (StoreChoice).
  kernels::Stores shared_stores = kernels::Stores::Auto;
  // An external input staged in rounds (pipe.cpp, two_shot.cpp): `in` is then the two slots
  // peers read, `piped_src` the input itself.
  const char* piped_src = nullptr;
  // Whether the operation ends with a synchronisation: not when no rank's buffer is read or
  // written by a peer (every input in its slot), as all ranks see from the descriptors.
  bool close_sync = true;
  // This call pushed into the outputs or ran in rounds (two_shot.cpp): the store mode played
  // no part (nor the input CMA route of all_gather), and its time teaches their trials nothing.
  bool pushed = false;

  const OpDesc& desc(int r) const { return c.peers[r].hdr()->slot(c.seq).desc; }

  bool cma(int r, uint32_t flag) const { return r != c.rank && (desc(r).flags & flag); }
  /// Whether rank r stages its input in rounds (pipe.cpp).
  bool piped(int r) const { return r == c.rank ? piped_src != nullptr : (desc(r).flags & OpDesc::kInPiped) != 0; }

  /// Readable address of `bytes` at `offset` in rank r's input. A CMA-registered input is
  /// read into a landing buffer first (only reductions need that; copies use copy_from).
  Result<char*> peer_in(int r, size_t offset, size_t bytes) {
    if (r == c.rank) return in + offset;
    if (!bytes) return static_cast<char*>(nullptr);
    const OpDesc& d = desc(r);
    if (!(d.flags & OpDesc::kHasIn)) return internal_error("rank " + std::to_string(r) + " published no input buffer");
    if (d.flags & OpDesc::kInSlot) {
      // The peer's slot is all it can point at: a range past its end is refused, not read.
      if (offset > kSlotInputBytes || bytes > kSlotInputBytes - offset)
        return internal_error("rank " + std::to_string(r) + " put its input in its slot, but bytes [" +
                              std::to_string(offset) + ", +" + std::to_string(bytes) + ") lie past the slot's " +
                              std::to_string(kSlotInputBytes));
      return reinterpret_cast<char*>(c.peers[r].hdr()->slot(c.seq).inline_data()) + offset;
    }
    if (d.flags & OpDesc::kInCma) {
      auto& tmp = c.cma_tmp[r];
      if (tmp.size() < bytes) tmp.resize(bytes);
      STRATA_RETURN_IF_ERROR(
          memory::cma_read(c.pids[r], reinterpret_cast<const void*>(d.in_off + offset), tmp.data(), bytes));
      c.cma_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return tmp.data();
    }
    STRATA_ASSIGN_OR_RETURN(void* p,
                            c.ctx->heap->peer_ptr(c.members[r], {d.in_seg, d.in_off + offset}, bytes, deadline));
    return static_cast<char*>(p);
  }
  Result<char*> peer_out(int r, size_t offset, size_t bytes) {
    if (r == c.rank) return out + offset;
    if (!bytes) return static_cast<char*>(nullptr);
    const OpDesc& d = desc(r);
    if (!(d.flags & OpDesc::kHasOut))
      return internal_error("rank " + std::to_string(r) + " published no output buffer");
    if (d.flags & OpDesc::kOutCma) return internal_error("peer_out on a CMA buffer of rank " + std::to_string(r));
    STRATA_ASSIGN_OR_RETURN(void* p,
                            c.ctx->heap->peer_ptr(c.members[r], {d.out_seg, d.out_off + offset}, bytes, deadline));
    return static_cast<char*>(p);
  }
  /// dst <- rank r's input or output at offset: one copy, whether mapped or CMA. `uncached`
  /// streams a mapped source around the cache (see copy_uncached).
  Status copy_from(int r, bool from_out, size_t offset, void* dst, size_t bytes, bool uncached = false) {
    if (!bytes) return Status::ok();
    if (cma(r, from_out ? OpDesc::kOutCma : OpDesc::kInCma)) {
      const OpDesc& d = desc(r);
      uint64_t base = from_out ? d.out_off : d.in_off;
      STRATA_RETURN_IF_ERROR(memory::cma_read(c.pids[r], reinterpret_cast<const void*>(base + offset), dst, bytes));
      c.cma_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return Status::ok();
    }
    STRATA_ASSIGN_OR_RETURN(char* p, from_out ? peer_out(r, offset, bytes) : peer_in(r, offset, bytes));
    copy(dst, p, bytes, uncached);
    return Status::ok();
  }
  /// rank r's output at offset <- src.
  Status copy_to_out(int r, size_t offset, const void* src, size_t bytes) {
    if (!bytes) return Status::ok();
    if (cma(r, OpDesc::kOutCma)) {
      STRATA_RETURN_IF_ERROR(
          memory::cma_write(c.pids[r], reinterpret_cast<void*>(desc(r).out_off + offset), src, bytes));
      c.cma_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return Status::ok();
    }
    STRATA_ASSIGN_OR_RETURN(char* p, peer_out(r, offset, bytes));
    copy(p, src, bytes);
    return Status::ok();
  }
  void copy(void* dst, const void* src, size_t bytes, bool uncached = false) {
    if (!bytes || dst == src) return;
    if (uncached) kernels::copy_uncached(dst, src, bytes);
    else kernels::copy(dst, src, bytes);
    c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  /// A synchronisation between two steps of the operation. Errors name the step; run() puts
  /// the operation's name before them.
  Status sync() { return c.sync(deadline, "step sync"); }
  /// The operation's last step: the synchronisation after which peers no longer touch this
  /// rank's buffers, when there is one (close_sync), or always (`always`: peers wrote into
  /// this rank's output).
  Status close(bool always = false) { return always || close_sync ? c.sync(deadline, "closing sync") : Status::ok(); }
  /// Elements a reduction reads per piece: `whole`, or kCmaChunkBytes' worth when some peer's
  /// input is read by CMA (it lands in a buffer of the size read, kept small enough for L2).
  size_t reduce_step(size_t whole) const;
};

/// The shortest call (the faster way's best trial) that TimedChoice may decide after
/// Trials::kEarlyTrials of each way, when the other way is more than 25% slower.
inline constexpr int64_t kEarlyChoiceMinNs = 500'000;

/// One of two modes for this call: `forced` (0 or 1), or the faster of the two as this
/// communicator's first calls of the same size (log2 of `bytes`) in `trials` measured, trying
/// each Trials::kTrials times, in pairs (exec.cpp); calls of kEarlyChoiceMinNs and more that
/// one way makes clearly slower stop after Trials::kEarlyTrials. The modes must give the same
/// result, and a rank may choose alone.
class TimedChoice {
 public:
  TimedChoice(CommImpl::Trials (&trials)[65], size_t bytes, int forced);
  int mode() const { return mode_; }
  /// Records the time since construction when this call was a trial; after a successful call.
  void done();
  /// Leaves `d` out of this call's time: the wait for the last peer to arrive. Ranks enter a
  /// call at different moments, most of all in its first calls, and each would otherwise
  /// judge the two ways by its own lateness and could keep the other way than its peers (a
  /// mix of both ran slower than either: 2 ranks, external, 8 MiB: 1.4 ms against 0.6 / 0.9).
  void exclude(std::chrono::steady_clock::duration d) {
    if (trials_) start_ += d;
  }
  /// Whether this call is a trial (is timed).
  bool timed() const { return trials_ != nullptr; }
  /// Counts one trial of `mode` that took `ns`, and decides when the trials allow it.
  static void record(CommImpl::Trials& t, int mode, int64_t ns);

 private:
  int mode_ = 0;
  CommImpl::Trials* trials_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

/// Two-shot all_reduce's store mode: STRATA_TWO_SHOT_STORES, or measured (cached, streamed).
inline TimedChoice store_choice(CommImpl& c, size_t slice_bytes) {
  return TimedChoice(c.two_shot_stores, slice_bytes, c.ctx->env.two_shot_stores);
}
inline kernels::Stores stores_of(const TimedChoice& t) {
  return t.mode() == 1 ? kernels::Stores::Streamed : kernels::Stores::Auto;
}

/// Smallest external input that an out-of-place all_to_all, all_gather or reduce_scatter may
/// let its peers read by CMA (TimedChoice; below it the input is staged, or rides in the
/// control block up to kSlotInputBytes).
inline constexpr size_t kInputCmaMinBytes = 16 * 1024;

/// CMA reads that feed a reduction land in pieces of this size (fits in L2 with its peers').
inline constexpr size_t kCmaChunkBytes = 256 * 1024;

inline std::pair<size_t, size_t> slice(size_t count, int n, int i, size_t esz) {
  return coll::balanced_slice(count, n, i, esz);
}

inline int divisor(const Exec& x) { return x.c.size; }

/// Source pointers of a reduction: on the stack for the usual rank counts.
class Srcs {
 public:
  explicit Srcs(int n) {
    if (n > kInline) heap_.resize(n);
    p_ = n > kInline ? heap_.data() : inline_;
  }
  const void*& operator[](int i) { return p_[i]; }
  const void* const* data() const { return p_; }

 private:
  static constexpr int kInline = 16;
  const void* inline_[kInline];
  std::vector<const void*> heap_;
  const void** p_;
};

/// dst[lo, hi) <- the reduction of every rank's input over [lo, hi) (elements), peers in
/// rank order starting with this rank. Where a peer's input is reachable only by CMA, its

/// dst[lo, hi) <- the reduction of every rank's input over [lo, hi) (elements), in rank
/// order starting with this rank (exec.cpp).
Status reduce_range(Exec& x, char* dst, size_t lo, size_t hi, kernels::Stores stores = kernels::Stores::Auto);

/// Runs `op` with the selected algorithm within one host (run.cpp).
Status run(CommImpl& c, Op& op, coll::Algo algo);

/// Takes the next sequence number and describes `op` for the peers' check (run.cpp).
OpDesc next_desc(CommImpl& c, const Op& op, coll::Algo algo);
/// Compares every peer's descriptor with ours (`mine`, as built locally) (run.cpp).
Status check_descriptors(const CommImpl& c, const Op& op, const OpDesc& mine);

// pipe.cpp: an external input staged in rounds for all_gather(v), all_to_all(v) and
// reduce_scatter(v), and reduce_scatter(v) done round by round.
/// How rank r's piped input is laid out, the same on every rank: each round stages up to
/// `chunk` bytes of every block, block j at j * stride of the round's slot, slots of `slot`
/// bytes alternating; `rounds` rounds cover the largest block. Blocks of 16 MiB or more (8 MiB
/// for reduce_scatter) go in one round, `packed` one after the other (64-byte aligned).
struct PipeShape {
  size_t chunk = 0, stride = 0, slot = 0;
  int rounds = 1;
  bool packed = false;
};
PipeShape pipe_shape(const Exec& x, int r);
/// Bytes of rank r's input that rank j reads (all_gather: its whole input, whatever j; a
/// reduction: the block j reduces, none of its own).
size_t piped_block(const Exec& x, int r, int j);
/// Where this rank's block for rank j starts in its input, in bytes (all_to_all(v),
/// reduce_scatter(v); 0 for the kinds whose peers read the whole input).
size_t own_displ(const Exec& x, int j);
/// Rounds of this operation: the most any piped rank needs (1 when none pipes).
int pipe_rounds(const Exec& x);
/// Makes `src` this rank's piped input: heap slots in x.in, round 0 staged. Before the
/// descriptor is published.
Result<char*> pipe_input(Exec& x, const char* src);
/// Stages round k of this rank's piped input (a no-op past its last round).
void fill_round(Exec& x, int k);
/// dst[k * chunk, ...) <- round k's part of the `bytes` piped rank r has for this rank.
Status copy_piped(Exec& x, int r, int k, size_t bytes, char* dst);
/// Whether any rank stages its input in rounds this operation.
bool any_piped(const Exec& x);
/// Tests only, with every rank in this process: 1 / 0 stage as where one last-level cache does
/// / does not serve every CPU (rounds at every size / large blocks whole); -1 reads the host.
void override_shared_llc_for_tests(int shared);
/// reduce_scatter(v) in rounds, where some rank pipes its input (any_piped).
Status reduce_scatter_piped(Exec& x);

// inline.cpp
/// Runs `op` with its input in the control block (coll::Algo::Inline, chosen by select.cpp):
/// one synchronisation, no buffer of a peer read.
Status run_inline(CommImpl& c, const Op& op, Deadline deadline);

// one_shot.cpp
/// all_reduce: every rank reduces every input; `tmp` holds the result when in place.
Status all_reduce_one_shot(Exec& x, void* tmp);

// two_shot.cpp
/// all_reduce: direct reduce-scatter into each rank's own output slice, then all-gather.
Status all_reduce_two_shot(Exec& x);
/// How two-shot all_reduce runs in rounds, where some rank's buffer is external, the same on
/// every rank: round k reduces elements [k * piece, (k + 1) * piece) of every slice; a rank's
/// staged input and its landing slots are two slots of `slot` bytes in turn, with rank j's
/// piece at j * block.
struct RoundShape {
  size_t piece = 0, block = 0, slot = 0;
  int rounds = 1;
};
RoundShape round_shape(const Exec& x);
/// Makes external `src` this rank's input staged in rounds for two-shot all_reduce: heap
/// slots in x.in, round 0 staged. Before the descriptor is published.
Result<char*> stage_rounds_input(Exec& x, const char* src);
/// Rank r reduces block r (`counts`, packed in rank order) of every input into its output.
Status reduce_scatter(Exec& x, const std::vector<size_t>& counts);
/// Every rank copies every peer's block (`counts`, packed in rank order) into its output.
Status all_gather(Exec& x, const std::vector<size_t>& counts);

// all_to_all.cpp
/// all_to_all and all_to_all_v: each rank copies its block from every peer's input.
Status all_to_all(Exec& x, void* tmp);

// rooted.cpp
/// Each rank reduces its slice of every input straight into the root's output.
Status reduce(Exec& x);
/// Each rank copies the root's input.
Status broadcast(Exec& x);
/// Each rank writes its block straight into the root's output.
Status gather(Exec& x);
/// Each rank copies its block of the root's input.
Status scatter(Exec& x);

}  // namespace strata::detail::shm

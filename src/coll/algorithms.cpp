// Intra-host collective algorithms over the shared heap. Every rank publishes a descriptor
// of its buffers, peers translate those into their own mappings and move data directly
// between the ranks' own buffers; external buffers are staged through heap scratch first.

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string_view>

#include "coll/comm_impl.hpp"
#include "coll/counts.hpp"
#include "common/reduce.hpp"

namespace strata::coll {

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Reduce: return "reduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::AllGather: return "all_gather";
    case OpKind::AllGatherV: return "all_gather_v";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::ReduceScatterV: return "reduce_scatter_v";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::AllToAllV: return "all_to_all_v";
    case OpKind::Gather: return "gather";
    case OpKind::Scatter: return "scatter";
    case OpKind::Barrier: return "barrier";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::Internal: return "internal";
  }
  return "unknown";
}

std::string describe(const OpDesc& d) {
  auto k = static_cast<OpKind>(d.kind);
  std::ostringstream os;
  os << to_string(k) << "(";
  const char* sep = "";
  if (has_count(k)) {
    os << "count=" << d.count;
    sep = ", ";
  }
  if (k != OpKind::Barrier) {
    os << sep << "dtype=" << to_string(static_cast<DataType>(d.dtype));
    sep = ", ";
  }
  if (reducing(k)) os << sep << "op=" << to_string(static_cast<ReduceOp>(d.rop));
  if (rooted(k)) os << sep << "root=" << d.root;
  if (k == OpKind::AllReduce) os << sep << "algorithm=" << (d.algo == 1 ? "one_shot" : "two_shot");
  os << ")";
  return os.str();
}

}  // namespace strata::coll

namespace strata::detail {

using coll::has_count;
using coll::Op;
using coll::OpDesc;
using coll::OpKind;
using coll::reducing;
using coll::rooted;

namespace {

constexpr uint8_t kOneShot = 1, kTwoShot = 2, kInline = 3;
// CMA reads that feed a reduction land in chunks of this size (fits in L2 with its peers').
constexpr size_t kCmaChunkBytes = 256 * 1024;
// In-place two-shot all_reduce gathers slices of at least this size with streaming stores.
constexpr size_t kUncachedMinBytes = size_t{1} << 20;

size_t sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

using coll::max_end;
std::vector<size_t> prefix(const std::vector<size_t>& v) { return coll::prefix_sums(v); }

/// Bytes this rank reads from `in` and writes to `out`.
struct Extent {
  size_t in = 0, out = 0;
};

Extent extent(const CommImpl& c, const Op& op) {
  const size_t e = dtype_size(op.dtype);
  const size_t n = static_cast<size_t>(c.size);
  const bool root = c.rank == op.root;
  switch (op.kind) {
    case OpKind::AllReduce: return {op.count * e, op.count * e};
    case OpKind::Reduce: return {op.count * e, root ? op.count * e : 0};
    case OpKind::Broadcast: return {root ? op.count * e : 0, op.count * e};
    case OpKind::AllGather: return {op.count * e, n * op.count * e};
    case OpKind::AllGatherV: return {op.counts[c.rank] * e, sum(op.counts) * e};
    case OpKind::ReduceScatter: return {n * op.count * e, op.count * e};
    case OpKind::ReduceScatterV: return {sum(op.counts) * e, op.counts[c.rank] * e};
    case OpKind::AllToAll: return {n * op.count * e, n * op.count * e};
    case OpKind::AllToAllV: return {max_end(op.counts, op.sdispls) * e, max_end(op.rcounts, op.rdispls) * e};
    case OpKind::Gather: return {op.count * e, root ? n * op.count * e : 0};
    case OpKind::Scatter: return {root ? n * op.count * e : 0, op.count * e};
    default: return {0, 0};
  }
}

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  if (!na || !nb) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

/// The in-place layout each collective accepts when in and out overlap.
bool canonical_in_place(const CommImpl& c, const Op& op) {
  const size_t e = dtype_size(op.dtype);
  auto in = reinterpret_cast<uintptr_t>(op.in), out = reinterpret_cast<uintptr_t>(op.out);
  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::Reduce:
    case OpKind::Broadcast:
    case OpKind::AllToAll:
    case OpKind::AllToAllV: return in == out;
    case OpKind::AllGather: return in == out + c.rank * op.count * e;
    case OpKind::AllGatherV: return in == out + prefix(op.counts)[c.rank] * e;
    case OpKind::ReduceScatter: return out == in + c.rank * op.count * e;
    case OpKind::ReduceScatterV: return out == in + prefix(op.counts)[c.rank] * e;
    case OpKind::Gather: return in == out + op.root * op.count * e;
    case OpKind::Scatter: return out == in + op.root * op.count * e;
    default: return false;
  }
}

std::string ptr_str(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

/// Everything one collective needs while it runs on this rank.
struct Exec {
  CommImpl& c;
  const Op& op;
  Deadline deadline;
  char* in = nullptr;  // this rank's effective (heap) buffers
  char* out = nullptr;
  size_t esz = 0;

  const OpDesc& desc(int r) const { return c.peers[r].hdr()->slot(c.seq).desc; }

  bool cma(int r, uint32_t flag) const { return r != c.rank && (desc(r).flags & flag); }

  /// Readable address of `bytes` at `offset` in rank r's input. A CMA-registered input is
  /// read into a landing buffer first (only reductions need that; copies use copy_from).
  Result<char*> peer_in(int r, size_t offset, size_t bytes) {
    if (r == c.rank) return in + offset;
    if (!bytes) return static_cast<char*>(nullptr);
    const OpDesc& d = desc(r);
    if (!(d.flags & OpDesc::kHasIn)) return internal_error("rank " + std::to_string(r) + " published no input buffer");
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
  Status sync(const char* what) { return c.sync(deadline, what); }
};

std::pair<size_t, size_t> slice(size_t count, int n, int i, size_t esz) {
  return coll::balanced_slice(count, n, i, esz);
}

int divisor(const Exec& x) { return x.c.size; }

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
/// bytes land in a per-peer buffer first: that is done in chunks small enough to stay in
/// cache, so the landing copy costs little more than reading a mapped buffer.
Status reduce_range(Exec& x, char* dst, size_t lo, size_t hi) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  bool any_cma = false;
  for (int r = 0; r < n; ++r) any_cma = any_cma || x.cma(r, OpDesc::kInCma);
  const size_t step = any_cma ? std::max<size_t>(1, kCmaChunkBytes / e) : hi - lo;
  Srcs srcs(n);
  for (size_t a = lo; a < hi; a += step) {
    const size_t b = std::min(hi, a + step);
    for (int k = 0; k < n; ++k) {
      int r = (me + k) % n;
      STRATA_ASSIGN_OR_RETURN(char* p, x.peer_in(r, a * e, (b - a) * e));
      srcs[k] = p;
    }
    kernels::reduce(x.op.dtype, x.op.rop, dst + (a - lo) * e, srcs.data(), n, b - a, divisor(x));
  }
  return Status::ok();
}

Status all_reduce(Exec& x, uint8_t algo, void* tmp) {
  const int n = x.c.size, me = x.c.rank;
  const size_t count = x.op.count, e = x.esz;
  Srcs srcs(n);
  if (algo == kOneShot) {
    // Every rank reduces in rank order, so all ranks get bit-identical floating results.
    for (int r = 0; r < n; ++r) {
      STRATA_ASSIGN_OR_RETURN(char* p, x.peer_in(r, 0, count * e));
      srcs[r] = p;
    }
    // In place, peers still read our buffer: reduce into a temporary, write after they finish.
    char* dst = x.in == x.out ? static_cast<char*>(tmp) : x.out;
    kernels::reduce(x.op.dtype, x.op.rop, dst, srcs.data(), n, count, divisor(x));
    STRATA_RETURN_IF_ERROR(x.sync("all_reduce"));
    if (dst != x.out) {
      kernels::copy(x.out, dst, count * e);
      x.c.temp_bytes.fetch_add(count * e, std::memory_order_relaxed);
    }
    return Status::ok();
  }
  // Two-shot: reduce-scatter straight into each rank's own output slice, then all-gather.
  auto [lo, hi] = slice(count, n, me, e);
  if (hi > lo) STRATA_RETURN_IF_ERROR(reduce_range(x, x.out + lo * e, lo, hi));
  STRATA_RETURN_IF_ERROR(x.sync("all_reduce"));
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    auto [rlo, rhi] = slice(count, n, r, e);
    if (rhi <= rlo) continue;
    const size_t bytes = (rhi - rlo) * e;
    // In place, rank r has just read these lines of our buffer (its input slice): claiming
    // them back one by one costs more than streaming around the cache (measured at 2 ranks:
    // 4 MiB 700 -> 490 us; below 1 MiB slices the cached copy wins).
    const bool uncached = x.in == x.out && bytes >= kUncachedMinBytes;
    STRATA_RETURN_IF_ERROR(x.copy_from(r, true, rlo * e, x.out + rlo * e, bytes, uncached));
  }
  return x.sync("all_reduce");
}

Status reduce(Exec& x) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  auto [lo, hi] = slice(x.op.count, n, me, e);
  if (hi > lo) {
    if (x.cma(x.op.root, OpDesc::kOutCma)) {
      // The root's output is external memory reached by CMA: reduce here, write once.
      std::vector<char> part((hi - lo) * e);
      STRATA_RETURN_IF_ERROR(reduce_range(x, part.data(), lo, hi));
      STRATA_RETURN_IF_ERROR(x.copy_to_out(x.op.root, lo * e, part.data(), part.size()));
    } else {
      STRATA_ASSIGN_OR_RETURN(char* dst, x.peer_out(x.op.root, lo * e, (hi - lo) * e));
      STRATA_RETURN_IF_ERROR(reduce_range(x, dst, lo, hi));
    }
  }
  return x.sync("reduce");
}

Status reduce_scatter(Exec& x, const std::vector<size_t>& counts) {
  const int me = x.c.rank;
  std::vector<size_t> displ = prefix(counts);
  size_t mine = counts[me];
  // In place, out is our own block of in, which no peer reads: safe to write directly.
  if (mine) STRATA_RETURN_IF_ERROR(reduce_range(x, x.out, displ[me], displ[me] + mine));
  return x.sync("reduce_scatter");
}

Status all_gather(Exec& x, const std::vector<size_t>& counts) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  std::vector<size_t> displ = prefix(counts);
  for (int k = 0; k < n; ++k) {
    int r = (me + k) % n;
    if (!counts[r]) continue;
    STRATA_RETURN_IF_ERROR(x.copy_from(r, false, 0, x.out + displ[r] * e, counts[r] * e));
  }
  return x.sync("all_gather");
}

Status all_to_all(Exec& x, void* tmp) {
  const int n = x.c.size, me = x.c.rank;
  const size_t e = x.esz;
  const bool v = x.op.kind == OpKind::AllToAllV;
  const size_t out_bytes = v ? max_end(x.op.rcounts, x.op.rdispls) * e : n * x.op.count * e;
  // In place, peers read the blocks we would overwrite: land in a temporary first.
  char* dst = x.out;
  if (x.in == x.out && out_bytes) {
    dst = static_cast<char*>(tmp);
    kernels::copy(dst, x.out, out_bytes);
  }
  for (int k = 0; k < n; ++k) {
    int r = (me + k) % n;
    size_t cnt, src_off, dst_off;
    if (v) {
      const uint64_t* pv = x.c.peers[r].vec();  // peer r's send counts and displacements
      cnt = x.op.rcounts[r];
      src_off = pv[n + me];
      dst_off = x.op.rdispls[r];
    } else {
      cnt = x.op.count;
      src_off = me * x.op.count;
      dst_off = r * x.op.count;
    }
    if (!cnt) continue;
    STRATA_RETURN_IF_ERROR(x.copy_from(r, false, src_off * e, dst + dst_off * e, cnt * e));
  }
  STRATA_RETURN_IF_ERROR(x.sync("all_to_all"));
  if (dst != x.out) {
    kernels::copy(x.out, dst, out_bytes);
    x.c.temp_bytes.fetch_add(out_bytes, std::memory_order_relaxed);
  }
  return Status::ok();
}

Status broadcast(Exec& x) {
  const size_t bytes = x.op.count * x.esz;
  if (bytes) {
    STRATA_RETURN_IF_ERROR(x.copy_from(x.op.root, false, 0, x.out, bytes));
  }
  return x.sync("broadcast");
}

Status gather(Exec& x) {
  const size_t bytes = x.op.count * x.esz;
  if (bytes) {
    // Push: every rank writes its block straight into the root's output.
    STRATA_RETURN_IF_ERROR(x.copy_to_out(x.op.root, x.c.rank * bytes, x.in, bytes));
  }
  return x.sync("gather");
}

Status scatter(Exec& x) {
  const size_t bytes = x.op.count * x.esz;
  if (bytes) {
    STRATA_RETURN_IF_ERROR(x.copy_from(x.op.root, false, x.c.rank * bytes, x.out, bytes));
  }
  return x.sync("scatter");
}

}  // namespace

Status compare_descriptor(const Op& op, const OpDesc& mine, int me, const OpDesc& d, const uint64_t* vec, int r,
                          int n) {
  auto kind = static_cast<OpKind>(mine.kind);
  bool same = d.kind == mine.kind && d.seq == mine.seq;
  if (same && kind != OpKind::Barrier) same = d.dtype == mine.dtype;
  if (same && has_count(kind)) same = d.count == mine.count;
  if (same && reducing(kind)) same = d.rop == mine.rop;
  if (same && rooted(kind)) same = d.root == mine.root;
  if (same && kind == OpKind::AllReduce) same = d.algo == mine.algo;
  std::string extra;
  if (same && vec && (kind == OpKind::AllGatherV || kind == OpKind::ReduceScatterV)) {
    for (int j = 0; j < n && same; ++j)
      if (vec[j] != op.counts[j]) {
        same = false;
        extra = " (counts[" + std::to_string(j) + "] is " + std::to_string(op.counts[j]) + " on rank " +
                std::to_string(me) + " but " + std::to_string(vec[j]) + " on rank " + std::to_string(r) + ")";
      }
  }
  if (same && vec && kind == OpKind::AllToAllV && vec[me] != op.rcounts[r]) {
    same = false;
    extra = " (rank " + std::to_string(r) + " sends " + std::to_string(vec[me]) + " elements to rank " +
            std::to_string(me) + ", which expects recv_counts[" + std::to_string(r) +
            "]=" + std::to_string(op.rcounts[r]) + ")";
  }
  if (same) return Status::ok();
  return Status(Code::InvalidArgument,
                "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                    " called " + coll::describe(mine) + " but rank " + std::to_string(r) + " called " +
                    coll::describe(d) + extra,
                r);
}

namespace {

/// Compares every peer's descriptor with ours; all ranks reach the same verdict because they
/// all see the same descriptors.
/// `mine` is this rank's descriptor as built locally: reading it back from the published
/// slot would wait for the cache line that peers are busy claiming.
Status check_descriptors(const CommImpl& c, const Op& op, const OpDesc& mine) {
  const int n = c.size;
  auto kind = static_cast<OpKind>(mine.kind);
  const bool has_vec = kind == OpKind::AllGatherV || kind == OpKind::ReduceScatterV || kind == OpKind::AllToAllV;
  for (int k = 1; k < n; ++k) {
    int r = (c.rank + k) % n;
    STRATA_RETURN_IF_ERROR(compare_descriptor(op, mine, c.rank, c.peers[r].hdr()->slot(c.seq).desc,
                                              has_vec ? c.peers[r].vec() : nullptr, r, n));
  }
  return Status::ok();
}

/// Takes the next sequence number and describes `op` for the peers' check.
OpDesc next_desc(CommImpl& c, const Op& op, uint8_t algo) {
  OpDesc d{};
  d.seq = ++c.seq;
  d.kind = static_cast<uint8_t>(op.kind);
  d.dtype = static_cast<uint8_t>(op.dtype);
  d.rop = static_cast<uint8_t>(op.rop);
  d.algo = algo;
  d.root = op.root;
  d.count = has_count(op.kind) ? op.count : 0;
  return d;
}

/// Small all_reduce: the input is copied into this rank's slot next to the descriptor, one
/// arrival publishes both, and every rank reduces the peers' slots in rank order. Nothing
/// else: nobody reads the caller's buffers, so no closing synchronisation is needed.
Status all_reduce_inline(CommImpl& c, const Op& op, Deadline deadline) {
  const int n = c.size;
  const size_t bytes = op.count * dtype_size(op.dtype);
  const OpDesc d = next_desc(c, op, kInline);
  OpSlot& mine = c.self.hdr()->slot(c.seq);
  if (bytes) std::memcpy(mine.data, op.in, bytes);
  mine.desc = d;
  STRATA_RETURN_IF_ERROR(c.sync(deadline, "all_reduce"));
  STRATA_RETURN_IF_ERROR(check_descriptors(c, op, d).with_context("all_reduce: "));
  Srcs srcs(n);
  for (int r = 0; r < n; ++r) srcs[r] = c.peers[r].hdr()->slot(c.seq).data;
  kernels::reduce(op.dtype, op.rop, op.out, srcs.data(), n, op.count, n);
  c.direct_bytes.fetch_add(bytes * static_cast<size_t>(n - 1), std::memory_order_relaxed);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

/// Whether peers read or write this rank's output during `kind` (else only this rank
/// writes it, and an external output is written in place).
bool peers_touch_out(OpKind kind, uint8_t algo) {
  return kind == OpKind::Reduce || kind == OpKind::Gather || (kind == OpKind::AllReduce && algo == kTwoShot);
}

/// Whether peers read this rank's input during `kind` (gather pushes it instead).
bool peers_read_in(OpKind kind) { return kind != OpKind::Gather; }

uint8_t pick_algorithm(const CommImpl& c, const Op& op) {
  if (op.kind != OpKind::AllReduce) return 0;
  if (op.opts.algorithm == Algorithm::OneShot) return kOneShot;
  if (op.opts.algorithm == Algorithm::TwoShot) return kTwoShot;
  size_t bytes = op.count * dtype_size(op.dtype);
  // One-shot reads every rank's whole input; the limit is for 2 ranks and shrinks as more
  // inputs are read (measured: at 2 ranks one-shot wins up to 256 KiB, 4x at 256 KiB).
  return bytes * static_cast<size_t>(c.size) <= 2 * c.ctx->env.oneshot_max_bytes ? kOneShot : kTwoShot;
}

}  // namespace

Status validate(const CommImpl& c, const Op& op) {
  // Strings are built only on the error paths: this runs on every call.
  const std::string_view name = coll::to_string(op.kind);
  auto str = [&](auto&&... parts) { return (std::string(name) + ... + std::string(parts)); };
  const int n = c.size;
  if (static_cast<unsigned>(op.dtype) > static_cast<unsigned>(DataType::Float64))
    return invalid_argument(str(": invalid dtype ", std::to_string(static_cast<int>(op.dtype))));
  if (reducing(op.kind)) {
    if (static_cast<unsigned>(op.rop) > static_cast<unsigned>(ReduceOp::Avg))
      return invalid_argument(str(": invalid reduce op ", std::to_string(static_cast<int>(op.rop))));
    if (op.rop == ReduceOp::Avg && !is_floating(op.dtype))
      return invalid_argument(str(": op avg is defined for floating types only, not ", to_string(op.dtype)));
  }
  if (rooted(op.kind) && (op.root < 0 || op.root >= n))
    return invalid_argument(str(": root ", std::to_string(op.root), " is out of range for a communicator of ",
                                std::to_string(n), " ranks"));
  const size_t e = dtype_size(op.dtype);
  const size_t limit = (size_t{1} << 62) / e / static_cast<size_t>(n);
  auto check_count = [&](size_t v, const char* what) -> Status {
    if (v > limit) return invalid_argument(str(": ", what, " ", std::to_string(v), " overflows the byte size"));
    return Status::ok();
  };
  STRATA_RETURN_IF_ERROR(check_count(op.count, "count"));
  if (op.kind == OpKind::AllGatherV || op.kind == OpKind::ReduceScatterV) {
    if (op.counts.size() != static_cast<size_t>(n)) return invalid_argument(str(": counts is null"));
    size_t total = 0;
    for (size_t v : op.counts) {
      STRATA_RETURN_IF_ERROR(check_count(v, "counts entry"));
      total += v;
    }
    STRATA_RETURN_IF_ERROR(check_count(total, "sum of counts"));
  }
  if (op.kind == OpKind::AllToAllV) {
    if (op.counts.size() != static_cast<size_t>(n) || op.sdispls.size() != static_cast<size_t>(n) ||
        op.rcounts.size() != static_cast<size_t>(n) || op.rdispls.size() != static_cast<size_t>(n))
      return invalid_argument(str(": send/recv counts or displacements are null"));
    for (int j = 0; j < n; ++j) {
      STRATA_RETURN_IF_ERROR(check_count(op.counts[j], "send_counts entry"));
      STRATA_RETURN_IF_ERROR(check_count(op.sdispls[j], "send_displs entry"));
      STRATA_RETURN_IF_ERROR(check_count(op.rcounts[j], "recv_counts entry"));
      STRATA_RETURN_IF_ERROR(check_count(op.rdispls[j], "recv_displs entry"));
    }
    // Receive ranges must not overlap each other, or two peers would write the same bytes.
    std::vector<std::pair<size_t, size_t>> ranges;
    for (int j = 0; j < n; ++j)
      if (op.rcounts[j]) ranges.emplace_back(op.rdispls[j], op.rdispls[j] + op.rcounts[j]);
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second)
        return invalid_argument(str(": receive ranges overlap at element ", std::to_string(ranges[i].first)));
  }
  Extent x = extent(c, op);
  if (x.in && !op.in) return invalid_argument(str(": in is null but ", std::to_string(x.in), " bytes are to be read"));
  if (x.out && !op.out)
    return invalid_argument(str(": out is null but ", std::to_string(x.out), " bytes are to be written"));
  if (overlap(op.in, x.in, op.out, x.out) && !canonical_in_place(c, op))
    return invalid_argument(str(": in ", ptr_str(op.in), " and out ", ptr_str(op.out),
                                " overlap but are not the in-place layout of ", name));
  for (auto [p, bytes, what] : {std::tuple<const void*, size_t, const char*>{op.in, x.in, "in"},
                                std::tuple<const void*, size_t, const char*>{op.out, x.out, "out"}}) {
    if (!bytes) continue;
    if (c.ctx->heap->locate(p, bytes)) continue;
    if (c.ctx->heap->locate(p, 1))
      return invalid_argument(str(": ", what, " [", ptr_str(p), ", +", std::to_string(bytes),
                                  " bytes) runs past the end of its heap segment"));
    if (const memory::Heap* owner = memory::Heap::find_owner(p); owner && owner != c.ctx->heap.get())
      return invalid_argument(str(": ", what, " ", ptr_str(p), " belongs to the heap of another communicator (rank ",
                                  std::to_string(owner->rank()), "), not to rank ", std::to_string(c.ctx->job.rank),
                                  "'s"));
  }
  return Status::ok();
}

Status run_collective(CommImpl& c, Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  if (c.net) return run_collective_net(c, op);
  auto timeout = op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout;
  // The choice depends only on what every rank's descriptor must agree on (kind, count,
  // dtype, size), so all ranks take the same path or see a mismatch.
  if (op.kind == OpKind::AllReduce && op.opts.algorithm == Algorithm::Auto && c.size > 1 &&
      op.count * dtype_size(op.dtype) <= kInlineBytes)
    return all_reduce_inline(c, op, Deadline::after(timeout));
  Exec x{c, op, Deadline::after(timeout)};
  x.esz = dtype_size(op.dtype);
  memory::Heap& heap = *c.ctx->heap;
  const int n = c.size;

  // Stage external buffers into heap scratch (the only copies made on their behalf).
  Extent ext = extent(c, op);
  char* in = const_cast<char*>(static_cast<const char*>(op.in));
  char* out = static_cast<char*>(op.out);
  struct CopyBack {
    char* dst = nullptr;
    const char* src = nullptr;
    size_t bytes = 0;
  } back;
  std::optional<memory::SegRef> in_ref = ext.in ? heap.locate(in, ext.in) : std::nullopt;
  std::optional<memory::SegRef> out_ref = ext.out ? heap.locate(out, ext.out) : std::nullopt;
  bool in_ext = ext.in && !in_ref;
  bool out_ext = ext.out && !out_ref;
  // A buffer that only its owner touches needs no staging, external or not: the output of
  // most collectives (each rank writes its own) and gather's input (each rank pushes it).
  const uint8_t algo = pick_algorithm(c, op);
  const bool out_local = out_ext && !peers_touch_out(op.kind, algo);
  const bool in_local = in_ext && !peers_read_in(op.kind);
  if (out_local) out_ext = false;
  if (in_local) in_ext = false;
  // External buffers that are registered, or large (a copy through the heap would cost more
  // than the system calls), are read and written in place by peers with CMA (single copy)
  // when every member can; otherwise they are staged. Each rank decides for its own buffers
  // and says so in its descriptor.
  const size_t cma_min = c.ctx->env.cma_min_bytes;
  bool in_cma = in_ext && c.cma_all && (ext.in >= cma_min || c.ctx->is_registered(in, ext.in));
  bool out_cma = out_ext && c.cma_all && (ext.out >= cma_min || c.ctx->is_registered(out, ext.out));
  const bool both_staged_together = overlap(in, ext.in, out, ext.out) && (in_ext || out_ext) && !out_local;
  if (both_staged_together && !(in_cma && out_cma)) in_cma = out_cma = false;
  if (in_cma) in_ext = false;
  if (out_cma) out_ext = false;
  if (both_staged_together && (in_ext || out_ext)) {
    auto lo = std::min(in, out);
    auto hi = std::max(in + ext.in, out + ext.out);
    size_t bytes = static_cast<size_t>(hi - lo);
    STRATA_ASSIGN_OR_RETURN(void* s, c.scratch_block(0, bytes));
    kernels::copy(s, lo, bytes);
    in = static_cast<char*>(s) + (in - lo);
    out = static_cast<char*>(s) + (out - lo);
    back = {lo, static_cast<char*>(s), bytes};
    if (ext.in) in_ref = heap.locate(in, ext.in);
    if (ext.out) out_ref = heap.locate(out, ext.out);
    c.staged_bytes.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    if (in_ext) {
      STRATA_ASSIGN_OR_RETURN(void* s, c.scratch_block(0, ext.in));
      kernels::copy(s, in, ext.in);
      c.staged_bytes.fetch_add(ext.in, std::memory_order_relaxed);
      in = static_cast<char*>(s);
      in_ref = heap.locate(in, ext.in);
    }
    if (out_ext) {
      STRATA_ASSIGN_OR_RETURN(void* s, c.scratch_block(1, ext.out));
      // all_to_all_v writes only the receive ranges; keep the rest of out as it was.
      if (op.kind == OpKind::AllToAllV) {
        kernels::copy(s, out, ext.out);
        c.staged_bytes.fetch_add(ext.out, std::memory_order_relaxed);
      }
      back = {out, static_cast<char*>(s), ext.out};
      out = static_cast<char*>(s);
      out_ref = heap.locate(out, ext.out);
    }
  }
  x.in = in;
  x.out = out;

  // In place, one-shot all_reduce and all_to_all land in a temporary (peers still read the
  // bytes they would overwrite).
  bool need_tmp = in == out && ext.out &&
                  ((op.kind == OpKind::AllReduce && algo == kOneShot && n > 1) || op.kind == OpKind::AllToAll ||
                   op.kind == OpKind::AllToAllV);
  void* tmp = nullptr;
  if (need_tmp) {
    STRATA_ASSIGN_OR_RETURN(tmp, c.scratch_block(2, ext.out));
  }

  // Publish the descriptor.
  OpDesc d = next_desc(c, op, algo);
  if (ext.in) {
    d.flags |= OpDesc::kHasIn;
    if (in_cma) {
      d.flags |= OpDesc::kInCma;
      d.in_off = reinterpret_cast<uint64_t>(in);
    } else {
      d.in_seg = in_ref->seg;
      d.in_off = in_ref->offset;
    }
  }
  if (ext.out) {
    d.flags |= OpDesc::kHasOut;
    if (out_cma) {
      d.flags |= OpDesc::kOutCma;
      d.out_off = reinterpret_cast<uint64_t>(out);
    } else {
      d.out_seg = out_ref->seg;
      d.out_off = out_ref->offset;
    }
  }
  uint64_t* vec = c.self.vec();
  if (op.kind == OpKind::AllGatherV || op.kind == OpKind::ReduceScatterV || op.kind == OpKind::AllToAllV) {
    for (int j = 0; j < n; ++j) vec[j] = op.counts[j];
  }
  if (op.kind == OpKind::AllToAllV) {
    for (int j = 0; j < n; ++j) {
      vec[n + j] = op.sdispls[j];
      vec[2 * n + j] = op.rcounts[j];
      vec[3 * n + j] = op.rdispls[j];
    }
  }
  c.self.hdr()->slot(c.seq).desc = d;
  const char* name = coll::to_string(op.kind);
  STRATA_RETURN_IF_ERROR(c.sync(x.deadline, name));

  // Every rank sees the mismatch after the same one step and returns; the communicator stays
  // usable (slots alternate, so nobody overwrites a descriptor a peer is still checking).
  Status st = check_descriptors(c, op, d);
  if (!st.is_ok()) return st;

  std::vector<size_t> counts;
  switch (op.kind) {
    case OpKind::AllReduce:
      if (n == 1) {
        x.copy(out, in, op.count * x.esz);
        st = Status::ok();
      } else {
        st = all_reduce(x, algo, tmp);
      }
      break;
    case OpKind::Reduce: st = reduce(x); break;
    case OpKind::Broadcast: st = broadcast(x); break;
    case OpKind::AllGather:
      counts.assign(n, op.count);
      st = all_gather(x, counts);
      break;
    case OpKind::AllGatherV: st = all_gather(x, op.counts); break;
    case OpKind::ReduceScatter:
      counts.assign(n, op.count);
      st = reduce_scatter(x, counts);
      break;
    case OpKind::ReduceScatterV: st = reduce_scatter(x, op.counts); break;
    case OpKind::AllToAll:
    case OpKind::AllToAllV: st = all_to_all(x, tmp); break;
    case OpKind::Gather: st = gather(x); break;
    case OpKind::Scatter: st = scatter(x); break;
    case OpKind::Barrier: break;  // the first step was the barrier
    default: st = internal_error(std::string("not a collective: ") + name);
  }
  if (!st.is_ok()) return st.with_context(std::string(name) + ": ");
  if (back.bytes) {
    kernels::copy(back.dst, back.src, back.bytes);
    c.staged_bytes.fetch_add(back.bytes, std::memory_order_relaxed);
  }
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

}  // namespace strata::detail

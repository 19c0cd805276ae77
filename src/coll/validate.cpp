// Checks of a call's arguments on this rank (validate), so that bad input fails with a
// message naming what is wrong and where, never silently. A peer's descriptor is compared
// with this rank's in coll/descriptor.cpp.

#include <algorithm>
#include <sstream>
#include <string_view>
#include <tuple>

#include "coll/comm_impl.hpp"
#include "coll/counts.hpp"

namespace strata::detail {

using coll::has_count;
using coll::Op;
using coll::OpDesc;
using coll::OpKind;
using coll::reducing;
using coll::rooted;

namespace {

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
    case OpKind::AllGatherV: return in == out + coll::prefix_sums(op.counts)[c.rank] * e;
    case OpKind::ReduceScatter: return out == in + c.rank * op.count * e;
    case OpKind::ReduceScatterV: return out == in + coll::prefix_sums(op.counts)[c.rank] * e;
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

}  // namespace

Status validate(const CommImpl& c, const Op& op) {
  // Strings are built only on the error paths: this runs on every call.
  const std::string_view name = coll::to_string(op.kind);
  auto str = [&](auto&&... parts) { return (std::string(name) + ... + std::string(parts)); };
  const int n = c.size;
  if (static_cast<unsigned>(op.dtype) > static_cast<unsigned>(DataType::Float64))
    return invalid_argument(str(": invalid dtype ", std::to_string(static_cast<int>(op.dtype))));
  if (reducing(op.kind)) {
    if (static_cast<unsigned>(op.rop) > static_cast<unsigned>(ReduceOp::BXor))
      return invalid_argument(str(": invalid reduce op ", std::to_string(static_cast<int>(op.rop))));
    if (op.rop == ReduceOp::Avg && !is_floating(op.dtype))
      return invalid_argument(str(": op avg is defined for floating types only, not ", to_string(op.dtype)));
    if (is_bitwise(op.rop) && is_floating(op.dtype))
      return invalid_argument(
          str(": op ", to_string(op.rop), " is defined for integer types only, not ", to_string(op.dtype)));
  }
  if (static_cast<unsigned>(op.opts.algorithm) > static_cast<unsigned>(Algorithm::TwoShot))
    return invalid_argument(
        str(": CollOptions::algorithm ", std::to_string(static_cast<int>(op.opts.algorithm)), " is not an Algorithm"));
  if (op.opts.timeout.count() < 0)
    return invalid_argument(str(": CollOptions::timeout is negative (", std::to_string(op.opts.timeout.count()),
                                " ms); 0 means the communicator's own timeout (STRATA_TIMEOUT)"));
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
    // A rank's own block: with peers, their descriptor check names it on every rank at once
    // (check_all_to_all_v_counts); alone, nobody else would.
    if (n == 1 && op.counts[0] != op.rcounts[0])
      return invalid_argument(str(": this rank sends itself send_counts[0]=", std::to_string(op.counts[0]),
                                  " elements but expects recv_counts[0]=", std::to_string(op.rcounts[0])));
    // Receive ranges must not overlap each other, or two peers would write the same bytes.
    std::vector<std::pair<size_t, size_t>> ranges;
    for (int j = 0; j < n; ++j)
      if (op.rcounts[j]) ranges.emplace_back(op.rdispls[j], op.rdispls[j] + op.rcounts[j]);
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second)
        return invalid_argument(str(": receive ranges overlap at element ", std::to_string(ranges[i].first)));
  }
  coll::Extent x = coll::extent(op, c.rank, c.size);
  if (x.in && !op.in) return invalid_argument(str(": in is null but ", std::to_string(x.in), " bytes are to be read"));
  if (x.out && !op.out)
    return invalid_argument(str(": out is null but ", std::to_string(x.out), " bytes are to be written"));
  if (coll::overlap(op.in, x.in, op.out, x.out) && !canonical_in_place(c, op))
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

}  // namespace strata::detail

// Names and byte extents of operations, and their descriptions in error messages.

#include <numeric>
#include <sstream>

#include "coll/counts.hpp"
#include "coll/op.hpp"
#include "coll/select.hpp"

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

const char* exchange_of(OpKind kind, int root) {
  if (rooted(kind)) return nullptr;
  if (root == kRootSplitExchange) return "split";
  if (root == kRootSymmetricExchange) return "alloc_symmetric";
  return nullptr;
}

std::string describe(const OpDesc& d) {
  auto k = static_cast<OpKind>(d.kind);
  if (k == OpKind::Barrier && d.root == kRootRefused)
    return "a call it refused (its arguments were invalid; its own error names them)";
  const char* exchange = exchange_of(k, d.root);
  std::ostringstream os;
  if (exchange) os << exchange << " (its exchange, ";
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
  if (k == OpKind::AllReduce) os << sep << "algorithm=" << to_string(static_cast<Algo>(d.algo));
  os << ")";
  if (exchange) os << ")";
  return os.str();
}

namespace {
size_t total(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }
}  // namespace

Extent extent(const Op& op, int rank, int size) {
  const size_t e = dtype_size(op.dtype);
  const size_t n = static_cast<size_t>(size);
  const bool root = rank == op.root;
  switch (op.kind) {
    case OpKind::AllReduce: return {op.count * e, op.count * e};
    case OpKind::Reduce: return {op.count * e, root ? op.count * e : 0};
    case OpKind::Broadcast: return {root ? op.count * e : 0, op.count * e};
    case OpKind::AllGather: return {op.count * e, n * op.count * e};
    case OpKind::AllGatherV: return {op.counts[rank] * e, total(op.counts) * e};
    case OpKind::ReduceScatter: return {n * op.count * e, op.count * e};
    case OpKind::ReduceScatterV: return {total(op.counts) * e, op.counts[rank] * e};
    case OpKind::AllToAll: return {n * op.count * e, n * op.count * e};
    case OpKind::AllToAllV: return {max_end(op.counts, op.sdispls) * e, max_end(op.rcounts, op.rdispls) * e};
    case OpKind::Gather: return {op.count * e, root ? n * op.count * e : 0};
    case OpKind::Scatter: return {root ? n * op.count * e : 0, op.count * e};
    default: return {0, 0};
  }
}

}  // namespace strata::coll

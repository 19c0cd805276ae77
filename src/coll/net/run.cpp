// A collective across hosts. Every operation starts with a descriptor exchange between all
// members (one small tag message per pair, carrying the data too for an eager operation): it
// is the cross-host mismatch check, and every rank reaches the same verdict because every
// rank sees every descriptor. Then the selected algorithm (coll/select.cpp) runs: eager,
// direct or hierarchical, one file per family beside this one.

#include <cstring>
#include <optional>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

namespace {

/// The first round of every operation: each member sends every other one message holding
/// its descriptor, then its count vector (v-collectives), then, for an eager operation, that
/// peer's data. It is the cross-host mismatch check (the form of check_descriptors in
/// coll/shm/run.cpp), and every rank reaches the same verdict because every rank sees every
/// descriptor. Eager data that arrived is left at x.eager_in[r].
Status first_round(NetExec& x, const OpDesc& mine, const Eager* eager) {
  CommImpl& c = x.c;
  const int n = c.size, me = c.rank;
  const auto kind = x.op.kind;
  const size_t head = first_message_head(kind, n);
  const bool has_vec = head > sizeof(OpDesc);
  std::vector<uint64_t> out_head(head / sizeof(uint64_t));
  std::memcpy(out_head.data(), &mine, sizeof mine);
  if (has_vec)
    for (int j = 0; j < n; ++j) out_head[sizeof(OpDesc) / sizeof(uint64_t) + j] = x.op.counts[j];
  // Each message is received in three parts: the record; the data, straight into its place
  // in the output (or into this receive area when it is to be combined first); and a spill
  // area with room for the largest first message of any operation, so that a peer that
  // called something else is read and named rather than cut off (only a mismatch reaches it).
  auto align = [](size_t v) { return (v + 63) & ~size_t{63}; };
  const size_t head_al = align(head),
               spill = align(std::max(sizeof(OpDesc) + kEagerBytes, head + n * sizeof(uint64_t)));
  size_t body_al = 0;
  if (eager)
    for (int r = 0; r < n; ++r)
      if (!eager->into[r]) body_al = std::max(body_al, align(eager->from_bytes[r]));
  STRATA_ASSIGN_OR_RETURN(void* rv, c.scratch_block(2, n * (head_al + body_al) + spill));
  char* heads = static_cast<char*>(rv);
  char* spill_at = heads + n * head_al;
  char* bodies = spill_at + spill;
  std::vector<transport::TransferPtr> rx(n);
  x.eager_in.assign(n, nullptr);
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    transport::Part parts[3] = {{heads + r * head_al, head}, {}, {spill_at, spill}};
    if (eager && eager->from_bytes[r]) {
      x.eager_in[r] = eager->into[r] ? eager->into[r] : bodies + r * body_al;
      parts[1] = {x.eager_in[r], eager->from_bytes[r]};
    }
    STRATA_ASSIGN_OR_RETURN(rx[r], x.net().recv_parts(x.g(r), make_tag(c, kDesc, x.seq, r), parts));
    x.xs.push_back(rx[r]);
  }
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    const bool data = eager && eager->to_bytes[r];
    STRATA_ASSIGN_OR_RETURN(auto t, x.net().send2(x.g(r), make_tag(c, kDesc, x.seq, me), out_head.data(), head,
                                                  data ? eager->to[r] : nullptr, data ? eager->to_bytes[r] : 0));
    if (data) c.direct_bytes.fetch_add(eager->to_bytes[r], std::memory_order_relaxed);
    x.xs.push_back(std::move(t));
  }
  Status ws = x.wait(coll::to_string(kind));
  if (!ws.is_ok()) {
    // A message too long for any first message of this operation: a different operation.
    if (ws.code() != Code::InvalidArgument) return ws;
    return Status(Code::InvalidArgument,
                  "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                      " called " + coll::describe(mine) + " but rank " + std::to_string(ws.peer()) +
                      " called an operation with a different descriptor (" + ws.message() + ")",
                  ws.peer());
  }
  x.descs.assign(n, OpDesc{});
  x.descs[me] = mine;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    STRATA_ASSIGN_OR_RETURN(x.descs[r], read_first_message(x.op, mine, me, n, r, heads + r * head_al, rx[r]->received,
                                                           eager ? eager->from_bytes[r] : 0));
  }
  return Status::ok();
}

}  // namespace

Status run(CommImpl& c, Op& op, coll::Algo algo) {
  auto timeout = op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout;
  NetExec x(c, op, Deadline::after(timeout));
  x.esz = dtype_size(op.dtype);
  // No staging: UCX moves data from and into any memory, heap or not.
  x.in = const_cast<char*>(static_cast<const char*>(op.in));
  x.out = static_cast<char*>(op.out);
  x.seq = ++c.seq;
  const bool hier = algo == coll::Algo::NetHierarchical;

  OpDesc d{};
  d.seq = x.seq;
  d.kind = static_cast<uint8_t>(op.kind);
  d.dtype = static_cast<uint8_t>(op.dtype);
  d.rop = static_cast<uint8_t>(op.rop);
  d.root = op.root;
  d.count = coll::has_count(op.kind) ? op.count : 0;
  // Peers may put into our output only where it is what they write: the heap buffer itself,
  // not a temporary (in-place all_to_all), and at element offsets they can compute.
  const bool lands_in_out = !((op.kind == OpKind::AllToAll || op.kind == OpKind::AllToAllV) && op.in == op.out) &&
                            op.kind != OpKind::AllToAllV;
  if (op.out && lands_in_out)
    if (auto ref = c.ctx->heap->locate(op.out, 1)) {
      d.flags |= kOutHeap | OpDesc::kHasOut;
      d.out_seg = ref->seg;
      d.out_off = ref->offset;
    }
  const char* name = coll::to_string(op.kind);
  std::optional<Eager> eager;
  if (algo == coll::Algo::NetEager) {
    STRATA_ASSIGN_OR_RETURN(eager, eager_plan(x));
  }
  // The algorithm, which depends on CollOptions::algorithm too, is published: ranks that
  // would run different ones fail as a mismatch instead of waiting for messages that never come.
  d.algo = static_cast<uint8_t>(algo);
  Status st = first_round(x, d, eager ? &*eager : nullptr);
  if (st.is_ok() && eager) {
    st = finish_eager(x);
  } else if (st.is_ok()) {
    switch (op.kind) {
      case OpKind::AllReduce: st = hier ? all_reduce_hier(x) : all_reduce_direct(x); break;
      case OpKind::Reduce: st = hier ? reduce_hier(x) : reduce(x); break;
      case OpKind::Broadcast: st = hier ? broadcast_hier(x) : broadcast(x); break;
      case OpKind::AllGather:
      case OpKind::AllGatherV: {
        auto counts = op.kind == OpKind::AllGather ? std::vector<size_t>(c.size, op.count) : op.counts;
        st = hier ? all_gather_hier(x, counts) : all_gather_direct(x, counts);
        break;
      }
      case OpKind::ReduceScatter:
      case OpKind::ReduceScatterV: {
        auto counts = op.kind == OpKind::ReduceScatter ? std::vector<size_t>(c.size, op.count) : op.counts;
        st = hier ? reduce_scatter_hier(x, counts) : reduce_scatter_direct(x, counts);
        break;
      }
      case OpKind::AllToAll:
      case OpKind::AllToAllV: st = all_to_all(x); break;
      case OpKind::Gather: st = gather(x); break;
      case OpKind::Scatter: st = scatter(x); break;
      case OpKind::Barrier: break;  // the descriptor exchange is an all-to-all handshake
      default: st = internal_error(std::string("not a collective: ") + name);
    }
  } else if (st.code() == Code::InvalidArgument) {
    // Every rank saw every descriptor: all fail this operation and the communicator stays usable.
    return st.with_context(std::string(name) + ": ");
  }
  if (!st.is_ok()) {
    Status full = st.with_context(std::string(name) + ": ");
    c.set_broken(full);
    if (c.local) c.local->set_broken(full);
    return full;
  }
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

}  // namespace strata::detail::net

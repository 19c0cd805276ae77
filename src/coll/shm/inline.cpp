// The inline forms: a small input travels in the rank's control-block slot, next to the
// descriptor it is published with. One synchronisation, after which every rank takes what it
// needs from the peers' slots; nobody reads the caller's buffers, so external, registered and
// heap buffers cost the same and no closing synchronisation is needed. Slot s % 2 is rewritten
// only at operation s + 2, after every peer has passed the first step of s + 1 (ctrl_block.hpp),
// so the peers' slots stay valid until this rank returns.

#include <cstring>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

namespace {

/// Bytes of `op`'s input on each rank.
size_t input_bytes(const Op& op, int n) {
  const size_t block = op.count * dtype_size(op.dtype);
  return op.kind == OpKind::AllReduce || op.kind == OpKind::AllGather ? block : block * static_cast<size_t>(n);
}

}  // namespace

Status run_inline(CommImpl& c, const Op& op, Deadline deadline) {
  const int n = c.size, me = c.rank;
  const size_t e = dtype_size(op.dtype), block = op.count * e, in_bytes = input_bytes(op, n);
  const char* name = coll::to_string(op.kind);
  if (in_bytes > kInlineSlotBytes) return internal_error(std::string(name) + ": input too large to go inline");
  const OpDesc d = next_desc(c, op, coll::Algo::Inline);
  OpSlot& mine = c.self.hdr()->slot(c.seq);
  // The head only: the input lies where the buffer references would be.
  std::memcpy(static_cast<void*>(&mine.desc), &d, kInlineDescBytes);
  if (in_bytes) std::memcpy(mine.inline_data(), op.in, in_bytes);
  STRATA_RETURN_IF_ERROR(c.sync(deadline, name));
  STRATA_RETURN_IF_ERROR(check_descriptors(c, op, d).with_context(std::string(name) + ": "));
  auto data = [&](int r) { return c.peers[r].hdr()->slot(c.seq).inline_data(); };
  char* out = static_cast<char*>(op.out);
  Srcs srcs(n);
  switch (op.kind) {
    case OpKind::AllReduce:
      // Every rank reduces in rank order: bit-identical results everywhere.
      for (int r = 0; r < n; ++r) srcs[r] = data(r);
      kernels::reduce(op.dtype, op.rop, out, srcs.data(), n, op.count, n);
      break;
    case OpKind::AllGather:
      for (int r = 0; r < n; ++r)
        if (block) std::memcpy(out + static_cast<size_t>(r) * block, data(r), block);
      break;
    case OpKind::AllToAll:
      for (int r = 0; r < n; ++r)
        if (block) std::memcpy(out + static_cast<size_t>(r) * block, data(r) + static_cast<size_t>(me) * block, block);
      break;
    case OpKind::ReduceScatter:
      // The order of reduce_range (this rank first), so that a block's value does not depend
      // on whether it went inline.
      for (int k = 0; k < n; ++k) srcs[k] = data((me + k) % n) + static_cast<size_t>(me) * block;
      kernels::reduce(op.dtype, op.rop, out, srcs.data(), n, op.count, n);
      break;
    default: return internal_error(std::string(name) + " has no inline form");
  }
  // Every kind takes one block (count elements) from each peer's slot.
  c.direct_bytes.fetch_add(block * static_cast<size_t>(n - 1), std::memory_order_relaxed);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

}  // namespace strata::detail::shm

// A collective within one host: stage what peers cannot reach (external buffers that are
// neither registered nor large), publish this rank's descriptor, check every peer's, then
// run the chosen algorithm (one file per family beside this one) straight on the ranks' own
// buffers.

#include <algorithm>
#include <cstring>
#include <optional>

#include "coll/shm/exec.hpp"

namespace strata::detail::shm {

using coll::has_count;

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
  // all_to_all_v publishes send counts, send displacements, receive counts, receive displacements.
  if (kind == OpKind::AllToAllV)
    return check_all_to_all_v_counts(
        mine, c.rank, n, [&](int r) { return r == c.rank ? op.counts.data() : c.peers[r].vec(); },
        [&](int r) { return r == c.rank ? op.rcounts.data() : c.peers[r].vec() + 2 * n; });
  return Status::ok();
}

/// Takes the next sequence number and describes `op` for the peers' check.
OpDesc next_desc(CommImpl& c, const Op& op, coll::Algo algo) {
  OpDesc d{};
  d.seq = ++c.seq;
  d.kind = static_cast<uint8_t>(op.kind);
  d.dtype = static_cast<uint8_t>(op.dtype);
  d.rop = static_cast<uint8_t>(op.rop);
  d.algo = static_cast<uint8_t>(algo);
  d.root = op.root;
  d.count = has_count(op.kind) ? op.count : 0;
  return d;
}

namespace {

/// Whether peers read or write this rank's output during `kind` (else only this rank
/// writes it, and an external output is written in place).
bool peers_touch_out(OpKind kind, coll::Algo algo) {
  return kind == OpKind::Reduce || kind == OpKind::Gather || (kind == OpKind::AllReduce && algo == coll::Algo::TwoShot);
}

/// Whether peers read this rank's input during `kind` (gather pushes it instead).
bool peers_read_in(OpKind kind) { return kind != OpKind::Gather; }

/// Copies into `slot` (at the input's own offsets) the bytes of this rank's input `in` that
/// peers read: where each peer reads its own block, the other ranks' blocks (as pipe.cpp
/// stages them), else all of it. Returns the bytes copied.
size_t fill_slot(const Exec& x, const char* in, size_t in_bytes, unsigned char* slot) {
  switch (x.op.kind) {
    case OpKind::AllToAll:
    case OpKind::AllToAllV:
    case OpKind::ReduceScatter:
    case OpKind::ReduceScatterV: {
      size_t copied = 0;
      for (int j = 0; j < x.c.size; ++j) {
        const size_t bytes = piped_block(x, x.c.rank, j);  // 0 for this rank's own block
        if (!bytes) continue;
        const size_t at = own_displ(x, j);
        std::memcpy(slot + at, in + at, bytes);
        copied += bytes;
      }
      return copied;
    }
    default: std::memcpy(slot, in, in_bytes); return in_bytes;
  }
}

}  // namespace

Status run(CommImpl& c, Op& op, coll::Algo algo) {
  auto timeout = op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout;
  if (algo == coll::Algo::Inline) return run_inline(c, op, Deadline::after(timeout));
  Exec x{c, op, Deadline::after(timeout)};
  x.esz = dtype_size(op.dtype);
  memory::Heap& heap = *c.ctx->heap;
  const int n = c.size;

  // Stage external buffers into heap scratch (the only copies made on their behalf).
  coll::Extent ext = coll::extent(op, c.rank, c.size);
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
  const bool out_local = out_ext && !peers_touch_out(op.kind, algo);
  const bool in_local = in_ext && !peers_read_in(op.kind);
  if (out_local) out_ext = false;
  if (in_local) in_ext = false;
  // A small external input rides in this rank's operation slot, as an inline operation's
  // does: the peers read it there, so it is neither staged nor read by CMA, and the call has
  // no closing synchronisation when every rank's input rides so. Only where peers do not
  // touch this rank's output: the input lies over the descriptor's buffer references.
  const bool slot_in = n > 1 && in_ext && ext.in <= kSlotInputBytes && !peers_touch_out(op.kind, algo);
  if (slot_in) in_ext = false;
  // External buffers large enough that a copy through the heap costs more than CMA's fixed
  // cost per call (system call, peer lookup, page pinning: several µs) are read and written
  // in place by peers with CMA (single copy) when every member can; otherwise they are
  // staged. Registration lowers that size (STRATA_CMA_REGISTERED_MIN_BYTES) but does not
  // make a small buffer pay the fixed cost. Each rank decides for its own buffers and says
  // so in its descriptor.
  const size_t cma_min = c.ctx->env.cma_min_bytes;
  const size_t cma_reg_min = std::min(cma_min, c.ctx->env.cma_registered_min_bytes);
  auto use_cma = [&](const char* p, size_t bytes) {
    return c.cma_all && (bytes >= cma_min || (bytes >= cma_reg_min && c.ctx->is_registered(p, bytes)));
  };
  // Two-shot all_reduce: a rank reads its own input slice and writes its own output itself;
  // peers read only the other input slices and write only their reduced slices. Only those go
  // through the heap, in rounds (two_shot.cpp): a round's pieces of the other slices staged
  // for the peers, their reduced pieces left in this rank's landing slots. Staging whole
  // slices beat CMA over whole buffers at every size, registered or not (2 ranks, 1-64 MiB:
  // 51-80% of heap buffers' busbw against 31-51%), and rounds beat staging whole (2 ranks, 4 /
  // 16 / 64 MiB: 1.05 / 1.27 / 1.23x out of place, 1.36 / 2.09 / 1.84x in place); out of
  // place, CMA a piece at a time may still win (below), so it is not taken here.
  const bool apart = !coll::overlap(in, ext.in, out, ext.out);
  const bool two_shot_ar =
      op.kind == OpKind::AllReduce && algo == coll::Algo::TwoShot && (in_ext || out_ext) && (in == out || apart);
  // all_gather(v), all_to_all(v) and reduce_scatter(v) out of place stage the blocks peers
  // read in rounds, each read while it is still in the cache (pipe.cpp); reduce_scatter's
  // blocks are reduced round by round. That beats staging the whole input first.
  // From kInputCmaMinBytes these three may instead let their peers read the input by CMA: a
  // CMA read is a block's only copy where a staged round makes two (the owner's into the heap,
  // the reader's out of it). Which is faster depends on the machine's CMA cost and on the
  // size, so each communicator times its first calls of each input size both ways
  // (TimedChoice, one set of trials per kind) and keeps the faster. On an Intel Xeon VM (2
  // ranks, external, 64 KiB / 256 KiB / 1 MiB, two runs) CMA won: all_to_all 3.4-3.8 /
  // 9.3-9.7 / 50-60 us against 7.1-7.2 / 18.3 / 106 staged, all_gather 3.6-3.7 / 10-10.4 /
  // 59-62 against 7.1-7.8 / 18.5-18.9 / 86-89, reduce_scatter 4.1-4.8 / 11.6-13.9 / 52-85
  // against 6.4-7.5 / 15.8-17.3 / 75-84; at 4 MiB the two were even, and reduce_scatter of
  // 16 MiB was faster staged (2.3-2.6 ms against 4.0-4.3). On the AMD EPYC VM of earlier
  // measurements CMA was the slower copy (all_gather of 4 / 16 MiB: 164 / 1,256 us against
  // 145 / 718 staged).
  const bool a2a = op.kind == OpKind::AllToAll || op.kind == OpKind::AllToAllV;
  std::optional<TimedChoice> route;
  if (n > 1 && in_ext && apart && c.cma_all && ext.in >= kInputCmaMinBytes) {
    const Env& env = c.ctx->env;
    if (a2a) route.emplace(c.all_to_all_cma, ext.in, env.all_to_all_cma);
    else if (op.kind == OpKind::AllGather || op.kind == OpKind::AllGatherV)
      route.emplace(c.all_gather_cma, ext.in, env.all_gather_cma);
    else if (op.kind == OpKind::ReduceScatter || op.kind == OpKind::ReduceScatterV)
      route.emplace(c.reduce_scatter_cma, ext.in, env.reduce_scatter_cma);
  }
  const bool input_cma = route && route->mode() == 1;
  const bool piped = n > 1 && in_ext && apart && !input_cma &&
                     (op.kind == OpKind::AllGather || op.kind == OpKind::AllGatherV || a2a ||
                      op.kind == OpKind::ReduceScatter || op.kind == OpKind::ReduceScatterV);
  if (piped) {
    STRATA_ASSIGN_OR_RETURN(in, pipe_input(x, in));
    in_ref = heap.locate(in, 1);
    in_ext = false;
  }
  std::optional<TimedChoice> choice;
  if (op.kind == OpKind::AllReduce && algo == coll::Algo::TwoShot && n > 1) {
    auto [lo, hi] = slice(op.count, n, c.rank, x.esz);
    choice.emplace(store_choice(c, (hi - lo) * x.esz));
    x.shared_stores = stores_of(*choice);
  }
  // Two-shot all_reduce with an external buffer runs in rounds (two_shot.cpp): an external
  // input is staged for the peers a round at a time, an external output gets landing slots
  // that it copies its peers' reduced pieces out of. Out of place, where every member can
  // CMA, the peers may instead read the input's pieces and write the output's by CMA. That
  // saves the staging copy and the copy out of the landing slots, each of which makes another
  // core read lines just written, but each piece costs a system call and the pinning of its
  // pages; so each communicator times its first calls of each size both ways and keeps the
  // faster (2 ranks, external, CMA against staged: 64 KiB / 256 KiB / 1 / 4 / 16 MiB 2.03 /
  // 1.78 / 1.69 / 1.10 / 1.09x, 64 MiB 0.66x; the output alone by CMA 1.40 / 1.34 / 1.10 /
  // 1.08x from 256 KiB, 4 ranks 1.37 / 1.16 / 1.15 / 1.05x). In place CMA made the peers
  // claim lines this rank has just read and will write: 0.65x reading, 0.86x writing from 4
  // MiB, so it is not tried there.
  std::optional<TimedChoice> cma_route;
  if (n > 1 && two_shot_ar && apart && c.cma_all && std::max(ext.in, ext.out) >= kInputCmaMinBytes)
    cma_route.emplace(c.all_reduce_cma, std::max(ext.in, ext.out), c.ctx->env.all_reduce_cma);
  const bool by_cma = cma_route && cma_route->mode() == 1;
  bool rounds_in = false;
  if (n > 1 && two_shot_ar) {
    if (in_ext && !by_cma) {
      STRATA_ASSIGN_OR_RETURN(in, stage_rounds_input(x, in));
      in_ref = heap.locate(in, 1);
      rounds_in = true;
    }
    if (out_ext && !by_cma) {
      STRATA_ASSIGN_OR_RETURN(void* l, c.scratch_block(1, 2 * round_shape(x).slot));
      x.landing = static_cast<char*>(l);
      out_ref = heap.locate(l, 1);
    }
    // By CMA, the external buffers are published as they are (kInCma, kOutCma).
    if (!by_cma) in_ext = out_ext = false;
  }
  bool in_cma = in_ext && (by_cma || input_cma || use_cma(in, ext.in));
  bool out_cma = out_ext && (by_cma || use_cma(out, ext.out));
  const bool both_staged_together = coll::overlap(in, ext.in, out, ext.out) && (in_ext || out_ext) && !out_local;
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
  // bytes they would overwrite; all_reduce not when its input rides in the slot).
  bool need_tmp = in == out && ext.out &&
                  ((op.kind == OpKind::AllReduce && algo == coll::Algo::OneShot && n > 1 && !slot_in) ||
                   op.kind == OpKind::AllToAll || op.kind == OpKind::AllToAllV);
  void* tmp = nullptr;
  if (need_tmp) {
    STRATA_ASSIGN_OR_RETURN(tmp, c.scratch_block(2, ext.out));
  }

  // Publish the descriptor.
  OpDesc d = next_desc(c, op, algo);
  if (slot_in) {
    d.flags |= OpDesc::kHasIn | OpDesc::kInSlot;
  } else if (ext.in) {
    d.flags |= OpDesc::kHasIn;
    if (piped || rounds_in) d.flags |= OpDesc::kInPiped;
    if (in_cma) {
      d.flags |= OpDesc::kInCma;
      d.in_off = reinterpret_cast<uint64_t>(in);
    } else {
      d.in_seg = in_ref->seg;
      d.in_off = in_ref->offset;
    }
  }
  // An external output that only its owner writes is not published (there is no heap place).
  if (ext.out && !slot_in && (out_cma || out_ref)) {
    d.flags |= OpDesc::kHasOut;
    if (out_cma) {
      d.flags |= OpDesc::kOutCma;
      d.out_off = reinterpret_cast<uint64_t>(out);
    } else {
      d.out_seg = out_ref->seg;
      d.out_off = out_ref->offset;
    }
    if (x.landing) d.flags |= OpDesc::kOutLanding;
  }
  if (c.ctx->env.push == 0) d.flags |= OpDesc::kNoPush;
  uint64_t* vec = c.self.vec();
  const bool has_vec =
      op.kind == OpKind::AllGatherV || op.kind == OpKind::ReduceScatterV || op.kind == OpKind::AllToAllV;
  if (has_vec) {
    for (int j = 0; j < n; ++j) vec[j] = op.counts[j];
  }
  if (op.kind == OpKind::AllToAllV) {
    for (int j = 0; j < n; ++j) {
      vec[n + j] = op.sdispls[j];
      vec[2 * n + j] = op.rcounts[j];
      vec[3 * n + j] = op.rdispls[j];
    }
  }
  OpSlot& slot = c.self.hdr()->slot(c.seq);
  if (slot_in) {
    std::memcpy(static_cast<void*>(&slot.desc), &d, kInlineDescBytes);
    c.staged_bytes.fetch_add(fill_slot(x, in, ext.in, slot.inline_data()), std::memory_order_relaxed);
  } else {
    slot.desc = d;
  }
  const char* name = coll::to_string(op.kind);
  // Only a trial reads the clock: most calls are none.
  TimedChoice* const timed[] = {choice ? &*choice : nullptr, cma_route ? &*cma_route : nullptr,
                                route ? &*route : nullptr};
  const bool trial = std::any_of(std::begin(timed), std::end(timed), [](TimedChoice* t) { return t && t->timed(); });
  const auto arrived = trial ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  STRATA_RETURN_IF_ERROR(c.sync(x.deadline, name));
  if (trial) {
    const auto waited = std::chrono::steady_clock::now() - arrived;
    for (TimedChoice* t : timed)
      if (t) t->exclude(waited);
  }

  // Every rank sees the mismatch after the same one step and returns; the communicator stays
  // usable (slots alternate, so nobody overwrites a descriptor a peer is still checking).
  Status st = check_descriptors(c, op, d);
  if (!st.is_ok()) return st;
  // The closing step is needed while a peer may still read some rank's buffer or write into
  // it, and for the v-collectives, whose counts lie in one array per rank (not per slot) that
  // the rank's next operation rewrites. Every rank reaches the same answer from the same
  // descriptors. Without it, the slots stay valid until every rank has returned: slot s % 2
  // is rewritten at operation s + 2, after every peer has passed the first step of s + 1
  // (ctrl_block.hpp).
  x.close_sync = peers_touch_out(op.kind, algo) || has_vec;
  for (int r = 0; r < n && !x.close_sync; ++r) {
    const uint32_t f = r == c.rank ? d.flags : x.desc(r).flags;
    x.close_sync = (f & OpDesc::kHasIn) && !(f & OpDesc::kInSlot);
  }

  std::vector<size_t> counts;
  switch (op.kind) {
    case OpKind::AllReduce:
      if (n == 1) {
        x.copy(out, in, op.count * x.esz);
        st = Status::ok();
      } else {
        st = algo == coll::Algo::OneShot ? all_reduce_one_shot(x, tmp) : all_reduce_two_shot(x);
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
    case OpKind::ReduceScatterV:
      if (any_piped(x)) {
        st = reduce_scatter_piped(x);
      } else if (op.kind == OpKind::ReduceScatter) {
        counts.assign(n, op.count);
        st = reduce_scatter(x, counts);
      } else {
        st = reduce_scatter(x, op.counts);
      }
      break;
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
  if (choice && !x.pushed) choice->done();
  if (cma_route) cma_route->done();
  if (route && !x.pushed) route->done();
  return Status::ok();
}

}  // namespace strata::detail::shm

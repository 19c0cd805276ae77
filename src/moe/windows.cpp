// The window transport of Prefill and Decode: every row goes straight into the destination's
// symmetric window, and combine reads the expert outputs where they lie.
//
// One call, seen from rank s:
//   dispatch: publish released = seq-1 (s no longer reads anything of earlier calls), wait
//     until every rank has done so (nobody still reads a window we are about to overwrite),
//     [Prefill: publish the count row, read everyone's], write each row straight into the
//     destination's window, publish sent_to[d] = seq, wait for sent_to[s] = seq from every
//     source.
//   combine: publish where y is and y = seq, read each (t, k) row from the expert rank's y
//     in place, reduce in float32, publish released = seq.

#include <cstring>
#include <optional>

#include "common/reduce.hpp"
#include "moe/schedule.hpp"

namespace strata::moe::detail {

Status BufferImpl::send_rows_to(size_t T, const std::byte* xb, const int64_t* idx, const std::vector<std::byte*>& win,
                                const std::vector<uint64_t>& first_row, HandleState& h) {
  // Per row the copy is small (cached stores), but a large call's rows together are far larger
  // than the cache: stream them, as a memcpy of that size does.
  const bool stream = T * K * row_bytes >= kStreamOutBytes;
  for (size_t t = 0; t < T; ++t) {
    const std::byte* src = xb + t * row_bytes;
    for (int k = 0; k < K; ++k) {
      size_t i = t * K + k;
      int64_t e = idx[i];
      if (e < 0) continue;
      int d = static_cast<int>(e / L);
      h.dest[i] = d;
      if (!on_my_host(d)) continue;
      uint64_t r = first_row[e] + rank_in_expert[i];
      if (stream) kernels::copy_streaming_unfenced(win[d] + r * row_bytes, src, row_bytes);
      else strata::kernels::copy(win[d] + r * row_bytes, src, row_bytes);
      h.row[i] = r;
    }
  }
  if (stream) kernels::stream_fence();  // before sent_to publishes the rows
  return Status::ok();
}

Status BufferImpl::finish_sends(Deadline d) {
  // Across hosts, the writers of this host's windows are this host's ranks (gates included).
  const int n = static_cast<int>(shm_ranks.size());
  int at = 0;
  while (shm_ranks[at] != me) ++at;
  for (int j = 0; j < n; ++j) transport::publish(sent_to(me, shm_ranks[(at + j) % n]), seq);
  for (int j = 0; j < n; ++j) {
    int s = shm_ranks[(at + n - j) % n];
    STRATA_ASSIGN_OR_RETURN(bool live, wait_live(sent_to(s, me), seq, d, s, "dispatch"));
    (void)live;  // a dead source's rows are never combined: its count reads 0
  }
  return Status::ok();
}

Status BufferImpl::combine_windows(const void* y, const HandleState& h, void* out) {
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
  const int n = static_cast<int>(shm_ranks.size());
  int at = 0;
  while (shm_ranks[at] != me) ++at;
  for (int j = 0; j < n; ++j) {
    int r = shm_ranks[(at + j) % n];
    STRATA_ASSIGN_OR_RETURN(bool live, wait_live(head(r)->y.ready, seq, d, r, "combine"));
    const YLine& py = head(r)->y;
    // Every rank's line is seen before any row is read, so a refusal stops the call everywhere
    // with nothing of it read (the next dispatch publishes released for it).
    if (live) STRATA_RETURN_IF_ERROR(refused_by(r, py.bytes, "combine"));
    if (!live) {
      // Died before publishing its outputs: its experts' selections are dropped now (one
      // that published first is still read; its mapping stays until recover()).
      ys[r] = nullptr;
      for (size_t i = 0; i < h.dest.size(); ++i)
        if (h.dest[i] == r) h.lost[i] = 1;
    } else if (py.bytes == 0) {
      const auto& win = masked ? peer_dwin : peer_pwin;
      ys[r] = win.empty() ? nullptr : win[r];  // no window yet: no rows anywhere
    } else {
      STRATA_ASSIGN_OR_RETURN(void* p, heap.peer_ptr(c->members[r], {py.seg, py.off}, py.bytes, d));
      ys[r] = static_cast<const std::byte*>(p);
    }
  }
  if (xhost) STRATA_RETURN_IF_ERROR(xcombine(h, ys, out, d));
  else reduce_tokens(h, out, [&](size_t i) { return ys[h.dest[i]] + h.row[i] * row_bytes; });
  publish_released(seq);
  if (!in_window) {
    // y is the caller's: it may be reused once we return, so every reader must be done.
    for (int r : shm_ranks) {
      STRATA_ASSIGN_OR_RETURN(bool live, wait_live(head(r)->released, seq, d, r, "combine"));
      (void)live;  // a dead rank reads nothing anymore
    }
  }
  return Status::ok();
}

}  // namespace strata::moe::detail

// Prefill schedule: a count exchange through the control blocks first, then every rank writes
// its rows into compact windows (experts' rows contiguous, aligned to expert_alignment), grown
// collectively when a batch needs more. Combine is the window one (windows.cpp).

#include <cstring>

#include "moe/schedule.hpp"

namespace strata::moe::detail {

Status BufferImpl::grow_prefill(size_t rows, Deadline d) {
  // Every rank sees the same count matrix, so every rank takes this branch together.
  if (pwin) (void)c->ctx->heap->free_symmetric(pwin);
  pwin = nullptr;
  pwin_rows = 0;
  size_t want = rows + rows / 4;
  STRATA_ASSIGN_OR_RETURN(pwin, sym_alloc(want * row_bytes));
  pwin_rows = want;
  STRATA_ASSIGN_OR_RETURN(peer_pwin, peers_of(pwin, want * row_bytes, d));
  return Status::ok();
}

void BufferImpl::compact_layout(int d, const uint64_t* mat, std::vector<uint64_t>& offsets, size_t& total) const {
  offsets.assign(static_cast<size_t>(L) * R, 0);
  size_t row = 0;
  for (int l = 0; l < L; ++l) {
    row = round_up(row, align);
    int e = d * L + l;
    for (int s = 0; s < R; ++s) {
      offsets[static_cast<size_t>(l) * R + s] = row;
      row += mat[static_cast<size_t>(s) * E + e];
    }
  }
  total = row;
}

Result<Dispatch> BufferImpl::prefill(const void* x, size_t T, const int64_t* idx, const float* w) {
  Deadline d = deadline();
  STRATA_RETURN_IF_ERROR(begin(d, true, Schedule::Prefill));
  auto h = new_handle(Schedule::Prefill, T, w);
  idx = mask_dead(T, idx, *h);
  plan(T, idx);
  matrix.resize(static_cast<size_t>(R) * E);
  if (xhost) {
    // Across hosts the count rows are all-gathered (E uint64 per rank; the collective keeps
    // its traffic within the host where it can).
    STRATA_RETURN_IF_ERROR(relay_cnt.ensure(comm, sizeof(uint64_t) * E * (R + 1)));
    auto* cs = static_cast<uint64_t*>(relay_cnt.p);
    put_counts(cs);
    try {
      comm.all_gather(cs, cs + E, static_cast<size_t>(E), DataType::UInt64);
    } catch (const Error& e) {
      return from_error(e);
    }
    std::memcpy(matrix.data(), cs + E, sizeof(uint64_t) * E * R);
  }
  uint64_t* mine = count_row(me);
  put_counts(mine);
  transport::publish(head(me)->counts_ready, seq);
  for (int k = 0; k < R && !xhost; ++k) {
    int r = (me + k) % R;
    STRATA_ASSIGN_OR_RETURN(bool live, wait_live(head(r)->counts_ready, seq, d, r, "dispatch (count exchange)"));
    // A rank that died before publishing sends nothing: every survivor reads the same row.
    if (live) std::memcpy(&matrix[static_cast<size_t>(r) * E], count_row(r), sizeof(uint64_t) * E);
    else std::fill_n(&matrix[static_cast<size_t>(r) * E], E, 0);
  }
  // A rank that refused its call: every rank sees the same matrix and stops here, before any
  // row moves or a window grows.
  for (int r = 0; r < R; ++r) STRATA_RETURN_IF_ERROR(refused_by(r, matrix[static_cast<size_t>(r) * E]));
  // Where our rows for each expert start, and how large the largest window must be.
  std::vector<uint64_t> first_row(E), offs, host_offs;  // host_offs: [R][L*R] of this host's ranks
  size_t need = 0;
  if (xhost) host_offs.resize(static_cast<size_t>(R) * L * R);
  for (int dst = 0; dst < R; ++dst) {
    size_t total = 0;
    compact_layout(dst, matrix.data(), offs, total);
    need = std::max(need, total);
    for (int l = 0; l < L; ++l) first_row[dst * L + l] = offs[static_cast<size_t>(l) * R + me];
    if (xhost && on_my_host(dst)) std::copy(offs.begin(), offs.end(), host_offs.begin() + dst * L * R);
    if (dst == me) {
      h->total_rows = total;
      h->offsets = offs;
    }
  }
  if (need > pwin_rows) {
    if (cfg.mask_failed_ranks && (any_dead() || !c->check_peers().is_ok()))
      return needs_all("growing the prefill window (" + std::to_string(need) + " rows)");
    STRATA_RETURN_IF_ERROR(grow_prefill(need, d));
  }
  if (xhost) {
    auto gated = [&](int s, int64_t e) {
      return host_offs[static_cast<size_t>(e / L) * L * R + static_cast<size_t>(e % L) * R + s];
    };
    STRATA_RETURN_IF_ERROR(
        xdispatch(T, static_cast<const std::byte*>(x), idx, *h, peer_pwin, pwin_rows, false, first_row, gated, d));
  } else {
    STRATA_RETURN_IF_ERROR(send_rows_to(T, static_cast<const std::byte*>(x), idx, peer_pwin, first_row, *h));
  }
  STRATA_RETURN_IF_ERROR(finish_sends(d));
  h->counts.resize(static_cast<size_t>(L) * R);
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < R; ++s)
      h->counts[static_cast<size_t>(l) * R + s] = dead[s] ? 0 : matrix[static_cast<size_t>(s) * E + me * L + l];
  return result(Schedule::Prefill, std::move(h), static_cast<std::byte*>(pwin));
}

}  // namespace strata::moe::detail

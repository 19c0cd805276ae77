// Decode schedule: a fixed window [L][R][M][H] per rank (made on the first Decode call), so a
// source knows where its rows go without a count exchange; the count row travels with the
// rows and is released by sent_to. Combine is the window one (windows.cpp).

#include "moe/schedule.hpp"

namespace strata::moe::detail {

Result<Dispatch> BufferImpl::decode(const void* x, size_t T, const int64_t* idx, const float* w) {
  Deadline d = deadline();
  STRATA_RETURN_IF_ERROR(begin(d, true, Schedule::Decode));
  const size_t rows = static_cast<size_t>(L) * R * M;
  if (!dwin) {  // first Decode call, on every rank at once
    if (cfg.mask_failed_ranks && (any_dead() || !c->check_peers().is_ok()))
      return needs_all("the first decode call (it makes the decode window)");
    STRATA_ASSIGN_OR_RETURN(dwin, sym_alloc(rows * row_bytes));
    STRATA_ASSIGN_OR_RETURN(peer_dwin, peers_of(dwin, rows * row_bytes, d));
  }
  auto h = new_handle(Schedule::Decode, T, w);
  idx = mask_dead(T, idx, *h);
  plan(T, idx);
  uint64_t* mine = count_row(me);
  put_counts(mine);  // released with sent_to below
  std::vector<uint64_t> first_row(E);
  for (int e = 0; e < E; ++e) first_row[e] = (static_cast<size_t>(e % L) * R + me) * M;
  h->total_rows = rows;
  if (xhost) {
    auto gated = [&](int s, int64_t e) { return (static_cast<size_t>(e % L) * R + s) * M; };
    STRATA_RETURN_IF_ERROR(
        xdispatch(T, static_cast<const std::byte*>(x), idx, *h, peer_dwin, rows, true, first_row, gated, d));
  } else {
    STRATA_RETURN_IF_ERROR(send_rows_to(T, static_cast<const std::byte*>(x), idx, peer_dwin, first_row, *h));
  }
  STRATA_RETURN_IF_ERROR(finish_sends(d));
  // A refusing rank's counts reach every rank (a gate marks them for its host): all fail here.
  for (int s = 0; s < R; ++s)
    if (!dead[s])
      STRATA_RETURN_IF_ERROR(
          refused_by(s, on_my_host(s) ? count_row(s)[me * L] : in_counts(me)[static_cast<size_t>(s) * L]));
  h->counts.resize(static_cast<size_t>(L) * R);
  h->offsets.resize(static_cast<size_t>(L) * R);
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < R; ++s) {
      h->counts[static_cast<size_t>(l) * R + s] = dead[s]         ? 0
                                                  : on_my_host(s) ? count_row(s)[me * L + l]
                                                                  : in_counts(me)[static_cast<size_t>(s) * L + l];
      h->offsets[static_cast<size_t>(l) * R + s] = (static_cast<size_t>(l) * R + s) * M;
    }
  return result(Schedule::Decode, std::move(h), static_cast<std::byte*>(dwin));
}

}  // namespace strata::moe::detail

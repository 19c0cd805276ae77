// Relay schedule, the buffer-centric baseline: rows move only through the communicator's
// all_to_all(v) (permute into send order, exchange, unpermute into the Prefill layout; and the
// way back in combine). It shares nothing with the windows but `released`.

#include "coll/counts.hpp"
#include "common/reduce.hpp"
#include "moe/schedule.hpp"

namespace strata::moe::detail {

Status BufferImpl::a2av(const void* in, const std::vector<size_t>& sc, const std::vector<size_t>& sd, void* out,
                        const std::vector<size_t>& rc, const std::vector<size_t>& rd) {
  auto el = [&](const std::vector<size_t>& v) {
    std::vector<size_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * H;
    return o;
  };
  auto sce = el(sc), sde = el(sd), rce = el(rc), rde = el(rd);
  try {
    comm.all_to_all_v(in, sce.data(), sde.data(), out, rce.data(), rde.data(), cfg.dtype);
  } catch (const Error& e) {
    return from_error(e);
  }
  return Status::ok();
}

Result<Dispatch> BufferImpl::relay(const void* x, size_t T, const int64_t* idx, const float* w) {
  Deadline d = deadline();
  STRATA_RETURN_IF_ERROR(begin(d, false, Schedule::Relay));
  plan(T, idx);
  auto h = new_handle(Schedule::Relay, T, w);
  // Permute: rows sorted by global expert id, which groups them by destination rank.
  std::vector<uint64_t> first(E, 0);
  for (int e = 1; e < E; ++e) first[e] = first[e - 1] + cnt[e - 1];
  const size_t sent = E ? first[E - 1] + cnt[E - 1] : 0;
  STRATA_RETURN_IF_ERROR(send_stage.ensure(comm, sent * row_bytes));
  const auto* xb = static_cast<const std::byte*>(x);
  for (size_t t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      size_t i = t * K + k;
      int64_t e = idx[i];
      if (e < 0) continue;
      uint64_t pos = first[e] + rank_in_expert[i];
      strata::kernels::copy(send_stage.b() + pos * row_bytes, xb + t * row_bytes, row_bytes);
      h->dest[i] = static_cast<int32_t>(e / L);
      h->row[i] = pos;
    }
  // Counts: [d][l] to rank d; back comes [s][l] = rows of our expert l from rank s.
  auto* cs = static_cast<uint64_t*>(relay_cnt.p);
  auto* cr = cs + E;
  put_counts(cs);
  try {
    comm.all_to_all(cs, cr, static_cast<size_t>(L), DataType::UInt64);
  } catch (const Error& e) {
    return from_error(e);
  }
  // Every rank receives a refusing rank's counts, and stops here before any row moves.
  for (int r = 0; r < R; ++r) STRATA_RETURN_IF_ERROR(refused_by(r, cr[static_cast<size_t>(r) * L]));
  h->send_rows.assign(R, 0);
  h->recv_rows.assign(R, 0);
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) {
      h->send_rows[r] += cnt[r * L + l];
      h->recv_rows[r] += cr[r * L + l];
    }
  h->send_displ = coll::prefix_sums(h->send_rows);
  h->recv_displ = coll::prefix_sums(h->recv_rows);
  const size_t received = h->recv_displ[R - 1] + h->recv_rows[R - 1];
  STRATA_RETURN_IF_ERROR(recv_stage.ensure(comm, received * row_bytes));
  STRATA_RETURN_IF_ERROR(a2av(send_stage.p, h->send_rows, h->send_displ, recv_stage.p, h->recv_rows, h->recv_displ));
  count_relay(h->send_rows, true);
  // Unpermute: [source][expert] chunks into [expert][source] order.
  std::vector<uint64_t> mat(static_cast<size_t>(R) * E, 0);
  for (int s = 0; s < R; ++s)
    for (int l = 0; l < L; ++l) mat[static_cast<size_t>(s) * E + me * L + l] = cr[s * L + l];
  compact_layout(me, mat.data(), h->offsets, h->total_rows);
  STRATA_RETURN_IF_ERROR(relay_win.ensure(comm, h->total_rows * row_bytes));
  h->counts.resize(static_cast<size_t>(L) * R);
  for (int s = 0; s < R; ++s) {
    size_t at = h->recv_displ[s];
    for (int l = 0; l < L; ++l) {
      size_t n = cr[s * L + l];
      h->counts[static_cast<size_t>(l) * R + s] = n;
      strata::kernels::copy(relay_win.b() + h->offsets[static_cast<size_t>(l) * R + s] * row_bytes,
                            recv_stage.b() + at * row_bytes, n * row_bytes);
      at += n;
    }
  }
  return result(Schedule::Relay, std::move(h), relay_win.b());
}

Status BufferImpl::combine_relay(const HandleState& h, const void* y, void* out) {
  // Permute back: [expert][source] rows into [source][expert] chunks, return them, reduce.
  const auto* yb = static_cast<const std::byte*>(y);
  for (int s = 0; s < R; ++s) {
    size_t at = h.recv_displ[s];
    for (int l = 0; l < L; ++l) {
      size_t n = h.counts[static_cast<size_t>(l) * R + s];
      strata::kernels::copy(recv_stage.b() + at * row_bytes, yb + h.offsets[static_cast<size_t>(l) * R + s] * row_bytes,
                            n * row_bytes);
      at += n;
    }
  }
  STRATA_RETURN_IF_ERROR(a2av(recv_stage.p, h.recv_rows, h.recv_displ, send_stage.p, h.send_rows, h.send_displ));
  count_relay(h.recv_rows, false);
  reduce_tokens(h, out, [&](size_t i) { return send_stage.b() + h.row[i] * row_bytes; });
  publish_released(seq);
  return Status::ok();
}

}  // namespace strata::moe::detail

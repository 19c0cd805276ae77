// Prefill and Decode on a communicator that spans hosts (DESIGN §5, "Across hosts"). Within a
// host rows go straight into the windows as on one host (windows.cpp). Between hosts a token
// travels once per destination host, whatever number of its experts live there: source s
// sends it, with its list of (expert, weight), to s's gate on that host, which writes the row
// into the window of every selected expert of its host. Combine is the way back: the gate
// sums, for each token it placed, the weighted outputs of its host's experts (float32, k
// ascending), rounds once to the dtype and returns one row per token; the source adds its own
// host's terms first, then those rows host by host in ascending host order.
//
// Gates: source s sends to the rank of host H whose local index is local(s) mod |H|, so the
// ranks of a host share the inbound traffic (rails when hosts have equal sizes).
//
// The gate lands each message in a staging block and copies the rows into the windows from
// there: one message per (source, host) cannot be scattered by the transport into several
// experts' windows (a row may go to several of them), and Decode has no count exchange, so
// the gate learns the size from the message itself (a receive of the largest possible size).
//
// Messages (tag: communicator, this Buffer's number and direction, call number, sender):
//   dispatch s -> gate:  [uint64 n][n*K records {int32 expert, -1 when not on that host;
//                         float weight}] padding to 64 bytes [n rows], in s's token order
//   combine gate -> s:   [n partial rows in the dtype], the same order
// Counts travel as before: Prefill all-gathers the count rows (E uint64 per rank), Decode
// needs none (the gate writes the counts of the rows it placed next to the window).

#include <cstring>

#include "common/reduce.hpp"
#include "moe/schedule.hpp"

namespace strata::moe::detail {

namespace {

struct Record {
  int32_t expert;
  float w;
};

constexpr size_t kHead = sizeof(uint64_t);

/// The transfers one call has posted. Any still listed when the call leaves early (an error
/// before their wait) are cancelled and the communicator breaks: no message may land in a
/// staging block after the call, and the peers are out of step anyway.
struct Posted {
  CommImpl& c;
  std::vector<transport::TransferPtr> xs;
  ~Posted() {
    if (xs.empty()) return;
    c.set_broken(internal_error("moe: a call ended with transfers in flight"));
    (void)c.net->wait(xs, c.policy(Deadline::after(std::chrono::milliseconds(0))), "moe (abandoned)");
  }
};

}  // namespace

void BufferImpl::init_hosts() {
  xhost = c->net != nullptr;
  shm_ranks.clear();
  host_of.assign(R, 0);
  hosts = 1;
  my_host = 0;
  if (!xhost) {
    for (int r = 0; r < R; ++r) shm_ranks.push_back(r);
    return;
  }
  host_of = c->host_of;
  hosts = static_cast<int>(c->host_members.size());
  my_host = host_of[me];
  shm_ranks = c->host_members[my_host];
  auto gate = [&](int h, int s) {
    const auto& m = c->host_members[h];
    return m[static_cast<size_t>(c->local_of[s]) % m.size()];
  };
  for (Inbound& in : inbound) in.stage.release(comm), in.back.release(comm);  // rejoin() runs this again
  for (Outbound& o : outbound) o.stage.release(comm), o.partial.release(comm);
  inbound.clear();
  outbound.clear();
  for (int s = 0; s < R; ++s)
    if (!on_my_host(s) && gate(my_host, s) == me) inbound.emplace_back().src = s;
  for (int h = 0; h < hosts; ++h)
    if (h != my_host) {
      Outbound& o = outbound.emplace_back();
      o.host = h;
      o.gate = gate(h, me);
    }
}

Status BufferImpl::init_puts() {
  use_put = true;
  // Sizes fixed from here on: a peer puts at these places in every call.
  for (Inbound& in : inbound) STRATA_RETURN_IF_ERROR(in.stage.ensure(comm, msg_bytes(M)));
  for (Outbound& o : outbound) STRATA_RETURN_IF_ERROR(o.partial.ensure(comm, M * row_bytes));
  // Every rank's record: [R] its staging block for source s (gates), [hosts] its partial
  // block for host h; (segment, offset) pairs of uint64.
  const size_t n = static_cast<size_t>(R + hosts) * 2;
  Local blk;
  STRATA_RETURN_IF_ERROR(blk.ensure(comm, sizeof(uint64_t) * n * (R + 1)));
  auto* mine = static_cast<uint64_t*>(blk.p);
  std::fill_n(mine, n * (R + 1), 0);
  memory::Heap& heap = *c->ctx->heap;
  auto ref_of = [&](const Local& l, uint64_t* at) -> Status {
    auto r = heap.locate(l.p, l.bytes);
    if (!r) return internal_error("moe: a staging block is not in the heap" + where());
    at[0] = r->seg;
    at[1] = r->offset;
    return Status::ok();
  };
  for (const Inbound& in : inbound) STRATA_RETURN_IF_ERROR(ref_of(in.stage, mine + 2 * in.src));
  for (const Outbound& o : outbound) STRATA_RETURN_IF_ERROR(ref_of(o.partial, mine + 2 * (R + o.host)));
  Status st = Status::ok();
  try {
    comm.all_gather(mine, mine + n, n, DataType::UInt64);
  } catch (const Error& e) {
    st = from_error(e);
  }
  if (st.is_ok()) {
    const uint64_t* all = mine + n;
    for (Outbound& o : outbound) {
      const uint64_t* r = all + static_cast<size_t>(o.gate) * n + 2 * me;
      o.gate_stage = {static_cast<uint32_t>(r[0]), r[1]};
    }
    for (Inbound& in : inbound) {
      const uint64_t* r = all + static_cast<size_t>(in.src) * n + 2 * (R + my_host);
      in.src_partial = {static_cast<uint32_t>(r[0]), r[1]};
    }
  }
  blk.release(comm);
  return st;
}

size_t BufferImpl::msg_bytes(size_t n) const { return round_up(kHead + n * K * sizeof(Record), kLine) + n * row_bytes; }

uint64_t BufferImpl::tag(int dir, int src) const {
  // Channels 0x40..0x7f: the collectives of coll/net use the low ones and 0xfe/0xff.
  const uint64_t ch = 0x40u | ((tag_id & 0x1fu) << 1) | static_cast<uint64_t>(dir & 1);
  return c->tag_base << 48 | ch << 40 | uint64_t{seq & 0xffffffu} << 16 | (static_cast<uint64_t>(src) & 0xffff);
}

Status BufferImpl::net_wait(std::vector<transport::TransferPtr>& xs, Deadline d, const char* what) {
  if (xs.empty()) return Status::ok();
  Status st = c->net->wait(xs, c->policy(d), what);
  xs.clear();
  if (st.is_ok()) return st;
  int peer = -1;
  for (int r = 0; r < R && st.peer() >= 0; ++r)
    if (c->members[r] == st.peer()) peer = r;
  Status full(st.code(), st.message() + where(), peer);  // the message names `what`
  c->set_broken(full);
  return full;
}

Status BufferImpl::xdispatch(size_t T, const std::byte* xb, const int64_t* idx, HandleState& h,
                             const std::vector<std::byte*>& win, size_t win_rows, bool decode,
                             const std::vector<uint64_t>& my_first,
                             const std::function<uint64_t(int, int64_t)>& first_row, Deadline d) {
  Posted posted{*c, {}};
  auto& xs = posted.xs;
  // Receives first: a message that arrives before its receive is buffered by UCX (a copy).
  const size_t max_msg = msg_bytes(M);
  for (Inbound& in : inbound) {
    STRATA_RETURN_IF_ERROR(in.stage.ensure(comm, max_msg));
    transport::Part part{in.stage.p, max_msg};
    if (use_put) {  // the rows are put into the stage; the message says they are there
      STRATA_ASSIGN_OR_RETURN(in.recv, c->net->recv(c->members[in.src], tag(0, in.src), nullptr, 0));
    } else {
      STRATA_ASSIGN_OR_RETURN(in.recv, c->net->recv_parts(c->members[in.src], tag(0, in.src), {&part, 1}));
    }
    xs.push_back(in.recv);
  }
  // One message per other host: the tokens that select one of its experts, once each.
  h.xpos.assign(T * hosts, kNone);
  h.xcount.assign(hosts, 0);
  for (Outbound& o : outbound) {
    size_t n = 0;
    for (size_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        int64_t e = idx[t * K + k];
        if (e >= 0 && host_of[e / L] == o.host) {
          h.xpos[t * hosts + o.host] = static_cast<uint32_t>(n++);
          break;
        }
      }
    const size_t bytes = msg_bytes(n);
    STRATA_RETURN_IF_ERROR(o.stage.ensure(comm, bytes));
    std::byte* p = o.stage.b();
    const uint64_t n64 = refusing ? kRefusedRows : n;  // a refused call (no tokens): its gates mark it
    std::memcpy(p, &n64, kHead);
    auto* rec = reinterpret_cast<Record*>(p + kHead);
    std::byte* rows = p + round_up(kHead + n * K * sizeof(Record), kLine);
    size_t selections = 0;
    for (size_t t = 0; t < T; ++t) {
      uint32_t j = h.xpos[t * hosts + o.host];
      if (j == kNone) continue;
      for (int k = 0; k < K; ++k) {
        size_t i = t * K + k;
        int64_t e = idx[i];
        bool there = e >= 0 && host_of[e / L] == o.host;
        rec[j * K + k] = {there ? static_cast<int32_t>(e) : -1, h.w[i]};
        selections += there;
      }
      strata::kernels::copy(rows + j * row_bytes, xb + t * row_bytes, row_bytes);
    }
    h.xcount[o.host] = static_cast<uint32_t>(n);
    transport::TransferPtr x;
    if (use_put) {
      STRATA_ASSIGN_OR_RETURN(x, c->net->put(c->members[o.gate], tag(0, me), p, bytes, o.gate_stage));
    } else {
      STRATA_ASSIGN_OR_RETURN(x, c->net->send(c->members[o.gate], tag(0, me), p, bytes));
    }
    xs.push_back(std::move(x));
    traffic.dispatch_bytes += bytes;
    traffic.record_bytes += bytes - n * row_bytes;
    traffic.rows_sent += n;
    traffic.remote_selections += selections;
  }
  // Rows for this host's experts go straight into the windows meanwhile.
  STRATA_RETURN_IF_ERROR(send_rows_to(T, xb, idx, win, my_first, h));
  STRATA_RETURN_IF_ERROR(net_wait(xs, d, "moe dispatch"));
  // Place what the gated sources sent: row of (s, e) = first_row(s, e) + its rank among s's
  // rows for e, which is its order in the message (s sends its tokens in order).
  std::vector<uint64_t> run(E);
  for (Inbound& in : inbound) {
    const std::byte* p = in.stage.b();
    uint64_t n = 0;
    std::memcpy(&n, p, kHead);
    const bool refused = n == kRefusedRows;
    if (refused) n = 0;
    if (n > M || (!use_put && in.recv->received != msg_bytes(n)))
      return internal_error("moe::dispatch: a malformed message from rank " + std::to_string(in.src) + " (" +
                            std::to_string(in.recv->received) + " bytes, " + std::to_string(n) + " tokens)" + where());
    const auto* rec = reinterpret_cast<const Record*>(p + kHead);
    const std::byte* rows = p + round_up(kHead + n * K * sizeof(Record), kLine);
    std::fill(run.begin(), run.end(), 0);
    in.n = n;
    in.first.assign(n + 1, 0);
    in.sel.clear();
    for (size_t j = 0; j < n; ++j) {
      for (int k = 0; k < K; ++k) {
        const Record& r = rec[j * K + k];
        if (r.expert < 0) continue;
        const int dst = r.expert / L;
        if (r.expert >= E || !on_my_host(dst))
          return internal_error("moe::dispatch: rank " + std::to_string(in.src) + " sent a row for expert " +
                                std::to_string(r.expert) + ", which is not on this host" + where());
        const uint64_t row = first_row(in.src, r.expert) + run[r.expert]++;
        if (row >= win_rows)
          return internal_error("moe::dispatch: a row from rank " + std::to_string(in.src) + " falls outside rank " +
                                std::to_string(dst) + "'s window" + where());
        strata::kernels::copy(win[dst] + row * row_bytes, rows + j * row_bytes, row_bytes);
        in.sel.push_back({dst, r.w, row});
      }
      in.first[j + 1] = static_cast<uint32_t>(in.sel.size());
    }
    if (decode)
      for (int dst : shm_ranks)
        for (int l = 0; l < L; ++l)
          in_counts(dst)[static_cast<size_t>(in.src) * L + l] = refused ? kRefusedRows : run[dst * L + l];
  }
  ++traffic.calls;
  return Status::ok();
}

Status BufferImpl::xcombine(const HandleState& h, const std::vector<const std::byte*>& ys, void* out, Deadline d) {
  Posted posted{*c, {}};
  auto& xs = posted.xs;
  for (Outbound& o : outbound) {
    const size_t n = h.xcount[o.host];
    if (!n) continue;
    STRATA_RETURN_IF_ERROR(o.partial.ensure(comm, n * row_bytes));
    transport::TransferPtr x;
    if (use_put) {
      STRATA_ASSIGN_OR_RETURN(x, c->net->recv(c->members[o.gate], tag(1, o.gate), nullptr, 0));
    } else {
      STRATA_ASSIGN_OR_RETURN(x, c->net->recv(c->members[o.gate], tag(1, o.gate), o.partial.p, n * row_bytes));
    }
    xs.push_back(std::move(x));
  }
  // This host's partial sum of every token we placed, back to its source.
  for (Inbound& in : inbound) {
    if (!in.n) continue;
    STRATA_RETURN_IF_ERROR(in.back.ensure(comm, in.n * row_bytes));
    for (size_t j = 0; j < in.n; ++j) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (uint32_t q = in.first[j]; q < in.first[j + 1]; ++q) {
        const Placed& s = in.sel[q];
        kernels::accumulate(cfg.dtype, acc.data(), ys[s.dest] + s.row * row_bytes, s.w, H);
      }
      kernels::store(cfg.dtype, in.back.b() + j * row_bytes, acc.data(), H);
    }
    transport::TransferPtr x;
    if (use_put) {
      STRATA_ASSIGN_OR_RETURN(x,
                              c->net->put(c->members[in.src], tag(1, me), in.back.p, in.n * row_bytes, in.src_partial));
    } else {
      STRATA_ASSIGN_OR_RETURN(x, c->net->send(c->members[in.src], tag(1, me), in.back.p, in.n * row_bytes));
    }
    xs.push_back(std::move(x));
    traffic.combine_bytes += in.n * row_bytes;
  }
  STRATA_RETURN_IF_ERROR(net_wait(xs, d, "moe combine"));
  auto* ob = static_cast<std::byte*>(out);
  for (size_t t = 0; t < h.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < K; ++k) {
      size_t i = t * K + k;
      if (h.dest[i] < 0 || !on_my_host(h.dest[i])) continue;
      kernels::accumulate(cfg.dtype, acc.data(), ys[h.dest[i]] + h.row[i] * row_bytes, h.w[i], H);
    }
    for (const Outbound& o : outbound) {
      uint32_t j = h.xpos[t * hosts + o.host];
      if (j != kNone) kernels::accumulate(cfg.dtype, acc.data(), o.partial.b() + j * row_bytes, 1.0f, H);
    }
    kernels::store(cfg.dtype, ob + t * row_bytes, acc.data(), H);
  }
  return Status::ok();
}

void BufferImpl::count_relay(const std::vector<size_t>& rows_to, bool dispatch) {
  if (!xhost) return;
  uint64_t rows = 0;
  for (int r = 0; r < R; ++r)
    if (!on_my_host(r)) rows += rows_to[r];
  if (dispatch) {
    traffic.dispatch_bytes += rows * row_bytes;
    traffic.rows_sent += rows;
    traffic.remote_selections += rows;
    ++traffic.calls;
  } else {
    traffic.combine_bytes += rows * row_bytes;
  }
}

}  // namespace strata::moe::detail

// A collective across hosts. Every operation starts with a descriptor exchange between all
// members (one small tag message per pair, carrying the data too for an eager operation): it
// is the cross-host mismatch check, and every rank reaches the same verdict because every
// rank sees every descriptor. Then the selected algorithm (coll/select.cpp) runs: eager,
// direct or hierarchical, one file per family beside this one.

#include <cstring>
#include <optional>
#include <span>

#include "coll/net/exec.hpp"

namespace strata::detail::net {

namespace {

/// What the intra-host step of the host round found.
struct HostRound {
  char* recs = nullptr;   // one record per rank of this host, in local rank order: its
  size_t rec = 0;         // descriptor, then its data slots (see host_gather)
  Status mismatch;        // InvalidArgument when this host's ranks called different operations
  int a = -1, b = -1;     // two of them (comm ranks), when known
  bool late = false;      // the mismatch is a's kLateMismatch flag, not a difference
  uint64_t late_seq = 0;  // then the operation a found mismatched
};

/// How an eager operation's data travels (rail_round, hosts_first), and so which ranks need none
/// from the other hosts (first_round, rail_round).
struct RailData {
  bool rooted = false;    // from the root only, to everyone: broadcast, scatter
  bool to_root = false;   // from everyone, to the root only: gather, reduce
  bool per_dest = false;  // each rank has a block per destination (its record holds n): all_to_all,
                          // reduce_scatter, scatter
};
RailData rail_data(OpKind k) {
  return {k == OpKind::Broadcast || k == OpKind::Scatter, k == OpKind::Gather || k == OpKind::Reduce,
          k == OpKind::AllToAll || k == OpKind::ReduceScatter || k == OpKind::Scatter};
}

/// Whether this rank needs no data from the other hosts in an eager operation of `op`'s kind
/// and `bytes` per block, so that it returns without waiting for their first messages
/// (CommImpl::LateCheck): the root's host of a broadcast or scatter (meeting the other hosts on
/// its rails; else the root alone), the ranks of a gather or reduce but the root, and every
/// rank of a rooted operation without data.
bool needs_nothing_back(const CommImpl& c, const Op& op, size_t bytes, bool rails) {
  const RailData rd = rail_data(op.kind);
  if (!rd.rooted && !rd.to_root) return false;
  if (bytes == 0) return true;
  if (rd.to_root) return c.rank != op.root;
  return rails ? c.host_of[c.rank] == c.host_of[op.root] : c.rank == op.root;
}

/// Where a first round's messages land: scratch block 2, or, when this rank does not wait for
/// them (x.defer), the area of a new late record of this operation (CommImpl::LateCheck),
/// untouched until a later operation read them.
Result<char*> receive_area(NetExec& x, const OpDesc& mine, bool rails, size_t bytes) {
  CommImpl& c = x.c;
  if (x.defer) {
    CommImpl::LateCheck& l = c.late.emplace_back();
    if (!c.late_spare.empty()) {
      l.area = std::move(c.late_spare.back());
      c.late_spare.pop_back();
    }
    l.area.resize(bytes);
    l.op = x.op, l.mine = mine, l.rails = rails;
    return l.area.data();
  }
  STRATA_ASSIGN_OR_RETURN(void* p, c.scratch_block(2, bytes));
  return static_cast<char*>(p);
}

/// A first-round receive from comm rank r, whose record lands at offset `at` of the receive
/// area: waited for by this operation, or, deferred, kept in its late record as soon as it is
/// posted, so that whatever ends the operation early, the receive is waited for or cancelled
/// (check_late, CommImpl::drop_late) before the area is reused or freed.
void keep(NetExec& x, int r, const transport::TransferPtr& t, size_t at) {
  if (!x.defer) {
    x.xs.push_back(t);
    return;
  }
  CommImpl::LateCheck& l = x.c.late.back();
  l.from.push_back(r), l.rx.push_back(t), l.at.push_back(at);
}

/// A first message longer than any of this operation's (`ws`, from the wait): a mismatch.
Status overlong_mismatch(const OpDesc& mine, int me, const Status& ws) {
  return Status(Code::InvalidArgument,
                "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " + std::to_string(me) +
                    " called " + coll::describe(mine) + " (" + ws.message() + ")",
                ws.peer());
}

/// The first round of every operation: each member sends every other one message holding
/// its descriptor, then its count vector (v-collectives), then, for an eager operation, that
/// peer's data. It is the cross-host mismatch check (the form of check_descriptors in
/// coll/shm/run.cpp), and every rank reaches the same verdict because every rank sees every
/// descriptor. Eager data that arrived is left at x.eager_in[r].
/// With `host` (the host round found this host's ranks agree), the round goes to the ranks
/// on other hosts only: this host's descriptors are in `host`'s records.
Status first_round(NetExec& x, const OpDesc& mine, const Eager* eager, const HostRound* host) {
  CommImpl& c = x.c;
  const int n = c.size, me = c.rank;
  auto by_net = [&](int r) { return !host || c.host_of[r] != c.host_of[me]; };
  const auto kind = x.op.kind;
  const size_t head = first_message_head(kind, n);
  const bool has_vec = head > sizeof(OpDesc);
  std::vector<uint64_t> out_head(head / sizeof(uint64_t));
  std::memcpy(out_head.data(), &mine, sizeof mine);
  if (has_vec)
    for (int j = 0; j < n; ++j) out_head[sizeof(OpDesc) / sizeof(uint64_t) + j] = x.op.counts[j];
  if (kind == OpKind::AllToAllV)  // then the receive counts (read_first_message)
    for (int j = 0; j < n; ++j) out_head[sizeof(OpDesc) / sizeof(uint64_t) + n + j] = x.op.rcounts[j];
  // Each message is received in three parts: the record; the data, straight into its place
  // in the output (or into this receive area when it is to be combined first); and a spill
  // area with room for the largest first message of any operation, so that a peer that
  // called something else is read and named rather than cut off (only a mismatch reaches it).
  auto align = [](size_t v) { return (v + 63) & ~size_t{63}; };
  const size_t head_al = align(head), spill = align(longest_first_message(n, c.local ? c.local->size : 1));
  size_t body_al = 0;
  if (eager)
    for (int r = 0; r < n; ++r)
      if (!eager->into[r]) body_al = std::max(body_al, align(eager->from_bytes[r]));
  // A rank that receives no data (the root of a broadcast or scatter, the ranks of a gather or
  // reduce but the root) does not wait for the others' messages (CommImpl::LateCheck).
  const bool defer = x.defer;
  STRATA_ASSIGN_OR_RETURN(char* heads, receive_area(x, mine, false, n * (head_al + body_al) + spill));
  char* spill_at = heads + n * head_al;
  char* bodies = spill_at + spill;
  std::vector<transport::TransferPtr> rx(n);
  x.eager_in.assign(n, nullptr);
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    if (!by_net(r)) continue;
    transport::Part parts[3] = {{heads + r * head_al, head}, {}, {spill_at, spill}};
    if (eager && eager->from_bytes[r]) {
      x.eager_in[r] = eager->into[r] ? eager->into[r] : bodies + r * body_al;
      parts[1] = {x.eager_in[r], eager->from_bytes[r]};
    }
    STRATA_ASSIGN_OR_RETURN(rx[r], x.net().recv_parts(x.g(r), make_tag(c, kDesc, x.seq, r), parts));
    keep(x, r, rx[r], static_cast<size_t>(r) * head_al);
  }
  for (int k = 1; k < n; ++k) {
    int r = (me + k) % n;
    if (!by_net(r)) continue;
    const bool data = eager && eager->to_bytes[r];
    STRATA_ASSIGN_OR_RETURN(auto t, x.net().send2(x.g(r), make_tag(c, kDesc, x.seq, me), out_head.data(), head,
                                                  data ? eager->to[r] : nullptr, data ? eager->to_bytes[r] : 0));
    if (data) c.direct_bytes.fetch_add(eager->to_bytes[r], std::memory_order_relaxed);
    c.desc_messages.fetch_add(1, std::memory_order_relaxed);
    x.xs.push_back(std::move(t));
  }
  // Deferred, only this rank's sends are waited for.
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
  for (int r = 0; r < n && !defer; ++r) {
    if (r == me) continue;
    if (by_net(r)) {
      STRATA_ASSIGN_OR_RETURN(x.descs[r], read_first_message(x.op, mine, me, n, r, heads + r * head_al, rx[r]->received,
                                                             eager ? eager->from_bytes[r] : 0));
      continue;
    }
    // The same checks of the fields only the peer knows as for a message (no eager operation
    // comes here: they all meet their rails, see hosts_first).
    const char* rec = host->recs + static_cast<size_t>(c.local_of[r]) * host->rec;
    STRATA_ASSIGN_OR_RETURN(x.descs[r], read_first_message(x.op, mine, me, n, r, rec, head, 0));
  }
  // The v-forms meet every rank here (hosts_first passes no host round), so every rank's
  // counts are at hand.
  if (kind == OpKind::AllToAllV && !defer && !host) {
    auto counts = [&](int r) {
      return reinterpret_cast<const uint64_t*>(heads + static_cast<size_t>(r) * head_al + sizeof(OpDesc));
    };
    return check_all_to_all_v_counts(
        mine, me, n, [&](int r) { return r == me ? x.op.counts.data() : counts(r); },
        [&](int r) { return r == me ? x.op.rcounts.data() : counts(r) + n; });
  }
  return Status::ok();
}

// ---- the host round -----------------------------------------------------------------------
// With several ranks on every host and as many on each, an operation first compares the
// descriptors of this host's ranks through shared memory (an intra-host all_gather of one
// record per rank). barrier, every eager operation without count vectors, and the
// hierarchical all_reduce, all_gather and reduce_scatter then meet the other hosts on their
// rails only: one message to and from the rank of equal local index on each other host,
// instead of one per member (2 hosts x 2 ranks: one message per rank instead of three, the
// one to the host's other rank included). Eager, the records carry each rank's input, and a
// rank sends its rail peer what that peer needs from its whole host: every local input
// (all_reduce, all_gather; gather and reduce to the root only, along its rail), every local
// rank's block for the peer (all_to_all, reduce_scatter), or the root's input or block for
// the peer (broadcast, scatter: from the root's host only). Every rank so still has the data
// it needs from all n ranks (and reduces it in rank order: the same bits as the all-pairs
// round), with as many bytes between hosts. The other operations (the non-eager direct
// forms) then meet every member on the other hosts (their descriptors, with output offsets,
// are needed pair by pair) but not this host's ranks, whose records already hold them (2 hosts
// x 2 ranks: two messages per rank instead of three). The v-forms keep the all-pairs round,
// this host's pairs included: their count vectors are compared pair by pair.
//
// Why a mismatch cannot leave a rank waiting: whether a rank meets its rails only is a function
// of its descriptor, so the ranks of a host, once they agree, choose alike. A rank that finds a
// mismatch (on its host, or in a rail peer's message) sends its descriptor to every member on
// the other hosts it has not sent to, and waits for one message from each. Every rank finds
// it: a rail peer whose descriptor equals this rank's and which reports no mismatch on its own
// host speaks for that whole host, so if every rail peer does, every member called the same.
// Ranks of the other rounds send to every member on the other hosts anyway, and the ranks of a
// host that agree all skip each other. So each pair of ranks on different hosts exchanges
// exactly one message and no receive is left posted.

/// Whether operations on `c` open with the host round.
bool host_round(const CommImpl& c) {
  if (!c.local || c.local->size < 2 || c.host_members.size() < 2) return false;
  for (const auto& m : c.host_members)
    if (m.size() != c.host_members[0].size()) return false;
  return true;
}

/// Whether an operation described by `d` meets the other hosts on its rails only: every eager
/// kind (what a rank needs from a host travels in one message from its rail peer there), the
/// hierarchical all_reduce, all_gather and reduce_scatter (their network steps are rail steps),
/// and barrier.
/// Not the v-forms: their count vectors are compared pair by pair, which the intra-host step
/// does not do.
bool rails_only(const OpDesc& d) {
  const auto algo = static_cast<coll::Algo>(d.algo);
  const auto kind = static_cast<OpKind>(d.kind);
  if (kind == OpKind::AllReduce || kind == OpKind::AllGather || kind == OpKind::ReduceScatter)
    return algo == coll::Algo::NetEager || algo == coll::Algo::NetHierarchical;
  if (kind == OpKind::Broadcast || kind == OpKind::AllToAll || kind == OpKind::Scatter || kind == OpKind::Gather ||
      kind == OpKind::Reduce)
    return algo == coll::Algo::NetEager;
  // A rail peer's message is sent after its host round, which every rank of its host reached.
  return kind == OpKind::Barrier;
}

/// The intra-host all_gather of one record per rank: its descriptor, then `slots.size()`
/// data slots of `slot` bytes, slot j from slots[j] (left unwritten where that is nullptr).
Result<HostRound> host_gather(NetExec& x, const OpDesc& mine, std::span<const char* const> slots, size_t slot) {
  CommImpl& c = x.c;
  const size_t L = static_cast<size_t>(c.local->size);
  HostRound h;
  h.rec = (sizeof(OpDesc) + slots.size() * slot + 63) & ~size_t{63};
  // This rank's record is not in the heap, so that up to kSlotInputBytes it rides in the
  // control-block slot: one synchronisation and no closing one (a heap input needs a
  // closing step, for the peers' reads of it).
  c.host_record.resize(h.rec);
  char* in = c.host_record.data();
  STRATA_ASSIGN_OR_RETURN(void* s, c.scratch_block(0, h.rec * L));
  h.recs = static_cast<char*>(s);
  std::memcpy(in, &mine, sizeof mine);
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j] && slot) std::memcpy(in + sizeof mine + j * slot, slots[j], slot);
  Op g = local_op(x, OpKind::AllGather, in, h.recs, {}, ReduceOp::Sum);
  g.dtype = DataType::UInt8;
  g.count = h.rec;
  // A refused call's record is shorter than most: the exchange itself says who refused.
  if (coll::refused(static_cast<OpKind>(mine.kind), mine.root)) g.root = coll::kRootRefused;
  Status st = run_collective(*c.local, g);
  const std::vector<int>& lm = c.host_members[c.host_of[c.rank]];
  if (is_refusal(st) && st.peer() >= 0 && static_cast<size_t>(st.peer()) < L) {
    h.a = lm[static_cast<size_t>(st.peer())], h.b = kPairRefused;
    h.mismatch = refused_mismatch(mine, c.rank, h.a);
    return h;
  }
  if (st.code() == Code::InvalidArgument) {
    // The records differ in size, and so do the calls; every rank of the host sees it.
    h.mismatch =
        Status(Code::InvalidArgument, "collective mismatch on operation #" + std::to_string(mine.seq) + ": rank " +
                                          std::to_string(c.rank) + " called " + coll::describe(mine) +
                                          " and another rank on its host a different operation (" + st.message() + ")");
    return h;
  }
  STRATA_RETURN_IF_ERROR(st.with_context("intra-host descriptor check: "));
  for (size_t j = 0; j < L && h.mismatch.is_ok(); ++j) {
    const int r = lm[j];
    if (r == c.rank) continue;
    OpDesc d;
    std::memcpy(&d, h.recs + j * h.rec, sizeof d);
    if (d.flags & kLateMismatch) {
      h.mismatch = late_mismatch(mine, c.rank, r, d.in_off, r), h.a = r, h.late = true, h.late_seq = d.in_off;
      break;
    }
    Status cmp = compare_algorithm(mine, c.rank, d, r);
    if (cmp.is_ok()) cmp = compare_descriptor(x.op, mine, c.rank, d, nullptr, r, c.size);
    if (cmp.is_ok()) continue;
    h.mismatch = cmp;
    if (coll::refused(static_cast<OpKind>(d.kind), d.root)) h.a = r, h.b = kPairRefused;
    else h.a = c.rank, h.b = r;
  }
  return h;
}

/// After a mismatch: `d` to every member on another host that `sent` does not mark, one
/// message from each that `got` does not mark (each sends one, see above), then `why`.
Status settle_mismatch(NetExec& x, const OpDesc& d, const std::vector<char>& sent, const std::vector<char>& got,
                       Status why) {
  CommImpl& c = x.c;
  const int n = c.size, me = c.rank, hm = c.host_of[me];
  const transport::WaitPolicy pol = c.policy(x.deadline);
  Status failed;  // a failure (not a mismatch) on the way: reported instead of `why`
  std::vector<transport::TransferPtr> sends;
  for (int r = 0; r < n && failed.is_ok(); ++r) {
    if (c.host_of[r] == hm || sent[r]) continue;
    auto t = x.net().send(x.g(r), make_tag(c, kDesc, x.seq, me), &d, sizeof d);
    if (!t.is_ok()) {
      failed = t.status();
      break;
    }
    c.desc_messages.fetch_add(1, std::memory_order_relaxed);
    sends.push_back(std::move(t.value()));
  }
  // The messages are read one at a time into one area with room for the longest first message
  // of any operation (they are only drained): memory for one, not for every member.
  std::vector<char> area(longest_first_message(n, c.local->size));
  for (int r = 0; r < n && failed.is_ok(); ++r) {
    if (c.host_of[r] == hm || got[r]) continue;
    auto t = x.net().recv(x.g(r), make_tag(c, kDesc, x.seq, r), area.data(), area.size());
    Status ws = t.is_ok() ? x.net().wait({t.value()}, pol, "mismatch notice") : t.status();
    // A message longer than any first message is a mismatch too: only a failure is news.
    if (!ws.is_ok() && ws.code() != Code::InvalidArgument) failed = ws;
  }
  // `d` is read until every send completed, whatever happened above.
  if (!sends.empty()) {
    Status ws = x.net().wait(sends, pol, "mismatch notice");
    if (failed.is_ok() && !ws.is_ok()) failed = ws;
  }
  return failed.is_ok() ? why : failed;
}

/// The round between rail peers (after host_gather): each sends the others its descriptor
/// and, eager, what each needs from its host (see below); the eager form is then finished
/// here (`done`).
Status rail_round(NetExec& x, const OpDesc& mine, const HostRound& h, bool eager, bool& done) {
  CommImpl& c = x.c;
  const int n = c.size, me = c.rank, hm = c.host_of[me], li = c.local_of[me];
  const int H = static_cast<int>(c.host_members.size());
  const size_t L = c.host_members[hm].size();
  const size_t b = eager ? x.op.count * x.esz : 0;
  // Eager, what a rank of another host needs from this host travels in one message from its
  // rail peer here: from every local rank its input (all_reduce, all_gather) or its block for
  // that rank (all_to_all, reduce_scatter); from the root only its input (broadcast) or its
  // block for that rank (scatter), so only the root's host sends data. gather and reduce go
  // the other way: the root's rail (the ranks of its local index) carries every other host's
  // inputs to the root itself. The records hold each local rank's input (see hosts_first).
  const OpKind kind = x.op.kind;
  const RailData rd = rail_data(kind);
  const bool rooted = rd.rooted, to_root = rd.to_root, per_dest = rd.per_dest;
  const int root_host = rooted || to_root ? c.host_of[x.op.root] : -1;
  const size_t root_j = rooted || to_root ? static_cast<size_t>(c.local_of[x.op.root]) : 0;
  // The data this rank receives from its rail peer on host g, and sends its rail peer there.
  auto body_from = [&](int g) -> size_t {
    if (rooted) return g == root_host ? b : 0;
    if (to_root) return me == x.op.root ? L * b : 0;
    return L * b;
  };
  auto body_to = [&](int g) -> size_t {
    if (rooted) return hm == root_host ? b : 0;
    if (to_root) return g == root_host && static_cast<size_t>(li) == root_j ? L * b : 0;
    return L * b;
  };
  // Where local rank j's data for rank r lies in its record.
  auto rec_for = [&](size_t j, int r) {
    return h.recs + j * h.rec + sizeof(OpDesc) + (per_dest ? static_cast<size_t>(r) * b : 0);
  };
  // A rank that needs nothing from the other hosts does not wait for their messages (see
  // CommImpl::LateCheck): the root's host of a broadcast or scatter, the ranks of a gather or
  // reduce but the root. Never the operation that reports a late mismatch.
  const bool defer = x.defer;
  auto align = [](size_t v) { return (v + 63) & ~size_t{63}; };
  const size_t head_al = align(sizeof(OpDesc)), body_al = align(L * b);
  const size_t spill = align(longest_first_message(n, static_cast<int>(L)));
  STRATA_ASSIGN_OR_RETURN(char* heads, receive_area(x, mine, true, H * (head_al + body_al) + spill));
  char* bodies = heads + H * head_al;
  char* spill_at = bodies + H * body_al;
  // What this rank sends the rail peer on host g: the root's data straight from its record,
  // else the L local ranks' pieces packed (once when every rail peer gets the same).
  std::vector<const char*> out_body(H, nullptr);
  bool sends = false;
  for (int g = 0; g < H; ++g) sends |= g != hm && body_to(g) > 0;
  if (sends && rooted) {
    for (int g = 0; g < H; ++g)
      if (g != hm) out_body[g] = rec_for(root_j, c.host_members[g][li]);
  } else if (sends) {
    const int packs = per_dest ? H : 1;
    STRATA_ASSIGN_OR_RETURN(void* ob, c.scratch_block(1, static_cast<size_t>(packs) * body_al));
    const char* shared = nullptr;
    for (int g = 0; g < H; ++g) {
      if (g == hm || !body_to(g)) continue;
      if (!per_dest && shared) {
        out_body[g] = shared;
        continue;
      }
      char* o = static_cast<char*>(ob) + (per_dest ? static_cast<size_t>(g) * body_al : 0);
      for (size_t j = 0; j < L; ++j) std::memcpy(o + j * b, rec_for(j, c.host_members[g][li]), b);
      out_body[g] = shared = o;
    }
  }
  std::vector<transport::TransferPtr> rx(H);
  std::vector<char> sent(n, 0), got(n, 0);
  for (int k = 1; k < H; ++k) {
    const int g = (hm + k) % H, r = c.host_members[g][li];
    transport::Part parts[3] = {
        {heads + g * head_al, sizeof(OpDesc)}, {bodies + g * body_al, body_from(g)}, {spill_at, spill}};
    STRATA_ASSIGN_OR_RETURN(rx[g], x.net().recv_parts(x.g(r), make_tag(c, kDesc, x.seq, r), parts));
    keep(x, r, rx[g], static_cast<size_t>(g) * head_al);
    got[r] = 1;
  }
  for (int k = 1; k < H; ++k) {
    const int g = (hm + k) % H, r = c.host_members[g][li];
    const size_t body = body_to(g);
    STRATA_ASSIGN_OR_RETURN(
        auto t, x.net().send2(x.g(r), make_tag(c, kDesc, x.seq, me), &mine, sizeof mine, out_body[g], body));
    if (body) c.direct_bytes.fetch_add(body, std::memory_order_relaxed);
    c.desc_messages.fetch_add(1, std::memory_order_relaxed);
    x.xs.push_back(std::move(t));
    sent[r] = 1;
  }
  if (defer) c.late.back().sent = sent, c.late.back().got = got;
  // Deferred, only this rank's sends are waited for.
  Status ws = x.wait(coll::to_string(x.op.kind));
  Status why;
  if (!ws.is_ok()) {
    if (ws.code() != Code::InvalidArgument) return ws;
    why = overlong_mismatch(mine, me, ws);
  }
  x.descs.assign(n, mine);
  for (auto& d : x.descs) d.flags &= ~kOutHeap;  // members not met: never written to
  for (size_t j = 0; j < L; ++j) std::memcpy(&x.descs[c.host_members[hm][j]], h.recs + j * h.rec, sizeof(OpDesc));
  for (int k = 1; k < H && why.is_ok() && !defer; ++k) {
    const int g = (hm + k) % H, r = c.host_members[g][li];
    auto d = read_first_message(x.op, mine, me, n, r, heads + g * head_al, rx[g]->received, body_from(g));
    if (d.is_ok()) x.descs[r] = d.value();
    else why = d.status();
  }
  if (!why.is_ok()) return settle_mismatch(x, mine, sent, got, why);
  if (!eager) return Status::ok();
  done = true;
  if (!b) return Status::ok();
  // Rank r's data for this rank: in r's record on this host, else in its host's message.
  auto src_of = [&](int r) -> const char* {
    const int g = c.host_of[r];
    const size_t j = static_cast<size_t>(c.local_of[r]);
    if (g == hm) return rec_for(j, me);
    return bodies + g * body_al + (rooted ? 0 : j * b);
  };
  const size_t own = per_dest ? static_cast<size_t>(me) * b : 0;  // this rank's part of its input
  auto place = [&](char* dst, int r) {
    const char* src = r == me ? x.in + own : src_of(r);
    if (dst != src) kernels::copy(dst, src, b);
  };
  if (to_root && me != x.op.root) return Status::ok();
  switch (kind) {
    case OpKind::Broadcast:
    case OpKind::Scatter: place(x.out, x.op.root); break;
    case OpKind::AllGather:
    case OpKind::AllToAll:
    case OpKind::Gather:
      for (int r = 0; r < n; ++r) place(x.out + static_cast<size_t>(r) * b, r);
      break;
    default: {
      // all_reduce, reduce_scatter, reduce: n sources in rank order, so all_reduce's result is
      // the same bits everywhere, and each the same as the all-pairs round's.
      std::vector<const void*> srcs(n);
      for (int r = 0; r < n; ++r) srcs[r] = src_of(r);
      kernels::reduce(x.op.dtype, x.op.rop, x.out, srcs.data(), n, x.op.count, n);
    }
  }
  return Status::ok();
}

/// Whether every first message of late record `l` has arrived, as far as the progress the
/// operations since drove has seen (driving it here for every record, every operation, cost a
/// stream of small broadcasts more than the window saved).
bool arrived(const CommImpl::LateCheck& l) {
  for (const auto& t : l.rx)
    if (!t->done.load(std::memory_order_acquire)) return false;
  return true;
}

/// Reads and checks the oldest late record's first messages (CommImpl::LateCheck), waiting for
/// them as its first round would have, and retires the record. A mismatch is settled with the
/// other hosts as there (each pair of ranks on different hosts still exchanges one message) and
/// returned (InvalidArgument, `seq` the operation's): the caller then fails the current
/// operation on every rank.
Status check_late(CommImpl& c, Deadline deadline, uint32_t& seq) {
  CommImpl::LateCheck& l = c.late.front();
  struct Retire {
    CommImpl& c;
    ~Retire() {
      c.late_spare.push_back(std::move(c.late.front().area));
      c.late.pop_front();
    }
  } retire{c};
  seq = l.mine.seq;
  NetExec x(c, l.op, deadline);
  x.seq = l.mine.seq;
  x.esz = dtype_size(l.op.dtype);
  x.xs.swap(l.rx);
  auto when = [&] {
    return "operation #" + std::to_string(l.mine.seq) + " (" + coll::describe(l.mine) +
           ", which returned before the other hosts' descriptors arrived and is checked as a later operation "
           "starts): ";
  };
  const std::vector<transport::TransferPtr> rx = x.xs;  // x.wait empties x.xs
  Status ws = x.wait(coll::to_string(l.op.kind));
  if (!ws.is_ok() && ws.code() != Code::InvalidArgument) return ws.with_context(when());
  Status why;
  if (!ws.is_ok()) why = overlong_mismatch(l.mine, c.rank, ws);
  for (size_t i = 0; i < rx.size() && why.is_ok(); ++i) {
    auto d = read_first_message(l.op, l.mine, c.rank, c.size, l.from[i], l.area.data() + l.at[i], rx[i]->received, 0);
    if (!d.is_ok()) why = d.status();
  }
  if (why.is_ok()) return Status::ok();
  if (l.rails) why = settle_mismatch(x, l.mine, l.sent, l.got, why);
  return why.with_context(when());
}

/// The first round of a communicator with the host round (see above).
Status hosts_first(NetExec& x, const OpDesc& mine, const Eager* eager, bool& done) {
  CommImpl& c = x.c;
  const bool rails = rails_only(mine), eager_rail = rails && eager != nullptr;
  // The other operations without count vectors (none of them eager) meet this host's ranks
  // in this step only, and the network round goes to the other hosts. The v-forms' count
  // vectors are compared pair by pair in the all-pairs round, this host's pairs included.
  const bool here = !rails && first_message_head(x.op.kind, c.size) == sizeof(OpDesc);
  if (!rails && eager)
    return internal_error(std::string("eager ") + coll::to_string(x.op.kind) + " without a rail round");
  std::vector<const char*> slots;
  // A broadcast's or scatter's ranks but its root have no input to publish: their slot stays
  // unwritten. all_to_all, reduce_scatter and scatter publish the whole input (n blocks).
  const RailData rd = rail_data(x.op.kind);
  size_t slot = x.op.count * x.esz;
  if (eager_rail) {
    slots = {rd.rooted && c.rank != x.op.root ? nullptr : x.in};
    if (rd.per_dest) slot *= static_cast<size_t>(c.size);
  }
  STRATA_ASSIGN_OR_RETURN(HostRound h, host_gather(x, mine, slots, slots.empty() ? 0 : slot));
  // This rank found an earlier operation mismatched (its flag is in `mine`, and the host round
  // showed it to this host's ranks): every rank fails this one; run() names the cause.
  if (mine.flags & kLateMismatch) h.mismatch = Status(Code::InvalidArgument, "an earlier operation did not match");
  if (!h.mismatch.is_ok()) {
    // This rank's own late records first, waiting for them: a rank of another host that found
    // one of those operations mismatched waits, in its settling, for this rank's notice, and
    // would not take part in this settling before it had it.
    while (!c.late.empty()) {
      uint32_t seq = 0;
      Status ls = check_late(c, x.deadline, seq);
      if (!ls.is_ok() && ls.code() != Code::InvalidArgument) return ls;
    }
    // This rank refused its call: it is the one to name on the other hosts.
    if (!h.late && coll::refused(static_cast<OpKind>(mine.kind), mine.root)) h.a = c.rank, h.b = kPairRefused;
    OpDesc flagged = mine;
    if (h.late) {
      flagged.flags |= kLateMismatch;
      flagged.in_seg = static_cast<uint32_t>(h.a);
      flagged.in_off = h.late_seq;
    } else if (!(mine.flags & kLateMismatch)) {
      flagged.flags |= kHostMismatch;
      flagged.in_seg = static_cast<uint32_t>(h.a);
      flagged.in_off = static_cast<uint64_t>(static_cast<int64_t>(h.b));
    }
    return settle_mismatch(x, flagged, std::vector<char>(c.size, 0), std::vector<char>(c.size, 0), h.mismatch);
  }
  if (!rails) return first_round(x, mine, eager, here ? &h : nullptr);
  return rail_round(x, mine, h, eager_rail, done);
}

}  // namespace

Status run(CommImpl& c, Op& op, coll::Algo algo) {
  auto timeout = op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout;
  NetExec x(c, op, Deadline::after(timeout));
  // A step that fails after posting receives returns before waiting for them: they are
  // cancelled on the way out, so that no later message lands in this call's buffers.
  struct CancelLeftovers {
    NetExec& x;
    ~CancelLeftovers() {
      if (!x.xs.empty()) x.net().cancel(x.xs);
    }
  } leftovers{x};
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
  // A broadcast root's input in its heap: the other ranks of its host read their blocks of it
  // there and send them on (broadcast_hier; the other forms do not look it up).
  if (hier && op.kind == OpKind::Broadcast && c.rank == op.root && op.count)
    if (auto ref = c.ctx->heap->locate(op.in, op.count * x.esz)) {
      d.flags |= kInHeap;
      d.in_seg = ref->seg;
      d.in_off = ref->offset;
    }
  const char* name = coll::to_string(op.kind);
  std::optional<Eager> eager;
  if (algo == coll::Algo::NetEager) {
    STRATA_ASSIGN_OR_RETURN(eager, eager_plan(x));
  }
  // The algorithm, which depends on CollOptions::algorithm too, is published: ranks that
  // would run different ones fail as a mismatch instead of waiting for messages that never come.
  d.algo = static_cast<uint8_t>(algo);
  // Earlier operations' messages this rank did not wait for, first, oldest first: all of them
  // when this operation waits for the other hosts anyway; else those that have all arrived, and
  // the oldest once the window is full. Checked as soon as they are in, a mismatch is settled
  // promptly with the ranks of other hosts that found it too and wait for this rank's notice.
  // A mismatch found there fails this operation on every rank (the flag tells the others); the
  // communicator stays usable, as after any mismatch.
  const bool host = host_round(c);
  x.defer = eager && needs_nothing_back(c, op, op.count * x.esz, host && rails_only(d));
  Status late;
  uint32_t late_seq = 0;
  while (late.is_ok() && !c.late.empty() &&
         (!x.defer || c.late.size() >= CommImpl::kLateWindow || arrived(c.late.front())))
    late = check_late(c, x.deadline, late_seq);
  if (late.code() == Code::InvalidArgument) {
    d.flags |= kLateMismatch;
    d.in_seg = static_cast<uint32_t>(c.rank);
    d.in_off = late_seq;
    x.defer = false;
  }
  bool done = false;  // the operation completed in its first round
  Status st;
  if (!late.is_ok() && late.code() != Code::InvalidArgument) st = late;
  else if (host) st = hosts_first(x, d, eager ? &*eager : nullptr, done);
  else st = first_round(x, d, eager ? &*eager : nullptr, nullptr);
  // Whatever the peers' descriptors held, this rank fails with the cause it found.
  if (late.code() == Code::InvalidArgument && (st.is_ok() || st.code() == Code::InvalidArgument)) st = late;
  if (st.is_ok() && done) {
    // Finished in its first round (an eager operation between rails).
  } else if (st.is_ok() && eager) {
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

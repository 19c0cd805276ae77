// Point-to-point across hosts: a send is its header (the receiver checks tag, dtype and
// count) with the data of a small message riding along, or followed by the data straight
// from the caller's buffer; a receive lands straight in the caller's buffer. A receive from
// any rank probes each sender's next header and sets aside one whose tag does not match.

#include <cstring>
#include <memory>
#include <new>

#include "coll/net/exec.hpp"

namespace strata::detail {

using coll::kEagerBytes;
using coll::Op;
using net::kP2pData;
using net::kP2pHeader;
using net::make_tag;

Result<std::shared_ptr<WorkState>> post_send_net(CommImpl& c, const Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const int peer = op.peer;
  const uint32_t s = ++c.send_seq[peer];
  auto hdr = std::make_shared<P2pHeader>();
  hdr->tag = op.tag;
  hdr->dtype = static_cast<uint32_t>(op.dtype);
  hdr->count = op.count;
  const size_t bytes = op.count * dtype_size(op.dtype);
  const int g = c.members[peer];
  std::vector<transport::TransferPtr> xs;
  // Straight from the caller's buffer (heap or not): nothing is staged. A small message rides
  // with its header (one message); a larger one follows it, so that the receiver, having
  // checked the header, receives it in place.
  const bool eager = bytes <= kEagerBytes;
  STRATA_ASSIGN_OR_RETURN(auto h, c.net->send2(g, make_tag(c, kP2pHeader, s, c.rank), hdr.get(), sizeof *hdr,
                                               eager ? op.in : nullptr, eager ? bytes : 0));
  xs.push_back(std::move(h));
  if (!eager) {
    STRATA_ASSIGN_OR_RETURN(auto dx, c.net->send_bulk(g, make_tag(c, kP2pData, s, c.rank), op.in, bytes));
    xs.push_back(std::move(dx));
  }
  c.direct_bytes.fetch_add(bytes, std::memory_order_relaxed);
  auto w = std::make_shared<WorkState>();
  w->rank = c.rank;
  auto self = c.shared_from_this();
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  w->poll = [self, xs, hdr, peer, d](bool block) -> Status {
    CommImpl& cc = *self;
    if (!block) {
      for (const auto& x : xs)
        if (!cc.net->test(*x)) return Status(Code::Unavailable, "pending");
      for (const auto& x : xs)
        if (!x->status.is_ok()) return x->status;
      return Status::ok();
    }
    Status st = cc.net->wait(xs, cc.policy(d), "send");
    if (!st.is_ok()) {
      Status full(st.code(),
                  st.message() + " on rank " + std::to_string(cc.rank) + " sending to rank " + std::to_string(peer),
                  peer);
      cc.set_broken(full);  // as after any timeout (SEMANTICS: errors)
      return full;
    }
    return st;
  };
  return w;
}

Status recv_net(CommImpl& c, const Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const int peer = op.peer, g = c.members[peer];
  const uint32_t s = ++c.recv_seq[peer];
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  auto fail = [&](Status st) {
    Status full(st.code(),
                st.message() + " on rank " + std::to_string(c.rank) + " receiving from rank " + std::to_string(peer),
                peer);
    // A mismatch leaves the communicator usable; a timeout revokes it, as everywhere.
    if (st.code() != Code::InvalidArgument) c.set_broken(full);
    return full;
  };
  // The header, then the data of a small message (see post_send_net) straight into the
  // receive buffer; a spill area takes what a mismatching sender sent beyond that.
  const size_t want = op.count * dtype_size(op.dtype);
  P2pHeader h;
  size_t received = 0;
  // A receive from any rank may already have taken this header (recv_any_net): then its
  // data, if it rode along, waits in the stash rather than in the caller's buffer.
  CommImpl::StashedHeader* stashed = nullptr;
  if (!c.net_stash.empty() && c.net_stash[peer].full) {
    stashed = &c.net_stash[peer];
    stashed->full = false;
    h = stashed->h;
    received = stashed->received;
  } else {
    auto spill = std::make_unique_for_overwrite<char[]>(kEagerBytes);
    const bool small = want <= kEagerBytes;
    const transport::Part parts[3] = {
        {&h, sizeof h}, {small ? op.out : nullptr, small ? want : 0}, {spill.get(), kEagerBytes}};
    STRATA_ASSIGN_OR_RETURN(auto hx, c.net->recv_parts(g, make_tag(c, kP2pHeader, s, peer), parts));
    Status st = c.net->wait({hx}, c.policy(d), "recv");
    if (!st.is_ok()) return fail(st);
    received = hx->received;
  }
  if (received < sizeof(P2pHeader))
    return fail(Status(Code::InvalidArgument,
                       "rank " + std::to_string(peer) + " sent a " + std::to_string(received) + "-byte message header",
                       peer));
  const bool match = h.tag == op.tag && h.dtype == static_cast<uint32_t>(op.dtype) && h.count == op.count;
  auto announced = p2p_data_bytes(h, peer);
  if (!announced.is_ok()) {
    // Nothing tells how much data follows: the two sides are out of step for good.
    Status full = fail(announced.status());
    c.set_broken(full);
    return full;
  }
  const size_t got = announced.value();
  if (got <= kEagerBytes) {
    // The data came with the header: in place when it matches this receive.
    if (received != sizeof h + got)
      return fail(Status(Code::InvalidArgument,
                         "rank " + std::to_string(peer) + " sent " + std::to_string(received - sizeof h) +
                             " data bytes for " + p2p_describe("send", h),
                         peer));
    if (stashed && match) std::memcpy(op.out, stashed->data.data(), want);
  } else {
    // On a mismatch the data is still taken (into a discard buffer), so the sender completes
    // and both sides stay in step for the next message.
    // The size is the peer's word: reserved, not touched, and refused rather than thrown over
    // when it cannot be (only the bytes that really arrive are written).
    std::unique_ptr<char[]> discard(match ? nullptr : new (std::nothrow) char[got]);
    if (!match && !discard) {
      Status full = fail(Status(Code::InvalidArgument,
                                "rank " + std::to_string(peer) + " announced " + std::to_string(got) + " bytes for " +
                                    p2p_describe("send", h) + ", more than this rank can set aside to discard",
                                peer));
      c.set_broken(full);
      return full;
    }
    STRATA_ASSIGN_OR_RETURN(auto dx, c.net->recv_bulk(g, make_tag(c, kP2pData, s, peer), match ? op.out : discard.get(),
                                                      match ? want : got));
    Status st = c.net->wait({dx}, c.policy(d), "recv");
    if (!st.is_ok()) return fail(st);
  }
  if (!match) {
    P2pHeader mine{op.tag, static_cast<uint32_t>(op.dtype), op.count};
    return Status(Code::InvalidArgument,
                  "send/recv mismatch: rank " + std::to_string(c.rank) + " called " + p2p_describe("recv", mine) +
                      " from rank " + std::to_string(peer) + " but rank " + std::to_string(peer) + " called " +
                      p2p_describe("send", h),
                  peer);
  }
  c.direct_bytes.fetch_add(want, std::memory_order_relaxed);
  c.ops.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

Status recv_any_net(CommImpl& c, const Op& op, int* source) {
  STRATA_RETURN_IF_ERROR(c.broken());
  auto d = Deadline::after(op.opts.timeout.count() > 0 ? op.opts.timeout : c.timeout);
  if (c.net_stash.empty()) c.net_stash.resize(c.size);
  // A header's tag is inside the message, not in the UCX tag (no room there): each sender's
  // oldest header is taken into its stash as soon as it arrives, and stays there for the
  // receive that matches it. Only that oldest message is a candidate, so every sender's
  // messages are still received in order; the scan starts after the last match.
  int found = -1;
  Status err;
  auto ready = [&] {
    for (int i = 0; i < c.size; ++i) {
      const int p = (c.any_source_next + i) % c.size;
      CommImpl::StashedHeader& sh = c.net_stash[p];
      if (!sh.full) {
        const uint64_t tag = make_tag(c, kP2pHeader, c.recv_seq[p] + 1, p);
        if (!c.net->probe(c.members[p], tag)) continue;
        if (sh.data.empty()) sh.data.resize(kEagerBytes);
        const transport::Part parts[2] = {{&sh.h, sizeof sh.h}, {sh.data.data(), kEagerBytes}};
        auto hx = c.net->recv_parts(c.members[p], tag, parts);
        Status st = hx.is_ok() ? c.net->wait({hx.value()}, c.policy(d), "recv from any source") : hx.status();
        if (!st.is_ok()) {
          err = Status(
              st.code(),
              st.message() + " on rank " + std::to_string(c.rank) + " receiving from rank " + std::to_string(p), p);
          return true;
        }
        sh.received = hx.value()->received;
        sh.full = true;
      }
      // A malformed header matches any receive, which then reports it (recv_net).
      if (sh.received >= sizeof sh.h && sh.h.tag != op.tag) continue;
      found = p;
      return true;
    }
    return false;
  };
  Status st = transport::wait_until(ready, c.policy(d), "recv from any source");
  if (st.is_ok() && !err.is_ok()) st = err;
  else if (!st.is_ok())
    st = Status(st.code(), st.message() + " on rank " + std::to_string(c.rank) + " waiting for a send with tag " +
                               std::to_string(op.tag) + " from any rank");
  if (!st.is_ok()) {
    c.set_broken(st);
    return st;
  }
  c.any_source_next = (found + 1) % c.size;
  *source = found;
  Op from = op;
  from.peer = found;
  return recv_net(c, from);
}

}  // namespace strata::detail

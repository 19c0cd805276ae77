// Algorithm selection: every rule in one table, tried in order, each with the threshold it
// uses and why. Measured figures are from docs/PERFORMANCE.md and
// docs/PERFORMANCE_MULTIHOST.md (2-core machine, 2 ranks per host).

#include "coll/select.hpp"

#include <iterator>

#include "coll/comm_impl.hpp"

namespace strata::coll {
namespace {

/// One call's facts that the rules test.
struct Call {
  const Shape& s;
  const Op& op;
  size_t bytes;  // count * dtype size: per rank, or per peer for the per-peer kinds
  bool is(OpKind k) const { return op.kind == k; }
  bool asked(Algorithm a) const { return op.opts.algorithm == a; }
  bool automatic() const { return asked(Algorithm::Auto); }
  /// Every host has the same number of ranks, and there are several on each: rails of
  /// equal length exist (the ranks of equal local index on every host).
  bool rails() const { return s.even_hosts && s.hosts > 1 && s.local_size > 1; }
};

struct Rule {
  bool net;  // applies to communicators that span hosts (else: within one host)
  bool (*applies)(const Call&);
  Algo algo;
  const char* reason;
};

bool blocks(const Call& c) {
  return c.is(OpKind::AllGather) || c.is(OpKind::AllGatherV) || c.is(OpKind::ReduceScatter) ||
         c.is(OpKind::ReduceScatterV);
}

/// Kinds whose eager form exists: the data one rank sends each peer is count elements.
bool has_eager_form(const Call& c) {
  return c.is(OpKind::AllReduce) || c.is(OpKind::AllGather) || c.is(OpKind::AllToAll) || c.is(OpKind::ReduceScatter) ||
         c.is(OpKind::Broadcast) || c.is(OpKind::Scatter) || c.is(OpKind::Reduce) || c.is(OpKind::Gather);
}

/// The most bytes per peer an eager call carries. reduce_scatter where the hierarchical form
/// applies: eager sends each member of the other hosts its block, L times the network bytes
/// of the hierarchical rail step (where each block crosses once, reduced over its host), so
/// it stays eager up to kEagerBytes / L (2 hosts x 2 ranks, per peer, with the eager message
/// still sent to every member of the other host: 16 KiB 82 us eager against 68 hierarchical,
/// 8 KiB 76 against 76, 4 KiB 59 against 70, 1 KiB 44 against 69; the rail round that
/// replaced it gained 4-40% more from 1 to 8 KiB). rails() implies even hosts, so every
/// member computes the same limit.
size_t eager_limit(const Call& c) {
  if (c.is(OpKind::ReduceScatter) && c.rails() && c.s.contiguous_hosts)
    return kEagerBytes / static_cast<size_t>(c.s.local_size);
  return kEagerBytes;
}

// The table. First match wins; the last rule of each half always applies.
constexpr Rule kRules[] = {
    // ---- within one host (coll/shm/) ----
    {false,
     [](const Call& c) {
       return c.s.size > 1 && (c.is(OpKind::AllGather) || c.is(OpKind::AllToAll) || c.is(OpKind::ReduceScatter)) &&
              c.bytes * static_cast<size_t>(c.s.size) <= detail::kInlineCopyBytes;
     },
     Algo::Inline,
     "all_gather, all_to_all, reduce_scatter with bytes x ranks <= kInlineCopyBytes (2 KiB): the input rides "
     "in the control-block slot, one sync instead of two, and external buffers are not staged (2 ranks: "
     "all_to_all of 1 KiB 0.7 against 0.9 us, external 0.8 against 1.2)"},
    {false, [](const Call& c) { return !c.is(OpKind::AllReduce); }, Algo::Single,
     "one algorithm per kind within a host: direct reads or writes of the peers' buffers"},
    {false, [](const Call& c) { return c.asked(Algorithm::OneShot); }, Algo::OneShot,
     "CollOptions::algorithm = OneShot"},
    {false, [](const Call& c) { return c.asked(Algorithm::TwoShot); }, Algo::TwoShot,
     "CollOptions::algorithm = TwoShot"},
    {false,
     [](const Call& c) {
       return c.s.size > 1 && c.bytes <= (c.s.size > 2 ? detail::kInlineManyBytes : detail::kInlineBytes);
     },
     Algo::Inline,
     "<= kInlineBytes (512 B; kInlineManyBytes, 4 KiB, with more than 2 ranks): the input fits the control-block "
     "slot, one cache-line handshake and no buffer read or closing sync"},
    // No rule may test what only this rank knows (whether its call is in place, its buffer
    // kinds): each rank resolves Auto alone, and they must all arrive at the same algorithm.
    {false, [](const Call& c) { return c.bytes * static_cast<size_t>(c.s.size) <= 2 * c.s.oneshot_max_bytes; },
     Algo::OneShot,
     "bytes x ranks <= 2 x STRATA_ONESHOT_MAX_BYTES (8 KiB): every rank reads every input, against two-shot's "
     "slices (2 ranks, two-shot pushing into heap outputs, inputs written just before each call: 1.33 / 1.7 / 1.7x "
     "at 8 / 16 / 32 KiB; inputs unchanged between calls: 0.75 / 1.05 / 1.0x; external buffers 0.89 / 1.05 / 1.39x: "
     "bench/fresh_inputs_bench, strata bench --buffers external); the limit shrinks as more inputs are read. In "
     "place too, where one-shot lands in a temporary and copies it back after a second sync (two-shot was 1.2x "
     "faster in place at 8 KiB): a rule that switched on it made ranks that differed in it disagree"},
    {false, [](const Call&) { return true; }, Algo::TwoShot,
     "large: each rank reads only its slice of every input, the bandwidth-optimal direct pattern"},

    // ---- across hosts (coll/net/) ----
    {true,
     [](const Call& c) {
       return has_eager_form(c) && c.bytes <= eager_limit(c) &&
              !(c.is(OpKind::AllReduce) && c.asked(Algorithm::TwoShot));
     },
     Algo::NetEager,
     "<= kEagerBytes (16 KiB) per peer, reduce_scatter with rails kEagerBytes / ranks per host: the data rides "
     "with the descriptor, one network round (all_reduce with CollOptions::algorithm = TwoShot excepted)"},
    {true, [](const Call& c) { return !c.automatic(); }, Algo::NetDirect,
     "CollOptions::algorithm = OneShot/TwoShot: the direct pattern between all members"},
    {true, [](const Call& c) { return c.is(OpKind::AllReduce) && c.rails(); }, Algo::NetHierarchical,
     "all_reduce, same rank count on every host: intra-host reduce-scatter, rail all-reduce, intra-host "
     "all-gather; each element crosses the network 2(H-1)/H times per rail rank, not 2(n-1)/n"},
    {true, [](const Call& c) { return blocks(c) && c.rails() && c.s.contiguous_hosts; }, Algo::NetHierarchical,
     "all_gather/reduce_scatter, even and contiguous hosts: each block crosses to a host once, along its rail"},
    {true,
     [](const Call& c) {
       return (c.is(OpKind::Broadcast) || c.is(OpKind::Reduce)) && c.s.shared_host && c.s.hosts > 1;
     },
     Algo::NetHierarchical,
     "broadcast/reduce with several ranks on some host: the data crosses to each host once, cut over its ranks"},
    {true, [](const Call&) { return true; }, Algo::NetDirect,
     "everything else: each transfer goes from the sender's buffer straight into the receiver's"},
};

}  // namespace

const char* to_string(Algo a) {
  switch (a) {
    case Algo::Single: return "single";
    case Algo::Inline: return "inline";
    case Algo::OneShot: return "one_shot";
    case Algo::TwoShot: return "two_shot";
    case Algo::NetEager: return "eager";
    case Algo::NetDirect: return "direct";
    case Algo::NetHierarchical: return "hierarchical";
  }
  return "unknown";
}

Shape shape_of(const detail::CommImpl& c) {
  Shape s;
  s.size = c.size;
  s.oneshot_max_bytes = c.ctx->env.oneshot_max_bytes;
  if (!c.net) return s;
  s.spans_hosts = true;
  s.hosts = static_cast<int>(c.host_members.size());
  s.local_size = c.local ? c.local->size : 1;
  const size_t L = c.host_members[0].size();
  for (size_t h = 0; h < c.host_members.size(); ++h) {
    const auto& m = c.host_members[h];
    s.even_hosts = s.even_hosts && m.size() == L;
    s.shared_host = s.shared_host || m.size() > 1;
    for (size_t l = 0; l < m.size(); ++l)
      s.contiguous_hosts = s.contiguous_hosts && m[l] == static_cast<int>(h * L + l);
  }
  return s;
}

Selection select_algorithm(const Shape& s, const Op& op) {
  const Call call{s, op, op.count * dtype_size(op.dtype)};
  for (const Rule& r : kRules)
    if (r.net == s.spans_hosts && r.applies(call)) return {r.algo, r.reason};
  return {};  // unreachable: each half ends with a rule that always applies
}

}  // namespace strata::coll

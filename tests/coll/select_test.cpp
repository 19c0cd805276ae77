// The selection table (coll/select.cpp): which algorithm each call gets, by kind, size,
// CollOptions::algorithm and communicator shape, at both sides of every threshold. A change
// of a threshold or of a rule's order shows here, by name, before it shows as a slowdown.

#include <gtest/gtest.h>

#include "coll/comm_impl.hpp"
#include "coll/select.hpp"
#include "coll/shm/exec.hpp"

namespace strata::coll {
namespace {

constexpr size_t kOneShotMax = 256 * 1024;

Shape one_host(int n) {
  Shape s;
  s.size = n;
  s.local_size = n;
  s.oneshot_max_bytes = kOneShotMax;
  return s;
}

/// `hosts` hosts holding `per_host` ranks each, in contiguous blocks.
Shape hosts(int hosts, int per_host) {
  Shape s = one_host(hosts * per_host);
  s.spans_hosts = true;
  s.hosts = hosts;
  s.local_size = per_host;
  s.shared_host = per_host > 1;
  return s;
}

Op call(OpKind kind, size_t bytes, Algorithm algo = Algorithm::Auto, DataType dtype = DataType::Float32) {
  Op op;
  op.kind = kind;
  op.dtype = dtype;
  op.count = bytes / dtype_size(dtype);
  op.opts.algorithm = algo;
  return op;
}

Algo pick(const Shape& s, const Op& op) {
  Selection sel = select_algorithm(s, op);
  EXPECT_NE(std::string(sel.reason), "") << "every rule says why it chose " << to_string(sel.algo);
  return sel.algo;
}

#define EXPECT_ALGO(want, shape, op) \
  EXPECT_EQ(to_string(pick(shape, op)), std::string(to_string(want))) << "for " << to_string((op).kind)

TEST(Select, OneHostAllReduceBySize) {
  const Shape two = one_host(2);
  EXPECT_ALGO(Algo::Inline, two, call(OpKind::AllReduce, 4));
  EXPECT_ALGO(Algo::Inline, two, call(OpKind::AllReduce, detail::kInlineBytes));
  EXPECT_ALGO(Algo::OneShot, two, call(OpKind::AllReduce, detail::kInlineBytes + 4));
  // bytes x ranks <= 2 x the one-shot limit: at 2 ranks the limit itself.
  EXPECT_ALGO(Algo::OneShot, two, call(OpKind::AllReduce, kOneShotMax));
  EXPECT_ALGO(Algo::TwoShot, two, call(OpKind::AllReduce, kOneShotMax + 4));
  // With more than 2 ranks the inline path goes further (no closing sync to wait for).
  const Shape three = one_host(3), eight = one_host(8);
  EXPECT_ALGO(Algo::Inline, three, call(OpKind::AllReduce, detail::kInlineManyBytes));
  EXPECT_ALGO(Algo::OneShot, three, call(OpKind::AllReduce, detail::kInlineManyBytes + 4));
  EXPECT_ALGO(Algo::Inline, eight, call(OpKind::AllReduce, detail::kInlineManyBytes));
  // The limit shrinks as more inputs are read.
  EXPECT_ALGO(Algo::OneShot, eight, call(OpKind::AllReduce, kOneShotMax / 4));
  EXPECT_ALGO(Algo::TwoShot, eight, call(OpKind::AllReduce, kOneShotMax / 4 + 4));
}

TEST(Select, InPlaceAndOutOfPlaceCallsOfOneSizeGetTheSameAlgorithm) {
  // Each rank resolves Auto alone; a rule that looked at whether its own call is in place
  // made ranks of one call pick one-shot and two-shot, and the call failed as a mismatch.
  std::vector<char> buf(1 << 20);
  for (int n : {2, 3, 4, 8}) {
    for (size_t bytes = 4; bytes <= buf.size(); bytes = bytes < 16384 ? bytes + 4 : bytes * 2) {
      Op in_place = call(OpKind::AllReduce, bytes);
      in_place.in = in_place.out = buf.data();
      const Algo a = select_algorithm(one_host(n), in_place).algo;
      const Algo b = select_algorithm(one_host(n), call(OpKind::AllReduce, bytes)).algo;
      ASSERT_EQ(a, b) << n << " ranks, " << bytes << " bytes";
    }
  }
  // Asked for, one-shot stays one-shot in place.
  Op op = call(OpKind::AllReduce, 64 << 10, Algorithm::OneShot);
  op.in = op.out = buf.data();
  EXPECT_ALGO(Algo::OneShot, one_host(2), op);
  // One rank in place, Auto: the size rule decides as for every rank count.
  Op alone = call(OpKind::AllReduce, 64 << 10);
  alone.in = alone.out = buf.data();
  EXPECT_ALGO(Algo::OneShot, one_host(1), alone);
}

TEST(Select, OneHostAskedAlgorithmWinsOverSize) {
  const Shape two = one_host(2);
  EXPECT_ALGO(Algo::TwoShot, two, call(OpKind::AllReduce, 8, Algorithm::TwoShot));
  EXPECT_ALGO(Algo::OneShot, two, call(OpKind::AllReduce, 64 << 20, Algorithm::OneShot));
  // A single rank never takes the inline path (there is no peer to hand the input to).
  EXPECT_ALGO(Algo::OneShot, one_host(1), call(OpKind::AllReduce, 8));
}

TEST(Select, OneHostOtherKindsHaveOneAlgorithm) {
  for (OpKind k : {OpKind::Reduce, OpKind::Broadcast, OpKind::AllGatherV, OpKind::ReduceScatterV, OpKind::AllToAllV,
                   OpKind::Gather, OpKind::Scatter, OpKind::Barrier})
    for (size_t bytes : {size_t{8}, size_t{64} << 20}) EXPECT_ALGO(Algo::Single, one_host(4), call(k, bytes));
  for (OpKind k : {OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllToAll})
    EXPECT_ALGO(Algo::Single, one_host(4), call(k, size_t{64} << 20));
}

// all_gather, all_to_all and reduce_scatter go inline while count x n (the bytes a rank reads
// from the peers' slots) fits kInlineCopyBytes.
TEST(Select, OneHostSmallBlockKindsGoInline) {
  for (int n : {2, 4, 8}) {
    for (OpKind k : {OpKind::AllGather, OpKind::AllToAll, OpKind::ReduceScatter}) {
      const size_t per_block = detail::kInlineCopyBytes / static_cast<size_t>(n);
      EXPECT_ALGO(Algo::Inline, one_host(n), call(k, per_block));
      EXPECT_ALGO(Algo::Single, one_host(n), call(k, per_block + 4));
    }
  }
  // One rank has no peer to meet.
  EXPECT_ALGO(Algo::Single, one_host(1), call(OpKind::AllGather, 8));
}

TEST(Select, AcrossHostsEagerUpToTheLimit) {
  const Shape s = hosts(2, 2);
  for (OpKind k : {OpKind::AllReduce, OpKind::AllGather, OpKind::AllToAll, OpKind::Broadcast, OpKind::Scatter,
                   OpKind::Reduce, OpKind::Gather}) {
    EXPECT_ALGO(Algo::NetEager, s, call(k, kEagerBytes));
    EXPECT_NE(pick(s, call(k, kEagerBytes + 4)), Algo::NetEager) << to_string(k);
  }
  // Kinds without an eager form, however small.
  for (OpKind k : {OpKind::AllGatherV, OpKind::ReduceScatterV, OpKind::AllToAllV}) {
    EXPECT_NE(pick(s, call(k, 8)), Algo::NetEager) << to_string(k);
  }
  // reduce_scatter where the hierarchical form applies: the limit shrinks with the ranks per
  // host (eager sends each block across on its own, hierarchical once per host, reduced).
  EXPECT_ALGO(Algo::NetEager, hosts(2, 4), call(OpKind::ReduceScatter, kEagerBytes / 4));
  EXPECT_ALGO(Algo::NetHierarchical, hosts(2, 4), call(OpKind::ReduceScatter, kEagerBytes / 4 + 4));
  EXPECT_ALGO(Algo::NetEager, hosts(2, 1), call(OpKind::ReduceScatter, kEagerBytes));
  // TwoShot turns eager all_reduce off; OneShot keeps it.
  EXPECT_ALGO(Algo::NetDirect, s, call(OpKind::AllReduce, 8, Algorithm::TwoShot));
  EXPECT_ALGO(Algo::NetEager, s, call(OpKind::AllReduce, 8, Algorithm::OneShot));
}

TEST(Select, AcrossHostsHierarchicalNeedsRails) {
  const size_t big = size_t{1} << 20;
  // Even hosts with several ranks each: rails exist.
  EXPECT_ALGO(Algo::NetHierarchical, hosts(2, 2), call(OpKind::AllReduce, big));
  EXPECT_ALGO(Algo::NetHierarchical, hosts(2, 2), call(OpKind::AllGather, big));
  EXPECT_ALGO(Algo::NetHierarchical, hosts(2, 2), call(OpKind::ReduceScatterV, big));
  EXPECT_ALGO(Algo::NetHierarchical, hosts(2, 2), call(OpKind::Broadcast, big));
  EXPECT_ALGO(Algo::NetHierarchical, hosts(2, 2), call(OpKind::Reduce, big));
  EXPECT_ALGO(Algo::NetDirect, hosts(2, 2), call(OpKind::AllToAll, big));
  EXPECT_ALGO(Algo::NetDirect, hosts(2, 2), call(OpKind::Gather, big));
  // One rank per host: no intra-host step to gain from.
  EXPECT_ALGO(Algo::NetDirect, hosts(3, 1), call(OpKind::AllReduce, big));
  EXPECT_ALGO(Algo::NetDirect, hosts(3, 1), call(OpKind::Broadcast, big));
  // Uneven hosts: no rails, but broadcast/reduce still go through one rank per host.
  Shape uneven = hosts(2, 2);
  uneven.even_hosts = false;
  EXPECT_ALGO(Algo::NetDirect, uneven, call(OpKind::AllReduce, big));
  EXPECT_ALGO(Algo::NetHierarchical, uneven, call(OpKind::Reduce, big));
  // Blocks need hosts holding contiguous ranks.
  Shape interleaved = hosts(2, 2);
  interleaved.contiguous_hosts = false;
  EXPECT_ALGO(Algo::NetDirect, interleaved, call(OpKind::AllGather, big));
  EXPECT_ALGO(Algo::NetHierarchical, interleaved, call(OpKind::AllReduce, big));
  // An asked-for algorithm means the direct pattern.
  for (Algorithm a : {Algorithm::OneShot, Algorithm::TwoShot})
    EXPECT_ALGO(Algo::NetDirect, hosts(2, 2), call(OpKind::AllReduce, big, a));
}

TEST(Select, DescriptionNamesTheAlgorithm) {
  OpDesc d;
  d.kind = static_cast<uint8_t>(OpKind::AllReduce);
  d.dtype = static_cast<uint8_t>(DataType::Float32);
  d.count = 8;
  for (Algo a : {Algo::Inline, Algo::OneShot, Algo::TwoShot, Algo::NetEager, Algo::NetHierarchical}) {
    d.algo = static_cast<uint8_t>(a);
    EXPECT_NE(describe(d).find(std::string("algorithm=") + to_string(a)), std::string::npos) << describe(d);
  }
}

// TimedChoice (coll/shm/exec.cpp) learns, per size, which of two ways of running a call is
// faster from the first calls' times. Fed times here, not measured: what it decides and when.
using detail::CommImpl;
using detail::shm::kEarlyChoiceMinNs;
using detail::shm::TimedChoice;
using Trials = CommImpl::Trials;

/// Feeds `calls` trials in the order TimedChoice runs them (pairs: 0 0 1 1 0 0 ...), mode m
/// taking ns[m], until it decides; returns the calls it took (-1: undecided).
int trials_until_chosen(Trials& t, const int64_t (&ns)[2], int calls) {
  for (int k = 0; k < calls; ++k) {
    if (t.chosen >= 0) return k;
    const int mode = (k / 2) % 2;
    TimedChoice::record(t, mode, ns[mode]);
  }
  return t.chosen >= 0 ? calls : -1;
}

TEST(TimedChoice, ShortCallsTryEachWayKTrialsTimes) {
  // 100 us against 300 us: clearly apart, but short calls are noisy, so every trial runs.
  Trials t;
  EXPECT_EQ(trials_until_chosen(t, {100'000, 300'000}, 100), 2 * Trials::kTrials);
  EXPECT_EQ(t.chosen, 0);
  Trials u;
  EXPECT_EQ(trials_until_chosen(u, {300'000, 100'000}, 100), 2 * Trials::kTrials);
  EXPECT_EQ(u.chosen, 1);
}

TEST(TimedChoice, LongCallsOneWayClearlySlowerAreDecidedAfterTwoWarmCallsEach) {
  // 64 MiB external all_reduce, 2 ranks: 10 ms staged, 20 ms by CMA.
  Trials t;
  EXPECT_EQ(trials_until_chosen(t, {10'000'000, 20'000'000}, 100), 2 * Trials::kEarlyTrials);
  EXPECT_EQ(t.chosen, 0);
  Trials u;
  EXPECT_EQ(trials_until_chosen(u, {2 * kEarlyChoiceMinNs, kEarlyChoiceMinNs}, 100), 2 * Trials::kEarlyTrials);
  EXPECT_EQ(u.chosen, 1);
}

TEST(TimedChoice, LongCallsWithinAQuarterOfEachOtherTryEveryTrial) {
  // Long, but 20% apart: not clear enough to stop early; the best of kTrials decides.
  Trials t;
  EXPECT_EQ(trials_until_chosen(t, {12'000'000, 10'000'000}, 100), 2 * Trials::kTrials);
  EXPECT_EQ(t.chosen, 1);
}

TEST(TimedChoice, AColdFirstCallDoesNotDecideEarly) {
  // The first call of a size pays for page faults and growth: 3x the steady time. Each way
  // is judged by its best call, so the cold one counts for nothing once a warm one came.
  Trials t;
  TimedChoice::record(t, 0, 30'000'000);  // cold
  TimedChoice::record(t, 0, 10'000'000);
  TimedChoice::record(t, 1, 11'000'000);
  TimedChoice::record(t, 1, 11'000'000);
  EXPECT_EQ(t.chosen, -1) << "10 ms against 11 ms is within a quarter: no early decision";
  Trials u;
  TimedChoice::record(u, 0, 30'000'000);
  TimedChoice::record(u, 1, 11'000'000);
  EXPECT_EQ(u.chosen, -1) << "one call of each way is not enough";
}

}  // namespace
}  // namespace strata::coll

// The hooks the recovery layer rebuilds a communicator with (coll/membership.hpp), on real
// communicators (threads as ranks): what a reset restarts, what it must leave for a slow peer,
// and that the communicator works again once every member has reset.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "coll/comm_impl.hpp"
#include "coll/harness.hpp"
#include "coll/membership.hpp"

namespace strata::detail {
namespace {

// A survivor that is slow to notice a failure may still be reading this rank's descriptor of
// the old epoch's last operation (its wait for it succeeded before the reset): the reset must
// not zero it under that reader, or the reader reports a false "collective mismatch" against
// an all-zero descriptor (seen on a loaded machine as a healthy rank exiting during recovery).
TEST(Membership, ResetRestartsCountersButKeepsWhatASlowPeerMayRead) {
  constexpr int n = 2;
  test::Team team(n);
  std::atomic<int> past_last_op{0}, reset_done{0};
  // Waits until `count` reaches n (a deadline, not std::barrier: a rank that failed must not
  // hang the other).
  auto meet = [&](std::atomic<int>& count) {
    count.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (count.load() < n && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    return count.load() == n;
  };
  auto failures = team.run([&](Communicator& comm) {
    std::vector<int32_t> v(64);
    std::iota(v.begin(), v.end(), comm.rank());
    std::vector<int32_t> sum(v.size());
    comm.all_reduce(v.data(), sum.data(), v.size(), DataType::Int32, ReduceOp::Sum);
    std::vector<size_t> counts(n, 4), displs{0, 4};
    std::vector<int32_t> a2a_in(8, comm.rank()), a2a_out(8);
    comm.all_to_all_v(a2a_in.data(), counts.data(), displs.data(), a2a_out.data(), counts.data(), displs.data(),
                      DataType::Int32);

    CommImpl& c = *comm.impl();
    const uint32_t seq = c.seq;
    ASSERT_GT(seq, 0u);
    const coll::OpDesc last = c.self.hdr()->slot(seq).desc;
    const uint64_t vec0 = c.self.vec()[0];
    ASSERT_EQ(last.seq, seq);
    ASSERT_EQ(vec0, 4u);

    // As in a rebuild, every member is out of its last operation before anyone resets (a
    // peer still waiting on our closing signal would otherwise wait for its revoke).
    ASSERT_TRUE(meet(past_last_op)) << "the other rank never finished its operations";
    Membership m(comm.impl());
    {
      auto quiet = m.quiesce(aborted("test"));
      m.reset_sync_state(1);
    }
    EXPECT_EQ(c.seq, 0u);
    EXPECT_EQ(c.phase, 0u);
    for (const OpSlot& sl : c.self.hdr()->slots) EXPECT_EQ(sl.ready.value.load(), 0u);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(c.self.send_posted(r).value.load(), 0u) << "peer " << r;
      EXPECT_EQ(c.self.recv_done(r).value.load(), 0u) << "peer " << r;
    }
    const coll::OpDesc kept = c.self.hdr()->slot(seq).desc;
    EXPECT_EQ(kept.seq, last.seq) << "the reset zeroed the descriptor a slow peer may still read";
    EXPECT_EQ(kept.kind, last.kind);
    EXPECT_EQ(c.self.vec()[0], vec0) << "the reset zeroed the count vector a slow peer may still read";

    // Once every member has reset, the communicator runs again from operation #1.
    ASSERT_TRUE(meet(reset_done)) << "the other rank never reset";
    ASSERT_TRUE(m.sync(Deadline::after(std::chrono::seconds(20)), "test").is_ok());
    comm.all_reduce(v.data(), sum.data(), v.size(), DataType::Int32, ReduceOp::Sum);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(sum[i], static_cast<int32_t>(2 * i + 1)) << "index " << i;
    std::vector<int32_t> got(v.size());
    if (comm.rank() == 0) {
      comm.send(v.data(), v.size(), DataType::Int32, 1);
      comm.recv(got.data(), got.size(), DataType::Int32, 1);
    } else {
      comm.recv(got.data(), got.size(), DataType::Int32, 0);
      comm.send(v.data(), v.size(), DataType::Int32, 0);
    }
    EXPECT_EQ(got[0], 1 - comm.rank());
  });
  EXPECT_TRUE(failures.empty()) << failures[0];
}

}  // namespace
}  // namespace strata::detail

// The launcher's merge of the ranks' flight-recorder lines (cli/flight_report.cpp), fed the
// lines coll/flight.cpp writes: who waits for whom, sub-communicators, silent ranks.

#include "cli/flight_report.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::cli::launch {
namespace {

std::string op(int rank, const std::string& comm, int seq, const std::string& kind, const std::string& state,
               int root = -1) {
  return std::string(kFlightLineMarker) + " op rank=" + std::to_string(rank) + " id=" + comm +
         " seq=" + std::to_string(seq) + " kind=" + kind + " dtype=float32 count=8 root=" + std::to_string(root) +
         " state=" + state + " queued_ms=10 started_ms=10 done_ms=" + (state == "done" ? "5" : "-1");
}

std::string comm(int rank, const std::string& id, int crank, const std::string& members) {
  return std::string(kFlightLineMarker) + " comm rank=" + std::to_string(rank) + " id=" + id +
         " crank=" + std::to_string(crank) + " size=2 members=" + members + " entries=1";
}

void feed(FlightReport& f, const std::vector<std::string>& lines) {
  for (const auto& l : lines) ASSERT_TRUE(f.take(l)) << l;
}

TEST(FlightReport, PendingCollectivesWaitForTheMembersBehindThem) {
  FlightReport f;
  for (int r : {0, 1, 2, 3}) f.expect(r);
  const std::string m = kFlightLineMarker;
  // World of 4; ranks 0 and 1 are in #7, rank 2 finished #6, rank 3 never answers. A split
  // {1, 3} has rank 1 in a receive from its comm rank 1 (global 3).
  feed(f, {m + " begin rank=0 pid=1", comm(0, "world", 0, "0,1,2,3"), op(0, "world", 6, "all_reduce", "done"),
           op(0, "world", 7, "all_reduce", "started"), m + " end rank=0"});
  feed(f, {m + " begin rank=1 pid=2", comm(1, "world", 1, "0,1,2,3"), op(1, "world", 7, "all_reduce", "started"),
           comm(1, "world/0:1", 0, "1,3"), op(1, "world/0:1", 1, "recv", "started", 1), m + " end rank=1"});
  EXPECT_FALSE(f.complete());
  feed(f, {m + " begin rank=2 pid=3", comm(2, "world", 2, "0,1,2,3"), op(2, "world", 6, "all_reduce", "done"),
           m + " end rank=2"});
  EXPECT_FALSE(f.complete()) << "rank 3 has not answered";
  EXPECT_FALSE(f.take("[2] an ordinary line"));

  auto lines = f.render({0, 1, 2, 3});
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0],
            "rank 0 [world]: last completed #6 all_reduce float32 x8 5 ms ago; pending #7 all_reduce float32 x8 "
            "started 10 ms ago, waiting for rank 2 (at #6), rank 3 (no answer)");
  EXPECT_EQ(lines[1],
            "rank 1 [world]: last completed none; pending #7 all_reduce float32 x8 started 10 ms ago, waiting for "
            "rank 2 (at #6), rank 3 (no answer)");
  EXPECT_EQ(lines[2],
            "rank 1 [world/0:1]: last completed none; pending #1 recv float32 x8 from rank 3 started 10 ms ago, "
            "waiting for rank 3");
  EXPECT_EQ(lines[3], "rank 2 [world]: last completed #6 all_reduce float32 x8 5 ms ago; nothing pending");
  EXPECT_EQ(lines[4], "rank 3: no answer (busy in a system call for long, or exiting)");
}

TEST(FlightReport, EveryMemberInTheSameOperationIsSaidSo) {
  FlightReport f;
  f.expect(0);
  f.expect(1);
  const std::string m = kFlightLineMarker;
  for (int r : {0, 1})
    feed(f, {m + " begin rank=" + std::to_string(r) + " pid=1", comm(r, "world", r, "0,1"),
             op(r, "world", 3, "barrier", "started"), m + " end rank=" + std::to_string(r)});
  EXPECT_TRUE(f.complete());
  auto lines = f.render({0, 1});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "rank 0 [world]: last completed none; pending #3 barrier started 10 ms ago, every member has "
            "reached it");
}

}  // namespace
}  // namespace strata::cli::launch

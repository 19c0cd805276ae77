// `strata info` run as a user runs it.

#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

TEST(CliInfoTest, PrintsHostIdentityTransportsAndHeapSettings) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"info"}, {"STRATA_HOST_ID=cli-test-host", "STRATA_HEAP_SEGMENT_SIZE=256M", "STRATA_TIMEOUT=90s",
                              "STRATA_UCX_TLS=tcp,self"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  bool host = false, cma = false, shm = false, ucx = false;
  for (const auto& line : lines_of(r.out)) {
    if (line.starts_with("host id") && contains(line, "cli-test-host")) host = true;
    if (line.starts_with("  CMA") && (contains(line, "yes") || contains(line, "no (") || contains(line, "off")))
      cma = true;
    if (line.starts_with("  shm") && contains(line, "yes")) shm = true;
    // A UCX build names its version and the settings; a build without says so.
    if (line.starts_with("  UCX") && ((contains(line, "UCX 1.") && contains(line, "tcp,self (STRATA_UCX_TLS)")) ||
                                      contains(line, "not built with UCX")))
      ucx = true;
  }
  EXPECT_TRUE(host) << r.out;
  EXPECT_TRUE(cma) << r.out;
  EXPECT_TRUE(shm) << r.out;
  EXPECT_TRUE(ucx) << r.out;
  EXPECT_TRUE(contains(r.out, "256 MiB (STRATA_HEAP_SEGMENT_SIZE)")) << r.out;
  EXPECT_TRUE(contains(r.out, "90 s (STRATA_TIMEOUT)")) << r.out;
  EXPECT_TRUE(contains(r.out, "numa nodes")) << r.out;
  EXPECT_TRUE(contains(r.out, "job                none")) << r.out;
}

TEST(CliInfoTest, CmaCanBeSwitchedOff) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"info"}, {"STRATA_CMA=0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "off (STRATA_CMA=0)")) << r.out;
}

TEST(CliInfoTest, ShowsThePlacementInsideAJobAndWhatIsWrongWithIt) {
  STRATA_REQUIRE_BIN();
  auto ok = run_cli({"info"}, {"STRATA_RANK=1", "STRATA_WORLD_SIZE=2", "STRATA_STORE=127.0.0.1:7", "STRATA_JOB_ID=j1"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(contains(ok.out, "rank 1 of 2")) << ok.out;
  EXPECT_TRUE(contains(ok.out, "store 127.0.0.1:7, job id j1")) << ok.out;
  auto bad = run_cli({"info"}, {"STRATA_RANK=3", "STRATA_WORLD_SIZE=2", "STRATA_STORE=127.0.0.1:7"});
  ASSERT_EQ(bad.exit_code, 0) << bad.err;
  EXPECT_TRUE(contains(bad.out, "invalid: STRATA_RANK=3 is not below STRATA_WORLD_SIZE=2")) << bad.out;
}

TEST(CliInfoTest, RejectsArguments) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"info", "--bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "unexpected argument '--bogus'")) << r.err;
}

}  // namespace
}  // namespace strata::cli_test

// `strata` refuses an environment setting it cannot read before it starts anything, naming
// the variable, rather than running the job with a default the user did not ask for.

#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

TEST(CliSettingsTest, MalformedSettingStopsRunBeforeAnyRankStarts) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"run", "-n", "2", "--", "sh", "-c", "echo started"}, {"STRATA_TIMEOUT=soon"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("STRATA_TIMEOUT=soon"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("started"), std::string::npos) << r.out;
}

TEST(CliSettingsTest, InfoShowsTheRefusedSetting) {
  STRATA_REQUIRE_BIN();
  auto r = run_cli({"info"}, {"STRATA_HEAP_MAX_SIZE=lots"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("STRATA_HEAP_MAX_SIZE=lots"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace strata::cli_test

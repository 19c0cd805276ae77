// Job placement from launcher variables (strata run, torchrun, Open MPI, Slurm), read
// through Env::from_lookup so the real environment is never touched.

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "bootstrap/job_info.hpp"
#include "test_status.hpp"

namespace strata::bootstrap {
namespace {

using Vars = std::map<std::string, std::string>;

Env env_of(const Vars& vars) {
  return Env::from_lookup([&](const char* k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The message of a failed detection (fails the test when detection succeeded).
std::string error_of(const Vars& vars, const JobOverrides& o = {}) {
  auto r = detect_job(env_of(vars), o);
  EXPECT_FALSE(r.is_ok()) << "expected an error";
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), Code::InvalidArgument);
  return r.status().message();
}

TEST(JobInfoTest, StrataVariables) {
  auto r = detect_job(env_of({{"STRATA_RANK", "2"},
                              {"STRATA_WORLD_SIZE", "4"},
                              {"STRATA_LOCAL_RANK", "2"},
                              {"STRATA_LOCAL_SIZE", "4"},
                              {"STRATA_STORE", "127.0.0.1:4567"},
                              {"STRATA_JOB_TOKEN", "secret"},
                              {"STRATA_JOB_ID", "job42"},
                              {"STRATA_HOST_ID", "hostA"}}));
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->store, "127.0.0.1:4567");
  EXPECT_EQ(r->token, "secret");
  EXPECT_EQ(r->job_id, "job42");
  EXPECT_EQ(r->host_id, "hostA");
}

TEST(JobInfoTest, TorchrunVariables) {
  auto r = detect_job(env_of({{"RANK", "3"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "3"},
                              {"LOCAL_WORLD_SIZE", "4"},
                              {"MASTER_ADDR", "node0"},
                              {"MASTER_PORT", "29400"},
                              {"TORCHELASTIC_RUN_ID", "elastic-7"}}));
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->store, "node0:29400");
  EXPECT_EQ(r->job_id, "elastic-7");
}

TEST(JobInfoTest, OpenMpiVariablesWithAStrataStore) {
  auto r = detect_job(env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                              {"STRATA_STORE", "10.0.0.1:5000"},
                              {"STRATA_JOB_TOKEN", "t"}}));
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->store, "10.0.0.1:5000");
  EXPECT_FALSE(r->job_id.empty());
}

TEST(JobInfoTest, SlurmVariables) {
  auto r = detect_job(env_of({{"SLURM_PROCID", "5"},
                              {"SLURM_NTASKS", "6"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_JOB_ID", "123456"},
                              {"STRATA_STORE", "login1:7000"}}));
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world_size, 6);
  EXPECT_EQ(r->job_id, "123456");
}

TEST(JobInfoTest, NoVariablesMeansOneRankWithoutAStore) {
  auto r = detect_job(env_of({}));
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->world_size, 1);
  EXPECT_TRUE(r->store.empty());
  EXPECT_FALSE(r->job_id.empty());
  EXPECT_FALSE(r->host_id.empty());
}

TEST(JobInfoTest, WorldSizeOneWithoutAStoreIsValid) {
  auto r = detect_job(env_of({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "1"}}));
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->world_size, 1);
  EXPECT_TRUE(r->store.empty());
}

TEST(JobInfoTest, OverridesWinOverTheEnvironment) {
  JobOverrides o;
  o.rank = 1;
  o.world_size = 3;
  o.store = "h:9";
  o.token = "tok";
  o.job_id = "mine";
  o.host_id = "forced";
  auto r = detect_job(env_of({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_STORE", "x:1"}}), o);
  STRATA_ASSERT_OK(r);
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 3);
  EXPECT_EQ(r->store, "h:9");
  EXPECT_EQ(r->token, "tok");
  EXPECT_EQ(r->job_id, "mine");
  EXPECT_EQ(r->host_id, "forced");
}

TEST(JobInfoTest, DerivedJobIdIsTheSameOnEveryRankAndDiffersPerToken) {
  auto rank_env = [](const char* rank, const char* token) {
    return env_of(
        {{"STRATA_RANK", rank}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_STORE", "h:1"}, {"STRATA_JOB_TOKEN", token}});
  };
  auto r0 = detect_job(rank_env("0", "aaa"));
  auto r1 = detect_job(rank_env("1", "aaa"));
  auto other = detect_job(rank_env("0", "bbb"));
  STRATA_ASSERT_OK(r0);
  STRATA_ASSERT_OK(r1);
  STRATA_ASSERT_OK(other);
  EXPECT_EQ(r0->job_id, r1->job_id);
  EXPECT_NE(r0->job_id, other->job_id);
  EXPECT_FALSE(r0->job_id.empty());
}

// A job id made from the store alone is marked so (init() then takes a generation of it per
// run); Open MPI's own identity of the mpirun makes one that differs from one mpirun to the next.
TEST(JobInfoTest, OpenMpiRunsGetTheirOwnIdAndStoreDerivedIdsAreMarked) {
  auto ompi = [](const char* rank, const char* ns, const char* transports) {
    return env_of({{"OMPI_COMM_WORLD_RANK", rank},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"PMIX_NAMESPACE", ns},
                   {"OMPI_MCA_orte_precondition_transports", transports},
                   {"STRATA_STORE", "h:1"},
                   {"STRATA_JOB_TOKEN", "t"}});
  };
  auto a0 = detect_job(ompi("0", "1541603329", "0cd7-940"));
  auto a1 = detect_job(ompi("1", "1541603329", "0cd7-940"));
  auto b0 = detect_job(ompi("0", "1541603330", "77aa-123"));
  STRATA_ASSERT_OK(a0);
  STRATA_ASSERT_OK(a1);
  STRATA_ASSERT_OK(b0);
  EXPECT_EQ(a0->job_id, a1->job_id);
  EXPECT_NE(a0->job_id, b0->job_id);
  EXPECT_FALSE(a0->id_from_store);
  auto mpich = detect_job(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"STRATA_STORE", "h:1"}}));
  STRATA_ASSERT_OK(mpich);
  EXPECT_TRUE(mpich->id_from_store);
  auto named =
      detect_job(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"STRATA_STORE", "h:1"}, {"STRATA_JOB_ID", "j7"}}));
  STRATA_ASSERT_OK(named);
  EXPECT_EQ(named->job_id, "j7");
  EXPECT_FALSE(named->id_from_store);
}

TEST(JobInfoTest, RankNotBelowWorldSizeNamesBothVariables) {
  EXPECT_NE(error_of({{"STRATA_RANK", "5"}, {"STRATA_WORLD_SIZE", "4"}, {"STRATA_STORE", "h:1"}})
                .find("STRATA_RANK=5 is not below STRATA_WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}).find("RANK=4 is not below WORLD_SIZE=4"),
      std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "4"}, {"STRATA_STORE", "h:1"}}).find("SLURM_PROCID=-1"),
            std::string::npos);
  EXPECT_NE(error_of({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "0"}}).find("STRATA_WORLD_SIZE=0"),
            std::string::npos);
  JobOverrides o;
  o.rank = 7;
  EXPECT_NE(error_of({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_STORE", "h:1"}}, o)
                .find("InitOptions.rank=7 is not below STRATA_WORLD_SIZE=2"),
            std::string::npos);
}

TEST(JobInfoTest, MissingOrMalformedVariablesAreNamed) {
  EXPECT_NE(error_of({{"STRATA_RANK", "1"}}).find("STRATA_WORLD_SIZE is missing"), std::string::npos);
  EXPECT_NE(error_of({{"STRATA_RANK", "one"}, {"STRATA_WORLD_SIZE", "2"}}).find("STRATA_RANK"), std::string::npos);
  EXPECT_NE(error_of({{"STRATA_RANK", "1"}, {"STRATA_WORLD_SIZE", "4"}}).find("STRATA_STORE"), std::string::npos);
  EXPECT_NE(
      error_of({{"STRATA_RANK", "1"}, {"STRATA_WORLD_SIZE", "4"}, {"STRATA_STORE", "nohostport"}}).find("STRATA_STORE"),
      std::string::npos);
  EXPECT_NE(error_of({{"STRATA_RANK", "1"},
                      {"STRATA_WORLD_SIZE", "4"},
                      {"STRATA_STORE", "h:1"},
                      {"STRATA_LOCAL_RANK", "2"},
                      {"STRATA_LOCAL_SIZE", "2"}})
                .find("STRATA_LOCAL_RANK=2 is not below STRATA_LOCAL_SIZE=2"),
            std::string::npos);
  JobOverrides o;
  o.world_size = 3;
  EXPECT_NE(error_of({}, o).find("STRATA_RANK is missing"), std::string::npos);
}

// A number that does not fit is refused and named, never wrapped: 4294967297 is 2^32 + 1,
// which a 32-bit conversion would read as rank 1 (issue 18 item 12).
TEST(JobInfoTest, OutOfRangeOrMalformedSettingsAreRefusedByName) {
  const std::string big =
      error_of({{"STRATA_RANK", "4294967297"}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_STORE", "h:1"}});
  EXPECT_NE(big.find("STRATA_RANK=4294967297"), std::string::npos) << big;
  EXPECT_NE(big.find("out of range"), std::string::npos) << big;
  // Not only placement: any setting the rank could not read ends it before it joins.
  const std::string t = error_of({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "1"}, {"STRATA_TIMEOUT", "soon"}});
  EXPECT_NE(t.find("STRATA_TIMEOUT=soon"), std::string::npos) << t;
  const std::string two = error_of({{"STRATA_RANK", "0"},
                                    {"STRATA_WORLD_SIZE", "1"},
                                    {"STRATA_HEAP_MAX_SIZE", "12X"},
                                    {"STRATA_HEARTBEAT_INTERVAL", "0"}});
  EXPECT_NE(two.find("STRATA_HEAP_MAX_SIZE=12X"), std::string::npos) << two;
  EXPECT_NE(two.find("STRATA_HEARTBEAT_INTERVAL=0"), std::string::npos) << two;
}

TEST(JobInfoTest, HostIdentityIsForcedByStrataHostIdOrBuiltFromHostnameAndBootId) {
  EXPECT_EQ(host_identity(env_of({{"STRATA_HOST_ID", "ns1"}})), "ns1");
  std::string id = host_identity(env_of({}));
  EXPECT_FALSE(id.empty());
  EXPECT_NE(id.find(':'), std::string::npos) << id;  // hostname:boot-id
  EXPECT_EQ(id, host_identity(env_of({})));          // stable
}

}  // namespace
}  // namespace strata::bootstrap

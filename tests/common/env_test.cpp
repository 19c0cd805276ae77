// Env: the typed view of STRATA_* and launcher variables, parsed from a fake environment.
#include "common/env.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace strata {
namespace {

using namespace std::chrono_literals;

Env env_of(const std::map<std::string, std::string>& vars) {
  return Env::from_lookup([&](const char* key) -> std::optional<std::string> {
    auto it = vars.find(key);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(EnvParse, DefaultsWithEmptyEnvironment) {
  const Env e = env_of({});
  EXPECT_FALSE(e.rank.has_value());
  EXPECT_FALSE(e.world_size.has_value());
  EXPECT_FALSE(e.local_rank.has_value());
  EXPECT_FALSE(e.local_size.has_value());
  EXPECT_EQ(e.launcher, "");
  EXPECT_EQ(e.store, "");
  EXPECT_EQ(e.timeout, 300000ms);
  EXPECT_EQ(e.store_connect_timeout, 60000ms);
  EXPECT_EQ(e.spin_us, 500u);
  EXPECT_EQ(e.oneshot_max_bytes, size_t{8} << 10);
  EXPECT_EQ(e.cma_min_bytes, size_t{1} << 20);
  EXPECT_EQ(e.cma_registered_min_bytes, size_t{256} << 10);
  EXPECT_EQ(e.oversubscribed, -1);
  EXPECT_EQ(e.log_level, "warn");
  EXPECT_EQ(e.kernels, "");
  EXPECT_EQ(e.heap_segment_size, size_t{1} << 30);
  EXPECT_EQ(e.heap_max_size, size_t{64} << 30);
  EXPECT_FALSE(e.heap_huge_pages);
  EXPECT_FALSE(e.heap_prefault);
  EXPECT_TRUE(e.cma);
}

TEST(EnvParse, StrataPlacementVariables) {
  const Env e = env_of({{"STRATA_RANK", "3"},
                        {"STRATA_WORLD_SIZE", "8"},
                        {"STRATA_LOCAL_RANK", "1"},
                        {"STRATA_LOCAL_SIZE", "2"},
                        {"STRATA_STORE", "10.0.0.1:7000"},
                        {"STRATA_JOB_ID", "job42"},
                        {"STRATA_HOST_ID", "hostA"},
                        {"STRATA_JOB_TOKEN", "s3cret"},
                        // torchrun variables are ignored when STRATA_* are present.
                        {"RANK", "5"},
                        {"WORLD_SIZE", "9"}});
  EXPECT_EQ(e.launcher, "strata");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.store, "10.0.0.1:7000");
  EXPECT_EQ(e.job_id, "job42");
  EXPECT_EQ(e.host_id, "hostA");
  EXPECT_EQ(e.job_token, "s3cret");
}

TEST(EnvParse, TorchrunVariables) {
  const Env e = env_of({{"RANK", "2"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", "0"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "node0"},
                        {"MASTER_PORT", "29511"},
                        {"TORCHELASTIC_RUN_ID", "elastic-1"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.store, "node0:29511");
  EXPECT_EQ(e.job_id, "elastic-1");
}

TEST(EnvParse, MasterPortDefaultsAndStrataStoreWins) {
  EXPECT_EQ(env_of({{"MASTER_ADDR", "node0"}}).store, "node0:29500");
  EXPECT_EQ(env_of({{"MASTER_ADDR", "node0"}, {"STRATA_STORE", "h:1"}}).store, "h:1");
}

TEST(EnvParse, OpenMpiVariables) {
  const Env e = env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                        {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
}

TEST(EnvParse, SlurmVariables) {
  const Env e = env_of({{"SLURM_PROCID", "7"},
                        {"SLURM_NTASKS", "16"},
                        {"SLURM_LOCALID", "3"},
                        {"SLURM_NTASKS_PER_NODE", "4"},
                        {"SLURM_JOB_ID", "12345"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 7);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.job_id, "12345");
}

TEST(EnvParse, SlurmLocalSizeAndStep) {
  // srun without --ntasks-per-node: the step's tasks per node, when it is one number.
  Env e = env_of({{"SLURM_PROCID", "1"},
                  {"SLURM_NTASKS", "4"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_STEP_TASKS_PER_NODE", "4"},
                  {"SLURM_JOB_ID", "7"},
                  {"SLURM_STEP_ID", "2"}});
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.job_id, "7.2");
  EXPECT_TRUE(e.check().is_ok());
  // Several nodes ("2(x2)"): unknown here, and not an error.
  e = env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  EXPECT_FALSE(e.local_size.has_value());
  EXPECT_TRUE(e.check().is_ok());
}

TEST(EnvParse, MpichHydraVariables) {
  // Hydra's ranks under a Slurm allocation also carry the proxy's SLURM_PROCID.
  const Env e = env_of({{"PMI_RANK", "3"},
                        {"PMI_SIZE", "4"},
                        {"MPI_LOCALRANKID", "1"},
                        {"MPI_LOCALNRANKS", "2"},
                        {"SLURM_PROCID", "0"},
                        {"SLURM_NTASKS", "2"},
                        {"SLURM_JOB_ID", "9"},
                        {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(e.launcher, "mpiexec");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.job_id, "");  // not the allocation's: detect_job derives one from the store
}

TEST(EnvParse, BehaviourAndHeapSettings) {
  const Env e = env_of({{"STRATA_TIMEOUT", "30s"},
                        {"STRATA_STORE_TIMEOUT", "1500"},
                        {"STRATA_SPIN_US", "0"},
                        {"STRATA_ONESHOT_MAX_BYTES", "128K"},
                        {"STRATA_CMA_MIN_BYTES", "64K"},
                        {"STRATA_CMA_REGISTERED_MIN_BYTES", "0"},
                        {"STRATA_OVERSUBSCRIBED", "1"},
                        {"STRATA_LOG", "debug"},
                        {"STRATA_KERNELS", "avx2"},
                        {"STRATA_HEAP_SEGMENT_SIZE", "256M"},
                        {"STRATA_HEAP_MAX_SIZE", "8G"},
                        {"STRATA_HEAP_SYMMETRIC_SIZE", "64MiB"},
                        {"STRATA_HEAP_HUGE_PAGES", "1"},
                        {"STRATA_HEAP_PREFAULT", "yes"},
                        {"STRATA_CMA", "0"}});
  EXPECT_EQ(e.timeout, 30000ms);
  EXPECT_EQ(e.store_connect_timeout, 1500ms);
  EXPECT_EQ(e.spin_us, 0u);
  EXPECT_EQ(e.oneshot_max_bytes, size_t{128} << 10);
  EXPECT_EQ(e.cma_min_bytes, size_t{64} << 10);
  EXPECT_EQ(e.cma_registered_min_bytes, size_t{0});
  EXPECT_EQ(e.oversubscribed, 1);
  EXPECT_EQ(env_of({{"STRATA_OVERSUBSCRIBED", "0"}}).oversubscribed, 0);
  EXPECT_EQ(env_of({{"STRATA_OVERSUBSCRIBED", "auto"}}).oversubscribed, -1);
  EXPECT_EQ(env_of({}).two_shot_stores, -1);
  EXPECT_EQ(env_of({{"STRATA_TWO_SHOT_STORES", "cached"}}).two_shot_stores, 0);
  EXPECT_EQ(env_of({{"STRATA_TWO_SHOT_STORES", "streamed"}}).two_shot_stores, 1);
  EXPECT_EQ(env_of({{"STRATA_TWO_SHOT_STORES", "auto"}}).two_shot_stores, -1);
  EXPECT_EQ(env_of({}).push, -1);
  EXPECT_EQ(env_of({{"STRATA_PUSH", "pull"}}).push, 0);
  EXPECT_EQ(env_of({{"STRATA_PUSH", "push"}}).push, 1);
  EXPECT_EQ(env_of({{"STRATA_PUSH", "auto"}}).push, -1);
  EXPECT_EQ(env_of({}).all_to_all_cma, -1);
  EXPECT_EQ(env_of({{"STRATA_ALL_TO_ALL_CMA", "staged"}}).all_to_all_cma, 0);
  EXPECT_EQ(env_of({{"STRATA_ALL_TO_ALL_CMA", "cma"}}).all_to_all_cma, 1);
  EXPECT_EQ(env_of({{"STRATA_ALL_TO_ALL_CMA", "auto"}}).all_to_all_cma, -1);
  EXPECT_EQ(env_of({}).all_gather_cma, -1);
  EXPECT_EQ(env_of({{"STRATA_ALL_GATHER_CMA", "cma"}}).all_gather_cma, 1);
  EXPECT_EQ(env_of({{"STRATA_ALL_GATHER_CMA", "staged"}}).all_gather_cma, 0);
  EXPECT_EQ(env_of({{"STRATA_ALL_GATHER_CMA", "staged"}}).all_to_all_cma, -1);
  EXPECT_EQ(env_of({}).reduce_scatter_cma, -1);
  EXPECT_EQ(env_of({{"STRATA_REDUCE_SCATTER_CMA", "staged"}}).reduce_scatter_cma, 0);
  EXPECT_EQ(env_of({{"STRATA_REDUCE_SCATTER_CMA", "cma"}}).reduce_scatter_cma, 1);
  EXPECT_EQ(env_of({{"STRATA_REDUCE_SCATTER_CMA", "cma"}}).all_gather_cma, -1);
  EXPECT_EQ(env_of({}).all_reduce_cma, -1);
  EXPECT_EQ(env_of({{"STRATA_ALL_REDUCE_CMA", "staged"}}).all_reduce_cma, 0);
  EXPECT_EQ(env_of({{"STRATA_ALL_REDUCE_CMA", "cma"}}).all_reduce_cma, 1);
  EXPECT_EQ(env_of({{"STRATA_ALL_REDUCE_CMA", "cma"}}).reduce_scatter_cma, -1);
  EXPECT_EQ(e.log_level, "debug");
  EXPECT_EQ(e.kernels, "avx2");
  EXPECT_EQ(e.heap_segment_size, size_t{256} << 20);
  EXPECT_EQ(e.heap_max_size, size_t{8} << 30);
  EXPECT_EQ(e.heap_symmetric_size, size_t{64} << 20);
  EXPECT_TRUE(e.heap_huge_pages);
  EXPECT_TRUE(e.heap_prefault);
  EXPECT_FALSE(e.cma);
}

// Strata picks UCX's rendezvous threshold unless the user tuned UCX itself; its own
// variable wins over both.
TEST(EnvParse, UcxRendezvousThresholdDefaultsUnlessUcxIsTuned) {
  EXPECT_EQ(env_of({}).ucx_rndv_thresh, "1m");
  EXPECT_EQ(env_of({{"UCX_RNDV_THRESH", "8k"}}).ucx_rndv_thresh, "");
  EXPECT_EQ(env_of({{"UCX_RNDV_THRESH", "8k"}, {"STRATA_UCX_RNDV_THRESH", "1m"}}).ucx_rndv_thresh, "1m");
  EXPECT_EQ(env_of({{"STRATA_UCX_DATAPATH", "put"}}).ucx_datapath, "put");
  EXPECT_EQ(env_of({{"STRATA_UCX_DATAPATH", "rdma"}}).ucx_datapath, "auto");  // not a choice: the default
}

// Striping of bulk transfers between hosts: lanes from 1 (off) to the two tag bits' 4, pieces of
// at least a page; a bad value names the variable and keeps the default.
TEST(EnvParse, UcxStriping) {
  const Env d = env_of({});
  EXPECT_EQ(d.ucx_lanes, 4);
  EXPECT_EQ(d.ucx_stripe_min, size_t{512} << 10);
  EXPECT_EQ(d.ucx_stripe_piece, size_t{256} << 10);
  const Env e = env_of({{"STRATA_UCX_LANES", "2"}, {"STRATA_UCX_STRIPE_MIN", "0"}, {"STRATA_UCX_STRIPE_PIECE", "64k"}});
  EXPECT_EQ(e.ucx_lanes, 2);
  EXPECT_EQ(e.ucx_stripe_min, 0u);
  EXPECT_EQ(e.ucx_stripe_piece, size_t{64} << 10);
  EXPECT_TRUE(e.invalid.empty());
  for (auto [var, bad] : {std::pair{"STRATA_UCX_LANES", "0"}, std::pair{"STRATA_UCX_LANES", "5"},
                          std::pair{"STRATA_UCX_STRIPE_PIECE", "1000"}, std::pair{"STRATA_UCX_STRIPE_MIN", "lots"}}) {
    const Env b = env_of({{var, bad}});
    EXPECT_EQ(b.ucx_lanes, 4) << var << "=" << bad;
    EXPECT_EQ(b.ucx_stripe_piece, size_t{256} << 10) << var << "=" << bad;
    ASSERT_EQ(b.invalid.size(), 1u) << var << "=" << bad;
    EXPECT_EQ(b.invalid[0].rfind(std::string(var) + "=" + bad, 0), 0u) << b.invalid[0];
  }
}

// A kernel set that does not exist is a typo, refused with the others (it fell back with a
// warning that only `strata bench` showed); a set the CPU lacks is chosen later, with a warning.
TEST(EnvParse, KernelsNameASet) {
  for (const char* ok : {"scalar", "avx2", "avx512", "auto"}) {
    const Env e = env_of({{"STRATA_KERNELS", ok}});
    EXPECT_EQ(e.kernels, ok);
    EXPECT_TRUE(e.invalid.empty()) << ok;
  }
  const Env b = env_of({{"STRATA_KERNELS", "bogus"}});
  EXPECT_EQ(b.kernels, "");
  ASSERT_EQ(b.invalid.size(), 1u);
  EXPECT_EQ(b.invalid[0].rfind("STRATA_KERNELS=bogus", 0), 0u) << b.invalid[0];
  EXPECT_NE(b.invalid[0].find("scalar, avx2, avx512, auto"), std::string::npos) << b.invalid[0];
}

TEST(EnvParse, BooleanSpellings) {
  for (const char* off : {"0", "false", "no", "off"}) EXPECT_FALSE(env_of({{"STRATA_CMA", off}}).cma) << off;
  for (const char* on : {"1", "true", "yes", "on"})
    EXPECT_TRUE(env_of({{"STRATA_HEAP_PREFAULT", on}}).heap_prefault) << on;
  EXPECT_TRUE(env_of({{"STRATA_CMA", ""}}).cma);  // empty keeps the default
}

// STRATA_FLIGHT_RECORDER: entries per communicator; 0 turns the recorder off; nonsense and
// absurd sizes are refused (the ring lies in every control block).
TEST(EnvParse, FlightRecorderSize) {
  EXPECT_EQ(env_of({}).flight_recorder, 64u);
  EXPECT_EQ(env_of({{"STRATA_FLIGHT_RECORDER", "0"}}).flight_recorder, 0u);
  EXPECT_EQ(env_of({{"STRATA_FLIGHT_RECORDER", "200"}}).flight_recorder, 200u);
  for (const char* bad : {"-1", "lots", "2000000"}) {
    const Env e = env_of({{"STRATA_FLIGHT_RECORDER", bad}});
    EXPECT_EQ(e.flight_recorder, 64u) << bad;
    ASSERT_EQ(e.invalid.size(), 1u) << bad;
    EXPECT_EQ(e.invalid[0].rfind(std::string("STRATA_FLIGHT_RECORDER=") + bad, 0), 0u) << e.invalid[0];
  }
}

// A value that does not parse keeps the default instead of becoming 0.
TEST(EnvParse, InvalidValuesKeepDefaults) {
  const Env e = env_of({{"STRATA_TIMEOUT", "soon"},
                        {"STRATA_ONESHOT_MAX_BYTES", "12X"},
                        {"STRATA_SPIN_US", "-5"},
                        {"STRATA_RANK", "two"},
                        {"STRATA_HEAP_MAX_SIZE", ""}});
  EXPECT_EQ(e.timeout, 300000ms);
  EXPECT_EQ(e.oneshot_max_bytes, size_t{8} << 10);
  EXPECT_EQ(e.spin_us, 500u);
  EXPECT_EQ(e.launcher, "strata");
  EXPECT_FALSE(e.rank.has_value());
  EXPECT_EQ(e.heap_max_size, size_t{64} << 30);
}

// ...and names each such variable, so that init() and the launcher refuse to start with it.
TEST(EnvParse, InvalidValuesAreNamedAndChecked) {
  const Env e = env_of({{"STRATA_TIMEOUT", "soon"},
                        {"STRATA_ONESHOT_MAX_BYTES", "12X"},
                        {"STRATA_SPIN_US", "-5"},
                        {"STRATA_RANK", "4294967297"},
                        {"STRATA_CMA", "maybe"},
                        {"STRATA_UCX_DATAPATH", "rdma"},
                        {"STRATA_LOG", "loud"},
                        {"STRATA_TWO_SHOT_STORES", "fast"},
                        {"STRATA_PUSH", "both"},
                        {"STRATA_ALL_TO_ALL_CMA", "yes"},
                        {"STRATA_REDUCE_SCATTER_CMA", "single"},
                        {"STRATA_HEARTBEAT_TIMEOUT", "0ms"},
                        {"STRATA_HEAP_MAX_SIZE", ""}});
  std::string all;
  for (const auto& s : e.invalid) all += s + "\n";
  for (const char* want : {"STRATA_TIMEOUT=soon", "STRATA_ONESHOT_MAX_BYTES=12X", "STRATA_SPIN_US=-5",
                           "STRATA_RANK=4294967297", "STRATA_CMA=maybe", "STRATA_UCX_DATAPATH=rdma", "STRATA_LOG=loud",
                           "STRATA_TWO_SHOT_STORES=fast", "STRATA_PUSH=both", "STRATA_ALL_TO_ALL_CMA=yes",
                           "STRATA_REDUCE_SCATTER_CMA=single", "STRATA_HEARTBEAT_TIMEOUT=0ms"})
    EXPECT_NE(all.find(want), std::string::npos) << want << " missing from:\n" << all;
  EXPECT_EQ(e.invalid.size(), 12u) << "an empty value is unset, not invalid:\n" << all;
  Status st = e.check();
  EXPECT_EQ(st.code(), Code::InvalidArgument);
  EXPECT_NE(st.message().find("STRATA_RANK=4294967297"), std::string::npos) << st.message();
  EXPECT_TRUE(env_of({{"STRATA_TIMEOUT", "2s"}, {"STRATA_CMA", "off"}}).check().is_ok());
}

// A deadline of 0 would fail every wait at once: refused, like the heartbeat's.
TEST(EnvParse, ZeroTimeoutsAreRefused) {
  const Env e = env_of({{"STRATA_TIMEOUT", "0"}, {"STRATA_STORE_TIMEOUT", "0ms"}});
  EXPECT_EQ(e.timeout, 300000ms);
  std::string all;
  for (const auto& s : e.invalid) all += s + "\n";
  EXPECT_NE(all.find("STRATA_TIMEOUT=0"), std::string::npos) << all;
  EXPECT_NE(all.find("STRATA_STORE_TIMEOUT=0ms"), std::string::npos) << all;
  EXPECT_NE(all.find("must be longer than 0 ms"), std::string::npos) << all;
}

// A replacement's start timeout follows STRATA_TIMEOUT (half of it: the survivors wait for
// the replacement that long) unless set; 0 is refused like the other timeouts.
TEST(EnvParse, StartTimeoutDefaultsToHalfTheTimeout) {
  EXPECT_EQ(env_of({}).start_timeout_or_default(), 150000ms);
  EXPECT_EQ(env_of({{"STRATA_TIMEOUT", "10s"}}).start_timeout_or_default(), 5000ms);
  EXPECT_EQ(env_of({{"STRATA_TIMEOUT", "10s"}, {"STRATA_START_TIMEOUT", "3s"}}).start_timeout_or_default(), 3000ms);
  const Env zero = env_of({{"STRATA_START_TIMEOUT", "0"}});
  ASSERT_EQ(zero.invalid.size(), 1u);
  EXPECT_NE(zero.invalid[0].find("STRATA_START_TIMEOUT=0"), std::string::npos) << zero.invalid[0];
}

// The size and duration syntax itself is tested in parse_test.cpp (common/parse.hpp).
TEST(EnvParse, SizesAreBinaryAndDurationsDefaultToMilliseconds) {
  const Env e = env_of({{"STRATA_ONESHOT_MAX_BYTES", "64KB"},
                        {"STRATA_CMA_MIN_BYTES", "2MiB"},
                        {"STRATA_HEAP_SEGMENT_SIZE", "1G"},
                        {"STRATA_TIMEOUT", "1500"},
                        {"STRATA_STORE_TIMEOUT", "2s"}});
  EXPECT_EQ(e.oneshot_max_bytes, size_t{64} << 10);
  EXPECT_EQ(e.cma_min_bytes, size_t{2} << 20);
  EXPECT_EQ(e.heap_segment_size, size_t{1} << 30);
  EXPECT_EQ(e.timeout, 1500ms);
  EXPECT_EQ(e.store_connect_timeout, 2000ms);
}

}  // namespace
}  // namespace strata

#pragma once
// Where this process sits in the job: rank, size, store and host identity, from the Env
// (STRATA_*, torchrun, Open MPI or Slurm variables) and explicit overrides.

#include <optional>
#include <string>

#include "common/env.hpp"
#include "common/status.hpp"

namespace strata::bootstrap {

struct JobInfo {
  int rank = 0;
  int world_size = 1;
  std::string store;   // "host:port"; empty when world_size == 1 and no store was given
  std::string token;   // job token presented to the store
  std::string job_id;  // unique per job; names abstract sockets, store keys
  // job_id was derived from the store address and token alone (no launcher gave one), so it is
  // the same for every job on that store: init() appends a generation the store hands out per
  // run (coll/context.cpp, join_run_generation).
  bool id_from_store = false;
  std::string host_id;  // ranks with equal host_id share memory
};

struct JobOverrides {
  std::optional<int> rank, world_size;
  std::string store, token, job_id, host_id;
};

/// Combines overrides (first) and the Env. Fails with InvalidArgument naming the variable
/// when the placement is incomplete or inconsistent (rank >= world size, no store for a
/// multi-rank job, ...).
Result<JobInfo> detect_job(const Env& env, const JobOverrides& overrides = {});

/// Host identity: STRATA_HOST_ID when set, else "<hostname>:<boot id>".
std::string host_identity(const Env& env);

/// Where the launcher notes, in job `job_id`'s store, that a rank exited (how, as text): a
/// rank that exited before publishing its world record never will (coll/context.cpp waits
/// for those records). The keys are exited_prefix(job_id) + the rank.
inline std::string exited_prefix(const std::string& job_id) { return "strata/" + job_id + "/exited/"; }
inline std::string exited_key(const std::string& job_id, int rank) {
  return exited_prefix(job_id) + std::to_string(rank);
}

}  // namespace strata::bootstrap

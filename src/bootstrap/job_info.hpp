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
  std::string store;    // "host:port"; empty when world_size == 1 and no store was given
  std::string token;    // job token presented to the store
  std::string job_id;   // unique per job; names abstract sockets, store keys
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

}  // namespace strata::bootstrap

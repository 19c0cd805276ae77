#include "bootstrap/job_info.hpp"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>

#include "bootstrap/store.hpp"
#include "common/sha256.hpp"

namespace strata::bootstrap {

namespace {

// The variables a launcher uses, so an error names what the user actually set.
struct VarNames {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_size;
};

VarNames var_names(const std::string& launcher) {
  if (launcher == "torchrun") return {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  if (launcher == "mpirun")
    return {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
  if (launcher == "mpiexec") return {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
  if (launcher == "slurm") return {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
  return {"STRATA_RANK", "STRATA_WORLD_SIZE", "STRATA_LOCAL_RANK", "STRATA_LOCAL_SIZE"};
}

// A value with the name of where it came from: "STRATA_RANK=5" or "InitOptions.rank=5".
struct Named {
  std::optional<int> value;
  std::string name;
  std::string show() const { return name + "=" + (value ? std::to_string(*value) : std::string("?")); }
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// An id derived from the token: keyed with it (HMAC-SHA256, 64 bits shown), because the id
// crosses the network in every store key, and a plain hash of the token would let whoever
// sees one test guesses of the token faster than against the store's own handshake.
std::string keyed_id(const std::string& token, const std::string& what) {
  return to_hex(hmac_sha256(token, what)).substr(0, 16);
}

}  // namespace

Result<JobInfo> detect_job(const Env& env, const JobOverrides& overrides) {
  // A rank refuses a setting it could not read rather than run with its default.
  STRATA_RETURN_IF_ERROR(env.check());
  VarNames vars = var_names(env.launcher);
  Named rank = overrides.rank ? Named{overrides.rank, "InitOptions.rank"} : Named{env.rank, vars.rank};
  Named size =
      overrides.world_size ? Named{overrides.world_size, "InitOptions.size"} : Named{env.world_size, vars.world_size};

  JobInfo job;
  if (!rank.value && !size.value) {
    // A launcher was recognised by its rank variable, which then failed to parse.
    if (!env.launcher.empty()) return invalid_argument(std::string(vars.rank) + " is set but is not an integer");
    // Nothing at all: a single process, which needs no store.
  } else if (!size.value) {
    return invalid_argument(rank.show() + " is set but " + size.name + " is missing or not an integer");
  } else if (!rank.value) {
    if (*size.value != 1)
      return invalid_argument(size.show() + " is set but " + rank.name + " is missing or not an integer");
    job.world_size = 1;
  } else {
    job.rank = *rank.value;
    job.world_size = *size.value;
  }
  if (job.world_size < 1) return invalid_argument(size.show() + " must be at least 1");
  if (job.rank < 0) return invalid_argument(rank.show() + " must not be negative");
  if (job.rank >= job.world_size) return invalid_argument(rank.show() + " is not below " + size.show());
  if (!overrides.rank && env.local_rank && env.local_size && *env.local_rank >= *env.local_size)
    return invalid_argument(std::string(vars.local_rank) + "=" + std::to_string(*env.local_rank) + " is not below " +
                            vars.local_size + "=" + std::to_string(*env.local_size));

  const char* store_var = overrides.store.empty() ? "STRATA_STORE (or MASTER_ADDR:MASTER_PORT)" : "InitOptions.store";
  job.store = overrides.store.empty() ? env.store : overrides.store;
  if (job.store.empty() && job.world_size > 1)
    return invalid_argument("a " + std::to_string(job.world_size) + "-rank job needs a store: set " + store_var +
                            " to host:port (strata run does this for its ranks)");
  if (!job.store.empty()) {
    auto addr = StoreAddress::parse(job.store);
    if (!addr.is_ok()) return addr.status().with_context(std::string(store_var) + ": ");
  }
  job.token = overrides.token.empty() ? env.job_token : overrides.token;
  job.host_id = overrides.host_id.empty() ? host_identity(env) : overrides.host_id;

  job.job_id = overrides.job_id.empty() ? env.job_id : overrides.job_id;
  if (job.job_id.empty()) {
    if (!env.launcher_job.empty()) {
      // Open MPI's identity of this mpirun: hashed, as it is part of socket paths.
      job.job_id = "mpirun-" + keyed_id(job.token, env.launcher_job + '\n' + job.store);
    } else if (!job.store.empty()) {
      // Every rank sees the same store and token, so every rank derives the same id.
      job.job_id = "job-" + keyed_id(job.token, job.store);
      job.id_from_store = true;
    } else {
      // A lone process only needs an id no other process on the host uses right now.
      auto now = std::chrono::steady_clock::now().time_since_epoch().count();
      job.job_id = "solo-" + hex64(fnv1a(job.host_id + '\n' + std::to_string(::getpid()) + '\n' + std::to_string(now)));
    }
  }
  return job;
}

std::string host_identity(const Env& env) {
  if (!env.host_id.empty()) return env.host_id;
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "unknown-host");
  std::string id = name;
  // Hostnames are not unique (cloned VMs, default container names); the boot id tells
  // apart machines that share one.
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot && std::getline(boot, boot_id) && !boot_id.empty()) id += ":" + boot_id;
  return id;
}

}  // namespace strata::bootstrap

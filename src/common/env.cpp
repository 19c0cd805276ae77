#include "common/env.hpp"

#include <cstdlib>
#include <limits>

#include "common/parse.hpp"

namespace strata {
namespace env_detail {

namespace {

// A malformed or out-of-range value leaves the setting unset (the default stays).
std::optional<int> to_int(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  auto v = parse_int(*s, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  if (!v.is_ok()) return std::nullopt;
  return static_cast<int>(*v);
}

std::optional<size_t> to_size(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  auto v = parse_size(*s);
  if (!v.is_ok()) return std::nullopt;
  return *v;
}

// Durations count milliseconds when no unit is given (STRATA_TIMEOUT=1500).
std::optional<std::chrono::milliseconds> to_duration(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  auto v = parse_duration(*s, BareDuration::Milliseconds);
  if (!v.is_ok()) return std::nullopt;
  return *v;
}

bool to_bool(const std::optional<std::string>& s, bool dflt) {
  if (!s || s->empty()) return dflt;
  return !(*s == "0" || *s == "false" || *s == "no" || *s == "off");
}

}  // namespace

Env parse(Lookup lookup, void* ctx) {
  auto get = [&](const char* k) { return lookup(k, ctx); };
  Env e;
  auto first_int = [&](std::initializer_list<const char*> keys) -> std::optional<int> {
    for (const char* k : keys)
      if (auto v = to_int(get(k))) return v;
    return std::nullopt;
  };
  if (get("STRATA_RANK")) e.launcher = "strata";
  else if (get("RANK") && get("WORLD_SIZE")) e.launcher = "torchrun";
  else if (get("OMPI_COMM_WORLD_RANK")) e.launcher = "mpirun";
  else if (get("SLURM_PROCID")) e.launcher = "slurm";

  if (e.launcher == "strata") {
    e.rank = first_int({"STRATA_RANK"});
    e.world_size = first_int({"STRATA_WORLD_SIZE"});
    e.local_rank = first_int({"STRATA_LOCAL_RANK"});
    e.local_size = first_int({"STRATA_LOCAL_SIZE"});
  } else if (e.launcher == "torchrun") {
    e.rank = first_int({"RANK"});
    e.world_size = first_int({"WORLD_SIZE"});
    e.local_rank = first_int({"LOCAL_RANK"});
    e.local_size = first_int({"LOCAL_WORLD_SIZE"});
  } else if (e.launcher == "mpirun") {
    e.rank = first_int({"OMPI_COMM_WORLD_RANK"});
    e.world_size = first_int({"OMPI_COMM_WORLD_SIZE"});
    e.local_rank = first_int({"OMPI_COMM_WORLD_LOCAL_RANK"});
    e.local_size = first_int({"OMPI_COMM_WORLD_LOCAL_SIZE"});
  } else if (e.launcher == "slurm") {
    e.rank = first_int({"SLURM_PROCID"});
    e.world_size = first_int({"SLURM_NTASKS"});
    e.local_rank = first_int({"SLURM_LOCALID"});
    e.local_size = first_int({"SLURM_NTASKS_PER_NODE"});
  }

  if (auto s = get("STRATA_STORE"); s && !s->empty()) {
    e.store = *s;
  } else if (auto a = get("MASTER_ADDR"); a && !a->empty()) {
    auto p = get("MASTER_PORT");
    e.store = *a + ":" + (p ? *p : std::string("29500"));
  }
  if (auto s = get("STRATA_JOB_TOKEN")) e.job_token = *s;
  if (auto s = get("STRATA_JOB_ID")) e.job_id = *s;
  else if (auto t = get("TORCHELASTIC_RUN_ID")) e.job_id = *t;
  else if (auto t = get("SLURM_JOB_ID")) e.job_id = *t;
  if (auto s = get("STRATA_HOST_ID")) e.host_id = *s;
  e.node_rank = to_int(get("STRATA_NODE_RANK"));
  if (!e.node_rank && e.launcher == "torchrun") e.node_rank = to_int(get("GROUP_RANK"));
  e.nnodes = to_int(get("STRATA_NNODES"));

  if (auto d = to_duration(get("STRATA_TIMEOUT"))) e.timeout = *d;
  if (auto d = to_duration(get("STRATA_STORE_TIMEOUT"))) e.store_connect_timeout = *d;
  if (auto d = to_duration(get("STRATA_STORE_HELLO_TIMEOUT")); d && d->count() > 0) e.store_hello_timeout = *d;
  if (auto v = to_int(get("STRATA_STORE_MAX_PENDING")); v && *v > 0) e.store_max_pending = static_cast<size_t>(*v);
  if (auto v = to_size(get("STRATA_STORE_MAX_CONN_BYTES")); v && *v >= 4096) e.store_max_conn_bytes = *v;
  if (auto v = to_int(get("STRATA_STORE_REPLY_CACHE")); v && *v > 0) e.store_reply_cache = static_cast<size_t>(*v);
  if (auto d = to_duration(get("STRATA_AGENT_TIMEOUT")); d && d->count() > 0) e.agent_timeout = *d;
  if (auto v = to_int(get("STRATA_SPIN_US")); v && *v >= 0) e.spin_us = static_cast<uint32_t>(*v);
  if (auto s = get("STRATA_OVERSUBSCRIBED"); s && *s != "auto" && !s->empty())
    e.oversubscribed = to_bool(s, false) ? 1 : 0;
  if (auto v = to_size(get("STRATA_ONESHOT_MAX_BYTES"))) e.oneshot_max_bytes = *v;
  if (auto v = to_size(get("STRATA_CMA_MIN_BYTES"))) e.cma_min_bytes = *v;
  if (auto s = get("STRATA_LOG")) e.log_level = *s;
  if (auto s = get("STRATA_KERNELS")) e.kernels = *s;
  if (auto v = to_size(get("STRATA_HEAP_SEGMENT_SIZE"))) e.heap_segment_size = *v;
  if (auto v = to_size(get("STRATA_HEAP_MAX_SIZE"))) e.heap_max_size = *v;
  if (auto v = to_size(get("STRATA_HEAP_SYMMETRIC_SIZE"))) e.heap_symmetric_size = *v;
  e.heap_huge_pages = to_bool(get("STRATA_HEAP_HUGE_PAGES"), false);
  e.heap_prefault = to_bool(get("STRATA_HEAP_PREFAULT"), false);
  e.cma = to_bool(get("STRATA_CMA"), true);
  e.ft = to_bool(get("STRATA_FT"), false);
  if (auto v = to_int(get("STRATA_EPOCH")); v && *v >= 0) e.epoch = static_cast<uint64_t>(*v);
  if (auto d = to_duration(get("STRATA_HEARTBEAT_INTERVAL")); d && d->count() > 0) e.heartbeat_interval = *d;
  if (auto d = to_duration(get("STRATA_HEARTBEAT_TIMEOUT")); d && d->count() > 0) e.heartbeat_timeout = *d;
  if (auto s = get("STRATA_UCX_TLS")) e.ucx_tls = *s;
  if (auto s = get("STRATA_UCX_NET_DEVICES")) e.ucx_net_devices = *s;
  if (auto s = get("STRATA_UCX_RNDV_THRESH")) e.ucx_rndv_thresh = *s;
  else if (get("UCX_RNDV_THRESH")) e.ucx_rndv_thresh.clear();  // tuned through UCX itself
  if (auto s = get("STRATA_UCX_DATAPATH"); s && (*s == "auto" || *s == "tag" || *s == "put")) e.ucx_datapath = *s;
  return e;
}

}  // namespace env_detail

Env Env::from_process() {
  return from_lookup([](const char* k) -> std::optional<std::string> {
    const char* v = std::getenv(k);
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

const Env& Env::get() {
  static const Env env = from_process();
  return env;
}

}  // namespace strata

#include "common/env.hpp"

#include <cctype>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/parse.hpp"

namespace strata {
namespace env_detail {

namespace {

// A variable as the environment holds it, with its name and where to report a value that
// does not parse: the setting keeps its default and Env::invalid names the variable, so that
// init() and the launcher refuse to start rather than run with a setting the user did not ask
// for (STRATA_RANK=4294967297 must not become rank 1, nor STRATA_TIMEOUT=soon 5 minutes).
struct Var : std::optional<std::string> {
  const char* key = "";
  std::vector<std::string>* invalid = nullptr;
  void reject(const std::string& why) const {
    if (invalid) invalid->push_back(std::string(key) + "=" + **this + ": " + why);
  }
};

std::optional<int> to_int(const Var& s, int lo = std::numeric_limits<int>::min(),
                          int hi = std::numeric_limits<int>::max()) {
  if (!s || s->empty()) return std::nullopt;  // exported but empty: unset
  auto v = parse_int(*s, lo, hi);
  if (!v.is_ok()) {
    s.reject(v.status().message());
    return std::nullopt;
  }
  return static_cast<int>(*v);
}

std::optional<size_t> to_size(const Var& s) {
  if (!s || s->empty()) return std::nullopt;  // exported but empty: unset
  auto v = parse_size(*s);
  if (!v.is_ok()) {
    s.reject(v.status().message());
    return std::nullopt;
  }
  return *v;
}

// Durations count milliseconds when no unit is given (STRATA_TIMEOUT=1500). `positive`: zero
// is rejected too (an interval of 0 would spin).
std::optional<std::chrono::milliseconds> to_duration(const Var& s, bool positive = false) {
  if (!s || s->empty()) return std::nullopt;  // exported but empty: unset
  auto v = parse_duration(*s, BareDuration::Milliseconds);
  if (!v.is_ok()) {
    s.reject(v.status().message());
    return std::nullopt;
  }
  if (positive && v->count() <= 0) {
    s.reject("must be longer than 0 ms");
    return std::nullopt;
  }
  return *v;
}

bool to_bool(const Var& s, bool dflt) {
  if (!s || s->empty()) return dflt;
  for (const char* off : {"0", "false", "no", "off"})
    if (*s == off) return false;
  for (const char* on : {"1", "true", "yes", "on"})
    if (*s == on) return true;
  s.reject("not a boolean (1/0, true/false, yes/no, on/off)");
  return dflt;
}

}  // namespace

Env parse(Lookup lookup, void* ctx) {
  Env e;
  auto get = [&](const char* k) {
    Var v;
    static_cast<std::optional<std::string>&>(v) = lookup(k, ctx);
    v.key = k;
    v.invalid = &e.invalid;
    return v;
  };
  auto first_int = [&](std::initializer_list<const char*> keys) -> std::optional<int> {
    for (const char* k : keys)
      if (auto v = to_int(get(k), 0)) return v;
    return std::nullopt;
  };
  // A hot spare has every STRATA_* placement variable but its rank, learnt at assignment.
  if (get("STRATA_RANK") || get("STRATA_SPARE")) e.launcher = "strata";
  else if (get("RANK") && get("WORLD_SIZE")) e.launcher = "torchrun";
  else if (get("OMPI_COMM_WORLD_RANK")) e.launcher = "mpirun";
  // MPICH's mpiexec (Hydra) before Slurm: under an allocation its ranks inherit the proxy's
  // SLURM_PROCID, which is not theirs.
  else if (get("PMI_RANK") && get("PMI_SIZE")) e.launcher = "mpiexec";
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
    // Both are the same on every rank of one mpirun and differ from one mpirun to the next (the
    // second is random per job), so two jobs on one store do not share an id.
    auto ns = get("PMIX_NAMESPACE"), pt = get("OMPI_MCA_orte_precondition_transports");
    if ((ns && !ns->empty()) || (pt && !pt->empty())) e.launcher_job = ns.value_or("") + "/" + pt.value_or("");
  } else if (e.launcher == "mpiexec") {
    e.rank = first_int({"PMI_RANK"});
    e.world_size = first_int({"PMI_SIZE"});
    e.local_rank = first_int({"MPI_LOCALRANKID"});
    e.local_size = first_int({"MPI_LOCALNRANKS"});
  } else if (e.launcher == "slurm") {
    e.rank = first_int({"SLURM_PROCID"});
    e.world_size = first_int({"SLURM_NTASKS"});
    e.local_rank = first_int({"SLURM_LOCALID"});
    e.local_size = first_int({"SLURM_NTASKS_PER_NODE"});
    // srun sets SLURM_NTASKS_PER_NODE only when asked for it; SLURM_STEP_TASKS_PER_NODE is
    // "4" on one node but "2(x3),1" across several, where this node's count is not in it.
    if (!e.local_size) {
      auto t = get("SLURM_STEP_TASKS_PER_NODE");
      if (t && !t->empty() && t->find_first_not_of("0123456789") == std::string::npos) e.local_size = to_int(t, 1);
    }
  }

  if (auto s = get("STRATA_STORE"); s && !s->empty()) {
    e.store = *s;
  } else if (auto a = get("MASTER_ADDR"); a && !a->empty()) {
    auto p = get("MASTER_PORT");
    e.store = *a + ":" + (p ? *p : std::string("29500"));
  }
  if (auto s = get("STRATA_JOB_TOKEN")) e.job_token = *s;
  if (auto s = get("STRATA_JOB_ID")) e.job_id = *s;
  // torchrun's default run id is "none", the same for every run: no id at all.
  else if (auto t = get("TORCHELASTIC_RUN_ID"); t && *t != "none") e.job_id = *t;
  else if (auto t = get("SLURM_JOB_ID"); t && e.launcher == "slurm") {
    // Steps of one allocation run at the same time; each is a job of its own here. (mpirun or
    // mpiexec inside an allocation inherit SLURM_JOB_ID too, but are not its steps: their id
    // comes from their store.)
    auto step = get("SLURM_STEP_ID");
    e.job_id = *t + (step && !step->empty() ? "." + *step : std::string());
  }
  if (auto s = get("STRATA_HOST_ID")) e.host_id = *s;
  e.node_rank = to_int(get("STRATA_NODE_RANK"), 0);
  if (!e.node_rank && e.launcher == "torchrun") e.node_rank = to_int(get("GROUP_RANK"), 0);
  e.nnodes = to_int(get("STRATA_NNODES"), 1);

  if (auto d = to_duration(get("STRATA_TIMEOUT"), true)) e.timeout = *d;
  if (auto d = to_duration(get("STRATA_STORE_TIMEOUT"), true)) e.store_connect_timeout = *d;
  if (auto d = to_duration(get("STRATA_STORE_HELLO_TIMEOUT"), true)) e.store_hello_timeout = *d;
  if (auto v = to_int(get("STRATA_STORE_MAX_PENDING"), 1)) e.store_max_pending = static_cast<size_t>(*v);
  if (auto s = get("STRATA_STORE_MAX_CONN_BYTES")) {
    if (auto v = to_size(s); v && *v >= 4096) e.store_max_conn_bytes = *v;
    else if (v) s.reject("must be at least 4096 bytes");
  }
  if (auto v = to_int(get("STRATA_STORE_REPLY_CACHE"), 1)) e.store_reply_cache = static_cast<size_t>(*v);
  if (auto d = to_duration(get("STRATA_AGENT_TIMEOUT"), true)) {
    e.agent_timeout = *d;
    e.agent_timeout_set = true;
  }
  if (auto d = to_duration(get("STRATA_AGENT_HEARTBEAT"), true)) e.agent_heartbeat = *d;
  if (auto v = to_int(get("STRATA_SPIN_US"), 0)) e.spin_us = static_cast<uint32_t>(*v);
  if (auto s = get("STRATA_OVERSUBSCRIBED"); s && *s != "auto" && !s->empty()) {
    const size_t before = e.invalid.size();
    const bool on = to_bool(s, false);
    if (e.invalid.size() == before) e.oversubscribed = on ? 1 : 0;
  }
  if (auto v = to_size(get("STRATA_ONESHOT_MAX_BYTES"))) e.oneshot_max_bytes = *v;
  if (auto s = get("STRATA_TWO_SHOT_STORES"); s && !s->empty()) {
    if (*s == "auto") e.two_shot_stores = -1;
    else if (*s == "cached") e.two_shot_stores = 0;
    else if (*s == "streamed") e.two_shot_stores = 1;
    else s.reject("not one of auto, cached, streamed");
  }
  if (auto s = get("STRATA_PUSH"); s && !s->empty()) {
    if (*s == "auto") e.push = -1;
    else if (*s == "pull") e.push = 0;
    else if (*s == "push") e.push = 1;
    else s.reject("not one of auto, pull, push");
  }
  for (auto [name, field] :
       {std::pair{"STRATA_ALL_TO_ALL_CMA", &e.all_to_all_cma}, std::pair{"STRATA_ALL_GATHER_CMA", &e.all_gather_cma},
        std::pair{"STRATA_REDUCE_SCATTER_CMA", &e.reduce_scatter_cma},
        std::pair{"STRATA_ALL_REDUCE_CMA", &e.all_reduce_cma}}) {
    if (auto s = get(name); s && !s->empty()) {
      if (*s == "auto") *field = -1;
      else if (*s == "staged") *field = 0;
      else if (*s == "cma") *field = 1;
      else s.reject("not one of auto, staged, cma");
    }
  }
  if (auto v = to_size(get("STRATA_CMA_MIN_BYTES"))) e.cma_min_bytes = *v;
  if (auto v = to_size(get("STRATA_CMA_REGISTERED_MIN_BYTES"))) e.cma_registered_min_bytes = *v;
  if (auto v = to_int(get("STRATA_FLIGHT_RECORDER"), 0, 1 << 20)) e.flight_recorder = static_cast<size_t>(*v);
  if (auto s = get("STRATA_LOG"); s && !s->empty()) {
    if (*s == "error" || *s == "warn" || *s == "info" || *s == "debug") e.log_level = *s;
    else s.reject("not one of error, warn, info, debug");
  }
  // A name that is not a kernel set is a typo, refused like any other value; a set this CPU
  // lacks falls back with a warning where the kernels are chosen (common/reduce.cpp).
  // The names are kernels::parse_isa's, spelt here too: the settings stay a leaf that small
  // tools (the fuzzers) link without the kernels.
  if (auto s = get("STRATA_KERNELS")) {
    std::string k = *s;
    for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (k.empty() || k == "auto" || k == "scalar" || k == "avx2" || k == "avx512") e.kernels = k;
    else s.reject("not one of scalar, avx2, avx512, auto");
  }
  if (auto v = to_size(get("STRATA_HEAP_SEGMENT_SIZE"))) e.heap_segment_size = *v;
  if (auto v = to_size(get("STRATA_HEAP_MAX_SIZE"))) e.heap_max_size = *v;
  if (auto v = to_size(get("STRATA_HEAP_SYMMETRIC_SIZE"))) e.heap_symmetric_size = *v;
  e.heap_huge_pages = to_bool(get("STRATA_HEAP_HUGE_PAGES"), false);
  e.heap_prefault = to_bool(get("STRATA_HEAP_PREFAULT"), false);
  if (auto s = get("STRATA_SOCKET_DIR"); s && !s->empty()) {
    if ((*s)[0] == '/') e.socket_dir = *s;
    else s.reject("must be an absolute path");
  }
  e.cma = to_bool(get("STRATA_CMA"), true);
  e.ft = to_bool(get("STRATA_FT"), false);
  if (auto v = to_int(get("STRATA_EPOCH"), 0)) e.epoch = static_cast<uint64_t>(*v);
  e.spare = to_int(get("STRATA_SPARE"), 0);
  if (auto d = to_duration(get("STRATA_HEARTBEAT_INTERVAL"), true)) e.heartbeat_interval = *d;
  if (auto d = to_duration(get("STRATA_HEARTBEAT_TIMEOUT"), true)) e.heartbeat_timeout = *d;
  if (auto d = to_duration(get("STRATA_START_TIMEOUT"), true)) e.start_timeout = *d;
  if (auto s = get("STRATA_UCX_TLS")) e.ucx_tls = *s;
  if (auto s = get("STRATA_UCX_NET_DEVICES")) e.ucx_net_devices = *s;
  if (auto s = get("STRATA_UCX_RNDV_THRESH")) e.ucx_rndv_thresh = *s;
  else if (get("UCX_RNDV_THRESH")) e.ucx_rndv_thresh.clear();  // tuned through UCX itself
  if (auto v = to_int(get("STRATA_UCX_LANES"), 1, Env::kMaxUcxLanes)) e.ucx_lanes = *v;
  if (auto v = to_size(get("STRATA_UCX_STRIPE_MIN"))) e.ucx_stripe_min = *v;
  if (auto s = get("STRATA_UCX_STRIPE_PIECE"); s && !s->empty()) {
    if (auto v = to_size(s)) {
      if (*v >= 4096) e.ucx_stripe_piece = *v;
      else s.reject("must be at least 4096 bytes");
    }
  }
  if (auto s = get("STRATA_UCX_DATAPATH"); s && !s->empty()) {
    if (*s == "auto" || *s == "tag" || *s == "put") e.ucx_datapath = *s;
    else s.reject("not one of auto, tag, put");
  }
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

Status Env::check() const {
  if (invalid.empty()) return Status::ok();
  std::string msg = "invalid environment setting" + std::string(invalid.size() > 1 ? "s" : "") + ": ";
  for (size_t i = 0; i < invalid.size(); ++i) msg += (i ? "; " : "") + invalid[i];
  return invalid_argument(msg);
}

const Env& Env::get() {
  static const Env env = from_process();
  return env;
}

}  // namespace strata

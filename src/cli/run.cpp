// `strata run`: the command line and its dispatch. The launcher it starts is in
// launcher.cpp (one host), node_agent.cpp (--nnodes: one agent per host) and ft_run.cpp (--ft).

#include <unistd.h>

#include <string>
#include <string_view>

#include "bootstrap/store.hpp"
#include "cli/commands.hpp"
#include "cli/launcher.hpp"
#include "common/env.hpp"
#include "common/parse.hpp"

namespace strata::cli {
namespace {

using launch::kRunWho;
using launch::RunOptions;

const char kUsage[] =
    "usage: strata run -n N [options] [--] PROGRAM [ARGS...]\n"
    "       strata run --nnodes H --node-rank I --store ADDR:PORT -n N [options] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts a rendezvous store on 127.0.0.1 and N copies of PROGRAM with STRATA_RANK,\n"
    "STRATA_WORLD_SIZE, STRATA_LOCAL_RANK, STRATA_LOCAL_SIZE, STRATA_STORE, STRATA_JOB_TOKEN\n"
    "and STRATA_JOB_ID set, and torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
    "MASTER_ADDR and MASTER_PORT (a free port for torch's own store), so torch.distributed\n"
    "programs run unchanged. Every line a rank prints is prefixed with \"[RANK] \".\n"
    "\n"
    "options:\n"
    "  -n, --np N       number of ranks (at least 1); also spelled -np, --nproc\n"
    "  --timeout T      stop the job after T and exit with 124; durations: 1500ms, 90s,\n"
    "                   1.5s, 5m (units ms, s, m = minutes; a plain number is seconds)\n"
    "  --port P         port of the store (default: any free port)\n"
    "  -h, --help       show this help\n"
    "\n"
    "fault tolerance (one host, or every host of a multi-node job):\n"
    "  --ft             keep the job going when a rank fails: the survivors shrink the\n"
    "                   communicator and a replacement rank is started in its place\n"
    "  --restart-all    with --ft: restart every rank after a failure (torchrun-like)\n"
    "                   instead of replacing only the failed one\n"
    "  --max-failures K with --ft: give up after K failed ranks (default 3)\n"
    "  --spares K       with --ft: keep K hot spares, processes that run PROGRAM up to\n"
    "                   strata::init() (strata.init() in Python) and wait there; a failed\n"
    "                   rank goes to a spare, so recovery pays no process start-up, and a\n"
    "                   new spare starts once the recovery is done. Spare output is\n"
    "                   prefixed \"[spareN] \" until it takes a rank (default 0)\n"
    "\n"
    "across hosts (run one agent per host, as with torchrun):\n"
    "  --nnodes H       number of nodes (agents) in the job\n"
    "  --node-rank I    this node, 0 to H-1; node 0 serves the store on ADDR:PORT (unless\n"
    "                   --external-store)\n"
    "                   (also spelled --node_rank, as torchrun does)\n"
    "  --store A:P      the store's address, the same on every node (node 0 listens on that\n"
    "                   address only: give the address of the interface the nodes share)\n"
    "  --token-file F   read the job token, the same on every node, from the first line of F\n"
    "  --token T        the job token on the command line (readable by every user of the host:\n"
    "                   prefer --token-file or STRATA_JOB_TOKEN, the default). Ranks get it\n"
    "                   in STRATA_JOB_TOKEN, never on their command line; it never crosses\n"
    "                   the network (challenge-response)\n"
    "  --external-store the store at --store is served by `strata store` (on any host), not by\n"
    "                   node 0: every agent watches every other one, so with --ft and a spare\n"
    "                   host the loss of any host is recovered, node 0's included. Give it\n"
    "                   to every agent and spare host of the job\n"
    "  --spare          with --ft and --store (no --nnodes): join the running job at ADDR:PORT as\n"
    "                   a spare host; when a host is lost (its agent silent for\n"
    "                   STRATA_AGENT_TIMEOUT, 750ms under --ft) its ranks start again here, with\n"
    "                   -n equal to that host's rank count. Without a spare host left, every\n"
    "                   rank gets an error naming the lost host and its ranks\n"
    "  --rdzv-timeout T how long agents wait for each other at start, a duration as for\n"
    "                   --timeout (default: STRATA_STORE_TIMEOUT, 60s)\n"
    "  -n N is this node's rank count and may differ between nodes; global ranks are\n"
    "  numbered by node order (node 0's first). Output lines are prefixed with\n"
    "  \"[HOST:RANK] \". A failed rank, a signalled agent, an agent silent for\n"
    "  STRATA_AGENT_TIMEOUT (default 10s) or a store that stops answering stops the ranks\n"
    "  on every node, and every agent reports why. Agents beat every STRATA_AGENT_HEARTBEAT\n"
    "  (default: an eighth of the agent timeout; at most half of it).\n"
    "\n"
    "When a rank fails, the others get SIGTERM, then SIGKILL after 2 s; the exit status is\n"
    "the failed rank's code (128+N for a signal). SIGINT, SIGTERM and SIGHUP are forwarded\n"
    "to every rank; a second one kills them. Nothing a rank started outlives the launcher,\n"
    "even a killed one. Output a slow terminal cannot take is dropped and counted\n"
    "(\"... N bytes dropped\"), so the job never waits for the terminal.\n"
    "\n"
    "SIGUSR1 (kill -USR1 <strata run's pid>) asks every rank for its flight recorder and\n"
    "prints one report: each rank's last completed and pending operation, and which ranks\n"
    "the pending ones wait for. The job keeps running (docs/SEMANTICS.md, 'Diagnosing a hang').\n";

int usage_error(const std::string& msg) {
  print_error(kRunWho, msg + " (try 'strata run --help')");
  return kUsageError;
}

// Returns an exit status when the command line says to stop (help, errors), else nullopt.
std::optional<int> parse_args(int argc, char** argv, RunOptions& o) {
  int i = 1;
  bool spares_given = false, max_failures_given = false;
  while (i < argc) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    if (arg == "-h" || arg == "--help") {
      write_all(STDOUT_FILENO, kUsage);
      return 0;
    }
    std::string value, error;
    if (take_option(argc, argv, i, {"-n", "--np", "-np", "--nproc"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto n = parse_int(value);
      if (!n || *n < 1 || *n > 65536)
        return usage_error("-n must be a number of ranks from 1 to 65536, got '" + value + "'");
      o.nranks = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--timeout"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto d = parse_duration(value, BareDuration::Seconds);
      if (!d || d->count() <= 0)
        return usage_error("--timeout must be a positive duration such as 90s, got '" + value + "'");
      o.timeout = *d;
      o.timeout_text = value;
    } else if (take_option(argc, argv, i, {"--port"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto p = parse_int(value);
      if (!p || *p < 0 || *p > 65535) return usage_error("--port must be 0-65535, got '" + value + "'");
      o.port = static_cast<uint16_t>(*p);
    } else if (arg == "--ft") {
      o.ft = true;
      ++i;
    } else if (arg == "--external-store") {
      o.external_store = true;
      ++i;
    } else if (arg == "--spare") {
      o.spare_host = true;
      ++i;
    } else if (arg == "--restart-all") {
      o.ft_opts.restart_all = true;
      ++i;
    } else if (take_option(argc, argv, i, {"--max-failures"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto k = parse_int(value);
      if (!k || *k < 0 || *k > 1'000'000)
        return usage_error("--max-failures must be a number >= 0, got '" + value + "'");
      o.ft_opts.max_failures = static_cast<int>(*k);
      max_failures_given = true;
    } else if (take_option(argc, argv, i, {"--spares"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto k = parse_int(value);
      if (!k || *k < 0 || *k > 4096)
        return usage_error("--spares must be a number of hot spares from 0 to 4096, got '" + value + "'");
      o.spares = static_cast<int>(*k);
      spares_given = true;
    } else if (take_option(argc, argv, i, {"--nnodes"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto n = parse_int(value);
      if (!n || *n < 1 || *n > 65536)
        return usage_error("--nnodes must be a number of nodes >= 1, got '" + value + "'");
      o.nnodes = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--node-rank", "--node_rank"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto n = parse_int(value);
      if (!n || *n < 0 || *n > 65535) return usage_error("--node-rank must be a number >= 0, got '" + value + "'");
      o.node_rank = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--store"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      o.store = value;
    } else if (o.token.has_value() && (take_option(argc, argv, i, {"--token"}, value, error) ||
                                       take_option(argc, argv, i, {"--token-file"}, value, error))) {
      return usage_error("--token and --token-file both give the job token (or one was given twice); pass one");
    } else if (take_option(argc, argv, i, {"--token"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      if (value.empty()) return usage_error("--token is empty; give the job token shared by all nodes");
      warn_token_on_command_line(kRunWho);
      o.token = value;
    } else if (take_option(argc, argv, i, {"--token-file"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto t = read_token_file(value, kRunWho);
      if (!t.is_ok()) return usage_error(t.status().message());
      o.token = *t;
    } else if (take_option(argc, argv, i, {"--rdzv-timeout"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto d = parse_duration(value, BareDuration::Seconds);
      if (!d || d->count() <= 0)
        return usage_error("--rdzv-timeout must be a positive duration such as 60s, got '" + value + "'");
      o.rdzv_timeout = *d;
    } else {
      return usage_error("unknown option '" + std::string(arg) + "'");
    }
  }
  for (; i < argc; ++i) o.argv.emplace_back(argv[i]);
  if (o.nranks == 0) return usage_error("missing -n N (the number of ranks)");
  if (o.argv.empty()) return usage_error("missing the program to run");
  if (o.ft_opts.restart_all && !o.ft) return usage_error("--restart-all needs --ft");
  if (spares_given && !o.ft) return usage_error("--spares needs --ft (spares stand in for failed ranks)");
  if (max_failures_given && !o.ft)
    return usage_error("--max-failures needs --ft (without it the first failed rank ends the job)");
  if (o.ft) {
    // The watcher declares a rank hung after heartbeat_timeout without a beat: a rank that
    // beats less often than that would be replaced while healthy.
    const Env& env = Env::get();
    if (env.heartbeat_interval * 2 > env.heartbeat_timeout)
      return usage_error("STRATA_HEARTBEAT_INTERVAL (" + std::to_string(env.heartbeat_interval.count()) +
                         " ms) must be at most half STRATA_HEARTBEAT_TIMEOUT (" +
                         std::to_string(env.heartbeat_timeout.count()) +
                         " ms), or every healthy rank of the --ft job reads as hung");
  }
  if (o.spares > 0 && o.ft_opts.restart_all)
    return usage_error("--spares cannot be combined with --restart-all, which starts every rank again");
  if (o.external_store && !o.nnodes && !o.spare_host)
    return usage_error("--external-store is for multi-node jobs (--nnodes H) and spare hosts (--spare)");
  if (o.spare_host) {
    if (!o.ft) return usage_error("--spare needs --ft (a spare host takes a lost host's ranks in a recovery)");
    if (o.nnodes || o.node_rank)
      return usage_error(
          "--spare joins a running job as a spare host: give --store ADDR:PORT, not --nnodes or "
          "--node-rank (it takes the node number of the host it replaces)");
    if (o.store.empty()) return usage_error("--spare needs --store ADDR:PORT, the job's store");
    auto addr = bootstrap::StoreAddress::parse(o.store);
    if (!addr.is_ok()) return usage_error("--store '" + o.store + "': " + addr.status().message());
    if (!o.token) o.token = Env::get().job_token;
    if (o.token->empty())
      return usage_error("--spare needs the job's token: pass --token-file F or set STRATA_JOB_TOKEN");
    if (o.ft_opts.restart_all) return usage_error("--spare cannot be combined with --restart-all");
    return std::nullopt;
  }
  bool any_multi = o.nnodes || o.node_rank || !o.store.empty() || o.token || o.rdzv_timeout;
  if (any_multi) {
    if (!o.nnodes) return usage_error("--node-rank, --store, --token, --token-file and --rdzv-timeout need --nnodes H");
    if (!o.node_rank) return usage_error("missing --node-rank I (0 to " + std::to_string(*o.nnodes - 1) + ")");
    if (*o.node_rank >= *o.nnodes)
      return usage_error("--node-rank " + std::to_string(*o.node_rank) + " must be below --nnodes " +
                         std::to_string(*o.nnodes) + " (nodes are numbered from 0)");
    if (o.store.empty()) return usage_error("missing --store ADDR:PORT (node 0 serves it, every node connects to it)");
    auto addr = bootstrap::StoreAddress::parse(o.store);
    if (!addr.is_ok()) return usage_error("--store '" + o.store + "': " + addr.status().message());
    if (addr->port == 0)
      return usage_error("--store needs a port other than 0: every node must know where node 0 listens");
    if (o.port != 0) return usage_error("--port is for single-node jobs; give the port in --store ADDR:PORT");
    if (!o.token) o.token = Env::get().job_token;
    if (o.token->empty() && *o.nnodes > 1)
      return usage_error(
          "a multi-node job needs a token shared by all nodes: pass --token-file F or set "
          "STRATA_JOB_TOKEN (e.g. to the output of 'openssl rand -hex 16') on every node");
    if (o.token->empty()) {  // one node: nobody else needs to know it
      auto t = random_hex(16);
      if (!t.is_ok()) return usage_error(t.status().message());
      o.token = *t;
    }
  }
  if (o.ft_opts.restart_all && o.nnodes && *o.nnodes > 1)
    return usage_error("--restart-all restarts the ranks of one host; it cannot be combined with --nnodes > 1");
  return std::nullopt;
}

}  // namespace

int run_main(int argc, char** argv) {
  RunOptions opts;
  if (auto done = parse_args(argc, argv, opts)) return *done;
  launch::Launcher launcher(std::move(opts));
  return launcher.run();
}

}  // namespace strata::cli

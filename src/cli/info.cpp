// `strata info`: what this host offers Strata and how Strata is configured here.

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bootstrap/job_info.hpp"
#include "cli/commands.hpp"
#include "common/cpu_cache.hpp"
#include "common/env.hpp"
#include "common/parse.hpp"
#include "memory/fd_channel.hpp"
#include "memory/heap.hpp"
#include "transport/net.hpp"

namespace strata::cli {
namespace {

constexpr const char* kWho = "strata info";

const char kUsage[] =
    "usage: strata info\n"
    "\n"
    "Prints the host identity, CPUs and NUMA nodes, the transports this host supports, the\n"
    "heap settings (STRATA_HEAP_*), the timeout and, inside a job, this process's placement.\n"
    "\n"
    "The STRATA_* variables take sizes: 8, 4K, 16M, 1G - K/M/G (also KiB, KB, ...) are powers\n"
    "of 1024; and durations: 500ms, 2s, 1.5s, 1m (units ms, s, m = minutes; a plain number is\n"
    "milliseconds).\n"
    "\n"
    "options:\n"
    "  -h, --help       show this help\n";

void row(const std::string& label, const std::string& value) {
  std::printf("%-18s %s\n", label.c_str(), value.c_str());
}

std::string format_bytes(size_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  // Exact units only ("1536 MiB", not "1.5 GiB"): these are settings people copy.
  while (u < 4 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + units[u];
}

std::string format_duration(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

std::string cpus() {
  long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string s = std::to_string(online) + " online";
  if (::sched_getaffinity(0, sizeof set, &set) == 0)
    s += ", " + std::to_string(CPU_COUNT(&set)) + " usable by this process";
  return s;
}

std::string llc() {
  const LastLevelCache& c = last_level_cache();
  if (!c.level) return "unknown (sysfs does not describe it)";
  return "L" + std::to_string(c.level) + ", " + format_bytes(c.bytes) +
         (c.shared ? ", one for every CPU (external inputs are staged in rounds at every size)"
                   : ", not one for every CPU");
}

std::string numa_nodes() {
  namespace fs = std::filesystem;
  std::vector<std::pair<int, std::string>> nodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/node", ec)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("node")) continue;
    auto id = parse_int(std::string_view(name).substr(4));
    if (!id) continue;
    nodes.emplace_back(static_cast<int>(*id), read_first_line(e.path().string() + "/cpulist"));
  }
  if (nodes.empty()) return "unknown (no /sys/devices/system/node)";
  std::sort(nodes.begin(), nodes.end());
  std::string s = std::to_string(nodes.size()) + " (";
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i) s += "; ";
    s += "node" + std::to_string(nodes[i].first) + ": cpus " + (nodes[i].second.empty() ? "none" : nodes[i].second);
  }
  return s + ")";
}

std::string probe_shm() {
  int fd = ::memfd_create("strata-info-probe", MFD_CLOEXEC);
  if (fd < 0) return std::string("no (memfd_create: ") + std::strerror(errno) + ")";
  ::close(fd);
  return "yes (memfd_create)";
}

// Marker read across processes by the CMA probe; fork keeps its address in every child.
volatile uint64_t g_cma_marker = 0;

// Ranks are siblings, not parent and child, and Yama's ptrace_scope=1 treats the two
// differently: so one child reads from another, as a rank would from its peer.
std::string probe_cma(const Env& env) {
  if (!env.cma) return "off (STRATA_CMA=0)";
  g_cma_marker = 0x5354524154414d41ull ^ static_cast<uint64_t>(::getpid());
  int gate[2], report[2];
  if (::pipe2(gate, O_CLOEXEC) != 0) return std::string("unknown (pipe: ") + std::strerror(errno) + ")";
  if (::pipe2(report, O_CLOEXEC) != 0) {
    ::close(gate[0]), ::close(gate[1]);
    return std::string("unknown (pipe: ") + std::strerror(errno) + ")";
  }
  std::fflush(stdout);
  pid_t holder = ::fork();
  if (holder == 0) {
    // Wait until the parent closes the gate (or dies). The report pipe must not stay open
    // here, or the parent would never see its end.
    ::close(gate[1]);
    ::close(report[0]);
    ::close(report[1]);
    char c;
    while (::read(gate[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  std::string result;
  if (holder < 0) {
    result = std::string("unknown (fork: ") + std::strerror(errno) + ")";
  } else {
    pid_t reader = ::fork();
    if (reader == 0) {
      uint64_t copy = 0;
      Status s = memory::cma_read(holder, const_cast<uint64_t*>(&g_cma_marker), &copy, sizeof copy);
      std::string msg = !s.is_ok() ? s.message() : copy == g_cma_marker ? "" : "read a wrong value";
      write_all(report[1], msg);
      ::_exit(0);
    }
    ::close(report[1]);
    report[1] = -1;
    std::string msg;
    char buf[512];
    ssize_t n;
    while ((n = ::read(report[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
      if (n > 0) msg.append(buf, static_cast<size_t>(n));
    if (reader > 0) ::waitpid(reader, nullptr, 0);
    if (reader < 0) {
      result = std::string("unknown (fork: ") + std::strerror(errno) + ")";
    } else if (msg.empty()) {
      result = "yes (process_vm_readv between sibling processes)";
    } else {
      result = "no (" + msg + ")";
      std::string scope = read_first_line("/proc/sys/kernel/yama/ptrace_scope");
      if (!scope.empty()) result += "; kernel.yama.ptrace_scope=" + scope;
    }
  }
  ::close(gate[0]);
  ::close(gate[1]);
  ::close(report[0]);
  if (report[1] >= 0) ::close(report[1]);
  if (holder > 0) ::waitpid(holder, nullptr, 0);
  return result;
}

std::string job_placement(const Env& env) {
  if (env.launcher.empty() && env.store.empty())
    return "none (not started by strata run, torchrun, mpirun, mpiexec or Slurm)";
  auto job = bootstrap::detect_job(env);
  if (!job.is_ok()) return "invalid: " + job.status().message();
  std::string s = "rank " + std::to_string(job->rank) + " of " + std::to_string(job->world_size);
  if (env.local_rank && env.local_size)
    s += " (local " + std::to_string(*env.local_rank) + " of " + std::to_string(*env.local_size) + ")";
  if (!env.launcher.empty()) s += ", from " + env.launcher + " variables";
  if (!job->store.empty()) s += ", store " + job->store;
  return s + ", job id " + job->job_id;
}

}  // namespace

int info_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      write_all(STDOUT_FILENO, kUsage);
      return 0;
    }
    print_error(kWho, "unexpected argument '" + std::string(arg) + "' (try 'strata info --help')");
    return kUsageError;
  }
  const Env& env = Env::get();
  std::printf("strata %s\n\n", STRATA_VERSION);
  row("host id", bootstrap::host_identity(env) + (env.host_id.empty() ? "" : " (STRATA_HOST_ID)"));
  row("cpus", cpus());
  row("numa nodes", numa_nodes());
  row("last-level cache", llc());
  std::printf("transports\n");
  row("  shm", probe_shm());
  row("  CMA", probe_cma(env));
  row("  UCX", transport::ucx_summary(env));
  std::printf("heap\n");
  row("  segment size", format_bytes(env.heap_segment_size) + " (STRATA_HEAP_SEGMENT_SIZE)");
  row("  max size", format_bytes(env.heap_max_size) + " (STRATA_HEAP_MAX_SIZE)");
  row("  symmetric size", format_bytes(env.heap_symmetric_size) + " (STRATA_HEAP_SYMMETRIC_SIZE)");
  row("  huge pages", std::string(env.heap_huge_pages ? "yes" : "no") + " (STRATA_HEAP_HUGE_PAGES)");
  row("  prefault", std::string(env.heap_prefault ? "yes" : "no") + " (STRATA_HEAP_PREFAULT)");
  row("  socket dir", memory::fd_socket_dir(env.socket_dir) + " (STRATA_SOCKET_DIR)");
  std::printf("settings\n");
  row("  timeout", format_duration(env.timeout) + " (STRATA_TIMEOUT)");
  row("  store timeout", format_duration(env.store_connect_timeout) + " (STRATA_STORE_TIMEOUT)");
  row("  one-shot max", format_bytes(env.oneshot_max_bytes) + " (STRATA_ONESHOT_MAX_BYTES)");
  row("  two-shot stores",
      std::string(env.two_shot_stores < 0    ? "auto: the faster of cached and streamed, per slice size"
                  : env.two_shot_stores == 0 ? "cached"
                                             : "streamed") +
          " (STRATA_TWO_SHOT_STORES)");
  row("  push",
      std::string(env.push == 0 ? "no: two-shot all_reduce and all_gather read the others' data"
                                : "two-shot all_reduce and all_gather write into every output where all are heap") +
          " (STRATA_PUSH)");
  for (auto [what, mode, var] :
       {std::tuple{"  all_to_all input", env.all_to_all_cma, "STRATA_ALL_TO_ALL_CMA"},
        std::tuple{"  all_gather input", env.all_gather_cma, "STRATA_ALL_GATHER_CMA"},
        std::tuple{"  reduce_scatter input", env.reduce_scatter_cma, "STRATA_REDUCE_SCATTER_CMA"},
        std::tuple{"  all_reduce buffers", env.all_reduce_cma, "STRATA_ALL_REDUCE_CMA"}})
    row(what, std::string(mode < 0    ? "auto: the faster of staged and CMA, per size"
                          : mode == 0 ? "staged"
                                      : "CMA") +
                  " (" + var + ")");
  row("  log level", env.log_level + " (STRATA_LOG)");
  for (const auto& bad : env.invalid) row("  refused", bad + " (strata run and init() stop on it)");
  row("job", job_placement(env));
  std::fflush(stdout);
  return 0;
}

}  // namespace strata::cli

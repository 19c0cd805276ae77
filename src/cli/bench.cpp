// `strata bench`: nccl-tests style sweeps of the collectives (time, algbw, busbw per size, a
// correctness check of every size), with JSON, CSV and PNG output.
//
// The user runs one command; it starts the ranks through the launcher of `strata run` (the
// same code path, called in-process) on this very binary, with a hidden `--worker-fds A,B`
// option: A and B are duplicates of our stdout and stderr that the ranks inherit, so rank 0
// prints the table and the progress straight to the user's terminal, without the "[0] "
// prefix the launcher puts on the ranks' own output (which still carries their errors).
// The method, the sizes and the formats live in bench_colls/args/sweep/output (bench_common.hpp),
// shared with the Open MPI peer in bench/peers/, so that both sides of every ratio are measured
// the same way; they know nothing of this file.

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <strata/strata.hpp>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_args.hpp"
#include "cli/bench_colls.hpp"
#include "cli/bench_output.hpp"
#include "cli/bench_sweep.hpp"
#include "cli/commands.hpp"

extern char** environ;

namespace strata::cli {
namespace {

using namespace strata::bench;

constexpr const char* kWho = "strata bench";

// Plots busbw and time against size from the JSON document strata bench writes.
constexpr const char* kPlotScript = R"PY(
import json, sys
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.stderr.write("strata bench: --plot needs matplotlib for %s (%s); install python3-matplotlib "
                     "(scripts/install_bench_deps.sh)\n" % (sys.executable, e))
    sys.exit(3)
if len(sys.argv) < 3:
    sys.exit(0)  # the check that matplotlib imports
d = json.load(open(sys.argv[1]))
rows = [r for r in d["results"] if r["time_us"] and r["size"] > 0]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
xs = [r["size"] for r in rows]
if rows and d["busbw_factor"] > 0:
    a1.loglog(xs, [r["busbw_gbs"] for r in rows], marker="o", label=d["label"])
a2.loglog(xs, [r["time_us"] for r in rows], marker="o", label=d["label"])
for a, yl in ((a1, "busbw (GB/s)"), (a2, "time (us)")):
    a.set_xscale("log", base=2)
    a.set_xlabel("size (bytes, %s)" % d["size_meaning"])
    a.set_ylabel(yl)
    a.grid(True, which="both", alpha=0.3)
    a.legend()
fig.suptitle("%s, %d ranks, %s%s, %s" % (d["collective"], d["nranks"], d["dtype"],
             "" if d["op"] == "none" else " " + d["op"], "in place" if d["inplace"] else "out of place"))
fig.savefig(sys.argv[2], dpi=110, bbox_inches="tight")
)PY";

int usage_error(const std::string& msg) {
  print_error(kWho, msg + " (try 'strata bench --help')");
  return kUsageError;
}

// ---- the ranks --------------------------------------------------------------------------------

class Worker {
 public:
  Worker(Options o, Communicator comm) : o_(std::move(o)), comm_(std::move(comm)) {
    n_ = comm_.size();
    r_ = comm_.rank();
    ri_.system = "strata";
    ri_.label = o_.label.empty() ? std::string("strata-") + buffers_name(o_.buffers) : o_.label;
    ri_.opts = o_;
    ri_.nranks = n_;
    out_fd_ = o_.worker_out_fd >= 0 ? o_.worker_out_fd : STDOUT_FILENO;
    err_fd_ = o_.worker_err_fd >= 0 ? o_.worker_err_fd : STDERR_FILENO;
  }
  ~Worker() { release(); }

  int run();

 private:
  struct Call {
    const void* in = nullptr;
    void* out = nullptr;
    size_t c = 0;
  };

  void allocate(size_t bytes);
  void release();
  Call make_call(const SizePoint& sp);
  void call(const Call& c);
  void max_all(double* v, int k);
  size_t check_size(const SizePoint& sp, const Call& c);
  void progress(size_t k, size_t total, const SizePoint& sp, bool done);

  Options o_;
  Communicator comm_;
  RunInfo ri_;
  int n_ = 0, r_ = 0;
  int out_fd_ = STDOUT_FILENO, err_fd_ = STDERR_FILENO;
  char* in_ = nullptr;
  char* out_ = nullptr;
  size_t bytes_ = 0;
  double* aux_in_ = nullptr;
  double* aux_out_ = nullptr;
  std::vector<Registration> regs_;
  bool tty_progress_ = false;
};

void Worker::allocate(size_t bytes) {
  bytes_ = (std::max<size_t>(bytes, 64) + 4095) / 4096 * 4096;
  if (o_.buffers == Buffers::Heap) {
    in_ = static_cast<char*>(comm_.alloc_bytes(bytes_, 4096));
    out_ = static_cast<char*>(comm_.alloc_bytes(bytes_, 4096));
  } else {
    in_ = static_cast<char*>(std::aligned_alloc(4096, bytes_));
    out_ = static_cast<char*>(std::aligned_alloc(4096, bytes_));
    if (!in_ || !out_) throw Error(Code::Unavailable, "cannot allocate 2 x " + std::to_string(bytes_) + " bytes");
    if (o_.buffers == Buffers::Registered) {
      regs_.push_back(comm_.register_buffer(in_, bytes_));
      regs_.push_back(comm_.register_buffer(out_, bytes_));
    }
  }
  // First touch here, once: on these machines it costs ~10 us per page, every later use is fast.
  std::memset(in_, 0, bytes_);
  std::memset(out_, 0, bytes_);
  size_t aux = static_cast<size_t>(std::max(o_.repeats, 2)) + 2;
  aux_in_ = static_cast<double*>(comm_.alloc_bytes(aux * sizeof(double), 64));
  aux_out_ = static_cast<double*>(comm_.alloc_bytes(aux * sizeof(double), 64));
}

void Worker::release() {
  regs_.clear();
  if (!comm_.valid()) return;
  try {
    if (o_.buffers == Buffers::Heap) {
      if (in_) comm_.free_bytes(in_);
      if (out_) comm_.free_bytes(out_);
    } else {
      std::free(in_);
      std::free(out_);
    }
    if (aux_in_) comm_.free_bytes(aux_in_);
    if (aux_out_) comm_.free_bytes(aux_out_);
  } catch (const Error&) {
    // Leaving anyway; the heap goes with the process.
  }
  in_ = out_ = nullptr;
  aux_in_ = aux_out_ = nullptr;
}

Worker::Call Worker::make_call(const SizePoint& sp) {
  size_t es = info(o_.dtype).size;
  Call c;
  c.c = sp.c;
  c.in = in_;
  c.out = out_;
  const bool ip = o_.inplace;
  const size_t block = sp.c * es;
  switch (o_.coll) {
    case Coll::AllGather:
      if (ip) c.in = out_ + static_cast<size_t>(r_) * block;
      break;
    case Coll::ReduceScatter:
      if (ip) c.out = in_ + static_cast<size_t>(r_) * block;
      break;
    case Coll::Gather:
      if (ip && r_ == o_.root) c.in = out_ + static_cast<size_t>(o_.root) * block;
      break;
    case Coll::Scatter:
      if (ip && r_ == o_.root) c.out = in_ + static_cast<size_t>(o_.root) * block;
      break;
    case Coll::Barrier:
    case Coll::SendRecv: break;
    default:
      if (ip) c.in = out_;
      break;
  }
  return c;
}

void Worker::call(const Call& c) {
  CollOptions co;
  const DataType dt = o_.dtype;
  switch (o_.coll) {
    case Coll::AllReduce:
      co.algorithm = o_.algorithm == AlgoChoice::OneShot   ? Algorithm::OneShot
                     : o_.algorithm == AlgoChoice::TwoShot ? Algorithm::TwoShot
                                                           : Algorithm::Auto;
      comm_.all_reduce(c.in, c.out, c.c, dt, o_.op, co);
      break;
    case Coll::Reduce: comm_.reduce(c.in, c.out, c.c, dt, o_.op, o_.root, co); break;
    case Coll::Broadcast: comm_.broadcast(c.in, c.out, c.c, dt, o_.root, co); break;
    case Coll::AllGather: comm_.all_gather(c.in, c.out, c.c, dt, co); break;
    case Coll::ReduceScatter: comm_.reduce_scatter(c.in, c.out, c.c, dt, o_.op, co); break;
    case Coll::AllToAll: comm_.all_to_all(c.in, c.out, c.c, dt, co); break;
    case Coll::Gather: comm_.gather(c.in, c.out, c.c, dt, o_.root, co); break;
    case Coll::Scatter: comm_.scatter(c.in, c.out, c.c, dt, o_.root, co); break;
    case Coll::Barrier: comm_.barrier(co); break;
    case Coll::SendRecv: {
      Work w = comm_.send_async(c.in, c.c, dt, (r_ + 1) % n_, 0, co);
      comm_.recv(c.out, c.c, dt, (r_ + n_ - 1) % n_, 0, co);
      w.wait();
      break;
    }
  }
}

void Worker::max_all(double* v, int k) {
  std::memcpy(aux_in_, v, static_cast<size_t>(k) * sizeof(double));
  comm_.all_reduce(aux_in_, aux_out_, static_cast<size_t>(k), DataType::Float64, ReduceOp::Max);
  std::memcpy(v, aux_out_, static_cast<size_t>(k) * sizeof(double));
}

// Fills the inputs with the pattern and the outputs with a sentinel, runs the call once and
// compares this rank's output with the expected values. Returns the wrong elements here.
size_t Worker::check_size(const SizePoint& sp, const Call& c) {
  const int root = o_.root;
  size_t oc = out_count(o_.coll, n_, r_, root, sp.c);
  size_t ic = in_count(o_.coll, n_, r_, root, sp.c);
  if (oc) fill(o_.dtype, c.out, oc, [](size_t) { return kSentinel; });
  if (ic) fill(o_.dtype, const_cast<void*>(c.in), ic, [&](size_t i) { return pattern(o_.op, r_, i); });
  call(c);
  if (!oc) return 0;
  CheckResult res = check(o_.dtype, c.out, oc, [&](size_t k) {
    return expected(o_.coll, o_.op, n_, r_, root, sp.c, k).value_or(kSentinel);
  });
  if (res.wrong) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s %zu B: %zu of %zu output elements wrong; first at index %zu: got %g, expected %g",
                  info(o_.coll).name, sp.bytes, res.wrong, oc, res.first, res.got, res.want);
    print_error(std::string(kWho) + ": rank " + std::to_string(r_), buf);
  }
  return res.wrong;
}

void Worker::progress(size_t k, size_t total, const SizePoint& sp, bool done) {
  if (o_.quiet || r_ != 0 || total < 2) return;
  if (tty_progress_) {
    std::string s = done ? "\r\033[K"
                         : "\r\033[K[" + std::to_string(k + 1) + "/" + std::to_string(total) + "] " +
                               info(o_.coll).name + " " + human_bytes(sp.bytes) + " ...";
    write_all(err_fd_, s);
  } else if (!done) {
    write_all(err_fd_, "strata bench: [" + std::to_string(k + 1) + "/" + std::to_string(total) + "] " +
                           info(o_.coll).name + " " + human_bytes(sp.bytes) + "\n");
  }
}

int Worker::run() {
  if (o_.nranks > 0 && o_.nranks != n_) {
    print_error(kWho,
                "started with -n " + std::to_string(o_.nranks) + " but the job has " + std::to_string(n_) + " ranks");
    return 1;
  }
  if (info(o_.coll).rooted && o_.root >= n_) {
    print_error(kWho, "--root " + std::to_string(o_.root) + " is not a rank of " + std::to_string(n_));
    return kUsageError;
  }
  if (o_.coll == Coll::SendRecv && n_ < 2) {
    print_error(kWho, "sendrecv needs 2 ranks or more");
    return kUsageError;
  }
  tty_progress_ = ::isatty(err_fd_) == 1;
  std::vector<SizePoint> pts = sizes(o_, n_);
  size_t max_bytes = 0;
  for (const auto& p : pts) max_bytes = std::max(max_bytes, p.bytes);
  allocate(max_bytes);

  if (r_ == 0) write_all(out_fd_, table_header(ri_));
  std::vector<Row> rows;
  size_t failed_sizes = 0;
  double busbw_sum = 0;
  for (size_t k = 0; k < pts.size(); ++k) {
    const SizePoint& sp = pts[k];
    progress(k, pts.size(), sp, false);
    Call c = make_call(sp);
    double wrong = 0;
    if (o_.check) wrong = static_cast<double>(check_size(sp, c));
    Timing t = measure(
        o_, [&] { call(c); }, [&] { comm_.barrier(); }, [&](double* v, int m) { max_all(v, m); });
    if (o_.check) max_all(&wrong, 1);
    Row row = make_row(ri_, sp, t, o_.check && o_.coll != Coll::Barrier, static_cast<size_t>(wrong));
    if (row.wrong) ++failed_sizes;
    busbw_sum += row.busbw;
    rows.push_back(row);
    progress(k, pts.size(), sp, true);
    if (r_ == 0) write_all(out_fd_, table_row(ri_, row));
  }

  int rc = failed_sizes ? 1 : 0;
  if (r_ == 0) {
    Stats st = comm_.stats();
    char buf[512];
    std::string foot = "#\n";
    if (o_.coll != Coll::Barrier) {
      std::snprintf(buf, sizeof buf, "# avg busbw: %.3f GB/s over %zu sizes\n",
                    rows.empty() ? 0.0 : busbw_sum / static_cast<double>(rows.size()), rows.size());
      foot += buf;
    }
    std::snprintf(buf, sizeof buf, "# rank 0 counters: %llu ops, %llu B moved directly, %llu B staged, %llu B by CMA\n",
                  static_cast<unsigned long long>(st.ops), static_cast<unsigned long long>(st.direct_bytes),
                  static_cast<unsigned long long>(st.staged_bytes), static_cast<unsigned long long>(st.cma_bytes));
    foot += buf;
    if (!o_.check || o_.coll == Coll::Barrier) foot += "# check: not done\n";
    else if (failed_sizes)
      foot += "# check: FAIL at " + std::to_string(failed_sizes) + " of " + std::to_string(rows.size()) + " sizes\n";
    else foot += "# check: all " + std::to_string(rows.size()) + " sizes ok\n";
    write_all(out_fd_, foot);

    std::snprintf(buf, sizeof buf,
                  "\"stats_rank0\": {\"ops\": %llu, \"direct_bytes\": %llu, \"staged_bytes\": %llu, "
                  "\"cma_bytes\": %llu}",
                  static_cast<unsigned long long>(st.ops), static_cast<unsigned long long>(st.direct_bytes),
                  static_cast<unsigned long long>(st.staged_bytes), static_cast<unsigned long long>(st.cma_bytes));
    if (!o_.json.empty() && !write_file(o_.json, to_json(ri_, rows, buf))) {
      print_error(kWho, "cannot write " + o_.json + ": " + std::strerror(errno));
      rc = 1;
    }
    if (!o_.csv.empty() && !write_file(o_.csv, to_csv(ri_, rows))) {
      print_error(kWho, "cannot write " + o_.csv + ": " + std::strerror(errno));
      rc = 1;
    }
  }
  // Every rank leaves together: a rank that exits first would look like a failure.
  comm_.barrier();
  return rc;
}

int worker_main(const Options& o) {
  try {
    Communicator comm = init();
    Worker w(o, comm);
    return w.run();
  } catch (const Error& e) {
    print_error(kWho, std::string(to_string(e.code())) + ": " + e.what());
    return 1;
  } catch (const std::exception& e) {
    print_error(kWho, e.what());
    return 1;
  }
}

// ---- the launcher side ------------------------------------------------------------------------

// Runs argv (PATH lookup for a bare name) with default signal handling, whatever the launcher
// left blocked or ignored; output to /dev/null when `silent`. Returns the exit status, 127 if
// it could not start, 128+N for a signal.
int spawn_and_wait(const std::vector<std::string>& args, bool silent) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_init(&fa);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (silent) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = -1;
  int err = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return 127;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The JSON a plot is made from when the user asked for none: a file without a name (O_TMPFILE
// in $TMPDIR, or one unlinked at once where the file system lacks it), not close-on-exec, so
// that the ranks and the plotter inherit it and reach it as /proc/self/fd/N. It vanishes with
// the last process that holds it, however `strata bench` ends (an error, a signal, SIGKILL):
// nothing is left in the temporary directory to clean up.
Result<int> nameless_temp_file() {
  std::error_code ec;
  std::string dir = std::filesystem::temp_directory_path(ec).string();
  if (ec) dir = "/tmp";
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR, 0600);
  if (fd >= 0) return fd;
  std::string tmpl = dir + "/strata-bench-XXXXXX.json";
  fd = ::mkstemps(tmpl.data(), 5);
  if (fd < 0) return errno_status("mkstemps", errno).with_context("a temporary file in " + dir + ": ");
  ::unlink(tmpl.c_str());
  ::fcntl(fd, F_SETFD, 0);
  return fd;
}

// Debian's interpreter first: python3 on PATH may be another one without matplotlib.
std::string find_python() {
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

int launch(const Options& o, int argc, char** argv) {
  char exe[PATH_MAX];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    print_error(kWho, std::string("cannot find this executable: ") + std::strerror(errno));
    return 1;
  }
  exe[len] = '\0';

  std::string python, json = o.json;
  bool temp_json = false;
  int temp_fd = -1;
  if (!o.plot.empty()) {
    python = find_python();
    int rc = spawn_and_wait({python, "-c", kPlotScript}, false);
    if (rc != 0) {
      if (rc == 127) print_error(kWho, "--plot needs python3 with matplotlib, and no python3 was found");
      print_error(kWho, "not running: the plot asked for cannot be made (the benchmark alone runs without --plot)");
      return 1;
    }
    if (json.empty()) {
      auto fd = nameless_temp_file();
      if (!fd.is_ok()) {
        print_error(kWho, "cannot create a temporary file: " + fd.status().message());
        return 1;
      }
      temp_fd = *fd;
      json = "/proc/self/fd/" + std::to_string(temp_fd);
      temp_json = true;
    }
  }

  // Started before the ranks (the launcher is still single-threaded here) and killed after the
  // last one exits, so every size runs beside it.
  NeighbourProcess neighbour;
  if (o.neighbour != Neighbour::None) {
    std::string nerr = neighbour.start(o.neighbour);
    if (!nerr.empty()) {
      print_error(kWho, nerr);
      if (temp_fd >= 0) ::close(temp_fd);
      return 1;
    }
    write_all(STDOUT_FILENO, "# neighbour: " + neighbour_description(o.neighbour, neighbour.threads()) + " (pid " +
                                 std::to_string(neighbour.pid()) + ")\n");
  }

  // Duplicates without close-on-exec: every rank inherits them; rank 0 writes the table and
  // the progress there, unprefixed.
  int out_fd = ::fcntl(STDOUT_FILENO, F_DUPFD, 10);
  int err_fd = ::fcntl(STDERR_FILENO, F_DUPFD, 10);
  std::vector<std::string> args = {"run",
                                   "-n",
                                   std::to_string(o.nranks),
                                   "--",
                                   exe,
                                   "bench",
                                   "--worker-fds=" + std::to_string(out_fd) + "," + std::to_string(err_fd)};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  if (temp_json) args.push_back("--json=" + json);
  std::vector<char*> run_argv;
  for (auto& a : args) run_argv.push_back(a.data());
  run_argv.push_back(nullptr);
  int rc = run_main(static_cast<int>(args.size()), run_argv.data());
  neighbour.stop();
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);

  struct stat st {};
  if (!o.plot.empty() && (rc == 0 || rc == 1) && ::stat(json.c_str(), &st) == 0 && st.st_size > 0) {
    int prc = spawn_and_wait({python, "-c", kPlotScript, json, o.plot}, false);
    if (prc != 0) {
      print_error(kWho, "the plot failed (exit " + std::to_string(prc) + "); " +
                            (temp_json ? std::string("no JSON was asked for") : "the results are in " + json));
      if (rc == 0) rc = 1;
    } else {
      write_all(STDOUT_FILENO, "# plot: " + o.plot + "\n");
    }
  }
  if (temp_fd >= 0) ::close(temp_fd);
  return rc;
}

}  // namespace

int bench_main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "moe") return bench_moe_main(argc - 1, argv + 1);
  Options o;
  bool help = false;
  std::string err = parse_options(argc, argv, 1, Tool::Strata, o, help);
  if (help) {
    write_all(STDOUT_FILENO, usage_text(Tool::Strata));
    return 0;
  }
  if (!err.empty()) return usage_error(err);
  if (o.worker) return worker_main(o);
  return launch(o, argc, argv);
}

}  // namespace strata::cli

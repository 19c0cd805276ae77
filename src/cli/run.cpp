// `strata run`: starts a store in-process and N ranks, relays their output line by line
// with a "[rank] " prefix, and stops the whole job when one rank fails or the launcher is
// signalled.
//
// With --nnodes it is the agent of one node of a multi-node job: node 0 serves the store
// on the --store address, every agent registers its local rank count there, and global
// ranks are numbered by node order. The agents then agree on the job's fate through the
// store (node_link.hpp): a failure anywhere, a vanished agent or a lost store stops the
// ranks on every node.
//
// One thread, one poll() loop over: a signalfd (SIGCHLD and the forwarded signals, blocked
// before the store thread starts so that only the signalfd sees them), and two pipes per
// rank. Each rank runs in its own process group, so a signal reaches everything the rank
// started (a shell's children included), and a Ctrl-C at the terminal reaches only the
// launcher, which decides what the ranks get.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <memory>
#include <vector>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"
#include "cli/commands.hpp"
#include "cli/ft_controller.hpp"
#include "cli/node_link.hpp"
#include "common/env.hpp"

extern char** environ;

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kWho = "strata run";
// Time between SIGTERM and SIGKILL when the launcher stops the ranks on its own.
constexpr auto kGrace = 2s;
// How long output is still relayed after the last rank exited, for descendants that hold
// the pipes open; they must not keep the launcher alive.
constexpr auto kDrain = 1s;
// A line longer than this is relayed in pieces, each with its own prefix.
constexpr size_t kMaxLine = 64 * 1024;
constexpr int kTimeoutExit = 124;   // as timeout(1)
constexpr int kNotFoundExit = 127;  // as a shell

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
    "  -n, --np N       number of ranks (at least 1)\n"
    "  --timeout T      stop the job after T (90s, 5m, 1500ms; plain numbers are seconds)\n"
    "                   and exit with 124\n"
    "  --port P         port of the store (default: any free port)\n"
    "  -h, --help       show this help\n"
    "\n"
    "across hosts (run one agent per host, as with torchrun):\n"
    "  --nnodes H       number of nodes (agents) in the job\n"
    "  --node-rank I    this node, 0 to H-1; node 0 serves the store on ADDR:PORT\n"
    "  --store A:P      the store's address, the same on every node (node 0 binds it)\n"
    "  --token T        job token, the same on every node (default: STRATA_JOB_TOKEN)\n"
    "  --rdzv-timeout T how long agents wait for each other at start (default:\n"
    "                   STRATA_STORE_TIMEOUT, 60s)\n"
    "  -n N is this node's rank count and may differ between nodes; global ranks are\n"
    "  numbered by node order (node 0's first). Output lines are prefixed with\n"
    "  \"[HOST:RANK] \". A failed rank, a signalled agent, an agent silent for\n"
    "  STRATA_AGENT_TIMEOUT (default 10s) or a store that stops answering stops the ranks\n"
    "  on every node, and every agent reports why.\n"
    "\n"
    "When a rank fails, the others get SIGTERM, then SIGKILL after 2 s; the exit status is\n"
    "the failed rank's code (128+N for a signal). SIGINT, SIGTERM and SIGHUP are forwarded\n"
    "to every rank; a second one kills them.\n";

struct RunOptions {
  int nranks = 0;
  std::optional<std::chrono::milliseconds> timeout;
  std::string timeout_text;  // as the user wrote it, for the message
  uint16_t port = 0;
  bool ft = false;
  FtOptions ft_opts;
  std::vector<std::string> argv;
  // Multi-node.
  std::optional<int> nnodes, node_rank;
  std::string store;
  std::optional<std::string> token;
  std::optional<std::chrono::milliseconds> rdzv_timeout;
  bool multi_node() const { return nnodes.has_value(); }
};

int usage_error(const std::string& msg) {
  print_error(kWho, msg + " (try 'strata run --help')");
  return kUsageError;
}

// Returns an exit status when the command line says to stop (help, errors), else nullopt.
std::optional<int> parse_args(int argc, char** argv, RunOptions& o) {
  int i = 1;
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
      auto n = parse_long(value);
      if (!n || *n < 1 || *n > 65536) return usage_error("-n must be a number of ranks >= 1, got '" + value + "'");
      o.nranks = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--timeout"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto d = parse_cli_duration(value);
      if (!d || d->count() <= 0)
        return usage_error("--timeout must be a positive duration such as 90s, got '" + value + "'");
      o.timeout = *d;
      o.timeout_text = value;
    } else if (take_option(argc, argv, i, {"--port"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto p = parse_long(value);
      if (!p || *p < 0 || *p > 65535) return usage_error("--port must be 0-65535, got '" + value + "'");
      o.port = static_cast<uint16_t>(*p);
    } else if (arg == "--ft") {
      o.ft = true;
      ++i;
    } else if (arg == "--restart-all") {
      o.ft_opts.restart_all = true;
      ++i;
    } else if (take_option(argc, argv, i, {"--max-failures"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto k = parse_long(value);
      if (!k || *k < 0 || *k > 1'000'000) return usage_error("--max-failures must be a number >= 0, got '" + value + "'");
      o.ft_opts.max_failures = static_cast<int>(*k);
    } else if (take_option(argc, argv, i, {"--nnodes"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto n = parse_long(value);
      if (!n || *n < 1 || *n > 65536) return usage_error("--nnodes must be a number of nodes >= 1, got '" + value + "'");
      o.nnodes = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--node-rank", "--node_rank"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto n = parse_long(value);
      if (!n || *n < 0 || *n > 65535) return usage_error("--node-rank must be a number >= 0, got '" + value + "'");
      o.node_rank = static_cast<int>(*n);
    } else if (take_option(argc, argv, i, {"--store"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      o.store = value;
    } else if (take_option(argc, argv, i, {"--token"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      o.token = value;
    } else if (take_option(argc, argv, i, {"--rdzv-timeout"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto d = parse_cli_duration(value);
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
  bool any_multi = o.nnodes || o.node_rank || !o.store.empty() || o.token || o.rdzv_timeout;
  if (any_multi) {
    if (!o.nnodes) return usage_error("--node-rank, --store, --token and --rdzv-timeout need --nnodes H");
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
      return usage_error("a multi-node job needs a token shared by all nodes: pass --token T or set "
                         "STRATA_JOB_TOKEN (e.g. to the output of 'openssl rand -hex 16') on every node");
  }
  if (o.ft && o.nnodes && *o.nnodes > 1)
    return usage_error("--ft runs within one host so far; it cannot be combined with --nnodes > 1");
  return std::nullopt;
}

// PATH lookup done before fork: execvp in the child could allocate, which is not safe in
// a child forked from a process that has threads (the store).
std::optional<std::string> find_program(const std::string& name) {
  auto runnable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return runnable(name) ? std::optional(name) : std::nullopt;
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  size_t start = 0;
  for (;;) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (runnable(candidate)) return candidate;
    if (end == std::string::npos) return std::nullopt;
    start = end + 1;
  }
}

class Launcher {
 public:
  explicit Launcher(RunOptions o) : opts_(std::move(o)) {}
  int run();

 private:
  struct Stream {
    int fd = -1;  // read end of the rank's pipe; -1 once closed
    int to = -1;  // where its lines go (our stdout or stderr)
    std::string pending;
  };
  struct Rank {
    int index = 0;   // on this node
    int global = 0;  // in the job
    pid_t pid = -1;
    bool running = false;
    bool current = true;  // the newest process of this rank (--ft keeps replaced ones for their output)
    Stream out, err;
  };

  Status prepare();
  Status join_nodes();
  void on_job_event(const JobEvent& e);
  void report_failure(int exit_code, const std::string& report);
  std::string rank_name(const Rank& r) const;
  Status spawn(Rank& r, const std::string& path, std::vector<char*>& argv, const std::vector<std::string>& shared_env);
  void loop();
  void on_signals();
  void reap();
  void on_exit(Rank& r, int status);
  void replace(const std::vector<Rank*>& failed, const std::string& why, int exit_code);
  void check_heartbeats();
  void relay(Rank& r, Stream& s);
  void emit(const Rank& r, Stream& s, bool at_eof);
  void stop(int sig, bool escalate);
  void signal_ranks(int sig);
  int running_count() const;
  bool any_pipe_open() const;

  RunOptions opts_;
  std::deque<Rank> ranks_;  // a deque: replacements are appended while others are referenced
  std::string path_;
  std::vector<char*> argv_;
  std::vector<std::string> shared_env_;
  std::unique_ptr<FtController> ft_;
  int restarts_ = 0;
  std::vector<Rank*> exited_;  // failed in the current reap pass (--ft)
  std::string exited_why_;
  int exited_code_ = 0;
  int sigfd_ = -1;
  int devnull_ = -1;
  std::string token_, job_id_;
  std::unique_ptr<bootstrap::StoreServer> store_;
  // Multi-node only.
  std::unique_ptr<NodeLink> link_;
  World world_;
  std::string node_name_;
  int link_fd_ = -1;
  bool job_over_ = false;   // the job's fate is known job-wide (or the store was lost)
  bool done_sent_ = false;
  int exit_code_ = 0;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_at_, job_deadline_, drain_until_;
};

Status Launcher::prepare() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return errno_status("sigprocmask", errno);
  sigfd_ = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigfd_ < 0) return errno_status("signalfd", errno);
  // A reader that went away (`strata run ... | head`) must not kill the launcher and
  // orphan the ranks; writes then fail with EPIPE and are dropped.
  ::signal(SIGPIPE, SIG_IGN);
  devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull_ < 0) return errno_status("open /dev/null", errno);

  STRATA_ASSIGN_OR_RETURN(std::string id, random_hex(6));
  job_id_ = "run-" + id;
  if (opts_.multi_node()) return join_nodes();
  STRATA_ASSIGN_OR_RETURN(token_, random_hex(16));
  // Signals are blocked above, so the store thread inherits the mask and never takes them.
  STRATA_ASSIGN_OR_RETURN(store_, bootstrap::StoreServer::start("127.0.0.1", opts_.port, token_));
  return Status::ok();
}

/// A port free on `host` right now, for torch's store (rank 0 binds it a moment later;
/// torchrun's --master_port=0 makes the same choice). 29500, torch's default, if none is found.
int free_port(const std::string& host = "127.0.0.1");

Status Launcher::join_nodes() {
  const Env& env = Env::get();
  auto addr = bootstrap::StoreAddress::parse(opts_.store);
  if (!addr.is_ok()) return addr.status();
  token_ = *opts_.token;
  char name[HOST_NAME_MAX + 1] = {};
  node_name_ = ::gethostname(name, sizeof name - 1) == 0 ? name : "node" + std::to_string(*opts_.node_rank);
  // The short name: prefixes are read by people, and FQDNs of one cluster share the tail.
  if (auto dot = node_name_.find('.'); dot != std::string::npos && dot > 0) node_name_.resize(dot);
  if (*opts_.node_rank == 0) {
    auto server = bootstrap::StoreServer::start(addr->host, addr->port, token_);
    if (!server.is_ok())
      return server.status().with_context("node 0 serves the store on --store " + opts_.store +
                                          ", which must be an address of this host: ");
    store_ = std::move(*server);
  }
  NodeSpec spec;
  spec.nnodes = *opts_.nnodes;
  spec.node_rank = *opts_.node_rank;
  spec.local_size = opts_.nranks;
  spec.store = *addr;
  spec.token = token_;
  spec.node_name = node_name_;
  spec.host_id = bootstrap::host_identity(env);
  spec.rdzv_timeout = opts_.rdzv_timeout.value_or(env.store_connect_timeout);
  spec.agent_timeout = env.agent_timeout;
  // Signals are blocked (and only the signalfd sees them): the waits below check it, so
  // that a Ctrl-C while the other nodes are still missing ends the wait.
  auto interrupted = [this]() -> std::optional<std::string> {
    signalfd_siginfo info;
    while (::read(sigfd_, &info, sizeof info) == sizeof info) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig != SIGCHLD) {
        exit_code_ = 128 + sig;
        return "received " + signal_name(sig);
      }
    }
    return std::nullopt;
  };
  STRATA_ASSIGN_OR_RETURN(link_, NodeLink::connect(spec, interrupted));
  STRATA_ASSIGN_OR_RETURN(world_, link_->rendezvous(free_port(addr->host), job_id_, interrupted));
  job_id_ = world_.job_id;
  return Status::ok();
}

std::string Launcher::rank_name(const Rank& r) const {
  if (!link_) return "rank " + std::to_string(r.index);
  return "rank " + std::to_string(r.global) + " on " + node_name_;
}

void Launcher::report_failure(int exit_code, const std::string& report) {
  if (link_) link_->report_failure(exit_code, report);
}

void Launcher::on_job_event(const JobEvent& e) {
  switch (e.kind) {
    case JobEvent::Kind::Finished:
      job_over_ = true;
      return;
    case JobEvent::Kind::Failed:
      job_over_ = true;
      if (e.node == *opts_.node_rank || stopping_) return;  // our own report, or already stopping
      exit_code_ = e.exit_code;
      print_error(kWho, "the job failed on node " + std::to_string(e.node) + " (" +
                            (e.node >= 0 && e.node < static_cast<int>(world_.nodes.size())
                                 ? world_.nodes[e.node].name
                                 : std::string("?")) +
                            "): " + e.report + "; stopping the " + std::to_string(running_count()) +
                            " rank(s) on " + node_name_);
      stop(SIGTERM, true);
      return;
    case JobEvent::Kind::LostStore:
      job_over_ = true;
      if (!stopping_ || exit_code_ == 0) exit_code_ = e.exit_code;
      print_error(kWho, e.report + (running_count() ? "; stopping the " + std::to_string(running_count()) +
                                                          " rank(s) on " + node_name_
                                                    : std::string()));
      if (!stopping_) stop(SIGTERM, true);
      return;
  }
}

Status Launcher::spawn(Rank& r, const std::string& path, std::vector<char*>& argv,
                       const std::vector<std::string>& shared_env) {
  std::vector<std::string> env_strings = shared_env;
  env_strings.push_back("STRATA_RANK=" + std::to_string(r.global));
  env_strings.push_back("STRATA_LOCAL_RANK=" + std::to_string(r.index));
  env_strings.push_back("RANK=" + std::to_string(r.global));
  env_strings.push_back("LOCAL_RANK=" + std::to_string(r.index));
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  int out[2], err[2], exec_status[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return errno_status("pipe2", errno);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(out[0]), ::close(out[1]);
    return errno_status("pipe2", e);
  }
  if (::pipe2(exec_status, O_CLOEXEC) != 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return errno_status("pipe2", e);
  }
  // Rank 0 keeps a non-terminal stdin (`strata run -n 2 prog < input`); a terminal would
  // stop a background process group that reads it, so ranks never get one.
  int in = (r.global == 0 && !::isatty(STDIN_FILENO)) ? STDIN_FILENO : devnull_;
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], exec_status[0], exec_status[1]}) ::close(fd);
    return errno_status("fork", e);
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until execve.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
    if (in != STDIN_FILENO) ::dup2(in, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    // Ignored signals and the blocked mask survive execve; the rank must start clean.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(path.c_str(), argv.data(), envp.data());
    int e = errno;
    (void)!::write(exec_status[1], &e, sizeof e);
    ::_exit(kNotFoundExit);
  }
  // Also in the parent, so the group exists before we might signal it.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(exec_status[1]);
  r.pid = pid;
  r.running = true;
  r.out = Stream{out[0], STDOUT_FILENO, {}};
  r.err = Stream{err[0], STDERR_FILENO, {}};
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);

  // EOF means execve succeeded (the pipe is close-on-exec); an int is its errno.
  int child_errno = 0;
  ssize_t n;
  do n = ::read(exec_status[0], &child_errno, sizeof child_errno);
  while (n < 0 && errno == EINTR);
  ::close(exec_status[0]);
  if (n == sizeof child_errno)
    return Status(Code::InvalidArgument, "cannot execute " + path + ": " + std::strerror(child_errno));
  return Status::ok();
}

int free_port(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

int Launcher::run() {
  Status ok = prepare();
  if (!ok.is_ok()) {
    print_error(kWho, ok.message());
    if (store_) store_->stop();
    return exit_code_ ? exit_code_ : 1;
  }
  auto path = find_program(opts_.argv[0]);
  if (!path) {
    bool is_path = opts_.argv[0].find('/') != std::string::npos;
    print_error(kWho, opts_.argv[0] + (is_path ? ": no such executable file" : ": command not found in PATH"));
    return kNotFoundExit;
  }
  path_ = *path;
  for (auto& a : opts_.argv) argv_.push_back(a.data());
  argv_.push_back(nullptr);

  // Our own variables replace any inherited ones (a launcher started from inside a job).
  static constexpr const char* kOwned[] = {
      "STRATA_RANK=",  "STRATA_WORLD_SIZE=", "STRATA_LOCAL_RANK=", "STRATA_LOCAL_SIZE=",
      "STRATA_STORE=", "STRATA_JOB_TOKEN=",  "STRATA_JOB_ID=",     "STRATA_NODE_RANK=",
      "STRATA_NNODES=", "STRATA_FT=", "STRATA_EPOCH=",
      // torchrun's, for torch.distributed's env:// rendezvous (any backend)
      "RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
      "GROUP_RANK="};
  std::vector<std::string>& shared_env = shared_env_;
  for (char** e = environ; *e; ++e) {
    bool owned = std::any_of(std::begin(kOwned), std::end(kOwned),
                             [&](const char* p) { return std::strncmp(*e, p, std::strlen(p)) == 0; });
    if (!owned) shared_env.emplace_back(*e);
  }
  const int world = link_ ? world_.world_size : opts_.nranks;
  std::string store_addr = "127.0.0.1:" + std::to_string(store_ ? store_->port() : 0);
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  if (link_) {
    store_addr = opts_.store;
    master_addr = link_->spec().store.host;
    master_port = world_.master_port;
    shared_env.push_back("STRATA_NODE_RANK=" + std::to_string(*opts_.node_rank));
    shared_env.push_back("STRATA_NNODES=" + std::to_string(*opts_.nnodes));
    shared_env.push_back("GROUP_RANK=" + std::to_string(*opts_.node_rank));
  } else {
    master_port = free_port();
  }
  shared_env.push_back("STRATA_WORLD_SIZE=" + std::to_string(world));
  shared_env.push_back("STRATA_LOCAL_SIZE=" + std::to_string(opts_.nranks));
  shared_env.push_back("STRATA_STORE=" + store_addr);
  shared_env.push_back("STRATA_JOB_TOKEN=" + token_);
  shared_env.push_back("STRATA_JOB_ID=" + job_id_);
  shared_env.push_back("WORLD_SIZE=" + std::to_string(world));
  shared_env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(opts_.nranks));
  shared_env.push_back("MASTER_ADDR=" + master_addr);
  shared_env.push_back("MASTER_PORT=" + std::to_string(master_port));
  if (opts_.ft) {
    shared_env.push_back("STRATA_FT=1");
    const Env& env = Env::get();
    opts_.ft_opts.heartbeat_interval = env.heartbeat_interval;
    opts_.ft_opts.heartbeat_timeout = env.heartbeat_timeout;
    ft_ = std::make_unique<FtController>(opts_.ft_opts, job_id_, opts_.nranks);
    Status c = ft_->start({"127.0.0.1", store_->port()}, token_);
    if (!c.is_ok()) {
      print_error(kWho, "--ft: cannot reach the job's store: " + c.message());
      store_->stop();
      return 1;
    }
  }

  if (link_) {
    auto fd = link_->start_monitor();
    if (!fd.is_ok()) {
      print_error(kWho, fd.status().message());
      return 1;
    }
    link_fd_ = *fd;
  }
  ranks_.resize(opts_.nranks);
  for (int i = 0; i < opts_.nranks; ++i) {
    ranks_[i].index = i;
    ranks_[i].global = (link_ ? world_.rank_base : 0) + i;
    Status s = spawn(ranks_[i], path_, argv_, shared_env);
    if (!s.is_ok()) {
      print_error(kWho, rank_name(ranks_[i]) + ": " + s.message());
      exit_code_ = s.code() == Code::InvalidArgument ? kNotFoundExit : 1;
      report_failure(exit_code_, rank_name(ranks_[i]) + ": " + s.message());
      stop(SIGTERM, true);
      break;
    }
  }
  if (opts_.timeout) job_deadline_ = Clock::now() + *opts_.timeout;
  loop();
  // Every rank is gone, but descendants that ignored the SIGTERM may not be: do not leave
  // them behind just because the ranks exited before the grace time ran out.
  if (kill_at_) signal_ranks(SIGKILL);
  if (ft_) ft_->stop();
  if (link_) link_->finish();
  if (store_) store_->stop();
  return exit_code_;
}

void Launcher::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> streams;
  for (;;) {
    auto now = Clock::now();
    if (running_count() == 0) {
      if (any_pipe_open()) {
        if (!drain_until_) drain_until_ = now + kDrain;
        if (now >= *drain_until_) {
          // Descendants still hold the pipes; relay what is buffered and leave them.
          for (auto& r : ranks_) {
            for (Stream* s : {&r.out, &r.err}) {
              if (s->fd < 0) continue;
              emit(r, *s, true);
              ::close(s->fd);
              s->fd = -1;
            }
          }
        }
      }
      if (!any_pipe_open()) {
        drain_until_.reset();
        // One node's ranks finishing is not the job finishing: the agent stays until the
        // job's fate is known, so that its exit status says how the whole job went.
        if (!link_ || job_over_) return;
        if (!done_sent_ && !stopping_) {
          link_->report_done();
          done_sent_ = true;
        }
      }
    }
    if (kill_at_ && now >= *kill_at_) {
      kill_at_.reset();
      for (const auto& r : ranks_)
        if (r.running)
          print_error(kWho, rank_name(r) + " (pid " + std::to_string(r.pid) +
                                ") did not exit after SIGTERM; sending SIGKILL");
      signal_ranks(SIGKILL);
    }
    if (job_deadline_ && now >= *job_deadline_) {
      job_deadline_.reset();
      if (!stopping_) {
        std::string msg = "the job did not finish within --timeout " + opts_.timeout_text;
        print_error(kWho, msg + "; stopping " + std::to_string(running_count()) + " rank(s)");
        exit_code_ = kTimeoutExit;
        report_failure(exit_code_, msg + (link_ ? " (timer of node " + node_name_ + ")" : ""));
        stop(SIGTERM, true);
      }
    }

    std::optional<Clock::time_point> wake;
    for (const auto& t : {kill_at_, job_deadline_, drain_until_})
      if (t && (!wake || *t < *wake)) wake = t;
    int timeout = -1;
    if (wake) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*wake - now).count() + 1;
      timeout = static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
    }

    fds.clear();
    streams.clear();
    fds.push_back({sigfd_, POLLIN, 0});
    fds.push_back({ft_ ? ft_->event_fd() : -1, POLLIN, 0});  // hung ranks found (--ft)
    fds.push_back({link_fd_, POLLIN, 0});                    // job events from other nodes
    const size_t first_stream = 3;
    for (auto& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.emplace_back(&r, s);
        }
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      print_error(kWho, std::string("poll: ") + std::strerror(errno));
      stop(SIGKILL, false);
      exit_code_ = exit_code_ ? exit_code_ : 1;
      return;
    }
    if (n <= 0) continue;
    // Output first, so lines a rank printed before it died come before the report of
    // its death.
    for (size_t i = 0; i < streams.size(); ++i)
      if (fds[i + first_stream].revents) relay(*streams[i].first, *streams[i].second);
    if (fds[0].revents & POLLIN) on_signals();
    if ((fds[1].revents & POLLIN) && !stopping_) check_heartbeats();
    if (link_fd_ >= 0 && (fds[2].revents & POLLIN))
      while (auto e = link_->take_event()) on_job_event(*e);
  }
}

void Launcher::on_signals() {
  signalfd_siginfo info;
  while (::read(sigfd_, &info, sizeof info) == sizeof info) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reaped below, once for any number of SIGCHLDs
    if (!stopping_) {
      print_error(
          kWho, "received " + signal_name(sig) + "; forwarding it to " + std::to_string(running_count()) + " rank(s)");
      exit_code_ = 128 + sig;
      report_failure(exit_code_, "the agent on " + node_name_ + " received " + signal_name(sig));
      // A Ctrl-C may be meant to let ranks clean up at leisure; a TERM or HUP comes from
      // something that wants the job gone, so that one is enforced after the grace time.
      stop(sig, sig != SIGINT);
    } else {
      print_error(kWho, "received " + signal_name(sig) + " again; killing the ranks");
      signal_ranks(SIGKILL);
    }
  }
  reap();
}

void Launcher::reap() {
  // By index: a replacement appended meanwhile invalidates deque iterators (not references).
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (!r.running) continue;
    int status = 0;
    pid_t p = ::waitpid(r.pid, &status, WNOHANG);
    if (p == r.pid) on_exit(r, status);
  }
  if (!exited_.empty()) {
    auto failed = std::move(exited_);
    auto why = std::move(exited_why_);
    exited_.clear();
    exited_why_.clear();
    replace(failed, why, exited_code_);
  }
}

void Launcher::on_exit(Rank& r, int status) {
  r.running = false;
  // Relay what it wrote before dying ahead of the report.
  relay(r, r.out);
  relay(r, r.err);
  bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!failed || stopping_ || !r.current) return;  // casualties of our own stop are not news
  std::string what;
  int code;
  if (WIFEXITED(status)) {
    what = "exited with code " + std::to_string(WEXITSTATUS(status));
    code = WEXITSTATUS(status);
  } else {
    int sig = WTERMSIG(status);
    what = "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
    if (WCOREDUMP(status)) what += ", core dumped";
    code = 128 + sig;
  }
  std::string msg = rank_name(r) + " (pid " + std::to_string(r.pid) + ") " + what;
  if (ft_) {
    // Replaced after the whole reap pass, so ranks that died together share one epoch.
    exited_.push_back(&r);
    exited_why_ += (exited_why_.empty() ? "" : "; ") + msg;
    exited_code_ = code;
    return;
  }
  exit_code_ = code;
  int others = running_count();
  report_failure(exit_code_, msg);
  bool other_nodes = link_ && link_->spec().nnodes > 1;
  if (others > 0) msg += "; stopping the other " + std::to_string(others) + " rank(s)";
  if (other_nodes) msg += (others > 0 ? " and" : "; stopping") + std::string(" the ranks on every other node");
  print_error(kWho, msg);
  stop(SIGTERM, true);
}

void Launcher::replace(const std::vector<Rank*>& failed, const std::string& why, int exit_code) {
  std::vector<int> idx;
  for (Rank* r : failed) {
    idx.push_back(r->index);
    r->current = false;
    if (r->running) {
      // A hung or stopped process: make sure it is gone before its replacement binds its
      // names (heap socket) and before survivors drop its memory.
      ::kill(-r->pid, SIGKILL);
      int st = 0;
      while (::waitpid(r->pid, &st, 0) < 0 && errno == EINTR) {
      }
      r->running = false;
      relay(*r, r->out);
      relay(*r, r->err);
    }
  }
  if (!ft_->on_failure(idx, why)) {
    exit_code_ = exit_code;
    print_error(kWho, why + "; " + std::to_string(ft_->failures()) + " failure(s) exceed --max-failures " +
                          std::to_string(ft_->options().max_failures) + ", stopping the job");
    stop(SIGTERM, true);
    return;
  }
  std::vector<int> respawn = idx;
  std::vector<std::string> env = shared_env_;
  if (ft_->options().restart_all) {
    // The baseline: every rank goes, all start again under a fresh job id.
    respawn.clear();
    for (auto& r : ranks_) {
      if (!r.current) continue;
      r.current = false;
      if (r.running) {
        ::kill(-r.pid, SIGKILL);
        int st = 0;
        while (::waitpid(r.pid, &st, 0) < 0 && errno == EINTR) {
        }
        r.running = false;
        relay(r, r.out);
        relay(r, r.err);
      }
    }
    for (int i = 0; i < opts_.nranks; ++i) respawn.push_back(i);
    std::string job = job_id_ + "-restart" + std::to_string(++restarts_);
    for (auto& e : shared_env_)
      if (e.rfind("STRATA_JOB_ID=", 0) == 0) e = "STRATA_JOB_ID=" + job;
    env = shared_env_;
    ft_->set_job(job);
  } else {
    env.push_back("STRATA_EPOCH=" + std::to_string(ft_->epoch()));
  }
  print_error(kWho, why + "; " + (ft_->options().restart_all ? "restarting every rank" : "replacing it") +
                        " (epoch " + std::to_string(ft_->epoch()) + ", failure " + std::to_string(ft_->failures()) +
                        " of at most " + std::to_string(ft_->options().max_failures) + ")");
  for (int i : respawn) {
    Rank& nr = ranks_.emplace_back();
    nr.index = i;
    nr.global = i;  // --ft runs on one node: global rank = local index
    Status s = spawn(nr, path_, argv_, env);
    if (!s.is_ok()) {
      print_error(kWho, "replacement of rank " + std::to_string(i) + ": " + s.message());
      exit_code_ = 1;
      stop(SIGTERM, true);
      return;
    }
  }
  ft_->on_spawned();
}

void Launcher::check_heartbeats() {
  for (int i : ft_->take_hung()) {
    for (auto& r : ranks_) {
      if (r.index != i || !r.current || !r.running) continue;
      replace({&r},
              "rank " + std::to_string(i) + " (pid " + std::to_string(r.pid) + ") sent no heartbeat for " +
                  std::to_string(ft_->options().heartbeat_timeout.count()) + " ms (hung or stopped)",
              128 + SIGKILL);
      break;
    }
    if (stopping_) return;
  }
}

void Launcher::relay(Rank& r, Stream& s) {
  if (s.fd < 0) return;
  char buf[64 * 1024];
  for (int round = 0; round < 16; ++round) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<size_t>(n));
      emit(r, s, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    emit(r, s, true);  // EOF (or error): flush a last line without newline
    ::close(s.fd);
    s.fd = -1;
    return;
  }
}

void Launcher::emit(const Rank& r, Stream& s, bool at_eof) {
  const std::string prefix =
      link_ ? "[" + node_name_ + ":" + std::to_string(r.global) + "] " : "[" + std::to_string(r.index) + "] ";
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = s.pending.find('\n', start);
    size_t len;
    if (nl != std::string::npos) {
      len = nl - start;
    } else if (s.pending.size() - start >= kMaxLine || (at_eof && start < s.pending.size())) {
      len = std::min(s.pending.size() - start, kMaxLine);
    } else {
      break;
    }
    out.append(prefix).append(s.pending, start, len).push_back('\n');
    start += len + (nl != std::string::npos ? 1 : 0);
  }
  s.pending.erase(0, start);
  // One write per batch: lines of different ranks never interleave mid-line.
  if (!out.empty()) write_all(s.to, out);
}

void Launcher::stop(int sig, bool escalate) {
  stopping_ = true;
  signal_ranks(sig);
  if (escalate && !kill_at_) kill_at_ = Clock::now() + kGrace;
}

void Launcher::signal_ranks(int sig) {
  // Exited ranks too: what they started (still in their group) must go with the job. A
  // group id stays reserved while the group has a member; an emptied one could only be
  // taken by a new process that makes itself a group leader within these few seconds.
  for (const auto& r : ranks_)
    if (r.pid > 0) ::kill(-r.pid, sig);
}

int Launcher::running_count() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
}

bool Launcher::any_pipe_open() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; });
}

}  // namespace

int run_main(int argc, char** argv) {
  RunOptions opts;
  if (auto done = parse_args(argc, argv, opts)) return *done;
  Launcher launcher(std::move(opts));
  return launcher.run();
}

}  // namespace strata::cli

// `strata run` on one host: starts the ranks, relays their output line by line with a
// "[rank] " prefix, and stops the whole job when one rank fails or the launcher is signalled.
//
// One thread, one poll() loop over: a signalfd (SIGCHLD and the forwarded signals, blocked
// before the store thread starts so that only the signalfd sees them), and two pipes per
// rank. Each rank runs in its own process group, so a signal reaches everything the rank
// started (a shell's children included), and a Ctrl-C at the terminal reaches only the
// launcher, which decides what the ranks get.
//
// Nothing of a job outlives the launcher: the ranks' groups are killed when it leaves, the
// ranks die with it (PR_SET_PDEATHSIG) if it is killed, and a guard process (rank_groups.hpp)
// then kills what the ranks started. The launcher is the ranks' children's subreaper, so an
// orphan is reaped here and a group can be seen empty. Output goes through a bounded queue
// written by a thread of its own (output_queue.hpp): a slow terminal costs dropped lines,
// counted and reported, never a stuck launcher or unbounded memory.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "bootstrap/job_info.hpp"
#include "bootstrap/resolve.hpp"
#include "cli/commands.hpp"
#include "cli/launcher.hpp"
#include "common/env.hpp"
#include "memory/fd_channel.hpp"

extern char** environ;

namespace strata::cli::launch {

// The lookup is done before fork: execvp in the child could allocate, which is not safe in
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

Status Launcher::prepare() {
  // First, while this is the only thread: the guard is forked and runs ordinary code.
  STRATA_ASSIGN_OR_RETURN(guard_, JobGuard::start());
  // Orphans of the ranks (children of an exited rank) become ours: reaped here, so that a
  // group's emptiness can be seen, and killable by group until then.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return errno_status("prctl(PR_SET_CHILD_SUBREAPER)", errno);
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set, s);
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
  if (opts_.spare_host) return join_as_spare();
  if (opts_.multi_node()) return join_nodes();
  STRATA_ASSIGN_OR_RETURN(token_, random_hex(16));
  // Signals are blocked above, so the store thread inherits the mask and never takes them.
  STRATA_ASSIGN_OR_RETURN(store_, bootstrap::StoreServer::start("127.0.0.1", opts_.port, token_));
  return Status::ok();
}

std::string Launcher::rank_name(const Rank& r) const {
  if (r.spare >= 0) return "spare " + std::to_string(r.spare);
  if (!link_) return "rank " + std::to_string(r.index);
  return "rank " + std::to_string(r.global) + " on " + node_name_;
}

Status Launcher::spawn(Rank& r, const std::string& path, std::vector<char*>& argv,
                       const std::vector<std::string>& shared_env) {
  std::vector<std::string> env_strings = shared_env;
  if (r.spare >= 0) {
    // No rank yet: strata::init() learns it (and its epoch) from the store when assigned.
    env_strings.push_back("STRATA_SPARE=" + std::to_string(r.spare));
  } else {
    env_strings.push_back("STRATA_RANK=" + std::to_string(r.global));
    env_strings.push_back("STRATA_LOCAL_RANK=" + std::to_string(r.index));
    env_strings.push_back("RANK=" + std::to_string(r.global));
    env_strings.push_back("LOCAL_RANK=" + std::to_string(r.index));
  }
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
  int in = (r.global == 0 && r.spare < 0 && !::isatty(STDIN_FILENO)) ? STDIN_FILENO : devnull_;
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
  if (guard_) guard_->watch(pid);
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
  // A name is resolved (with a deadline) and its address probed; never every interface,
  // which would report a port free there that is taken on the address the job uses.
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    auto addrs = bootstrap::resolve(host, 0, false, Deadline::after(std::chrono::seconds(5)));
    if (addrs.is_ok())
      for (const auto& r : *addrs)
        if (r.family == AF_INET) {
          a.sin_addr = reinterpret_cast<const sockaddr_in*>(&r.addr)->sin_addr;
          break;
        }
  }
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
    print_error(kRunWho, ok.message());
    if (store_) store_->stop();
    return exit_code_ ? exit_code_ : 1;
  }
  // After prepare(): the thread inherits the blocked signals and never takes them.
  if (Status o = output_.start(); !o.is_ok()) print_error(kRunWho, o.message() + "; writing output directly");
  if (spare_unneeded_) {
    say("the job ended without needing this spare host");
    output_.close();
    return 0;
  }
  auto path = find_program(opts_.argv[0]);
  if (!path) {
    const bool is_path = opts_.argv[0].find('/') != std::string::npos;
    struct stat st {};
    const bool exists = is_path && ::stat(opts_.argv[0].c_str(), &st) == 0;
    say(opts_.argv[0] + (!is_path              ? ": command not found in PATH"
                         : !exists             ? ": no such file"
                         : S_ISDIR(st.st_mode) ? ": is a directory, not a program"
                                               : ": is not executable (chmod +x, or run it through its interpreter)"));
    return kNotFoundExit;
  }
  path_ = *path;
  for (auto& a : opts_.argv) argv_.push_back(a.data());
  argv_.push_back(nullptr);

  // Our own variables replace any inherited ones (a launcher started from inside a job).
  static constexpr const char* kOwned[] = {
      "STRATA_RANK=", "STRATA_WORLD_SIZE=", "STRATA_LOCAL_RANK=", "STRATA_LOCAL_SIZE=", "STRATA_STORE=",
      "STRATA_JOB_TOKEN=", "STRATA_JOB_ID=", "STRATA_NODE_RANK=", "STRATA_NNODES=", "STRATA_FT=", "STRATA_EPOCH=",
      "STRATA_SPARE=",
      // torchrun's, for torch.distributed's env:// rendezvous (any backend)
      "RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "GROUP_RANK="};
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
    opts_.ft_opts.start_timeout = env.start_timeout_or_default();
    opts_.ft_opts.world_size = world;
    // Each host's agent watches and replaces its own ranks; they meet in the job's store.
    std::vector<int> mine;
    const int base = link_ ? world_.rank_base : 0;
    for (int i = 0; i < opts_.nranks; ++i) mine.push_back(base + i);
    ft_ = std::make_unique<FtController>(opts_.ft_opts, job_id_, std::move(mine));
    const bootstrap::StoreAddress at =
        link_ ? link_->spec().store : bootstrap::StoreAddress{"127.0.0.1", store_->port()};
    // Across hosts a store gone for twice the agent timeout is lost with its node (the
    // agents' own links declare it after one): this agent's failure notices give up then,
    // rather than after the store client's default of a minute.
    Status c = link_ ? ft_->start(at, token_, 2 * link_->spec().agent_timeout) : ft_->start(at, token_);
    if (!c.is_ok()) {
      say("--ft: cannot reach the job's store: " + c.message());
      if (store_) store_->stop();
      return 1;
    }
    // Spare numbers are job-wide (the store keys of a spare carry them): each host has a range.
    if (link_) next_spare_ = *opts_.node_rank * kSparesPerNode;
  }

  if (link_) {
    auto fd = link_->start_monitor();
    if (!fd.is_ok()) {
      say(fd.status().message());
      return 1;
    }
    link_fd_ = *fd;
  }
  ranks_.resize(opts_.nranks);
  // A spare host's ranks replace a lost host's: they start in the epoch that announced it.
  std::vector<std::string> first_env = shared_env;
  if (start_epoch_ > 0) first_env.push_back("STRATA_EPOCH=" + std::to_string(start_epoch_));
  for (int i = 0; i < opts_.nranks; ++i) {
    ranks_[i].index = i;
    ranks_[i].global = (link_ ? world_.rank_base : 0) + i;
    Status s = spawn(ranks_[i], path_, argv_, first_env);
    if (!s.is_ok()) {
      say(rank_name(ranks_[i]) + ": " + s.message());
      exit_code_ = s.code() == Code::InvalidArgument ? kNotFoundExit : 1;
      report_failure(exit_code_, rank_name(ranks_[i]) + ": " + s.message());
      stop(SIGTERM, true);
      break;
    }
  }
  // After the ranks, so that the first epoch's start-up has the cores first.
  for (int k = 0; k < opts_.spares && !stopping_; ++k)
    if (!start_spare()) break;
  if (opts_.timeout) job_deadline_ = Clock::now() + *opts_.timeout;
  loop();
  // Every rank is gone, but what they started may not be (a background child, descendants
  // that ignored the SIGTERM): nothing of the job outlives the launcher.
  signal_ranks(SIGKILL);
  // Ranks that were killed could not remove their heap sockets.
  {
    std::vector<int> mine;
    for (const auto& r : ranks_)
      if (r.spare < 0) mine.push_back(r.global);
    memory::remove_job_sockets(Env::get().socket_dir, job_id_, mine);
  }
  if (guard_) guard_->disarm();
  if (ft_) ft_->stop();
  if (link_) link_->finish();
  if (store_) store_->stop();
  output_.close();
  return exit_code_;
}

void Launcher::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> streams;
  for (;;) {
    auto now = Clock::now();
    retire_spares();
    if (refill_check_ && now >= *refill_check_) refill_spares(now);
    if (running_count() == 0) {
      if (any_pipe_open()) {
        if (!drain_until_) drain_until_ = now + kDrain;
        if (now >= *drain_until_) {
          // Descendants still hold the pipes; relay what is buffered and stop reading (they
          // are killed with their groups when the launcher leaves).
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
    if (term_at_ && now >= *term_at_) {
      term_at_.reset();
      stop(SIGTERM, true);
    }
    if (kill_at_ && now >= *kill_at_) {
      kill_at_.reset();
      for (const auto& r : ranks_)
        if (r.running)
          say(rank_name(r) + " (pid " + std::to_string(r.pid) + ") did not exit after SIGTERM; sending SIGKILL");
      signal_ranks(SIGKILL);
    }
    if (job_deadline_ && now >= *job_deadline_) {
      job_deadline_.reset();
      if (!stopping_) {
        std::string msg = "the job did not finish within --timeout " + opts_.timeout_text;
        say(msg + "; stopping " + std::to_string(running_count()) + " rank(s)");
        exit_code_ = kTimeoutExit;
        report_failure(exit_code_, msg + (link_ ? " (timer of node " + node_name_ + ")" : ""));
        stop(SIGTERM, true);
      }
    }

    std::optional<Clock::time_point> wake;
    finish_flight(now);
    for (const auto& t : {kill_at_, term_at_, job_deadline_, drain_until_, flight_until_, refill_check_})
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
      say(std::string("poll: ") + std::strerror(errno));
      stop(SIGKILL, false);
      exit_code_ = exit_code_ ? exit_code_ : 1;
      return;
    }
    if (n <= 0) continue;
    // Output first, so lines a rank printed before it died come before the report of
    // its death.
    for (size_t i = 0; i < streams.size(); ++i)
      if (fds[i + first_stream].revents) relay(*streams[i].first, *streams[i].second);
    finish_flight(Clock::now());
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
    if (sig == SIGUSR1) {
      request_flight();  // a question, not a stop: the job keeps running
      continue;
    }
    if (!stopping_) {
      say("received " + signal_name(sig) + "; forwarding it to " + std::to_string(running_count()) + " rank(s)");
      exit_code_ = 128 + sig;
      report_failure(exit_code_, "the agent on " + node_name_ + " received " + signal_name(sig));
      // A Ctrl-C may be meant to let ranks clean up at leisure; a TERM or HUP comes from
      // something that wants the job gone, so that one is enforced after the grace time.
      stop(sig, sig != SIGINT);
    } else {
      say("received " + signal_name(sig) + " again; killing the ranks");
      signal_ranks(SIGKILL);
    }
  }
  reap();
}

void Launcher::request_flight() {
  if (flight_) {
    say("received SIGUSR1; a flight-recorder report is already being collected");
    return;
  }
  flight_ = std::make_unique<FlightReport>();
  int asked = 0, skipped = 0;
  for (const auto& r : ranks_) {
    if (!r.running || !r.current || r.spare >= 0) continue;
    // The library installs its handler at init; before that (or with the recorder off)
    // SIGUSR1 would end the rank, so it is only sent to ranks that catch it.
    if (!catches_signal(r.pid, SIGUSR1)) {
      ++skipped;
      continue;
    }
    if (::kill(r.pid, SIGUSR1) == 0) {
      flight_->expect(r.global);
      ++asked;
    }
  }
  say("received SIGUSR1; asking " + std::to_string(asked) + " rank(s) for their flight recorder" +
      (skipped ? " (" + std::to_string(skipped) + " without a SIGUSR1 handler not asked)" : std::string()));
  flight_until_ = Clock::now() + kFlightWait;
}

void Launcher::finish_flight(Clock::time_point now) {
  if (!flight_ || !(flight_->complete() || (flight_until_ && now >= *flight_until_))) return;
  std::vector<int> all;
  for (const auto& r : ranks_)
    if (r.current && r.spare < 0) all.push_back(r.global);
  std::string msg = "flight recorder report (" + std::to_string(all.size()) + " rank(s)):";
  for (const auto& l : flight_->render(all)) msg += "\n  " + l;
  say(msg);
  flight_.reset();
  flight_until_.reset();
}

void Launcher::reap() {
  // Any child: a rank, an orphan of a rank (we are their subreaper) or the guard.
  for (;;) {
    int status = 0;
    pid_t p = ::waitpid(-1, &status, WNOHANG);
    if (p <= 0) break;
    // By index: a replacement appended meanwhile invalidates deque iterators (not references).
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].running && ranks_[i].pid == p) {
        on_exit(ranks_[i], status);
        break;
      }
    }
  }
  forget_empty_groups();
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
  if (r.spare >= 0) return on_spare_exit(r, status);
  bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // A rank that ends well while others run may have ended before it joined the job; they would
  // wait for it until their deadline (with --ft, its recovery handles an exit).
  if (!failed && !stopping_ && r.current && !ft_ && running_count() > 0) note_exit(r, "exited with code 0");
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
  say(msg);
  stop(SIGTERM, true);
}

void Launcher::note_exit(const Rank& r, const std::string& what) {
  if (!notes_) {
    if (!link_ && !store_) return;
    const bootstrap::StoreAddress at =
        link_ ? link_->spec().store : bootstrap::StoreAddress{"127.0.0.1", store_->port()};
    auto c = bootstrap::StoreClient::connect(at, token_, Deadline::after(std::chrono::milliseconds(500)));
    if (!c.is_ok()) return;  // a hint for the others only: their deadline still holds
    notes_ = std::move(c.value());
  }
  (void)notes_->set(bootstrap::exited_key(job_id_, r.global), what + " (pid " + std::to_string(r.pid) + ")");
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
  const std::string prefix = r.spare >= 0 ? "[spare" + std::to_string(r.spare) + "] "
                             : link_      ? "[" + node_name_ + ":" + std::to_string(r.global) + "] "
                                          : "[" + std::to_string(r.index) + "] ";
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
    // A flight-recorder dump asked for by SIGUSR1 goes into the merged report instead.
    if (!(flight_ && &s == &r.err && flight_->take(s.pending.substr(start, len))))
      out.append(prefix).append(s.pending, start, len).push_back('\n');
    start += len + (nl != std::string::npos ? 1 : 0);
  }
  s.pending.erase(0, start);
  auto dropped_note = [&] {
    return prefix + "... " + std::to_string(s.dropped) + " bytes dropped (output faster than the terminal)\n";
  };
  // One queued chunk per batch: lines of different ranks never interleave mid-line. The
  // report of earlier drops goes first, so it sits where the gap is.
  if (!out.empty()) {
    std::string batch = s.dropped ? dropped_note() + out : std::move(out);
    if (output_.push(s.to, std::move(batch))) s.dropped = 0;
    else s.dropped += start;  // the rank's bytes, prefixes aside
  }
  if (at_eof && s.dropped) {
    output_.push_always(s.to, dropped_note());
    s.dropped = 0;
  }
}

void Launcher::say(const std::string& msg) {
  std::string line;
  line.reserve(msg.size() + 16);
  line.append(kRunWho).append(": ").append(msg).push_back('\n');
  output_.push_always(STDERR_FILENO, std::move(line));
}

void Launcher::stop(int sig, bool escalate) {
  stopping_ = true;
  signal_ranks(sig);
  if (escalate && !kill_at_) kill_at_ = Clock::now() + kGrace;
}

void Launcher::signal_ranks(int sig) {
  // Exited ranks too: what they started (still in their group) must go with the job. Groups
  // seen empty are skipped (forget_empty_groups): their ids may have been reused.
  for (const auto& r : ranks_)
    if (r.pid > 0 && !r.group_gone) ::kill(-r.pid, sig);
}

void Launcher::forget_empty_groups() {
  // A group id stays reserved while the group has a member, zombies included: one seen
  // empty after its members were reaped can only be a stranger's later.
  for (auto& r : ranks_) {
    if (r.running || r.group_gone || r.pid <= 0) continue;
    if (::kill(-r.pid, 0) != 0 && errno == ESRCH) {
      r.group_gone = true;
      if (guard_) guard_->forget(r.pid);
    }
  }
}

int Launcher::running_count() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
}

bool Launcher::any_pipe_open() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; });
}

}  // namespace strata::cli::launch

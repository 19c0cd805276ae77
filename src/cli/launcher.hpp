#pragma once
// What the parts of `strata run` share (internal to src/cli): the parsed command line and the
// Launcher, whose members live in launcher.cpp (one host: spawn, relay, signals), node_agent.cpp
// (one agent of a multi-node job) and ft_run.cpp (replacement of failed ranks, --ft); run.cpp
// parses the command line and starts it.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"
#include "cli/flight_report.hpp"
#include "cli/ft_controller.hpp"
#include "cli/node_link.hpp"
#include "cli/output_queue.hpp"
#include "cli/rank_groups.hpp"
#include "common/status.hpp"

namespace strata::cli::launch {

using Clock = std::chrono::steady_clock;

/// Prefix of the launcher's own messages.
inline constexpr const char* kRunWho = "strata run";
/// Time between SIGTERM and SIGKILL when the launcher stops the ranks on its own.
inline constexpr std::chrono::seconds kGrace{2};
/// How long output is still relayed after the last rank exited, for descendants that hold
/// the pipes open; they must not keep the launcher alive.
inline constexpr std::chrono::seconds kDrain{1};
/// A line longer than this is relayed in pieces, each with its own prefix.
inline constexpr size_t kMaxLine = 64 * 1024;
/// Output waiting for a slow terminal, at most; beyond it ranks' lines are dropped and
/// counted. Enough for seconds of a chatty job, small next to the ranks' memory.
inline constexpr size_t kMaxQueuedOutput = 8 * 1024 * 1024;
/// How long a SIGKILLed process group may take to vanish before the launcher reports the
/// stuck process instead of waiting on (a process in uninterruptible sleep does not die).
inline constexpr std::chrono::seconds kKillWait{5};
/// How long the launcher waits for the ranks' flight-recorder dumps after a SIGUSR1.
inline constexpr std::chrono::seconds kFlightWait{2};
/// How long a spare used by a recovery waits at most for that recovery before another is
/// started in the background, and how often the recovery's completion is checked meanwhile.
inline constexpr std::chrono::seconds kRefillWait{2};
inline constexpr std::chrono::milliseconds kRefillPoll{5};
/// After the rebuild the ranks still restore the state and redo the step: the new spare's
/// start-up (exec, loading, a Python program's imports) waits this much longer.
inline constexpr std::chrono::milliseconds kRefillSettle{250};
/// Hot spares are numbered job-wide: node I numbers its spares from I * kSparesPerNode.
inline constexpr int kSparesPerNode = 100000;
/// --ft across hosts: how long an agent may stay silent before its host counts as lost,
/// unless STRATA_AGENT_TIMEOUT says otherwise.
inline constexpr std::chrono::milliseconds kFtAgentTimeout{750};
/// --ft: when a lost host ends the job, the ranks get the error through the store and exit on
/// their own; SIGTERM follows after this long.
inline constexpr std::chrono::milliseconds kFatalGrace{1000};
/// Exit status when --timeout ends the job, as timeout(1).
inline constexpr int kTimeoutExit = 124;
/// Exit status when the program cannot be started, as a shell.
inline constexpr int kNotFoundExit = 127;

/// The command line of `strata run`.
struct RunOptions {
  int nranks = 0;
  std::optional<std::chrono::milliseconds> timeout;
  std::string timeout_text;  // as the user wrote it, for the message
  uint16_t port = 0;
  bool ft = false;
  FtOptions ft_opts;
  int spares = 0;               // --spares K: hot spares waiting in strata::init() (--ft)
  bool spare_host = false;      // --spare: a spare host for a lost node's ranks (--ft)
  bool external_store = false;  // --external-store: `strata store` serves --store, not node 0
  std::vector<std::string> argv;
  // Multi-node.
  std::optional<int> nnodes, node_rank;
  std::string store;
  std::optional<std::string> token;
  std::optional<std::chrono::milliseconds> rdzv_timeout;
  bool multi_node() const { return nnodes.has_value() || spare_host; }
};

/// The path PROGRAM runs from (PATH lookup for a bare name), or nullopt.
std::optional<std::string> find_program(const std::string& name);

/// A port free on `host` right now, for torch's store (rank 0 binds it a moment later;
/// torchrun's --master_port=0 makes the same choice). 29500, torch's default, if none is found.
int free_port(const std::string& host = "127.0.0.1");

/// One `strata run`: the ranks of this host, their output, their signals and their fate. Its
/// members are defined by concern: launcher.cpp (single host, output), node_agent.cpp
/// (multi-node agent), ft_run.cpp (replacing failed ranks, --ft).
class Launcher {
 public:
  /// Takes the parsed command line; nothing starts before run().
  explicit Launcher(RunOptions o) : opts_(std::move(o)) {}
  /// Starts the store (or joins the other nodes), the ranks, and relays until the job is over;
  /// returns the exit status of `strata run`.
  int run();

 private:
  struct Stream {
    int fd = -1;  // read end of the rank's pipe; -1 once closed
    int to = -1;  // where its lines go (our stdout or stderr)
    std::string pending;
    uint64_t dropped = 0;  // bytes not relayed since the last report (the terminal was too slow)
  };
  struct Rank {
    int index = 0;   // on this node
    int global = 0;  // in the job
    pid_t pid = -1;
    bool running = false;
    bool current = true;      // the newest process of this rank (--ft keeps replaced ones for their output)
    bool group_gone = false;  // its process group was seen empty: its id may belong to others now
    int spare = -1;           // hot spare number while it waits for a rank (--spares); -1 for a rank
    Stream out, err;
  };

  // Single host (launcher.cpp).
  /// Blocks the signals onto a signalfd and starts the store (or joins the nodes).
  Status prepare();
  // Multi-node agent (node_agent.cpp).
  /// Serves the store on node 0, registers this node and waits for the others.
  Status join_nodes();
  /// Reacts to the job's fate as another node or the store reported it.
  void on_job_event(const JobEvent& e);
  /// `strata run --ft --spare`: waits at the job's store until a lost host's ranks are given
  /// to this host (it then runs them like that node's agent), or the job ends without it.
  Status join_as_spare();
  /// --ft: node `node` was lost; a spare host takes its ranks, or the job ends with `report`.
  void on_node_lost(int node, const std::string& report);
  /// --ft: the job cannot recover (`why`): every rank learns it through the store, and this
  /// host's ranks are stopped after kFatalGrace.
  void end_unrecoverable(const std::string& why);
  /// This agent's part of the multi-node settings, for the store at `store` (node count and
  /// node rank are the caller's).
  NodeSpec node_spec(const bootstrap::StoreAddress& store) const;
  /// The host's name without its domain, for output prefixes.
  static std::string short_host_name(int node_rank);
  /// What the rendezvous waits check: a signal that ends the wait (its name), or nullopt.
  NodeLink::Interrupted signal_check();
  /// Tells the other nodes that this one failed (no-op on a single host).
  void report_failure(int exit_code, const std::string& report);
  /// "rank 3", or "rank 3 on host" in a multi-node job, for messages.
  std::string rank_name(const Rank& r) const;
  /// Forks and execs one rank with its environment and output pipes.
  Status spawn(Rank& r, const std::string& path, std::vector<char*>& argv, const std::vector<std::string>& shared_env);
  /// The poll() loop: output, signals, heartbeats, job events, deadlines.
  void loop();
  /// Drains the signalfd: forwards SIGINT/SIGTERM/SIGHUP, reaps on SIGCHLD.
  void on_signals();
  /// SIGUSR1: asks every running rank that catches it for its flight recorder.
  void request_flight();
  /// Prints the merged report once every asked rank answered or kFlightWait passed.
  void finish_flight(Clock::time_point now);
  /// Collects exited ranks (and, with --ft, replaces the failed ones together).
  void reap();
  /// One rank exited: report it and stop the job, or queue it for replacement (--ft).
  void on_exit(Rank& r, int status);
  // Fault tolerance, --ft (ft_run.cpp).
  /// Kills what is left of `failed` and starts replacements (or every rank, --restart-all).
  void replace(const std::vector<Rank*>& failed, const std::string& why, int exit_code);
  /// Replaces the ranks the controller found silent (hung or stopped).
  void check_heartbeats();
  /// Starts one more hot spare (no rank, STRATA_SPARE set); false when it could not start.
  bool start_spare();
  /// The spare that takes a failed rank next (one waiting in strata::init(), else the
  /// oldest), or nullptr.
  Rank* waiting_spare();
  /// Starts spares up to --spares K kRefillSettle after the rebuild that used one is complete
  /// (so that the new spare's start-up does not compete with the recovery), or after
  /// kRefillWait in any case.
  void refill_spares(Clock::time_point now);
  /// A spare exited while waiting: start another, unless spares keep failing.
  void on_spare_exit(Rank& r, int status);
  /// The job's ranks are all gone: the spares have nothing left to wait for.
  void retire_spares();
  /// Whether a rank (not a spare) is still running.
  bool ranks_running() const;
  /// Whether every rank but `failed` (this host's, on a one-host job) has exited with code 0:
  /// the job is over, and a replacement would have nobody to rejoin.
  bool job_finished_without(const std::vector<Rank*>& failed) const;
  // Output (launcher.cpp).
  /// Reads what a rank wrote on one stream and passes whole lines on.
  void relay(Rank& r, Stream& s);
  /// Writes the complete lines of `s` with the rank prefix (all of it at EOF), or drops and
  /// counts them when the terminal is behind; a count is reported with the next lines.
  void emit(const Rank& r, Stream& s, bool at_eof);
  /// The launcher's own message "strata run: MSG" on stderr, in order with the ranks' lines.
  void say(const std::string& msg);
  /// SIGKILLs the process group of `r` (its leader may be reaped already) and waits, up to
  /// kKillWait, until nothing of it is left; reports a process that stays.
  void kill_and_wait(Rank& r);
  /// Sends `sig` to every rank; `escalate`: SIGKILL after the grace time.
  void stop(int sig, bool escalate);
  /// Signals the process groups of all ranks, exited ones included, unless seen empty.
  void signal_ranks(int sig);
  /// Marks the groups of exited ranks that have emptied, so that they are never signalled
  /// again (their ids can be reused), here or by the guard.
  void forget_empty_groups();
  /// Ranks not yet reaped.
  int running_count() const;
  /// Notes in the job's store that rank `r` exited (`what`), so that ranks waiting for its
  /// world record in init fail at once, naming it, instead of at their deadline.
  void note_exit(const Rank& r, const std::string& what);
  /// Whether some rank's output pipe is still open.
  bool any_pipe_open() const;

  RunOptions opts_;
  std::deque<Rank> ranks_;  // a deque: replacements are appended while others are referenced
  std::string path_;
  std::vector<char*> argv_;
  std::vector<std::string> shared_env_;
  std::unique_ptr<FtController> ft_;
  int restarts_ = 0;
  int next_spare_ = 0;   // number of the next spare started
  int spares_lost_ = 0;  // spares that died while waiting
  bool spares_off_ = false;
  std::optional<Clock::time_point> refill_check_, refill_by_, refill_at_;
  std::vector<Rank*> exited_;  // failed in the current reap pass (--ft)
  std::string exited_why_;
  int exited_code_ = 0;
  int sigfd_ = -1;
  int devnull_ = -1;
  std::unique_ptr<JobGuard> guard_;  // kills the rank groups if the launcher dies
  OutputQueue output_{kMaxQueuedOutput};
  std::string token_, job_id_;
  std::unique_ptr<bootstrap::StoreServer> store_;
  std::unique_ptr<bootstrap::StoreClient> notes_;  // note_exit's connection, made when first needed
  // Multi-node only.
  std::unique_ptr<NodeLink> link_;
  World world_;
  std::string node_name_;
  int link_fd_ = -1;
  uint64_t start_epoch_ = 0;     // a spare host's ranks start in this recovery epoch
  bool spare_unneeded_ = false;  // a spare host whose job ended without it
  bool job_over_ = false;        // the job's fate is known job-wide (or the store was lost)
  bool fenced_ = false;          // this host was declared lost: it reports nothing any more
  bool done_sent_ = false;
  int exit_code_ = 0;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_at_, job_deadline_, drain_until_;
  std::optional<Clock::time_point> term_at_;  // --ft: SIGTERM the ranks then (a fatal notice was given)
  std::unique_ptr<FlightReport> flight_;      // a SIGUSR1 report being collected
  std::optional<Clock::time_point> flight_until_;
};

}  // namespace strata::cli::launch

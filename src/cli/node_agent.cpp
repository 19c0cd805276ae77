// `strata run --nnodes`: the agent of one node of a multi-node job. Node 0 serves the store
// on the --store address, every agent registers its local rank count there, and global ranks
// are numbered by node order. The agents then agree on the job's fate through the store
// (node_link.hpp): a failure anywhere, a vanished agent or a lost store stops the ranks on
// every node.

#include <sys/signalfd.h>
#include <unistd.h>

#include <climits>
#include <csignal>

#include "bootstrap/job_info.hpp"
#include "cli/commands.hpp"
#include "cli/launcher.hpp"
#include "common/env.hpp"

namespace strata::cli::launch {

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
  // --ft: a lost host must be found within a second (its ranks' survivors wait meanwhile);
  // STRATA_AGENT_TIMEOUT, when set, decides.
  spec.agent_timeout = env.agent_timeout_set || !opts_.ft ? env.agent_timeout : kFtAgentTimeout;
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

void Launcher::report_failure(int exit_code, const std::string& report) {
  if (link_) link_->report_failure(exit_code, report);
}

void Launcher::on_job_event(const JobEvent& e) {
  switch (e.kind) {
    case JobEvent::Kind::Finished: job_over_ = true; return;
    case JobEvent::Kind::Failed:
      job_over_ = true;
      if (e.node == *opts_.node_rank || stopping_) return;  // our own report, or already stopping
      exit_code_ = e.exit_code;
      if (ft_) {
        // --ft: the ranks here are waiting to recover. They learn through the store why they
        // cannot (an error naming the lost host and its ranks) and exit on their own; the
        // stop follows after a short grace.
        ft_->announce_fatal(e.report);
        say("the job failed on node " + std::to_string(e.node) + ": " + e.report +
            "; no spare host takes its ranks, so the job cannot recover; the " + std::to_string(running_count()) +
            " rank(s) on " + node_name_ + " get this error and are stopped in " + std::to_string(kFatalGrace.count()) +
            " ms if still running");
        stopping_ = true;
        term_at_ = Clock::now() + kFatalGrace;
        return;
      }
      say("the job failed on node " + std::to_string(e.node) + " (" +
          (e.node >= 0 && e.node < static_cast<int>(world_.nodes.size()) ? world_.nodes[e.node].name
                                                                         : std::string("?")) +
          "): " + e.report + "; stopping the " + std::to_string(running_count()) + " rank(s) on " + node_name_);
      stop(SIGTERM, true);
      return;
    case JobEvent::Kind::LostStore:
      job_over_ = true;
      if (!stopping_ || exit_code_ == 0) exit_code_ = e.exit_code;
      say(e.report + (running_count()
                          ? "; stopping the " + std::to_string(running_count()) + " rank(s) on " + node_name_
                          : std::string()));
      if (!stopping_) stop(SIGTERM, true);
      return;
  }
}

}  // namespace strata::cli::launch

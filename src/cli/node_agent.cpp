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

std::string Launcher::short_host_name(int node_rank) {
  char name[HOST_NAME_MAX + 1] = {};
  std::string n = ::gethostname(name, sizeof name - 1) == 0 ? name : "node" + std::to_string(node_rank);
  // The short name: prefixes are read by people, and FQDNs of one cluster share the tail.
  if (auto dot = n.find('.'); dot != std::string::npos && dot > 0) n.resize(dot);
  return n;
}

NodeLink::Interrupted Launcher::signal_check() {
  // Signals are blocked (and only the signalfd sees them): the waits check it, so that a
  // Ctrl-C while the other nodes are still missing ends the wait.
  return [this]() -> std::optional<std::string> {
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
}

NodeSpec Launcher::node_spec(const bootstrap::StoreAddress& store) const {
  const Env& env = Env::get();
  NodeSpec spec;
  spec.local_size = opts_.nranks;
  spec.store = store;
  spec.token = token_;
  spec.node_name = node_name_;
  spec.host_id = bootstrap::host_identity(env);
  spec.rdzv_timeout = opts_.rdzv_timeout.value_or(env.store_connect_timeout);
  // --ft: a lost host must be found within a second (its ranks' survivors wait meanwhile);
  // STRATA_AGENT_TIMEOUT, when set, decides.
  spec.agent_timeout = env.agent_timeout_set || !opts_.ft ? env.agent_timeout : kFtAgentTimeout;
  spec.heartbeat = env.agent_heartbeat;
  spec.ft = opts_.ft;
  spec.external_store = opts_.external_store;
  spec.job_options = std::string(opts_.ft ? "--ft" : "no --ft") +
                     (opts_.ft ? ", --max-failures " + std::to_string(opts_.ft_opts.max_failures) +
                                     (opts_.ft_opts.restart_all ? ", --restart-all" : "")
                               : std::string()) +
                     (opts_.external_store ? ", --external-store" : "");
  return spec;
}

Status Launcher::join_nodes() {
  auto addr = bootstrap::StoreAddress::parse(opts_.store);
  if (!addr.is_ok()) return addr.status();
  token_ = *opts_.token;
  node_name_ = short_host_name(*opts_.node_rank);
  if (*opts_.node_rank == 0 && !opts_.external_store) {
    auto server = bootstrap::StoreServer::start(addr->host, addr->port, token_);
    if (!server.is_ok())
      return server.status().with_context("node 0 serves the store on --store " + opts_.store +
                                          ", which must be an address of this host: ");
    store_ = std::move(*server);
  }
  NodeSpec spec = node_spec(*addr);
  spec.nnodes = *opts_.nnodes;
  spec.node_rank = *opts_.node_rank;
  STRATA_ASSIGN_OR_RETURN(link_, NodeLink::connect(spec, signal_check()));
  STRATA_ASSIGN_OR_RETURN(world_, link_->rendezvous(free_port(addr->host), job_id_, signal_check()));
  job_id_ = world_.job_id;
  return Status::ok();
}

void Launcher::report_failure(int exit_code, const std::string& report) {
  if (link_ && !fenced_) link_->report_failure(exit_code, report);
}

void Launcher::on_job_event(const JobEvent& e) {
  switch (e.kind) {
    case JobEvent::Kind::Finished: job_over_ = true; return;
    case JobEvent::Kind::Failed:
      job_over_ = true;
      if (e.node == *opts_.node_rank || stopping_) return;  // our own report, or already stopping
      exit_code_ = e.exit_code;
      if (ft_) {
        end_unrecoverable("the job failed on node " + std::to_string(e.node) + ": " + e.report);
        return;
      }
      say("the job failed on node " + std::to_string(e.node) + " (" +
          (e.node >= 0 && e.node < static_cast<int>(world_.nodes.size()) ? world_.nodes[e.node].name
                                                                         : std::string("?")) +
          "): " + e.report + "; stopping the " + std::to_string(running_count()) + " rank(s) on " + node_name_);
      stop(SIGTERM, true);
      return;
    case JobEvent::Kind::NodeLost: on_node_lost(e.node, e.report); return;
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

void Launcher::end_unrecoverable(const std::string& why) {
  // --ft: the ranks here are waiting to recover. They learn through the store why they
  // cannot (the fatal notice) and exit on their own; the stop follows after a short grace.
  ft_->announce_fatal(why);
  say(why + "; the job cannot recover: the " + std::to_string(running_count()) + " rank(s) on " + node_name_ +
      " get this error and are stopped in " + std::to_string(kFatalGrace.count()) + " ms if still running");
  if (exit_code_ == 0) exit_code_ = 1;
  stopping_ = true;
  term_at_ = Clock::now() + kFatalGrace;
}

void Launcher::on_node_lost(int node, const std::string& report) {
  if (!ft_ || stopping_) return;
  // With a store outside the job every agent saw it: one handles it.
  if (auto mine = link_->claim_loss(node); mine.is_ok() && !*mine) return;
  const auto [base, n] = link_->ranks_of_node(node);
  const std::string what = "node " + std::to_string(node) + " lost: " + report;
  std::vector<std::string> skipped;
  auto spare = link_->claim_spare(node, skipped);
  std::string passed;
  for (const auto& s : skipped) passed += (passed.empty() ? "" : ", ") + s;
  if (!passed.empty()) passed = "; spare host(s) " + passed + " skipped: dead or cut off";
  std::string why;
  if (!spare.is_ok()) {
    why = passed + "; looking for a spare host: " + spare.status().message();
  } else if (!*spare) {
    why = passed + "; no spare host is left to take its ranks";
  } else if ((*spare)->local_size != n) {
    why = "; spare host " + (*spare)->name + " runs " + std::to_string((*spare)->local_size) +
          " rank(s) (strata run -n), not the " + std::to_string(n) + " the node had";
    (void)link_->refuse_spare(**spare, "it runs " + std::to_string((*spare)->local_size) +
                                           " rank(s) (strata run -n) where node " + std::to_string(node) + " had " +
                                           std::to_string(n));
  } else {
    std::vector<int> ranks;
    for (int r = base; r < base + n; ++r) ranks.push_back(r);
    if (ft_->on_failure(ranks, &why, (*spare)->host_id)) {
      Status s = link_->assign_spare(**spare, node, ft_->epoch());
      if (s.is_ok()) {
        say(what + passed + "; its ranks start again on spare host " + (*spare)->name + " (epoch " +
            std::to_string(ft_->epoch()) + ", failure " + std::to_string(ft_->failures()) + " of at most " +
            std::to_string(ft_->options().max_failures) + ")");
        return;
      }
      why = s.message();
    } else if (why.empty()) {
      why = std::to_string(ft_->failures()) + " failure(s) in the job exceed --max-failures " +
            std::to_string(ft_->options().max_failures);
    }
    why = "; " + why;
  }
  // Every other agent learns it from the job's state; this one ends its own ranks here.
  report_failure(1, report + why);
  end_unrecoverable(what + why);
}

Status Launcher::join_as_spare() {
  auto addr = bootstrap::StoreAddress::parse(opts_.store);
  if (!addr.is_ok()) return addr.status();
  token_ = *opts_.token;
  node_name_ = short_host_name(-1);
  NodeSpec spec = node_spec(*addr);  // nnodes and node rank come with the takeover
  spec.nnodes = 0;
  spec.node_rank = -1;
  STRATA_ASSIGN_OR_RETURN(link_, NodeLink::connect(spec, signal_check()));
  say("spare host " + node_name_ + " waits at the store " + opts_.store + " for the ranks of a lost host");
  STRATA_ASSIGN_OR_RETURN(auto takeover, link_->wait_as_spare(signal_check()));
  if (!takeover) {
    spare_unneeded_ = true;
    return Status::ok();
  }
  world_ = takeover->world;
  job_id_ = world_.job_id;
  opts_.nnodes = link_->spec().nnodes;
  opts_.node_rank = link_->spec().node_rank;
  start_epoch_ = takeover->epoch;
  say("spare host " + node_name_ + " takes node " + std::to_string(*opts_.node_rank) + "'s ranks " +
      std::to_string(world_.rank_base) + "-" + std::to_string(world_.rank_base + opts_.nranks - 1) + " in epoch " +
      std::to_string(start_epoch_));
  return Status::ok();
}

}  // namespace strata::cli::launch

// `strata run --ft`: what the launcher does with a failed rank when a recovery controller
// (ft_controller.hpp) runs the job: kill what is left of it, then start a replacement in a
// new epoch, or restart every rank (--restart-all, the baseline).

#include <csignal>

#include "cli/commands.hpp"
#include "cli/launcher.hpp"

namespace strata::cli::launch {

void Launcher::replace(const std::vector<Rank*>& failed, const std::string& why, int exit_code) {
  std::vector<int> idx;
  for (Rank* r : failed) {
    idx.push_back(r->index);
    r->current = false;
    // Even when the rank itself has exited: a child it forked shares its sockets (the heap's
    // fd channel) and would keep the replacement from binding them.
    kill_and_wait(*r);
  }
  if (!ft_->on_failure(idx, why)) {
    exit_code_ = exit_code;
    say(why + "; " + std::to_string(ft_->failures()) + " failure(s) exceed --max-failures " +
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
      kill_and_wait(r);
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
  say(why + "; " + (ft_->options().restart_all ? "restarting every rank" : "replacing it") + " (epoch " +
      std::to_string(ft_->epoch()) + ", failure " + std::to_string(ft_->failures()) + " of at most " +
      std::to_string(ft_->options().max_failures) + ")");
  for (int i : respawn) {
    Rank& nr = ranks_.emplace_back();
    nr.index = i;
    nr.global = i;  // --ft runs on one node: global rank = local index
    Status s = spawn(nr, path_, argv_, env);
    if (!s.is_ok()) {
      say("replacement of rank " + std::to_string(i) + ": " + s.message());
      exit_code_ = 1;
      stop(SIGTERM, true);
      return;
    }
  }
  ft_->on_spawned();
}

void Launcher::kill_and_wait(Rank& r) {
  // Before its replacement binds its names (heap socket) and before survivors drop its
  // memory, nothing of the rank may be left; but a process stuck in the kernel must not
  // stop the launcher: report it and go on.
  Status s = r.group_gone ? Status::ok() : kill_group_and_wait(r.pid, SIGKILL, Deadline::after(kKillWait));
  if (s.is_ok()) {
    r.group_gone = true;
    if (guard_) guard_->forget(r.pid);
  } else {
    say(rank_name(r) + " (pid " + std::to_string(r.pid) + "): " + s.message() +
        "; going on without waiting for it (its replacement may find its names still taken)");
  }
  if (r.running) {
    // Reaped above with the rest of its group (or stuck): either way it is no rank any more.
    r.running = false;
    relay(r, r.out);
    relay(r, r.err);
  }
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

}  // namespace strata::cli::launch

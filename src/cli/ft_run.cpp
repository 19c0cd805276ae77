// `strata run --ft`: what the launcher does with a failed rank when a recovery controller
// (ft_controller.hpp) runs the job: kill what is left of it, then start a replacement in a
// new epoch, or restart every rank (--restart-all, the baseline).
//
// With --spares K the replacement is already running: K processes started with the job run
// the program up to strata::init() and wait there (recovery/spare.cpp). A failed rank goes to
// the oldest waiting spare; the spare used is replaced in the background once the recovery
// is complete (its rebuild, then kRefillSettle for the state transfer and the redone step),
// so that its start-up does not compete with the recovery for the cores.

#include <algorithm>
#include <csignal>

#include "cli/commands.hpp"
#include "cli/launcher.hpp"

namespace strata::cli::launch {

void Launcher::replace(const std::vector<Rank*>& failed, const std::string& why, int exit_code) {
  if (job_finished_without(failed)) {
    // A replacement would wait for peers that are gone, until its deadline.
    const std::string msg = why +
                            "; every other rank had already finished, so there is nothing for a replacement "
                            "to rejoin: not replacing it";
    for (Rank* r : failed) r->current = false;
    exit_code_ = exit_code;
    say(msg);
    report_failure(exit_code, msg);
    retire_spares();
    return;
  }
  if (link_) {
    // This agent may have been declared lost (stopped, or cut off, for the agent timeout) while
    // its ranks went on: a spare host runs them now, and these exited on learning it. Nothing
    // here is a failure of the job any more; what is left of it stops.
    auto by = link_->replaced_by();
    if (by.is_ok() && *by) {
      for (Rank* r : failed) r->current = false;
      exit_code_ = exit_code ? exit_code : 1;
      say("this host was declared lost and its ranks run on host " + **by + " now; stopping the " +
          std::to_string(running_count()) + " rank(s) still here (" + why + ")");
      fenced_ = true;
      job_over_ = true;
      stop(SIGKILL, false);
      return;
    }
  }
  std::vector<int> idx;  // global ranks
  for (Rank* r : failed) {
    idx.push_back(r->global);
    r->current = false;
    // Even when the rank itself has exited: a child it forked shares its sockets (the heap's
    // fd channel) and would keep the replacement from binding them.
    kill_and_wait(*r);
  }
  const int base = link_ ? world_.rank_base : 0;
  // Hot spares take their ranks before the epoch's notice goes out: the notice wakes every
  // survivor at once, and a hand-over queued behind their store traffic came ~12 ms after the
  // detection at 64 ranks on 2 cores (under 1 ms before it).
  struct Handed {
    int rank, spare, pid;
  };
  std::vector<Handed> handed;
  std::string hand_error;
  auto hand_to_spares = [&] {
    if (ft_->options().restart_all) return;
    for (int i : idx) {
      Rank* sp = waiting_spare();
      if (!sp) return;
      // The ranks read the spawn time once their rebuild is done, which a spare can reach
      // before this loop ends: record it before the first hand-over (when other ranks are
      // also spawned afresh, their start is then counted in the join, not the spawn).
      if (handed.empty()) ft_->on_spawned();
      const int id = sp->spare;
      sp->spare = -1;
      sp->index = i - base;
      sp->global = i;
      ft_->forget_spare(id);
      if (Status s = ft_->assign_spare(id, i); !s.is_ok()) {
        hand_error = "handing rank " + std::to_string(i) + " to spare " + std::to_string(id) + ": " + s.message();
        return;
      }
      ft_->expect_start(i, true);
      handed.push_back({i, id, static_cast<int>(sp->pid)});
    }
  };
  std::string refused;
  if (!ft_->on_failure(idx, &refused, "", hand_to_spares)) {
    exit_code_ = exit_code;
    const std::string msg =
        why + "; " +
        (refused.empty() ? std::to_string(ft_->failures()) + " failure(s) in the job exceed --max-failures " +
                               std::to_string(ft_->options().max_failures)
                         : refused) +
        ", stopping the job";
    say(msg);
    report_failure(exit_code, msg);  // the other hosts' ranks cannot go on either
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
    for (int i = 0; i < opts_.nranks; ++i) respawn.push_back(base + i);
    std::string job = job_id_ + "-restart" + std::to_string(++restarts_);
    for (auto& e : shared_env_)
      if (e.rfind("STRATA_JOB_ID=", 0) == 0) e = "STRATA_JOB_ID=" + job;
    env = shared_env_;
    ft_->set_job(job);
  } else {
    env.push_back("STRATA_EPOCH=" + std::to_string(ft_->epoch()));
  }
  say(why + "; " +
      (ft_->options().restart_all ? "restarting every rank"
       : idx.size() > 1           ? "replacing them"
                                  : "replacing it") +
      " (epoch " + std::to_string(ft_->epoch()) + ", failure " + std::to_string(ft_->failures()) + " of at most " +
      std::to_string(ft_->options().max_failures) + ")");
  for (const Handed& h : handed)
    say("rank " + std::to_string(h.rank) + " goes to spare " + std::to_string(h.spare) + " (pid " +
        std::to_string(h.pid) + ")");
  if (!hand_error.empty()) {
    say(hand_error);
    exit_code_ = 1;
    report_failure(exit_code_, hand_error);
    stop(SIGTERM, true);
    return;
  }
  for (int i : respawn) {
    if (std::any_of(handed.begin(), handed.end(), [i](const Handed& h) { return h.rank == i; })) continue;
    Rank& nr = ranks_.emplace_back();
    nr.index = i - base;
    nr.global = i;
    Status s = spawn(nr, path_, argv_, env);
    if (!s.is_ok()) {
      const std::string msg = "replacement of rank " + std::to_string(i) + ": " + s.message();
      say(msg);
      exit_code_ = 1;
      report_failure(exit_code_, msg);
      stop(SIGTERM, true);
      return;
    }
    // One stuck before init() (in its imports, stopped) would hold the survivors in recover()
    // until their STRATA_TIMEOUT, which they would then fail with.
    ft_->expect_start(i, false);
  }
  if (handed.empty()) ft_->on_spawned();
  say("epoch " + std::to_string(ft_->epoch()) + ": the controller's cost of this failure: " + ft_->failure_cost());
  if (!handed.empty()) {
    refill_by_ = Clock::now() + kRefillWait;
    refill_check_ = Clock::now() + kRefillPoll;
    refill_at_.reset();
  }
}

bool Launcher::start_spare() {
  Rank& sp = ranks_.emplace_back();
  sp.index = -1;
  sp.global = -1;
  sp.spare = next_spare_++;
  Status s = spawn(sp, path_, argv_, shared_env_);
  if (s.is_ok()) {
    ft_->watch_spare(sp.spare);
    return true;
  }
  sp.current = false;
  say("spare " + std::to_string(sp.spare) + ": " + s.message() + "; going on without it");
  return false;
}

Launcher::Rank* Launcher::waiting_spare() {
  // One already waiting in strata::init() first; else the oldest, the likeliest to get there
  // first (the assignment waits for it in the store).
  Rank* oldest = nullptr;
  // One whose wait beat stopped is skipped: stopped or stuck, it would never take the rank
  // (the watcher reports it, and it is replaced).
  for (auto& r : ranks_) {
    if (r.spare < 0 || !r.running || !r.current || !ft_->spare_alive(r.spare)) continue;
    if (ft_->spare_waiting(r.spare)) return &r;
    if (!oldest) oldest = &r;
  }
  return oldest;
}

void Launcher::refill_spares(Clock::time_point now) {
  refill_check_.reset();
  if (stopping_ || spares_off_ || !ranks_running()) return;
  if (!refill_at_) {
    if (now < *refill_by_ && !ft_->recovered()) {
      refill_check_ = now + kRefillPoll;
      return;
    }
    refill_at_ = now + kRefillSettle;
  }
  if (now < *refill_at_) {
    refill_check_ = refill_at_;
    return;
  }
  refill_at_.reset();
  int waiting = 0;
  for (const auto& r : ranks_) waiting += r.spare >= 0 && r.running && r.current;
  for (; waiting < opts_.spares; ++waiting)
    if (!start_spare()) break;
}

void Launcher::on_spare_exit(Rank& r, int status) {
  ft_->forget_spare(r.spare);
  if (stopping_ || !r.current) return;  // retired or stopped with the job
  r.current = false;
  kill_and_wait(r);  // what it started goes with it
  const std::string who = rank_name(r) + " (pid " + std::to_string(r.pid) + ")";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    // It never waited for a rank: a program without strata::init(), whose spares would all
    // do the same.
    spares_off_ = true;
    say(who +
        " exited with code 0 before it was given a rank (does the program call strata::init()?); "
        "no more spares are started");
    return;
  }
  const std::string what = WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                             : "was killed by " + signal_name(WTERMSIG(status));
  if (++spares_lost_ > ft_->options().max_failures) {
    spares_off_ = true;
    say(who + " " + what + "; " + std::to_string(spares_lost_) + " lost spares exceed --max-failures " +
        std::to_string(ft_->options().max_failures) + ", no more spares are started");
    return;
  }
  say(who + " " + what + " while waiting; starting spare " + std::to_string(next_spare_) + " in its place");
  if (!refill_check_ && ranks_running()) start_spare();  // else the pending refill starts it after the recovery
}

bool Launcher::job_finished_without(const std::vector<Rank*>& failed) const {
  // Only this host's ranks are known here: on several hosts the others may still run.
  if ((link_ && link_->spec().nnodes > 1) || ft_->options().restart_all) return false;
  bool others = false;
  for (const Rank& r : ranks_) {
    if (!r.current || r.spare >= 0 || std::find(failed.begin(), failed.end(), &r) != failed.end()) continue;
    if (r.running) return false;
    others = true;  // current and not running: it exited with code 0
  }
  return others;
}

bool Launcher::ranks_running() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running && r.spare < 0; });
}

void Launcher::retire_spares() {
  if (opts_.spares == 0 || ranks_running()) return;
  for (auto& r : ranks_) {
    if (r.spare < 0 || !r.running || !r.current) continue;
    r.current = false;  // its exit is ours, not news
    if (!r.group_gone) ::kill(-r.pid, SIGKILL);
  }
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
  for (const FtController::Hung& h : ft_->take_hung()) {
    for (auto& r : ranks_) {
      if (r.global != h.rank || !r.current || !r.running) continue;
      const std::string who = rank_name(r) + " (pid " + std::to_string(r.pid) + ")";
      const std::string within =
          " did not begin as the rank within " + std::to_string(ft_->start_grace(h.spare).count()) + " ms";
      std::string why;
      if (!h.never_started)
        why = who + " sent no heartbeat for " + std::to_string(ft_->options().heartbeat_timeout.count()) +
              " ms (hung or stopped)";
      else if (h.spare) why = who + ", handed to a hot spare," + within + " (hung or stopped)";
      else
        why = who + ", started as its replacement," + within +
              " (STRATA_START_TIMEOUT; stuck or stopped before strata::init())";
      replace({&r}, why, 128 + SIGKILL);
      break;
    }
    if (stopping_) return;
  }
  for (int id : ft_->take_hung_spares()) {
    for (auto& r : ranks_) {
      if (r.spare != id || !r.current || !r.running) continue;
      // Its exit comes back through on_spare_exit, which starts another in its place.
      say(rank_name(r) + " (pid " + std::to_string(r.pid) + ") stopped beating for " +
          std::to_string(ft_->options().heartbeat_timeout.count()) +
          " ms while it waited (hung or stopped): killing it");
      if (!r.group_gone) ::kill(-r.pid, SIGKILL);
      break;
    }
  }
  if (auto e = ft_->take_rebuild(); e && ft_->announce_rebuild(*e))
    say("every rank is recovering in epoch " + std::to_string(*e) +
        " and none failed (a rank called abort()?): rebuilding in epoch " + std::to_string(ft_->epoch()) +
        " with no rank replaced");
  for (auto [i, by] : ft_->take_suspected()) {
    for (auto& r : ranks_) {
      if (r.global != i || !r.current) continue;
      const std::string named = "rank " + std::to_string(by) + " saw a failure waiting for " + rank_name(r) + " (pid " +
                                std::to_string(r.pid) + "), which ";
      if (r.running)
        replace({&r}, named + "did not begin recovering itself (stuck in the program, or stopped)", 128 + SIGKILL);
      else replace({&r}, named + "had exited with code 0 while the other ranks still needed it", 0);
      break;
    }
    if (stopping_) return;
  }
}

}  // namespace strata::cli::launch

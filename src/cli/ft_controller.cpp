#include "cli/ft_controller.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <sstream>

#include <strata/recovery.hpp>

#include "common/parse.hpp"
#include "recovery/keys.hpp"

namespace strata::cli {

namespace keys = recovery::keys;
using Clock = std::chrono::steady_clock;
// The least a named rank is given to report that it is recovering itself.
constexpr std::chrono::milliseconds kSuspectGrace{1000};

Status FtController::start(const bootstrap::StoreAddress& addr, const std::string& token,
                           std::optional<std::chrono::milliseconds> reconnect) {
  auto deadline = Deadline::after(std::chrono::seconds(10));
  STRATA_ASSIGN_OR_RETURN(store_, bootstrap::StoreClient::connect(addr, token, deadline));
  if (reconnect) store_->set_reconnect_timeout(*reconnect);
  STRATA_ASSIGN_OR_RETURN(watch_store_, bootstrap::StoreClient::connect(addr, token, deadline));
  // The store lives in this process: a broken connection means it is shutting down.
  watch_store_->set_reconnect_timeout(std::chrono::seconds(1));
  beats_.assign(ranks_.size(), Beat{});
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return errno_status("eventfd", errno);
  watcher_ = std::thread([this] { watch_loop(); });
  return Status::ok();
}

void FtController::stop() {
  stop_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

FtController::~FtController() {
  stop();
  if (event_fd_ >= 0) ::close(event_fd_);
}

void FtController::watch_loop() {
  while (!stop_.load()) {
    std::this_thread::sleep_for(tick_interval());
    std::string job;
    {
      std::lock_guard<std::mutex> g(mu_);
      job = job_;
    }
    bool found = false;
    for (size_t i = 0; i < ranks_.size() && !stop_.load(); ++i) {
      const int r = ranks_[i];
      auto v = watch_store_->try_get(keys::heartbeat(job, r));
      const auto now = Clock::now();
      std::lock_guard<std::mutex> g(mu_);
      Beat& b = beats_[i];
      if (job != job_ || !v.is_ok()) continue;
      if (!v.value()) {
        // Not up: a replacement that does not begin as the rank within its start grace is
        // stuck (a spare's is short: it has started already).
        if (b.start_by && !b.reported && now > *b.start_by) {
          b.reported = true;
          hung_.push_back({static_cast<int>(i), b.gen, true, b.start_spare});
          found = true;
        }
        continue;
      }
      if (*v.value() == keys::kExiting) continue;  // leaving
      b.start_by.reset();                          // it beat: up
      if (went_silent(b, *v.value(), now)) {
        hung_.push_back({static_cast<int>(i), b.gen, false, false});
        found = true;
      }
    }
    if (watch_spares(job)) found = true;
    if (check_reports(job)) found = true;
    if (found) {
      uint64_t one = 1;
      (void)!::write(event_fd_, &one, sizeof one);
    }
  }
}

bool FtController::watch_spares(const std::string& job) {
  std::vector<int> ids;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [id, sb] : spares_)
      if (!sb.reported) ids.push_back(id);
  }
  bool found = false;
  for (int id : ids) {
    auto v = watch_store_->try_get(keys::spare_beat(job, id));
    const auto now = Clock::now();
    std::lock_guard<std::mutex> g(mu_);
    auto it = spares_.find(id);
    if (job != job_ || it == spares_.end() || !v.is_ok() || !v.value()) continue;  // forgotten, or not waiting yet
    if (went_silent(it->second, *v.value(), now)) {
      hung_spares_.push_back(id);
      found = true;
    }
  }
  return found;
}

void FtController::watch_spare(int spare) {
  std::lock_guard<std::mutex> g(mu_);
  spares_[spare] = SpareBeat{};
}

void FtController::forget_spare(int spare) {
  std::lock_guard<std::mutex> g(mu_);
  spares_.erase(spare);
}

bool FtController::spare_alive(int spare) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = spares_.find(spare);
  if (it == spares_.end() || !it->second.seen) return true;  // not watched, or not waiting yet
  return !it->second.reported && Clock::now() - it->second.changed <= opts_.heartbeat_timeout;
}

std::vector<int> FtController::take_hung_spares() {
  std::lock_guard<std::mutex> g(mu_);
  return std::exchange(hung_spares_, {});
}

void FtController::expect_start(int rank, bool spare) {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end()) return;
  std::lock_guard<std::mutex> g(mu_);
  Beat& b = beats_[static_cast<size_t>(it - ranks_.begin())];
  b.start_by = Clock::now() + start_grace(spare);
  b.start_spare = spare;
}

bool FtController::check_reports(const std::string& job) {
  // Two lists per tick, whatever the job's size: both are empty unless a rank saw a failure
  // that no controller announced. Reports are phases (keys::running_phase, rebuild_phase);
  // those of an epoch a failure has since ended are deleted here, so the lists stay short.
  auto named = watch_store_->list(keys::suspect_prefix(job));
  auto recovering = watch_store_->list(keys::recovering_prefix(job));
  if (!named.is_ok() || !recovering.is_ok() || (named.value().empty() && recovering.value().empty())) return false;
  auto st = watch_store_->try_get(state_key_);
  if (!st.is_ok()) return false;
  const uint64_t latest = st.value() ? parse_state(*st.value()).epoch : 0;
  auto rank_of = [](const std::string& k) {
    auto r = parse_int(std::string_view(k).substr(k.rfind('/') + 1), 0, INT_MAX);
    return r.is_ok() ? static_cast<int>(r.value()) : -1;
  };
  // Every rank's own report, by rank: its phase.
  std::vector<std::optional<uint64_t>> own(static_cast<size_t>(std::max(opts_.world_size, 0)));
  int running = 0;  // ranks recovering from a failure in the newest epoch
  if (!recovering.value().empty()) {
    auto values = watch_store_->get_many(recovering.value(), std::chrono::milliseconds(0));
    if (!values.is_ok()) return false;
    for (size_t k = 0; k < values.value().size(); ++k) {
      const std::string& key = recovering.value()[k];
      uint64_t phase = 0;
      if (!(std::istringstream(values.value()[k]) >> phase) || phase / 2 < latest) {
        (void)watch_store_->del(key);
        continue;
      }
      const int r = rank_of(key);
      if (r >= 0 && r < static_cast<int>(own.size())) own[static_cast<size_t>(r)] = phase;
      if (phase == keys::running_phase(latest)) ++running;
    }
  }
  bool found = false;
  for (const std::string& k : named.value()) {
    const int r = rank_of(k);
    auto at = std::find(ranks_.begin(), ranks_.end(), r);
    if (at == ranks_.end()) continue;  // another host's agent watches it
    const size_t i = static_cast<size_t>(at - ranks_.begin());
    uint64_t gen = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      gen = beats_[i].gen;
    }
    auto v = watch_store_->try_get(k);
    if (!v.is_ok() || !v.value()) continue;
    uint64_t phase = 0;
    int by = -1;
    if (!(std::istringstream(*v.value()) >> phase >> by) || phase / 2 < latest) {
      (void)watch_store_->del(k);  // of an epoch a failure has since ended
      continue;
    }
    // Recovering itself in that phase or later: it waited for someone else.
    if (r < static_cast<int>(own.size()) && own[static_cast<size_t>(r)] && *own[static_cast<size_t>(r)] >= phase)
      continue;
    // Named for not joining a rebuild (an even phase) but it has joined since.
    if (phase % 2 == 0) {
      auto joined = watch_store_->try_get(keys::join(job, phase / 2, r));
      if (!joined.is_ok() || joined.value()) continue;
    }
    const auto now = Clock::now();
    std::lock_guard<std::mutex> g(mu_);
    if (job != job_) return false;
    Beat& b = beats_[i];
    if (b.gen != gen) continue;  // replaced meanwhile: the report was about its predecessor
    if (b.suspect_phase != phase) {
      b.suspect_phase = phase;
      b.suspect_since = now;
      b.suspected_by = by;
      b.suspect_reported = false;
      continue;
    }
    // The grace lets a rank that waited for someone else in the same way report itself first.
    if (b.suspect_reported || now - b.suspect_since < std::max(opts_.heartbeat_timeout, kSuspectGrace)) continue;
    b.suspect_reported = true;
    suspected_.emplace_back(static_cast<int>(i), b.gen);
    found = true;
  }
  // Every rank recovering from a failure in the newest epoch, none of them failed: a rank
  // called abort(), or every rank recover().
  if (opts_.world_size > 0 && running == opts_.world_size) {
    std::lock_guard<std::mutex> g(mu_);
    if (job == job_ && rebuild_seen_ != latest) {
      rebuild_seen_ = latest;
      rebuild_ = latest;
      found = true;
    }
  }
  return found;
}

std::optional<uint64_t> FtController::take_rebuild() {
  std::lock_guard<std::mutex> g(mu_);
  return std::exchange(rebuild_, std::nullopt);
}

bool FtController::announce_rebuild(uint64_t e) {
  std::string why;
  auto next = advance([e](JobState& st) { return st.epoch == e && st.pending.empty(); }, &why);
  if (!next) return false;
  epoch_ = next->epoch;
  (void)store_->set(keys::detected(job_, epoch_), std::to_string(recovery::now_ns()));
  (void)store_->set(keys::epoch(job_, epoch_), "");
  return true;
}

std::vector<std::pair<int, int>> FtController::take_suspected() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::pair<int, int>> out;
  for (auto [i, gen] : suspected_) {
    const Beat& b = beats_[static_cast<size_t>(i)];
    if (b.gen == gen) out.emplace_back(ranks_[static_cast<size_t>(i)], b.suspected_by);
  }
  suspected_.clear();
  return out;
}

std::vector<FtController::Hung> FtController::take_hung() {
  uint64_t drain;
  (void)!::read(event_fd_, &drain, sizeof drain);
  std::lock_guard<std::mutex> g(mu_);
  std::vector<Hung> out;
  for (const Found& f : hung_)
    if (beats_[static_cast<size_t>(f.index)].gen == f.gen)
      out.push_back({ranks_[static_cast<size_t>(f.index)], f.never_started, f.spare});
  hung_.clear();
  return out;
}

FtController::JobState FtController::parse_state(const std::string& v) {
  JobState st;
  std::istringstream is(v);
  std::string ranks, flag;
  if (is >> st.epoch >> st.failures >> ranks) {
    st.pending = keys::parse_ranks(ranks);
    st.moves = keys::parse_moves(ranks);
  }
  st.fatal = (is >> flag) && flag == "fatal";
  return st;
}

std::string FtController::format_pending(const JobState& st) {
  std::string s;
  for (int r : st.pending) {
    s += s.empty() ? "" : ",";
    auto m = std::find_if(st.moves.begin(), st.moves.end(), [r](const auto& mv) { return mv.first == r; });
    s += m == st.moves.end() ? std::to_string(r) : keys::with_host(r, m->second);
  }
  return s;
}

std::string FtController::format_state(const JobState& st) {
  // "-" for no ranks keeps the fields apart for the stream that reads them back.
  const std::string ranks = format_pending(st);
  return std::to_string(st.epoch) + " " + std::to_string(st.failures) + " " + (ranks.empty() ? "-" : ranks) +
         (st.fatal ? " fatal" : "");
}

std::optional<FtController::JobState> FtController::advance(const std::function<bool(JobState&)>& change,
                                                            std::string* why) {
  // Every agent of the job may be doing the same at this moment: the winner of epoch E+1
  // announces it, with every rank still pending.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    auto cur = store_->try_get(state_key_);
    if (!cur.is_ok()) {
      *why = "the job's store cannot be reached to announce the failure: " + cur.status().message();
      return std::nullopt;
    }
    const std::string expected = cur.value().value_or("");
    JobState next = parse_state(expected);
    if (!next.pending.empty()) {
      // Ranks of a rebuild that completed are no longer being replaced.
      auto ready = store_->try_get(keys::ready(job_, next.epoch));
      if (ready.is_ok() && ready.value()) {
        next.pending.clear();
        next.moves.clear();
      }
    }
    if (next.fatal) {
      *why = "the job already ended without recovery (epoch " + std::to_string(next.epoch) + ")";
      return std::nullopt;
    }
    if (!change(next)) return std::nullopt;
    ++next.epoch;
    const std::string desired = format_state(next);
    auto res = store_->compare_set(state_key_, expected, desired);
    if (!res.is_ok()) {
      *why = "the job's store cannot be reached to announce the failure: " + res.status().message();
      return std::nullopt;
    }
    if (res.value() == desired) return next;
  }
  *why = "the job's failure state kept changing under this agent (1000 attempts)";
  return std::nullopt;
}

bool FtController::on_failure(const std::vector<int>& ranks, std::string* why, const std::string& new_host,
                              const std::function<void()>& before_notice) {
  at_failure_ = store_->counters();
  const int64_t t = recovery::now_ns();
  auto next = advance(
      [&](JobState& st) {
        // Restarting everything is one event however many ranks went down with the first (the
        // others typically exit on seeing it); replacing counts every rank replaced.
        st.failures += opts_.restart_all ? 1 : static_cast<int>(ranks.size());
        failures_ = st.failures;
        if (st.failures > opts_.max_failures) return false;
        for (int r : ranks) {
          if (std::find(st.pending.begin(), st.pending.end(), r) == st.pending.end()) st.pending.push_back(r);
          if (new_host.empty()) continue;
          std::erase_if(st.moves, [r](const auto& mv) { return mv.first == r; });
          st.moves.emplace_back(r, new_host);
        }
        std::sort(st.pending.begin(), st.pending.end());
        return true;
      },
      why);
  if (!next) return false;
  epoch_ = next->epoch;
  // The timestamps first: a rank that wakes on the notice reads them in its report.
  (void)store_->set(keys::detected(job_, epoch_), std::to_string(t));
  {
    // Before any hand-over: a spare's first beat must not land on its predecessor's counter
    // and be wiped with it.
    std::lock_guard<std::mutex> g(mu_);
    for (int r : ranks) reset_heartbeat(r);
  }
  if (before_notice) before_notice();
  (void)store_->set(keys::epoch(job_, epoch_), format_pending(*next));
  return true;
}

void FtController::announce_fatal(const std::string& why) {
  std::string err;
  auto next = advance(
      [](JobState& st) {
        st.fatal = true;
        return true;
      },
      &err);
  if (!next) return;
  epoch_ = next->epoch;
  (void)store_->set(keys::epoch(job_, epoch_), std::string(1, keys::kFatal) + why);
}

void FtController::on_spawned() { (void)store_->set(keys::spawned(job_, epoch_), std::to_string(recovery::now_ns())); }

std::string FtController::failure_cost() const {
  const bootstrap::StoreClient::Counters now = store_->counters();
  return std::to_string(now.ops - at_failure_.ops) + " store requests, " +
         std::to_string(now.bytes - at_failure_.bytes) + " bytes";
}

Status FtController::assign_spare(int spare, int rank) {
  return store_->set(keys::assign(job_, spare), std::to_string(rank) + " " + std::to_string(epoch_));
}

bool FtController::spare_waiting(int spare) {
  auto v = store_->try_get(keys::spare(job_, spare));
  return v.is_ok() && v.value();
}

bool FtController::recovered() {
  // The newest epoch, which another host's agent may have announced after ours.
  auto cur = store_->try_get(state_key_);
  const uint64_t e = cur.is_ok() && cur.value() ? std::max(epoch_, parse_state(*cur.value()).epoch) : epoch_;
  auto ready = store_->try_get(keys::ready(job_, e));
  return ready.is_ok() && ready.value();
}

void FtController::reset_heartbeat(int rank) {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end()) return;
  Beat& b = beats_[static_cast<size_t>(it - ranks_.begin())];
  b = Beat{{}, false, false, b.gen + 1, {}, {}};
  // The predecessor's counter must not count as the replacement's first beat: a slow start
  // would look like a hang.
  (void)store_->del(keys::heartbeat(job_, rank));
  (void)store_->del(keys::suspect(job_, rank));
}

void FtController::set_job(std::string job_id) {
  std::lock_guard<std::mutex> g(mu_);
  job_ = std::move(job_id);
  for (auto& b : beats_) b = Beat{{}, false, false, b.gen + 1, {}, {}};
}

}  // namespace strata::cli

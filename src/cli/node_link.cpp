#include "cli/node_link.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <sstream>

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using namespace std::chrono_literals;

const std::string kPrefix = "launcher/";
std::string node_key(int i) { return kPrefix + "node/" + std::to_string(i); }
std::string hb_key(int i) { return kPrefix + "hb/" + std::to_string(i); }
std::string done_key(int i) { return kPrefix + "done/" + std::to_string(i); }
std::string left_key(int i) { return kPrefix + "left/" + std::to_string(i); }
std::string spare_key(int64_t s) { return kPrefix + "spare/" + std::to_string(s); }
std::string taken_key(int64_t s) { return kPrefix + "taken/" + std::to_string(s); }
std::string assign_key(int64_t s) { return kPrefix + "assign/" + std::to_string(s); }
// How messages name the job's store: node 0's, or the one `strata store` serves outside the
// job (--external-store), whose loss says nothing about node 0.
std::string store_name(const NodeSpec& s) {
  return (s.external_store ? "the job's store (strata store) at " : "the store of node 0 at ") + s.store.to_string();
}
// The store client's "(tried for N ms)" counts the last slice of a longer wait only.
std::string without_try_time(std::string m) {
  const size_t a = m.find(" (tried for ");
  const size_t b = a == std::string::npos ? a : m.find(')', a);
  if (b != std::string::npos) m.erase(a, b + 1 - a);
  return m;
}
// An assignment that refuses the spare host, followed by why.
constexpr std::string_view kRefused = "refused ";
std::string options_key(int node) { return kPrefix + "options/" + std::to_string(node); }
std::string spare_hb_key(int64_t s) { return kPrefix + "sparehb/" + std::to_string(s); }
std::string lost_key(int node, const std::string& host_id) {
  // Per host: the node's spare host, once it took over, can be lost in its turn.
  return kPrefix + "lost/" + std::to_string(node) + "/" + std::to_string(std::hash<std::string>{}(host_id));
}
const std::string kSparesKey = kPrefix + "spares";
const std::string kStateKey = kPrefix + "state";
const std::string kJobKey = kPrefix + "job";

std::vector<std::string> split_lines(const std::string& s, size_t max_parts) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (parts.size() + 1 < max_parts) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) break;
    parts.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  parts.push_back(s.substr(start));
  return parts;
}

std::optional<int> to_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<int>(v);
}

std::string seconds_text(milliseconds d) {
  std::ostringstream o;
  o.precision(3);
  o << std::chrono::duration<double>(d).count() << " s";
  return o.str();
}

// A beat often enough that a loss is declared close to the agent timeout (a watcher sees a
// node silent between timeout - interval and timeout + 2 intervals after its last beat),
// rarely enough that a thousand agents do not keep the store busy.
milliseconds heartbeat_interval(const NodeSpec& spec) {
  if (spec.heartbeat.count() > 0) return spec.heartbeat;
  return std::clamp(spec.agent_timeout / 8, milliseconds(25), milliseconds(1000));
}

std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i) s += ", ";
    if (i == 16) {
      s += "... (" + std::to_string(nodes.size()) + " nodes)";
      break;
    }
    s += std::to_string(nodes[i]);
  }
  return s;
}

}  // namespace

std::string NodeLink::ranks_of(int node) const {
  const auto [base, n] = ranks_of_node(node);
  if (n == 0) return "";
  return "; lost with it: rank" +
         (n == 1 ? " " + std::to_string(base) : "s " + std::to_string(base) + "-" + std::to_string(base + n - 1));
}

// Waits are cut into slices of this length to look at `interrupted` in between.
constexpr milliseconds kSlice{250};

Result<std::unique_ptr<NodeLink>> NodeLink::connect(const NodeSpec& spec, const Interrupted& interrupted) {
  if (spec.heartbeat.count() > 0 && spec.heartbeat * 2 > spec.agent_timeout)
    return invalid_argument("STRATA_AGENT_HEARTBEAT (" + seconds_text(spec.heartbeat) +
                            ") must be at most half the agent timeout (" + seconds_text(spec.agent_timeout) +
                            ", STRATA_AGENT_TIMEOUT), or one late beat reads as a lost host");
  std::unique_ptr<NodeLink> link(new NodeLink(spec));
  Deadline until = Deadline::after(spec.rdzv_timeout);
  // Why the last try that got an answer failed (a refused connection, say): the last slice of
  // the deadline may be too short to get one, and its timeout would hide the cause.
  Status cause;
  for (;;) {
    auto client =
        bootstrap::StoreClient::connect(spec.store, spec.token, Deadline::after(std::min(kSlice, until.remaining())));
    if (client.is_ok()) {
      link->client_ = std::move(*client);
      return link;
    }
    if (client.status().code() != Code::Unavailable && client.status().code() != Code::Timeout)
      return client.status().with_context(store_name(spec) + ": ");
    if (client.status().code() == Code::Unavailable) cause = client.status();
    if (auto why = interrupted()) return aborted(*why + " while connecting to " + store_name(spec));
    if (until.expired()) {
      const Status& last = cause.is_ok() ? client.status() : cause;
      return Status(last.code(), "cannot reach " + store_name(spec) + " within " + seconds_text(spec.rdzv_timeout) +
                                     ": " + without_try_time(last.message()));
    }
  }
}

NodeLink::~NodeLink() {
  {
    std::lock_guard lk(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Result<World> NodeLink::rendezvous(int master_port, const std::string& job_id, const Interrupted& interrupted) {
  const NodeSpec& s = spec_;
  auto& store = *client_;
  if (s.node_rank == 0) STRATA_RETURN_IF_ERROR(store.set(kJobKey, job_id + "\n" + std::to_string(master_port)));

  // Before the registration: whoever sees a node registered finds its options there too.
  STRATA_RETURN_IF_ERROR(store.set(options_key(s.node_rank), s.job_options));
  std::string mine =
      std::to_string(s.local_size) + "\n" + std::to_string(s.nnodes) + "\n" + s.node_name + "\n" + s.host_id;
  STRATA_ASSIGN_OR_RETURN(std::string got, store.compare_set(node_key(s.node_rank), "", mine));
  if (got != mine) {
    auto other = split_lines(got, 4);
    return invalid_argument("node rank " + std::to_string(s.node_rank) + " is already taken by host '" +
                            (other.size() > 2 ? other[2] : got) +
                            "': give every node its own --node-rank (0 to --nnodes - 1)");
  }

  std::vector<std::string> keys;
  for (int i = 0; i < s.nnodes; ++i) keys.push_back(node_key(i));
  // The store itself may go (node 0 refused the job and left, say): each question to it is
  // bounded, or it would wait for the store a minute.
  const milliseconds patience = std::clamp(s.agent_timeout, milliseconds(1000), milliseconds(2000));
  auto gone = [&](const Status& why) {
    return unavailable(store_name(s) + " stopped answering while this node waited for the others to join (" +
                       why.message() + ")" +
                       (s.external_store ? std::string("; is `strata store` still running?")
                                         : std::string("; see node 0's output for why it left")));
  };
  Deadline until = Deadline::after(s.rdzv_timeout);
  Status waited;
  for (;;) {
    waited = store.wait(keys, std::min(kSlice, until.remaining()));
    if (waited.code() != Code::Timeout || until.expired()) break;
    if (auto why = interrupted()) return aborted(*why + " while waiting for the other nodes to join");
    // A slice also times out when the store is away: look whether it still answers.
    if (auto alive = store.try_get(node_key(s.node_rank), Deadline::after(patience)); !alive.is_ok())
      return gone(alive.status());
  }
  if (!waited.is_ok()) {
    if (waited.code() != Code::Timeout) return waited;
    std::vector<int> missing;
    const Deadline ask = Deadline::after(patience);
    for (int i = 0; i < s.nnodes; ++i) {
      auto v = store.try_get(node_key(i), ask);
      if (!v.is_ok()) return gone(v.status());
      if (!v->has_value()) missing.push_back(i);
    }
    return timeout_error("node(s) " + node_list(missing) + " of " + std::to_string(s.nnodes) + " did not join within " +
                         seconds_text(s.rdzv_timeout) +
                         " (is 'strata run --node-rank N' running there, with the same " + "--store and token?)");
  }

  STRATA_ASSIGN_OR_RETURN(World w, read_world());
  for (int i = 0; i < s.nnodes; ++i) {
    if (i == s.node_rank) continue;
    STRATA_ASSIGN_OR_RETURN(std::string theirs, store.get(options_key(i), patience));
    if (theirs != s.job_options)
      return invalid_argument("node " + std::to_string(i) + " ('" + w.nodes[i].name + "') was started with " + theirs +
                              ", this node with " + s.job_options + "; give every node the same options");
  }
  return w;
}

Result<World> NodeLink::read_world() {
  const NodeSpec& s = spec_;
  auto& store = *client_;
  World w;
  // Every key read here was set before the registrations this node has seen: a short bound,
  // so that a store gone meanwhile (node 0 left: a refused job) is not waited for.
  const milliseconds bound = std::clamp(s.agent_timeout, milliseconds(1000), milliseconds(5000));
  STRATA_ASSIGN_OR_RETURN(std::string job, store.get(kJobKey, bound));
  auto job_parts = split_lines(job, 2);
  w.job_id = job_parts[0];
  w.master_port = job_parts.size() > 1 ? to_int(job_parts[1]).value_or(29500) : 29500;
  for (int i = 0; i < s.nnodes; ++i) {
    STRATA_ASSIGN_OR_RETURN(std::string v, store.get(node_key(i), bound));
    auto p = split_lines(v, 4);
    if (p.size() != 4) return internal_error("malformed registration of node " + std::to_string(i) + ": '" + v + "'");
    auto local = to_int(p[0]);
    auto nnodes = to_int(p[1]);
    if (!local || *local < 1 || !nnodes)
      return internal_error("malformed registration of node " + std::to_string(i) + ": '" + v + "'");
    if (*nnodes != s.nnodes)
      return invalid_argument("node " + std::to_string(i) + " ('" + p[2] + "') was started with --nnodes " +
                              std::to_string(*nnodes) + ", this node with --nnodes " + std::to_string(s.nnodes));
    if (i < s.node_rank) w.rank_base += *local;
    w.world_size += *local;
    w.nodes.push_back(NodeInfo{*local, p[2], p[3]});
  }
  // From here on a store that does not answer within the agent timeout is a lost store.
  store.set_reconnect_timeout(s.agent_timeout);
  world_ = w;
  return w;
}

Result<std::optional<NodeLink::Takeover>> NodeLink::wait_as_spare(const Interrupted& interrupted) {
  auto& store = *client_;
  // The job's store is node 0's (or outside the job): gone for twice the agent timeout, the
  // job is over or lost, and no one will hand this host anything.
  store.set_reconnect_timeout(2 * spec_.agent_timeout);
  STRATA_ASSIGN_OR_RETURN(int64_t n, store.add(kSparesKey, 1));
  const int64_t id = n - 1;
  // The spare beats while it waits, so that the agent that claims it for a lost host can
  // tell a spare that died (or was cut off) meanwhile from one that is ready.
  STRATA_RETURN_IF_ERROR(store.add(spare_hb_key(id), 1).status());
  STRATA_RETURN_IF_ERROR(
      store.set(spare_key(id), std::to_string(spec_.local_size) + "\n" + spec_.node_name + "\n" + spec_.host_id));
  const milliseconds interval = heartbeat_interval(spec_);
  // A spare may wait long for a failure, but not for a job that never comes: the job's node 0
  // must have registered within the rendezvous timeout (a wrong --store, a job started
  // elsewhere).
  const Deadline rdzv = Deadline::after(spec_.rdzv_timeout);
  bool job_seen = false;
  for (;;) {
    if (Status beat = store.add(spare_hb_key(id), 1).status(); !beat.is_ok())
      return beat.with_context("spare host " + spec_.node_name + ": the job's store went away (its node lost, or " +
                               "the job over without telling this host): ");
    if (!job_seen) {
      STRATA_ASSIGN_OR_RETURN(auto reg, store.try_get(node_key(0)));
      job_seen = reg.has_value();
      if (!job_seen && rdzv.expired())
        return unavailable("spare host " + spec_.node_name + ": no job registered at the store " +
                           spec_.store.to_string() + " within the rendezvous timeout of " +
                           seconds_text(spec_.rdzv_timeout) +
                           " (--rdzv-timeout); start the job's agents with this --store, or give a longer one");
    }
    auto v = store.get(assign_key(id), interval);
    if (v.is_ok() && v.value().starts_with(kRefused))
      return invalid_argument("spare host " + spec_.node_name +
                              " was refused by the job: " + v.value().substr(kRefused.size()));
    if (v.is_ok()) {
      std::istringstream in(v.value());
      int node = -1;
      uint64_t epoch = 0;
      if (!(in >> node >> epoch) || node < 0 || epoch == 0)
        return internal_error("malformed assignment '" + v.value() + "' of spare host " + std::to_string(id));
      // The job's shape from node 0's registration; this host becomes `node`.
      STRATA_ASSIGN_OR_RETURN(std::string reg0, store.get(node_key(0), spec_.rdzv_timeout));
      auto p0 = split_lines(reg0, 4);
      auto nnodes = p0.size() == 4 ? to_int(p0[1]) : std::nullopt;
      if (!nnodes || node >= *nnodes) return internal_error("malformed registration of node 0: '" + reg0 + "'");
      spec_.nnodes = static_cast<int>(*nnodes);
      spec_.node_rank = node;
      STRATA_ASSIGN_OR_RETURN(World w, read_world());
      if (w.nodes[node].local_size != spec_.local_size)
        return invalid_argument("spare host " + spec_.node_name + " was started with -n " +
                                std::to_string(spec_.local_size) + " but node " + std::to_string(node) + " had " +
                                std::to_string(w.nodes[node].local_size) + " rank(s)");
      STRATA_RETURN_IF_ERROR(store.set(node_key(node), std::to_string(spec_.local_size) + "\n" +
                                                           std::to_string(spec_.nnodes) + "\n" + spec_.node_name +
                                                           "\n" + spec_.host_id));
      w.nodes[node] = NodeInfo{spec_.local_size, spec_.node_name, spec_.host_id};
      world_ = w;
      return std::optional<Takeover>(Takeover{w, epoch});
    }
    if (v.status().code() != Code::Timeout)
      return v.status().with_context("spare host waiting at the store " + spec_.store.to_string() + ": ");
    STRATA_ASSIGN_OR_RETURN(auto state, store.try_get(kStateKey));
    if (state) return std::optional<Takeover>();  // the job is over
    if (auto why = interrupted()) return aborted(*why + " while waiting as a spare host");
  }
}

Result<std::optional<NodeLink::SpareHost>> NodeLink::claim_spare(int node, std::vector<std::string>& skipped) {
  STRATA_RETURN_IF_ERROR(ensure_main_client());
  auto& store = *main_client_;
  STRATA_ASSIGN_OR_RETURN(auto keys, store.list(kPrefix + "spare/"));
  for (const std::string& k : keys) {
    auto id = to_int(k.substr(k.rfind('/') + 1));
    if (!id) continue;
    std::optional<milliseconds> silent;
    {
      std::lock_guard lk(mu_);
      if (auto it = spare_beats_.find(*id); it != spare_beats_.end()) {
        auto quiet = std::chrono::duration_cast<milliseconds>(Clock::now() - it->second.changed);
        if (quiet >= spec_.agent_timeout) silent = quiet;
      }
    }
    // A dead spare is taken too, so that no other agent waits on it.
    const std::string claim = silent ? "silent" : std::to_string(node);
    STRATA_ASSIGN_OR_RETURN(std::string got, store.compare_set(taken_key(*id), "", claim));
    if (got != claim) continue;
    STRATA_ASSIGN_OR_RETURN(auto rec, store.try_get(k));
    if (!rec) continue;
    auto p = split_lines(*rec, 3);
    if (p.size() != 3 || p[2].empty()) continue;
    if (silent) {
      skipped.push_back(p[1] + " (no heartbeat for " + seconds_text(*silent) + ")");
      continue;
    }
    SpareHost sp;
    sp.id = static_cast<int>(*id);
    sp.local_size = static_cast<int>(to_int(p[0]).value_or(0));
    sp.name = p[1];
    sp.host_id = p[2];
    return std::optional<SpareHost>(sp);
  }
  return std::optional<SpareHost>();
}

Status NodeLink::watch_spares() {
  auto& store = *client_;
  STRATA_ASSIGN_OR_RETURN(auto keys, store.list(kPrefix + "spare/"));
  const auto now = Clock::now();
  for (const std::string& k : keys) {
    auto id = to_int(k.substr(k.rfind('/') + 1));
    if (!id) continue;
    STRATA_ASSIGN_OR_RETURN(auto hb, store.try_get(spare_hb_key(*id)));
    const int64_t beats = hb ? std::strtoll(hb->c_str(), nullptr, 10) : 0;
    std::lock_guard lk(mu_);
    auto [it, fresh] = spare_beats_.try_emplace(*id, SpareBeat{beats, now});
    if (!fresh && it->second.beats != beats) it->second = SpareBeat{beats, now};
  }
  return Status::ok();
}

Status NodeLink::ensure_main_client() {
  // The monitor thread owns client_: the agent's own requests take a connection of their own.
  if (main_client_) return Status::ok();
  STRATA_ASSIGN_OR_RETURN(
      main_client_, bootstrap::StoreClient::connect(spec_.store, spec_.token, Deadline::after(spec_.agent_timeout)));
  main_client_->set_reconnect_timeout(spec_.agent_timeout);
  return Status::ok();
}

Result<bool> NodeLink::claim_loss(int node) {
  STRATA_RETURN_IF_ERROR(ensure_main_client());
  auto& store = *main_client_;
  // The host this agent saw go silent (its registration may already name the spare host
  // another agent gave the node to): every agent that saw the same loss claims the same key.
  std::string host;
  {
    std::lock_guard lk(mu_);
    if (node >= 0 && node < static_cast<int>(world_.nodes.size())) host = world_.nodes[node].host_id;
  }
  const std::string me = std::to_string(spec_.node_rank);
  STRATA_ASSIGN_OR_RETURN(std::string got, store.compare_set(lost_key(node, host), "", me));
  if (got == me) return true;
  // Another agent handles it: watch the node again, for its spare host's beats.
  std::lock_guard lk(mu_);
  revived_.push_back(node);
  return false;
}

Result<std::optional<std::string>> NodeLink::replaced_by() {
  STRATA_RETURN_IF_ERROR(ensure_main_client());
  // A spare host that takes a node over registers under the node's key (wait_as_spare).
  STRATA_ASSIGN_OR_RETURN(auto reg, main_client_->try_get(node_key(spec_.node_rank),
                                                          Deadline::after(std::max(spec_.agent_timeout, 1000ms))));
  if (!reg) return std::optional<std::string>();
  const auto p = split_lines(*reg, 4);
  if (p.size() == 4 && (p[2] != spec_.node_name || p[3] != spec_.host_id)) return std::optional<std::string>(p[2]);
  return std::optional<std::string>();
}

Status NodeLink::assign_spare(const SpareHost& spare, int node, uint64_t epoch) {
  {
    std::lock_guard lk(mu_);
    revived_.push_back(node);
    if (node >= 0 && node < static_cast<int>(world_.nodes.size()))
      world_.nodes[node] = NodeInfo{world_.nodes[node].local_size, spare.name, spare.host_id};
  }
  return main_client_->set(assign_key(spare.id), std::to_string(node) + " " + std::to_string(epoch));
}

Status NodeLink::refuse_spare(const SpareHost& spare, const std::string& why) {
  return main_client_->set(assign_key(spare.id), std::string(kRefused) + why);
}

std::pair<int, int> NodeLink::ranks_of_node(int node) const {
  std::lock_guard lk(mu_);  // the monitor thread updates a node a spare host took over
  int base = 0;
  const int nodes = static_cast<int>(world_.nodes.size());
  for (int j = 0; j < node && j < nodes; ++j) base += world_.nodes[j].local_size;
  return {base, node >= 0 && node < nodes ? world_.nodes[node].local_size : 0};
}

Result<int> NodeLink::start_monitor() {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return errno_status("eventfd", errno);
  thread_ = std::thread([this] { monitor(); });
  return wake_fd_;
}

std::optional<JobEvent> NodeLink::take_event() {
  uint64_t drained;
  if (wake_fd_ >= 0) (void)!::read(wake_fd_, &drained, sizeof drained);
  std::lock_guard lk(mu_);
  if (events_.empty()) return std::nullopt;
  JobEvent e = std::move(events_.front());
  events_.erase(events_.begin());
  return e;
}

void NodeLink::post(JobEvent e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(e));
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void NodeLink::report_failure(int exit_code, const std::string& report) {
  {
    std::lock_guard lk(mu_);
    if (final_seen_ || failure_to_publish_) return;
    failure_to_publish_ = {exit_code, report};
    published_ = false;
  }
  cv_.notify_all();
}

void NodeLink::report_done() {
  {
    std::lock_guard lk(mu_);
    done_to_publish_ = true;
    published_ = false;
  }
  cv_.notify_all();
}

void NodeLink::finish() {
  auto interval = heartbeat_interval(spec_);
  {
    // A failure still on its way to the store must get there, or the other nodes learn of
    // it only from the missing heartbeats.
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, spec_.agent_timeout, [&] { return published_ || final_seen_ || !thread_.joinable(); });
  }
  if (spec_.node_rank == 0 && !spec_.external_store && thread_.joinable()) {
    // The others poll the state once per interval; give them a few to read it before the
    // store goes away. A node that died never leaves, hence the bound.
    std::vector<std::string> keys;
    std::vector<int> silent;
    {
      std::lock_guard lk(mu_);
      silent = silent_nodes_;
    }
    for (int i = 1; i < spec_.nnodes; ++i)
      if (std::find(silent.begin(), silent.end(), i) == silent.end()) keys.push_back(left_key(i));
    if (!keys.empty()) (void)client_->wait(keys, 3 * interval + 500ms);
  }
  {
    std::lock_guard lk(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status NodeLink::tick(std::vector<int64_t>& last_hb, std::vector<Clock::time_point>& last_change) {
  auto& store = *client_;
  STRATA_RETURN_IF_ERROR(store.add(hb_key(spec_.node_rank), 1).status());
  STRATA_ASSIGN_OR_RETURN(auto state, store.try_get(kStateKey));
  if (!state && (spec_.node_rank == 0 || spec_.external_store)) {
    // Node 0 watches the others (with a store outside the job, every agent does): an agent
    // whose heartbeat stalls took its host's ranks with it (killed, host down, or cut off
    // from the network).
    {
      // A spare host took these nodes over: its beats are watched from now on.
      std::lock_guard lk(mu_);
      for (int i : revived_) {
        if (i < 0 || i >= spec_.nnodes || i == spec_.node_rank) continue;
        last_hb[i] = -1;
        last_change[i] = Clock::now();
        std::erase(silent_nodes_, i);
      }
      revived_.clear();
    }
    if (spec_.ft) STRATA_RETURN_IF_ERROR(watch_spares());
    STRATA_ASSIGN_OR_RETURN(auto done, store.list(kPrefix + "done/"));
    if (static_cast<int>(done.size()) >= spec_.nnodes) {
      STRATA_ASSIGN_OR_RETURN(std::string v, store.compare_set(kStateKey, "", "ok"));
      state = v;
    } else {
      auto now = Clock::now();
      for (int i = 0; i < spec_.nnodes && !state; ++i) {
        if (i == spec_.node_rank) continue;
        if (std::find(done.begin(), done.end(), done_key(i)) != done.end()) continue;
        STRATA_ASSIGN_OR_RETURN(auto hb, store.try_get(hb_key(i)));
        int64_t beats = hb ? std::strtoll(hb->c_str(), nullptr, 10) : 0;
        if (beats != last_hb[i]) {
          last_hb[i] = beats;
          last_change[i] = now;
          continue;
        }
        auto silent = std::chrono::duration_cast<milliseconds>(now - last_change[i]);
        if (silent < spec_.agent_timeout) continue;
        bool reported = false;
        {
          std::lock_guard lk(mu_);
          reported = std::find(silent_nodes_.begin(), silent_nodes_.end(), i) != silent_nodes_.end();
        }
        if (reported) continue;  // --ft: lost, and the agent is deciding what to do about it
        std::string name;
        if (auto reg = store.try_get(node_key(i)); reg.is_ok() && reg->has_value()) {
          auto p = split_lines(**reg, 4);
          if (p.size() > 2) name = p[2];
          if (p.size() > 3) {
            // A spare host took the node over since this agent last saw it beat (another
            // agent handled the loss): watch the newcomer, whose first beat may be on its way.
            std::lock_guard lk(mu_);
            if (i < static_cast<int>(world_.nodes.size()) && p[3] != world_.nodes[i].host_id) {
              world_.nodes[i] = NodeInfo{world_.nodes[i].local_size, p[2], p[3]};
              last_change[i] = now;
              continue;
            }
          }
        }
        std::string report = "the agent of node " + std::to_string(i) + (name.empty() ? "" : " (" + name + ")") +
                             " sent no heartbeat for " + seconds_text(silent) +
                             ": its host is down or cut off from the network, or the agent was killed" + ranks_of(i);
        if (spec_.ft) {
          // The agent decides: a spare host takes the ranks, or the job ends with this report.
          {
            std::lock_guard lk(mu_);
            silent_nodes_.push_back(i);
          }
          post(JobEvent{JobEvent::Kind::NodeLost, 1, i, report});
          continue;
        }
        STRATA_ASSIGN_OR_RETURN(std::string v,
                                store.compare_set(kStateKey, "", "fail\n1\n" + std::to_string(i) + "\n" + report));
        state = v;
        std::lock_guard lk(mu_);
        silent_nodes_.push_back(i);
      }
    }
  }
  if (state) {
    JobEvent e{JobEvent::Kind::Finished, 0, -1, ""};
    if (*state != "ok") {
      auto p = split_lines(*state, 4);
      e.kind = JobEvent::Kind::Failed;
      e.exit_code = p.size() > 1 ? to_int(p[1]).value_or(1) : 1;
      e.node = p.size() > 2 ? to_int(p[2]).value_or(-1) : -1;
      e.report = p.size() > 3 ? p[3] : *state;
    }
    STRATA_RETURN_IF_ERROR(store.set(left_key(spec_.node_rank), "1"));
    {
      std::lock_guard lk(mu_);
      final_seen_ = true;
    }
    post(std::move(e));
    cv_.notify_all();
  }
  return Status::ok();
}

void NodeLink::monitor() {
  const auto interval = heartbeat_interval(spec_);
  std::vector<int64_t> last_hb(spec_.nnodes, -1);
  std::vector<Clock::time_point> last_change(spec_.nnodes, Clock::now());
  auto last_ok = Clock::now();
  Status last_error;
  auto& store = *client_;
  for (;;) {
    std::optional<std::pair<int, std::string>> failure;
    bool done = false;
    {
      std::unique_lock lk(mu_);
      if (quit_ || final_seen_) {
        // After the final state only node 0's finish() still talks to the store.
        if (quit_) return;
        cv_.wait(lk, [&] { return quit_; });
        return;
      }
      failure = failure_to_publish_;
      done = done_to_publish_;
    }
    Status s;
    if (failure) {
      std::string value =
          "fail\n" + std::to_string(failure->first) + "\n" + std::to_string(spec_.node_rank) + "\n" + failure->second;
      auto r = store.compare_set(kStateKey, "", value);
      s = r.status();
    } else if (done) {
      s = store.set(done_key(spec_.node_rank), "1");
    }
    if (s.is_ok() && (failure || done)) {
      std::lock_guard lk(mu_);
      published_ = true;
      if (failure) failure_to_publish_.reset();
      if (done) done_to_publish_ = false;
    }
    if (s.is_ok()) s = tick(last_hb, last_change);
    auto now = Clock::now();
    if (s.is_ok()) {
      last_ok = now;
    } else {
      last_error = s;
      auto silent = std::chrono::duration_cast<milliseconds>(now - last_ok);
      if (silent >= spec_.agent_timeout) {
        JobEvent e{JobEvent::Kind::LostStore, 1, 0,
                   "lost " + store_name(spec_) + " (no answer for " + seconds_text(silent) + ": " +
                       last_error.message() + "); " + (spec_.external_store ? "the store is down" : "node 0 is down") +
                       " or this host is cut off"};
        {
          std::lock_guard lk(mu_);
          final_seen_ = true;
        }
        post(std::move(e));
        cv_.notify_all();
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return quit_; });
        return;
      }
    }
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, interval,
                 [&] { return quit_ || (failure_to_publish_ && !failure) || (done_to_publish_ && !done); });
  }
}

}  // namespace strata::cli

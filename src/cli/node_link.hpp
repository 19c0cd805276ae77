#pragma once
// How the agents of a multi-node `strata run` (one per host) find each other and agree on
// the job's fate, through the rendezvous store node 0 serves.
//
// Keys, all under "launcher/":
//   job            node 0's job id and torch MASTER_PORT, set before node 0 registers
//   node/I         agent I's local rank count, name and host id (compare-and-set: a second
//                  agent claiming the same node rank is refused)
//   hb/I           agent I's heartbeat counter, bumped every heartbeat interval
//   done/I         agent I's ranks all exited with 0
//   state          absent while the job runs; "ok" or "fail\n<code>\n<node>\n<report>",
//                  written once (compare-and-set: the first failure is the one reported)
//   left/I         agent I saw the final state; node 0 keeps the store up until every
//                  agent left (or a short grace passed), so none loses it before reading it
//   spare/S        (--ft) spare host S waits to take a lost node's ranks: "N\nNAME\nHOST_ID"
//   spares         the counter that numbers spare hosts
//   taken/S        spare host S was given to a node (compare-and-set: given once)
//   assign/S       "I E": spare host S becomes node I in recovery epoch E
//
// The store traffic after rendezvous runs on a thread of its own: a request to a host that
// is cut off blocks for up to the agent timeout, and the agent's main loop must keep
// relaying output and watching its ranks meanwhile.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"
#include "common/status.hpp"

namespace strata::cli {

struct NodeSpec {
  int nnodes = 1;
  int node_rank = 0;
  int local_size = 1;
  bootstrap::StoreAddress store;
  std::string token;
  std::string node_name;  // shown in output prefixes and reports (the hostname)
  std::string host_id;    // what ranks on this node use as host identity
  std::chrono::milliseconds rdzv_timeout{60000};
  std::chrono::milliseconds agent_timeout{10000};
  std::chrono::milliseconds heartbeat{0};  // between beats and looks; 0: agent_timeout / 8
  bool ft = false;                         // --ft: a silent node is reported to the agent (NodeLost), not the job's end
  // --external-store: `strata store` serves the store outside the job, so no node is special:
  // every agent watches every other one, and node 0's loss is a node's loss like any other.
  bool external_store = false;
  // The options every node of the job must be given alike, as text ("--ft, --max-failures 3"):
  // compared in the rendezvous, so that a node started differently is named there rather than
  // found out later as a lost host or a recovery one node refuses.
  std::string job_options;
};

struct NodeInfo {
  int local_size = 0;
  std::string name, host_id;
};

/// What the rendezvous settled.
struct World {
  std::string job_id;
  int master_port = 0;
  int world_size = 0;
  int rank_base = 0;  // global rank of this node's local rank 0
  std::vector<NodeInfo> nodes;
};

/// What the monitor thread tells the agent's main loop.
struct JobEvent {
  enum class Kind { Failed, Finished, LostStore, NodeLost };
  Kind kind;
  int exit_code = 0;
  int node = -1;       // the node that reported the failure (Failed), or was lost (NodeLost)
  std::string report;  // what to print
};

class NodeLink {
 public:
  /// Returns why to give up waiting (a signal arrived), or nullopt to keep waiting.
  using Interrupted = std::function<std::optional<std::string>()>;

  /// Connects to the store (node 0 must already serve it) within the rendezvous timeout.
  static Result<std::unique_ptr<NodeLink>> connect(const NodeSpec& spec, const Interrupted& interrupted);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  /// Registers this node and waits for all the others. `master_port` is node 0's offer.
  Result<World> rendezvous(int master_port, const std::string& job_id, const Interrupted& interrupted);

  /// A spare host (`strata run --ft --spare`): registers as one and waits until the job
  /// gives it a lost node (its world then, this node's rank in spec(), and the epoch its
  /// ranks start in), or until the job ends without needing it (nullopt).
  struct Takeover {
    World world;
    uint64_t epoch = 0;
  };
  Result<std::optional<Takeover>> wait_as_spare(const Interrupted& interrupted);
  /// --ft: a spare host that waits, taken for lost node `node` (compare-and-set): its number
  /// and host id, or nullopt when none is left. A spare host whose beats this agent saw stop
  /// for the agent timeout is dead or cut off: it is marked taken and named in `skipped`.
  struct SpareHost {
    int id = -1;
    std::string name, host_id;
    int local_size = 0;
  };
  Result<std::optional<SpareHost>> claim_spare(int node, std::vector<std::string>& skipped);
  /// Hands lost node `node` to the claimed spare host in recovery epoch `epoch`, and watches
  /// the node's heartbeat afresh.
  Status assign_spare(const SpareHost& spare, int node, uint64_t epoch);
  /// Tells a claimed spare host that it cannot take the node (`why`): it exits with that
  /// error rather than as a spare the job did not need.
  Status refuse_spare(const SpareHost& spare, const std::string& why);
  /// Whether this agent handles the loss of `node` (compare-and-set: with an external store
  /// every agent sees it, and one acts). One that does not watches the node afresh.
  Result<bool> claim_loss(int node);
  /// The global ranks of `node`: first and count.
  std::pair<int, int> ranks_of_node(int node) const;
  /// --ft: the host that took this node's place, when this agent was declared lost (its
  /// beats stopped for the agent timeout: the agent was stopped, or cut off) while its ranks
  /// went on; nullopt while the node is still this host's. Its ranks belong to that host now.
  Result<std::optional<std::string>> replaced_by();

  /// Starts heartbeats and the watch on the job state. The returned fd becomes readable
  /// whenever an event may be waiting (an eventfd; read it to clear).
  Result<int> start_monitor();
  /// The next event, if any.
  std::optional<JobEvent> take_event();

  /// Publishes a failure on this node (first one wins job-wide). Non-blocking.
  void report_failure(int exit_code, const std::string& report);
  /// Publishes that this node's ranks all succeeded. Non-blocking.
  void report_done();
  /// Waits (bounded) until what was reported reached the store and, on node 0, until the
  /// other agents saw the final state; then stops the thread.
  void finish();

  const NodeSpec& spec() const { return spec_; }

 private:
  explicit NodeLink(NodeSpec spec) : spec_(std::move(spec)) {}
  void monitor();
  void post(JobEvent e);
  Status tick(std::vector<int64_t>& last_hb, std::vector<std::chrono::steady_clock::time_point>& last_change);
  /// --ft, on a watching agent: reads the beat counters of the spare hosts that wait.
  Status watch_spares();

  /// "; lost with it: ranks 2-3", the global ranks of `node` (empty before rendezvous).
  std::string ranks_of(int node) const;
  /// Connects main_client_, the agent thread's own store connection, once.
  Status ensure_main_client();
  /// The job's id and every node's registration (spec_.node_rank's rank base).
  Result<World> read_world();

  NodeSpec spec_;
  World world_;  // what rendezvous settled
  std::unique_ptr<bootstrap::StoreClient> client_;
  std::unique_ptr<bootstrap::StoreClient> main_client_;  // the agent's own requests (claim_spare)
  std::thread thread_;
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<JobEvent> events_;
  std::optional<std::pair<int, std::string>> failure_to_publish_;
  bool done_to_publish_ = false;
  bool final_seen_ = false;  // the monitor read a final state (or lost the store)
  bool quit_ = false;
  bool published_ = false;         // the last report reached the store
  std::vector<int> silent_nodes_;  // node 0: agents it declared gone (they will not leave)
  std::vector<int> revived_;       // nodes a spare host took over: watched afresh
  struct SpareBeat {
    int64_t beats = -1;
    std::chrono::steady_clock::time_point changed;
  };
  std::map<int64_t, SpareBeat> spare_beats_;  // waiting spare hosts' counters, when they last moved
};

}  // namespace strata::cli

#pragma once
// The one typed view of every STRATA_* setting (and of the launcher variables of torchrun,
// Open MPI, MPICH's Hydra and Slurm). Nothing else in the library calls getenv.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace strata {

struct Env {
  // Job placement. Filled from STRATA_* first, then torchrun, Open MPI, MPICH (Hydra), Slurm.
  std::optional<int> rank;        // STRATA_RANK | RANK | OMPI_COMM_WORLD_RANK | PMI_RANK | SLURM_PROCID
  std::optional<int> world_size;  // STRATA_WORLD_SIZE | WORLD_SIZE | OMPI_COMM_WORLD_SIZE | PMI_SIZE | SLURM_NTASKS
  // STRATA_LOCAL_RANK | LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_RANK | MPI_LOCALRANKID | SLURM_LOCALID
  std::optional<int> local_rank;
  // STRATA_LOCAL_SIZE | LOCAL_WORLD_SIZE | OMPI_COMM_WORLD_LOCAL_SIZE | MPI_LOCALNRANKS |
  // SLURM_NTASKS_PER_NODE | SLURM_STEP_TASKS_PER_NODE (one node)
  std::optional<int> local_size;
  std::string store;             // STRATA_STORE host:port | MASTER_ADDR:MASTER_PORT
  std::string job_token;         // STRATA_JOB_TOKEN: secret the store requires on connect
  std::string job_id;            // STRATA_JOB_ID | TORCHELASTIC_RUN_ID | SLURM_JOB_ID[.SLURM_STEP_ID]
  std::string launcher_job;      // Open MPI: PMIX_NAMESPACE + OMPI_MCA_orte_precondition_transports, which
                                 // tell one mpirun apart from the next (detect_job makes the job id of it)
  std::string host_id;           // STRATA_HOST_ID: overrides hostname + boot id
  std::optional<int> node_rank;  // STRATA_NODE_RANK | GROUP_RANK: this host's agent in a multi-node job
  std::optional<int> nnodes;     // STRATA_NNODES: agents (hosts) in the job
  std::string launcher;          // which variables were found: "strata", "torchrun", "mpirun", "mpiexec", "slurm", ""

  // Behaviour.
  std::chrono::milliseconds timeout{300000};               // STRATA_TIMEOUT (ms, or with s/ms/m suffix)
  std::chrono::milliseconds store_connect_timeout{60000};  // STRATA_STORE_TIMEOUT
  // STRATA_STORE_HELLO_TIMEOUT: a store connection that has not authenticated within this
  // long is closed (server), and one connect attempt waits no longer for the handshake (client).
  std::chrono::milliseconds store_hello_timeout{5000};
  // STRATA_STORE_MAX_PENDING: unauthenticated connections a store holds at once; beyond it
  // the oldest is dropped (a scanner cannot lock real clients out, see docs/SECURITY.md).
  size_t store_max_pending = 64;
  // STRATA_STORE_MAX_CONN_BYTES: bytes a store buffers per connection (largest request, and
  // replies not yet read); also bounds the bytes of the table of replayable replies.
  size_t store_max_conn_bytes = size_t{64} << 20;
  size_t store_reply_cache = 4096;  // STRATA_STORE_REPLY_CACHE: clients whose last reply the store keeps
  // STRATA_AGENT_TIMEOUT: a multi-node agent silent (no heartbeat) or a store unanswered
  // for this long counts as failed and stops the job on every node.
  std::chrono::milliseconds agent_timeout{10000};
  bool agent_timeout_set = false;  // STRATA_AGENT_TIMEOUT was given (--ft's shorter default yields)
  // STRATA_AGENT_HEARTBEAT: how often an agent (and a waiting spare host) beats into the
  // store, and how often the watching agents look; 0: an eighth of the agent timeout.
  std::chrono::milliseconds agent_heartbeat{0};
  uint32_t spin_us = 500;               // STRATA_SPIN_US: µs a wait spins before yielding/sleeping
  int oversubscribed = -1;              // STRATA_OVERSUBSCRIBED: 1/0 force the wait policy; -1 (auto): ranks > cores
  size_t oneshot_max_bytes = 8 * 1024;  // STRATA_ONESHOT_MAX_BYTES: one-shot vs two-shot all_reduce (2 ranks)
  // STRATA_TWO_SHOT_STORES: how two-shot writes the reduced slice peers read next: 0 cached,
  // 1 streamed, -1 (auto) whichever measured faster in this communicator's first calls
  // (pushing: cached in place, else streamed past 128 MiB of the host's buffers).
  int two_shot_stores = -1;
  // STRATA_PUSH: how two-shot all_reduce and all_gather move data within a host: 0 each rank
  // reads the others' (pull); 1 or -1 (auto) each rank writes its part into every rank's
  // output (push) where every output is a heap buffer, else pull.
  int push = -1;
  // STRATA_ALL_TO_ALL_CMA, STRATA_ALL_GATHER_CMA, STRATA_REDUCE_SCATTER_CMA: how an
  // out-of-place call of that kind (and its v-form) lets peers read an external input (from
  // 16 KiB, where every member can CMA): 0 staged in rounds, 1 read by CMA, -1 (auto) whichever
  // measured faster in this communicator's first calls.
  int all_to_all_cma = -1;
  int all_gather_cma = -1;
  int reduce_scatter_cma = -1;
  // STRATA_ALL_REDUCE_CMA: how an out-of-place two-shot all_reduce (from 16 KiB, where every
  // member can CMA) moves a rank's external buffers: 0 staged (the input's pieces staged in
  // heap slots for the peers, the peers' reduced pieces left in landing slots and copied
  // out), 1 by CMA (the peers read the input and write the output), -1 (auto) whichever
  // measured faster in this communicator's first calls.
  int all_reduce_cma = -1;
  std::string log_level = "warn";  // STRATA_LOG: error|warn|info|debug
  std::string kernels;             // STRATA_KERNELS: scalar|avx2|avx512 (empty/auto: best the CPU has)
  // STRATA_FLIGHT_RECORDER: operations each communicator remembers for hang reports
  // (rounded up to a power of two; 0 turns the recorder, its dumps and the SIGUSR1 handler off).
  size_t flight_recorder = 64;

  // Heap.
  size_t heap_segment_size = size_t{1} << 30;    // STRATA_HEAP_SEGMENT_SIZE: bytes per memfd segment (virtual)
  size_t heap_max_size = size_t{64} << 30;       // STRATA_HEAP_MAX_SIZE: total heap limit per rank
  size_t heap_symmetric_size = size_t{1} << 30;  // STRATA_HEAP_SYMMETRIC_SIZE: symmetric arena per rank
  bool heap_huge_pages = false;                  // STRATA_HEAP_HUGE_PAGES: MFD_HUGETLB segments
  bool heap_prefault = false;                    // STRATA_HEAP_PREFAULT: touch pages when a segment is made
  std::string socket_dir;  // STRATA_SOCKET_DIR: private directory of the heap sockets (empty: /tmp/strata-<uid>)
  bool cma = true;         // STRATA_CMA=0 disables process_vm_readv/writev
  size_t cma_min_bytes = size_t{1} << 20;  // STRATA_CMA_MIN_BYTES: unregistered buffers this big use CMA too
  // STRATA_CMA_REGISTERED_MIN_BYTES: registered buffers this big use CMA; smaller ones are
  // staged, as one process_vm_readv/writev costs several µs (system call, peer lookup, page
  // pinning) where copying a small buffer through the heap costs well under one.
  size_t cma_registered_min_bytes = size_t{256} << 10;

  // Failure recovery (set by `strata run --ft`; see docs/RECOVERY.md).
  bool ft = false;     // STRATA_FT: the job runs under a recovery controller
  uint64_t epoch = 0;  // STRATA_EPOCH: >0 for a replacement started in that epoch
  // STRATA_SPARE: this process is hot spare N of `strata run --ft --spares K`; it has no rank
  // until the launcher assigns one (strata::init() waits for it).
  std::optional<int> spare;
  std::chrono::milliseconds heartbeat_interval{100};  // STRATA_HEARTBEAT_INTERVAL: how often a rank beats
  std::chrono::milliseconds heartbeat_timeout{1000};  // STRATA_HEARTBEAT_TIMEOUT: silence that counts as a hang
  // STRATA_START_TIMEOUT: how long a replacement started afresh may take from its spawn to its
  // first heartbeat (its strata::init()) before it is taken for stuck and replaced; unset:
  // half of STRATA_TIMEOUT, so that the survivors, who wait for it that long, never time out
  // first (see start_timeout_or_default()).
  std::optional<std::chrono::milliseconds> start_timeout;
  std::chrono::milliseconds start_timeout_or_default() const { return start_timeout ? *start_timeout : timeout / 2; }

  // Between hosts (UCX). Empty strings leave UCX's own UCX_* settings in force.
  std::string ucx_tls;                // STRATA_UCX_TLS: transports, e.g. "tcp,self" (sets UCX TLS)
  std::string ucx_net_devices;        // STRATA_UCX_NET_DEVICES: e.g. "eth0" (sets UCX NET_DEVICES)
  std::string ucx_datapath = "auto";  // STRATA_UCX_DATAPATH: auto|tag|put (auto: put only on native RMA)
  // STRATA_UCX_RNDV_THRESH: messages from this size use UCX's rendezvous on the tag data path
  // (sets UCX RNDV_THRESH; empty when UCX_RNDV_THRESH is set and this is not). Over TCP the
  // rendezvous handshake costs a round trip of wake-ups, more than the copy it saves below
  // about 1 MiB (2 namespace hosts x 1 rank: all_reduce of 1 MiB 0.78 against 1.23 ms with
  // 256k, 4 MiB 3.4 against 4.3 ms; all_to_all of 16 MiB 6.3 ms against 7.8-8.1 ms when
  // every message goes eagerly).
  std::string ucx_rndv_thresh = "1m";
  // Bulk transfers (data whose size both sides agreed beforehand) are cut into pieces of
  // STRATA_UCX_STRIPE_PIECE bytes spread over STRATA_UCX_LANES connections to the peer when
  // at least STRATA_UCX_STRIPE_MIN bytes (0: never). Over TCP a message that outgrows what
  // one connection holds in flight drops to that connection's streaming rate (2 namespace
  // hosts x 1 rank, broadcast: 256 KiB 73 us, 1 MiB 750 us alone; 1 MiB 258 us over 4 lanes).
  static constexpr int kMaxUcxLanes = 4;  // the tag has two bits for the lane
  int ucx_lanes = 4;
  size_t ucx_stripe_min = size_t{512} << 10;
  size_t ucx_stripe_piece = size_t{256} << 10;

  /// Every variable whose value did not parse or lies out of range ("STRATA_TIMEOUT=soon: ...");
  /// such a setting keeps its default here, and check() refuses it.
  std::vector<std::string> invalid;
  /// InvalidArgument naming every entry of `invalid`; ok when there is none. Checked where a
  /// rank or the launcher starts, so a typo ends the job at once instead of changing it.
  [[nodiscard]] Status check() const;

  /// Reads the process environment.
  static Env from_process();
  /// Reads from a lookup function (tests use this to avoid touching the real environment).
  template <class F>
  static Env from_lookup(F&& lookup);
  /// The process-wide Env, read once on first use.
  static const Env& get();
};

namespace env_detail {
using Lookup = std::optional<std::string> (*)(const char*, void*);
/// Builds an Env from `lookup`; sizes and durations are read by common/parse.hpp.
Env parse(Lookup lookup, void* ctx);
}  // namespace env_detail

template <class F>
Env Env::from_lookup(F&& lookup) {
  return env_detail::parse(
      [](const char* k, void* c) -> std::optional<std::string> { return (*static_cast<F*>(c))(k); }, &lookup);
}

}  // namespace strata

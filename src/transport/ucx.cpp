// The UCX transport: one UCP context and worker per rank, endpoints made on first use from
// worker addresses found in the store, heap segments mapped for RMA as they are created.
//
// Threads: a rank's communicators (and their copy engines) share the worker, so every UCP
// call is made under one mutex (worker in SERIALIZED mode). Completion callbacks run inside
// ucp_worker_progress, i.e. under that mutex too. The callers drive the worker while they
// wait; between calls a thread of its own does (idle_loop), since a peer may need this
// rank's answer meanwhile: a connection it opens waits for this side's reply, and a rank
// that returned early (a broadcast's root) may not call again for a long time.

#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "bootstrap/store.hpp"
#include "common/log.hpp"
#include "memory/heap.hpp"
#include "transport/net.hpp"
#include "transport/ucx_wire.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_UCX_RELAX() _mm_pause()
#else
#define STRATA_UCX_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace strata::transport {
namespace {

Status from_ucs(ucs_status_t st, int peer, const char* what) {
  const std::string m = std::string(what) + ": " + ucs_status_string(st);
  switch (st) {
    case UCS_OK: return Status::ok();
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
      return ::strata::peer_failed(m + " (world rank " + std::to_string(peer) + " died or its link broke)", peer);
    case UCS_ERR_MESSAGE_TRUNCATED:
      return Status(Code::InvalidArgument, m + " (world rank " + std::to_string(peer) + " sent more than was expected)",
                    peer);
    case UCS_ERR_CANCELED: return aborted(m);
    default: return internal_error(m + " (peer: world rank " + std::to_string(peer) + ")");
  }
}

/// RDMA hardware present: puts are native there (auto data path).
bool have_rdma_devices() {
  DIR* d = opendir("/sys/class/infiniband");
  if (!d) return false;
  bool any = false;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') any = true;
  closedir(d);
  return any;
}

class Ucx;

struct PeerState {
  Ucx* net = nullptr;
  int rank = -1;
  // ep[0] carries every message; the others (lanes) are made on the first striped transfer.
  ucp_ep_h ep[kMaxLanes] = {};
  std::string addr;  // its worker address, once read from the store
  std::atomic<bool> failed{false};
  ucs_status_t error = UCS_OK;
  uint64_t gen = 0;  // the recovery epoch the peer's process started in (0: with the job)
};

/// A bulk transfer cut into pieces (send_bulk/recv_bulk): piece i travels over lane
/// i % lanes, i.e. its own endpoint and connection to the peer, with the lane number in the
/// tag's transport bits. Pieces on one lane share a tag and are matched in order (UCX keeps
/// the order of messages from one endpoint). Done when every piece is; its status is the
/// first failed piece's.
struct StripedTransfer : Transfer {
  static constexpr int kStage = -1;  // marks a striped transfer (Transfer::stage)
  std::vector<TransferPtr> pieces;
  size_t open = 0;
  /// Called as a piece finishes, under the worker's mutex.
  void piece_done(const Transfer& h) {
    if (!h.status.is_ok() && status.is_ok()) status = h.status;
    received += h.received;
    if (--open) return;
    TransferPtr keep = std::move(self);  // the last reference may be this one
    done.store(true, std::memory_order_release);
  }
};

/// The most pieces one transfer is cut into: past a few MiB the connections run at their
/// steady rate, and more, smaller pieces only add work per message (2 hosts x 1 rank, 64 MiB:
/// 256 pieces of 256 KiB ran at 0.89-0.95x of one lane, 16 larger ones at 0.89-1.15x).
constexpr size_t kMaxPieces = 16;

struct RemoteSeg {
  ucp_rkey_h rkey = nullptr;
  uint64_t base = 0;
};

class Ucx final : public Net {
 public:
  Ucx(std::string job, int rank, int n, std::shared_ptr<bootstrap::StoreClient> store, memory::Heap& heap,
      std::chrono::milliseconds timeout)
      : job_(std::move(job)), rank_(rank), store_(std::move(store)), heap_(heap), timeout_(timeout), peers_(n) {
    for (int r = 0; r < n; ++r) {
      peers_[r] = std::make_unique<PeerState>();
      peers_[r]->net = this;
      peers_[r]->rank = r;
    }
  }
  ~Ucx() override;

  Status start(const Env& env);

  std::string describe() const override { return put_ ? "put" : "tag"; }
  bool use_put() const override { return put_; }
  Result<TransferPtr> send(int peer, uint64_t tag, const void* buf, size_t bytes) override;
  Result<TransferPtr> send2(int peer, uint64_t tag, const void* head, size_t head_bytes, const void* body,
                            size_t body_bytes) override;
  Result<TransferPtr> recv(int peer, uint64_t tag, void* buf, size_t bytes) override {
    return post_recv(peer, tag, buf, bytes, true);
  }
  Result<TransferPtr> recv_parts(int peer, uint64_t tag, std::span<const Part> parts) override;
  Result<TransferPtr> send_bulk(int peer, uint64_t tag, const void* buf, size_t bytes) override {
    if (!stripes(bytes)) return send(peer, tag, buf, bytes);
    return striped(peer, tag, const_cast<void*>(buf), bytes, false);
  }
  Result<TransferPtr> recv_bulk(int peer, uint64_t tag, void* buf, size_t bytes) override {
    if (!stripes(bytes)) return recv(peer, tag, buf, bytes);
    return striped(peer, tag, buf, bytes, true);
  }
  Result<TransferPtr> put(int peer, uint64_t tag, const void* buf, size_t bytes, RemoteRef dst) override;
  Status wait(const std::vector<TransferPtr>& xs, const WaitPolicy& policy, const char* what) override;
  void cancel(const std::vector<TransferPtr>& xs) override;
  bool test(const Transfer& x) override;
  void progress() override;
  bool probe(int peer, uint64_t tag) override;
  bool peer_failed(int peer) const override { return peers_[peer]->failed.load(std::memory_order_acquire); }
  void reset_peer(int peer, uint64_t gen) override;
  int connections(int peer) const override {
    std::lock_guard<std::mutex> g(mu_);
    int n = 0;
    for (ucp_ep_h e : peers_[peer]->ep) n += e != nullptr;
    return n;
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* p = static_cast<PeerState*>(arg);
    p->error = st;
    p->failed.store(true, std::memory_order_release);
    STRATA_LOG(Info, "ucx: endpoint to rank " << p->rank << " failed: " << ucs_status_string(st));
  }

 private:
  // A replacement publishes under the epoch it started in: the predecessor's address and
  // keys stay in the store, and a survivor must never take them for the new process's.
  std::string key(const std::string& what, int r, uint64_t gen) const {
    std::string k = "strata/" + job_ + "/ucx/" + what + "/" + std::to_string(r);
    return gen ? k + "@" + std::to_string(gen) : k;
  }
  Result<ucp_ep_h> endpoint(int peer, int lane = 0);  // under mu_
  // Force-closes every endpoint of `p` (under mu_), collecting the close requests that are still
  // in flight; await_closes drives them for at most `grace`, then frees them.
  void force_close(PeerState& p, std::vector<void*>& closing);
  void await_closes(const std::vector<void*>& closing, std::chrono::milliseconds grace);
  Result<RemoteSeg> remote_seg(int peer, uint32_t seg);  // under mu_
  void map_segment(uint32_t id, void* base, size_t size);
  void progress_locked() {
    // Under mu_: a plain increment, read by idle_loop to tell whether a caller drives the worker.
    progress_calls_.store(progress_calls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    while (ucp_worker_progress(worker_) != 0) {
    }
  }
  /// Drives the worker whenever no caller has since its last look (every 10 ms, or 100 ms
  /// after a look found a caller driving it).
  void idle_loop();
  void stop_idle();
  Result<TransferPtr> post_recv(int peer, uint64_t tag, void* buf, size_t bytes, bool exact);
  void post_recv_locked(const TransferPtr& x, uint64_t tag, void* buf, size_t bytes);  // x: filled in
  bool stripes(size_t bytes) const { return lanes_ > 1 && stripe_min_ && bytes >= stripe_min_; }
  Result<TransferPtr> striped(int peer, uint64_t tag, void* buf, size_t bytes, bool is_recv);
  Status post_tag_send(ucp_ep_h ep, uint64_t tag, const void* buf, size_t bytes, const TransferPtr& x,
                       bool iov = false);
  static void on_send(void* req, ucs_status_t st, void* user);
  static void on_recv(void* req, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user);
  static void on_flush(void* req, ucs_status_t st, void* user);
  static void finish(Transfer* x, ucs_status_t st, size_t len);
  /// After posting `x` (with x->self set): UCX may complete an operation inside the posting
  /// call, through the callback (which drops x->self and frees the request), or return a
  /// status without a callback; only a request still in flight is remembered for cancel.
  static void track(const TransferPtr& x, ucs_status_ptr_t r) {
    if (x->done.load(std::memory_order_acquire)) return;
    if (UCS_PTR_IS_PTR(r)) {
      x->handle = r;
      return;
    }
    x->self.reset();
    finish(x.get(), UCS_PTR_STATUS(r), 0);
  }

  std::string job_;
  int rank_;
  uint64_t gen_ = 0;  // STRATA_EPOCH: > 0 in a replacement
  std::shared_ptr<bootstrap::StoreClient> store_;
  memory::Heap& heap_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<PeerState>> peers_;
  mutable std::mutex mu_;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::thread idle_;
  int idle_stop_ = -1;  // eventfd: ends idle_loop
  std::atomic<uint64_t> progress_calls_{0};
  bool put_ = false;
  int lanes_ = 1;          // connections per peer for bulk transfers
  size_t stripe_min_ = 0;  // bulk transfers from this size are striped
  size_t piece_ = 0;       // bytes per piece
  // What a peer must match, published with the worker address: the data path and how bulk
  // transfers are cut (set in start()).
  std::string settings_;
  // Lanes beyond the first cost a connection (a file descriptor) each: at most a quarter of
  // the process's descriptor limit goes to them (all_to_all between many hosts meets every
  // peer).
  size_t extra_eps_ = 0;
  size_t max_extra_eps_ = 0;
  std::map<uint32_t, ucp_mem_h> memh_;  // own segments
  std::map<std::pair<int, uint32_t>, RemoteSeg> rsegs_;
  // Put transfers waiting for their flush: the notification is sent from the flush callback.
  struct PutNotify {
    ucp_ep_h ep;
    uint64_t tag;
    TransferPtr x;
    Ucx* net;
  };
};

/// Puts are the data path only where RDMA hardware is present (UCX emulates RMA over TCP:
/// MEASURED.md, puts ~5x slower than tag messages there), unless forced.
bool puts_are_datapath(const Env& env) {
  return env.ucx_datapath == "put" ||
         (env.ucx_datapath == "auto" && have_rdma_devices() && env.ucx_tls.find("tcp") == std::string::npos);
}

Status Ucx::start(const Env& env) {
  const std::string& tls = env.ucx_tls;
  const std::string& devices = env.ucx_net_devices;
  put_ = puts_are_datapath(env);
  lanes_ = std::clamp(env.ucx_lanes, 1, kMaxLanes);
  stripe_min_ = env.ucx_stripe_min;
  piece_ = std::max<size_t>(env.ucx_stripe_piece, 4096);
  settings_ = std::string("data path ") + (put_ ? "put" : "tag") + ", " + std::to_string(lanes_) +
              " lane(s), pieces of " + std::to_string(piece_) + " bytes from " + std::to_string(stripe_min_) + " bytes";
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0)
    max_extra_eps_ = nofile.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(nofile.rlim_cur) / 4;
  gen_ = env.epoch;
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return unavailable(std::string("ucx: reading UCX configuration: ") + ucs_status_string(st));
  if (!tls.empty() && (st = ucp_config_modify(cfg, "TLS", tls.c_str())) != UCS_OK) {
    ucp_config_release(cfg);
    return invalid_argument("STRATA_UCX_TLS='" + tls + "' is not accepted by UCX: " + ucs_status_string(st));
  }
  if (!devices.empty() && (st = ucp_config_modify(cfg, "NET_DEVICES", devices.c_str())) != UCS_OK) {
    ucp_config_release(cfg);
    return invalid_argument("STRATA_UCX_NET_DEVICES='" + devices +
                            "' is not accepted by UCX: " + ucs_status_string(st));
  }
  if (!put_ && !env.ucx_rndv_thresh.empty() &&
      (st = ucp_config_modify(cfg, "RNDV_THRESH", env.ucx_rndv_thresh.c_str())) != UCS_OK) {
    ucp_config_release(cfg);
    return invalid_argument("STRATA_UCX_RNDV_THRESH='" + env.ucx_rndv_thresh +
                            "' is not accepted by UCX: " + ucs_status_string(st));
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&p, cfg, &ctx_);
  ucp_config_release(cfg);
  if (st != UCS_OK) return unavailable(std::string("ucx: ucp_init failed: ") + ucs_status_string(st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if ((st = ucp_worker_create(ctx_, &wp, &worker_)) != UCS_OK)
    return unavailable(std::string("ucx: ucp_worker_create failed: ") + ucs_status_string(st));
  if ((st = ucp_worker_get_efd(worker_, &efd_)) != UCS_OK)
    return unavailable(std::string("ucx: no wakeup fd: ") + ucs_status_string(st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if ((st = ucp_worker_get_address(worker_, &addr, &len)) != UCS_OK)
    return unavailable(std::string("ucx: ucp_worker_get_address failed: ") + ucs_status_string(st));
  std::string a = to_hex(addr, len);
  ucp_worker_release_address(worker_, addr);
  STRATA_RETURN_IF_ERROR(store_->set(key("addr", rank_, gen_), a + " " + settings_));
  heap_.set_segment_listener([this](uint32_t id, void* base, size_t size) { map_segment(id, base, size); });
  idle_stop_ = ::eventfd(0, EFD_CLOEXEC);
  if (idle_stop_ < 0) return unavailable(std::string("ucx: eventfd: ") + std::strerror(errno));
  idle_ = std::thread([this] { idle_loop(); });
  return Status::ok();
}

void Ucx::idle_loop() {
  // It only looks, on a timer: waiting on the worker's event fd instead added a waiter to
  // every socket's readiness and slowed the callers' transfers measurably, and even a look
  // every 10 ms while callers were busy cost small operations on a crowded host (4 ranks on
  // 2 cores). So it looks rarely while the callers drive the worker, often once they stopped.
  constexpr int kIdleLookMs = 10, kBusyLookMs = 100;
  uint64_t seen = progress_calls_.load(std::memory_order_relaxed);
  int look_ms = kIdleLookMs;
  for (;;) {
    pollfd stop{idle_stop_, POLLIN, 0};
    if (::poll(&stop, 1, look_ms) > 0) return;
    const uint64_t now = progress_calls_.load(std::memory_order_relaxed);
    if (now != seen) {  // a caller drives the worker
      seen = now;
      look_ms = kBusyLookMs;
      continue;
    }
    look_ms = kIdleLookMs;
    std::unique_lock<std::mutex> g(mu_, std::try_to_lock);
    if (!g.owns_lock()) continue;
    progress_locked();
    seen = progress_calls_.load(std::memory_order_relaxed);
  }
}

void Ucx::stop_idle() {
  if (idle_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(idle_stop_, &one, sizeof one);
    idle_.join();
  }
  if (idle_stop_ >= 0) ::close(idle_stop_);
  idle_stop_ = -1;
}

void Ucx::map_segment(uint32_t id, void* base, size_t size) {
  std::lock_guard<std::mutex> g(mu_);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = size;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(ctx_, &mp, &memh);
  if (st != UCS_OK) {
    STRATA_LOG(Warn, "ucx: rank " << rank_ << " cannot map heap segment " << id << " for RMA: " << ucs_status_string(st)
                                  << " (its data moves by tag messages)");
    return;
  }
  void* rk = nullptr;
  size_t rklen = 0;
  if ((st = ucp_rkey_pack(ctx_, memh, &rk, &rklen)) != UCS_OK) {
    ucp_mem_unmap(ctx_, memh);
    STRATA_LOG(Warn,
               "ucx: rank " << rank_ << " cannot pack the rkey of segment " << id << ": " << ucs_status_string(st));
    return;
  }
  memh_[id] = memh;
  uint64_t b = reinterpret_cast<uint64_t>(base);
  // Published once; every peer fetches it the first time it puts into this segment.
  Status s = store_->set(key("rkey", rank_, gen_) + "/" + std::to_string(id), encode_rkey_record(b, rk, rklen));
  ucp_rkey_buffer_release(rk);
  if (!s.is_ok()) STRATA_LOG(Warn, "ucx: publishing the rkey of segment " << id << ": " << s.to_string());
}

Ucx::~Ucx() {
  stop_idle();
  heap_.set_segment_listener(nullptr);
  if (!worker_) {
    if (ctx_) ucp_cleanup(ctx_);
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [k, rs] : rsegs_) ucp_rkey_destroy(rs.rkey);
  std::vector<void*> closing;
  for (auto& p : peers_) force_close(*p, closing);
  await_closes(closing, std::chrono::seconds(1));
  for (auto& [id, m] : memh_) ucp_mem_unmap(ctx_, m);
  ucp_worker_destroy(worker_);
  ucp_cleanup(ctx_);
}

Result<ucp_ep_h> Ucx::endpoint(int peer, int lane) {
  PeerState& p = *peers_[peer];
  if (p.failed.load(std::memory_order_acquire))
    return ::strata::peer_failed(
        "world rank " + std::to_string(peer) + " is unreachable: " + ucs_status_string(p.error), peer);
  // Each UCP endpoint has its own connection (over TCP, its own stream).
  ucp_ep_h& slot = p.ep[lane];
  if (slot) return slot;
  if (p.addr.empty()) {
    // The address was published at the peer's init; it is in the store by the time any
    // operation with that peer runs, so this waits only if the peer is still starting.
    auto a = store_->get(key("addr", peer, p.gen), timeout_);
    if (!a.is_ok()) return a.status().with_context("ucx: worker address of rank " + std::to_string(peer) + ": ");
    const std::string& rec = a.value();
    const size_t cut = rec.find(' ');
    // Both sides of a transfer must cut and send it alike: settings that differ would leave
    // pieces no receive matches, so they are refused at the first connection.
    const std::string theirs = cut == std::string::npos ? std::string() : rec.substr(cut + 1);
    if (theirs != settings_)
      return Status(Code::InvalidArgument,
                    "ucx: world rank " + std::to_string(peer) + " runs with " +
                        (theirs.empty() ? std::string("no settings published") : theirs) + ", world rank " +
                        std::to_string(rank_) + " with " + settings_ +
                        ": every rank of a job must use the same STRATA_UCX_DATAPATH, STRATA_UCX_LANES, "
                        "STRATA_UCX_STRIPE_MIN and STRATA_UCX_STRIPE_PIECE",
                    peer);
    STRATA_ASSIGN_OR_RETURN(p.addr, decode_worker_address(std::string_view(rec).substr(0, cut), peer));
  }
  const std::string& addr = p.addr;
  ucp_ep_params_t ep{};
  ep.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Ucx::on_ep_error;
  ep.err_handler.arg = &p;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &slot);
  if (st != UCS_OK) {
    slot = nullptr;
    return from_ucs(st, peer, "ucx: connecting to rank");
  }
  if (lane) ++extra_eps_;
  return slot;
}

void Ucx::force_close(PeerState& p, std::vector<void*>& closing) {
  for (ucp_ep_h& e : p.ep) {
    if (!e) continue;
    if (&e != &p.ep[0]) --extra_eps_;
    // Forced: a polite flush could wait for a peer that is already gone. Requests still
    // queued on it complete with an error, which their (already discarded) owners ignore.
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e, &cp);
    if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
    e = nullptr;
  }
}

void Ucx::await_closes(const std::vector<void*>& closing, std::chrono::milliseconds grace) {
  const auto until = std::chrono::steady_clock::now() + grace;
  for (void* r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < until)
      ucp_worker_progress(worker_);
    ucp_request_free(r);
  }
}

void Ucx::reset_peer(int peer, uint64_t gen) {
  std::lock_guard<std::mutex> g(mu_);
  PeerState& p = *peers_[peer];
  for (auto it = rsegs_.begin(); it != rsegs_.end();) {
    if (it->first.first != peer) {
      ++it;
      continue;
    }
    ucp_rkey_destroy(it->second.rkey);
    it = rsegs_.erase(it);
  }
  std::vector<void*> closing;
  force_close(p, closing);
  await_closes(closing, std::chrono::milliseconds(200));
  p.gen = gen;
  p.addr.clear();
  p.error = UCS_OK;
  p.failed.store(false, std::memory_order_release);
}

Result<RemoteSeg> Ucx::remote_seg(int peer, uint32_t seg) {
  auto it = rsegs_.find({peer, seg});
  if (it != rsegs_.end()) return it->second;
  STRATA_ASSIGN_OR_RETURN(ucp_ep_h ep, endpoint(peer));
  auto v = store_->get(key("rkey", peer, peers_[peer]->gen) + "/" + std::to_string(seg), timeout_);
  if (!v.is_ok())
    return v.status().with_context("ucx: rkey of segment " + std::to_string(seg) + " of rank " + std::to_string(peer) +
                                   ": ");
  // Checked before UCX reads it: ucp_ep_rkey_unpack takes no length.
  STRATA_ASSIGN_OR_RETURN(RkeyRecord rec, decode_rkey_record(v.value(), peer, seg));
  RemoteSeg rs;
  rs.base = rec.base;
  ucs_status_t st = ucp_ep_rkey_unpack(ep, rec.packed.data(), &rs.rkey);
  if (st != UCS_OK) return from_ucs(st, peer, "ucx: unpacking an rkey");
  rsegs_[{peer, seg}] = rs;
  return rs;
}

void Ucx::finish(Transfer* x, ucs_status_t st, size_t len) {
  x->status = from_ucs(st, x->peer, x->is_recv ? "ucx receive" : "ucx send");
  x->received = len;
  if (x->is_recv && x->exact && st == UCS_OK && len != x->bytes)
    x->status = Status(Code::InvalidArgument,
                       "world rank " + std::to_string(x->peer) + " sent " + std::to_string(len) + " bytes where " +
                           std::to_string(x->bytes) + " were expected",
                       x->peer);
  x->handle = nullptr;
  x->done.store(true, std::memory_order_release);
  if (x->whole) static_cast<StripedTransfer*>(x->whole)->piece_done(*x);
}

void Ucx::on_send(void* req, ucs_status_t st, void* user) {
  auto* x = static_cast<Transfer*>(user);
  TransferPtr keep = std::move(x->self);  // released at the end of this scope
  finish(x, st, 0);
  ucp_request_free(req);
}

void Ucx::on_recv(void* req, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user) {
  auto* x = static_cast<Transfer*>(user);
  TransferPtr keep = std::move(x->self);
  finish(x, st, st == UCS_OK ? info->length : 0);
  ucp_request_free(req);
}

Status Ucx::post_tag_send(ucp_ep_h ep, uint64_t tag, const void* buf, size_t bytes, const TransferPtr& x, bool iov) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (iov) {  // buf: an array of `bytes` ucp_dt_iov_t entries
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    rp.datatype = ucp_dt_make_iov();
  }
  rp.cb.send = &Ucx::on_send;
  rp.user_data = x.get();
  x->self = x;
  track(x, ucp_tag_send_nbx(ep, buf, bytes, tag, &rp));
  return Status::ok();
}

Result<TransferPtr> Ucx::send(int peer, uint64_t tag, const void* buf, size_t bytes) {
  auto x = std::make_shared<Transfer>();
  x->peer = peer;
  x->bytes = bytes;
  std::lock_guard<std::mutex> g(mu_);
  STRATA_ASSIGN_OR_RETURN(ucp_ep_h ep, endpoint(peer));
  STRATA_RETURN_IF_ERROR(post_tag_send(ep, tag, buf, bytes, x));
  return x;
}

/// A send or receive in parts: UCX reads the parts list until it completes, so it lives here.
struct IovTransfer : Transfer {
  ucp_dt_iov_t parts[3];
};

Result<TransferPtr> Ucx::send2(int peer, uint64_t tag, const void* head, size_t head_bytes, const void* body,
                               size_t body_bytes) {
  auto x = std::make_shared<IovTransfer>();
  x->peer = peer;
  x->bytes = head_bytes + body_bytes;
  x->parts[0] = {const_cast<void*>(head), head_bytes};
  x->parts[1] = {const_cast<void*>(body), body_bytes};
  std::lock_guard<std::mutex> g(mu_);
  STRATA_ASSIGN_OR_RETURN(ucp_ep_h ep, endpoint(peer));
  TransferPtr t = x;
  STRATA_RETURN_IF_ERROR(post_tag_send(ep, tag, x->parts, body_bytes ? 2 : 1, t, true));
  return t;
}

Result<TransferPtr> Ucx::recv_parts(int peer, uint64_t tag, std::span<const Part> parts) {
  auto x = std::make_shared<IovTransfer>();
  size_t n = 0;
  for (const Part& p : parts) {
    if (!p.bytes) continue;
    if (n == std::size(x->parts)) return internal_error("ucx: a receive in more than 3 parts");
    x->parts[n++] = {p.p, p.bytes};
    x->bytes += p.bytes;
  }
  if (n == 0) return post_recv(peer, tag, nullptr, 0, false);
  x->peer = peer;
  x->is_recv = true;
  x->exact = false;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL |
                    UCP_OP_ATTR_FIELD_DATATYPE;
  rp.datatype = ucp_dt_make_iov();
  rp.cb.recv = &Ucx::on_recv;
  rp.user_data = x.get();
  std::lock_guard<std::mutex> g(mu_);
  TransferPtr t = x;
  x->self = t;
  track(t, ucp_tag_recv_nbx(worker_, x->parts, n, tag, ~uint64_t{0}, &rp));
  return t;
}

Result<TransferPtr> Ucx::post_recv(int peer, uint64_t tag, void* buf, size_t bytes, bool exact) {
  auto x = std::make_shared<Transfer>();
  x->peer = peer;
  x->bytes = bytes;
  x->is_recv = true;
  x->exact = exact;
  std::lock_guard<std::mutex> g(mu_);
  post_recv_locked(x, tag, buf, bytes);
  return x;
}

void Ucx::post_recv_locked(const TransferPtr& x, uint64_t tag, void* buf, size_t bytes) {
  ucp_request_param_t rp{};
  // Completion always through the callback: UCX 1.13 does not report the received length
  // of a receive that completes immediately.
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  rp.cb.recv = &Ucx::on_recv;
  rp.user_data = x.get();
  x->self = x;
  track(x, ucp_tag_recv_nbx(worker_, buf, bytes, tag, ~uint64_t{0}, &rp));
}

Result<TransferPtr> Ucx::striped(int peer, uint64_t tag, void* buf, size_t bytes, bool is_recv) {
  auto w = std::make_shared<StripedTransfer>();
  w->peer = peer;
  w->bytes = bytes;
  w->is_recv = is_recv;
  w->stage = StripedTransfer::kStage;
  // Both sides cut alike, from `bytes` and their settings (the same in every rank of a job).
  const size_t piece = std::max(piece_, ((bytes + kMaxPieces - 1) / kMaxPieces + 4095) & ~size_t{4095});
  const size_t n = (bytes + piece - 1) / piece;
  const int lanes = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(lanes_)));
  std::lock_guard<std::mutex> g(mu_);
  ucp_ep_h ep[kMaxLanes] = {};
  if (!is_recv) {
    // Each lane's pieces share a tag and go over one endpoint, which keeps them in order; a
    // lane past the file-descriptor budget rides on the first endpoint instead (the receiver
    // cannot tell).
    PeerState& ps = *peers_[peer];
    for (int l = 0; l < lanes; ++l) {
      if (l && !ps.ep[l] && extra_eps_ >= max_extra_eps_) {
        ep[l] = ep[0];
        continue;
      }
      STRATA_ASSIGN_OR_RETURN(ep[l], endpoint(peer, l));
    }
  }
  w->open = n;
  w->self = w;  // until every piece has finished
  w->pieces.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const TransferPtr& h = w->pieces.emplace_back(std::make_shared<Transfer>());
    h->peer = peer;
    h->is_recv = is_recv;
    h->bytes = std::min(piece, bytes - i * piece);
    h->whole = w.get();
    char* p = static_cast<char*>(buf) + i * piece;
    const auto lane = static_cast<int>(i % static_cast<size_t>(lanes));
    const uint64_t t = tag | static_cast<uint64_t>(lane) << kLaneShift;
    if (is_recv) {
      post_recv_locked(h, t, p, h->bytes);
    } else {
      STRATA_RETURN_IF_ERROR(post_tag_send(ep[lane], t, p, h->bytes, h));
    }
  }
  return TransferPtr(w);
}

void Ucx::on_flush(void* req, ucs_status_t st, void* user) {
  auto* n = static_cast<PutNotify*>(user);
  std::unique_ptr<PutNotify> own(n);
  ucp_request_free(req);
  Transfer* x = n->x.get();
  x->stage = 2;
  x->handle = nullptr;
  TransferPtr keep = std::move(x->self);
  if (st != UCS_OK) {
    finish(x, st, 0);
    return;
  }
  // The data is in the peer's memory: tell it (we are inside progress, under mu_).
  (void)n->net->post_tag_send(n->ep, n->tag, nullptr, 0, n->x);
}

Result<TransferPtr> Ucx::put(int peer, uint64_t tag, const void* buf, size_t bytes, RemoteRef dst) {
  auto x = std::make_shared<Transfer>();
  x->peer = peer;
  x->bytes = bytes;
  std::lock_guard<std::mutex> g(mu_);
  STRATA_ASSIGN_OR_RETURN(ucp_ep_h ep, endpoint(peer));
  if (bytes) {
    STRATA_ASSIGN_OR_RETURN(RemoteSeg rs, remote_seg(peer, dst.seg));
    ucp_request_param_t rp{};
    ucs_status_ptr_t r = ucp_put_nbx(ep, buf, bytes, rs.base + dst.offset, rs.rkey, &rp);
    if (UCS_PTR_IS_ERR(r)) return from_ucs(UCS_PTR_STATUS(r), peer, "ucx put");
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // the flush below covers its completion
    auto* n = new PutNotify{ep, tag, x, this};
    ucp_request_param_t fp{};
    fp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    fp.cb.send = &Ucx::on_flush;
    fp.user_data = n;
    x->self = x;
    x->stage = 1;  // flushing; on_flush moves it on (possibly inside ucp_ep_flush_nbx)
    ucs_status_ptr_t f = ucp_ep_flush_nbx(ep, &fp);
    if (x->stage != 1) return x;
    if (UCS_PTR_IS_PTR(f)) {
      x->handle = f;
      return x;
    }
    x->self.reset();
    delete n;
    if (UCS_PTR_STATUS(f) != UCS_OK) return from_ucs(UCS_PTR_STATUS(f), peer, "ucx flush");
  }
  STRATA_RETURN_IF_ERROR(post_tag_send(ep, tag, nullptr, 0, x));
  return x;
}

bool Ucx::test(const Transfer& x) {
  if (x.done.load(std::memory_order_acquire)) return true;
  {
    std::lock_guard<std::mutex> g(mu_);
    progress_locked();
  }
  return x.done.load(std::memory_order_acquire);
}

void Ucx::progress() {
  std::unique_lock<std::mutex> g(mu_, std::try_to_lock);
  if (g.owns_lock()) progress_locked();
}

bool Ucx::probe(int peer, uint64_t tag) {
  // The tag names its sender (make_tag's source bits), so matching it exactly is enough;
  // the message stays in UCX's unexpected queue (remove = 0) for the receive that follows.
  (void)peer;
  std::lock_guard<std::mutex> g(mu_);
  progress_locked();
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(worker_, tag, ~uint64_t{0}, 0, &info) != nullptr;
}

Status Ucx::wait(const std::vector<TransferPtr>& xs, const WaitPolicy& policy, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // The shm waits' policy: spin, then yield the core (oversubscribed hosts), then sleep.
  const auto spin_until = t0 + std::chrono::microseconds(policy.spin_us);
  const auto yield_until = spin_until + std::chrono::microseconds(policy.yield_us);
  auto next_check = t0 + std::chrono::milliseconds(1);
  size_t first_open = 0;
  Status fail;
  for (;;) {
    {
      std::lock_guard<std::mutex> g(mu_);
      progress_locked();
    }
    while (first_open < xs.size() && xs[first_open]->done.load(std::memory_order_acquire)) {
      if (!xs[first_open]->status.is_ok() && fail.is_ok()) fail = xs[first_open]->status;
      ++first_open;
    }
    if (first_open == xs.size()) return fail;
    if (!fail.is_ok()) break;
    for (size_t i = first_open; i < xs.size() && fail.is_ok(); ++i) {
      const Transfer& x = *xs[i];
      if (x.done.load(std::memory_order_acquire)) {
        if (!x.status.is_ok()) fail = x.status;
      } else if (peer_failed(x.peer)) {
        fail = ::strata::peer_failed(std::string(what) + ": world rank " + std::to_string(x.peer) + " failed (" +
                                         ucs_status_string(peers_[x.peer]->error) + ")",
                                     x.peer);
      }
    }
    if (!fail.is_ok()) break;
    auto now = Clock::now();
    if (policy.abort && policy.abort->load(std::memory_order_relaxed)) {
      fail = aborted(std::string(what) + ": communicator aborted");
      break;
    }
    if (policy.deadline.expired()) {
      fail = timeout_error(
          std::string(what) + ": timed out waiting for world rank " + std::to_string(xs[first_open]->peer),
          xs[first_open]->peer);
      break;
    }
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(1);
      if (policy.check) {
        fail = policy.check();
        if (!fail.is_ok()) break;
      }
    }
    if (now < spin_until) {
      for (int i = 0; i < 16; ++i) STRATA_UCX_RELAX();
      continue;
    }
    if (now < yield_until) {
      sched_yield();
      continue;
    }
    // Sleep on the worker's event fd; 1 ms bounds the abort/deadline/liveness latency.
    ucs_status_t st;
    {
      std::lock_guard<std::mutex> g(mu_);
      st = ucp_worker_arm(worker_);
    }
    if (st == UCS_OK) {
      pollfd p{efd_, POLLIN, 0};
      (void)::poll(&p, 1, 1);
    }
  }
  // Cancel what is still open: a receive must not land in a buffer the caller reuses.
  cancel(xs);
  return fail;
}

void Ucx::cancel(const std::vector<TransferPtr>& xs) {
  std::lock_guard<std::mutex> g(mu_);
  auto one = [this](const Transfer& x) {
    if (!x.done.load(std::memory_order_acquire) && x.handle && x.is_recv) ucp_request_cancel(worker_, x.handle);
  };
  for (const auto& x : xs) {
    if (x->stage != StripedTransfer::kStage) one(*x);
    else
      for (const TransferPtr& h : static_cast<const StripedTransfer&>(*x).pieces) one(*h);
  }
  progress_locked();
}

}  // namespace

std::string ucx_summary(const Env& env) {
  const bool put = puts_are_datapath(env);
  const std::string& dp = env.ucx_datapath;
  std::string s =
      std::string("UCX ") + ucp_get_version_string() + ", data path " + (put ? "put" : "tag") + " (" +
      (dp == "auto"
           ? std::string(have_rdma_devices() ? "RDMA devices found" : "no RDMA devices") + ", STRATA_UCX_DATAPATH=auto"
           : "STRATA_UCX_DATAPATH=" + dp) +
      "), transports " + (env.ucx_tls.empty() ? std::string("UCX default") : env.ucx_tls) + " (STRATA_UCX_TLS)";
  if (!env.ucx_net_devices.empty()) s += ", devices " + env.ucx_net_devices + " (STRATA_UCX_NET_DEVICES)";
  if (env.ucx_lanes > 1 && env.ucx_stripe_min)
    s += ", bulk messages from " + std::to_string(env.ucx_stripe_min) + " bytes in pieces of " +
         std::to_string(env.ucx_stripe_piece) + " over " + std::to_string(env.ucx_lanes) +
         " connections per peer (STRATA_UCX_STRIPE_MIN, STRATA_UCX_STRIPE_PIECE, STRATA_UCX_LANES)";
  else s += ", bulk messages whole over one connection per peer (STRATA_UCX_LANES, STRATA_UCX_STRIPE_MIN)";
  if (!put)
    s += ", rendezvous from " +
         (env.ucx_rndv_thresh.empty() ? std::string("UCX's UCX_RNDV_THRESH") : env.ucx_rndv_thresh) +
         " (STRATA_UCX_RNDV_THRESH)";
  return s;
}

Result<std::unique_ptr<Net>> make_ucx_net(const std::string& job_id, int rank, int world_size,
                                          std::shared_ptr<bootstrap::StoreClient> store, memory::Heap& heap,
                                          std::chrono::milliseconds timeout, const Env& env) {
  auto u = std::make_unique<Ucx>(job_id, rank, world_size, std::move(store), heap, timeout);
  STRATA_RETURN_IF_ERROR(u->start(env));
  return std::unique_ptr<Net>(std::move(u));
}

}  // namespace strata::transport

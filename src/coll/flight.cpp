// The flight recorder (coll/flight.hpp): the per-communicator ring, what a rank publishes in
// its control block for its peers, the dumps (stderr on a timeout or an abort, the marked
// lines strata run merges), and the SIGUSR1 watch that asks for the latter.

#include "coll/flight.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

#include "coll/comm_impl.hpp"
#include "common/log.hpp"

namespace strata::detail {

namespace {

constexpr uint32_t pack(coll::OpKind k, DataType d, FlightState s) {
  return static_cast<uint32_t>(k) | static_cast<uint32_t>(d) << 8 | static_cast<uint32_t>(s) << 16;
}
constexpr uint32_t with_state(uint32_t info, FlightState s) {
  return (info & 0xffffu) | static_cast<uint32_t>(s) << 16;
}

/// The root of a rooted collective or the peer of send/recv: whom the operation names.
int32_t named_rank(const coll::Op& op) {
  if (op.kind == coll::OpKind::Send || op.kind == coll::OpKind::Recv) return op.peer;
  return coll::rooted(op.kind) ? op.root : -1;
}

void fill(FlightEntry& e, uint64_t id, const coll::Op& op, FlightState state, uint32_t seq, uint64_t now) {
  e.id.store(0, std::memory_order_relaxed);  // readers skip an entry being rewritten
  e.seq.store(seq, std::memory_order_relaxed);
  e.info.store(pack(op.kind, op.dtype, state), std::memory_order_relaxed);
  e.root.store(named_rank(op), std::memory_order_relaxed);
  e.count.store(coll::has_count(op.kind) ? op.count : 0, std::memory_order_relaxed);
  e.t_queued.store(now, std::memory_order_relaxed);
  e.t_started.store(state == FlightState::Started ? now : 0, std::memory_order_relaxed);
  e.t_done.store(0, std::memory_order_relaxed);
  e.id.store(id, std::memory_order_release);
}

std::string ms_ago(uint64_t t, uint64_t now) {
  if (!t) return "?";
  const uint64_t ms = now > t ? (now - t) / 1000000 : 0;
  if (ms < 1000) return std::to_string(ms) + " ms ago";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s ago", static_cast<double>(ms) / 1000.0);
  return buf;
}

long long age_ms(uint64_t t, uint64_t now) {
  if (!t) return -1;
  return now > t ? static_cast<long long>((now - t) / 1000000) : 0;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

const char* to_string(FlightState s) {
  switch (s) {
    case FlightState::Queued: return "queued";
    case FlightState::Started: return "started";
    case FlightState::Done: return "done";
    case FlightState::Failed: return "failed";
    default: return "empty";
  }
}

FlightEntry::Snapshot FlightEntry::read(bool* ok) const {
  Snapshot s;
  s.id = id.load(std::memory_order_acquire);
  s.seq = seq.load(std::memory_order_relaxed);
  const uint32_t i = info.load(std::memory_order_relaxed);
  s.kind = static_cast<coll::OpKind>(i & 0xff);
  s.dtype = static_cast<DataType>((i >> 8) & 0xff);
  s.state = static_cast<FlightState>((i >> 16) & 0xff);
  s.root = root.load(std::memory_order_relaxed);
  s.count = count.load(std::memory_order_relaxed);
  s.t_queued = t_queued.load(std::memory_order_relaxed);
  s.t_started = t_started.load(std::memory_order_relaxed);
  s.t_done = t_done.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (ok) *ok = s.id != 0 && id.load(std::memory_order_relaxed) == s.id;
  if (static_cast<unsigned>(s.kind) > static_cast<unsigned>(coll::OpKind::Internal)) s.kind = coll::OpKind::Internal;
  if (static_cast<unsigned>(s.dtype) > static_cast<unsigned>(DataType::Float64)) s.dtype = DataType::UInt8;
  if (static_cast<unsigned>(s.state) > static_cast<unsigned>(FlightState::Failed)) s.state = FlightState::Empty;
  return s;
}

uint64_t flight_now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint32_t flight_entries(size_t n) {
  if (n == 0) return 0;
  uint32_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

void FlightRecorder::init(size_t n, FlightEntry* storage) {
  n_ = flight_entries(n);
  if (!n_) return;
  mask_ = n_ - 1;
  if (!storage) {
    own_ = std::make_unique<FlightEntry[]>(n_);
    storage = own_.get();
  }
  ring_ = storage;
}

FlightEntry* FlightRecorder::entry(uint64_t h) const {
  if (!h || !n_) return nullptr;
  FlightEntry* e = &ring_[(h - 1) & mask_];
  // Turned over meanwhile (more than N later operations): the entry is someone else's.
  return e->id.load(std::memory_order_relaxed) == h ? e : nullptr;
}

uint64_t FlightRecorder::begin(const coll::Op& op, FlightState state, uint32_t seq, uint64_t now) {
  if (!n_) return 0;
  // Sends are posted by the caller's thread while the engine may run other work: the claim
  // is the one read-modify-write, on a line no other process touches.
  const uint64_t h = next_.fetch_add(1, std::memory_order_relaxed) + 1;
  fill(ring_[(h - 1) & mask_], h, op, state, seq, now);
  return h;
}

void FlightRecorder::start(uint64_t h, uint32_t seq, uint64_t now) {
  FlightEntry* e = entry(h);
  if (!e) return;
  e->seq.store(seq, std::memory_order_relaxed);
  e->t_started.store(now, std::memory_order_relaxed);
  e->info.store(with_state(e->info.load(std::memory_order_relaxed), FlightState::Started), std::memory_order_release);
}

void FlightRecorder::end(uint64_t h, bool ok, uint64_t now) {
  FlightEntry* e = entry(h);
  if (!e) return;
  e->t_done.store(now, std::memory_order_relaxed);
  e->info.store(with_state(e->info.load(std::memory_order_relaxed), ok ? FlightState::Done : FlightState::Failed),
                std::memory_order_release);
}

std::vector<FlightEntry::Snapshot> FlightRecorder::snapshot() const {
  std::vector<FlightEntry::Snapshot> out;
  if (!n_) return out;
  const uint64_t last = next_.load(std::memory_order_acquire);
  const uint64_t first = last > n_ ? last - n_ + 1 : 1;
  for (uint64_t h = first; h <= last; ++h) {
    bool ok = false;
    auto s = ring_[(h - 1) & mask_].read(&ok);
    if (ok && s.id == h) out.push_back(s);
  }
  return out;
}

std::string describe(const FlightEntry::Snapshot& e) {
  std::string s = "#" + std::to_string(e.seq) + " " + coll::to_string(e.kind);
  if (e.kind == coll::OpKind::Barrier) return s;
  s += std::string(" ") + strata::to_string(e.dtype);
  if (e.count || coll::has_count(e.kind)) s += " x" + std::to_string(e.count);
  if (e.kind == coll::OpKind::Send) s += " to rank " + std::to_string(e.root);
  else if (e.kind == coll::OpKind::Recv) s += " from rank " + std::to_string(e.root);
  else if (e.root >= 0) s += " root " + std::to_string(e.root);
  return s;
}

// ---- hooks ---------------------------------------------------------------------------------

uint64_t flight_begin(CommImpl& c, const coll::Op& op, uint32_t seq, uint64_t queued) {
  if (!c.flight.capacity()) return 0;
  const uint64_t now = flight_now_ns();
  if (!queued) return c.flight.begin(op, FlightState::Started, seq, now);
  c.flight.start(queued, seq, now);
  return queued;
}

uint64_t flight_queue(CommImpl& c, const coll::Op& op) {
  if (!c.flight.capacity()) return 0;
  return c.flight.begin(op, FlightState::Queued, 0, flight_now_ns());
}

void flight_end(CommImpl& c, uint64_t h, const Status& st) {
  if (h) c.flight.end(h, st.is_ok(), flight_now_ns());
}

std::string peer_activity(const CommImpl& c, int r) {
  if (!c.flight.capacity() || r < 0 || r >= static_cast<int>(c.peer_flight_len.size()) || !c.peers[r].base()) return "";
  // The length the peer's block had when it was mapped (attach_peer checked it lies mapped).
  const uint32_t len = c.peer_flight_len[r];
  const FlightEntry* ring = c.peers[r].flight();
  FlightEntry::Snapshot pending, last;
  for (uint32_t i = 0; i < len; ++i) {
    bool ok = false;
    auto s = ring[i].read(&ok);
    if (!ok) continue;
    if (s.state == FlightState::Started && s.id > pending.id) pending = s;
    if ((s.state == FlightState::Done || s.state == FlightState::Failed) && s.id > last.id) last = s;
  }
  const std::string who = "rank " + std::to_string(r);
  if (!pending.id && !last.id)
    return who + " has recorded no operation on this communicator (none yet, or STRATA_FLIGHT_RECORDER=0 there)";
  const uint64_t now = flight_now_ns();
  std::string s;
  if (last.id && last.id > pending.id) {
    s = who + "'s last operation: " + describe(last) + " " + to_string(last.state) + " " + ms_ago(last.t_done, now) +
        ", nothing pending";
  } else {
    s = who + " is in " + describe(pending) + ", started " + ms_ago(pending.t_started, now);
    if (last.id) s += " (before it: " + describe(last) + " " + to_string(last.state) + ")";
  }
  return s;
}

void flight_dump_stderr(const CommImpl& c, const std::string& why) {
  auto all = c.flight.snapshot();
  if (all.empty()) return;
  constexpr size_t kShown = 8;
  const size_t from = all.size() > kShown ? all.size() - kShown : 0;
  const uint64_t now = flight_now_ns();
  const int global = c.members.empty() ? c.rank : c.members[c.rank];
  std::string out = "strata: rank " + std::to_string(global) + " " + why + "; flight recorder of communicator '" +
                    c.id + "' (rank " + std::to_string(c.rank) + " of " + std::to_string(c.size) + "), last " +
                    std::to_string(all.size() - from) + " operation(s):\n";
  for (size_t i = from; i < all.size(); ++i) {
    const auto& e = all[i];
    out += "strata:   " + describe(e) + " " + to_string(e.state) + " ";
    if (e.state == FlightState::Done || e.state == FlightState::Failed) out += ms_ago(e.t_done, now);
    else if (e.state == FlightState::Started) out += ms_ago(e.t_started, now) + ", pending";
    else out += ms_ago(e.t_queued, now) + ", pending";
    out += "\n";
  }
  write_all(STDERR_FILENO, out);
}

// ---- the machine-readable dump and SIGUSR1 -------------------------------------------------

namespace {

std::string comm_lines(const CommImpl& c, int global, uint64_t now) {
  const std::string m = kFlightMarker;
  std::string out = m + " comm rank=" + std::to_string(global) + " id=" + c.id + " crank=" + std::to_string(c.rank) +
                    " size=" + std::to_string(c.size) + " members=";
  for (size_t i = 0; i < c.members.size(); ++i) out += (i ? "," : "") + std::to_string(c.members[i]);
  auto all = c.flight.snapshot();
  out += " entries=" + std::to_string(all.size()) + "\n";
  for (const auto& e : all) {
    out += m + " op rank=" + std::to_string(global) + " id=" + c.id + " seq=" + std::to_string(e.seq) +
           " kind=" + coll::to_string(e.kind) + " dtype=" + strata::to_string(e.dtype) +
           " count=" + std::to_string(e.count) + " root=" + std::to_string(e.root) + " state=" + to_string(e.state) +
           " queued_ms=" + std::to_string(age_ms(e.t_queued, now)) +
           " started_ms=" + std::to_string(age_ms(e.t_started, now)) +
           " done_ms=" + std::to_string(age_ms(e.t_done, now)) + "\n";
  }
  return out;
}

}  // namespace

std::string flight_dump_lines(ContextImpl& ctx) {
  std::vector<std::shared_ptr<CommImpl>> live;
  {
    std::lock_guard<std::mutex> g(ctx.mu);
    for (auto& w : ctx.comms)
      if (auto c = w.lock()) live.push_back(std::move(c));
  }
  const int global = ctx.job.rank;
  const uint64_t now = flight_now_ns();
  const std::string m = kFlightMarker;
  std::string out = m + " begin rank=" + std::to_string(global) + " pid=" + std::to_string(::getpid()) + "\n";
  // A destroyed communicator still answers while the dump holds it (its flag is the owner's).
  for (const auto& c : live) out += comm_lines(*c, global, now);
  out += m + " end rank=" + std::to_string(global) + "\n";
  return out;
}

namespace {

// The write end of the pipe the handler wakes the dump thread through; -1 until installed.
std::atomic<int> g_wake_fd{-1};

void on_sigusr1(int) {
  const int saved = errno;
  const int fd = g_wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char b = 1;
    (void)!::write(fd, &b, 1);
  }
  errno = saved;
}

/// The contexts a dump covers, and this process's handler state. Never destroyed: the dump
/// thread may run while static destructors do.
struct Watch {
  std::mutex mu;
  std::vector<std::weak_ptr<ContextImpl>> ctxs;
  pid_t pid = 0;         // the process that installed (a forked child starts over)
  bool enabled = false;  // handler installed in this process
};
Watch& watch() {
  static Watch* w = new Watch;
  return *w;
}

void dump_thread(int rfd) {
  char buf[64];
  for (;;) {
    ssize_t n = ::read(rfd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::vector<std::shared_ptr<ContextImpl>> live;
    {
      Watch& w = watch();
      std::lock_guard<std::mutex> g(w.mu);
      std::erase_if(w.ctxs, [](const std::weak_ptr<ContextImpl>& x) { return x.expired(); });
      for (auto& x : w.ctxs)
        if (auto c = x.lock()) live.push_back(std::move(c));
    }
    for (auto& c : live) write_all(STDERR_FILENO, flight_dump_lines(*c));
  }
}

}  // namespace

void flight_watch(const std::shared_ptr<ContextImpl>& ctx) {
  if (!ctx->env.flight_recorder) return;
  Watch& w = watch();
  std::lock_guard<std::mutex> g(w.mu);
  if (w.pid != ::getpid()) {
    // First context of this process (or of a forked child, which has no dump thread).
    w.pid = ::getpid();
    w.ctxs.clear();
    w.enabled = false;
    struct sigaction old {};
    ::sigaction(SIGUSR1, nullptr, &old);
    const bool ours = !(old.sa_flags & SA_SIGINFO) && old.sa_handler == on_sigusr1;
    if (!ours && ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)) {
      STRATA_LOG(Info, "SIGUSR1 has a handler of the program (or is ignored): the flight recorder is not dumped on it");
    } else {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) {
        STRATA_LOG(Warn, "flight recorder: pipe2: " << std::strerror(errno) << "; no dump on SIGUSR1");
      } else {
        // A burst of signals must never block the handler: extra wake-ups are dropped.
        ::fcntl(p[1], F_SETFL, O_NONBLOCK);
        const int old_fd = g_wake_fd.exchange(p[1]);
        if (old_fd >= 0) ::close(old_fd);  // the parent's, inherited through fork
        std::thread(dump_thread, p[0]).detach();
        struct sigaction sa {};
        sa.sa_handler = on_sigusr1;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        ::sigaction(SIGUSR1, &sa, nullptr);
        w.enabled = true;
      }
    }
  }
  if (w.enabled) w.ctxs.push_back(ctx);
}

}  // namespace strata::detail

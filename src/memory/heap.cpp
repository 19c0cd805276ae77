#include "memory/heap.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

#include "common/log.hpp"
#include "memory/block_allocator.hpp"
#include "memory/fd_channel.hpp"
#include "memory/segment.hpp"

namespace strata::memory {

namespace {

constexpr uint32_t kSymmetricSegment = 0;
// Requests above this are refused before any rounding can overflow.
constexpr size_t kMaxRequest = size_t{1} << 62;
// Peer views live in a two-level table so that a job of a few ranks does not pay for
// kMaxPeers entries, while the lookup stays two atomic loads.
constexpr int kPeerChunk = 256;
constexpr int kPeerChunks = kMaxPeers / kPeerChunk;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
size_t round_down(size_t v, size_t a) { return v / a * a; }

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// Live heaps' own segments, for find_owner. Allocated once and never destroyed, so that a
// heap outliving static destruction (one held by a static object) can still unregister.
struct Registry {
  std::shared_mutex mu;
  std::map<uintptr_t, std::pair<uintptr_t, const Heap*>> ranges;  // base -> (end, heap)
  // Every address any range ever covered lies in [lo, hi): find_owner answers an address
  // outside without the lock (a collective on an external buffer asks on every call).
  std::atomic<uintptr_t> lo{UINTPTR_MAX}, hi{0};
};
/// Widens [lo, hi) to cover [b, e). Under the lock that guards the ranges.
void widen(std::atomic<uintptr_t>& lo, std::atomic<uintptr_t>& hi, uintptr_t b, uintptr_t e) {
  if (b < lo.load(std::memory_order_relaxed)) lo.store(b, std::memory_order_release);
  if (e > hi.load(std::memory_order_relaxed)) hi.store(e, std::memory_order_release);
}
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

Status check_alignment(size_t alignment, const char* what) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    return invalid_argument(std::string(what) + ": alignment " + std::to_string(alignment) + " is not a power of two");
  if (alignment > kMaxAlignment)
    return invalid_argument(std::string(what) + ": alignment " + std::to_string(alignment) + " exceeds the maximum " +
                            std::to_string(kMaxAlignment));
  return Status::ok();
}

enum class SegKind { Regular, Dedicated, Symmetric };

struct OwnSeg {
  OwnSegment seg;
  bool symmetric = false;
};

// One peer segment as seen here. base is published last (release) so that a reader that
// sees it also sees size.
struct PeerSeg {
  std::atomic<char*> base{nullptr};
  std::atomic<size_t> size{0};
};

// A peer's segment entries, in chunks made on first use. A view holding all kMaxSegments
// entries is 64 KiB, which a rank paid for each peer in first-touch faults (about 10 us a
// page here): 10-25 ms for 63 peers on a replacement's join, and on every rank's start.
constexpr uint32_t kSegChunk = 64;
struct PeerSegChunk {
  std::array<PeerSeg, kSegChunk> segs;
};

struct PeerView {
  std::array<std::atomic<PeerSegChunk*>, kMaxSegments / kSegChunk> chunks{};
  std::atomic<pid_t> pid{0};       // learned from the first fetch
  std::atomic<pid_t> expected{0};  // published in the store (expect_peer_pid)
  // Serialises only the bookkeeping of misses; the fetch itself runs unlocked so that
  // different segments of one peer can be fetched at once.
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_set<uint32_t> fetching;

  PeerView() = default;
  PeerView(const PeerView&) = delete;
  PeerView& operator=(const PeerView&) = delete;
  ~PeerView() {
    for (auto& c : chunks) delete c.load(std::memory_order_relaxed);
  }
  /// The entry of segment `id` (< kMaxSegments), its chunk made when missing.
  PeerSeg& seg(uint32_t id) {
    auto& slot = chunks[id / kSegChunk];
    PeerSegChunk* c = slot.load(std::memory_order_acquire);
    if (c == nullptr) {
      auto* fresh = new PeerSegChunk;
      if (slot.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) c = fresh;
      else delete fresh;
    }
    return c->segs[id % kSegChunk];
  }
  /// Calls f(entry) for every entry made so far.
  template <class F>
  void for_each_seg(F&& f) {
    for (auto& slot : chunks)
      if (PeerSegChunk* c = slot.load(std::memory_order_acquire))
        for (auto& ps : c->segs) f(ps);
  }
};

struct PeerChunk {
  std::array<std::atomic<PeerView*>, kPeerChunk> views{};
};

}  // namespace

HeapOptions HeapOptions::from_env(const Env& e) {
  HeapOptions o;
  o.segment_size = e.heap_segment_size;
  o.max_size = e.heap_max_size;
  o.symmetric_size = e.heap_symmetric_size;
  o.huge_pages = e.heap_huge_pages;
  o.prefault = e.heap_prefault;
  o.socket_dir = e.socket_dir;
  return o;
}

struct Heap::Impl {
  HeapOptions opts;
  std::string job_key;
  int rank = 0;
  pid_t creator_pid = 0;
  const Heap* self = nullptr;

  // Own segments. `own` is what lock-free readers use (the fd server thread and
  // peer_ptr(rank())); `by_base` serves locate(). Both are filled under seg_mu and entries
  // are never removed while the heap lives.
  std::array<std::atomic<OwnSeg*>, kMaxSegments> own{};
  mutable std::shared_mutex seg_mu;
  std::map<uintptr_t, OwnSeg*> by_base;
  // The segment locate() found last. Collectives call locate() on every operation and
  // nearly always hit the same segment; OwnSeg objects live as long as the heap, so the
  // hint can be read without the lock.
  mutable std::atomic<const OwnSeg*> locate_hint{nullptr};
  // Every own segment lies in [span_lo, span_hi) (written under seg_mu, never narrowed): an
  // external buffer's address usually lies outside, and locate() then needs no lock.
  std::atomic<uintptr_t> span_lo{UINTPTR_MAX}, span_hi{0};
  uint32_t next_id = 1;
  Heap::SegmentListener listener;  // under seg_mu
  size_t reserved = 0;             // includes segments being created, so that the limit holds
  size_t segment_count = 0;
  bool try_huge = false;
  std::atomic<size_t> published_bytes{0};

  std::mutex alloc_mu;
  BlockAllocator regular;
  std::mutex sym_mu;
  BlockAllocator symmetric;
  bool symmetric_created = false;

  std::array<std::atomic<PeerChunk*>, kPeerChunks> peers{};

  std::unique_ptr<FdServer> server;

  size_t granule() const { return try_huge ? kHugePageSize : page_size(); }
  std::string rank_str() const { return "rank " + std::to_string(rank); }

  // `bytes` is the allocation that needs the segment, for the limit check and messages.
  Result<OwnSeg*> create_own_segment(size_t size, SegKind kind, size_t bytes);
  Status limit_error(size_t request) const;
  Result<void*> alloc_in(BlockAllocator& a, size_t bytes, size_t alignment);
  Status bad_free(void* p, bool symmetric_call);

  PeerView* view(int peer, bool create);
  Result<void*> peer_miss(int peer, PeerView& v, SegRef ref, size_t bytes, Deadline deadline);
  Result<void*> in_range(int peer, char* base, size_t size, SegRef ref, size_t bytes) const;
  SegmentFd lookup_for_server(uint32_t seg) const;
};

Status Heap::Impl::limit_error(size_t request) const {
  return unavailable("heap limit STRATA_HEAP_MAX_SIZE=" + std::to_string(opts.max_size) + " reached while allocating " +
                     std::to_string(request) + " bytes on " + rank_str() + " (" + std::to_string(reserved) +
                     " bytes reserved in " + std::to_string(segment_count) + " segments)");
}

// Reserves the id and the bytes under the lock, builds the segment (which may take long
// with prefault) outside it, and publishes it under the lock again, so locate() and the fd
// server are not held up.
Result<OwnSeg*> Heap::Impl::create_own_segment(size_t size, SegKind kind, size_t bytes) {
  const bool is_symmetric = kind == SegKind::Symmetric;
  SegmentSpec spec;
  spec.rank = rank;
  spec.prefault = opts.prefault;
  {
    std::unique_lock lk(seg_mu);
    const size_t g = granule();
    size = round_up(size, g);
    const size_t left = opts.max_size > reserved ? opts.max_size - reserved : 0;
    if (size > left) {
      // A regular segment may be cut down to what the limit leaves, if that still holds the
      // request; a dedicated or symmetric one has exactly the size it needs.
      const size_t need = round_up(std::max<size_t>(bytes, 1), g);
      const size_t fit = round_down(left, g);
      if (kind != SegKind::Regular || need > fit) return limit_error(bytes);
      size = fit;
    }
    if (is_symmetric) {
      spec.id = kSymmetricSegment;
    } else {
      if (next_id >= kMaxSegments)
        return unavailable("heap on " + rank_str() + " reached its limit of " + std::to_string(kMaxSegments) +
                           " segments while allocating " + std::to_string(bytes) +
                           " bytes (raise STRATA_HEAP_SEGMENT_SIZE)");
      spec.id = next_id++;
    }
    spec.size = size;
    spec.huge_pages = try_huge;
    reserved += size;
  }

  auto made = create_segment(spec);

  std::unique_lock lk(seg_mu);
  if (!made.is_ok()) {
    reserved -= size;
    if (!is_symmetric && next_id == spec.id + 1) next_id = spec.id;
    return made.status();
  }
  if (!made->huge_fallback.empty() && try_huge) {
    try_huge = false;
    STRATA_LOG(Warn, "heap on " << rank_str() << ": STRATA_HEAP_HUGE_PAGES is set but huge pages are unavailable ("
                                << made->huge_fallback << "); using normal pages");
  }
  auto* s = new OwnSeg{std::move(*made), is_symmetric};
  by_base.emplace(reinterpret_cast<uintptr_t>(s->seg.base), s);
  widen(span_lo, span_hi, reinterpret_cast<uintptr_t>(s->seg.base),
        reinterpret_cast<uintptr_t>(s->seg.base) + s->seg.size);
  ++segment_count;
  published_bytes.fetch_add(s->seg.size, std::memory_order_relaxed);
  own[spec.id].store(s, std::memory_order_release);
  if (listener) listener(spec.id, s->seg.base, s->seg.size);
  {
    Registry& reg = registry();
    std::unique_lock rl(reg.mu);
    const uintptr_t b = reinterpret_cast<uintptr_t>(s->seg.base);
    reg.ranges[b] = {b + s->seg.size, self};
    widen(reg.lo, reg.hi, b, b + s->seg.size);
  }
  return s;
}

SegmentFd Heap::Impl::lookup_for_server(uint32_t seg) const {
  SegmentFd r;
  if (seg >= kMaxSegments) return r;
  const OwnSeg* s = own[seg].load(std::memory_order_acquire);
  if (s == nullptr) {
    r.status = seg == kSymmetricSegment ? kFdNotYet : kFdNoSegment;
    return r;
  }
  r.status = kFdOk;
  r.fd = s->seg.fd;
  r.size = s->seg.size;
  return r;
}

Result<void*> Heap::Impl::alloc_in(BlockAllocator& a, size_t bytes, size_t alignment) {
  const size_t size = round_up(std::max<size_t>(bytes, 1), BlockAllocator::kGranule);
  const size_t align = std::max(alignment, BlockAllocator::kGranule);
  if (auto p = a.allocate(size, align)) return reinterpret_cast<void*>(*p);
  return Status(Code::Unavailable, "no block fits");
}

PeerView* Heap::Impl::view(int peer, bool create) {
  auto& slot = peers[static_cast<size_t>(peer / kPeerChunk)];
  PeerChunk* chunk = slot.load(std::memory_order_acquire);
  if (chunk == nullptr) {
    if (!create) return nullptr;
    auto* fresh = new PeerChunk;
    if (slot.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel)) {
      chunk = fresh;
    } else {
      delete fresh;
    }
  }
  auto& vslot = chunk->views[static_cast<size_t>(peer % kPeerChunk)];
  PeerView* v = vslot.load(std::memory_order_acquire);
  if (v == nullptr && create) {
    auto* fresh = new PeerView;
    if (vslot.compare_exchange_strong(v, fresh, std::memory_order_acq_rel)) {
      v = fresh;
    } else {
      delete fresh;
    }
  }
  return v;
}

Result<void*> Heap::Impl::in_range(int peer, char* base, size_t size, SegRef ref, size_t bytes) const {
  if (ref.offset > size || bytes > size - ref.offset)
    return Status(Code::InvalidArgument,
                  "peer_ptr on " + rank_str() + ": range [" + std::to_string(ref.offset) + ", +" +
                      std::to_string(bytes) + ") is outside peer rank " + std::to_string(peer) + "'s segment " +
                      std::to_string(ref.seg) + " of " + std::to_string(size) + " bytes",
                  peer);
  return static_cast<void*>(base + ref.offset);
}

Result<void*> Heap::Impl::peer_miss(int peer, PeerView& v, SegRef ref, size_t bytes, Deadline deadline) {
  PeerSeg& ps = v.seg(ref.seg);
  {
    std::unique_lock lk(v.mu);
    for (;;) {
      if (char* b = ps.base.load(std::memory_order_acquire))
        return in_range(peer, b, ps.size.load(std::memory_order_relaxed), ref, bytes);
      if (v.fetching.count(ref.seg) == 0) break;
      // Another thread is fetching this segment: wait for it rather than map it twice.
      if (deadline.at() == Deadline::Clock::time_point::max()) {
        v.cv.wait(lk);
      } else if (v.cv.wait_until(lk, deadline.at()) == std::cv_status::timeout &&
                 ps.base.load(std::memory_order_acquire) == nullptr) {
        return Status(Code::Timeout,
                      "peer_ptr on " + rank_str() + ": segment " + std::to_string(ref.seg) + " of peer rank " +
                          std::to_string(peer) + " is being fetched by another thread and did not arrive in time",
                      peer);
      }
    }
    v.fetching.insert(ref.seg);
  }

  Result<char*> mapped = Status(Code::Internal, "unset");
  size_t size = 0;
  pid_t pid = 0;
  const pid_t expected = v.expected.load(std::memory_order_relaxed);
  const pid_t want = expected != 0 ? expected : v.pid.load(std::memory_order_relaxed);
  auto path = fd_socket_path(fd_socket_dir(opts.socket_dir), job_key, peer);
  auto fetched =
      path.is_ok() ? fetch_segment_fd(*path, peer, ref.seg, deadline, want) : Result<FetchedFd>(path.status());
  if (fetched.is_ok()) {
    size = fetched->size;
    pid = fetched->pid;
    mapped = map_peer_segment(fetched->fd, size);
    close(fetched->fd);
    if (!mapped.is_ok())
      mapped = Status(mapped.status().code(),
                      "mapping segment " + std::to_string(ref.seg) + " of peer rank " + std::to_string(peer) + " (" +
                          std::to_string(size) + " bytes): " + mapped.status().message(),
                      peer);
  } else {
    mapped = fetched.status().with_context("peer_ptr on " + rank_str() + ": ");
  }

  {
    std::lock_guard lk(v.mu);
    v.fetching.erase(ref.seg);
    if (mapped.is_ok()) {
      ps.size.store(size, std::memory_order_relaxed);
      ps.base.store(*mapped, std::memory_order_release);
      v.pid.store(pid, std::memory_order_relaxed);
    }
  }
  v.cv.notify_all();
  if (!mapped.is_ok()) return mapped.status();
  STRATA_LOG(Debug, "heap on " << rank_str() << ": mapped segment " << ref.seg << " of rank " << peer << " (" << size
                               << " bytes) at " << static_cast<void*>(*mapped));
  return in_range(peer, *mapped, size, ref, bytes);
}

Status Heap::Impl::bad_free(void* p, bool symmetric_call) {
  const char* call = symmetric_call ? "free_symmetric" : "free";
  const std::string ptr = hex(p);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (!symmetric_call) {
    std::lock_guard lk(sym_mu);
    if (symmetric.block_size(a))
      return invalid_argument("free on " + rank_str() + ": pointer " + ptr +
                              " was allocated by alloc_symmetric; free it with free_symmetric");
  } else {
    std::lock_guard lk(alloc_mu);
    if (regular.block_size(a))
      return invalid_argument("free_symmetric on " + rank_str() + ": pointer " + ptr +
                              " was allocated by alloc; free it with free");
  }
  if (auto ref = self->locate(p, 1))
    return invalid_argument(std::string(call) + " on " + rank_str() + ": pointer " + ptr + " lies in segment " +
                            std::to_string(ref->seg) + " at offset " + std::to_string(ref->offset) +
                            " but does not start a live block (interior pointer or double free)");
  if (const Heap* other = Heap::find_owner(p))
    return invalid_argument(std::string(call) + " on " + rank_str() + ": pointer " + ptr +
                            " belongs to another heap (rank " + std::to_string(other->rank()) + ")");
  return invalid_argument(std::string(call) + " on " + rank_str() + ": pointer " + ptr +
                          " was not allocated by this heap");
}

// ---------------------------------------------------------------------------------------

Heap::Heap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Heap>> Heap::create(const HeapOptions& opts, const std::string& job_key, int rank) {
  if (rank < 0 || rank >= kMaxPeers)
    return invalid_argument("heap: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(kMaxPeers) +
                            ")");
  if (opts.segment_size == 0) return invalid_argument("heap: STRATA_HEAP_SEGMENT_SIZE is 0");
  if (opts.symmetric_size == 0) return invalid_argument("heap: STRATA_HEAP_SYMMETRIC_SIZE is 0");
  if (opts.segment_size > kMaxRequest || opts.symmetric_size > kMaxRequest)
    return invalid_argument("heap: segment size " + std::to_string(std::max(opts.segment_size, opts.symmetric_size)) +
                            " is too large");
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->job_key = job_key;
  impl->rank = rank;
  impl->creator_pid = getpid();
  impl->try_huge = opts.huge_pages;
  std::unique_ptr<Heap> heap(new Heap(std::move(impl)));
  Impl* im = heap->impl_.get();
  im->self = heap.get();
  auto path = fd_socket_path(fd_socket_dir(opts.socket_dir), job_key, rank);
  if (!path.is_ok()) return path.status().with_context("heap on rank " + std::to_string(rank) + ": ");
  auto server = FdServer::start(*path, rank, [im](uint32_t seg) { return im->lookup_for_server(seg); });
  if (!server.is_ok()) return server.status().with_context("heap on rank " + std::to_string(rank) + ": ");
  im->server = std::move(server).value();
  return heap;
}

void Heap::set_segment_listener(SegmentListener l) {
  Impl& im = *impl_;
  std::unique_lock lk(im.seg_mu);
  im.listener = std::move(l);
  if (!im.listener) return;
  for (uint32_t id = 0; id < kMaxSegments; ++id)
    if (const OwnSeg* s = im.own[id].load(std::memory_order_acquire)) im.listener(id, s->seg.base, s->seg.size);
}

Heap::~Heap() {
  Impl& im = *impl_;
  if (getpid() != im.creator_pid) {
    // A forked child holds a copy of this object but not the server thread, and shares the
    // server's eventfd with the parent: stopping it from here would stop the parent's.
    (void)im.server.release();
  } else {
    im.server.reset();
  }
  {
    Registry& reg = registry();
    std::unique_lock rl(reg.mu);
    for (auto& [base, s] : im.by_base) reg.ranges.erase(base);
  }
  for (auto& slot : im.peers) {
    PeerChunk* chunk = slot.load(std::memory_order_acquire);
    if (chunk == nullptr) continue;
    for (auto& vs : chunk->views) {
      PeerView* v = vs.load(std::memory_order_acquire);
      if (v == nullptr) continue;
      v->for_each_seg([](PeerSeg& ps) {
        if (char* b = ps.base.load(std::memory_order_acquire)) munmap(b, ps.size.load(std::memory_order_relaxed));
      });
      delete v;
    }
    delete chunk;
  }
  for (auto& [base, s] : im.by_base) {
    destroy_segment(s->seg);
    delete s;
  }
}

int Heap::rank() const { return impl_->rank; }

Result<void*> Heap::alloc(size_t bytes, size_t alignment) {
  Impl& im = *impl_;
  STRATA_RETURN_IF_ERROR(check_alignment(alignment, "alloc"));
  if (bytes > kMaxRequest) {
    std::shared_lock lk(im.seg_mu);
    return im.limit_error(bytes);
  }
  std::lock_guard lk(im.alloc_mu);
  if (auto p = im.alloc_in(im.regular, bytes, alignment); p.is_ok()) return p;
  const size_t size = round_up(std::max<size_t>(bytes, 1), BlockAllocator::kGranule);
  // Segment bases are aligned to kMaxAlignment, so offset 0 of a new segment satisfies any
  // accepted alignment and the segment needs no slack for it.
  const bool dedicated = size > im.opts.segment_size / 2;
  STRATA_ASSIGN_OR_RETURN(OwnSeg * s, im.create_own_segment(dedicated ? size : im.opts.segment_size,
                                                            dedicated ? SegKind::Dedicated : SegKind::Regular, bytes));
  im.regular.add_region(reinterpret_cast<uintptr_t>(s->seg.base), s->seg.size, s->seg.id);
  auto p = im.alloc_in(im.regular, bytes, alignment);
  if (!p.is_ok())
    return internal_error("alloc on " + im.rank_str() + ": " + std::to_string(bytes) +
                          " bytes do not fit in a fresh segment of " + std::to_string(s->seg.size) + " bytes");
  return p;
}

Status Heap::free(void* p) {
  if (p == nullptr) return Status::ok();
  Impl& im = *impl_;
  {
    std::lock_guard lk(im.alloc_mu);
    if (im.regular.release(reinterpret_cast<uintptr_t>(p))) return Status::ok();
  }
  return im.bad_free(p, false);
}

Result<void*> Heap::alloc_symmetric(size_t bytes, size_t alignment) {
  Impl& im = *impl_;
  STRATA_RETURN_IF_ERROR(check_alignment(alignment, "alloc_symmetric"));
  std::lock_guard lk(im.sym_mu);
  if (bytes > im.opts.symmetric_size)
    return unavailable("alloc_symmetric on " + im.rank_str() + ": " + std::to_string(bytes) +
                       " bytes exceed the symmetric arena (STRATA_HEAP_SYMMETRIC_SIZE=" +
                       std::to_string(im.opts.symmetric_size) + ")");
  if (!im.symmetric_created) {
    STRATA_ASSIGN_OR_RETURN(OwnSeg * s, im.create_own_segment(im.opts.symmetric_size, SegKind::Symmetric, bytes));
    im.symmetric.add_region(reinterpret_cast<uintptr_t>(s->seg.base), s->seg.size, s->seg.id);
    im.symmetric_created = true;
  }
  auto p = im.alloc_in(im.symmetric, bytes, alignment);
  if (!p.is_ok())
    return unavailable("alloc_symmetric on " + im.rank_str() + ": symmetric arena (STRATA_HEAP_SYMMETRIC_SIZE=" +
                       std::to_string(im.opts.symmetric_size) + ") has no free block for " + std::to_string(bytes) +
                       " bytes (" + std::to_string(im.symmetric.free_bytes()) + " bytes free in " +
                       std::to_string(im.symmetric.free_blocks()) + " blocks)");
  return p;
}

Status Heap::free_symmetric(void* p) {
  if (p == nullptr) return Status::ok();
  Impl& im = *impl_;
  {
    std::lock_guard lk(im.sym_mu);
    if (im.symmetric.release(reinterpret_cast<uintptr_t>(p))) return Status::ok();
  }
  return im.bad_free(p, true);
}

uint32_t Heap::symmetric_segment() const { return kSymmetricSegment; }

std::optional<SegRef> Heap::locate(const void* p, size_t bytes) const {
  const Impl& im = *impl_;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (const OwnSeg* h = im.locate_hint.load(std::memory_order_acquire)) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(h->seg.base);
    if (a >= base && a - base < h->seg.size && bytes <= h->seg.size - (a - base)) return SegRef{h->seg.id, a - base};
  }
  // A segment that holds p was added before p was handed out, so it is within the span.
  if (a < im.span_lo.load(std::memory_order_acquire) || a >= im.span_hi.load(std::memory_order_acquire))
    return std::nullopt;
  std::shared_lock lk(im.seg_mu);
  auto it = im.by_base.upper_bound(a);
  if (it == im.by_base.begin()) return std::nullopt;
  --it;
  const OwnSeg& s = *it->second;
  const size_t off = a - it->first;
  if (off >= s.seg.size || bytes > s.seg.size - off) return std::nullopt;
  im.locate_hint.store(&s, std::memory_order_release);
  return SegRef{s.seg.id, off};
}

Result<void*> Heap::peer_ptr(int peer, SegRef ref, size_t bytes, Deadline deadline) {
  Impl& im = *impl_;
  if (peer < 0 || peer >= kMaxPeers)
    return invalid_argument("peer_ptr on " + im.rank_str() + ": peer rank " + std::to_string(peer) +
                            " is outside [0, " + std::to_string(kMaxPeers) + ")");
  if (ref.seg >= kMaxSegments)
    return Status(Code::InvalidArgument,
                  "peer_ptr on " + im.rank_str() + ": segment id " + std::to_string(ref.seg) + " of peer rank " +
                      std::to_string(peer) + " exceeds the limit of " + std::to_string(kMaxSegments),
                  peer);
  if (peer == im.rank) {
    const OwnSeg* s = im.own[ref.seg].load(std::memory_order_acquire);
    if (s == nullptr)
      return invalid_argument("peer_ptr on " + im.rank_str() + ": own segment " + std::to_string(ref.seg) +
                              " does not exist");
    return im.in_range(peer, s->seg.base, s->seg.size, ref, bytes);
  }
  PeerView* v = im.view(peer, true);
  PeerSeg& ps = v->seg(ref.seg);
  if (char* b = ps.base.load(std::memory_order_acquire))
    return im.in_range(peer, b, ps.size.load(std::memory_order_relaxed), ref, bytes);
  return im.peer_miss(peer, *v, ref, bytes, deadline);
}

Status Heap::adopt_peer_segment(int peer, uint32_t seg, char* base, size_t size, pid_t pid) {
  Impl& im = *impl_;
  struct Unmapper {
    char* base;
    size_t size;
    ~Unmapper() {
      if (base) munmap(base, size);
    }
  } owned{base, size};
  if (peer < 0 || peer >= kMaxPeers || peer == im.rank || seg >= kMaxSegments)
    return invalid_argument("adopt_peer_segment on " + im.rank_str() + ": peer rank " + std::to_string(peer) +
                            ", segment " + std::to_string(seg) + " is not a peer's segment");
  PeerView* v = im.view(peer, true);
  PeerSeg& ps = v->seg(seg);
  std::lock_guard lk(v->mu);
  if (ps.base.load(std::memory_order_acquire) != nullptr || v->fetching.count(seg)) return Status::ok();
  const pid_t expected = v->expected.load(std::memory_order_relaxed);
  const pid_t known = v->pid.load(std::memory_order_relaxed);
  if ((expected != 0 && pid != expected) || (known != 0 && pid != known))
    return Status(Code::PeerFailed,
                  "adopt_peer_segment on " + im.rank_str() + ": segment " + std::to_string(seg) + " of peer rank " +
                      std::to_string(peer) + " came from pid " + std::to_string(pid) + ", not from rank " +
                      std::to_string(peer) + "'s process " + std::to_string(expected != 0 ? expected : known),
                  peer);
  owned.base = nullptr;
  ps.size.store(size, std::memory_order_relaxed);
  ps.base.store(base, std::memory_order_release);
  v->pid.store(pid, std::memory_order_relaxed);
  return Status::ok();
}

pid_t Heap::peer_pid(int peer) const {
  if (peer == impl_->rank) return impl_->creator_pid;
  if (peer < 0 || peer >= kMaxPeers) return 0;
  PeerView* v = impl_->view(peer, false);
  return v == nullptr ? 0 : v->pid.load(std::memory_order_relaxed);
}

void Heap::drop_peer(int peer) {
  if (peer < 0 || peer >= kMaxPeers || peer == impl_->rank) return;
  PeerView* v = impl_->view(peer, false);
  if (v == nullptr) return;
  std::lock_guard lk(v->mu);
  v->for_each_seg([](PeerSeg& ps) {
    char* b = ps.base.exchange(nullptr, std::memory_order_acq_rel);
    if (b != nullptr) munmap(b, ps.size.load(std::memory_order_relaxed));
    ps.size.store(0, std::memory_order_relaxed);
  });
  v->pid.store(0, std::memory_order_relaxed);
  v->expected.store(0, std::memory_order_relaxed);
}

void Heap::expect_peer_pid(int peer, pid_t pid) {
  if (peer < 0 || peer >= kMaxPeers || peer == impl_->rank) return;
  PeerView* v = impl_->view(peer, true);
  if (v != nullptr) v->expected.store(pid, std::memory_order_relaxed);
}

size_t Heap::reserved_bytes() const { return impl_->published_bytes.load(std::memory_order_relaxed); }

const Heap* Heap::find_owner(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Registry& reg = registry();
  if (a < reg.lo.load(std::memory_order_acquire) || a >= reg.hi.load(std::memory_order_acquire)) return nullptr;
  std::shared_lock lk(reg.mu);
  auto it = reg.ranges.upper_bound(a);
  if (it == reg.ranges.begin()) return nullptr;
  --it;
  return a < it->second.first ? it->second.second : nullptr;
}

}  // namespace strata::memory

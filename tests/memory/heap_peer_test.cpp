// Peer access with threads as ranks: several heaps of one job in one process.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "memory/fd_channel.hpp"
#include "memory/heap.hpp"
#include "memory/segment.hpp"
#include "memory/test_util.hpp"
#include "test_status.hpp"

namespace strata::memory {
namespace {

using testing::make_heap;
using testing::pattern;
using testing::small_options;
using testing::socket_path;
using testing::soon;
using testing::unique_key;

constexpr size_t kMiB = size_t{1} << 20;

TEST(HeapPeer, WritesAreVisibleBothWays) {
  const std::string key = unique_key("both");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  constexpr size_t n = 64 * 1024;
  auto a = h0->alloc(n);
  auto b = h1->alloc(n);
  STRATA_ASSERT_OK(a);
  STRATA_ASSERT_OK(b);
  auto* pa = static_cast<unsigned char*>(*a);
  auto* pb = static_cast<unsigned char*>(*b);
  for (size_t i = 0; i < n; ++i) pa[i] = pattern(0, i);
  for (size_t i = 0; i < n; ++i) pb[i] = pattern(1, i);

  auto ra = h0->locate(pa, n);
  auto rb = h1->locate(pb, n);
  ASSERT_TRUE(ra && rb);
  auto va = h1->peer_ptr(0, *ra, n, soon());
  auto vb = h0->peer_ptr(1, *rb, n, soon());
  STRATA_ASSERT_OK(va);
  STRATA_ASSERT_OK(vb);
  auto* qa = static_cast<unsigned char*>(*va);
  auto* qb = static_cast<unsigned char*>(*vb);
  EXPECT_NE(qa, pa) << "a peer view is a mapping of its own";
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(qa[i], pattern(0, i)) << "rank 1 reading rank 0's block at " << i;
    ASSERT_EQ(qb[i], pattern(1, i)) << "rank 0 reading rank 1's block at " << i;
  }
  for (size_t i = 0; i < n; ++i) qa[i] = pattern(2, i);
  for (size_t i = 0; i < n; ++i) qb[i] = pattern(3, i);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(pa[i], pattern(2, i)) << "rank 0 seeing rank 1's write at " << i;
    ASSERT_EQ(pb[i], pattern(3, i)) << "rank 1 seeing rank 0's write at " << i;
  }
  EXPECT_EQ(h0->peer_pid(1), getpid());
  EXPECT_EQ(h1->peer_pid(0), getpid());
  EXPECT_EQ(h0->peer_pid(5), 0) << "a peer never contacted has no pid yet";

  // The own rank resolves locally, so a collective can treat every rank alike.
  auto self = h0->peer_ptr(0, *ra, n, soon());
  STRATA_ASSERT_OK(self);
  EXPECT_EQ(*self, *a);
}

TEST(HeapPeer, SegmentCreatedAfterFirstAccessIsMappedOnFirstUse) {
  const std::string key = unique_key("lazy");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto first = h0->alloc(1024);
  STRATA_ASSERT_OK(first);
  auto r1 = h0->locate(*first, 1024);
  STRATA_ASSERT_OK(h1->peer_ptr(0, *r1, 1024, soon()));

  auto later = h0->alloc(5 * kMiB);  // more than a segment: a new one, made after the first access
  STRATA_ASSERT_OK(later);
  std::memset(*later, 0x77, 5 * kMiB);
  auto r2 = h0->locate(*later, 5 * kMiB);
  ASSERT_TRUE(r2);
  ASSERT_NE(r2->seg, r1->seg);
  auto v = h1->peer_ptr(0, *r2, 5 * kMiB, soon());
  STRATA_ASSERT_OK(v);
  auto* q = static_cast<unsigned char*>(*v);
  EXPECT_EQ(q[0], 0x77);
  EXPECT_EQ(q[5 * kMiB - 1], 0x77);
}

TEST(HeapPeer, SymmetricOffsetsAddressTheSameBlockOnThePeer) {
  const std::string key = unique_key("sympeer");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto s0 = h0->alloc_symmetric(4096);
  auto s1 = h1->alloc_symmetric(4096);
  STRATA_ASSERT_OK(s0);
  STRATA_ASSERT_OK(s1);
  auto r0 = h0->locate(*s0, 4096);
  ASSERT_TRUE(r0);
  // No exchange: rank 0 computes rank 1's address from its own offset.
  auto v = h0->peer_ptr(1, SegRef{h0->symmetric_segment(), r0->offset}, 4096, soon());
  STRATA_ASSERT_OK(v);
  std::memset(*v, 0x3c, 4096);
  EXPECT_EQ(static_cast<unsigned char*>(*s1)[4095], 0x3c);
}

TEST(HeapPeer, SymmetricArenaNotYetCreatedIsUnavailable) {
  const std::string key = unique_key("symnot");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto v = h0->peer_ptr(1, SegRef{0, 0}, 64, soon());
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), Code::Unavailable) << v.status().to_string();
  EXPECT_EQ(v.status().peer(), 1);
}

TEST(HeapPeer, RangesOutsideTheSegmentAndUnknownSegmentsAreInvalid) {
  const std::string key = unique_key("range");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto p = h0->alloc(64);
  STRATA_ASSERT_OK(p);
  auto r = h0->locate(*p, 64);
  const size_t seg_size = small_options().segment_size;
  auto bad = h1->peer_ptr(0, SegRef{r->seg, seg_size - 8}, 16, soon());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::InvalidArgument);
  const std::string& m = bad.status().message();
  EXPECT_NE(m.find("peer rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("segment " + std::to_string(r->seg)), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(seg_size - 8)), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(seg_size) + " bytes"), std::string::npos) << m;
  // The same on the (now mapped) hit path.
  EXPECT_EQ(h1->peer_ptr(0, SegRef{r->seg, seg_size}, 1, soon()).status().code(), Code::InvalidArgument);
  STRATA_EXPECT_OK(h1->peer_ptr(0, SegRef{r->seg, seg_size - 8}, 8, soon()));

  auto unknown = h1->peer_ptr(0, SegRef{99, 0}, 8, soon());
  EXPECT_EQ(unknown.status().code(), Code::InvalidArgument);
  EXPECT_NE(unknown.status().message().find("no segment 99"), std::string::npos) << unknown.status().message();
  EXPECT_EQ(h1->peer_ptr(0, SegRef{kMaxSegments, 0}, 8, soon()).status().code(), Code::InvalidArgument);
  EXPECT_EQ(h1->peer_ptr(-1, *r, 8, soon()).status().code(), Code::InvalidArgument);
}

TEST(HeapPeer, PeerThatNeverStartsTimesOutWithinTheDeadline) {
  const std::string key = unique_key("never");
  auto h0 = make_heap(key, 0);
  ASSERT_TRUE(h0);
  const auto t0 = std::chrono::steady_clock::now();
  auto v = h0->peer_ptr(7, SegRef{1, 0}, 64, Deadline::after(std::chrono::milliseconds(300)));
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(v.is_ok());
  EXPECT_TRUE(v.status().code() == Code::Timeout || v.status().code() == Code::Unavailable) << v.status().to_string();
  EXPECT_EQ(v.status().peer(), 7);
  EXPECT_NE(v.status().message().find("peer rank 7"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find(socket_path(key, 7)), std::string::npos) << v.status().message();
  EXPECT_GE(waited, std::chrono::milliseconds(290)) << "it must keep retrying until the deadline";
  EXPECT_LT(waited, std::chrono::milliseconds(1500)) << "and give up soon after it";
}

TEST(HeapPeer, ConnectIsRetriedUntilTheServerStarts) {
  const std::string name = socket_path(unique_key("late"), 3);
  const int memfd = memfd_create("strata-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, 4096), 0);
  std::unique_ptr<FdServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    auto s = FdServer::start(name, 3, [memfd](uint32_t seg) {
      return seg == 5 ? SegmentFd{kFdOk, memfd, 4096} : SegmentFd{kFdNoSegment, -1, 0};
    });
    if (s.is_ok()) server = std::move(s).value();
  });
  auto f = fetch_segment_fd(name, 3, 5, soon());
  starter.join();
  ASSERT_TRUE(server);
  STRATA_ASSERT_OK(f);
  EXPECT_EQ(f->size, 4096u);
  EXPECT_EQ(f->pid, getpid());
  close(f->fd);
  auto none = fetch_segment_fd(name, 3, 6, soon());
  EXPECT_EQ(none.status().code(), Code::InvalidArgument);
  auto wrong_rank = fetch_segment_fd(name, 4, 5, soon());
  EXPECT_FALSE(wrong_rank.is_ok()) << "a server answering for another rank must be noticed";
  server.reset();
  close(memfd);
}

TEST(HeapPeer, ManyClientsAtOnceAreAllServed) {
  const std::string key = unique_key("many");
  auto h0 = make_heap(key, 0);
  ASSERT_TRUE(h0);
  auto p = h0->alloc(64);
  STRATA_ASSERT_OK(p);
  const uint32_t seg = h0->locate(*p, 64)->seg;
  constexpr int kClients = 8;
  constexpr int kEach = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kClients; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        auto f = fetch_segment_fd(socket_path(key, 0), 0, seg, soon());
        if (f.is_ok()) {
          ok.fetch_add(1);
          close(f->fd);
        }
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), kClients * kEach);
}

TEST(HeapPeer, ConcurrentMissesOnOneSegmentMapItOnce) {
  const std::string key = unique_key("miss");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto p = h0->alloc(kMiB);
  STRATA_ASSERT_OK(p);
  std::memset(*p, 0x11, kMiB);
  const SegRef ref = *h0->locate(*p, kMiB);
  constexpr int kThreads = 8;
  std::vector<void*> got(kThreads, nullptr);
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      auto v = h1->peer_ptr(0, ref, kMiB, soon());
      if (v.is_ok()) got[static_cast<size_t>(t)] = *v;
    });
  for (auto& t : ts) t.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_NE(got[static_cast<size_t>(t)], nullptr) << "thread " << t;
    EXPECT_EQ(got[static_cast<size_t>(t)], got[0]) << "thread " << t << " got another mapping";
  }
  EXPECT_EQ(static_cast<unsigned char*>(got[0])[kMiB - 1], 0x11);
}

TEST(HeapPeer, ThreadsAsRanksAllToAll) {
  // Every rank allocates a block, every rank writes its rank into every other rank's block
  // at its own slot: the pattern collectives use.
  const std::string key = unique_key("a2a");
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<Heap>> heaps(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    heaps[static_cast<size_t>(r)] = make_heap(key, r);
    ASSERT_TRUE(heaps[static_cast<size_t>(r)]);
  }
  std::vector<int32_t*> blocks(kRanks);
  std::vector<SegRef> refs(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    auto p = heaps[static_cast<size_t>(r)]->alloc(kRanks * sizeof(int32_t) + r * 4096);
    STRATA_ASSERT_OK(p);
    blocks[static_cast<size_t>(r)] = static_cast<int32_t*>(*p);
    refs[static_cast<size_t>(r)] = *heaps[static_cast<size_t>(r)]->locate(*p, kRanks * sizeof(int32_t));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      for (int peer = 0; peer < kRanks; ++peer) {
        auto v = heaps[static_cast<size_t>(r)]->peer_ptr(peer, refs[static_cast<size_t>(peer)],
                                                         kRanks * sizeof(int32_t), soon());
        if (!v.is_ok()) {
          failures.fetch_add(1);
          continue;
        }
        static_cast<int32_t*>(*v)[r] = 100 + r;
      }
    });
  for (auto& t : ts) t.join();
  ASSERT_EQ(failures.load(), 0);
  for (int r = 0; r < kRanks; ++r)
    for (int s = 0; s < kRanks; ++s)
      EXPECT_EQ(blocks[static_cast<size_t>(r)][s], 100 + s) << "rank " << r << " slot " << s;
}

TEST(HeapPeer, DropPeerUnmapsAndALaterAccessMapsAgain) {
  const std::string key = unique_key("drop");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto p = h0->alloc(4096);
  STRATA_ASSERT_OK(p);
  static_cast<char*>(*p)[0] = 42;
  const SegRef ref = *h0->locate(*p, 4096);
  STRATA_ASSERT_OK(h1->peer_ptr(0, ref, 4096, soon()));
  EXPECT_NE(h1->peer_pid(0), 0);
  h1->drop_peer(0);
  EXPECT_EQ(h1->peer_pid(0), 0);
  auto again = h1->peer_ptr(0, ref, 4096, soon());
  STRATA_ASSERT_OK(again);
  EXPECT_EQ(static_cast<char*>(*again)[0], 42);
}

// A mapping made beforehand (a hot spare's) is taken as the peer's segment: peer_ptr then
// answers from it, with the owner's data. One from a process the store does not name is
// refused, as is a second mapping of a segment already mapped; both are unmapped.
TEST(HeapPeer, AdoptedMappingServesPeerPtrAndAWrongPidIsRefused) {
  const std::string key = unique_key("adopt");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  auto h2 = make_heap(key, 2);
  ASSERT_TRUE(h0 && h1 && h2);
  auto p = h0->alloc(4096);
  STRATA_ASSERT_OK(p);
  static_cast<char*>(*p)[7] = 42;
  const SegRef ref = *h0->locate(*p, 4096);
  auto premap = [&] {
    auto f = fetch_segment_fd(socket_path(key, 0), 0, ref.seg, soon());
    EXPECT_TRUE(f.is_ok()) << f.status().message();
    auto m = map_peer_segment(f->fd, f->size);
    ::close(f->fd);
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    return std::make_pair(*m, f->size);
  };
  const pid_t me = ::getpid();

  auto [base, size] = premap();
  STRATA_ASSERT_OK(h1->adopt_peer_segment(0, ref.seg, base, size, me));
  auto v = h1->peer_ptr(0, ref, 4096, soon());
  STRATA_ASSERT_OK(v);
  EXPECT_EQ(*v, base + ref.offset) << "peer_ptr must answer from the adopted mapping";
  EXPECT_EQ(static_cast<char*>(*v)[7], 42);
  EXPECT_EQ(h1->peer_pid(0), me);
  // Already mapped: a second mapping is not taken (and is unmapped).
  auto [again, again_size] = premap();
  STRATA_EXPECT_OK(h1->adopt_peer_segment(0, ref.seg, again, again_size, me));
  EXPECT_EQ(*h1->peer_ptr(0, ref, 4096, soon()), base + ref.offset);

  // The store names another process for rank 0: the mapping is refused and the segment is
  // fetched as usual later (here the fetch itself refuses the server's pid).
  h2->expect_peer_pid(0, me + 1);
  auto [other, other_size] = premap();
  Status refused = h2->adopt_peer_segment(0, ref.seg, other, other_size, me);
  EXPECT_EQ(refused.code(), Code::PeerFailed) << refused.message();
  EXPECT_NE(refused.message().find("peer rank 0"), std::string::npos) << refused.message();
  EXPECT_EQ(h2->peer_ptr(0, ref, 4096, soon()).status().code(), Code::PeerFailed);
  // Not a peer's segment: this heap's own rank.
  auto [own, own_size] = premap();
  EXPECT_EQ(h0->adopt_peer_segment(0, ref.seg, own, own_size, me).code(), Code::InvalidArgument);
}

// Two heaps with 64 MiB segments; rank 0 touches 1 MiB of its first segment and rank 1 maps
// it. The heaps stay alive as long as this does.
struct TouchedMiB {
  HeapOptions o = small_options();
  std::unique_ptr<Heap> h0, h1;
  void* owner = nullptr;  // rank 0's touched MiB
  void* peer = nullptr;   // the same MiB as rank 1 maps it
  SegRef ref{};

  explicit TouchedMiB(const char* name) {
    o.segment_size = 64 * kMiB;
    o.max_size = 128 * kMiB;
    const std::string key = unique_key(name);
    h0 = make_heap(key, 0, o);
    h1 = make_heap(key, 1, o);
    if (!h0 || !h1) return;
    auto p = h0->alloc(kMiB);
    if (!p.is_ok()) return;
    std::memset(*p, 1, kMiB);
    ref = *h0->locate(*p, kMiB);
    auto v = h1->peer_ptr(0, ref, kMiB, soon());
    if (!v.is_ok()) return;
    owner = *p;
    peer = *v;
  }
};

TEST(HeapPeer, MappingAPeerSegmentCommitsOnlyThePagesItsOwnerTouched) {
  TouchedMiB t("commit");
  ASSERT_NE(t.peer, nullptr);
  const HeapOptions& o = t.o;
  char* base = static_cast<char*>(t.owner) - t.ref.offset;
  std::vector<unsigned char> vec(o.segment_size / 4096);
  ASSERT_EQ(mincore(base, o.segment_size, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char c : vec) resident += c & 1;
  EXPECT_LE(resident, kMiB / 4096 + 16) << "the peer's mapping allocated untouched pages (MAP_POPULATE-like)";
}

// The pages the owner touched are mapped at once in the peer (no fault per page later), found
// from the memfd's data extents: /proc/self/pagemap shows them present in the peer's mapping.
TEST(HeapPeer, MappingAPeerSegmentInstallsThePagesItsOwnerTouched) {
  TouchedMiB t("present");
  ASSERT_NE(t.peer, nullptr);
  const int pm = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(pm, 0);
  size_t present = 0;
  const uintptr_t first = reinterpret_cast<uintptr_t>(t.peer) / 4096;
  for (uintptr_t pg = first; pg < first + kMiB / 4096; ++pg) {
    uint64_t e = 0;
    ASSERT_EQ(::pread(pm, &e, sizeof e, static_cast<off_t>(pg * sizeof e)), static_cast<ssize_t>(sizeof e));
    present += (e >> 63) & 1;
  }
  ::close(pm);
  EXPECT_EQ(present, kMiB / 4096) << "pages the owner touched were not mapped in the peer";
}

TEST(HeapPeer, SecondHeapWithTheSameKeyAndRankIsRefused) {
  const std::string key = unique_key("dup");
  auto h0 = make_heap(key, 0);
  ASSERT_TRUE(h0);
  auto again = Heap::create(small_options(), key, 0);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), Code::Unavailable);
  EXPECT_NE(again.status().message().find("already in use"), std::string::npos) << again.status().message();
  auto too_long = Heap::create(small_options(), std::string(200, 'k'), 0);
  EXPECT_EQ(too_long.status().code(), Code::InvalidArgument);
}

}  // namespace
}  // namespace strata::memory

// Local allocation: the allocator, limits, locate and find_owner, in one process.

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <random>
#include <set>
#include <thread>
#include <vector>

#include "memory/block_allocator.hpp"
#include "memory/heap.hpp"
#include "memory/test_util.hpp"
#include "test_status.hpp"

namespace strata::memory {
namespace {

using testing::make_heap;
using testing::small_options;
using testing::unique_key;

constexpr size_t kMiB = size_t{1} << 20;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(HeapAlloc, FreedBlockIsReusedAtTheSameAddress) {
  auto h = make_heap(unique_key("reuse"), 0);
  ASSERT_TRUE(h);
  auto a = h->alloc(kMiB);
  STRATA_ASSERT_OK(a);
  std::memset(*a, 1, kMiB);
  const size_t reserved = h->reserved_bytes();
  STRATA_ASSERT_OK(h->free(*a));
  auto b = h->alloc(kMiB);
  STRATA_ASSERT_OK(b);
  EXPECT_EQ(*a, *b) << "a freed block of the same size must be recycled (its pages are already touched)";
  EXPECT_EQ(h->reserved_bytes(), reserved);
  STRATA_ASSERT_OK(h->free(*b));
}

TEST(HeapAlloc, NeighboursCoalesceWhicheverOrderTheyAreFreed) {
  auto h = make_heap(unique_key("coal"), 0);
  ASSERT_TRUE(h);
  void* p[3];
  for (auto& q : p) {
    auto r = h->alloc(1024);
    STRATA_ASSERT_OK(r);
    q = *r;
  }
  ASSERT_EQ(addr(p[1]), addr(p[0]) + 1024);
  ASSERT_EQ(addr(p[2]), addr(p[1]) + 1024);
  STRATA_ASSERT_OK(h->free(p[0]));
  STRATA_ASSERT_OK(h->free(p[2]));
  STRATA_ASSERT_OK(h->free(p[1]));
  // All three (and the rest of the segment) are one free block again: a request for the
  // whole segment fits without a new segment.
  const size_t reserved = h->reserved_bytes();
  auto whole = h->alloc(small_options().segment_size / 2);
  STRATA_ASSERT_OK(whole);
  EXPECT_EQ(*whole, p[0]);
  auto rest = h->alloc(small_options().segment_size / 2);
  STRATA_ASSERT_OK(rest);
  EXPECT_EQ(h->reserved_bytes(), reserved) << "coalesced space must serve both halves";
  STRATA_ASSERT_OK(h->free(*whole));
  STRATA_ASSERT_OK(h->free(*rest));
}

TEST(HeapAlloc, BlockAllocatorDoesNotMergeAcrossRegions) {
  // Two regions adjacent in the address space must stay apart: a block spanning both would
  // cross a segment boundary.
  BlockAllocator a;
  a.add_region(0x10000, 0x1000, 1);
  a.add_region(0x11000, 0x1000, 2);
  EXPECT_FALSE(a.allocate(0x2000, 64).has_value());
  auto x = a.allocate(0x1000, 64);
  ASSERT_TRUE(x.has_value());
  ASSERT_TRUE(a.release(*x).has_value());
  EXPECT_EQ(a.free_blocks(), 2u);
  EXPECT_FALSE(a.release(*x).has_value()) << "a second release of the same block must fail";
}

TEST(HeapAlloc, AlignmentIsHonouredAndValidated) {
  auto h = make_heap(unique_key("align"), 0);
  ASSERT_TRUE(h);
  for (size_t align : {size_t{1}, size_t{8}, size_t{64}, size_t{128}, size_t{4096}, size_t{65536}, kMiB, 2 * kMiB}) {
    auto small = h->alloc(100);  // shifts the next free address off any large boundary
    STRATA_ASSERT_OK(small);
    auto r = h->alloc(300, align);
    STRATA_ASSERT_OK(r) << "alignment " << align;
    const size_t want = std::max<size_t>(align, 64);
    EXPECT_EQ(addr(*r) % want, 0u) << "alignment " << align << " gave " << *r;
  }
  for (size_t bad : {size_t{0}, size_t{3}, size_t{96}, 4 * kMiB}) {
    auto r = h->alloc(64, bad);
    ASSERT_FALSE(r.is_ok()) << "alignment " << bad;
    EXPECT_EQ(r.status().code(), Code::InvalidArgument);
    EXPECT_NE(r.status().message().find(std::to_string(bad)), std::string::npos) << r.status().message();
  }
}

TEST(HeapAlloc, ZeroBytesGiveDistinctFreeableBlocks) {
  auto h = make_heap(unique_key("zero"), 0);
  ASSERT_TRUE(h);
  auto a = h->alloc(0);
  auto b = h->alloc(0);
  STRATA_ASSERT_OK(a);
  STRATA_ASSERT_OK(b);
  EXPECT_NE(*a, nullptr);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(h->locate(*a, 0).has_value());
  STRATA_EXPECT_OK(h->free(*a));
  STRATA_EXPECT_OK(h->free(*b));
  STRATA_EXPECT_OK(h->free(nullptr));
}

TEST(HeapAlloc, InvalidFreesAreRejectedWithThePointerNamed) {
  auto h = make_heap(unique_key("badfree"), 0);
  ASSERT_TRUE(h);
  int on_stack = 0;
  Status s = h->free(&on_stack);
  EXPECT_EQ(s.code(), Code::InvalidArgument);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", static_cast<void*>(&on_stack));
  EXPECT_NE(s.message().find(buf), std::string::npos) << s.message();

  auto p = h->alloc(256);
  STRATA_ASSERT_OK(p);
  s = h->free(static_cast<char*>(*p) + 64);
  EXPECT_EQ(s.code(), Code::InvalidArgument);
  EXPECT_NE(s.message().find("interior pointer"), std::string::npos) << s.message();
  STRATA_ASSERT_OK(h->free(*p));
  s = h->free(*p);
  EXPECT_EQ(s.code(), Code::InvalidArgument) << "double free must be caught";
  EXPECT_NE(s.message().find("double free"), std::string::npos) << s.message();

  auto q = h->alloc_symmetric(256);
  STRATA_ASSERT_OK(q);
  s = h->free(*q);
  EXPECT_EQ(s.code(), Code::InvalidArgument);
  EXPECT_NE(s.message().find("free_symmetric"), std::string::npos) << s.message();
  auto r = h->alloc(256);
  STRATA_ASSERT_OK(r);
  s = h->free_symmetric(*r);
  EXPECT_EQ(s.code(), Code::InvalidArgument);
  STRATA_EXPECT_OK(h->free_symmetric(*q));
  STRATA_EXPECT_OK(h->free(*r));
}

TEST(HeapAlloc, FreeOfAnotherHeapsPointerNamesThatHeap) {
  const std::string key = unique_key("other");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  auto p = h1->alloc(128);
  STRATA_ASSERT_OK(p);
  EXPECT_EQ(Heap::find_owner(*p), h1.get());
  EXPECT_EQ(Heap::find_owner(static_cast<char*>(*p) + 100), h1.get());
  int on_stack = 0;
  EXPECT_EQ(Heap::find_owner(&on_stack), nullptr);
  Status s = h0->free(*p);
  EXPECT_EQ(s.code(), Code::InvalidArgument);
  EXPECT_NE(s.message().find("another heap (rank 1)"), std::string::npos) << s.message();
  STRATA_EXPECT_OK(h1->free(*p));
}

TEST(HeapAlloc, LimitIsReportedAsUnavailableWithTheSetting) {
  HeapOptions o = small_options();
  o.max_size = 16 * kMiB;
  auto h = make_heap(unique_key("limit"), 0, o);
  ASSERT_TRUE(h);
  std::vector<void*> blocks;
  Status last;
  for (int i = 0; i < 64; ++i) {
    auto r = h->alloc(kMiB + 512 * 1024);
    if (!r.is_ok()) {
      last = r.status();
      break;
    }
    blocks.push_back(*r);
  }
  ASSERT_FALSE(last.is_ok()) << "16 MiB cannot hold 64 blocks of 1.5 MiB";
  EXPECT_EQ(last.code(), Code::Unavailable);
  EXPECT_NE(last.message().find("STRATA_HEAP_MAX_SIZE=16777216"), std::string::npos) << last.message();
  EXPECT_NE(last.message().find("allocating 1572864 bytes"), std::string::npos) << last.message();
  EXPECT_LE(h->reserved_bytes(), o.max_size);
  EXPECT_GE(blocks.size(), 8u) << "the limit must be usable nearly to the end";

  auto huge = h->alloc((size_t{1} << 40) + 3);
  EXPECT_EQ(huge.status().code(), Code::Unavailable);
  EXPECT_NE(huge.status().message().find("allocating 1099511627779 bytes"), std::string::npos)
      << "the message names the bytes asked for: " << huge.status().message();
  for (void* b : blocks) STRATA_ASSERT_OK(h->free(b));
  // After freeing, the same space serves again without new segments.
  auto again = h->alloc(kMiB);
  STRATA_EXPECT_OK(again);
}

TEST(HeapAlloc, LargeRequestGetsADedicatedSegmentThatIsRecycled) {
  auto h = make_heap(unique_key("large"), 0);
  ASSERT_TRUE(h);
  auto small = h->alloc(4096);
  STRATA_ASSERT_OK(small);
  const size_t before = h->reserved_bytes();
  ASSERT_EQ(before, small_options().segment_size);
  const size_t big = 10 * kMiB + 12345;  // over half a segment (and over a whole one)
  auto b = h->alloc(big);
  STRATA_ASSERT_OK(b);
  auto rs = h->locate(*small, 1);
  auto rb = h->locate(*b, big);
  ASSERT_TRUE(rs && rb);
  EXPECT_NE(rs->seg, rb->seg);
  EXPECT_EQ(rb->offset, 0u);
  // Found in a segment made after the first (locate and find_owner skip the lock for
  // addresses outside every segment made so far: the span must have grown).
  EXPECT_EQ(Heap::find_owner(static_cast<char*>(*b) + big - 1), h.get());
  EXPECT_TRUE(h->locate(static_cast<char*>(*b) + big - 1, 1).has_value());
  const size_t dedicated = h->reserved_bytes() - before;
  EXPECT_GE(dedicated, big);
  EXPECT_LT(dedicated, big + 2 * kMiB) << "a dedicated segment is the request rounded up, not a multiple of segments";
  std::memset(*b, 0x5a, big);
  STRATA_ASSERT_OK(h->free(*b));
  auto b2 = h->alloc(big);
  STRATA_ASSERT_OK(b2);
  EXPECT_EQ(*b2, *b) << "a freed dedicated segment must be reused, not a new one created";
  EXPECT_EQ(h->reserved_bytes(), before + dedicated);
}

TEST(HeapAlloc, LocateFindsInteriorPointersAndRejectsRangesCrossingTheEnd) {
  auto h = make_heap(unique_key("locate"), 0);
  ASSERT_TRUE(h);
  auto p = h->alloc(1000);
  STRATA_ASSERT_OK(p);
  auto r = h->locate(*p, 1000);
  ASSERT_TRUE(r.has_value());
  auto inner = h->locate(static_cast<char*>(*p) + 10, 100);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->seg, r->seg);
  EXPECT_EQ(inner->offset, r->offset + 10);

  char* base = static_cast<char*>(*p) - r->offset;
  const size_t size = small_options().segment_size;
  EXPECT_TRUE(h->locate(base + size - 10, 10).has_value());
  EXPECT_FALSE(h->locate(base + size - 10, 11).has_value()) << "a range past the segment end";
  EXPECT_FALSE(h->locate(base + size, 1).has_value());
  EXPECT_FALSE(h->locate(base - 1, 2).has_value());
  EXPECT_FALSE(h->locate(base, SIZE_MAX).has_value());
  int on_stack = 0;
  EXPECT_FALSE(h->locate(&on_stack, sizeof(on_stack)).has_value());
}

TEST(HeapAlloc, SymmetricAllocationsRepeatTheSameOffsetsOnEveryRank) {
  const std::string key = unique_key("symoff");
  auto h0 = make_heap(key, 0);
  auto h1 = make_heap(key, 1);
  ASSERT_TRUE(h0 && h1);
  // Rank 1 has extra regular segments first: the symmetric arena must not care.
  auto extra = h1->alloc(3 * kMiB);
  STRATA_ASSERT_OK(extra);
  std::mt19937 rng(7);
  std::vector<std::pair<void*, void*>> live;
  for (int i = 0; i < 200; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t k = rng() % live.size();
      STRATA_ASSERT_OK(h0->free_symmetric(live[k].first));
      STRATA_ASSERT_OK(h1->free_symmetric(live[k].second));
      live.erase(live.begin() + static_cast<long>(k));
      continue;
    }
    const size_t bytes = 1 + rng() % 20000;
    const size_t align = size_t{64} << (rng() % 8);
    auto a = h0->alloc_symmetric(bytes, align);
    auto b = h1->alloc_symmetric(bytes, align);
    STRATA_ASSERT_OK(a);
    STRATA_ASSERT_OK(b);
    auto ra = h0->locate(*a, bytes);
    auto rb = h1->locate(*b, bytes);
    ASSERT_TRUE(ra && rb);
    ASSERT_EQ(ra->seg, h0->symmetric_segment());
    ASSERT_EQ(rb->seg, h1->symmetric_segment());
    ASSERT_EQ(ra->offset, rb->offset) << "step " << i << ": " << bytes << " bytes aligned " << align;
    live.emplace_back(*a, *b);
  }
  EXPECT_EQ(h0->symmetric_segment(), 0u);
}

TEST(HeapAlloc, SymmetricArenaExhaustionIsUnavailable) {
  auto h = make_heap(unique_key("symfull"), 0);
  ASSERT_TRUE(h);
  auto a = h->alloc_symmetric(3 * kMiB);
  STRATA_ASSERT_OK(a);
  auto b = h->alloc_symmetric(2 * kMiB);
  EXPECT_EQ(b.status().code(), Code::Unavailable);
  EXPECT_NE(b.status().message().find("STRATA_HEAP_SYMMETRIC_SIZE"), std::string::npos) << b.status().message();
  auto c = h->alloc_symmetric(8 * kMiB);
  EXPECT_EQ(c.status().code(), Code::Unavailable);
}

TEST(HeapAlloc, HugePagesFallBackAndPrefaultTouchesEveryPage) {
  HeapOptions o = small_options();
  o.huge_pages = true;  // none are reserved on the test machines: must fall back
  o.prefault = true;
  auto h = make_heap(unique_key("huge"), 0, o);
  ASSERT_TRUE(h);
  auto p = h->alloc(4096);
  STRATA_ASSERT_OK(p);
  auto r = h->locate(*p, 1);
  ASSERT_TRUE(r);
  char* base = static_cast<char*>(*p) - r->offset;
  const size_t size = h->reserved_bytes();
  std::vector<unsigned char> vec(size / 4096);
  ASSERT_EQ(mincore(base, size, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  EXPECT_EQ(resident, vec.size()) << "prefault must have touched every page";
}

TEST(HeapAlloc, ConcurrentAllocAndFreeNeverHandOutOverlappingBlocks) {
  auto h = make_heap(unique_key("conc"), 0);
  ASSERT_TRUE(h);
  constexpr int kThreads = 4;
  constexpr int kIters = 1500;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t + 1));
      std::vector<std::pair<unsigned char*, size_t>> mine;
      for (int i = 0; i < kIters; ++i) {
        if (mine.size() > 16 || (!mine.empty() && rng() % 2)) {
          auto [p, n] = mine.back();
          mine.pop_back();
          const unsigned char tag = static_cast<unsigned char>(t * 50 + n % 50);
          for (size_t k = 0; k < n; k += 61)
            if (p[k] != tag) failures.fetch_add(1);
          if (!h->free(p).is_ok()) failures.fetch_add(1);
          continue;
        }
        const size_t n = 1 + rng() % 50000;
        auto r = h->alloc(n, size_t{64} << (rng() % 4));
        if (!r.is_ok()) {
          failures.fetch_add(1);
          continue;
        }
        auto* p = static_cast<unsigned char*>(*r);
        std::memset(p, t * 50 + n % 50, n);
        mine.emplace_back(p, n);
      }
      for (auto [p, n] : mine)
        if (!h->free(p).is_ok()) failures.fetch_add(1);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0) << "a block was overwritten by another thread's block, or an alloc/free failed";
}

}  // namespace
}  // namespace strata::memory

#include "memory/block_allocator.hpp"

#include <cassert>
#include <iterator>

namespace strata::memory {

namespace {

// Misaligned candidates examined before settling for the first block that fits whatever its
// alignment: bounds the search when many same-sized blocks sit at unlucky addresses.
constexpr int kAlignedProbeLimit = 64;

uintptr_t align_up(uintptr_t v, size_t a) { return (v + a - 1) & ~(uintptr_t{a} - 1); }

}  // namespace

void BlockAllocator::add_region(uintptr_t base, size_t size, uint32_t region) {
  assert(base % kGranule == 0 && size % kGranule == 0);
  if (size == 0) return;
  insert_free(base, Block{size, region});
}

void BlockAllocator::insert_free(uintptr_t addr, Block b) {
  free_by_addr_.emplace(addr, b);
  free_by_size_.emplace(b.size, addr);
  free_bytes_ += b.size;
}

void BlockAllocator::erase_free(std::map<uintptr_t, Block>::iterator it) {
  free_by_size_.erase({it->second.size, it->first});
  free_bytes_ -= it->second.size;
  free_by_addr_.erase(it);
}

void BlockAllocator::take(std::map<uintptr_t, Block>::iterator it, uintptr_t at, size_t bytes) {
  const uintptr_t start = it->first;
  const Block b = it->second;
  erase_free(it);
  const size_t head = at - start;
  const size_t tail = b.size - head - bytes;
  if (head > 0) insert_free(start, Block{head, b.region});
  if (tail > 0) insert_free(at + bytes, Block{tail, b.region});
  used_.emplace(at, Block{bytes, b.region});
}

std::optional<uintptr_t> BlockAllocator::allocate(size_t bytes, size_t alignment) {
  assert(bytes > 0 && bytes % kGranule == 0);
  assert(alignment >= kGranule && (alignment & (alignment - 1)) == 0);
  auto fits = [&](const std::pair<size_t, uintptr_t>& e) {
    const uintptr_t at = align_up(e.second, alignment);
    return at - e.second <= e.first - bytes;  // e.first >= bytes holds for every candidate
  };
  int probes = 0;
  for (auto it = free_by_size_.lower_bound({bytes, 0}); it != free_by_size_.end(); ++it) {
    if (fits(*it)) {
      const uintptr_t start = it->second;
      take(free_by_addr_.find(start), align_up(start, alignment), bytes);
      return align_up(start, alignment);
    }
    if (++probes == kAlignedProbeLimit) break;
  }
  if (probes < kAlignedProbeLimit) return std::nullopt;
  // Any block of at least bytes + alignment - kGranule holds an aligned range.
  const size_t need = bytes + alignment - kGranule;
  if (need < bytes) return std::nullopt;
  for (auto it = free_by_size_.lower_bound({need, 0}); it != free_by_size_.end(); ++it) {
    if (!fits(*it)) continue;
    const uintptr_t start = it->second;
    take(free_by_addr_.find(start), align_up(start, alignment), bytes);
    return align_up(start, alignment);
  }
  return std::nullopt;
}

std::optional<size_t> BlockAllocator::release(uintptr_t p) {
  auto u = used_.find(p);
  if (u == used_.end()) return std::nullopt;
  const Block freed = u->second;
  used_.erase(u);

  uintptr_t start = p;
  size_t size = freed.size;
  auto next = free_by_addr_.lower_bound(p);
  if (next != free_by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size == p && prev->second.region == freed.region) {
      start = prev->first;
      size += prev->second.size;
      erase_free(prev);
    }
  }
  if (next != free_by_addr_.end() && next->first == p + freed.size && next->second.region == freed.region) {
    size += next->second.size;
    erase_free(next);
  }
  insert_free(start, Block{size, freed.region});
  return freed.size;
}

std::optional<size_t> BlockAllocator::block_size(uintptr_t p) const {
  auto u = used_.find(p);
  if (u == used_.end()) return std::nullopt;
  return u->second.size;
}

}  // namespace strata::memory

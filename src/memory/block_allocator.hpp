#pragma once
// Best-fit block allocator over address ranges with coalescing. Not thread-safe: the heap
// holds a lock around it.
//
// Deterministic: the result depends only on the regions added and the sequence of calls,
// with addresses compared relative to each other. Two ranks whose symmetric arenas start at
// bases aligned alike therefore get the same offsets for the same call sequence.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

namespace strata::memory {

class BlockAllocator {
 public:
  /// Every block start and size is a multiple of this.
  static constexpr size_t kGranule = 64;

  /// Adds [base, base + size) as free space. Blocks never merge across regions, even when
  /// two regions happen to be adjacent in the address space: a block must stay inside one
  /// segment for the (segment, offset) translation to hold. base and size are multiples of
  /// kGranule.
  void add_region(uintptr_t base, size_t size, uint32_t region);

  /// A block of `bytes` (a multiple of kGranule) starting at a multiple of `alignment`
  /// (a power of two, at least kGranule); nullopt when no free block fits.
  std::optional<uintptr_t> allocate(size_t bytes, size_t alignment);

  /// Returns the block starting at p to the free space; its size, or nullopt when p is not
  /// the start of a live block.
  std::optional<size_t> release(uintptr_t p);

  /// Size of the live block starting at p.
  std::optional<size_t> block_size(uintptr_t p) const;

  size_t free_bytes() const { return free_bytes_; }
  size_t live_blocks() const { return used_.size(); }
  size_t free_blocks() const { return free_by_addr_.size(); }

 private:
  struct Block {
    size_t size;
    uint32_t region;
  };
  void insert_free(uintptr_t addr, Block b);
  void erase_free(std::map<uintptr_t, Block>::iterator it);
  void take(std::map<uintptr_t, Block>::iterator it, uintptr_t at, size_t bytes);

  std::map<uintptr_t, Block> free_by_addr_;
  // (size, address): the first entry not smaller than a request is the best fit, and the
  // address breaks ties so that the choice is reproducible.
  std::set<std::pair<size_t, uintptr_t>> free_by_size_;
  std::unordered_map<uintptr_t, Block> used_;
  size_t free_bytes_ = 0;
};

}  // namespace strata::memory

#pragma once
// memfd segments: creating and mapping the owner's side, and mapping a peer's segment from
// the fd it sent.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.hpp"

namespace strata::memory {

/// Huge pages as MFD_HUGETLB uses them by default on x86-64.
inline constexpr size_t kHugePageSize = size_t{2} << 20;

size_t page_size();

struct OwnSegment {
  uint32_t id = 0;
  char* base = nullptr;
  size_t size = 0;
  int fd = -1;
  bool hugetlb = false;
  /// Why MFD_HUGETLB was asked for and not used; empty when it was used or not asked for.
  std::string huge_fallback;
};

struct SegmentSpec {
  int rank = 0;
  uint32_t id = 0;
  size_t size = 0;  // a multiple of kHugePageSize when huge_pages is set, else of page_size()
  bool huge_pages = false;
  bool prefault = false;
};

/// memfd "strata-heap-r<rank>-s<id>", sized and sealed against resizing (a peer holding the
/// fd must not be able to shrink it under the owner, which would turn accesses into
/// SIGBUS), mapped MAP_SHARED at an address aligned to kMaxAlignment.
Result<OwnSegment> create_segment(const SegmentSpec& spec);
void destroy_segment(OwnSegment& s);

/// Maps a peer's segment from its fd (which the caller still owns and closes), then maps
/// the pages the owner has already touched (see populate_present).
Result<char*> map_peer_segment(int fd, size_t size);

/// Installs page-table entries for the pages of [base, base + size) that already exist in
/// the file, and only those. MAP_POPULATE would instead allocate every page of the (mostly
/// untouched, gigabyte-sized) segment; faulting pages in one at a time costs ~5 µs each
/// here against ~0.3–0.45 µs populated (MEASURED.md). Best effort: failures are ignored.
void populate_present(char* base, size_t size);
/// The same for a mapping of `fd`, finding the pages from the file's data extents
/// (SEEK_DATA/SEEK_HOLE) instead of probing every page; falls back to mincore.
void populate_present(int fd, char* base, size_t size);

}  // namespace strata::memory

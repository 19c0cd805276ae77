#include "memory/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "common/log.hpp"
#include "memory/heap.hpp"

namespace strata::memory {

namespace {

uintptr_t align_up(uintptr_t v, size_t a) { return (v + a - 1) & ~(uintptr_t{a} - 1); }

std::string segment_name(const SegmentSpec& spec) {
  return "strata-heap-r" + std::to_string(spec.rank) + "-s" + std::to_string(spec.id);
}

std::string where(const SegmentSpec& spec) {
  return "rank " + std::to_string(spec.rank) + " segment " + std::to_string(spec.id) + " (" +
         std::to_string(spec.size) + " bytes)";
}

// A fixed address aligned to kMaxAlignment: reserve a larger span of address space, then
// map the file over its aligned middle and give back the ends.
Result<char*> map_aligned(int fd, size_t size) {
  const size_t span = size + kMaxAlignment;
  void* r = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return errno_status("mmap (address reservation)", errno);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(r);
  const uintptr_t at = align_up(lo, kMaxAlignment);
  void* m = mmap(reinterpret_cast<void*>(at), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (m == MAP_FAILED) {
    const int err = errno;
    munmap(r, span);
    return errno_status("mmap", err);
  }
  if (at > lo) munmap(r, at - lo);
  const uintptr_t end = at + size;
  if (lo + span > end) munmap(reinterpret_cast<void*>(end), lo + span - end);
  return static_cast<char*>(m);
}

struct Mapped {
  int fd;
  char* base;
};

Result<Mapped> make_mapped(const SegmentSpec& spec, bool hugetlb) {
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (hugetlb) flags |= MFD_HUGETLB;
  const std::string name = segment_name(spec);
  const int fd = memfd_create(name.c_str(), flags);
  if (fd < 0) return errno_status("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(spec.size)) != 0) {
    const int err = errno;
    close(fd);
    return errno_status("ftruncate", err);
  }
  // Sealing is a safety net only; a kernel that refuses it still gives a working segment.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    STRATA_LOG(Debug, "heap: cannot seal " << name << ": " << std::strerror(errno));
  auto base = map_aligned(fd, spec.size);
  if (!base.is_ok()) {
    close(fd);
    return base.status();
  }
  return Mapped{fd, *base};
}

void touch_every_page(char* base, size_t size, size_t page) {
  volatile char* p = base;
  for (size_t off = 0; off < size; off += page) p[off] = 0;
}

}  // namespace

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

Result<OwnSegment> create_segment(const SegmentSpec& spec) {
  OwnSegment seg;
  seg.id = spec.id;
  seg.size = spec.size;
  std::optional<Mapped> mapped;
  if (spec.huge_pages) {
    // With no huge pages reserved, memfd_create(MFD_HUGETLB) still succeeds and it is the
    // mmap that fails (ENOMEM), so the whole sequence is the probe.
    auto m = make_mapped(spec, true);
    if (m.is_ok()) {
      mapped = *m;
      seg.hugetlb = true;
    } else {
      seg.huge_fallback = m.status().message();
    }
  }
  if (!mapped) {
    auto m = make_mapped(spec, false);
    if (!m.is_ok()) return m.status().with_context("heap: creating " + where(spec) + ": ");
    mapped = *m;
    // Leaves the choice to the kernel's THP policy; a no-op where shmem THP is off.
    madvise(mapped->base, spec.size, MADV_HUGEPAGE);
  }
  seg.fd = mapped->fd;
  seg.base = mapped->base;
  if (spec.prefault) touch_every_page(seg.base, seg.size, seg.hugetlb ? kHugePageSize : page_size());
  STRATA_LOG(Debug, "heap: created " << where(spec) << " at " << static_cast<void*>(seg.base)
                                     << (seg.hugetlb ? " (hugetlb)" : ""));
  return seg;
}

void destroy_segment(OwnSegment& s) {
  if (s.base != nullptr) munmap(s.base, s.size);
  if (s.fd >= 0) close(s.fd);
  s.base = nullptr;
  s.fd = -1;
}

Result<char*> map_peer_segment(int fd, size_t size) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return errno_status("fstat", errno);
  // A file shorter than the announced size would fault with SIGBUS past its end.
  if (st.st_size < 0 || static_cast<size_t>(st.st_size) < size)
    return internal_error("segment fd is " + std::to_string(st.st_size) + " bytes, peer announced " +
                          std::to_string(size));
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return errno_status("mmap", errno);
  char* base = static_cast<char*>(m);
  populate_present(fd, base, size);
  return base;
}

void populate_present(int fd, char* base, size_t size) {
  // The file's data extents come from its page index, skipping holes a whole index node at a
  // time; mincore instead walks every page of the range, ~10 ms per GiB here, paid per peer
  // mapped (a replacement maps every peer, so its join grew with the job).
  off_t at = 0;
  const off_t end = static_cast<off_t>(size);
  while (at < end) {
    const off_t data = lseek(fd, at, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) return;                                          // no data past `at`
      return populate_present(base + at, size - static_cast<size_t>(at));  // no SEEK_DATA here
    }
    if (data >= end) return;
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0 || hole > end) hole = end;
    madvise(base + data, static_cast<size_t>(hole - data), MADV_POPULATE_WRITE);
    at = hole;
  }
}

void populate_present(char* base, size_t size) {
  const size_t page = page_size();
  // mincore in windows keeps its vector small for multi-gigabyte segments.
  constexpr size_t kWindowPages = size_t{1} << 16;
  std::vector<unsigned char> present(kWindowPages);
  for (size_t win = 0; win < size; win += kWindowPages * page) {
    const size_t len = std::min(kWindowPages * page, size - win);
    const size_t pages = (len + page - 1) / page;
    if (mincore(base + win, len, present.data()) != 0) return;
    size_t i = 0;
    while (i < pages) {
      if (!(present[i] & 1)) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < pages && (present[j] & 1)) ++j;
      // Pages that exist stay (the owner never punches holes), so populating them
      // allocates nothing new.
      madvise(base + win + i * page, (j - i) * page, MADV_POPULATE_WRITE);
      i = j;
    }
  }
}

}  // namespace strata::memory

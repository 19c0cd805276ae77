#pragma once
// One rank's shared heap (memfd segments) and its views of the local peers' heaps.
//
// Segments are memfd files mapped MAP_SHARED. A peer obtains a segment's fd from the owner
// over the owner's Unix socket <socket dir>/<job_key>/<rank> (SCM_RIGHTS, fd_channel.hpp) and
// maps it the first time it meets an address in that segment. Nothing touches /dev/shm, and
// memfd leaves nothing behind when a process dies (a killed rank's socket file is taken over
// by its replacement, and removed with the job's directory at the end).
//
// Pages are committed on first touch and never given back while the heap lives: freed
// blocks are recycled, because the first touch of a page is what costs (MEASURED.md).
// Each own segment keeps one fd open (to hand it out later); peers close theirs once mapped.
// The fd grants read/write on the rank's memory, so the socket lives in a directory only this
// user can enter, and both ends check each other's uid (and the client the peer's pid).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/deadline.hpp"
#include "common/env.hpp"
#include "common/status.hpp"

namespace strata::memory {

/// A location inside one rank's heap: (segment id, byte offset). Segment ids are dense
/// and never reused within a heap's lifetime. Id 0 is the symmetric arena on every rank
/// (it exists once alloc_symmetric has been called); regular segments count from 1.
struct SegRef {
  uint32_t seg = 0;
  uint64_t offset = 0;
};

struct HeapOptions {
  size_t segment_size = size_t{1} << 30;    // virtual size of a regular segment
  size_t max_size = size_t{64} << 30;       // limit on the sum of own segment sizes
  size_t symmetric_size = size_t{1} << 30;  // size of the symmetric arena (its own segment)
  bool huge_pages = false;                  // MFD_HUGETLB (falls back with a warning)
  bool prefault = false;                    // touch every page when a segment is created
  std::string socket_dir;                   // where the fd sockets live (empty: fd_socket_dir's default)
  static HeapOptions from_env(const Env& e);
};

/// Most segments one heap may own (regular, dedicated and symmetric together); peers'
/// mapping tables are sized by it so that the lookup needs no lock.
inline constexpr uint32_t kMaxSegments = 4096;
/// Ranks a heap can address as peers (peer_ptr / peer_pid).
inline constexpr int kMaxPeers = 65536;
/// Largest alignment alloc() and alloc_symmetric() accept; segment bases are aligned to it,
/// so symmetric offsets do not depend on where each rank's arena happens to be mapped.
inline constexpr size_t kMaxAlignment = size_t{2} << 20;

/// Thread-safe.
class Heap {
 public:
  /// Creates the heap (no segment yet) and starts the fd server thread.
  static Result<std::unique_ptr<Heap>> create(const HeapOptions& opts, const std::string& job_key, int rank);
  ~Heap();
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  int rank() const;

  /// Local, non-collective allocation. Memory is zero on first use of a page and is never
  /// returned to the kernel while the heap lives (pages are recycled: first touch is slow).
  /// Large requests (over half a segment) get a segment of their own when no free block fits.
  /// `alignment` must be a power of two up to kMaxAlignment; below 64 it is raised to 64.
  /// bytes == 0 gives a valid, unique 64-byte block (as malloc(0) may), to be freed as usual.
  /// Unavailable when STRATA_HEAP_MAX_SIZE would be exceeded.
  Result<void*> alloc(size_t bytes, size_t alignment = 64);
  /// Frees a block from alloc(). InvalidArgument for a pointer that alloc() did not return
  /// (or already freed); free(nullptr) is a no-op.
  Status free(void* p);

  /// Allocation in the symmetric arena. The arena's allocator is deterministic: the same
  /// sequence of alloc_symmetric/free_symmetric calls gives the same offsets on every rank,
  /// which the caller (a collective) verifies.
  Result<void*> alloc_symmetric(size_t bytes, size_t alignment = 64);
  Status free_symmetric(void* p);
  /// Segment id of the symmetric arena: always 0, the same on every rank.
  uint32_t symmetric_segment() const;

  /// Where [p, p+bytes) lies in this heap; nullopt when it is not entirely inside one
  /// of this heap's segments.
  std::optional<SegRef> locate(const void* p, size_t bytes) const;

  /// Address of [ref.offset, ref.offset + bytes) in `peer`'s segment ref.seg, mapping the
  /// segment first if needed (fd fetched from the peer's socket, retried until deadline).
  /// Fast once mapped (no lock on the hit path). InvalidArgument if the range is outside
  /// the segment; Unavailable/Timeout if the peer cannot be reached. peer == rank() resolves
  /// in this heap's own segments, so callers may treat every rank alike.
  Result<void*> peer_ptr(int peer, SegRef ref, size_t bytes, Deadline deadline);

  /// Takes [base, base + size) as the mapping of segment `seg` of `peer`, made beforehand
  /// (map_peer_segment of a descriptor fetched from the process `pid`), so that its first
  /// peer_ptr needs neither a fetch nor the mapping's population. The heap owns the mapping
  /// from then on, and unmaps it here when refused: when the segment is mapped already, or
  /// (PeerFailed) when `pid` is not the process expect_peer_pid named for `peer`.
  Status adopt_peer_segment(int peer, uint32_t seg, char* base, size_t size, pid_t pid);

  /// Process id of a peer, learned when its first segment was fetched (0 before).
  pid_t peer_pid(int peer) const;

  /// The pid the store published for `peer`: its fd server must be that process, or a fetch
  /// fails with PeerFailed. Without it the first server's pid is learned and then required
  /// until drop_peer.
  void expect_peer_pid(int peer, pid_t pid);

  /// Unmaps everything of `peer` and forgets its pid (used when a failed peer is replaced).
  void drop_peer(int peer);

  /// Told about every own segment: the existing ones at once, later ones as they are created
  /// (registration on allocation, e.g. ucp_mem_map). Runs under the heap's segment lock, so
  /// it must not call back into the heap. An empty function removes the listener.
  using SegmentListener = std::function<void(uint32_t id, void* base, size_t size)>;
  void set_segment_listener(SegmentListener listener);

  /// Sum of own segment sizes.
  size_t reserved_bytes() const;

  /// The live heap in this process whose own segments contain `p`, or nullptr. Lets error
  /// messages say "this buffer belongs to another communicator's heap". A shared lock on a
  /// process-wide map: fine for error paths and checks, not meant per element.
  static const Heap* find_owner(const void* p);

  struct Impl;

 private:
  explicit Heap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// True when this process can read `bytes` at `remote` in process `pid` with
/// process_vm_readv (the CMA probe). Used once per peer at communicator init.
bool cma_probe(pid_t pid, const void* remote, size_t bytes);
/// process_vm_readv / process_vm_writev of one contiguous range, looping over partial
/// transfers. PeerFailed when the process is gone.
Status cma_read(pid_t pid, const void* remote, void* local, size_t bytes);
Status cma_write(pid_t pid, void* remote, const void* local, size_t bytes);

}  // namespace strata::memory

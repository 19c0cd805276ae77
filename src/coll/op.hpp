#pragma once
// The internal description of one operation and its wire form in shared memory.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <strata/strata.hpp>

namespace strata::coll {

enum class OpKind : uint8_t {
  AllReduce,
  Reduce,
  Broadcast,
  AllGather,
  AllGatherV,
  ReduceScatter,
  ReduceScatterV,
  AllToAll,
  AllToAllV,
  Gather,
  Scatter,
  Barrier,
  Send,
  Recv,
  Internal
};
const char* to_string(OpKind k);
inline bool reducing(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::Reduce || k == OpKind::ReduceScatter || k == OpKind::ReduceScatterV;
}
inline bool rooted(OpKind k) {
  return k == OpKind::Reduce || k == OpKind::Broadcast || k == OpKind::Gather || k == OpKind::Scatter;
}
/// Kinds whose `count` is meaningful (v-collectives carry arrays instead).
inline bool has_count(OpKind k) {
  return k != OpKind::AllGatherV && k != OpKind::ReduceScatterV && k != OpKind::AllToAllV && k != OpKind::Barrier;
}

/// In `root` of an operation that has none: who issued it. A user's call has kRootNone; the
/// exchanges inside split and alloc_symmetric (all_gathers) have their own values, so that a
/// peer that called all_gather of the same size meanwhile fails as a mismatch naming them
/// rather than trading records with them.
inline constexpr int kRootNone = -1;
inline constexpr int kRootSplitExchange = -2;
inline constexpr int kRootSymmetricExchange = -3;
/// A barrier in the place of a call this rank refused (its arguments were invalid): peers that
/// meet it fail their call naming this rank, instead of waiting for it until the timeout.
inline constexpr int kRootRefused = -4;
/// Whether a peer's descriptor is the barrier in the place of a call it refused, or, across
/// hosts, that barrier's exchange within its host (coll/net/run.cpp, host_gather).
inline bool refused(OpKind kind, int root) { return root == kRootRefused && !rooted(kind); }
/// The call an internal exchange serves ("split", "alloc_symmetric"), from its `root`; null
/// for a user's call or a rooted kind.
const char* exchange_of(OpKind kind, int root);

/// One operation as issued by the caller.
struct Op {
  OpKind kind = OpKind::Barrier;
  DataType dtype = DataType::UInt8;
  ReduceOp rop = ReduceOp::Sum;
  int root = kRootNone;
  int peer = -1;
  int tag = 0;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;             // elements (meaning depends on kind, see Communicator)
  std::vector<size_t> counts;   // all_gather_v / reduce_scatter_v block counts; a2av send counts
  std::vector<size_t> sdispls;  // a2av send displacements
  std::vector<size_t> rcounts;  // a2av recv counts
  std::vector<size_t> rdispls;  // a2av recv displacements
  CollOptions opts;
};

/// Published by every rank before a collective and compared by every peer. 48 bytes, so it
/// shares one cache line with the phase counter that announces it.
struct OpDesc {
  uint32_t seq = 0;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t rop = 0;
  uint8_t algo = 0;
  int32_t root = -1;
  uint32_t flags = 0;  // kHasIn / kHasOut
  uint64_t count = 0;
  uint32_t in_seg = 0, out_seg = 0;
  uint64_t in_off = 0, out_off = 0;
  static constexpr uint32_t kHasIn = 1, kHasOut = 2;
  // The buffer is registered external memory: *_off holds its address in the owner's
  // process, read and written with process_vm_readv/writev.
  static constexpr uint32_t kInCma = 4, kOutCma = 8;
  // Within a host: the input is staged in rounds (coll/shm/pipe.cpp, and two-shot
  // all_reduce's rounds in two_shot.cpp); in_seg/in_off name the slots. (16 is
  // descriptor.hpp's kOutHeap, used between hosts.)
  static constexpr uint32_t kInPiped = 32;
  // Within a host: the input lies in the owner's operation slot (OpSlot::inline_data), over
  // in_seg and the fields after it, which the owner then does not publish.
  static constexpr uint32_t kInSlot = 64;
  // Within a host, two-shot all_reduce: this rank's output is an external buffer peers
  // cannot write; out_seg/out_off name the heap slots where they leave its reduced pieces
  // for it to copy out, round by round (two_shot.cpp).
  static constexpr uint32_t kOutLanding = 1024;
  // Within a host: this rank's process runs with STRATA_PUSH=pull. Published, because the
  // number of synchronisations depends on it and every rank must choose alike.
  static constexpr uint32_t kNoPush = 2048;
};
static_assert(sizeof(OpDesc) == 48);

/// "all_reduce(count=8, dtype=float32, op=sum)" for error messages.
std::string describe(const OpDesc& d);

/// Bytes one rank reads from `in` and writes to `out` during an operation.
struct Extent {
  size_t in = 0, out = 0;
};
/// The extent of `op` on rank `rank` of a communicator of `size` ranks.
Extent extent(const Op& op, int rank, int size);

/// Whether [a, a + na) and [b, b + nb) share a byte.
inline bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  if (!na || !nb) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

}  // namespace strata::coll

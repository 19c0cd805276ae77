#pragma once
// The layout of a communicator's control block: the per-rank area in the shared heap through
// which the ranks of one host synchronise, publish their operations and hand over
// point-to-point messages. Every member maps every other member's block.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "coll/flight.hpp"
#include "coll/op.hpp"
#include "transport/shm_sync.hpp"

namespace strata::detail {

/// Written last when a block is initialised: a peer that maps a block without it is too early.
/// Its last digit is the layout's version: processes of builds with another layout (the slots
/// grew in version 2, inline input moved over the descriptor's buffer fields in 3, the slots
/// grew to hold a small external input in 4) refuse each other's blocks instead of misreading
/// them.
inline constexpr uint64_t kCtrlMagic = 0x3743544152545353ull;  // "SSTRATC7"
/// Point-to-point messages in flight per (sender, receiver) pair: the ring of P2pSlot.
inline constexpr uint32_t kP2pDepth = 8;

/// One posted send, as the receiver reads it: the message's sequence number, tag, type, count
/// and where its bytes lie in the sender's heap.
struct P2pSlot {
  uint32_t seq = 0;
  int32_t tag = 0;
  uint8_t dtype = 0;
  uint8_t pad[7] = {};
  uint64_t count = 0;
  uint32_t seg = 0;
  // Who settled the message first (through std::atomic_ref; 0 when posted): the receiver, which
  // claims it before copying, or the sender, which withdraws it when its send fails (a timeout,
  // abort()), so that no receive copies a buffer the caller may be reusing by then.
  uint32_t claim = 0;
  uint64_t off = 0;
};
/// P2pSlot::claim values. kP2pRefused: the receiver claimed the message and found it did not
/// match its receive; it stays in the slot, where the sender reads it (a word per pair was
/// overwritten by the next refusal before the sender looked, and that send passed as received).
inline constexpr uint32_t kP2pClaimed = 1, kP2pWithdrawn = 2, kP2pRefused = 3;

/// Largest all_reduce input (bytes per rank) that travels inline in the control block
/// (shm/inline.cpp: one cache-line handshake, no heap buffer read). Above it one-shot's
/// direct reads of the peers' buffers win.
inline constexpr size_t kInlineBytes = 512;
/// The same limit with more than 2 ranks. There one-shot's closing synchronisation costs more
/// than copying the input into the slot: the slowest of n ranks arrives at every step, and on
/// a host with fewer cores than ranks every step may wait for a rank to be scheduled (3 ranks
/// on 2 cores, 1/2/4 KiB: 4.8/5.5/6.0 against 7.2/7.4/7.4 us one-shot; 8 ranks: 15-20 against
/// 24-28; 8 KiB: equal).
inline constexpr size_t kInlineManyBytes = 4096;
static_assert(kInlineManyBytes >= kInlineBytes);
/// all_gather, all_to_all and reduce_scatter travel inline while count x ranks x element size
/// (what a rank reads from the slots; also the largest input per rank) is at most this. One
/// synchronisation instead of two, and external buffers need no staging; but the slots are
/// read just after their owners wrote them, which on this machine kind costs more than the
/// direct form's reads of heap inputs from 4 KiB on (2 ranks, all_gather of 2 KiB per rank:
/// 1.3 against 1.1 us; at 2 KiB read all forms are equal on the heap, external buffers
/// 1.1-1.2 against 1.3-1.5 us).
inline constexpr size_t kInlineCopyBytes = 2048;
static_assert(kInlineCopyBytes >= kInlineBytes);
/// An external (or registered but staged) input of at most this many bytes rides in its
/// owner's slot in the direct forms too (shm/run.cpp): each rank decides for its own input and
/// flags it (OpDesc::kInSlot), so heap and external buffers can meet in one call. That
/// replaces a copy into heap scratch, which the peers would read just as soon after it was
/// written, and when every rank's input rides so, the closing synchronisation as well.
inline constexpr size_t kSlotInputBytes = 8192;
static_assert(kSlotInputBytes >= kInlineCopyBytes);

/// The fields of an OpDesc that an inline operation publishes: everything up to the buffer
/// references, which it has none of (its input travels in the slot).
inline constexpr size_t kInlineDescBytes = offsetof(coll::OpDesc, in_seg);

/// One operation's synchronisation word, descriptor and, for an inline operation, input. Two
/// per rank, used by alternate sequence numbers. `ready` carries the rank's sync steps
/// (CommImpl::phase) during the operation; the first step publishes the descriptor. Slot
/// s % 2 is rewritten only at operation s + 2, after every peer has passed the first step of
/// s + 1, so no peer still reads it; and a rank waiting on a peer's slot for s is never
/// overtaken by that peer's writes for s + 2.
struct alignas(64) OpSlot {
  transport::Signal ready;
  coll::OpDesc desc;
  unsigned char tail[8 + kSlotInputBytes];  // the rest of an inline input (see inline_data)
  /// Where an inline operation's input starts: over the descriptor's buffer references, so
  /// that up to 32 bytes share the cache line of `ready` and the descriptor's head, and a
  /// peer's all_reduce of up to 8 floats costs one miss (with the input after the whole
  /// descriptor, 16 bytes and more took a second, serial miss: 0.73 against 0.58 us).
  unsigned char* inline_data() { return reinterpret_cast<unsigned char*>(&desc) + kInlineDescBytes; }
  const unsigned char* inline_data() const { return reinterpret_cast<const unsigned char*>(&desc) + kInlineDescBytes; }
};
/// Bytes of inline input a slot holds.
inline constexpr size_t kInlineSlotBytes = sizeof(OpSlot) - offsetof(OpSlot, desc) - kInlineDescBytes;
static_assert(offsetof(OpSlot, desc) + kInlineDescBytes == 32, "32 bytes of inline input share the first line");
static_assert(kInlineSlotBytes >= kSlotInputBytes);
static_assert(kInlineSlotBytes >= kInlineManyBytes);

/// The start of a control block: who owns it, and the two operation slots.
struct alignas(64) CtrlHeader {
  uint64_t magic = 0;
  int32_t rank = 0;
  int32_t size = 0;
  int32_t pid = 0;
  uint64_t self_addr = 0;  // the block's address in its owner's address space (CMA probe)
  uint32_t cma_ok = 0;     // owner could read every peer with process_vm_readv
  /// Entries of the owner's flight-recorder ring, which follows the block (CtrlView::flight):
  /// a peer that times out waiting for this rank reads what it is doing there.
  uint32_t flight_len = 0;
  /// Bumped by the owner each time it restarts its signals for a recovery epoch: a sender
  /// waiting for the acknowledgement of a message this rank claimed learns from it that the
  /// receive is over (its acknowledgement was wiped with the rest).
  uint32_t resets = 0;
  OpSlot slots[2];
  /// The slot of operation `seq`.
  OpSlot& slot(uint32_t seq) { return slots[seq & 1]; }
};

/// Typed view of a control block: header, then 4n size_t (v-collective arrays), then the
/// point-to-point area (per peer: posted signal, done signal, done-with flag, ring of slots).
class CtrlView {
 public:
  CtrlView() = default;
  CtrlView(void* base, int n) : base_(static_cast<char*>(base)), n_(n) {}
  /// Size of the block of a communicator of n ranks.
  static size_t bytes(int n) { return p2p_offset(n) + static_cast<size_t>(n) * per_peer(); }
  CtrlHeader* hdr() const { return reinterpret_cast<CtrlHeader*>(base_); }
  /// The v-collective arrays (counts and displacements of every rank).
  uint64_t* vec() const { return reinterpret_cast<uint64_t*>(base_ + sizeof(CtrlHeader)); }
  /// Raised by this block's owner when it posts a send to `peer`.
  transport::Signal& send_posted(int peer) const { return *reinterpret_cast<transport::Signal*>(peer_area(peer)); }
  /// Raised by this block's owner when it has received a message from `peer`.
  transport::Signal& recv_done(int peer) const { return *reinterpret_cast<transport::Signal*>(peer_area(peer) + 64); }
  /// Set by `peer` when it destroys its communicator of this block, its last touch of it;
  /// cleared by the owner when it attaches a replacement of `peer`. Once every peer's is set
  /// the owner frees the block (a comm destroyed after each split left its block behind for
  /// good, 42 KiB a time). One flag per peer, not a count: a rank that finished and was
  /// replaced must not count for a peer still inside its last operation.
  std::atomic<uint32_t>& done_with(int peer) const {
    return *reinterpret_cast<std::atomic<uint32_t>*>(peer_area(peer) + 128);
  }
  /// The slot of this owner's send `seq` to `peer`.
  P2pSlot& slot(int peer, uint32_t seq) const {
    return reinterpret_cast<P2pSlot*>(peer_area(peer) + 192)[seq % kP2pDepth];
  }
  void* base() const { return base_; }
  /// The owner's flight-recorder ring (hdr()->flight_len entries), right after the block.
  FlightEntry* flight() const { return reinterpret_cast<FlightEntry*>(base_ + bytes(n_)); }
  /// Bytes of a block of n ranks with a ring of `flight_len` entries.
  static size_t bytes_with_flight(int n, uint32_t flight_len) {
    return bytes(n) + static_cast<size_t>(flight_len) * sizeof(FlightEntry);
  }

 private:
  static size_t align64(size_t v) { return (v + 63) & ~size_t{63}; }
  static size_t p2p_offset(int n) {
    return align64(sizeof(CtrlHeader) + 4 * sizeof(uint64_t) * static_cast<size_t>(n));
  }
  static size_t per_peer() { return align64(192 + kP2pDepth * sizeof(P2pSlot)); }
  char* peer_area(int peer) const { return base_ + p2p_offset(n_) + static_cast<size_t>(peer) * per_peer(); }
  char* base_ = nullptr;
  int n_ = 0;
};

}  // namespace strata::detail

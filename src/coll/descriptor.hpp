#pragma once
// Descriptors that arrive from peers, and what this rank checks before it uses any number in
// them: the comparison of a peer's call with this rank's (every transport), the first message
// of a cross-host operation (descriptor, count vector, eager data) and the header of a
// cross-host send. Pure functions of the bytes received, so the fuzzer (tests/fuzz/) and the
// unit tests drive them without a network.

#include <cstddef>
#include <cstdint>
#include <functional>

#include "coll/op.hpp"
#include "common/status.hpp"

namespace strata::detail {

/// Set in a descriptor exchanged between hosts (beside OpDesc's own flags): the rank's output
/// is in its heap at (out_seg, out_off), so peers may put into it.
inline constexpr uint32_t kOutHeap = 16;

/// Set in a descriptor exchanged between hosts: the ranks on the sender's host called
/// different operations (found by the host round, coll/net/run.cpp); in_seg and in_off then
/// hold two of them (comm ranks, or -1 when the check could not tell which).
inline constexpr uint32_t kHostMismatch = 128;

/// Set in a descriptor exchanged between hosts: the sender found, when this operation started,
/// that an earlier one did not match on every rank (it had not waited for the other hosts'
/// descriptors, see CommImpl::LateCheck), so this operation fails on every rank; in_seg holds
/// the comm rank that found it, in_off that operation's sequence number.
inline constexpr uint32_t kLateMismatch = 256;

/// Set in a broadcast root's descriptor exchanged between hosts: its input is in its heap at
/// (in_seg, in_off), where the other ranks of its host read their blocks to send them on
/// (coll/net/hierarchical.cpp, broadcast_hier).
inline constexpr uint32_t kInHeap = 512;

/// In a kHostMismatch descriptor's in_off (where the second rank of the pair goes): the rank in
/// in_seg refused its call (coll::kRootRefused) rather than calling another one.
inline constexpr int kPairRefused = -2;

/// The error of operation `mine` on rank `me` when rank r refused its call there (its
/// arguments were invalid): InvalidArgument naming r, on every rank but r.
Status refused_mismatch(const coll::OpDesc& mine, int me, int r);
/// Whether `s` is refused_mismatch's error (as a local exchange reports it).
bool is_refusal(const Status& s);

/// The error of operation `mine` on rank `me` when rank `finder` (reported by rank r) flagged
/// it kLateMismatch, finding operation #seq mismatched: InvalidArgument naming both and #seq.
Status late_mismatch(const coll::OpDesc& mine, int me, int finder, uint64_t seq, int r);

/// Compares peer r's descriptor `d` (and its count vector `vec` for v-collectives, when
/// known) with this rank's (`me`, `mine`, `op`) in a communicator of n ranks: ok, or
/// InvalidArgument naming both ranks and both calls.
Status compare_descriptor(const coll::Op& op, const coll::OpDesc& mine, int me, const coll::OpDesc& d,
                          const uint64_t* vec, int r, int n);

/// all_to_all_v, once every descriptor matched: rank r's n send counts (`sends(r)`) against
/// what each receiver j expects from it (`recvs(j)[r]`), for every pair, this rank's own
/// block included. Every rank checks every pair in the same order, so all of them fail after
/// the same step and name the same pair; a rank whose own counts disagree is named too.
Status check_all_to_all_v_counts(const coll::OpDesc& mine, int me, int n,
                                 const std::function<const uint64_t*(int)>& sends,
                                 const std::function<const uint64_t*(int)>& recvs);

/// InvalidArgument naming both ranks and patterns when peer r runs this rank's operation (same
/// kind and sequence, as in `d`) with another algorithm than `mine`, else ok.
Status compare_algorithm(const coll::OpDesc& mine, int me, const coll::OpDesc& d, int r);

/// Bytes of the longest first message any member of a communicator of n ranks, `local_size` on
/// each host, may send: a descriptor with n counts (the v-forms, never eager), or with eager
/// data for one peer or a whole host's inputs (coll/net/run.cpp's host round). A receive area
/// of this size reads any of them whole.
size_t longest_first_message(int n, int local_size);

/// Bytes of the record that opens every first message of `kind` in a communicator of n
/// ranks: the descriptor, then first_message_words(kind, n) counts.
size_t first_message_head(coll::OpKind kind, int n);
/// The counts after the descriptor: n for the v-collectives (all_to_all_v: the n send counts,
/// then the n receive counts), none for the others.
size_t first_message_words(coll::OpKind kind, int n);

/// Reads peer r's first message of an operation across hosts: `len` bytes arrived in all, of
/// which the first min(len, first_message_head) are at `record`; `eager_bytes` is the data
/// this rank expects after the record. Checks it against this rank's call (`op`, `mine`, rank
/// `me` of n): the descriptor's size, the algorithm, compare_descriptor, the message length,
/// and the fields later steps use (flags, the output offset peers put at). Returns the peer's
/// descriptor, or InvalidArgument naming rank r and what is wrong.
Result<coll::OpDesc> read_first_message(const coll::Op& op, const coll::OpDesc& mine, int me, int n, int r,
                                        const void* record, size_t len, size_t eager_bytes);

/// The record that opens a point-to-point message across hosts.
struct P2pHeader {
  int32_t tag = 0;
  uint32_t dtype = 0;
  uint64_t count = 0;
};

/// "send(count=.., dtype=.., tag=..)" for error messages (`name`: "send" or "recv").
std::string p2p_describe(const char* name, const P2pHeader& h);

/// The data bytes peer `peer`'s header announces. InvalidArgument naming the peer when its
/// dtype is not one Strata sends or count × dtype size does not fit in 64 bits.
Result<size_t> p2p_data_bytes(const P2pHeader& h, int peer);

}  // namespace strata::detail

#pragma once
// The one place that chooses the algorithm a collective runs: one enum naming every
// algorithm, one function, and in select.cpp one table holding every rule with its
// threshold and the reason for it.

#include <cstddef>
#include <cstdint>

#include "coll/op.hpp"

namespace strata::detail {
struct CommImpl;
}

namespace strata::coll {

/// Every algorithm a collective can run. The value travels in OpDesc::algo, so that ranks
/// which would run different algorithms report a mismatch instead of waiting for each other.
enum class Algo : uint8_t {
  Single = 0,       // the kind has one algorithm on its transport (broadcast, all_to_all, ...)
  Inline,           // shm: the input rides in the control block next to the descriptor
  OneShot,          // shm all_reduce: every rank reads every input and reduces all of it
  TwoShot,          // shm all_reduce: direct reduce-scatter, then direct all-gather
  NetEager,         // across hosts: the data travels with the descriptor, one network round
  NetDirect,        // across hosts: a direct pattern between all members
  NetHierarchical,  // across hosts: an intra-host step over shm, then rails / one rank per host
};

/// "one_shot", "net_eager", ... for error messages and logs.
const char* to_string(Algo a);

/// Bytes per peer up to which an operation across hosts travels with its descriptor (and a
/// send with its header). Measured at 2 hosts x 2 ranks (docs/PERFORMANCE_MULTIHOST.md):
/// eager all_reduce wins up to 16 KiB, beyond which the hierarchical pattern's smaller
/// cross-host messages win.
inline constexpr size_t kEagerBytes = size_t{16} << 10;

/// What the choice depends on besides the call: the communicator's shape, never its state.
/// Every member sees the same shape, so every member chooses alike.
struct Shape {
  int size = 1;                  // members
  bool spans_hosts = false;      // members on more than one host (the network carries data)
  int hosts = 1;                 // hosts the members are on
  int local_size = 1;            // members on this rank's host
  bool even_hosts = true;        // every host holds as many members as every other
  bool contiguous_hosts = true;  // host h holds comm ranks h*L .. h*L+L-1
  bool shared_host = false;      // some host holds more than one member
  size_t oneshot_max_bytes = 0;  // STRATA_ONESHOT_MAX_BYTES
};

/// The shape of communicator `c`.
Shape shape_of(const detail::CommImpl& c);

/// An algorithm and the rule that chose it.
struct Selection {
  Algo algo = Algo::Single;
  const char* reason = "";  // the rule, as written in select.cpp's table
};

/// The algorithm `op` runs on a communicator of shape `s`: the first rule of the table that
/// applies. Depends only on fields every rank's descriptor must agree on (kind, count,
/// dtype, CollOptions::algorithm) and on the shape.
Selection select_algorithm(const Shape& s, const Op& op);

}  // namespace strata::coll

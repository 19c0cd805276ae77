#pragma once
// Rebuilding the world communicator after a failure (rebuild.cpp).

#include "coll/membership.hpp"
#include "common/status.hpp"

namespace strata::detail {

/// Rebuilds the world communicator in the newest epoch: survivors keep everything that did
/// not touch a failed rank. `fresh`: attach every peer (a replacement joining for the first
/// time, or a rank of the first epoch whose setup a failure interrupted). The caller
/// holds the lock Membership::quiesce returned.
Status rebuild_world(Membership& m, bool fresh, int suspect = -1);

}  // namespace strata::detail

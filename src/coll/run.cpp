// Where every collective starts: refuse a broken communicator, select the algorithm
// (coll/select.cpp), and hand the operation to the shared-memory or the network side.

#include "coll/comm_impl.hpp"
#include "coll/net/exec.hpp"
#include "coll/select.hpp"
#include "coll/shm/exec.hpp"

namespace strata::detail {

Status run_collective(CommImpl& c, coll::Op& op, uint64_t queued) {
  if (Status b = c.broken(); !b.is_ok()) {
    if (queued) flight_end(c, queued, b);  // never started: the queued entry fails
    return b;
  }
  const coll::Algo algo = coll::select_algorithm(coll::shape_of(c), op).algo;
  // Both sides number the operation c.seq + 1 (under exec_mu, nothing else runs meanwhile).
  const uint64_t h = flight_begin(c, op, c.seq + 1, queued);
  Status st = c.net ? net::run(c, op, algo) : shm::run(c, op, algo);
  if (st.code() == Code::Aborted) {
    // A revocation records its cause before it raises the abort flag that woke this wait:
    // report the cause (PeerFailed, naming the failed rank), which is what a caller recovers
    // on, rather than the mechanism. A user's abort() leaves Aborted as the cause.
    Status cause = c.broken();
    if (!cause.is_ok() && cause.code() != Code::Aborted)
      st = Status(cause.code(), st.message() + "; " + cause.message(), cause.peer());
  }
  flight_end(c, h, st);
  return st;
}

}  // namespace strata::detail

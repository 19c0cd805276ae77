// Where every collective starts: refuse a broken communicator, select the algorithm
// (coll/select.cpp), and hand the operation to the shared-memory or the network side.

#include "coll/comm_impl.hpp"
#include "coll/net/exec.hpp"
#include "coll/select.hpp"
#include "coll/shm/exec.hpp"

namespace strata::detail {

Status run_collective(CommImpl& c, coll::Op& op) {
  STRATA_RETURN_IF_ERROR(c.broken());
  const coll::Algo algo = coll::select_algorithm(coll::shape_of(c), op).algo;
  return c.net ? net::run(c, op, algo) : shm::run(c, op, algo);
}

}  // namespace strata::detail

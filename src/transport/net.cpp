// What the transport layer offers in a build without UCX.

#include "transport/net.hpp"

namespace strata::transport {

#if !STRATA_HAVE_UCX
std::string ucx_summary(const Env&) {
  return "no (not built with UCX: install libucx-dev and configure with -DSTRATA_WITH_UCX=ON)";
}
#endif

}  // namespace strata::transport

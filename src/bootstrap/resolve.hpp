#pragma once
// Name resolution with a deadline. getaddrinfo has no timeout of its own (a dead DNS server
// stalls it for resolv.conf's timeout × attempts × servers, often 30 s or more), and a wait
// without a deadline breaks the rule every wait in Strata follows.

#include <netdb.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"

namespace strata::bootstrap {

/// One address getaddrinfo returned, copied out of its list.
struct ResolvedAddress {
  int family = 0;
  int socktype = 0;
  int protocol = 0;
  sockaddr_storage addr{};
  socklen_t len = 0;
};

/// Resolves host:port for a TCP socket (`passive`: an address to bind; an empty host then
/// means every interface). Unavailable when the name does not resolve, Timeout when
/// resolution is still running at `deadline` (it finishes on its own thread and is dropped).
Result<std::vector<ResolvedAddress>> resolve(const std::string& host, uint16_t port, bool passive,
                                             const Deadline& deadline);

/// Whether `host` is a numeric IPv4 or IPv6 address (no resolution needed).
bool is_numeric_host(const std::string& host);

namespace testing {
/// Replaces getaddrinfo (nullptr restores it); lets a test make resolution slow.
using GetAddrInfoFn = int (*)(const char*, const char*, const addrinfo*, addrinfo**);
void set_getaddrinfo(GetAddrInfoFn fn);
}  // namespace testing

}  // namespace strata::bootstrap

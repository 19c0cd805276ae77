// getaddrinfo on a thread of its own, waited for with a deadline. The thread is detached:
// when the deadline passes first, it finishes later and frees the shared state itself.

#include "bootstrap/resolve.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

namespace strata::bootstrap {

namespace {

std::atomic<testing::GetAddrInfoFn> g_getaddrinfo{nullptr};

// getaddrinfo's hints for a stream socket (`passive`: to bind), with `flags` added.
addrinfo stream_hints(bool passive, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | flags | (passive ? AI_PASSIVE : 0);
  return hints;
}

// The addresses of a getaddrinfo result (frees it).
std::vector<ResolvedAddress> addresses(addrinfo* res) {
  std::vector<ResolvedAddress> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    ResolvedAddress a;
    a.family = ai->ai_family;
    a.socktype = ai->ai_socktype;
    a.protocol = ai->ai_protocol;
    a.len = static_cast<socklen_t>(std::min<size_t>(ai->ai_addrlen, sizeof a.addr));
    std::memcpy(&a.addr, ai->ai_addr, a.len);
    out.push_back(a);
  }
  if (res) ::freeaddrinfo(res);
  return out;
}

// What the resolving thread hands back.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int gai = 0;
  std::vector<ResolvedAddress> out;
};

}  // namespace

void testing::set_getaddrinfo(GetAddrInfoFn fn) { g_getaddrinfo.store(fn); }

bool is_numeric_host(const std::string& host) {
  in6_addr buf;
  return ::inet_pton(AF_INET, host.c_str(), &buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
}

Result<std::vector<ResolvedAddress>> resolve(const std::string& host, uint16_t port, bool passive,
                                             const Deadline& deadline) {
  std::string port_str = std::to_string(port);
  // A numeric address asks nothing of a name service: converted here, it never times out (a
  // deadline nearly spent would otherwise report a refused connection as a slow resolver).
  if (is_numeric_host(host)) {
    const addrinfo hints = stream_hints(passive, AI_NUMERICHOST);
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (gai != 0) {
      if (res) ::freeaddrinfo(res);
      return unavailable("cannot use address '" + host + "': " + ::gai_strerror(gai));
    }
    std::vector<ResolvedAddress> out = addresses(res);
    if (out.empty()) return unavailable("'" + host + "' resolved to no address");
    return out;
  }
  auto p = std::make_shared<Pending>();
  auto fn = g_getaddrinfo.load();
  if (!fn) fn = &::getaddrinfo;
  try {
    std::thread([p, host, port_str, passive, fn] {
      const addrinfo hints = stream_hints(passive, 0);
      addrinfo* res = nullptr;
      int gai = fn(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
      std::vector<ResolvedAddress> out = addresses(gai == 0 ? res : nullptr);
      if (gai != 0 && res) ::freeaddrinfo(res);
      std::lock_guard<std::mutex> lock(p->mu);
      p->gai = gai;
      p->out = std::move(out);
      p->done = true;
      p->cv.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    return unavailable(std::string("cannot start a resolver thread: ") + e.what());
  }
  std::unique_lock<std::mutex> lock(p->mu);
  // A never-ending deadline would overflow the clock conversion inside wait_until.
  if (deadline.at() == Deadline::never().at()) p->cv.wait(lock, [&] { return p->done; });
  else if (!p->cv.wait_until(lock, deadline.at(), [&] { return p->done; }))
    return timeout_error("resolving '" + host + "' took longer than the deadline");
  if (p->gai != 0) return unavailable("cannot resolve '" + host + "': " + ::gai_strerror(p->gai));
  if (p->out.empty()) return unavailable("'" + host + "' resolved to no address");
  return std::move(p->out);
}

}  // namespace strata::bootstrap

// The store server: one thread running a poll() loop over the listening socket, a wake-up
// eventfd and every client connection. Requests that must wait (Get, Wait) are parked on
// their connection and answered when the keys appear or their deadline passes, so a
// thousand waiting ranks cost a thousand idle sockets, not a thousand threads.

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <charconv>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/store.hpp"
#include "bootstrap/store_wire.hpp"
#include "common/log.hpp"

namespace strata::bootstrap {

namespace {

using Clock = std::chrono::steady_clock;
using wire::Fd;
using wire::Op;
using wire::ReplyCode;

// One client connection. Requests on a connection are handled strictly in order: while a
// request is parked, later frames stay buffered, which keeps replies in request order.
struct Conn {
  Fd fd;
  uint64_t id = 0;
  bool authed = false;
  uint64_t client_id = 0;
  std::string in;
  size_t in_off = 0;
  std::string out;
  size_t out_off = 0;
  bool close_after_flush = false;
  bool dead = false;

  // The parked request, if any.
  bool parked = false;
  Op parked_op = Op::Wait;
  std::vector<std::string> parked_keys;
  Clock::time_point parked_deadline;
  uint64_t park_gen = 0;  // tells a stale waiter-index entry from the current park
};

// A request's dedup record: sequence number and the reply that was sent.
struct LastReply {
  uint64_t seq = 0;
  std::string frame;
};

std::string reply_ok() { return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).frame(); }

std::string reply_error(const std::string& msg) {
  return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Error)).str(msg).frame();
}

std::optional<int64_t> parse_int64(const std::string& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Compares every byte, so the time taken does not tell a prober how much of a guess matched.
bool tokens_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Longer waits than a year are treated as "forever"; this also keeps now + timeout from
// overflowing the clock.
Clock::time_point deadline_from_ms(int64_t ms) {
  constexpr int64_t kMaxMs = int64_t{365} * 24 * 3600 * 1000;
  return Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, kMaxMs));
}

}  // namespace

struct StoreServer::Impl {
  Fd listen_fd;
  Fd wake_fd;
  std::string token;
  uint16_t port = 0;
  std::string bind_desc;
  std::thread thread;

  std::mutex stop_mu;
  bool stopped = false;

  // Owned by the loop thread once it runs.
  uint64_t next_conn_id = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::map<std::string, std::string> data;  // ordered so list/delete_prefix walk a range
  std::unordered_map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> waiters;
  std::deque<uint64_t> ready;  // parked connections whose keys may all exist now
  std::unordered_map<uint64_t, LastReply> last_reply;
  Clock::time_point accept_paused_until{};

  void loop();
  void accept_all();
  void on_readable(Conn& c);
  void flush(Conn& c);
  void send(Conn& c, std::string frame);
  void pump(Conn& c);
  void handle_hello(Conn& c, std::string_view payload);
  void handle_request(Conn& c, std::string_view payload);
  std::string execute(Conn& c, Op op, wire::Reader& r, bool& parked);
  void park(Conn& c, Op op, std::vector<std::string> keys, int64_t timeout_ms);
  void register_waiter(const Conn& c);
  void unregister_waiter(const Conn& c);
  bool all_present(const Conn& c) const;
  void answer_parked(Conn& c, bool timed_out);
  void key_created(const std::string& key);
  void process_ready();
  void expire_parked();
  void close_conn(Conn& c);
};

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& bind_host, uint16_t port,
                                                        std::string token) {
  auto impl = std::make_unique<Impl>();
  impl->token = std::move(token);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int gai = ::getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0)
    return invalid_argument("store: cannot resolve bind address '" + bind_host + "': " + ::gai_strerror(gai));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);

  Status last = unavailable("no address to bind");
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = errno_status("socket", errno);
      continue;
    }
    // A restarted store must rebind its port while the old connections sit in TIME_WAIT.
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = errno_status("bind", errno);
      continue;
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      last = errno_status("listen", errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      last = errno_status("getsockname", errno);
      continue;
    }
    impl->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    impl->listen_fd = std::move(fd);
    break;
  }
  if (!impl->listen_fd.valid())
    return last.with_context("store: cannot listen on " + bind_host + ":" + port_str + ": ");

  impl->wake_fd = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->wake_fd.valid()) return errno_status("eventfd", errno);
  impl->bind_desc = bind_host + ":" + std::to_string(impl->port);

  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->loop(); });
  STRATA_LOG(Info, "store: serving on " << raw->bind_desc);
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { stop(); }

uint16_t StoreServer::port() const { return impl_->port; }

void StoreServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  uint64_t one = 1;
  (void)!::write(impl_->wake_fd.get(), &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  // The loop has closed every connection; closing the listener last means no client can
  // slip into the backlog of a server that will never accept it.
  impl_->listen_fd.reset();
}

void StoreServer::Impl::loop() {
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  for (;;) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd.get(), POLLIN, 0});
    bool accepting = Clock::now() >= accept_paused_until;
    fds.push_back({listen_fd.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    Clock::time_point next_wake = Clock::time_point::max();
    if (!accepting) next_wake = accept_paused_until;
    for (auto& [id, c] : conns) {
      short ev = 0;
      // A parked connection is not read: its next request must wait for this reply anyway,
      // but EOF must still be noticed, which POLLRDHUP/POLLHUP report without reading.
      if (!c->parked && !c->close_after_flush) ev |= POLLIN;
      if (c->out_off < c->out.size()) ev |= POLLOUT;
      ev |= POLLRDHUP;
      fds.push_back({c->fd.get(), ev, 0});
      polled.push_back(c.get());
      if (c->parked) next_wake = std::min(next_wake, c->parked_deadline);
    }
    int timeout = -1;
    if (next_wake != Clock::time_point::max()) timeout = wire::poll_timeout_ms(Deadline(next_wake));

    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      STRATA_LOG(Error, "store: poll failed: " << std::strerror(errno));
      break;
    }
    if (n > 0 && (fds[0].revents & POLLIN)) break;  // stop()
    if (n > 0 && (fds[1].revents & POLLIN)) accept_all();
    for (size_t i = 0; n > 0 && i < polled.size(); ++i) {
      Conn& c = *polled[i];
      short re = fds[i + 2].revents;
      if (c.dead || re == 0) continue;
      if (re & POLLOUT) flush(c);
      if (!c.dead && (re & POLLIN)) on_readable(c);
      // Hang-up of a parked connection (or one we do not read): the client is gone.
      if (!c.dead && (re & (POLLHUP | POLLERR | POLLRDHUP)) && !(re & POLLIN)) close_conn(c);
    }
    process_ready();
    expire_parked();
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->second->dead) it = conns.erase(it);
      else ++it;
    }
  }
  for (auto& [id, c] : conns) c->fd.reset();
  conns.clear();
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection would make poll() report the listener ready again at
        // once; stop looking at it for a moment instead of spinning.
        STRATA_LOG(Warn, "store: accept: " << std::strerror(errno) << "; pausing accepts");
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->fd = Fd(fd);
    c->id = next_conn_id++;
    conns.emplace(c->id, std::move(c));
  }
}

void StoreServer::Impl::on_readable(Conn& c) {
  char buf[64 * 1024];
  // Bounded per wake-up so one busy client cannot starve the others.
  for (int round = 0; round < 16; ++round) {
    ssize_t r = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (r > 0) {
      c.in.append(buf, static_cast<size_t>(r));
      if (static_cast<size_t>(r) < sizeof buf) break;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_conn(c);  // EOF or error
    return;
  }
  pump(c);
}

void StoreServer::Impl::pump(Conn& c) {
  while (!c.dead && !c.parked && !c.close_after_flush) {
    size_t avail = c.in.size() - c.in_off;
    if (avail < 4) break;
    uint32_t n = wire::decode_length(c.in.data() + c.in_off);
    uint32_t limit = c.authed ? wire::kMaxFrameBytes : wire::kMaxHelloBytes;
    if (n > limit) {
      STRATA_LOG(Warn, "store: connection " << c.id << " sent a " << n << "-byte frame; closing it");
      send(c, reply_error("frame too large"));
      c.close_after_flush = true;
      break;
    }
    if (avail < 4 + size_t{n}) break;
    std::string_view payload(c.in.data() + c.in_off + 4, n);
    if (c.authed) handle_request(c, payload);
    else handle_hello(c, payload);
    c.in_off += 4 + size_t{n};
  }
  // Compact once the consumed prefix dominates, so a long-lived connection does not grow.
  if (c.in_off > 0 && c.in_off * 2 >= c.in.size()) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
  if (!c.dead && c.close_after_flush && c.out_off == c.out.size()) close_conn(c);
}

void StoreServer::Impl::handle_hello(Conn& c, std::string_view payload) {
  wire::Reader r(payload);
  uint32_t magic = r.u32();
  uint32_t version = r.u32();
  uint64_t client_id = r.u64();
  std::string token = r.str();
  std::string why;
  if (!r.ok() || magic != wire::kMagic) why = "not a Strata store handshake";
  else if (version != wire::kVersion)
    why = "protocol version " + std::to_string(version) + " is not supported (server speaks " +
          std::to_string(wire::kVersion) + ")";
  else if (token.empty() && !this->token.empty()) why = "missing job token";
  else if (!tokens_equal(token, this->token)) why = "wrong job token";
  if (!why.empty()) {
    STRATA_LOG(Warn, "store: refused connection " << c.id << ": " << why);
    send(c, reply_error(why));
    c.close_after_flush = true;
    return;
  }
  c.authed = true;
  c.client_id = client_id;
  send(c, reply_ok());
}

void StoreServer::Impl::handle_request(Conn& c, std::string_view payload) {
  wire::Reader r(payload);
  Op op = static_cast<Op>(r.u8());
  uint64_t seq = r.u64();
  if (!r.ok()) {
    send(c, reply_error("malformed request"));
    c.close_after_flush = true;
    return;
  }
  // The client re-sends a request whose reply it lost with the same sequence number;
  // replaying the stored reply keeps add/compare_set/del applied exactly once.
  bool dedup = wire::is_mutating(op) && c.client_id != 0;
  if (dedup) {
    auto it = last_reply.find(c.client_id);
    if (it != last_reply.end() && it->second.seq == seq) {
      send(c, it->second.frame);
      return;
    }
  }
  bool parked = false;
  std::string reply = execute(c, op, r, parked);
  if (parked) return;
  if (dedup && !c.close_after_flush) last_reply[c.client_id] = LastReply{seq, reply};
  send(c, std::move(reply));
}

std::string StoreServer::Impl::execute(Conn& c, Op op, wire::Reader& r, bool& parked) {
  auto malformed = [&] {
    c.close_after_flush = true;
    return reply_error("malformed request");
  };
  switch (op) {
    case Op::Set: {
      std::string key = r.str(), value = r.str();
      if (!r.ok()) return malformed();
      auto [it, inserted] = data.insert_or_assign(std::move(key), std::move(value));
      if (inserted) key_created(it->first);
      return reply_ok();
    }
    case Op::Get: {
      std::string key = r.str();
      int64_t timeout_ms = r.i64();
      if (!r.ok()) return malformed();
      auto it = data.find(key);
      if (it != data.end()) return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).str(it->second).frame();
      park(c, op, {std::move(key)}, timeout_ms);
      parked = true;
      return {};
    }
    case Op::TryGet: {
      std::string key = r.str();
      if (!r.ok()) return malformed();
      auto it = data.find(key);
      if (it == data.end()) return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::NotFound)).frame();
      return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).str(it->second).frame();
    }
    case Op::Wait: {
      uint32_t n = r.count(4);
      std::vector<std::string> keys;
      for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.str());
      int64_t timeout_ms = r.i64();
      if (!r.ok()) return malformed();
      std::vector<std::string> missing;
      for (auto& k : keys)
        if (!data.count(k)) missing.push_back(std::move(k));
      if (missing.empty()) return reply_ok();
      park(c, op, std::move(missing), timeout_ms);
      parked = true;
      return {};
    }
    case Op::Add: {
      std::string key = r.str();
      int64_t delta = r.i64();
      if (!r.ok()) return malformed();
      auto it = data.find(key);
      int64_t value = 0;
      if (it != data.end()) {
        auto cur = parse_int64(it->second);
        if (!cur) return reply_error("value of key " + wire::quote_key(key) + " is not an integer");
        value = *cur;
      }
      if (__builtin_add_overflow(value, delta, &value))
        return reply_error("add on key " + wire::quote_key(key) + " overflows int64");
      if (it != data.end()) {
        it->second = std::to_string(value);
      } else {
        auto ins = data.emplace(std::move(key), std::to_string(value)).first;
        key_created(ins->first);
      }
      return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).i64(value).frame();
    }
    case Op::CompareSet: {
      std::string key = r.str(), expected = r.str(), desired = r.str();
      if (!r.ok()) return malformed();
      auto it = data.find(key);
      std::string after;
      if (it == data.end()) {
        if (expected.empty()) {
          auto ins = data.emplace(std::move(key), desired).first;
          key_created(ins->first);
          after = std::move(desired);
        }
      } else if (it->second == expected) {
        it->second = desired;
        after = std::move(desired);
      } else {
        after = it->second;
      }
      return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).str(after).frame();
    }
    case Op::Del: {
      std::string key = r.str();
      if (!r.ok()) return malformed();
      bool existed = data.erase(key) > 0;
      return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).u8(existed ? 1 : 0).frame();
    }
    case Op::List: {
      std::string prefix = r.str();
      if (!r.ok()) return malformed();
      std::vector<const std::string*> keys;
      for (auto it = data.lower_bound(prefix); it != data.end() && it->first.starts_with(prefix); ++it)
        keys.push_back(&it->first);
      wire::Writer w;
      w.u8(static_cast<uint8_t>(ReplyCode::Ok)).u32(static_cast<uint32_t>(keys.size()));
      for (const auto* k : keys) w.str(*k);
      return w.frame();
    }
    case Op::DeletePrefix: {
      std::string prefix = r.str();
      if (!r.ok()) return malformed();
      auto first = data.lower_bound(prefix);
      auto last = first;
      int64_t count = 0;
      while (last != data.end() && last->first.starts_with(prefix)) {
        ++last;
        ++count;
      }
      data.erase(first, last);
      return wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).i64(count).frame();
    }
  }
  return malformed();
}

void StoreServer::Impl::park(Conn& c, Op op, std::vector<std::string> keys, int64_t timeout_ms) {
  c.parked = true;
  c.parked_op = op;
  c.parked_keys = std::move(keys);
  c.parked_deadline = deadline_from_ms(timeout_ms);
  ++c.park_gen;
  register_waiter(c);
}

void StoreServer::Impl::register_waiter(const Conn& c) {
  for (const auto& k : c.parked_keys) {
    if (data.count(k)) continue;
    auto& list = waiters[k];
    std::pair<uint64_t, uint64_t> entry{c.id, c.park_gen};
    if (std::find(list.begin(), list.end(), entry) == list.end()) list.push_back(entry);
  }
}

void StoreServer::Impl::unregister_waiter(const Conn& c) {
  // Without this, waits that time out on keys nobody sets would pile up in the index.
  for (const auto& k : c.parked_keys) {
    auto it = waiters.find(k);
    if (it == waiters.end()) continue;
    std::erase_if(it->second, [&](const auto& e) { return e.first == c.id; });
    if (it->second.empty()) waiters.erase(it);
  }
}

bool StoreServer::Impl::all_present(const Conn& c) const {
  return std::all_of(c.parked_keys.begin(), c.parked_keys.end(),
                     [&](const std::string& k) { return data.count(k) > 0; });
}

void StoreServer::Impl::answer_parked(Conn& c, bool timed_out) {
  c.parked = false;
  unregister_waiter(c);
  if (timed_out) {
    wire::Writer w;
    w.u8(static_cast<uint8_t>(ReplyCode::Timeout));
    std::vector<const std::string*> missing;
    for (const auto& k : c.parked_keys)
      if (!data.count(k)) missing.push_back(&k);
    w.u32(static_cast<uint32_t>(missing.size()));
    for (const auto* k : missing) w.str(*k);
    send(c, w.frame());
  } else if (c.parked_op == Op::Get) {
    send(c, wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).str(data.at(c.parked_keys[0])).frame());
  } else {
    send(c, reply_ok());
  }
  c.parked_keys.clear();
  // Requests that arrived behind the parked one are waiting in the input buffer.
  pump(c);
}

void StoreServer::Impl::key_created(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  for (const auto& [conn_id, gen] : it->second) {
    auto cit = conns.find(conn_id);
    if (cit != conns.end() && cit->second->parked && cit->second->park_gen == gen) ready.push_back(conn_id);
  }
  waiters.erase(it);
}

void StoreServer::Impl::process_ready() {
  // Answering one waiter may run its buffered requests, which may create keys and queue
  // further waiters; the queue (rather than recursion) keeps that flat.
  while (!ready.empty()) {
    uint64_t id = ready.front();
    ready.pop_front();
    auto it = conns.find(id);
    if (it == conns.end()) continue;
    Conn& c = *it->second;
    if (c.dead || !c.parked) continue;
    if (all_present(c)) answer_parked(c, false);
    else register_waiter(c);  // a key it saw created was deleted again before the rest appeared
  }
}

void StoreServer::Impl::expire_parked() {
  auto now = Clock::now();
  for (auto& [id, c] : conns) {
    if (c->dead || !c->parked || c->parked_deadline > now) continue;
    // A key may have been set in the same loop turn; prefer the answer to the timeout.
    answer_parked(*c, !all_present(*c));
  }
  process_ready();
}

void StoreServer::Impl::send(Conn& c, std::string frame) {
  if (c.dead) return;
  if (c.out_off == c.out.size()) {
    c.out = std::move(frame);
    c.out_off = 0;
  } else {
    c.out.append(frame);
  }
  flush(c);
}

void StoreServer::Impl::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_conn(c);
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.close_after_flush) close_conn(c);
}

void StoreServer::Impl::close_conn(Conn& c) {
  if (c.dead) return;
  c.dead = true;
  if (c.parked) unregister_waiter(c);
  c.parked = false;
  c.fd.reset();
}

}  // namespace strata::bootstrap

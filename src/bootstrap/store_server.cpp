// The store server: one thread running a poll() loop over the listening socket, a wake-up
// eventfd and every client connection. Requests that must wait (Get, Wait) are parked on
// their connection and answered when the keys appear or their deadline passes, so a
// thousand waiting ranks cost a thousand idle sockets, not a thousand threads.
//
// Before authentication a peer may be anything, so what it can hold is bounded by
// construction: the server greets each connection with a nonce, closes it when no valid
// hello arrives within the hello timeout, and keeps at most `max_pending` unauthenticated
// connections (a new one drops a random one of them). Without these, idle connections used to pile up
// until accept() failed with EMFILE; the server then paused accepting and a real client sat
// in the listen backlog, its hello unread, until its own deadline.

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/resolve.hpp"
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
  std::string nonce;                 // the challenge sent in the greeting
  Clock::time_point hello_deadline;  // closed if not authenticated by then
  std::string in;
  size_t in_off = 0;
  std::string out;
  size_t out_off = 0;
  bool close_after_flush = false;
  bool dead = false;
  std::string* sink = nullptr;  // StoreProtocolDriver: replies are collected here, not sent

  // The parked request, if any.
  bool parked = false;
  Op parked_op = Op::Wait;
  std::vector<std::string> parked_keys;
  Clock::time_point parked_deadline;
  uint64_t park_gen = 0;  // tells a stale waiter-index entry from the current park
};

// A request's dedup record: sequence number and the reply that was sent, with its place in
// the least-recently-used order.
struct LastReply {
  uint64_t seq = 0;
  std::string frame;
  std::list<uint64_t>::iterator lru;
};

// How long binding waits for its address to resolve.
constexpr std::chrono::seconds kBindResolveTimeout{30};
// New connections accepted per turn of the loop before the open ones are served again.
constexpr int kAcceptBatch = 16;

// The fields of a Wait or GetMany request: its keys and timeout (check r.ok() after).
std::pair<std::vector<std::string>, int64_t> read_keys(wire::Reader& r) {
  uint32_t n = r.count(4);
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.str());
  const int64_t timeout_ms = r.i64();
  return {std::move(keys), timeout_ms};
}

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

// Longer waits than a year are treated as "forever"; this also keeps now + timeout from
// overflowing the clock.
Clock::time_point deadline_from_ms(int64_t ms) {
  constexpr int64_t kMaxMs = int64_t{365} * 24 * 3600 * 1000;
  return Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, kMaxMs));
}

}  // namespace

StoreServerOptions StoreServerOptions::from_env(const Env& env) {
  StoreServerOptions o;
  o.hello_timeout = env.store_hello_timeout;
  o.max_pending = env.store_max_pending;
  o.max_conn_bytes = env.store_max_conn_bytes;
  o.reply_cache_entries = env.store_reply_cache;
  return o;
}

struct StoreServer::Impl {
  Fd listen_fd;
  Fd wake_fd;
  std::string token;
  StoreServerOptions opts;
  uint64_t incarnation = 0;
  uint16_t port = 0;
  std::string bound_host;
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
  std::list<uint64_t> reply_lru;  // client ids, most recent first
  size_t reply_bytes = 0;
  std::atomic<size_t> reply_entries{0};  // last_reply.size(), readable from other threads
  std::set<uint64_t> unauthed;           // ids of unauthenticated connections; ids grow, so begin() is the oldest
  Clock::time_point accept_paused_until{};

  void loop();
  void housekeeping();
  void accept_all();
  Conn& add_conn(int fd, std::string nonce, std::string* sink);
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
  /// Ok with the value of every key, in order (all present).
  std::string values_reply(const std::vector<std::string>& keys) const;
  void answer_parked(Conn& c, bool timed_out);
  void key_created(const std::string& key);
  void process_ready();
  void expire_parked();
  void close_conn(Conn& c);
  bool drop_unauthed(const char* why);
  std::minstd_rand drop_rng{std::random_device{}()};
  void expire_hellos();
  void remember_reply(uint64_t client_id, uint64_t seq, const std::string& frame);
  size_t out_pending(const Conn& c) const { return c.out.size() - c.out_off; }
};

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& bind_host, uint16_t port, std::string token,
                                                        StoreServerOptions opts) {
  if (token.empty())
    return invalid_argument(
        "store: the job token is empty; give one (--token-file F, or STRATA_JOB_TOKEN, e.g. the output of "
        "'openssl rand -hex 16'): a store without a token lets anyone who can reach it join the job");
  auto impl = std::make_unique<Impl>();
  impl->token = std::move(token);
  impl->opts = opts;
  impl->opts.max_pending = std::max<size_t>(1, opts.max_pending);
  STRATA_ASSIGN_OR_RETURN(std::string inc, random_bytes(8));
  for (int i = 0; i < 8; ++i) impl->incarnation |= uint64_t{static_cast<uint8_t>(inc[i])} << (8 * i);

  // No host means loopback, never every interface: listening wider is asked for by address.
  const std::string host = bind_host.empty() ? "127.0.0.1" : bind_host;
  std::string port_str = std::to_string(port);
  auto addrs = resolve(host, port, true, Deadline::after(kBindResolveTimeout));
  if (!addrs.is_ok())
    return invalid_argument("store: cannot resolve bind address '" + host + "': " + addrs.status().message());

  Status last = unavailable("no address to bind");
  for (const ResolvedAddress& ai : *addrs) {
    Fd fd(::socket(ai.family, ai.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.protocol));
    if (!fd.valid()) {
      last = errno_status("socket", errno);
      continue;
    }
    // A restarted store must rebind its port while the old connections sit in TIME_WAIT.
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ai.addr), ai.len) != 0) {
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
    char numeric[NI_MAXHOST] = {};
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, numeric, sizeof numeric, nullptr, 0, NI_NUMERICHOST) == 0)
      impl->bound_host = numeric;
    impl->listen_fd = std::move(fd);
    break;
  }
  if (!impl->listen_fd.valid()) return last.with_context("store: cannot listen on " + host + ":" + port_str + ": ");

  impl->wake_fd = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->wake_fd.valid()) return errno_status("eventfd", errno);
  impl->bind_desc = StoreAddress{impl->bound_host, impl->port}.to_string();

  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->loop(); });
  STRATA_LOG(Info, "store: serving on " << raw->bind_desc);
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { stop(); }

uint16_t StoreServer::port() const { return impl_->port; }

std::string StoreServer::bound_host() const { return impl_->bound_host; }

uint64_t StoreServer::incarnation() const { return impl_->incarnation; }

size_t StoreServer::cached_replies() const { return impl_->reply_entries.load(std::memory_order_relaxed); }

void StoreServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  uint64_t one = 1;
  (void)!::write(impl_->wake_fd.get(), &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->listen_fd.reset();  // the loop closed it already, unless it never ran
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
      // Nor is one whose unread replies fill its buffer: it must read before it may ask more.
      if (!c->parked && !c->close_after_flush && out_pending(*c) < opts.max_conn_bytes) ev |= POLLIN;
      if (c->out_off < c->out.size()) ev |= POLLOUT;
      ev |= POLLRDHUP;
      fds.push_back({c->fd.get(), ev, 0});
      polled.push_back(c.get());
      if (c->parked) next_wake = std::min(next_wake, c->parked_deadline);
      if (!c->authed) next_wake = std::min(next_wake, c->hello_deadline);
    }
    int timeout = -1;
    if (next_wake != Clock::time_point::max()) timeout = wire::poll_timeout_ms(Deadline(next_wake));

    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      STRATA_LOG(Error, "store: poll failed: " << std::strerror(errno));
      break;
    }
    if (n > 0 && (fds[0].revents & POLLIN)) break;  // stop()
    // Connections first, new ones after: a hello that has arrived is read (and its client
    // authenticated) before a flood of new connections can push that client out.
    for (size_t i = 0; n > 0 && i < polled.size(); ++i) {
      Conn& c = *polled[i];
      short re = fds[i + 2].revents;
      if (c.dead || re == 0) continue;
      if (re & POLLOUT) {
        bool was_full = out_pending(c) >= opts.max_conn_bytes;
        flush(c);
        if (was_full && !c.dead) pump(c);  // requests left buffered while the replies were unread
      }
      if (!c.dead && (re & POLLIN)) on_readable(c);
      // Hang-up of a parked connection (or one we do not read): the client is gone.
      if (!c.dead && (re & (POLLHUP | POLLERR | POLLRDHUP)) && !(re & POLLIN)) close_conn(c);
    }
    if (n > 0 && (fds[1].revents & POLLIN)) accept_all();
    housekeeping();
  }
  // The listener first: a client that sees its connection close reconnects at once, and one
  // that reached a listener still open after the loop stopped would wait for a greeting that
  // never comes (closing the listener does not always reset what sits in its backlog).
  listen_fd.reset();
  for (auto& [id, c] : conns) c->fd.reset();
  conns.clear();
}

void StoreServer::Impl::housekeeping() {
  process_ready();
  expire_parked();
  expire_hellos();
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second->dead) it = conns.erase(it);
    else ++it;
  }
}

void StoreServer::Impl::accept_all() {
  // A bounded batch per turn, so that the connections already open are served in between.
  for (int batch = 0; batch < kAcceptBatch; ++batch) {
    int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors: an unauthenticated connection is the one to give up, so that a
      // real client never waits in the backlog behind peers that never said hello.
      if ((errno == EMFILE || errno == ENFILE) && drop_unauthed("out of file descriptors")) continue;
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
    auto nonce = random_bytes(wire::kNonceBytes);
    if (!nonce.is_ok()) {
      STRATA_LOG(Error, "store: " << nonce.status().message() << "; refusing a connection");
      ::close(fd);
      continue;
    }
    add_conn(fd, std::move(*nonce), nullptr);
  }
}

Conn& StoreServer::Impl::add_conn(int fd, std::string nonce, std::string* sink) {
  // Drop the oldest rather than refuse the newest: a peer flooding idle connections then
  // has to open max_pending of them within one handshake round trip of a real client to
  // push it out, while refusing new ones would lock real clients out for as long as the
  // flood is kept up.
  if (unauthed.size() >= opts.max_pending) drop_unauthed("too many unauthenticated connections");
  auto c = std::make_unique<Conn>();
  c->fd = Fd(fd);
  c->sink = sink;
  c->id = next_conn_id++;
  c->nonce = std::move(nonce);
  c->hello_deadline = Clock::now() + opts.hello_timeout;
  unauthed.insert(c->id);
  Conn& ref = *c;
  conns.emplace(c->id, std::move(c));
  send(ref, wire::Writer().u32(wire::kMagic).u32(wire::kVersion).str(ref.nonce).u64(incarnation).frame());
  return ref;
}

bool StoreServer::Impl::drop_unauthed(const char* why) {
  if (unauthed.empty()) return false;
  // A random one, not the oldest: a flood that opens max_pending connections while a real
  // client's hello is on its way would always push out the oldest, that client, while a
  // random pick leaves it a fair chance per connection the flood opens (and it retries).
  auto victim = unauthed.begin();
  std::advance(victim, static_cast<long>(drop_rng() % unauthed.size()));
  auto it = conns.find(*victim);
  if (it == conns.end()) {
    unauthed.erase(victim);
    return true;
  }
  STRATA_LOG(Info, "store: dropping unauthenticated connection " << it->first << " (" << why << ")");
  close_conn(*it->second);
  return true;
}

void StoreServer::Impl::expire_hellos() {
  auto now = Clock::now();
  // Oldest first, and every one accepted later has a later deadline: stop at the first alive.
  while (!unauthed.empty()) {
    auto it = conns.find(*unauthed.begin());
    if (it == conns.end() || it->second->dead) {
      unauthed.erase(unauthed.begin());
      continue;
    }
    Conn& c = *it->second;
    if (c.hello_deadline > now) break;
    STRATA_LOG(Info, "store: connection " << c.id << " did not authenticate within " << opts.hello_timeout.count()
                                          << " ms; closing it");
    close_conn(c);
  }
}

void StoreServer::Impl::on_readable(Conn& c) {
  char buf[64 * 1024];
  // Bounded per wake-up so one busy client cannot starve the others.
  for (int round = 0; round < 16; ++round) {
    // Never more than the largest frame accepted (plus its header) waits unparsed.
    if (c.in.size() - c.in_off >= opts.max_conn_bytes + 4) break;
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
  while (!c.dead && !c.parked && !c.close_after_flush && out_pending(c) < opts.max_conn_bytes) {
    size_t avail = c.in.size() - c.in_off;
    if (avail < 4) break;
    uint32_t n = wire::decode_length(c.in.data() + c.in_off);
    size_t limit = c.authed ? std::min<size_t>(wire::kMaxFrameBytes, opts.max_conn_bytes) : wire::kMaxHelloBytes;
    if (n > limit) {
      STRATA_LOG(Warn, "store: connection " << c.id << " sent a " << n << "-byte frame; closing it");
      send(c, reply_error("request of " + std::to_string(n) + " bytes is larger than the store accepts (" +
                          std::to_string(limit) + " bytes; STRATA_STORE_MAX_CONN_BYTES)"));
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
  std::string client_nonce = r.str();
  std::string client_proof = r.str();
  std::string why;
  if (!r.ok() || magic != wire::kMagic) why = "not a Strata store handshake";
  else if (version != wire::kVersion)
    why = "protocol version " + std::to_string(version) + " is not supported (server speaks " +
          std::to_string(wire::kVersion) + ")";
  else if (client_nonce.size() != wire::kNonceBytes) why = "malformed handshake (nonce)";
  else if (client_proof.empty()) why = "missing job token";
  else if (!wire::proofs_equal(client_proof,
                               wire::proof(token, wire::Role::Client, c.nonce, client_nonce, client_id, incarnation)))
    why = "wrong job token";
  if (!why.empty()) {
    STRATA_LOG(Warn, "store: refused connection " << c.id << ": " << why);
    send(c, reply_error(why));
    c.close_after_flush = true;
    return;
  }
  c.authed = true;
  c.client_id = client_id;
  unauthed.erase(c.id);
  // Mutual: the client checks this proof, so a server without the token cannot pose as the store.
  std::string server_proof = wire::proof(token, wire::Role::Server, c.nonce, client_nonce, client_id, incarnation);
  send(c, wire::Writer().u8(static_cast<uint8_t>(ReplyCode::Ok)).str(server_proof).frame());
}

void StoreServer::Impl::remember_reply(uint64_t client_id, uint64_t seq, const std::string& frame) {
  auto it = last_reply.find(client_id);
  if (it != last_reply.end()) {
    reply_bytes -= it->second.frame.size();
    reply_lru.erase(it->second.lru);
    last_reply.erase(it);
  }
  reply_lru.push_front(client_id);
  last_reply.emplace(client_id, LastReply{seq, frame, reply_lru.begin()});
  reply_bytes += frame.size();
  // Bounded in entries and bytes. A dropped entry only matters to a client that lost its
  // connection in the middle of a mutating request and comes back after thousands of other
  // clients have written since; it would then apply that request twice.
  while (last_reply.size() > 1 && (last_reply.size() > opts.reply_cache_entries || reply_bytes > opts.max_conn_bytes)) {
    auto victim = last_reply.find(reply_lru.back());
    reply_bytes -= victim->second.frame.size();
    last_reply.erase(victim);
    reply_lru.pop_back();
  }
  reply_entries.store(last_reply.size(), std::memory_order_relaxed);
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
  if (dedup && !c.close_after_flush) remember_reply(c.client_id, seq, reply);
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
      auto [keys, timeout_ms] = read_keys(r);
      if (!r.ok()) return malformed();
      std::vector<std::string> missing;
      for (auto& k : keys)
        if (!data.count(k)) missing.push_back(std::move(k));
      if (missing.empty()) return reply_ok();
      park(c, op, std::move(missing), timeout_ms);
      parked = true;
      return {};
    }
    case Op::GetMany: {
      auto [keys, timeout_ms] = read_keys(r);
      if (!r.ok()) return malformed();
      // Parked with every key, present or not: the answer carries all the values, read when
      // the last one appears (one that was deleted meanwhile is waited for again).
      if (std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; }))
        return values_reply(keys);
      park(c, op, std::move(keys), timeout_ms);
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

std::string StoreServer::Impl::values_reply(const std::vector<std::string>& keys) const {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(ReplyCode::Ok)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(data.at(k));
  return w.frame();
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
  } else if (c.parked_op == Op::GetMany) {
    send(c, values_reply(c.parked_keys));
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
  if (c.sink) {
    c.sink->append(c.out, c.out_off);
    c.out_off = c.out.size();
  }
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
  if (!c.authed) unauthed.erase(c.id);
  if (c.parked) unregister_waiter(c);
  c.parked = false;
  c.fd.reset();
}

StoreProtocolDriver::StoreProtocolDriver(std::string token, StoreServerOptions opts, std::string nonce,
                                         uint64_t incarnation)
    : impl_(std::make_unique<StoreServer::Impl>()), nonce_(std::move(nonce)) {
  impl_->token = std::move(token);
  impl_->opts = opts;
  impl_->opts.max_pending = std::max<size_t>(1, opts.max_pending);
  impl_->incarnation = incarnation;
}

StoreProtocolDriver::~StoreProtocolDriver() = default;

uint64_t StoreProtocolDriver::open() {
  const uint64_t id = impl_->next_conn_id;
  impl_->add_conn(-1, nonce_, &out_[id]);
  impl_->housekeeping();
  return id;
}

bool StoreProtocolDriver::feed(uint64_t id, std::string_view bytes) {
  auto it = impl_->conns.find(id);
  if (it == impl_->conns.end() || it->second->dead) return false;
  Conn& c = *it->second;
  c.in.append(bytes);
  impl_->pump(c);
  impl_->housekeeping();
  return !closed(id);
}

void StoreProtocolDriver::hang_up(uint64_t id) {
  auto it = impl_->conns.find(id);
  if (it == impl_->conns.end()) return;
  impl_->close_conn(*it->second);
  impl_->housekeeping();
}

std::string StoreProtocolDriver::take_output(uint64_t id) {
  auto it = out_.find(id);
  if (it == out_.end()) return {};
  return std::exchange(it->second, std::string());
}

bool StoreProtocolDriver::closed(uint64_t id) const {
  auto it = impl_->conns.find(id);
  return it == impl_->conns.end() || it->second->dead;
}

size_t StoreProtocolDriver::keys() const { return impl_->data.size(); }

}  // namespace strata::bootstrap

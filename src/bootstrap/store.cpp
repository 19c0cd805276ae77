// The store client and StoreAddress.
//
// Re-issue after a broken connection: every request carries a sequence number that stays
// the same when it is re-sent. A server that is still the same process replays its stored
// reply for set/add/compare_set/del/delete_prefix, so those are applied exactly once.
// get/wait/try_get/list are re-sent as they are, with the wait shortened to the time left.
// A restarted server has lost every key: continuing against it would leave every waiter
// waiting for keys nobody will set again, so meeting a new incarnation is an error
// (PeerFailed, sticky), not a reconnect.

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <charconv>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "bootstrap/resolve.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/store_wire.hpp"
#include "common/env.hpp"
#include "common/log.hpp"

namespace strata::bootstrap {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using wire::Fd;
using wire::Op;
using wire::ReplyCode;

constexpr milliseconds kDefaultReconnectTimeout{60000};
constexpr milliseconds kMaxBackoff{100};
constexpr milliseconds kFirstGreetingPatience{500};
// How much longer than its own timeout a waiting request gives the server to answer
// before deciding the server itself is stuck.
constexpr milliseconds kReplySlack{2000};

uint64_t random_client_id() {
  std::random_device rd;
  uint64_t id = (uint64_t{rd()} << 32) ^ rd();
  return id == 0 ? 1 : id;  // 0 means "no dedup" on the server
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) s += ", ";
    if (i == 8) {
      s += "... (" + std::to_string(keys.size()) + " keys)";
      break;
    }
    s += wire::quote_key(keys[i]);
  }
  return s;
}

}  // namespace

Result<StoreAddress> StoreAddress::parse(const std::string& s) {
  auto bad = [&](const std::string& why) {
    return invalid_argument("store address '" + s + "' is not host:port (" + why + ")");
  };
  std::string host, port;
  if (!s.empty() && s[0] == '[') {  // [v6-address]:port
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return bad("unterminated [");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("write an IPv6 address as [addr]:port");
  }
  if (host.empty()) return bad("empty host");
  unsigned v = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (port.empty() || ec != std::errc() || p != port.data() + port.size() || v == 0 || v > 65535)
    return bad("port must be 1-65535");
  return StoreAddress{host, static_cast<uint16_t>(v)};
}

std::string StoreAddress::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

struct StoreClient::Impl {
  StoreAddress addr;
  std::string token;
  uint64_t client_id = random_client_id();
  std::mutex mu;
  Fd fd;
  uint64_t seq = 0;
  milliseconds reconnect_timeout = kDefaultReconnectTimeout;
  milliseconds hello_timeout = Env::get().store_hello_timeout;
  std::optional<uint64_t> incarnation;  // of the server first met
  Status lost;                          // set once the store is known to have restarted
  StoreClient::Counters counted;        // guarded by mu
  uint64_t last_bytes = 0;              // frames of the last answered request

  std::string where() const { return "store at " + addr.to_string(); }
  Status connect_once(const Deadline& d, milliseconds patience);
  Status connect_until(const Deadline& d);
  /// Sends a request built by `build` (called again for every re-send, so a wait can
  /// shorten its timeout) and returns the reply payload. `wait_until` is set for requests
  /// that may park on the server. (An out-parameter rather than Result<std::string>:
  /// GCC 12 reports a false maybe-uninitialized on the moved-out optional string.)
  // `bound` caps a request that is not itself a wait (its reconnects and its reply) at the
  // deadline of the wait it serves, so the store's absence cannot stretch that wait.
  Status call(const std::function<std::string(uint64_t seq)>& build, std::optional<Deadline> wait_until,
              std::string& reply, const Deadline& bound = Deadline::never());
  Status unexpected(const std::string& payload, const char* what) const;
};

Status StoreClient::Impl::connect_once(const Deadline& d, milliseconds patience) {
  auto addrs = resolve(addr.host, addr.port, false, d);
  if (!addrs.is_ok()) return unavailable(addrs.status().message());

  Status last = unavailable("no address");
  for (const ResolvedAddress& ai : *addrs) {
    // One attempt waits at most `patience`, so a connection stuck where no server will ever
    // greet it is given up and retried rather than waited on until `d`: one that landed in
    // the backlog of a listener being closed (the kernel can complete it and send no reset:
    // seen when a store restarts on its port), or in a backlog the server does not drain.
    Deadline attempt(std::min(d.at(), Deadline::after(patience).at()));
    Fd s(::socket(ai.family, ai.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.protocol));
    if (!s.valid()) {
      last = errno_status("socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&ai.addr), ai.len) != 0) {
      if (errno != EINPROGRESS) {
        last = unavailable(std::string("connect: ") + std::strerror(errno));
        continue;
      }
      Status ready = wire::wait_ready(s.get(), POLLOUT, attempt);
      if (!ready.is_ok()) {
        last = unavailable("connect: " + ready.message());
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = unavailable(std::string("connect: ") + std::strerror(err));
        continue;
      }
    }
    // The server speaks first: its nonce (the challenge) and its incarnation.
    std::string greeting;
    Status got = wire::recv_frame(s.get(), attempt, greeting, wire::kMaxHelloBytes);
    if (!got.is_ok()) {
      last = unavailable("handshake: " + got.message());
      continue;
    }
    wire::Reader g(greeting);
    uint32_t magic = g.u32(), version = g.u32();
    std::string server_nonce = g.str();
    uint64_t server_incarnation = g.u64();
    if (!g.ok() || magic != wire::kMagic)
      return internal_error(where() + " is not a Strata store (unexpected handshake)");
    if (version != wire::kVersion)
      return internal_error(where() + " speaks store protocol version " + std::to_string(version) + ", this client " +
                            std::to_string(wire::kVersion) + " (mixed Strata versions in one job?)");
    STRATA_ASSIGN_OR_RETURN(std::string client_nonce, random_bytes(wire::kNonceBytes));
    std::string mine =
        wire::proof(token, wire::Role::Client, server_nonce, client_nonce, client_id, server_incarnation);
    std::string hello =
        wire::Writer().u32(wire::kMagic).u32(wire::kVersion).u64(client_id).str(client_nonce).str(mine).frame();
    Status sent = wire::send_all(s.get(), hello, attempt);
    if (!sent.is_ok()) {
      last = unavailable(sent.message());
      continue;
    }
    std::string reply;
    got = wire::recv_frame(s.get(), attempt, reply, wire::kMaxHelloBytes);
    if (!got.is_ok()) {
      last = unavailable("handshake: " + got.message());
      continue;
    }
    wire::Reader r(reply);
    auto code = static_cast<ReplyCode>(r.u8());
    if (code == ReplyCode::Error) {
      std::string why = r.str();
      std::string hint;
      if (why.find("token") != std::string::npos) hint = " (set STRATA_JOB_TOKEN to the token of the job)";
      return invalid_argument(where() + " refused the connection: " + why + hint);
    }
    std::string theirs = r.str();
    if (!r.ok() || code != ReplyCode::Ok) return internal_error(where() + " sent a malformed handshake reply");
    if (!wire::proofs_equal(
            theirs, wire::proof(token, wire::Role::Server, server_nonce, client_nonce, client_id, server_incarnation)))
      return invalid_argument(where() +
                              " could not prove it knows the job token: it is not this job's store (another job's "
                              "store on the same address, or something posing as it)");
    if (incarnation && *incarnation != server_incarnation) {
      lost = peer_failed(where() + " restarted since this client first connected (incarnation " +
                         std::to_string(*incarnation) + ", now " + std::to_string(server_incarnation) +
                         ") and has lost every key; the job cannot continue against it");
      return lost;
    }
    incarnation = server_incarnation;
    fd = std::move(s);
    return Status::ok();
  }
  return last;
}

Status StoreClient::Impl::connect_until(const Deadline& d) {
  auto start = Clock::now();
  milliseconds backoff{1};
  // A store greets within a round trip of the connect; the patience grows from a short first
  // try to the hello timeout, so a stuck attempt costs little and a slow store is still met.
  milliseconds patience = std::min(kFirstGreetingPatience, hello_timeout);
  for (;;) {
    Status s = connect_once(d, patience);
    patience = std::min(patience * 2, hello_timeout);
    if (s.is_ok()) return s;
    // A refused token or a malformed server will not get better by retrying.
    if (s.code() != Code::Unavailable) return s;
    if (d.expired()) {
      auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
      return unavailable("cannot reach " + where() + " (tried for " + std::to_string(waited) + " ms): " + s.message());
    }
    std::this_thread::sleep_for(std::min(backoff, d.remaining()));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

Status StoreClient::Impl::call(const std::function<std::string(uint64_t)>& build, std::optional<Deadline> wait_until,
                               std::string& reply, const Deadline& bound) {
  if (!lost.is_ok()) return lost;
  if (!wait_until && bound.at() != Deadline::never().at()) wait_until = bound;
  uint64_t my_seq = ++seq;
  // Set on the first break; all reconnects and re-sends of this request share it, so a
  // server that accepts and then drops every request cannot keep us looping.
  std::optional<Deadline> reconnect_by;
  Status last;
  for (;;) {
    if (!fd.valid()) {
      if (!reconnect_by) reconnect_by = Deadline::after(reconnect_timeout);
      // A wait never outlives its own deadline, even while the store is away.
      bool wait_ends_first = wait_until && wait_until->at() < reconnect_by->at();
      Status s = connect_until(wait_ends_first ? *wait_until : *reconnect_by);
      if (!s.is_ok()) {
        if (wait_ends_first && s.code() == Code::Unavailable)
          return timeout_error(where() + " was not reachable again before the deadline: " + s.message());
        if (last.is_ok()) return s;
        return Status(s.code(), s.message() + " (connection lost: " + last.message() + ")");
      }
    }
    Deadline reply_by =
        wait_until
            ? Deadline(wait_until->at() == Deadline::never().at() ? wait_until->at() : wait_until->at() + kReplySlack)
            : Deadline::after(reconnect_timeout);
    const std::string req = build(my_seq);
    Status io = wire::send_all(fd.get(), req, reply_by);
    if (io.is_ok()) io = wire::recv_frame(fd.get(), reply_by, reply);
    if (io.is_ok()) {
      last_bytes = req.size() + reply.size() + 4;  // + the reply's length prefix
      ++counted.ops;
      counted.bytes += last_bytes;
      return io;
    }
    // Whatever went wrong, the stream may now hold half a frame: start afresh.
    fd.reset();
    last = io;
    if (last.code() == Code::Timeout) return timeout_error(where() + " did not answer in time");
    if (last.code() != Code::Unavailable) return last.with_context(where() + ": ");
    STRATA_LOG(Info, "store client: " << where() << ": " << last.message() << "; reconnecting");
    if (!reconnect_by) reconnect_by = Deadline::after(reconnect_timeout);
  }
}

Status StoreClient::Impl::unexpected(const std::string& payload, const char* what) const {
  wire::Reader r(payload);
  if (static_cast<ReplyCode>(r.u8()) == ReplyCode::Error) {
    std::string msg = r.str();
    return invalid_argument(std::string(what) + ": " + msg);
  }
  return internal_error(std::string(what) + ": malformed reply from " + where());
}

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const StoreAddress& addr, std::string token,
                                                          Deadline deadline) {
  if (token.empty())
    return invalid_argument("store at " + addr.to_string() +
                            ": the job token is empty; set STRATA_JOB_TOKEN to the token of the job");
  auto impl = std::make_unique<Impl>();
  impl->addr = addr;
  impl->token = std::move(token);
  STRATA_RETURN_IF_ERROR(impl->connect_until(deadline));
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

void StoreClient::set_reconnect_timeout(std::chrono::milliseconds t) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->reconnect_timeout = t;
}

namespace {

// Remaining time of a wait, as sent on the wire.
int64_t remaining_ms(const Deadline& d) { return d.remaining().count(); }

// A request naming `keys` and the time left until `until` (Wait, GetMany).
std::string keys_request(Op op, uint64_t seq, const std::vector<std::string>& keys, const Deadline& until) {
  wire::Writer w = wire::request(op, seq);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  return w.i64(remaining_ms(until)).frame();
}

// Waits longer than a year are "forever"; this also keeps now + timeout from overflowing.
Deadline wait_deadline(milliseconds timeout) {
  if (timeout > std::chrono::hours(24 * 365)) return Deadline::never();
  return Deadline::after(timeout);
}

}  // namespace

Status StoreClient::set(const std::string& key, const std::string& value, const Deadline& bound) {
  auto build = [&](uint64_t seq) { return wire::request(Op::Set, seq).str(key).str(value).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply, bound));
  wire::Reader r(reply);
  if (static_cast<ReplyCode>(r.u8()) != ReplyCode::Ok) return impl_->unexpected(reply, "store set");
  return Status::ok();
}

Result<std::string> StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  Deadline until = wait_deadline(timeout);
  auto build = [&](uint64_t seq) { return wire::request(Op::Get, seq).str(key).i64(remaining_ms(until)).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  std::string what = "timed out after " + std::to_string(timeout.count()) + " ms waiting for key " +
                     wire::quote_key(key) + " in the " + impl_->where();
  Status st = impl_->call(build, until, reply);
  if (st.code() == Code::Timeout) return timeout_error(what + " (" + st.message() + ")");
  STRATA_RETURN_IF_ERROR(st);
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  if (code == ReplyCode::Timeout) {
    --impl_->counted.ops;
    impl_->counted.bytes -= impl_->last_bytes;
    ++impl_->counted.polls;
    return timeout_error(what);
  }
  std::string value = r.str();
  if (code != ReplyCode::Ok || !r.ok()) return impl_->unexpected(reply, "store get");
  return value;
}

StoreClient::Counters StoreClient::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->counted;
}

Result<std::optional<std::string>> StoreClient::try_get(const std::string& key, const Deadline& bound) {
  auto build = [&](uint64_t seq) { return wire::request(Op::TryGet, seq).str(key).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply, bound));
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  if (code == ReplyCode::NotFound) return std::optional<std::string>();
  std::string value = r.str();
  if (code != ReplyCode::Ok || !r.ok()) return impl_->unexpected(reply, "store try_get");
  return std::optional<std::string>(std::move(value));
}

Result<std::vector<std::string>> StoreClient::get_many(const std::vector<std::string>& keys,
                                                       std::chrono::milliseconds timeout) {
  if (keys.empty()) return std::vector<std::string>();
  Deadline until = wait_deadline(timeout);
  auto build = [&](uint64_t seq) { return keys_request(Op::GetMany, seq, keys, until); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  auto what = [&](const std::vector<std::string>& missing) {
    return "timed out after " + std::to_string(timeout.count()) + " ms waiting for key(s) " + join_keys(missing) +
           " in the " + impl_->where();
  };
  Status st = impl_->call(build, until, reply);
  if (st.code() == Code::Timeout) return timeout_error(what(keys) + " (" + st.message() + ")");
  STRATA_RETURN_IF_ERROR(st);
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  std::vector<std::string> out(r.count(4));
  for (auto& v : out) v = r.str();
  if (!r.ok() || (code != ReplyCode::Ok && code != ReplyCode::Timeout))
    return impl_->unexpected(reply, "store get_many");
  if (code == ReplyCode::Timeout) {
    // As for get: a wait polled in slices counts once, when answered.
    --impl_->counted.ops;
    impl_->counted.bytes -= impl_->last_bytes;
    ++impl_->counted.polls;
    return timeout_error(what(out));
  }
  if (out.size() != keys.size()) return impl_->unexpected(reply, "store get_many");
  return out;
}

Status StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return Status::ok();
  Deadline until = wait_deadline(timeout);
  auto build = [&](uint64_t seq) { return keys_request(Op::Wait, seq, keys, until); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  Status st = impl_->call(build, until, reply);
  if (st.code() == Code::Timeout)
    return timeout_error("timed out after " + std::to_string(timeout.count()) + " ms waiting for key(s) " +
                         join_keys(keys) + " (" + st.message() + ")");
  STRATA_RETURN_IF_ERROR(st);
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  if (code == ReplyCode::Ok) return Status::ok();
  if (code != ReplyCode::Timeout) return impl_->unexpected(reply, "store wait");
  std::vector<std::string> missing(r.count(4));
  for (auto& k : missing) k = r.str();
  if (!r.ok()) return impl_->unexpected(reply, "store wait");
  return timeout_error("timed out after " + std::to_string(timeout.count()) + " ms waiting for key(s) " +
                       join_keys(missing) + " in the " + impl_->where());
}

Result<int64_t> StoreClient::add(const std::string& key, int64_t delta, const Deadline& bound) {
  auto build = [&](uint64_t seq) { return wire::request(Op::Add, seq).str(key).i64(delta).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply, bound));
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  int64_t value = r.i64();
  if (code != ReplyCode::Ok || !r.ok()) return impl_->unexpected(reply, "store add");
  return value;
}

Result<std::string> StoreClient::compare_set(const std::string& key, const std::string& expected,
                                             const std::string& desired) {
  auto build = [&](uint64_t seq) {
    return wire::request(Op::CompareSet, seq).str(key).str(expected).str(desired).frame();
  };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply));
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  std::string value = r.str();
  if (code != ReplyCode::Ok || !r.ok()) return impl_->unexpected(reply, "store compare_set");
  return value;
}

Result<bool> StoreClient::del(const std::string& key) {
  auto build = [&](uint64_t seq) { return wire::request(Op::Del, seq).str(key).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply));
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  bool existed = r.u8() != 0;
  if (code != ReplyCode::Ok || !r.ok()) return impl_->unexpected(reply, "store del");
  return existed;
}

Result<std::vector<std::string>> StoreClient::list(const std::string& prefix, const Deadline& bound) {
  auto build = [&](uint64_t seq) { return wire::request(Op::List, seq).str(prefix).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply, bound));
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  if (code != ReplyCode::Ok) return impl_->unexpected(reply, "store list");
  std::vector<std::string> keys(r.count(4));
  for (auto& k : keys) k = r.str();
  if (!r.ok()) return impl_->unexpected(reply, "store list");
  return keys;
}

Result<int64_t> StoreClient::delete_prefix(const std::string& prefix) {
  auto build = [&](uint64_t seq) { return wire::request(Op::DeletePrefix, seq).str(prefix).frame(); };
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string reply;
  STRATA_RETURN_IF_ERROR(impl_->call(build, std::nullopt, reply));
  wire::Reader r(reply);
  auto code = static_cast<ReplyCode>(r.u8());
  int64_t count = r.i64();
  if (code != ReplyCode::Ok || !r.ok()) return impl_->unexpected(reply, "store delete_prefix");
  return count;
}

}  // namespace strata::bootstrap

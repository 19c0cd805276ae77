#pragma once
// Rendezvous store: a TCP key-value server and its client. Used for setup and recovery only;
// data never flows through it.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/deadline.hpp"
#include "common/env.hpp"
#include "common/status.hpp"

namespace strata::bootstrap {

/// "host:port" parsed.
struct StoreAddress {
  std::string host;
  uint16_t port = 0;
  static Result<StoreAddress> parse(const std::string& s);
  std::string to_string() const;
};

/// Limits of a store server against clients that misbehave or never authenticate.
struct StoreServerOptions {
  /// An unauthenticated connection is closed after this long.
  std::chrono::milliseconds hello_timeout{5000};
  /// Unauthenticated connections held at once; a new one beyond it drops the oldest.
  size_t max_pending = 64;
  /// Bytes buffered per connection: the largest request accepted, and the replies a client
  /// has not read yet (beyond it the server stops reading that connection).
  size_t max_conn_bytes = size_t{64} << 20;
  /// Clients whose last mutating reply is kept for replay (least recently used dropped).
  size_t reply_cache_entries = 4096;
  /// The limits set by STRATA_STORE_* (see Env).
  static StoreServerOptions from_env(const Env& env);
};

/// The server. Every connection must first prove it knows the job token (challenge-response:
/// the token never crosses the wire); a client that fails is refused with a message saying
/// so. Each server has a random incarnation id, so a client that reconnects to a restarted
/// (empty) store notices. Thread-safe; runs its own thread.
class StoreServer {
 public:
  /// Binds host:port (port 0 = any free port; an empty host = 127.0.0.1) and starts serving.
  /// InvalidArgument when the token is empty: a store anyone can use is never what a job wants.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& bind_host, uint16_t port, std::string token,
                                                    StoreServerOptions opts = StoreServerOptions::from_env(Env::get()));
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  /// The port actually bound.
  uint16_t port() const;
  /// The address actually bound (numeric).
  std::string bound_host() const;
  /// This server's incarnation id (random, fixed for its lifetime).
  uint64_t incarnation() const;
  /// Entries in the table of replayable replies (tests check its bound).
  size_t cached_replies() const;
  /// Stops serving and closes every connection (clients see the server go away). Idempotent.
  void stop();

  struct Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The server's protocol without sockets or a thread, for the fuzzer (tests/fuzz/) and tests.
/// Bytes fed to a connection are handled as if its client had sent them (hello, requests,
/// parked waits, replayed replies) by the same code StoreServer runs; what the server would
/// send is collected instead. Single-threaded.
class StoreProtocolDriver {
 public:
  /// Every connection is greeted with the challenge `nonce` (fixed, so that a caller can
  /// build a valid hello) on behalf of a server with `incarnation`.
  StoreProtocolDriver(std::string token, StoreServerOptions opts, std::string nonce, uint64_t incarnation);
  ~StoreProtocolDriver();
  StoreProtocolDriver(const StoreProtocolDriver&) = delete;
  StoreProtocolDriver& operator=(const StoreProtocolDriver&) = delete;
  /// Accepts a new connection (its greeting is in its output) and returns its id.
  uint64_t open();
  /// Hands `bytes` to connection `id` as if its client had sent them; false once the server
  /// has closed it (or it never existed).
  bool feed(uint64_t id, std::string_view bytes);
  /// The client of `id` hangs up.
  void hang_up(uint64_t id);
  /// What the server has sent on `id` since the last call: whole frames.
  std::string take_output(uint64_t id);
  /// Whether the server has closed `id`.
  bool closed(uint64_t id) const;
  /// Keys in the store.
  size_t keys() const;

 private:
  std::unique_ptr<StoreServer::Impl> impl_;
  std::string nonce_;
  std::unordered_map<uint64_t, std::string> out_;
};

/// A client connection. Thread-safe (requests are serialised). When the connection breaks,
/// the next request reconnects with backoff until the reconnect timeout and is retried; a
/// wait in progress is re-issued. A reconnect that meets a different server incarnation (the
/// store restarted and lost every key) fails with PeerFailed, now and on every later call.
class StoreClient {
 public:
  /// Connects, retrying with backoff until `deadline`. Fails with Unavailable when the
  /// server is not reachable in time and InvalidArgument when the token is refused, empty,
  /// or the server cannot prove it knows it.
  static Result<std::unique_ptr<StoreClient>> connect(const StoreAddress& addr, std::string token, Deadline deadline);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  Status set(const std::string& key, const std::string& value, const Deadline& bound = Deadline::never());
  /// Waits until `key` exists (Timeout after `timeout`) and returns its value.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  /// Returns the value, or nullopt when the key does not exist (no wait). A request made
  /// inside a wait passes that wait's deadline as `bound`: while the store is away it is
  /// retried until then (Timeout), not for the whole reconnect timeout; so for add and list.
  Result<std::optional<std::string>> try_get(const std::string& key, const Deadline& bound = Deadline::never());
  /// Waits until every key exists (Timeout after `timeout`, naming the missing ones) and
  /// returns their values in the order of `keys`: one request however many keys.
  Result<std::vector<std::string>> get_many(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Waits until every key exists.
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Atomically adds `delta` to the integer stored at key (missing = 0); returns the new value.
  Result<int64_t> add(const std::string& key, int64_t delta, const Deadline& bound = Deadline::never());
  /// Sets key to `desired` if its current value equals `expected` (a missing key matches an
  /// empty `expected`). Returns the value after the operation.
  Result<std::string> compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  /// Deletes a key; returns whether it existed.
  Result<bool> del(const std::string& key);
  /// Keys that start with `prefix`, sorted.
  Result<std::vector<std::string>> list(const std::string& prefix, const Deadline& bound = Deadline::never());
  /// Deletes every key that starts with `prefix`; returns how many.
  Result<int64_t> delete_prefix(const std::string& prefix);

  /// Timeout used to reconnect after the connection breaks.
  void set_reconnect_timeout(std::chrono::milliseconds t);

  /// What this client has asked of the server (recovery's cost accounting). A wait that a
  /// caller polls in slices counts once, when it is answered; the slices that timed out are
  /// `polls`, so that `ops` and `bytes` do not depend on timing.
  struct Counters {
    uint64_t ops = 0;    ///< requests answered (a get that timed out is a poll, not an op)
    uint64_t bytes = 0;  ///< request and reply frames of those requests
    uint64_t polls = 0;  ///< gets that timed out
  };
  Counters counters() const;

  struct Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A view of a client that prepends `prefix` to every key (namespacing per communicator).
class PrefixStore {
 public:
  PrefixStore(std::shared_ptr<StoreClient> client, std::string prefix)
      : client_(std::move(client)), prefix_(std::move(prefix)) {}
  Status set(const std::string& k, const std::string& v) { return client_->set(prefix_ + k, v); }
  Result<std::string> get(const std::string& k, std::chrono::milliseconds t) { return client_->get(prefix_ + k, t); }
  Result<int64_t> add(const std::string& k, int64_t d) { return client_->add(prefix_ + k, d); }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return client_->wait(full, t);
  }
  const std::string& prefix() const { return prefix_; }
  StoreClient& client() { return *client_; }

 private:
  std::shared_ptr<StoreClient> client_;
  std::string prefix_;
};

}  // namespace strata::bootstrap

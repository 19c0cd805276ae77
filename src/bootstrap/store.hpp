#pragma once
// Rendezvous store: a TCP key-value server and its client. Used for setup and recovery only;
// data never flows through it.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.hpp"
#include "common/status.hpp"

namespace strata::bootstrap {

/// "host:port" parsed.
struct StoreAddress {
  std::string host;
  uint16_t port = 0;
  static Result<StoreAddress> parse(const std::string& s);
  std::string to_string() const;
};

/// The server. Every connection must first present the job token; a client without the
/// right token is refused with a message saying so. Thread-safe; runs its own thread.
class StoreServer {
 public:
  /// Binds host:port (port 0 = any free port) and starts serving.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& bind_host, uint16_t port, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  /// The port actually bound.
  uint16_t port() const;
  /// Stops serving and closes every connection (clients see the server go away). Idempotent.
  void stop();

  struct Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A client connection. Thread-safe (requests are serialised). When the connection breaks
/// (server restart), the next request reconnects with backoff until `connect_timeout` and is
/// retried; a wait in progress is re-issued.
class StoreClient {
 public:
  /// Connects, retrying with backoff until `deadline`. Fails with Unavailable when the
  /// server is not reachable in time and InvalidArgument when the token is refused.
  static Result<std::unique_ptr<StoreClient>> connect(const StoreAddress& addr, std::string token, Deadline deadline);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  Status set(const std::string& key, const std::string& value);
  /// Waits until `key` exists (Timeout after `timeout`) and returns its value.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  /// Returns the value, or nullopt when the key does not exist (no wait).
  Result<std::optional<std::string>> try_get(const std::string& key);
  /// Waits until every key exists.
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Atomically adds `delta` to the integer stored at key (missing = 0); returns the new value.
  Result<int64_t> add(const std::string& key, int64_t delta);
  /// Sets key to `desired` if its current value equals `expected` (a missing key matches an
  /// empty `expected`). Returns the value after the operation.
  Result<std::string> compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  /// Deletes a key; returns whether it existed.
  Result<bool> del(const std::string& key);
  /// Keys that start with `prefix`, sorted.
  Result<std::vector<std::string>> list(const std::string& prefix);
  /// Deletes every key that starts with `prefix`; returns how many.
  Result<int64_t> delete_prefix(const std::string& prefix);

  /// Timeout used to reconnect after the connection breaks.
  void set_reconnect_timeout(std::chrono::milliseconds t);

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

// The rendezvous store over real TCP sockets on 127.0.0.1: semantics of every op, waits
// and their timeouts, the job token, reconnect across a server restart, many clients.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"
#include "test_status.hpp"

namespace strata::bootstrap {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "test-token-0123";

long elapsed_ms(Clock::time_point since) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

// A port nothing listens on right now (bound, read, released).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StoreServer::start("127.0.0.1", 0, kToken);
    STRATA_ASSERT_OK(s);
    server_ = std::move(s).value();
  }
  StoreAddress addr() const { return {"127.0.0.1", server_->port()}; }
  std::unique_ptr<StoreClient> client(const std::string& token = kToken) {
    auto c = StoreClient::connect(addr(), token, Deadline::after(5s));
    STRATA_EXPECT_OK(c);
    return c.is_ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<StoreServer> server_;
};

TEST(StoreAddressTest, ParsesHostPortAndRejectsMalformed) {
  auto a = StoreAddress::parse("node7:29500");
  STRATA_ASSERT_OK(a);
  EXPECT_EQ(a->host, "node7");
  EXPECT_EQ(a->port, 29500);
  EXPECT_EQ(a->to_string(), "node7:29500");
  auto v6 = StoreAddress::parse("[::1]:80");
  STRATA_ASSERT_OK(v6);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->to_string(), "[::1]:80");
  for (const char* bad : {"node7", "node7:", ":80", "node7:0", "node7:65536", "node7:8x", "::1:80", "[::1]80"}) {
    auto r = StoreAddress::parse(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().code(), Code::InvalidArgument);
      EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
    }
  }
}

TEST_F(StoreTest, SetThenGetReturnsBinaryValuesExactly) {
  auto c = client();
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes.push_back(static_cast<char>(i));
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  STRATA_ASSERT_OK(c->set("bytes", all_bytes));
  STRATA_ASSERT_OK(c->set("big", big));
  STRATA_ASSERT_OK(c->set(std::string("k\0ey", 4), "nul-key"));
  STRATA_ASSERT_OK(c->set("empty", ""));
  EXPECT_EQ(c->get("bytes", 1s).value(), all_bytes);
  EXPECT_EQ(c->get("big", 1s).value(), big);
  EXPECT_EQ(c->get(std::string("k\0ey", 4), 1s).value(), "nul-key");
  EXPECT_EQ(c->get("empty", 1s).value(), "");
  STRATA_ASSERT_OK(c->set("bytes", "overwritten"));
  EXPECT_EQ(c->get("bytes", 1s).value(), "overwritten");
}

TEST_F(StoreTest, TryGetDoesNotWait) {
  auto c = client();
  auto start = Clock::now();
  auto missing = c->try_get("absent");
  STRATA_ASSERT_OK(missing);
  EXPECT_FALSE(missing->has_value());
  EXPECT_LT(elapsed_ms(start), 500);
  STRATA_ASSERT_OK(c->set("present", "v"));
  auto got = c->try_get("present");
  STRATA_ASSERT_OK(got);
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, "v");
}

TEST_F(StoreTest, GetWaitsForAKeySetLaterByAnotherClient) {
  auto waiter = client();
  auto setter = client();
  std::thread t([&] {
    std::this_thread::sleep_for(150ms);
    STRATA_ASSERT_OK(setter->set("late", "value"));
  });
  auto start = Clock::now();
  auto v = waiter->get("late", 5s);
  t.join();
  STRATA_ASSERT_OK(v);
  EXPECT_EQ(*v, "value");
  EXPECT_GE(elapsed_ms(start), 100);
}

TEST_F(StoreTest, GetTimesOutWithinBoundAndNamesTheKey) {
  auto c = client();
  auto start = Clock::now();
  auto v = c->get("never/set", 200ms);
  long ms = elapsed_ms(start);
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), Code::Timeout);
  EXPECT_NE(v.status().message().find("'never/set'"), std::string::npos) << v.status().message();
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 1500);
  // The connection is still usable after a timed-out wait.
  STRATA_ASSERT_OK(c->set("after", "1"));
  EXPECT_EQ(c->get("after", 1s).value(), "1");
}

TEST_F(StoreTest, WaitReturnsWhenAllKeysExistAndNamesOnlyTheMissingOnTimeout) {
  auto c = client();
  auto other = client();
  STRATA_ASSERT_OK(c->set("a", "1"));
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    STRATA_ASSERT_OK(other->set("b", "2"));
  });
  STRATA_EXPECT_OK(c->wait({"a", "b"}, 5s));
  t.join();

  auto start = Clock::now();
  Status s = c->wait({"a", "c", "d"}, 200ms);
  long ms = elapsed_ms(start);
  EXPECT_EQ(s.code(), Code::Timeout);
  EXPECT_NE(s.message().find("'c', 'd'"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("'a'"), std::string::npos) << s.message();
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 1500);
  STRATA_EXPECT_OK(c->wait({}, 0ms));
}

TEST_F(StoreTest, WaitOnAKeyThatIsCreatedDeletedAndCreatedAgain) {
  auto c = client();
  auto other = client();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    STRATA_ASSERT_OK(other->set("x", "1"));
    STRATA_ASSERT_OK(other->del("x"));
    std::this_thread::sleep_for(50ms);
    STRATA_ASSERT_OK(other->set("y", "1"));
    std::this_thread::sleep_for(50ms);
    STRATA_ASSERT_OK(other->set("x", "2"));
  });
  // The first creation of x may or may not be seen by the waiter; either way it must
  // finish once x and y both exist.
  STRATA_EXPECT_OK(c->wait({"x", "y"}, 5s));
  t.join();
}

TEST_F(StoreTest, GetManyReturnsEveryValueInOrderOnceTheLastIsSet) {
  auto c = client();
  auto other = client();
  STRATA_ASSERT_OK(c->set("m/2", std::string("two\0bytes", 9)));
  STRATA_ASSERT_OK(c->set("m/0", ""));
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    STRATA_ASSERT_OK(other->set("m/1", "1"));
    STRATA_ASSERT_OK(other->del("m/0"));  // waited for again, then set anew
    std::this_thread::sleep_for(50ms);
    STRATA_ASSERT_OK(other->set("m/0", "zero"));
  });
  auto v = c->get_many({"m/0", "m/1", "m/2", "m/1"}, 5s);
  t.join();
  STRATA_ASSERT_OK(v);
  ASSERT_EQ(v.value().size(), 4u);
  EXPECT_TRUE(v.value()[0] == "" || v.value()[0] == "zero") << v.value()[0];
  EXPECT_EQ(v.value()[1], "1");
  EXPECT_EQ(v.value()[2], std::string("two\0bytes", 9));
  EXPECT_EQ(v.value()[3], "1");

  // All present: answered at once, as one request.
  const uint64_t ops0 = c->counters().ops;
  auto again = c->get_many({"m/2", "m/1"}, 5s);
  STRATA_ASSERT_OK(again);
  EXPECT_EQ(again.value()[0], std::string("two\0bytes", 9));
  EXPECT_EQ(c->counters().ops, ops0 + 1);
  auto none = c->get_many({}, 0ms);
  STRATA_ASSERT_OK(none);
  EXPECT_TRUE(none.value().empty());

  auto start = Clock::now();
  auto missing = c->get_many({"m/1", "m/7", "m/9"}, 200ms);
  long ms = elapsed_ms(start);
  ASSERT_EQ(missing.status().code(), Code::Timeout);
  EXPECT_NE(missing.status().message().find("'m/7', 'm/9'"), std::string::npos) << missing.status().message();
  EXPECT_EQ(missing.status().message().find("'m/1'"), std::string::npos) << missing.status().message();
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 1500);
  // The connection is still in step: the next request gets its own answer.
  auto after = c->get("m/1", 1s);
  STRATA_ASSERT_OK(after);
  EXPECT_EQ(after.value(), "1");
}

TEST_F(StoreTest, AddCountsFromZeroAndRejectsNonIntegers) {
  auto c = client();
  EXPECT_EQ(c->add("n", 5).value(), 5);
  EXPECT_EQ(c->add("n", -7).value(), -2);
  EXPECT_EQ(c->add("n", 0).value(), -2);
  EXPECT_EQ(c->get("n", 1s).value(), "-2");
  STRATA_ASSERT_OK(c->set("text", "hello"));
  auto bad = c->add("text", 1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::InvalidArgument);
  EXPECT_NE(bad.status().message().find("not an integer"), std::string::npos) << bad.status().message();
  // An add creates the key, so it wakes a waiter.
  auto other = client();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    STRATA_ASSERT_OK(other->add("counter", 1));
  });
  EXPECT_EQ(c->get("counter", 5s).value(), "1");
  t.join();
}

TEST_F(StoreTest, CompareSetSwapsOnlyOnMatch) {
  auto c = client();
  // A missing key matches an empty expected value.
  EXPECT_EQ(c->compare_set("leader", "", "rank3").value(), "rank3");
  // Mismatch: unchanged, the current value comes back.
  EXPECT_EQ(c->compare_set("leader", "", "rank5").value(), "rank3");
  EXPECT_EQ(c->compare_set("leader", "rank4", "rank5").value(), "rank3");
  EXPECT_EQ(c->get("leader", 1s).value(), "rank3");
  // Match: swapped.
  EXPECT_EQ(c->compare_set("leader", "rank3", "rank5").value(), "rank5");
  EXPECT_EQ(c->get("leader", 1s).value(), "rank5");
  // Missing key with a non-empty expectation: stays missing.
  EXPECT_EQ(c->compare_set("ghost", "x", "y").value(), "");
  EXPECT_FALSE(c->try_get("ghost")->has_value());
}

TEST_F(StoreTest, DelListAndDeletePrefix) {
  auto c = client();
  for (const char* k : {"job/b", "job/a", "job/c/1", "jobx", "other"}) STRATA_ASSERT_OK(c->set(k, "v"));
  EXPECT_EQ(c->list("job/").value(), (std::vector<std::string>{"job/a", "job/b", "job/c/1"}));
  EXPECT_EQ(c->list("").value().size(), 5u);
  EXPECT_TRUE(c->list("nothing").value().empty());
  EXPECT_TRUE(c->del("job/b").value());
  EXPECT_FALSE(c->del("job/b").value());
  EXPECT_EQ(c->list("job/").value(), (std::vector<std::string>{"job/a", "job/c/1"}));
  EXPECT_EQ(c->delete_prefix("job").value(), 3);  // job/a, job/c/1, jobx
  EXPECT_EQ(c->delete_prefix("job").value(), 0);
  EXPECT_EQ(c->list("").value(), std::vector<std::string>{"other"});
  // A deleted key is waited for again.
  EXPECT_EQ(c->get("job/a", 100ms).status().code(), Code::Timeout);
}

TEST_F(StoreTest, PrefixStoreNamespacesKeys) {
  std::shared_ptr<StoreClient> shared = client();
  PrefixStore comm1(shared, "comm1/");
  PrefixStore comm2(shared, "comm2/");
  STRATA_ASSERT_OK(comm1.set("k", "one"));
  STRATA_ASSERT_OK(comm2.set("k", "two"));
  EXPECT_EQ(comm1.get("k", 1s).value(), "one");
  EXPECT_EQ(comm2.get("k", 1s).value(), "two");
  EXPECT_EQ(comm1.add("n", 2).value(), 2);
  STRATA_EXPECT_OK(comm1.wait({"k", "n"}, 1s));
  EXPECT_EQ(shared->get("comm1/n", 1s).value(), "2");
}

TEST_F(StoreTest, WrongOrMissingTokenIsRefusedWithAClearMessage) {
  auto start = Clock::now();
  auto wrong = StoreClient::connect(addr(), "not-the-token", Deadline::after(10s));
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().code(), Code::InvalidArgument);
  const std::string& m = wrong.status().message();
  EXPECT_NE(m.find("store at " + addr().to_string() + " refused the connection: wrong job token"), std::string::npos)
      << m;
  EXPECT_NE(m.find("set STRATA_JOB_TOKEN to the token of the job"), std::string::npos) << m;
  // Refusal is final: no retrying until the deadline.
  EXPECT_LT(elapsed_ms(start), 2000);

  auto missing = StoreClient::connect(addr(), "", Deadline::after(10s));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), Code::InvalidArgument);
  EXPECT_NE(missing.status().message().find("job token is empty"), std::string::npos) << missing.status().message();
  // The server is unharmed.
  auto c = client();
  STRATA_EXPECT_OK(c->set("k", "v"));
}

TEST_F(StoreTest, GarbageOnTheSocketDoesNotDisturbOtherClients) {
  auto good = client();
  int raw = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(server_->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(raw, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const char http[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::send(raw, http, sizeof http - 1, MSG_NOSIGNAL), 0);
  // The server answers with an error frame and closes: read until EOF.
  char buf[256];
  timeval tv{5, 0};
  ::setsockopt(raw, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ssize_t n;
  while ((n = ::recv(raw, buf, sizeof buf, 0)) > 0) {
  }
  EXPECT_EQ(n, 0) << "server should close a connection that does not speak the protocol";
  ::close(raw);
  // An idle unauthenticated connection must not block anyone either.
  int idle = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  STRATA_ASSERT_OK(good->set("still", "working"));
  EXPECT_EQ(good->get("still", 1s).value(), "working");
  ::close(idle);
}

TEST_F(StoreTest, SixtyFourClientsAddingConcurrentlyGiveAnExactCount) {
  constexpr int kClients = 64, kAdds = 50;
  std::vector<std::thread> threads;
  threads.reserve(kClients);
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&] {
      auto c = StoreClient::connect(addr(), kToken, Deadline::after(10s));
      if (!c.is_ok()) {
        ++failures;
        return;
      }
      for (int j = 0; j < kAdds; ++j)
        if (!(*c)->add("count", 1).is_ok()) ++failures;
      if (!(*c)->add("done", 1).is_ok()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto c = client();
  EXPECT_EQ(c->add("count", 0).value(), kClients * kAdds);
  EXPECT_EQ(c->add("done", 0).value(), kClients);
}

TEST_F(StoreTest, OneClientSharedByThreadsSerialisesRequests) {
  auto c = client();
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      for (int j = 0; j < 100; ++j) {
        STRATA_ASSERT_OK(c->add("shared", 1));
        std::string k = "t" + std::to_string(i) + "/" + std::to_string(j);
        STRATA_ASSERT_OK(c->set(k, k));
        ASSERT_EQ(c->get(k, 1s).value(), k);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->add("shared", 0).value(), 800);
}

TEST_F(StoreTest, ManyParkedWaitersAreAllWokenByOneSet) {
  constexpr int kWaiters = 32;
  std::vector<std::thread> threads;
  threads.reserve(kWaiters);
  std::atomic<int> woke{0};
  for (int i = 0; i < kWaiters; ++i)
    threads.emplace_back([&] {
      auto c = StoreClient::connect(addr(), kToken, Deadline::after(10s));
      STRATA_ASSERT_OK(c);
      auto v = (*c)->get("go", 10s);
      if (v.is_ok() && *v == "now") ++woke;
    });
  std::this_thread::sleep_for(200ms);
  auto start = Clock::now();
  STRATA_ASSERT_OK(client()->set("go", "now"));
  for (auto& t : threads) t.join();
  EXPECT_EQ(woke.load(), kWaiters);
  EXPECT_LT(elapsed_ms(start), 3000);
}

TEST(StoreConnectTest, UnreachableStoreGivesUnavailableNamingTheAddress) {
  StoreAddress addr{"127.0.0.1", free_port()};
  auto start = Clock::now();
  auto c = StoreClient::connect(addr, kToken, Deadline::after(300ms));
  long ms = elapsed_ms(start);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), Code::Unavailable);
  EXPECT_NE(c.status().message().find(addr.to_string()), std::string::npos) << c.status().message();
  EXPECT_GE(ms, 290);
  EXPECT_LT(ms, 2000);
}

TEST(StoreConnectTest, ConnectRetriesUntilTheServerAppears) {
  uint16_t port = free_port();
  Result<std::unique_ptr<StoreClient>> c = unavailable("not yet");
  auto start = Clock::now();
  std::thread t([&] { c = StoreClient::connect({"127.0.0.1", port}, kToken, Deadline::after(10s)); });
  std::this_thread::sleep_for(300ms);
  auto server = StoreServer::start("127.0.0.1", port, kToken);
  STRATA_ASSERT_OK(server);
  t.join();
  STRATA_ASSERT_OK(c);
  EXPECT_GE(elapsed_ms(start), 290);
  EXPECT_LT(elapsed_ms(start), 3000);  // backoff is capped, so it notices the server quickly
  STRATA_EXPECT_OK((*c)->set("k", "v"));
}

// A restarted store has lost every key: the waiters fail with PeerFailed at the reconnect
// (issue 18 item 9) instead of waiting on an empty store; a new client uses the new store.
TEST(StoreRestartTest, WaitingClientsMeetingARestartedServerFailAndNewClientsUseIt) {
  auto first = StoreServer::start("127.0.0.1", 0, kToken);
  STRATA_ASSERT_OK(first);
  uint16_t port = (*first)->port();
  StoreAddress addr{"127.0.0.1", port};

  constexpr int kWaiters = 4;
  std::vector<std::thread> threads;
  threads.reserve(kWaiters);
  std::vector<Result<std::string>> got(kWaiters, Result<std::string>(unavailable("not run")));
  for (int i = 0; i < kWaiters; ++i)
    threads.emplace_back([&, i] {
      auto c = StoreClient::connect(addr, kToken, Deadline::after(5s));
      STRATA_ASSERT_OK(c);
      (*c)->set_reconnect_timeout(5s);
      STRATA_ASSERT_OK((*c)->set("before/" + std::to_string(i), "x"));
      got[i] = (*c)->get("after-restart", 15s);
    });
  std::this_thread::sleep_for(300ms);  // let them park on the first server
  (*first)->stop();
  (*first)->stop();  // idempotent
  first = unavailable("stopped");
  std::this_thread::sleep_for(200ms);  // they are now in their reconnect backoff

  auto second = StoreServer::start("127.0.0.1", port, kToken);
  STRATA_ASSERT_OK(second);
  auto setter = StoreClient::connect(addr, kToken, Deadline::after(5s));
  STRATA_ASSERT_OK(setter);
  auto start = Clock::now();
  STRATA_ASSERT_OK((*setter)->set("after-restart", "hello again"));
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_FALSE(got[i].is_ok()) << "waiter " << i;
    EXPECT_EQ(got[i].status().code(), Code::PeerFailed) << "waiter " << i << ": " << got[i].status().to_string();
  }
  EXPECT_LT(elapsed_ms(start), 3000);
  // The new server started empty.
  EXPECT_FALSE((*setter)->try_get("before/0")->has_value());
}

TEST(StoreRestartTest, ServerGoneForGoodGivesUnavailableAfterTheReconnectTimeout) {
  auto server = StoreServer::start("127.0.0.1", 0, kToken);
  STRATA_ASSERT_OK(server);
  StoreAddress addr{"127.0.0.1", (*server)->port()};
  auto c = StoreClient::connect(addr, kToken, Deadline::after(5s));
  STRATA_ASSERT_OK(c);
  (*c)->set_reconnect_timeout(300ms);
  Result<std::string> v = unavailable("not run");
  auto start = Clock::now();
  std::thread t([&] { v = (*c)->get("k", 10s); });
  std::this_thread::sleep_for(100ms);
  (*server)->stop();
  t.join();
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), Code::Unavailable);
  EXPECT_NE(v.status().message().find(addr.to_string()), std::string::npos) << v.status().message();
  EXPECT_LT(elapsed_ms(start), 3000);
}

TEST(StoreRestartTest, WaitWhileTheServerIsAwayEndsAtItsOwnDeadline) {
  auto server = StoreServer::start("127.0.0.1", 0, kToken);
  STRATA_ASSERT_OK(server);
  auto c = StoreClient::connect({"127.0.0.1", (*server)->port()}, kToken, Deadline::after(5s));
  STRATA_ASSERT_OK(c);
  (*c)->set_reconnect_timeout(30s);
  Result<std::string> v = unavailable("not run");
  auto start = Clock::now();
  std::thread t([&] { v = (*c)->get("k", 500ms); });
  std::this_thread::sleep_for(100ms);
  (*server)->stop();
  t.join();
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), Code::Timeout);
  EXPECT_NE(v.status().message().find("'k'"), std::string::npos) << v.status().message();
  EXPECT_LT(elapsed_ms(start), 2500) << "the 30 s reconnect timeout must not stretch a 500 ms wait";
}

}  // namespace
}  // namespace strata::bootstrap

// A rank for the launcher test across namespaces: checks that `strata run --nnodes` placed
// it where the node order says (global rank, local rank, node, host identity, hostname),
// then exchanges values with every other rank through the store the agents share.
//
//   mh_smoke_rank COUNTS     COUNTS = ranks per node, e.g. 1,2,2

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"

namespace {

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  using namespace std::chrono_literals;
  if (argc != 2) {
    std::fprintf(stderr, "usage: mh_smoke_rank COUNTS (ranks per node, e.g. 1,2,2)\n");
    return 2;
  }
  std::vector<int> counts;
  {
    std::stringstream in(argv[1]);
    for (std::string c; std::getline(in, c, ',');) counts.push_back(std::stoi(c));
  }
  int world = 0;
  for (int c : counts) world += c;

  Env env = Env::from_process();
  auto job = bootstrap::detect_job(env);
  if (!job.is_ok()) return fail(-1, "detect_job: " + job.status().to_string());
  const int rank = job->rank;

  // Where this rank must be, from the node order alone.
  int node = 0, base = 0;
  while (node < static_cast<int>(counts.size()) && rank >= base + counts[node]) base += counts[node++];
  if (node >= static_cast<int>(counts.size()))
    return fail(rank, "rank beyond the " + std::to_string(world) + " expected");
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof host - 1);
  auto expect = [&](const char* what, const std::string& got, const std::string& want) -> bool {
    if (got == want) return true;
    std::fprintf(stderr, "rank %d: FAILED: %s is '%s', expected '%s'\n", rank, what, got.c_str(), want.c_str());
    return false;
  };
  auto str = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("unset"); };
  bool ok = expect("world size", std::to_string(job->world_size), std::to_string(world)) &
            expect("node rank", str(env.node_rank), std::to_string(node)) &
            expect("node count", str(env.nnodes), std::to_string(counts.size())) &
            expect("local rank", str(env.local_rank), std::to_string(rank - base)) &
            expect("local size", str(env.local_size), std::to_string(counts[node])) &
            expect("host id", job->host_id, "mh-h" + std::to_string(node)) &
            expect("hostname", host, "h" + std::to_string(node));
  if (!ok) return 1;

  auto addr = bootstrap::StoreAddress::parse(job->store);
  if (!addr.is_ok()) return fail(rank, addr.status().to_string());
  auto client = bootstrap::StoreClient::connect(*addr, job->token, Deadline::after(10s));
  if (!client.is_ok()) return fail(rank, "connect to the store: " + client.status().to_string());
  auto& store = **client;

  // Every rank publishes where it runs and a value only it knows; every rank checks all.
  auto value_of = [](int r) { return std::to_string(1000003LL * (r + 1)); };
  std::vector<std::string> keys, added;
  for (int r = 0; r < world; ++r) {
    keys.push_back("smoke/rank/" + std::to_string(r));
    added.push_back("smoke/added/" + std::to_string(r));
  }
  std::string mine = job->host_id + "|" + std::to_string(node) + "|" + value_of(rank);
  Status s = store.set(keys[rank], mine);
  if (s.is_ok()) s = store.add("smoke/sum", rank + 1).status();
  if (s.is_ok()) s = store.set(added[rank], "1");
  if (s.is_ok()) s = store.wait(keys, 20s);
  if (s.is_ok()) s = store.wait(added, 20s);
  if (!s.is_ok()) return fail(rank, "store exchange: " + s.to_string());
  int other_hosts = 0;
  for (int r = 0, n = 0, b = 0; r < world; ++r) {
    while (r >= b + counts[n]) b += counts[n++];
    auto v = store.get(keys[r], 1s);
    if (!v.is_ok()) return fail(rank, "get " + keys[r] + ": " + v.status().to_string());
    std::string want = "mh-h" + std::to_string(n) + "|" + std::to_string(n) + "|" + value_of(r);
    if (*v != want) return fail(rank, keys[r] + " is '" + *v + "', expected '" + want + "'");
    if (n != node) ++other_hosts;
  }
  auto sum = store.add("smoke/sum", 0);
  if (!sum.is_ok()) return fail(rank, "sum: " + sum.status().to_string());
  if (*sum != int64_t{world} * (world + 1) / 2)
    return fail(rank, "sum of rank+1 over all ranks is " + std::to_string(*sum) + ", expected " +
                          std::to_string(int64_t{world} * (world + 1) / 2));
  std::printf("rank %d of %d on %s (node %d, local %d of %d): ok, met %d ranks on other hosts\n", rank, world, host,
              node, rank - base, counts[node], other_hosts);
  return 0;
}

// A rank for launcher tests: finds its placement and the store in the environment, then
// waits until every rank has checked in.

#include <cstdio>

#include "bootstrap/job_info.hpp"
#include "bootstrap/store.hpp"

int main() {
  using namespace strata;
  using namespace std::chrono_literals;
  Env env = Env::from_process();
  auto job = bootstrap::detect_job(env);
  if (!job.is_ok()) {
    std::fprintf(stderr, "detect_job: %s\n", job.status().to_string().c_str());
    return 1;
  }
  auto addr = bootstrap::StoreAddress::parse(job->store);
  if (!addr.is_ok()) {
    std::fprintf(stderr, "%s\n", addr.status().to_string().c_str());
    return 1;
  }
  auto client = bootstrap::StoreClient::connect(*addr, job->token, Deadline::after(10s));
  if (!client.is_ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().to_string().c_str());
    return 1;
  }
  auto& store = **client;
  std::vector<std::string> keys;
  keys.reserve(job->world_size);
  for (int r = 0; r < job->world_size; ++r) keys.push_back("checkin/" + std::to_string(r));
  Status s = store.set(keys[job->rank], job->job_id);
  if (s.is_ok()) s = store.wait(keys, 10s);
  if (!s.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", job->rank, s.to_string().c_str());
    return 1;
  }
  // Every rank must have derived the same job id.
  for (const auto& k : keys) {
    auto v = store.get(k, 1s);
    if (!v.is_ok() || *v != job->job_id) {
      std::fprintf(stderr, "rank %d: %s has job id '%s', mine is '%s'\n", job->rank, k.c_str(),
                   v.is_ok() ? v->c_str() : "?", job->job_id.c_str());
      return 1;
    }
  }
  std::printf("rank %d: all %d ranks met\n", job->rank, job->world_size);
  return 0;
}

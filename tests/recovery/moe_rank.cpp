// A rank for Recovery.MoeBufferWorksAfterAPeerIsReplaced (issue 18 item 8): 4 ranks, one
// moe::Buffer with identity experts. Survivors run dispatch + combine until rank 2's original
// process dies by SIGKILL at its 3rd call, recover() and go on with the same Buffer; the
// replacement makes its own. Then every rank runs 3 Prefill and 3 Decode calls and checks
// out[t] = x[t] * sum of its valid weights against a local reference. Before rank 2 dies every
// rank makes a Relay dispatch nobody combines; after recover() the survivors combine it, which
// must fail as stale and refuse nothing (a refusal would meet the replacement's first call). Each rank prints
// "MOE_OK rank=R" or "MOE_BAD rank=R ..." and exits 1.
//
// With the argument `mask` (issue 17 item 2) the Buffer masks failed ranks: rank 2 dies after
// one Prefill and one Decode call; the survivors repeat both calls (same inputs, so no window
// has to grow) and must get rank 2's experts dropped, without an error, and the dropped
// selections reported per token; then a barrier fails, they recover() and go on as above
// (the replaced rank re-attached, results unmasked again).
//
//   strata run --ft -n 4 moe_rank [mask]

#include <strata/moe.hpp>
#include <strata/recovery.hpp>
#include <strata/strata.hpp>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr int kE = 8, kK = 2;
constexpr size_t kH = 16, kM = 8;

constexpr int kDead = 2, kL = kE / 4;

/// One call with identity experts on inputs that depend on (rank, call); false on a mismatch.
/// With `dead`, rank 2's experts must be dropped (and reported so); rank 2 is masked.
bool call(strata::moe::Buffer& ep, int rank, int n, strata::moe::Schedule s, bool dead = false) {
  const size_t T = 1 + static_cast<size_t>(rank + n) % kM;
  std::vector<float> x(T * kH), w(T * kK), out(T * kH);
  std::vector<int64_t> idx(T * kK);
  for (size_t t = 0; t < T; ++t) {
    for (size_t h = 0; h < kH; ++h) x[t * kH + h] = static_cast<float>(rank * 1000 + n * 100 + t * 10) + h * 0.5f;
    for (int k = 0; k < kK; ++k) {
      int64_t e = static_cast<int64_t>((t * 3 + k * 5 + rank + n) % kE);
      idx[t * kK + k] = (t + k + n) % 5 == 0 ? -1 : e;  // some -1 too
      w[t * kK + k] = 0.25f * static_cast<float>(k + 1);
    }
  }
  strata::moe::Dispatch d =
      ep.dispatch(std::span<const float>(x), std::span<const int64_t>(idx), std::span<const float>(w), s);
  // Identity experts: the rows in the window are the outputs.
  ep.combine(d.window, d.handle, out.data());
  auto lost = [&](size_t i) { return dead && idx[i] >= 0 && idx[i] / kL == kDead; };
  std::vector<uint32_t> dropped = d.handle.dropped();
  for (size_t t = 0; t < T; ++t) {
    uint32_t want = 0;
    for (int k = 0; k < kK; ++k) want += lost(t * kK + k);
    if (dropped.size() != T || dropped[t] != want) {
      std::printf("MOE_BAD rank=%d call=%d schedule=%s t=%zu dropped=%u want=%u\n", rank, n, strata::moe::to_string(s),
                  t, dropped.size() == T ? dropped[t] : 999u, want);
      return false;
    }
  }
  for (size_t t = 0; t < T; ++t)
    for (size_t h = 0; h < kH; ++h) {
      float want = 0.0f;
      for (int k = 0; k < kK; ++k)
        if (idx[t * kK + k] >= 0 && !lost(t * kK + k)) want += w[t * kK + k] * x[t * kH + h];
      float got = out[t * kH + h];
      if (std::fabs(got - want) > 1e-3f * std::fabs(want) + 1e-6f) {
        std::printf("MOE_BAD rank=%d call=%d schedule=%s t=%zu h=%zu got=%g want=%g\n", rank, n,
                    strata::moe::to_string(s), t, h, got, want);
        return false;
      }
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const bool mask = argc > 1 && std::string(argv[1]) == "mask";
    strata::Communicator comm = strata::init();
    const int rank = comm.rank();
    const bool replacement = strata::recovery::is_replacement();
    strata::moe::Config cfg{
        .num_experts = kE, .hidden = kH, .max_tokens = kM, .topk = kK, .dtype = strata::DataType::Float32};
    cfg.mask_failed_ranks = mask;
    strata::moe::Buffer ep(comm, cfg);
    bool ok = true;
    if (!replacement && mask) {
      using strata::moe::Schedule;
      ok = call(ep, rank, 0, Schedule::Prefill) && ok;
      ok = call(ep, rank, 1, Schedule::Decode) && ok;
      if (rank == kDead) {
        strata::recovery::mark_failure(comm);
        ::raise(SIGKILL);
      }
      for (int i = 0; i < 2; ++i) {
        ok = call(ep, rank, 0, Schedule::Prefill, true) && ok;
        ok = call(ep, rank, 1, Schedule::Decode, true) && ok;
      }
      try {
        comm.barrier();
        std::printf("MOE_BAD rank=%d the barrier after rank 2's death succeeded\n", rank);
        return 1;
      } catch (const strata::Error& e) {
        if (e.code() != strata::Code::PeerFailed && e.code() != strata::Code::Aborted) throw;
      }
      comm.recover();
    } else if (!replacement) {
      std::optional<strata::moe::Dispatch> stale;
      try {
        for (int n = 0; n < 6; ++n) {
          if (n == 2) {
            // A Relay dispatch every rank completes and nobody combines: after recover() its
            // handle is stale, and combining it must refuse nothing into the new epoch.
            std::vector<float> x(kH, 1.0f), w(kK, 0.5f);
            std::vector<int64_t> idx = {0, kE - 1};
            stale = ep.dispatch(x.data(), 1, idx.data(), w.data(), strata::moe::Schedule::Relay);
            if (rank == 2) {
              strata::recovery::mark_failure(comm);
              ::raise(SIGKILL);
            }
            comm.barrier();  // fails: rank 2 is gone
          }
          auto s = n % 2 ? strata::moe::Schedule::Decode : strata::moe::Schedule::Prefill;
          ok = call(ep, rank, n, s) && ok;
        }
        std::printf("MOE_BAD rank=%d the failure of rank 2 was not seen\n", rank);
        return 1;
      } catch (const strata::Error& e) {
        if (e.code() != strata::Code::PeerFailed && e.code() != strata::Code::Aborted &&
            e.code() != strata::Code::Timeout)
          throw;
      }
      comm.recover();
      if (stale) {
        std::vector<float> out(kH);
        try {
          ep.combine(stale->window, stale->handle, out.data());
          std::printf("MOE_BAD rank=%d a combine with a handle from before recover() succeeded\n", rank);
          return 1;
        } catch (const strata::Error& e) {
          if (e.code() != strata::Code::InvalidArgument ||
              std::string(e.what()).find("before recover()") == std::string::npos) {
            std::printf("MOE_BAD rank=%d stale combine: %s\n", rank, e.what());
            return 1;
          }
        }
      }
    }
    for (int n = 10; n < 16; ++n) {
      auto s = n < 13 ? strata::moe::Schedule::Prefill : strata::moe::Schedule::Decode;
      ok = call(ep, rank, n, s) && ok;
    }
    comm.barrier();
    std::printf(ok ? "MOE_OK rank=%d\n" : "MOE_BAD rank=%d\n", rank);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_rank: %s\n", e.what());
    return 1;
  }
}

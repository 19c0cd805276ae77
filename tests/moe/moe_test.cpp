// MoE dispatch/combine (DESIGN §5): every valid (t, k) delivered exactly once into the right
// range, payloads bit-exact, combine equal to a single-process reference computed here (not
// with the library's kernels), the three schedules agreeing byte for byte, argument checks,
// and a killed peer failing the others instead of hanging them.

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <iostream>

#include <strata/moe.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "coll/harness.hpp"
#include "moe/moe_values.hpp"

namespace strata::test {
namespace {

using moe::Schedule;
using namespace std::chrono_literals;

// ---- values, independent of the library's kernels -----------------------------------------

using namespace strata::test::moe_values;

struct Shape {
  int R, E, K;
  size_t H, M, T;
  DataType dt;
  Routing routing;
  size_t align = 1;
};

/// One rank's inputs, reproducible from (shape, rank, salt) so every rank can rebuild any
/// other rank's inputs for its checks.
struct Inputs {
  std::vector<unsigned char> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
};

Inputs make_inputs(const Shape& s, int rank, uint64_t salt) {
  std::mt19937_64 rng(salt * 1000003u + static_cast<uint64_t>(rank) * 7919u + 17u);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), wd(0.05f, 1.0f), u01(0.0f, 1.0f);
  Inputs in;
  in.x.resize(s.T * s.H * dtype_size(s.dt));
  for (size_t i = 0; i < s.T * s.H; ++i) put(s.dt, in.x.data(), i, val(rng));
  in.idx.assign(s.T * s.K, -1);
  in.w.resize(s.T * s.K);
  for (auto& v : in.w) v = wd(rng);
  std::vector<int64_t> perm(s.E);
  for (size_t t = 0; t < s.T; ++t) {
    int64_t* row = &in.idx[t * s.K];
    if (s.routing == Routing::Skewed) {
      for (int k = 0; k < s.K; ++k) row[k] = k;  // every token to expert 0 (and the next K-1)
      continue;
    }
    if (s.routing == Routing::EmptyRows && t % 2 == 0) continue;  // a row of only -1
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < s.K; ++k) row[k] = u01(rng) < 0.15f ? -1 : perm[k];
  }
  return in;
}

/// What expert e computes in the tests: a per-expert scale, so a row routed to the wrong
/// expert (or a token's rows mixed up) changes the combined result.
float expert_scale(int64_t e) { return 1.0f + 0.125f * static_cast<float>(e); }

/// out[t] = round(sum_k w * round(x[t] * scale(e_k))) in float32, k ascending.
std::vector<unsigned char> reference_combine(const Shape& s, const Inputs& in, bool identity) {
  std::vector<unsigned char> out(s.T * s.H * dtype_size(s.dt));
  std::vector<float> acc(s.H);
  for (size_t t = 0; t < s.T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < s.K; ++k) {
      int64_t e = in.idx[t * s.K + k];
      if (e < 0) continue;
      float w = in.w[t * s.K + k];
      for (size_t h = 0; h < s.H; ++h) {
        float y = get(s.dt, in.x.data(), t * s.H + h);
        if (!identity) y = round_to(s.dt, y * expert_scale(e));
        float p = w * y;
        acc[h] = acc[h] + p;
      }
    }
    for (size_t h = 0; h < s.H; ++h) put(s.dt, out.data(), t * s.H + h, acc[h]);
  }
  return out;
}

std::string at(const Shape& s, Schedule sc) {
  std::ostringstream o;
  o << "[" << moe::to_string(sc) << " R=" << s.R << " E=" << s.E << " K=" << s.K << " T=" << s.T << " H=" << s.H << " "
    << to_string(s.dt) << " " << routing_name(s.routing) << " align=" << s.align << "] ";
  return o.str();
}

/// Exactly-once delivery and layout: for every local expert l and source s, count(l, s) is
/// the number of s's tokens routed to expert e, its rows start at offset(l, s), and row j is
/// bit-for-bit x_s of the j-th such token. Compact layouts: ranges contiguous per expert in
/// source order, aligned, inside total_rows.
void check_layout(const Shape& s, Schedule sc, const moe::Dispatch& d, int me, const std::vector<Inputs>& all) {
  const int L = s.E / s.R;
  const size_t rb = s.H * dtype_size(s.dt);
  STRATA_TEST_REQUIRE(d.local_experts == L && d.ranks == s.R, at(s, sc) << "rank " << me << ": L/R in the result");
  for (int l = 0; l < L; ++l) {
    const int64_t e = static_cast<int64_t>(me) * L + l;
    size_t next = 0;
    for (int src = 0; src < s.R; ++src) {
      std::vector<size_t> toks;
      for (size_t t = 0; t < s.T; ++t)
        for (int k = 0; k < s.K; ++k)
          if (all[src].idx[t * s.K + k] == e) toks.push_back(t);
      STRATA_TEST_REQUIRE(d.count(l, src) == toks.size(), at(s, sc) << "rank " << me << ": count(l=" << l
                                                                    << ", src=" << src << ") = " << d.count(l, src)
                                                                    << ", expected " << toks.size());
      size_t off = d.offset(l, src);
      if (d.masked()) {
        STRATA_TEST_REQUIRE(off == (static_cast<size_t>(l) * s.R + src) * s.M,
                            at(s, sc) << "masked offset of (" << l << "," << src << ")");
      } else {
        if (src == 0) {
          STRATA_TEST_REQUIRE(off % s.align == 0 && off >= next, at(s, sc) << "rank " << me << ": expert " << l
                                                                           << " starts at " << off << " (alignment "
                                                                           << s.align << ")");
        } else {
          STRATA_TEST_REQUIRE(off == next, at(s, sc)
                                               << "rank " << me << ": range of (l=" << l << ", src=" << src << ") at "
                                               << off << ", expected " << next << " (ordered by source)");
        }
      }
      STRATA_TEST_REQUIRE(off + toks.size() <= d.total_rows, at(s, sc) << "range past total_rows");
      for (size_t j = 0; j < toks.size(); ++j) {
        const unsigned char* got = reinterpret_cast<const unsigned char*>(d.window) + (off + j) * rb;
        const unsigned char* want = all[src].x.data() + toks[j] * rb;
        if (std::memcmp(got, want, rb) != 0) {
          size_t h = 0;
          while (h < s.H && std::memcmp(got + h * dtype_size(s.dt), want + h * dtype_size(s.dt), dtype_size(s.dt)) == 0)
            ++h;
          STRATA_TEST_REQUIRE(false, at(s, sc) << "rank " << me << ": expert " << l << " row " << j << " from rank "
                                               << src << " (token " << toks[j] << ") differs at h=" << h << ": got "
                                               << get(s.dt, got, h) << ", want " << get(s.dt, want, h));
        }
      }
      next = off + toks.size();
    }
    if (!d.masked()) {
      // Padding between experts: the next expert begins at the next multiple of align.
      if (l + 1 < L)
        STRATA_TEST_REQUIRE(
            d.offset(l + 1) == (next + s.align - 1) / s.align * s.align,
            at(s, sc) << "rank " << me << ": expert " << l + 1 << " at " << d.offset(l + 1) << " after " << next);
    }
  }
}

void compare_out(const Shape& s, Schedule sc, int me, const std::vector<unsigned char>& got,
                 const std::vector<unsigned char>& want, const char* what) {
  if (got == want) return;
  size_t i = 0;
  const size_t es = dtype_size(s.dt);
  while (i < s.T * s.H && std::memcmp(&got[i * es], &want[i * es], es) == 0) ++i;
  STRATA_TEST_REQUIRE(false, at(s, sc) << "rank " << me << ": " << what << " differs at token " << i / s.H
                                       << " h=" << i % s.H << ": got " << get(s.dt, got.data(), i) << ", want "
                                       << get(s.dt, want.data(), i));
}

/// Applies the test's experts to the received rows, in place in the window.
void run_experts(const Shape& s, const moe::Dispatch& d, int me) {
  const int L = s.E / s.R;
  const size_t rb = s.H * dtype_size(s.dt);
  for (int l = 0; l < L; ++l)
    for (int src = 0; src < s.R; ++src) {
      unsigned char* base = reinterpret_cast<unsigned char*>(d.window) + d.offset(l, src) * rb;
      for (size_t i = 0; i < d.count(l, src) * s.H; ++i)
        put(s.dt, base, i, get(s.dt, base, i) * expert_scale(static_cast<int64_t>(me) * L + l));
    }
}

/// The full check of one shape on one rank: for each schedule, layout + identity combine +
/// real-expert combine, then the schedules must agree and a repeat must give the same bytes.
void check_shape(Communicator& c, const Shape& s, uint64_t salt) {
  const int me = c.rank();
  std::vector<Inputs> all;
  for (int r = 0; r < s.R; ++r) all.push_back(make_inputs(s, r, salt));
  const Inputs& mine = all[me];
  const auto ref_identity = reference_combine(s, mine, true);
  const auto ref_experts = reference_combine(s, mine, false);
  moe::Buffer buf(
      c,
      {.num_experts = s.E, .hidden = s.H, .max_tokens = s.M, .topk = s.K, .dtype = s.dt, .expert_alignment = s.align});
  std::vector<std::vector<unsigned char>> results;
  std::vector<unsigned char> out(ref_identity.size());
  for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay, Schedule::Prefill}) {
    auto d = buf.dispatch(mine.x.data(), s.T, mine.idx.data(), mine.w.data(), sc);
    check_layout(s, sc, d, me, all);
    buf.combine(d.window, d.handle, out.data());
    compare_out(s, sc, me, out, ref_identity, "identity combine");
    // out[t] = x[t] * sum of valid w, up to the rounding of the two sides.
    for (size_t t = 0; t < s.T; ++t) {
      float sw = 0;
      for (int k = 0; k < s.K; ++k)
        if (mine.idx[t * s.K + k] >= 0) sw += mine.w[t * s.K + k];
      for (size_t h = 0; h < s.H; h += 7) {
        float want = get(s.dt, mine.x.data(), t * s.H + h) * sw;
        float got = get(s.dt, out.data(), t * s.H + h);
        float tol = (s.dt == DataType::Float32   ? 1e-5f
                     : s.dt == DataType::Float16 ? 2e-3f
                                                 : 1.6e-2f) *
                    (std::fabs(want) + 1.0f) * static_cast<float>(s.K);
        STRATA_TEST_REQUIRE(std::fabs(got - want) <= tol, at(s, sc)
                                                              << "rank " << me << ": identity token " << t << " h=" << h
                                                              << ": got " << got << ", want x*sum(w) = " << want);
      }
    }
    d = buf.dispatch(mine.x.data(), s.T, mine.idx.data(), mine.w.data(), sc);
    run_experts(s, d, me);
    buf.combine(d.window, d.handle, out.data());
    compare_out(s, sc, me, out, ref_experts, "expert combine");
    results.push_back(out);
  }
  for (size_t i = 1; i < results.size(); ++i)
    STRATA_TEST_REQUIRE(results[i] == results[0], at(s, Schedule::Prefill) << "rank " << me << ": schedule run " << i
                                                                           << " gives other bytes than run 0");
}

void run_team(int R, const std::function<void(Communicator&)>& fn) {
  auto failures = Team::get(R).run(fn);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// ---- the matrix ---------------------------------------------------------------------------

struct MatrixParam {
  int R, e_factor, K;
  int t_kind;  // 0: no tokens, 1: one token, 2: max_tokens
  Routing routing;
};

class MoeMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(MoeMatrix, DeliveryLayoutCombineAndScheduleAgreement) {
  const MatrixParam p = GetParam();
  const int E = p.R * p.e_factor;
  static const DataType kTypes[] = {DataType::BFloat16, DataType::Float16, DataType::Float32};
  Shape s{p.R, E, p.K, 40, 12, 0, kTypes[(p.e_factor + p.K + p.t_kind + static_cast<int>(p.routing)) % 3], p.routing};
  s.T = p.t_kind == 0 ? 0 : p.t_kind == 1 ? 1 : s.M;
  s.align = (p.K + p.t_kind) % 2 ? 4 : 1;
  run_team(p.R, [&](Communicator& c) { check_shape(c, s, 1 + p.R * 131 + E * 7 + p.K); });
}

std::vector<MatrixParam> matrix_params() {
  std::vector<MatrixParam> v;
  for (int R : {1, 2, 4, 8})
    for (int ef : {1, 4, 16})
      for (int K : {1, 2, 8})
        for (int tk : {0, 1, 2})
          for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::EmptyRows}) {
            if (K > R * ef) continue;                        // topk <= experts
            if (tk != 2 && r != Routing::Uniform) continue;  // routing matters only with many tokens
            v.push_back({R, ef, K, tk, r});
          }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, MoeMatrix, ::testing::ValuesIn(matrix_params()),
                         [](const ::testing::TestParamInfo<MatrixParam>& i) {
                           const auto& p = i.param;
                           return "R" + std::to_string(p.R) + "_E" + std::to_string(p.R * p.e_factor) + "_K" +
                                  std::to_string(p.K) + "_T" +
                                  (p.t_kind == 0   ? "0"
                                   : p.t_kind == 1 ? "1"
                                                   : "M") +
                                  "_" + routing_name(p.routing);
                         });

// ---- reuse, growth, where y lives --------------------------------------------------------

TEST(Moe, WindowsReusedAcrossIterationsWithChangingBatches) {
  // Batches of varying size and skew on one Buffer: the Prefill window grows (collectively)
  // when a skewed batch needs more rows, and every iteration stays exact.
  run_team(4, [](Communicator& c) {
    Shape s{4, 16, 4, 24, 32, 0, DataType::BFloat16, Routing::Uniform};
    moe::Buffer buf(c, {.num_experts = s.E, .hidden = s.H, .max_tokens = s.M, .topk = s.K, .dtype = s.dt});
    for (int it = 0; it < 24; ++it) {
      Shape si = s;
      si.T = static_cast<size_t>((it * 7) % 33);
      si.routing = it % 5 == 3 ? Routing::Skewed : it % 3 == 1 ? Routing::EmptyRows : Routing::Uniform;
      std::vector<Inputs> all;
      for (int r = 0; r < s.R; ++r) all.push_back(make_inputs(si, r, 1000 + it));
      Schedule sc = it % 3 == 0 ? Schedule::Prefill : it % 3 == 1 ? Schedule::Decode : Schedule::Relay;
      auto d = buf.dispatch(all[c.rank()].x.data(), si.T, all[c.rank()].idx.data(), all[c.rank()].w.data(), sc);
      check_layout(si, sc, d, c.rank(), all);
      run_experts(si, d, c.rank());
      std::vector<unsigned char> out(si.T * si.H * 2);
      buf.combine(d.window, d.handle, out.data());
      compare_out(si, sc, c.rank(), out, reference_combine(si, all[c.rank()], false), "expert combine");
    }
  });
}

TEST(Moe, ExpertOutputsOutsideTheWindow) {
  // y in another heap buffer is read in place; y in ordinary memory is staged. Same result.
  run_team(2, [](Communicator& c) {
    Shape s{2, 8, 2, 64, 16, 16, DataType::Float32, Routing::Uniform};
    std::vector<Inputs> all;
    for (int r = 0; r < s.R; ++r) all.push_back(make_inputs(s, r, 77));
    const auto want = reference_combine(s, all[c.rank()], false);
    moe::Buffer buf(c, {.num_experts = s.E, .hidden = s.H, .max_tokens = s.M, .topk = s.K, .dtype = s.dt});
    for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay})
      for (int where = 0; where < 2; ++where) {
        auto d = buf.dispatch(std::span<const float>(reinterpret_cast<const float*>(all[c.rank()].x.data()), s.T * s.H),
                              std::span<const int64_t>(all[c.rank()].idx), std::span<const float>(all[c.rank()].w), sc);
        run_experts(s, d, c.rank());
        const size_t n = d.total_rows * s.H;
        std::vector<float> out(s.T * s.H);
        if (where == 0) {
          auto y = c.alloc<float>(n);
          std::memcpy(y.data(), d.window, n * sizeof(float));
          std::memset(d.window, 0xff, n * sizeof(float));  // the window must not be read
          buf.combine(std::span<const float>(y.data(), n), d.handle, std::span<float>(out));
        } else {
          std::vector<float> y(n);
          std::memcpy(y.data(), d.window, n * sizeof(float));
          std::memset(d.window, 0xff, n * sizeof(float));
          buf.combine(std::span<const float>(y), d.handle, std::span<float>(out));
        }
        std::vector<unsigned char> got(out.size() * 4);
        std::memcpy(got.data(), out.data(), got.size());
        compare_out(s, sc, c.rank(), got, want, where == 0 ? "combine of a heap y" : "combine of a staged y");
      }
  });
}

// ---- argument checks ----------------------------------------------------------------------

template <class F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() != Code::InvalidArgument)
      throw std::runtime_error(std::string("expected InvalidArgument, got ") + to_string(e.code()) + ": " + e.what());
    if (std::string(e.what()).find(needle) == std::string::npos)
      throw std::runtime_error("message '" + std::string(e.what()) + "' does not mention '" + needle + "'");
    return;
  }
  throw std::runtime_error("no error for a call that should fail (" + needle + ")");
}

TEST(Moe, InvalidConfigsAndArguments) {
  run_team(2, [](Communicator& c) {
    using moe::Config;
    expect_invalid([&] { moe::Buffer b(c, Config{.num_experts = 3, .hidden = 8, .max_tokens = 4, .topk = 1}); },
                   "num_experts = 3");
    expect_invalid([&] { moe::Buffer b(c, Config{.num_experts = 4, .hidden = 8, .max_tokens = 4, .topk = 5}); },
                   "topk = 5");
    expect_invalid([&] { moe::Buffer b(c, Config{.num_experts = 4, .hidden = 0, .max_tokens = 4, .topk = 1}); },
                   "hidden");
    expect_invalid(
        [&] {
          moe::Buffer b(c, Config{.num_experts = 4, .hidden = 8, .max_tokens = 4, .topk = 1, .dtype = DataType::Int32});
        },
        "dtype int32");
    moe::Buffer buf(c, Config{.num_experts = 4, .hidden = 8, .max_tokens = 4, .topk = 2, .dtype = DataType::Float32});
    std::vector<float> x(5 * 8, 1.0f), w(10, 0.5f);
    std::vector<int64_t> idx = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1};
    expect_invalid([&] { buf.dispatch(x.data(), 5, idx.data(), w.data(), Schedule::Prefill); }, "num_tokens = 5");
    idx[3] = 4;
    expect_invalid([&] { buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Decode); }, "topk_idx[1][1] = 4");
    idx[3] = -2;
    expect_invalid([&] { buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Relay); }, "topk_idx[1][1] = -2");
    idx[3] = 2;
    expect_invalid([&] { buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Prefill); },
                   "expert 2 appears twice");
    idx[3] = 3;
    std::vector<bfloat16_t> xb(32);
    expect_invalid(
        [&] {
          buf.dispatch(std::span<const bfloat16_t>(xb), std::span<const int64_t>(idx.data(), 8),
                       std::span<const float>(w.data(), 8), Schedule::Prefill);
        },
        "element type bfloat16");
    expect_invalid(
        [&] {
          buf.dispatch(std::span<const float>(x.data(), 30), std::span<const int64_t>(idx.data(), 8),
                       std::span<const float>(w.data(), 8), Schedule::Prefill);
        },
        "not a multiple of hidden");
    expect_invalid(
        [&] {
          buf.dispatch(std::span<const float>(x.data(), 32), std::span<const int64_t>(idx.data(), 6),
                       std::span<const float>(w.data(), 8), Schedule::Prefill);
        },
        "topk_idx has 6");
    // A handle is good for the latest dispatch only: the windows are reused.
    auto d1 = buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Prefill);
    auto d2 = buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Decode);
    std::vector<float> out(32);
    expect_invalid([&] { buf.combine(d1.window, d1.handle, out.data()); }, "but the buffer's latest dispatch is");
    // That refused combine was d2's (every rank refused it): d2 is not combined now.
    expect_invalid([&] { buf.combine(d2.window, d2.handle, out.data()); }, "dispatch again");
    auto d3 = buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Decode);
    buf.combine(d3.window, d3.handle, out.data());
    for (size_t i = 0; i < out.size(); ++i)
      STRATA_TEST_REQUIRE(out[i] == 1.0f,
                          "rank " << c.rank() << ": out[" << i << "] = " << out[i] << " after the good call");
  });
}

// Building a Buffer is collective and so are its checks: configs that differ between ranks
// (a dtype that keeps the row size, a max_tokens) fail on every rank naming the field and both
// ranks, instead of rows landing in windows laid out differently; a config invalid on one rank
// only fails on every rank, naming it; a size that cannot be addressed is refused, not thrown as
// a std::length_error. The communicator stays usable after each.
TEST(Moe, ConfigsAreComparedAcrossRanks) {
  run_team(3, [](Communicator& c) {
    using moe::Config;
    const bool odd = c.rank() == 2;
    const Config good{.num_experts = 3, .hidden = 16, .max_tokens = 4, .topk = 2, .dtype = DataType::Float32};
    Config dtype = good;
    if (odd) dtype.dtype = DataType::BFloat16, dtype.hidden = 32;  // the same bytes per row
    expect_invalid([&] { moe::Buffer b(c, dtype); }, "configs differ: hidden is 16 on rank 0 but 32 on rank 2");
    Config same_rows = good;
    if (odd) same_rows.dtype = DataType::BFloat16;
    expect_invalid([&] { moe::Buffer b(c, same_rows); }, "dtype is float32 on rank 0 but bfloat16 on rank 2");
    Config tokens = good;
    if (odd) tokens.max_tokens = 8;
    expect_invalid([&] { moe::Buffer b(c, tokens); }, "max_tokens is 4 on rank 0 but 8 on rank 2");
    Config topk = good;
    if (odd) topk.topk = 0;
    expect_invalid([&] { moe::Buffer b(c, topk); }, odd ? "topk = 0" : "rank 2's config is invalid");
    Config huge = good;
    huge.hidden = SIZE_MAX / 4;
    expect_invalid([&] { moe::Buffer b(c, huge); }, "larger than memory can address");
    // The communicator and a good Buffer still work.
    moe::Buffer buf(c, good);
    std::vector<float> x(4 * 16, 1.0f + c.rank()), w(8, 0.5f), out(4 * 16);
    std::vector<int64_t> idx = {0, 1, 1, 2, 2, 0, 0, 2};
    for (Schedule s : {Schedule::Prefill, Schedule::Decode}) {
      auto d = buf.dispatch(x.data(), 4, idx.data(), w.data(), s);
      buf.combine(d.window, d.handle, out.data());
      for (size_t i = 0; i < out.size(); ++i)
        STRATA_TEST_REQUIRE(out[i] == 1.0f + c.rank(), "rank " << c.rank() << ": out[" << i << "] = " << out[i]);
    }
  });
}

// A dispatch one rank refuses (an expert id out of range, or a typed overload's shapes) takes
// its place in every schedule: the other ranks' matching calls fail naming it at once instead
// of waiting for it until the timeout, and the Buffer stays usable.
TEST(Moe, ADispatchRefusedOnOneRankFailsEveryRankAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  run_team(3, [](Communicator& c) {
    const int R = c.size(), me = c.rank();
    moe::Buffer buf(c, {.num_experts = 2 * R, .hidden = 8, .max_tokens = 4, .topk = 2, .dtype = DataType::Float32});
    std::vector<float> x(4 * 8, 1.0f), w(8, 0.5f);
    std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 0, 5}, bad = idx;
    bad[5] = 2 * R;
    int round = 0;
    for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay})
      for (int typed = 0; typed < 2; ++typed, ++round) {
        const int refuser = round % R;
        try {
          if (typed)
            buf.dispatch(std::span<const float>(x.data(), me == refuser ? 30 : 32),
                         std::span<const int64_t>(idx.data(), 8), std::span<const float>(w.data(), 8), sc);
          else buf.dispatch(x.data(), 4, (me == refuser ? bad : idx).data(), w.data(), sc);
          throw std::runtime_error("rank " + std::to_string(me) + ": no error in round " + std::to_string(round));
        } catch (const Error& e) {
          const std::string m = e.what();
          const std::string want = me != refuser ? "rank " + std::to_string(refuser) + " refused its call"
                                   : typed       ? "not a multiple of hidden"
                                                 : "topk_idx[2][1] = " + std::to_string(2 * R);
          STRATA_TEST_REQUIRE(e.code() == Code::InvalidArgument && m.find(want) != std::string::npos,
                              "rank " << me << ", round " << round << ": '" << m << "' lacks '" << want << "'");
          if (me != refuser) STRATA_TEST_REQUIRE(e.peer() == refuser, "rank " << me << ": peer " << e.peer());
        }
        auto d = buf.dispatch(x.data(), 4, idx.data(), w.data(), sc);
        std::vector<float> out(32);
        buf.combine(d.window, d.handle, out.data());
        for (size_t i = 0; i < out.size(); ++i)
          STRATA_TEST_REQUIRE(out[i] == 1.0f, "rank " << me << ", round " << round << ": out[" << i << "] = " << out[i]
                                                      << " after the refused call");
      }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << "told by the refusal, not the timeout";
}

// Ranks that call one dispatch with different schedules fail naming both schedules: the ranks
// whose schedule waits for its peers' signals at once, the others (a collective of Relay, the
// first Decode call's symmetric allocation) at their timeout. Both timed out before, naming a
// count exchange or an all_to_all.
TEST(Moe, RanksThatCallDifferentSchedulesFailNamingBoth) {
  const Schedule kinds[] = {Schedule::Prefill, Schedule::Decode, Schedule::Relay};
  for (Schedule a : kinds)
    for (Schedule b : kinds) {
      if (a == b) continue;
      Team team(2, 1500ms);
      auto failures = team.run([&](Communicator& c) {
        const int R = c.size(), me = c.rank();
        moe::Buffer buf(c, {.num_experts = 2 * R, .hidden = 8, .max_tokens = 4, .topk = 2, .dtype = DataType::Float32});
        std::vector<float> x(4 * 8, 1.0f), w(8, 0.5f);
        std::vector<int64_t> idx = {0, 1, 2, 3, 0, 3, 1, 2};
        const Schedule mine = me == 0 ? a : b, theirs = me == 0 ? b : a;
        try {
          buf.dispatch(x.data(), 4, idx.data(), w.data(), mine);
        } catch (const Error& e) {
          const std::string m = e.what();
          const std::string want = std::string("rank ") + std::to_string(1 - me) + " with " + moe::to_string(theirs);
          STRATA_TEST_REQUIRE(
              e.code() == Code::InvalidArgument && m.find("schedule mismatch") != std::string::npos &&
                  m.find(want) != std::string::npos,
              "rank " << me << " (" << moe::to_string(mine) << "): '" << m << "' lacks '" << want << "'");
          return;
        }
        throw std::runtime_error("rank " + std::to_string(me) + ": no error");
      });
      for (const auto& f : failures)
        ADD_FAILURE() << moe::to_string(a) << " against " << moe::to_string(b) << ": " << f;
    }
}

// A combine one rank refuses (a null out, a typed y too small, the handle of an older dispatch)
// takes its place too: the other ranks' matching combine fails naming it before reading any row,
// that dispatch's combine is not run again on any rank, and the next dispatch works.
TEST(Moe, ACombineRefusedOnOneRankFailsEveryRankAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  run_team(3, [](Communicator& c) {
    const int R = c.size(), me = c.rank();
    moe::Buffer buf(c, {.num_experts = 2 * R, .hidden = 8, .max_tokens = 4, .topk = 2, .dtype = DataType::Float32});
    std::vector<float> x(4 * 8, 1.0f), w(8, 0.5f), out(32);
    std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 0, 5};
    auto expect_invalid = [&](const std::function<void()>& f, const std::string& want, int peer, int round) {
      try {
        f();
      } catch (const Error& e) {
        const std::string m = e.what();
        STRATA_TEST_REQUIRE(e.code() == Code::InvalidArgument && m.find(want) != std::string::npos,
                            "rank " << me << ", round " << round << ": '" << m << "' lacks '" << want << "'");
        if (peer >= 0) STRATA_TEST_REQUIRE(e.peer() == peer, "rank " << me << ": peer " << e.peer());
        return;
      }
      STRATA_TEST_REQUIRE(false, "rank " << me << ": no error in round " << round << " ('" << want << "')");
    };
    int round = 0;
    for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay})
      for (int kind = 0; kind < 3; ++kind, ++round) {
        const int refuser = round % R;
        auto old = buf.dispatch(x.data(), 4, idx.data(), w.data(), sc);
        auto d = buf.dispatch(x.data(), 4, idx.data(), w.data(), sc);
        if (me == refuser) {
          if (kind == 0) expect_invalid([&] { buf.combine(d.window, d.handle, nullptr); }, "out is null", -1, round);
          else if (kind == 1)
            expect_invalid(
                [&] {
                  buf.combine(std::span<const float>(reinterpret_cast<const float*>(d.window), 1), d.handle,
                              std::span<float>(out));
                },
                "y has 1 elements", -1, round);
          else
            expect_invalid([&] { buf.combine(old.window, old.handle, out.data()); }, "latest dispatch is", -1, round);
        } else {
          expect_invalid([&] { buf.combine(d.window, d.handle, out.data()); },
                         "rank " + std::to_string(refuser) + " refused its call", refuser, round);
        }
        // That dispatch's combine is over on every rank: a retry would meet the peers' next call.
        expect_invalid([&] { buf.combine(d.window, d.handle, out.data()); }, "dispatch again", -1, round);
        auto again = buf.dispatch(x.data(), 4, idx.data(), w.data(), sc);
        std::fill(out.begin(), out.end(), 0.0f);
        buf.combine(again.window, again.handle, out.data());
        for (size_t i = 0; i < out.size(); ++i)
          STRATA_TEST_REQUIRE(out[i] == 1.0f, "rank " << me << ", round " << round << ": out[" << i << "] = " << out[i]
                                                      << " after the refused combine");
      }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << "told by the refusal, not the timeout";
}

// ---- processes: shared memory for real, and a peer that dies --------------------------------

TEST(MoeForked, DispatchCombineAcrossProcesses) {
  auto results = run_forked(4, 10000ms, [](Communicator& c, std::string& report) {
    try {
      Shape s{4, 16, 8, 96, 64, 64, DataType::BFloat16, Routing::Uniform};
      check_shape(c, s, 5);
      s.routing = Routing::Skewed;
      check_shape(c, s, 6);
    } catch (const std::exception& e) {
      report = e.what();
      return 1;
    }
    return 0;
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
}

TEST(MoeForked, PeerKilledDuringDispatchFailsTheOthers) {
  const auto timeout = 2000ms;
  using Clock = std::chrono::steady_clock;
  // The kill comes once every rank is in the loop (slow starts, e.g. under TSan, must not turn
  // this into a test of joining): each rank touches a marker after its first iteration.
  const std::string marker = "/tmp/strata-moe-kill-" + std::to_string(getpid()) + "-";
  auto results = run_forked(
      3, timeout,
      [&](Communicator& c, std::string& report) {
        Shape s{3, 12, 4, 1024, 256, 256, DataType::BFloat16, Routing::Uniform};
        Inputs in = make_inputs(s, c.rank(), 9);
        moe::Buffer buf(c, {.num_experts = s.E, .hidden = s.H, .max_tokens = s.M, .topk = s.K, .dtype = s.dt});
        std::vector<unsigned char> out(in.x.size());
        auto t_fail = Clock::now();
        try {
          for (int i = 0; i < 1000000; ++i) {
            t_fail = Clock::now();
            auto d = buf.dispatch(in.x.data(), s.T, in.idx.data(), in.w.data(),
                                  i % 2 ? Schedule::Decode : Schedule::Prefill);
            buf.combine(d.window, d.handle, out.data());
            if (i == 0) std::fclose(std::fopen((marker + std::to_string(c.rank())).c_str(), "w"));
          }
        } catch (const Error& e) {
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_fail).count();
          report = std::to_string(static_cast<int>(e.code())) + " " + std::to_string(ms) + " " + e.what();
          return 0;
        }
        report = "finished without error";
        return 1;
      },
      [&](const std::vector<int>& pids) {
        auto all_started = [&] {
          for (int r = 0; r < 3; ++r)
            if (access((marker + std::to_string(r)).c_str(), F_OK) != 0) return false;
          return true;
        };
        for (int i = 0; i < 3000 && !all_started(); ++i) std::this_thread::sleep_for(10ms);
        std::this_thread::sleep_for(100ms);
        kill(pids[1], SIGKILL);
      });
  for (int r = 0; r < 3; ++r) unlink((marker + std::to_string(r)).c_str());
  for (int r : {0, 2}) {
    std::cout << "rank " << r << ": " << results[r].output << "\n";
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
    int code = -1;
    long ms = -1;
    ASSERT_EQ(sscanf(results[r].output.c_str(), "%d %ld", &code, &ms), 2) << results[r].output;
    EXPECT_TRUE(code == static_cast<int>(Code::PeerFailed) || code == static_cast<int>(Code::Timeout))
        << "rank " << r << ": " << results[r].output;
    EXPECT_LT(ms, 2 * timeout.count()) << "rank " << r << " noticed late: " << results[r].output;
    EXPECT_NE(results[r].output.find("rank 1"), std::string::npos) << results[r].output;
  }
  EXPECT_EQ(results[1].signal, SIGKILL);
}

}  // namespace
}  // namespace strata::test

// One rank of the multi-host MoE test: moe::Buffer dispatch and combine on a communicator that
// spans hosts, for Prefill, Decode and Relay, bf16/fp16/fp32, uniform, skewed (every token to
// the same experts) and half-empty routing, ranks with no tokens, T = 0 everywhere, expert
// outputs outside the window, two Buffers in flight on one communicator and the max_tokens
// error. Every rank checks its own results: each (token, expert) row delivered once, bit for
// bit, at the place the Dispatch names; combine equal, bit for bit, to a reference computed
// here in the documented order (Relay: k ascending; Prefill/Decode across hosts: this host's
// terms k ascending, then each other host's partial sum, fp32 k ascending and rounded to the
// dtype, in ascending host order); and the bytes sent to other hosts deduplicated (one row per
// token and destination host). Exits non-zero naming the rank, the case and the mismatch.
//
//   mh_moe_rank [--quick]              the checks above
//   mh_moe_rank --fault VICTIM [--iters K]
//                                      Prefill and Decode in a loop; rank VICTIM SIGKILLs itself
//                                      between a dispatch and its combine after K iterations;
//                                      every other rank must fail with PeerFailed or Timeout
//                                      within 2x STRATA_TIMEOUT of the call's start (exit 0),
//                                      else exit 3.
//
// Placement comes from the environment like any Strata program, so the same binary runs under
// tests/multihost/multihost_test.cpp (hosts faked with STRATA_HOST_ID, UCX over loopback TCP)
// and one agent per network namespace (launcher_netns_test.sh matrix 2,2).

#include <strata/moe.hpp>
#include <strata/strata.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "coll/comm_impl.hpp"
#include "moe/moe_values.hpp"  // host_of: which host each rank is on (the reference's order)

namespace {

using namespace strata;
using moe::Schedule;

using namespace strata::test::moe_values;

struct Shape {
  int R, E, K;
  size_t H, M;
  std::vector<size_t> T;  // per rank
  DataType dt;
  Routing routing;
  size_t align = 1;
};

struct Inputs {
  std::vector<unsigned char> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
};

Inputs make_inputs(const Shape& s, int rank, uint64_t salt) {
  std::mt19937_64 rng(salt * 1000003u + static_cast<uint64_t>(rank) * 7919u + 17u);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), wd(0.05f, 1.0f), u01(0.0f, 1.0f);
  const size_t T = s.T[rank];
  Inputs in;
  in.x.resize(T * s.H * dtype_size(s.dt));
  for (size_t i = 0; i < T * s.H; ++i) put(s.dt, in.x.data(), i, val(rng));
  in.idx.assign(T * s.K, -1);
  in.w.resize(T * s.K);
  for (auto& v : in.w) v = wd(rng);
  std::vector<int64_t> perm(s.E);
  for (size_t t = 0; t < T; ++t) {
    int64_t* row = &in.idx[t * s.K];
    if (s.routing == Routing::Skewed) {
      for (int k = 0; k < s.K; ++k) row[k] = s.K - 1 - k;  // every token to experts 0..K-1
      continue;
    }
    if (s.routing == Routing::EmptyRows && t % 2 == 0) continue;
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < s.K; ++k) row[k] = u01(rng) < 0.15f ? -1 : perm[k];
  }
  return in;
}

float expert_scale(int64_t e) { return 1.0f + 0.125f * static_cast<float>(e); }

struct Checker {
  Communicator& c;
  std::vector<int> host_of;  // comm rank -> host
  long checks = 0;
  int failures = 0;
  std::string where;

  bool require(bool ok, const std::string& what) {
    ++checks;
    if (!ok && failures++ < 20)
      std::fprintf(stderr, "mh_moe_rank: rank %d: %s: %s\n", c.rank(), where.c_str(), what.c_str());
    return ok;
  }

  /// The expected combine for `in` (this rank's tokens). Relay: k ascending. Across hosts:
  /// this host's terms first, then the other hosts' rounded partial sums, host ascending.
  std::vector<unsigned char> reference(const Shape& s, const Inputs& in, size_t T, bool identity, bool by_host) {
    const int L = s.E / s.R, mine = host_of[c.rank()];
    const int hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
    std::vector<unsigned char> out(T * s.H * dtype_size(s.dt));
    std::vector<float> acc(s.H), part(s.H);
    auto y = [&](size_t t, size_t h, int64_t e) {
      float v = get(s.dt, in.x.data(), t * s.H + h);
      return identity ? v : round_to(s.dt, v * expert_scale(e));
    };
    for (size_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int k = 0; k < s.K; ++k) {
        int64_t e = in.idx[t * s.K + k];
        if (e < 0 || (by_host && host_of[e / L] != mine)) continue;
        float w = in.w[t * s.K + k];
        for (size_t h = 0; h < s.H; ++h) {
          float p = w * y(t, h, e);
          acc[h] = acc[h] + p;
        }
      }
      for (int hh = 0; by_host && hh < hosts; ++hh) {
        if (hh == mine) continue;
        bool any = false;
        std::fill(part.begin(), part.end(), 0.0f);
        for (int k = 0; k < s.K; ++k) {
          int64_t e = in.idx[t * s.K + k];
          if (e < 0 || host_of[e / L] != hh) continue;
          any = true;
          float w = in.w[t * s.K + k];
          for (size_t h = 0; h < s.H; ++h) {
            float p = w * y(t, h, e);
            part[h] = part[h] + p;
          }
        }
        if (any)
          for (size_t h = 0; h < s.H; ++h) acc[h] = acc[h] + round_to(s.dt, part[h]);
      }
      for (size_t h = 0; h < s.H; ++h) put(s.dt, out.data(), t * s.H + h, acc[h]);
    }
    return out;
  }

  /// Every (token, expert) of every source delivered once, bit for bit, where d says.
  void layout(const Shape& s, const moe::Dispatch& d, const std::vector<Inputs>& all) {
    const int me = c.rank(), L = s.E / s.R;
    const size_t rb = s.H * dtype_size(s.dt);
    require(d.local_experts == L && d.ranks == s.R, "L/R in the result");
    for (int l = 0; l < L; ++l) {
      const int64_t e = static_cast<int64_t>(me) * L + l;
      for (int src = 0; src < s.R; ++src) {
        std::vector<size_t> toks;
        for (size_t t = 0; t < s.T[src]; ++t)
          for (int k = 0; k < s.K; ++k)
            if (all[src].idx[t * s.K + k] == e) toks.push_back(t);
        if (!require(d.count(l, src) == toks.size(), "count(l=" + std::to_string(l) + ", src=" + std::to_string(src) +
                                                         ") = " + std::to_string(d.count(l, src)) + ", want " +
                                                         std::to_string(toks.size())))
          continue;
        const size_t off = d.offset(l, src);
        if (!require(off + toks.size() <= d.total_rows, "range past total_rows")) continue;
        if (!d.masked() && s.align > 1 && src == 0) require(off % s.align == 0, "expert range not aligned");
        for (size_t j = 0; j < toks.size(); ++j)
          require(std::memcmp(d.window + (off + j) * rb, all[src].x.data() + toks[j] * rb, rb) == 0,
                  "expert " + std::to_string(l) + " row " + std::to_string(j) + " from rank " + std::to_string(src) +
                      " is not token " + std::to_string(toks[j]) + "'s row");
      }
    }
  }

  void run_experts(const Shape& s, const moe::Dispatch& d) {
    const int L = s.E / s.R;
    const size_t rb = s.H * dtype_size(s.dt);
    for (int l = 0; l < L; ++l)
      for (int src = 0; src < s.R; ++src) {
        std::byte* base = d.window + d.offset(l, src) * rb;
        for (size_t i = 0; i < d.count(l, src) * s.H; ++i)
          put(s.dt, base, i, get(s.dt, base, i) * expert_scale(static_cast<int64_t>(c.rank()) * L + l));
      }
  }

  void compare(const Shape& s, const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
               const char* what) {
    const size_t es = dtype_size(s.dt);
    for (size_t i = 0; i < want.size() / es; ++i)
      if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
        require(false, std::string(what) + " differs at token " + std::to_string(i / s.H) +
                           " h=" + std::to_string(i % s.H) + ": got " + std::to_string(get(s.dt, got.data(), i)) +
                           ", want " + std::to_string(get(s.dt, want.data(), i)));
        return;
      }
    ++checks;
  }

  /// Rows and selections of this rank's tokens on other hosts: (deduplicated, not).
  std::pair<uint64_t, uint64_t> remote(const Shape& s, const Inputs& in, size_t T) {
    const int L = s.E / s.R, mine = host_of[c.rank()];
    const int hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
    uint64_t rows = 0, sel = 0;
    for (size_t t = 0; t < T; ++t)
      for (int hh = 0; hh < hosts; ++hh) {
        if (hh == mine) continue;
        uint64_t n = 0;
        for (int k = 0; k < s.K; ++k) {
          int64_t e = in.idx[t * s.K + k];
          n += e >= 0 && host_of[e / L] == hh;
        }
        sel += n;
        rows += n > 0;
      }
    return {rows, sel};
  }

  void shape(const Shape& s, uint64_t salt, bool y_outside = false) {
    const int me = c.rank();
    std::vector<Inputs> all;
    for (int r = 0; r < s.R; ++r) all.push_back(make_inputs(s, r, salt));
    const Inputs& mine = all[me];
    const size_t T = s.T[me];
    moe::Buffer buf(c, {.num_experts = s.E,
                        .hidden = s.H,
                        .max_tokens = s.M,
                        .topk = s.K,
                        .dtype = s.dt,
                        .expert_alignment = s.align});
    std::vector<unsigned char> out(T * s.H * dtype_size(s.dt));
    for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay, Schedule::Prefill}) {
      std::ostringstream o;
      o << moe::to_string(sc) << " R=" << s.R << " E=" << s.E << " K=" << s.K << " H=" << s.H << " T=" << T << " "
        << to_string(s.dt) << " " << routing_name(s.routing) << " align=" << s.align << (y_outside ? " y-outside" : "");
      where = o.str();
      const bool by_host = sc != Schedule::Relay;
      for (bool identity : {true, false}) {
        const moe::Traffic before = buf.traffic();
        auto d = buf.dispatch(mine.x.data(), T, mine.idx.data(), mine.w.data(), sc);
        if (identity) layout(s, d, all);
        else run_experts(s, d);
        const moe::Traffic after = buf.traffic();
        auto [rows, sel] = remote(s, mine, T);
        require(after.remote_selections - before.remote_selections == sel, "traffic: remote selections");
        require(after.rows_sent - before.rows_sent == (by_host ? rows : sel),
                "traffic: rows sent " + std::to_string(after.rows_sent - before.rows_sent) + ", want " +
                    std::to_string(by_host ? rows : sel));
        const size_t rb = s.H * dtype_size(s.dt);
        if (!by_host) require(after.dispatch_bytes - before.dispatch_bytes == sel * rb, "traffic: relay bytes");
        else
          require(
              after.dispatch_bytes - before.dispatch_bytes - (after.record_bytes - before.record_bytes) == rows * rb,
              "traffic: row bytes");
        if (y_outside) {
          const auto* wb = reinterpret_cast<const unsigned char*>(d.window);
          std::vector<unsigned char> y(wb, wb + d.total_rows * rb);
          buf.combine(y.data(), d.handle, out.data());
        } else {
          buf.combine(d.window, d.handle, out.data());
        }
        compare(s, out, reference(s, mine, T, identity, by_host), identity ? "identity combine" : "expert combine");
      }
    }
  }
};

int run(Communicator& c, bool quick) {
  Checker ck{c, {}, 0, 0, {}};
  ck.host_of = c.impl()->host_of;
  if (ck.host_of.empty()) ck.host_of.assign(c.size(), 0);
  const int R = c.size();
  const size_t M = 16;
  uint64_t salt = 1;
  std::vector<size_t> full(R, M), none(R, 0), some(R);
  for (int r = 0; r < R; ++r) some[r] = r % 2 ? 0 : M - static_cast<size_t>(r);  // odd ranks: no tokens
  for (DataType dt : {DataType::BFloat16, DataType::Float16, DataType::Float32})
    for (Routing rt : {Routing::Uniform, Routing::Skewed, Routing::EmptyRows}) {
      if (quick && rt != Routing::Uniform && dt != DataType::Float32) continue;
      ck.shape({R, 2 * R, 3, 40, M, full, dt, rt}, salt++);
      ck.shape({R, 2 * R, 2, 40, M, some, dt, rt}, salt++);
    }
  // T = 0 everywhere, an aligned layout, more experts per rank, wide rows, K = E, y outside.
  ck.shape({R, R, 1, 8, M, none, DataType::BFloat16, Routing::Uniform}, salt++);
  ck.shape({R, 4 * R, 4, 64, M, full, DataType::BFloat16, Routing::Uniform, 8}, salt++);
  ck.shape({R, R, R, 520, M, full, DataType::Float32, Routing::Uniform}, salt++);
  ck.shape({R, 2 * R, 2, 40, M, some, DataType::Float16, Routing::Uniform}, salt++, true);

  // Two Buffers in flight on one communicator: their messages must not meet.
  {
    ck.where = "two buffers";
    Shape s{R, 2 * R, 2, 24, M, full, DataType::Float32, Routing::Uniform};
    moe::Buffer a(c, {.num_experts = s.E, .hidden = s.H, .max_tokens = M, .topk = s.K, .dtype = s.dt});
    moe::Buffer b(c, {.num_experts = s.E, .hidden = s.H, .max_tokens = M, .topk = s.K, .dtype = s.dt});
    Inputs ia = make_inputs(s, c.rank(), 900), ib = make_inputs(s, c.rank(), 901);
    std::vector<unsigned char> oa(M * s.H * 4), ob(M * s.H * 4);
    auto da = a.dispatch(ia.x.data(), M, ia.idx.data(), ia.w.data(), Schedule::Prefill);
    auto db = b.dispatch(ib.x.data(), M, ib.idx.data(), ib.w.data(), Schedule::Decode);
    b.combine(db.window, db.handle, ob.data());
    a.combine(da.window, da.handle, oa.data());
    ck.compare(s, oa, ck.reference(s, ia, M, true, true), "buffer a");
    ck.compare(s, ob, ck.reference(s, ib, M, true, true), "buffer b");
  }

  // More tokens than max_tokens: a clear error naming the rank and the limit, before any
  // message (so every rank fails alike and the Buffer stays usable).
  {
    ck.where = "max_tokens";
    moe::Buffer buf(c, {.num_experts = 2 * R, .hidden = 8, .max_tokens = 4, .topk = 1, .dtype = DataType::Float32});
    std::vector<float> x(5 * 8, 1.0f), w(5, 1.0f);
    std::vector<int64_t> idx(5, 0);
    for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay}) {
      std::string msg;
      try {
        buf.dispatch(x.data(), 5, idx.data(), w.data(), sc);
      } catch (const Error& e) {
        msg = e.what();
        ck.require(e.code() == Code::InvalidArgument, "max_tokens: code is not InvalidArgument");
      }
      const std::string want = "num_tokens = 5 on rank " + std::to_string(c.rank()) + " exceeds max_tokens = 4";
      ck.require(msg.find(want) != std::string::npos, "max_tokens: error '" + msg + "' lacks '" + want + "'");
    }
    auto d = buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Prefill);
    std::vector<float> out(4 * 8);
    buf.combine(d.window, d.handle, out.data());
    for (float v : out) ck.require(v == 1.0f, "after the error: combine gives " + std::to_string(v));
  }
  // An expert id out of range on the last rank only: it refuses its call, and every other
  // rank's matching call fails naming it (not by the timeout); the Buffer stays usable.
  {
    ck.where = "refused";
    moe::Buffer buf(c, {.num_experts = 2 * R, .hidden = 8, .max_tokens = 4, .topk = 1, .dtype = DataType::Float32});
    std::vector<float> x(4 * 8, 1.0f), w(4, 1.0f);
    std::vector<int64_t> idx(4, 0), bad = {0, 2 * R, 0, 0};
    for (Schedule sc : {Schedule::Prefill, Schedule::Decode, Schedule::Relay}) {
      std::string msg;
      try {
        buf.dispatch(x.data(), 4, (c.rank() == R - 1 ? bad : idx).data(), w.data(), sc);
      } catch (const Error& e) {
        msg = e.what();
        ck.require(e.code() == Code::InvalidArgument, "refused: code is not InvalidArgument: " + msg);
      }
      const std::string want = c.rank() == R - 1 ? "topk_idx[1][0] = " + std::to_string(2 * R)
                                                 : "rank " + std::to_string(R - 1) + " refused its call";
      ck.require(msg.find(want) != std::string::npos, "refused: error '" + msg + "' lacks '" + want + "'");
      auto d = buf.dispatch(x.data(), 4, idx.data(), w.data(), sc);
      std::vector<float> out(4 * 8);
      buf.combine(d.window, d.handle, out.data());
      for (float v : out) ck.require(v == 1.0f, "after the refused call: combine gives " + std::to_string(v));
    }
    // A Relay combine refused on the last rank (a null out): its all_to_all_v is refused, so
    // the ranks of every host fail naming it; that dispatch is not combined again anywhere.
    ck.where = "refused combine";
    auto d = buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Relay);
    std::vector<float> out(4 * 8);
    std::string msg;
    try {
      buf.combine(d.window, d.handle, c.rank() == R - 1 ? nullptr : out.data());
    } catch (const Error& e) {
      msg = e.what();
      ck.require(e.code() == Code::InvalidArgument, "code is not InvalidArgument: " + msg);
    }
    const std::string want = c.rank() == R - 1 ? "out is null" : "rank " + std::to_string(R - 1) + " refused its call";
    ck.require(msg.find(want) != std::string::npos, "error '" + msg + "' lacks '" + want + "'");
    d = buf.dispatch(x.data(), 4, idx.data(), w.data(), Schedule::Relay);
    buf.combine(d.window, d.handle, out.data());
    for (float v : out) ck.require(v == 1.0f, "after the refused combine: combine gives " + std::to_string(v));
  }
  std::printf("mh_moe_rank: rank %d: %ld checks, %d failed\n", c.rank(), ck.checks, ck.failures);
  return ck.failures ? 1 : 0;
}

int fault(Communicator& c, int victim, int iters) {
  const int R = c.size();
  const size_t M = 64, H = 1024;
  moe::Buffer buf(c, {.num_experts = 2 * R, .hidden = H, .max_tokens = M, .topk = 4, .dtype = DataType::Float32});
  Shape s{R, 2 * R, 4, H, M, std::vector<size_t>(R, M), DataType::Float32, Routing::Uniform};
  Inputs in = make_inputs(s, c.rank(), 77);
  std::vector<float> out(M * H);
  auto t_op = std::chrono::steady_clock::now();
  try {
    for (int i = 0;; ++i) {
      Schedule sc = i % 2 ? Schedule::Decode : Schedule::Prefill;
      t_op = std::chrono::steady_clock::now();
      auto d = buf.dispatch(in.x.data(), M, in.idx.data(), in.w.data(), sc);
      if (c.rank() == victim && i == iters) raise(SIGKILL);
      t_op = std::chrono::steady_clock::now();
      buf.combine(d.window, d.handle, out.data());
    }
  } catch (const Error& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_op).count();
    std::printf("mh_moe_rank: rank %d: FAULT code=%s ms=%lld: %s\n", c.rank(), to_string(e.code()),
                static_cast<long long>(ms), e.what());
    bool ok = (e.code() == Code::PeerFailed || e.code() == Code::Timeout) && ms < 2 * c.timeout().count();
    return ok ? 0 : 3;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int victim = -1, iters = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--fault" && i + 1 < argc) victim = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] | --fault VICTIM [--iters K]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    Communicator c = init();
    if (victim >= 0) return fault(c, victim, iters);
    int rc = run(c, quick);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("mh_moe_rank: rank %d of %d (local %d of %d): %s, %.2f s\n", c.rank(), c.size(), c.local_rank(),
                c.local_size(), rc ? "FAILED" : "ok", s);
    return rc;
  } catch (const Error& e) {
    std::fprintf(stderr, "mh_moe_rank: error: %s\n", e.what());
    return 2;
  }
}

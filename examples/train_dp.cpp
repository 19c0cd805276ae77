// Deterministic data-parallel training of a small MLP, gradients all-reduced by Strata, with
// checkpoint-free failure recovery and fault injection.
//
//   strata run --ft -n 4 ./build/examples/train_dp --steps 30 --fail 2:10:kill
//
// Every rank trains a replica of y = W2·relu(W1·x + b1) + b2 against a fixed teacher on
// synthetic data that depends only on (step, rank, data cursor, RNG state), so a run with
// failures must end with the same parameter bytes as a run without. Rank 0 prints, per
// recovery, the detection time, the RTO and its breakdown; with --times every rank also
// prints START/INJECT/DONE and RECOVERY lines with raw timestamps for scripts
// (scripts/bench_recovery.py, tests/recovery).
//
// Fault injection (each fires once, in the original process of RANK):
//   --fail RANK:STEP[:kill|stop|exit|exit0|hang|abort|killmid|killdonor|host]  at STEP, after the local gradients:
//                                   SIGKILL, SIGSTOP (a hang), exit(3), exit(0) (leaves early,
//                                   as if done), a hang in the program (the library's thread
//                                   keeps beating), comm.abort() (abort: the process goes on),
//                                   SIGKILL while its own
//                                   all_reduce is in flight (killmid), or SIGKILL and then the
//                                   donor of its state dies after sending its first buffer
//                                   (killdonor: the restore is cut short; another donor must
//                                   redo it in full). A replacement that saw its restore cut
//                                   short prints "INTERRUPTED rank=R step=S" with the step it
//                                   held then (the old one: the step commits the transfer).
//                                   host: SIGKILL the whole host of RANK, its `strata run` agent
//                                   (this process's parent) and, through the agent's guard, every
//                                   rank there (--ft --nnodes: a host lost).
//   --fail-in-recovery RANK         RANK dies as soon as it enters the first recovery
//   --fail-replacement RANK         the first replacement of RANK dies before restoring
//   --stall-replacement RANK        the first replacement of RANK started afresh never reaches
//                                   strata::init() (it sleeps before it, as a program stuck in
//                                   its imports would); a hot spare is not affected
//   --no-replica                    every rank is its own replica group: nothing to restore from
//   --pace MS                       every step sleeps MS ms more (tests: time for a spare to start)
// Baseline (restart everything, reload a checkpoint; run with `strata run --ft --restart-all`):
//   --checkpoint PATH --checkpoint-every K

#include <strata/recovery.hpp>
#include <strata/strata.hpp>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using strata::recovery::now_ns;

struct Fault {
  int rank = -1;
  uint64_t step = 0;
  std::string mode = "kill";
};

struct Options {
  uint64_t steps = 30;
  int in = 32, hidden = 128, out = 8, batch = 16;
  float lr = 0.05f, momentum = 0.9f;
  std::vector<Fault> faults;
  int fail_in_recovery = -1;
  int fail_replacement = -1;
  int stall_replacement = -1;
  bool no_replica = false;
  int pace_ms = 0;
  std::string checkpoint;
  uint64_t checkpoint_every = 5;
  bool quiet = false;
  bool times = false;  // START/INJECT/DONE/RECOVERY lines with raw timestamps, for scripts
};

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr, "train_dp: %s\n", msg.c_str());
  std::exit(2);
}

constexpr const char* kHelp =
    "usage: strata run [--ft] -n N -- train_dp [options]\n"
    "  --steps K  --hidden H  --in I  --batch B   the job (defaults 30, 128, 32, 16)\n"
    "  --fail RANK:STEP[:kill|stop|exit|exit0|hang|abort|killmid|killdonor|host]   inject a failure (repeatable)\n"
    "  --fail-in-recovery RANK  --fail-replacement RANK  --stall-replacement RANK  --no-replica  --pace MS\n"
    "  --checkpoint PATH --checkpoint-every K   the restart-everything baseline (strata run --ft --restart-all)\n"
    "  --quiet  --times\n"
    "See the comment at the top of examples/train_dp.cpp for what each one does.\n";

/// The whole of `v` as a whole number from lo to hi, or a usage error naming option `opt`.
template <class T>
T number(const std::string& opt, const std::string& v, T lo, T hi = std::numeric_limits<T>::max()) {
  T x{};
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty() || x < lo || x > hi)
    usage(opt + ": '" + v + "' is not a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    // Sizes are bounded so that the model's buffers stay addressable in an int.
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    } else if (a == "--steps") o.steps = number<uint64_t>(a, next(), 1);
    else if (a == "--hidden") o.hidden = number(a, next(), 1, 1 << 14);
    else if (a == "--in") o.in = number(a, next(), 1, 1 << 14);
    else if (a == "--batch") o.batch = number(a, next(), 1, 1 << 16);
    else if (a == "--fail") {
      std::string v = next();
      Fault f;
      size_t c1 = v.find(':');
      if (c1 == std::string::npos) usage("--fail wants RANK:STEP[:MODE], got '" + v + "'");
      size_t c2 = v.find(':', c1 + 1);
      f.rank = number("--fail " + v + ": RANK", v.substr(0, c1), 0);
      f.step = number<uint64_t>("--fail " + v + ": STEP",
                                v.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1), 0);
      if (c2 != std::string::npos) f.mode = v.substr(c2 + 1);
      if (f.mode != "kill" && f.mode != "stop" && f.mode != "exit" && f.mode != "exit0" && f.mode != "hang" &&
          f.mode != "abort" && f.mode != "killmid" && f.mode != "killdonor" && f.mode != "host")
        usage("--fail mode must be kill, stop, exit, exit0, hang, abort, killmid, killdonor or host, got '" + f.mode +
              "'");
      o.faults.push_back(f);
    } else if (a == "--fail-in-recovery") o.fail_in_recovery = number(a, next(), 0);
    else if (a == "--fail-replacement") o.fail_replacement = number(a, next(), 0);
    else if (a == "--stall-replacement") o.stall_replacement = number(a, next(), 0);
    else if (a == "--no-replica") o.no_replica = true;
    else if (a == "--pace") o.pace_ms = number(a, next(), 0, 3600 * 1000);
    else if (a == "--checkpoint") o.checkpoint = next();
    else if (a == "--checkpoint-every") o.checkpoint_every = number<uint64_t>(a, next(), 1);
    else if (a == "--quiet") o.quiet = true;
    else if (a == "--times") o.times = true;
    else usage("unknown option '" + a + "'");
  }
  return o;
}

// Counter-based randomness: the same (a, b, c) gives the same number in every process.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float uniform(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = mix(a ^ mix(b ^ mix(c)));
  return static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
}

class Model {
 public:
  Model(strata::Communicator& comm, const Options& o)
      : o_(o),
        n_(static_cast<size_t>(o.hidden) * o.in + o.hidden + static_cast<size_t>(o.out) * o.hidden + o.out),
        params(comm.alloc<float>(n_)),
        momentum(comm.alloc<float>(n_)),
        grads(comm.alloc<float>(n_)) {
    for (size_t i = 0; i < n_; ++i) params[i] = 0.1f * uniform(1, i, 7);
    std::fill(momentum.begin(), momentum.end(), 0.0f);
  }
  size_t size() const { return n_; }

  // Local gradients of the mean squared error over this rank's batch of `step`.
  void gradients(int rank, uint64_t cursor, uint64_t rng) {
    const int D = o_.in, H = o_.hidden, C = o_.out, B = o_.batch;
    const float* W1 = params.data();
    const float* b1 = W1 + static_cast<size_t>(H) * D;
    const float* W2 = b1 + H;
    const float* b2 = W2 + static_cast<size_t>(C) * H;
    float* gW1 = grads.data();
    float* gb1 = gW1 + static_cast<size_t>(H) * D;
    float* gW2 = gb1 + H;
    float* gb2 = gW2 + static_cast<size_t>(C) * H;
    std::fill(grads.begin(), grads.end(), 0.0f);
    std::vector<float> x(D), h(H), y(C), dy(C), dh(H);
    for (int s = 0; s < B; ++s) {
      uint64_t sample = cursor + static_cast<uint64_t>(rank) * B + s;
      for (int d = 0; d < D; ++d) x[d] = uniform(sample, d, rng);
      for (int j = 0; j < H; ++j) {
        float a = b1[j];
        for (int d = 0; d < D; ++d) a += W1[static_cast<size_t>(j) * D + d] * x[d];
        h[j] = a > 0 ? a : 0;
      }
      for (int c = 0; c < C; ++c) {
        float a = b2[c];
        for (int j = 0; j < H; ++j) a += W2[static_cast<size_t>(c) * H + j] * h[j];
        float target = std::sin(x[c % D] * 2.0f + x[(c * 7 + 3) % D]);
        y[c] = a;
        dy[c] = 2.0f * (a - target);
      }
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (int c = 0; c < C; ++c) {
        gb2[c] += dy[c];
        for (int j = 0; j < H; ++j) {
          gW2[static_cast<size_t>(c) * H + j] += dy[c] * h[j];
          dh[j] += dy[c] * W2[static_cast<size_t>(c) * H + j];
        }
      }
      for (int j = 0; j < H; ++j) {
        if (h[j] <= 0) continue;
        gb1[j] += dh[j];
        for (int d = 0; d < D; ++d) gW1[static_cast<size_t>(j) * D + d] += dh[j] * x[d];
      }
    }
  }

  void apply(int world) {
    const float scale = 1.0f / static_cast<float>(world * o_.batch);
    for (size_t i = 0; i < n_; ++i) {
      momentum[i] = o_.momentum * momentum[i] + grads[i] * scale;
      params[i] -= o_.lr * momentum[i];
    }
  }

  uint64_t hash() const {
    uint64_t h = 0xcbf29ce484222325ull;
    const auto* p = reinterpret_cast<const unsigned char*>(params.data());
    for (size_t i = 0; i < n_ * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
  }

 private:
  const Options& o_;
  size_t n_;

 public:
  strata::Buffer<float> params, momentum, grads;
};

double ms(int64_t a, int64_t b) { return (a > 0 && b > 0) ? static_cast<double>(b - a) / 1e6 : -1.0; }

// --times: the machine-readable START/INJECT/DONE/RECOVERY lines (raw timestamps) for scripts;
// without it a person reads one line per event.
bool g_times = false;

void inject(strata::Communicator& comm, const std::string& mode) {
  if (g_times) std::printf("INJECT rank=%d mode=%s t=%" PRId64 "\n", comm.rank(), mode.c_str(), now_ns());
  else std::printf("rank %d: injecting a failure (%s)\n", comm.rank(), mode.c_str());
  std::fflush(stdout);
  strata::recovery::mark_failure(comm);
  if (mode == "stop") ::raise(SIGSTOP);
  else if (mode == "exit") std::_Exit(3);
  else if (mode == "exit0") std::_Exit(0);  // leaves early, as if done: only its peers can tell
  else if (mode == "abort") comm.abort();   // the process goes on: every rank recovers, none failed
  else if (mode == "hang") {
    // Stuck in the program: the library's own thread keeps this rank's heartbeat going.
    for (;;) ::pause();
  } else if (mode == "host") {
    // The whole host: its agent (our parent, `strata run`), whose guard then SIGKILLs every
    // rank it started there, and this rank at once.
    ::kill(::getppid(), SIGKILL);
    ::raise(SIGKILL);
  } else ::raise(SIGKILL);
}

// Plain loop with a checkpoint every K steps: the restart-everything baseline.
int run_checkpointed(strata::Communicator& comm, const Options& o, Model& m) {
  uint64_t step = 0, cursor = 0, rng = 12345;
  // The file: a tag, the parameter count, the step, the data cursor, the RNG, then the
  // parameters and the momentum. A file of another model or a torn one is refused, not read
  // into the parameters.
  const uint64_t kTag = 0x31504b4350445453;  // "STDPCKP1"
  const uint64_t count = m.size();
  const size_t want = 5 * sizeof(uint64_t) + 2 * count * sizeof(float);
  auto fail = [&](const std::string& why) { throw std::runtime_error("checkpoint " + o.checkpoint + ": " + why); };
  {
    std::ifstream in(o.checkpoint, std::ios::binary | std::ios::ate);
    if (in) {
      const auto got = static_cast<size_t>(in.tellg());
      uint64_t head[2] = {};
      in.seekg(0);
      in.read(reinterpret_cast<char*>(head), sizeof head);
      if (!in || head[0] != kTag) fail("not a checkpoint of train_dp");
      if (head[1] != count)
        fail("holds a model of " + std::to_string(head[1]) + " parameters, this job's has " + std::to_string(count) +
             " (another --in / --hidden)");
      if (got != want) fail(std::to_string(got) + " bytes where " + std::to_string(want) + " were expected");
      in.read(reinterpret_cast<char*>(&step), sizeof step);
      in.read(reinterpret_cast<char*>(&cursor), sizeof cursor);
      in.read(reinterpret_cast<char*>(&rng), sizeof rng);
      in.read(reinterpret_cast<char*>(m.params.data()), static_cast<std::streamsize>(count * sizeof(float)));
      in.read(reinterpret_cast<char*>(m.momentum.data()), static_cast<std::streamsize>(count * sizeof(float)));
      if (!in) fail("could not be read");
      if (comm.rank() == 0) {
        if (o.times) std::printf("CKPT_LOADED step=%" PRIu64 " t=%" PRId64 "\n", step, now_ns());
        else std::printf("loaded the checkpoint of step %" PRIu64 "\n", step);
      }
    }
  }
  const bool restarted = step > 0;
  for (; step < o.steps;) {
    m.gradients(comm.rank(), cursor, rng);
    for (const Fault& f : o.faults)
      if (!restarted && f.rank == comm.rank() && f.step == step) inject(comm, f.mode);
    comm.all_reduce(m.grads.span(), strata::ReduceOp::Sum);
    m.apply(comm.size());
    ++step;
    cursor += static_cast<uint64_t>(comm.size()) * o.batch;
    rng = mix(rng);
    if (comm.rank() == 0) {
      if (o.times) std::printf("STEP_DONE step=%" PRIu64 " t=%" PRId64 "\n", step - 1, now_ns());
      else if (!o.quiet) std::printf("step %" PRIu64 " done\n", step - 1);
      if (step % o.checkpoint_every == 0) {
        std::string tmp = o.checkpoint + ".tmp";
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        const uint64_t head[5] = {kTag, count, step, cursor, rng};
        out.write(reinterpret_cast<const char*>(head), sizeof head);
        out.write(reinterpret_cast<const char*>(m.params.data()), static_cast<std::streamsize>(count * sizeof(float)));
        out.write(reinterpret_cast<const char*>(m.momentum.data()),
                  static_cast<std::streamsize>(count * sizeof(float)));
        out.close();
        if (!out) fail("could not write " + tmp);
        if (std::rename(tmp.c_str(), o.checkpoint.c_str()) != 0)
          fail("could not rename " + tmp + " to it: " + std::strerror(errno));
      }
    }
    // Ranks must not run ahead of the checkpoint they may be restarted from.
    comm.barrier();
  }
  if (comm.rank() == 0) std::printf("final params hash %016" PRIx64 " after %" PRIu64 " steps\n", m.hash(), step);
  return 0;
}

}  // namespace

int train(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return train(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_dp: %s\n", e.what());
    return 1;
  }
}

int train(int argc, char** argv) {
  Options o = parse(argc, argv);
  g_times = o.times;
  const int64_t started = now_ns();
  if (o.stall_replacement >= 0) {
    // Before init() the rank is only in the launcher's variables (a hot spare has none yet).
    const char* r = std::getenv("STRATA_RANK");
    const char* e = std::getenv("STRATA_EPOCH");
    if (r && e && std::string(e) == "1" && std::string(r) == std::to_string(o.stall_replacement)) {
      std::fprintf(stderr, "train_dp: rank %s's replacement stalls before strata::init() (--stall-replacement)\n", r);
      for (;;) ::pause();
    }
  }
  strata::Communicator comm = strata::init();
  const int rank = comm.rank();
  // A fault that names a rank or step the job does not have would silently never fire, and the
  // test or demo that asked for it would pass without the failure: refuse it on every rank.
  for (const Fault& f : o.faults) {
    if (f.rank < 0 || f.rank >= comm.size())
      usage("--fail " + std::to_string(f.rank) + ":" + std::to_string(f.step) + ": rank " + std::to_string(f.rank) +
            " does not exist in a job of " + std::to_string(comm.size()) + " ranks");
    if (f.mode == "host" && comm.local_size() == comm.size())
      usage("--fail " + std::to_string(f.rank) + ":" + std::to_string(f.step) +
            ":host: this job runs on one host, and losing it ends the job; a host loss needs `strata run --ft "
            "--nnodes H` with H > 1");
    if (f.step >= o.steps)
      usage("--fail " + std::to_string(f.rank) + ":" + std::to_string(f.step) + ": step " + std::to_string(f.step) +
            " is not below --steps " + std::to_string(o.steps));
  }
  for (auto [opt, r] : {std::pair{"--fail-in-recovery", o.fail_in_recovery},
                        {"--fail-replacement", o.fail_replacement},
                        {"--stall-replacement", o.stall_replacement}})
    if (r >= comm.size())
      usage(std::string(opt) + " " + std::to_string(r) + ": rank " + std::to_string(r) +
            " does not exist in a job of " + std::to_string(comm.size()) + " ranks");
  const bool replacement = strata::recovery::is_replacement();
  if (o.times)
    std::printf("START rank=%d pid=%d replacement=%d\n", rank, static_cast<int>(getpid()), replacement ? 1 : 0);
  std::fflush(stdout);
  Model m(comm, o);
  if (!o.checkpoint.empty()) return run_checkpointed(comm, o, m);

  if (replacement && rank == o.fail_replacement && comm.epoch() == 1) inject(comm, "kill");

  strata::recovery::State state(comm, o.no_replica ? rank : 0);
  uint64_t cursor = 0, rng = 12345;
  state.add("params", m.params.span());
  state.add("momentum", m.momentum.span());
  state.add("cursor", std::span<uint64_t>(&cursor, 1));
  state.add("rng", std::span<uint64_t>(&rng, 1));
  // killdonor: whichever original rank donates first dies after its first buffer, once.
  bool donor_kill_armed = false;
  for (const Fault& f : o.faults) donor_kill_armed |= f.mode == "killdonor" && !replacement;
  state.on_sent([&](const std::string&, int) {
    if (donor_kill_armed && comm.epoch() == 1) inject(comm, "kill");
  });

  bool in_recovery_fired = false;
  bool state_restored = false;  // this process completed a restore (or needed none)
  bool report_pending = false;
  strata::recovery::Report last;
  strata::recovery::StepFunctions fns;
  bool abort_fired = false;
  fns.compute = [&](uint64_t step) {
    if (o.pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.pace_ms));
    m.gradients(rank, cursor, rng);
    for (const Fault& f : o.faults) {
      if (replacement || f.rank != rank || f.step != step) continue;
      // The only fault its process outlives: once, not again in the redone step.
      if (f.mode == "abort" && std::exchange(abort_fired, true)) continue;
      if (f.mode == "killdonor") inject(comm, "kill");
      if (f.mode == "killmid") {
        strata::Work w = comm.all_reduce_async(m.grads.span(), strata::ReduceOp::Sum);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        inject(comm, "kill");
      }
      inject(comm, f.mode);
    }
    comm.all_reduce(m.grads.span(), strata::ReduceOp::Sum);
  };
  fns.apply = [&](uint64_t step) {
    m.apply(comm.size());
    cursor += static_cast<uint64_t>(comm.size()) * o.batch;
    rng = mix(rng);
    int64_t t = now_ns();
    if (rank == 0 && !o.quiet) {
      if (o.times) std::printf("STEP_DONE step=%" PRIu64 " t=%" PRId64 "\n", step, t);
      else std::printf("step %" PRIu64 " done\n", step);
      if (o.pace_ms > 0) std::fflush(stdout);  // a paced run is watched as it goes
    }
    if (report_pending) {
      report_pending = false;
      const auto& r = last;
      if (o.times)
        std::printf("RECOVERY rank=%d epoch=%" PRIu64 " replacement=%d injected=%" PRId64 " detected=%" PRId64
                    " spawned=%" PRId64 " seen=%" PRId64 " rebuild_start=%" PRId64 " joined=%" PRId64
                    " rebuilt=%" PRId64 " restored=%" PRId64 " step_done=%" PRId64 " bytes=%" PRIu64
                    " store_ops=%" PRIu64 " store_bytes=%" PRIu64 " peer_waits=%" PRIu64 " agree_bytes=%" PRIu64
                    " agree_rounds=%u premapped=%u\n",
                    rank, r.epoch, r.replacement ? 1 : 0, r.injected_ns, r.detected_ns, r.spawned_ns, r.seen_ns,
                    r.rebuild_start_ns, r.joined_ns, r.rebuilt_ns, r.restored_ns, t, r.restored_bytes, r.store_ops,
                    r.store_bytes, r.peer_waits, r.agree_bytes, r.agree_rounds, r.premapped);
      std::string failed;
      for (int f : r.failed) failed += (failed.empty() ? "" : ",") + std::to_string(f);
      if (rank == 0 && r.injected_ns <= 0) {
        // Killed, stopped or cut off from outside: no injection time to measure from.
        std::printf("recovered epoch %" PRIu64
                    " (replaced rank %s): the failure came from outside this program (no injection time, so "
                    "no detection time or RTO); from its detection: revoke %.1f + join %.1f + rebuild %.1f + "
                    "state transfer %.1f + redone step %.1f ms\n",
                    r.epoch, failed.c_str(), ms(r.detected_ns, r.seen_ns), ms(r.rebuild_start_ns, r.joined_ns),
                    ms(r.joined_ns, r.rebuilt_ns), ms(r.rebuilt_ns, r.restored_ns), ms(r.restored_ns, t));
      } else if (rank == 0) {
        std::printf("recovered epoch %" PRIu64
                    " (replaced rank %s): detection %.1f ms, RTO %.1f ms = detect %.1f + revoke %.1f"
                    " + join %.1f (replacement spawned after %.1f) + rebuild %.1f + state transfer %.1f + redone step "
                    "%.1f ms\n",
                    r.epoch, failed.c_str(), ms(r.injected_ns, r.seen_ns), ms(r.injected_ns, t),
                    ms(r.injected_ns, r.detected_ns), ms(r.detected_ns, r.seen_ns), ms(r.rebuild_start_ns, r.joined_ns),
                    ms(r.detected_ns, r.spawned_ns), ms(r.joined_ns, r.rebuilt_ns), ms(r.rebuilt_ns, r.restored_ns),
                    ms(r.restored_ns, t));
      }
      std::fflush(stdout);
    }
  };
  strata::recovery::RunOptions ro;
  ro.on_failure = [&] {
    if (replacement && !state_restored) {
      std::printf("INTERRUPTED rank=%d step=%" PRIu64 "\n", rank, state.step());
      std::fflush(stdout);
    }
    if (rank == o.fail_in_recovery && !replacement && !in_recovery_fired) {
      in_recovery_fired = true;
      inject(comm, "kill");
    }
  };
  ro.on_recovered = [&](const strata::recovery::Report& r) {
    state_restored = true;
    last = r;
    report_pending = true;
  };
  try {
    strata::recovery::run(comm, state, o.steps, fns, ro);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "rank %d: training failed: %s\n", rank, e.what());
    return 1;
  }
  if (o.times)
    std::printf("DONE rank=%d pid=%d steps=%" PRIu64 " startup_ms=%.1f\n", rank, static_cast<int>(getpid()),
                state.step(), ms(started, now_ns()));
  if (rank == 0) std::printf("final params hash %016" PRIx64 " after %" PRIu64 " steps\n", m.hash(), state.step());
  return 0;
}

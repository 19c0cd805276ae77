// The floor under a small all_reduce between two processes of one host: each round, both
// processes write a descriptor and their input into a slot of shared memory, raise a flag,
// spin until the other's flag shows the round, and add the other's input to their own.
// That is the inline all_reduce's data movement (coll/shm/inline.cpp) with nothing else: no
// validation, no copy-engine lock, no flight recorder, no futex fallback. Two slots per
// process in turn, as in the control block, so a round never overwrites what the other
// process still reads. The layout can follow the control block (input from byte 32 of the
// slot, on the flag's line) or start on the next line (--apart), to show what the first
// line is worth.
//
//   build/bench/handshake_probe [--apart] [--rounds N] [SIZE...]   (default 8 16 32 64 128 256 512 1024 2048)
//
// Per size: the median over 7 repeats of the mean time of a round, in microseconds.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define PROBE_RELAX() _mm_pause()
#else
#define PROBE_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace {

constexpr size_t kMaxBytes = 4096;
constexpr int kRepeats = 7;

struct alignas(64) Slot {
  std::atomic<uint32_t> round{0};
  uint32_t pad = 0;
  uint64_t desc[3] = {};  // the descriptor's head, as an inline operation publishes it
  unsigned char data[32 + kMaxBytes];
};
static_assert(offsetof(Slot, data) == 32);

struct Shared {
  Slot slot[2][2];                      // [process][round % 2]
  std::atomic<uint32_t> ready[2] = {};  // start line: both processes mapped and running
};

pid_t g_child = 0, g_parent = 0;

// Called now and then while spinning: a probe whose peer died must not spin forever.
void check_peer(int me, const char* where) {
  const bool gone = me == 0 ? waitpid(g_child, nullptr, WNOHANG) != 0 : getppid() != g_parent;
  if (!gone) return;
  std::fprintf(stderr, "handshake_probe: process %d: the other process exited (%s)\n", me, where);
  _exit(1);
}

// One timed repeat of `rounds` rounds for process `me`; returns microseconds per round.
double run(Shared* sh, int me, size_t bytes, size_t offset, uint32_t first, uint32_t rounds) {
  std::vector<float> in(bytes / sizeof(float) + 1, 1.0f + static_cast<float>(me)), out(in.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t r = first; r < first + rounds; ++r) {
    Slot& mine = sh->slot[me][r & 1];
    const Slot& peer = sh->slot[1 - me][r & 1];
    mine.desc[0] = r;
    std::memcpy(mine.data + offset, in.data(), bytes);
    // seq_cst like the library's publish: a sleeping waiter would be woken from here.
    mine.round.store(r, std::memory_order_seq_cst);
    for (uint32_t spins = 1; peer.round.load(std::memory_order_acquire) != r; ++spins) {
      PROBE_RELAX();
      if (spins % (1u << 22) == 0) check_peer(me, "waiting for a round");
    }
    const auto* p = reinterpret_cast<const float*>(peer.data + offset);
    for (size_t i = 0; i < bytes / sizeof(float); ++i) out[i] = in[i] + p[i];
    if (peer.desc[0] != r) std::abort();  // the descriptor check, reduced to its read
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (out[0] != 3.0f) std::abort();
  return us / rounds;
}

}  // namespace

int main(int argc, char** argv) {
  bool apart = false;
  uint32_t rounds = 200000;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--apart") {
      apart = true;
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else {
      char* end = nullptr;
      const unsigned long v = std::strtoul(a.c_str(), &end, 10);
      if (!end || *end || v == 0 || v > kMaxBytes || v % sizeof(float)) {
        std::fprintf(stderr, "handshake_probe: size '%s' is not a multiple of 4 in [4, %zu]\n", a.c_str(), kMaxBytes);
        return 2;
      }
      sizes.push_back(v);
    }
  }
  if (rounds == 0) {
    std::fprintf(stderr, "handshake_probe: --rounds must be positive\n");
    return 2;
  }
  if (sizes.empty()) sizes = {8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  const size_t offset = apart ? 32 : 0;  // from byte 32 or 64 of the slot

  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("handshake_probe: mmap");
    return 1;
  }
  auto* sh = new (m) Shared;
  g_parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    std::perror("handshake_probe: fork");
    return 1;
  }
  const int me = child == 0 ? 1 : 0;
  g_child = child;
  sh->ready[me].store(1);
  for (uint32_t spins = 1; sh->ready[1 - me].load() == 0; ++spins)
    if (spins % (1u << 22) == 0) check_peer(me, "starting");

  if (me == 0)
    std::printf("# handshake_probe: 2 processes, input from byte %zu of the slot, %u rounds x %d repeats\n",
                32 + offset, rounds, kRepeats);
  if (me == 0) std::printf("%10s %12s\n", "bytes", "us/round");
  uint32_t next = 1;
  for (size_t bytes : sizes) {
    std::vector<double> t;
    for (int k = 0; k < kRepeats; ++k) {
      t.push_back(run(sh, me, bytes, offset, next, rounds));
      next += rounds;
    }
    std::sort(t.begin(), t.end());
    if (me == 0) std::printf("%10zu %12.3f\n", bytes, t[kRepeats / 2]);
  }
  if (me == 1) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

#pragma once
// The flight recorder: what each communicator did last, for "why is my job stuck?". Every
// operation leaves one entry in a fixed ring (sequence number, kind, type, count, root or
// peer, queued/started/done times); the ring is dumped when an operation times out, when the
// communicator is aborted, and when the process gets SIGUSR1 (strata run forwards it and
// merges the ranks' dumps). Within a host the ring lies right after the rank's control block
// in the shared heap, so that a rank that times out waiting for a peer reads what that peer
// is doing; a communicator that spans hosts keeps it in process memory.
//
// The hot path costs a few relaxed stores to a line only this process writes, one
// uncontended fetch_add and two reads of the coarse monotonic clock (no allocation, no lock).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coll/op.hpp"
#include "common/status.hpp"

namespace strata::detail {

struct CommImpl;
struct ContextImpl;

/// Where an operation is in its life.
enum class FlightState : uint8_t { Empty = 0, Queued = 1, Started = 2, Done = 3, Failed = 4 };
/// "queued", "started", "done", "failed" (or "empty").
const char* to_string(FlightState s);

/// One operation as the recorder keeps it. Every field is atomic: the thread that runs the
/// operation writes it while a dump (another thread, or a peer process reading the control
/// block) may read it. A reader may see a mix of two operations while the ring turns over;
/// `id` read before and after tells it apart.
struct alignas(64) FlightEntry {
  std::atomic<uint64_t> id{0};     // claim number + 1 (0: never used)
  std::atomic<uint32_t> seq{0};    // collective number, or the message number with `peer` for send/recv; 0 while queued
  std::atomic<uint32_t> info{0};   // kind | dtype << 8 | state << 16
  std::atomic<int32_t> root{-1};   // root of a rooted collective, peer of send/recv, else -1
  std::atomic<uint64_t> count{0};  // elements (0 for v-collectives and barrier)
  std::atomic<uint64_t> t_queued{0}, t_started{0}, t_done{0};  // flight_now_ns(); 0: not yet

  /// Fields of one entry read at once (plain values).
  struct Snapshot {
    uint64_t id = 0;
    uint32_t seq = 0;
    coll::OpKind kind = coll::OpKind::Internal;
    DataType dtype = DataType::UInt8;
    FlightState state = FlightState::Empty;
    int32_t root = -1;
    uint64_t count = 0;
    uint64_t t_queued = 0, t_started = 0, t_done = 0;
  };
  /// Reads every field (relaxed); `ok` false when the entry changed meanwhile.
  Snapshot read(bool* ok = nullptr) const;
};
static_assert(sizeof(FlightEntry) == 64);

/// Ring entries for a setting of `n` (STRATA_FLIGHT_RECORDER): n rounded up to a power of two.
uint32_t flight_entries(size_t n);

/// The coarse monotonic clock in ns (a few ns to read; ms resolution is what a hang needs).
uint64_t flight_now_ns();

/// A communicator's ring of the last N operations. N = 0: recording is off, every call is a
/// no-op returning handle 0.
class FlightRecorder {
 public:
  /// Keeps the last `n` operations (a power of two, flight_entries(); 0: off) in `storage`
  /// (n zeroed entries, e.g. after the control block), or in memory of its own when null.
  /// Called once, before the communicator runs anything.
  void init(size_t n, FlightEntry* storage = nullptr);
  /// Entries kept.
  size_t capacity() const { return n_; }
  /// Claims an entry for `op`, in state `state` (Queued for _async work, Started otherwise),
  /// with sequence number `seq` (0 when not known yet). Returns its handle (0: off).
  uint64_t begin(const coll::Op& op, FlightState state, uint32_t seq, uint64_t now);
  /// A queued entry starts now as operation `seq`.
  void start(uint64_t h, uint32_t seq, uint64_t now);
  /// The operation of handle `h` ended, well or not.
  void end(uint64_t h, bool ok, uint64_t now);
  /// Every used entry, oldest first (at most capacity()).
  std::vector<FlightEntry::Snapshot> snapshot() const;

 private:
  FlightEntry* entry(uint64_t h) const;
  size_t n_ = 0, mask_ = 0;
  FlightEntry* ring_ = nullptr;
  std::unique_ptr<FlightEntry[]> own_;
  std::atomic<uint64_t> next_{0};
};

/// "#4 all_reduce float32 x1024 root 0", the words the reports use for one entry.
std::string describe(const FlightEntry::Snapshot& e);

// ---- what the hooks on the collective path call ---------------------------------------------

/// Records the start of `op` as operation `seq` on `c`; `queued` is the handle of the Queued
/// entry of _async work, or 0. Returns the handle flight_end takes.
uint64_t flight_begin(CommImpl& c, const coll::Op& op, uint32_t seq, uint64_t queued = 0);
/// Records the end of the operation of handle `h` with `st`.
void flight_end(CommImpl& c, uint64_t h, const Status& st);
/// Records _async work `op` as queued on `c` (its sequence number comes when it starts);
/// returns the handle flight_begin takes as `queued`.
uint64_t flight_queue(CommImpl& c, const coll::Op& op);

/// What member `r` of a single-host communicator is doing, from its ring after its control
/// block: "rank 1's last operation: #4 all_reduce float32 x1024 done 2 ms ago, nothing
/// pending". Empty when this rank's recorder is off or the peer's block is not mapped.
std::string peer_activity(const CommImpl& c, int r);

/// Writes this rank's recent operations on `c` to stderr (a few lines), saying `why`.
void flight_dump_stderr(const CommImpl& c, const std::string& why);

/// Marker that starts every line of a machine-readable dump (the SIGUSR1 answer):
/// strata run takes such lines out of a rank's stderr and merges them (cli/flight_report).
inline constexpr const char* kFlightMarker = "strata-flight:";
/// The machine-readable dump of every communicator of `ctx` (lines ending in '\n').
std::string flight_dump_lines(ContextImpl& ctx);

/// Installs the SIGUSR1 handler of this process (once; not when the program has a handler of
/// its own, or ignores the signal) and registers `ctx` for its dumps. The handler only writes
/// a byte to a pipe; a thread of the library writes the dump.
void flight_watch(const std::shared_ptr<ContextImpl>& ctx);

}  // namespace strata::detail

// Training state restored from a replica, and the step loop that makes "redo one step" safe.
//
// Why a commit barrier between compute and apply: a rank that finished the gradient
// all_reduce cannot tell whether every other rank did too. Applying only after a barrier
// that every rank passed makes the common case (failure before the barrier) a clean
// discard on all survivors. The one race left (the barrier completed on some ranks and
// failed on others, so some applied the step and some did not) is closed by restore():
// whoever is behind receives the state of a replica that applied the most steps, exactly
// like a replacement does. Either way every rank resumes from the same bytes.

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <string>

#include "coll/membership.hpp"
#include "common/log.hpp"

namespace strata::recovery {
namespace {

constexpr int kStateTag = 0x5354;  // "ST"

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// What every rank tells the others before a restore.
struct Info {
  uint64_t step;
  uint64_t manifest;  // hash of (name, bytes) of every registered buffer, in order
  uint64_t bytes;
  int32_t group;
  uint32_t fresh;  // a replacement that has not received its state yet
};

// The restore's agreement, without any rank collecting all N Infos: a binomial tree over
// point-to-point messages carries a summary up to rank 0 and the verdict back down. The
// summary holds one entry per replica group and the list of fresh ranks, so what a rank
// sends and receives depends on the number of groups and of replaced ranks, not on N, and
// each rank exchanges O(log N) messages (rank 0) or fewer.
constexpr int kAgreeTag = 0x5341;  // "SA"

struct GroupSum {
  int64_t group, first, manifest, best, best_step, healthy, at_best, first_fresh;
};
constexpr size_t kGroupWords = sizeof(GroupSum) / sizeof(int64_t);

// verdict (0 ok, 1 mismatch, 2 no replica), rank, other; the groups, sorted; fresh ranks.
struct Summary {
  int64_t verdict = 0, rank = -1, other = -1;
  std::vector<GroupSum> groups;
  std::vector<int64_t> ranks;  // (rank, group) pairs: fresh (first round) or behind (second round)

  std::vector<int64_t> pack() const {
    std::vector<int64_t> w{verdict, rank, other, static_cast<int64_t>(groups.size())};
    for (const auto& g : groups) {
      const auto* p = reinterpret_cast<const int64_t*>(&g);
      w.insert(w.end(), p, p + kGroupWords);
    }
    w.insert(w.end(), ranks.begin(), ranks.end());
    return w;
  }
  static Summary unpack(const std::vector<int64_t>& w) {
    Summary s;
    s.verdict = w[0], s.rank = w[1], s.other = w[2];
    size_t ng = static_cast<size_t>(w[3]), at = 4;
    s.groups.resize(ng);
    for (size_t i = 0; i < ng; ++i, at += kGroupWords) std::memcpy(&s.groups[i], &w[at], sizeof(GroupSum));
    s.ranks.assign(w.begin() + static_cast<std::ptrdiff_t>(at), w.end());
    return s;
  }
  const GroupSum* find(int64_t g) const {
    for (const auto& x : groups)
      if (x.group == g) return &x;
    return nullptr;
  }
};

// In each replica group the donor is the healthy member that applied the most steps (lowest
// rank on ties); a manifest that differs from the group's lowest rank's is a mismatch.
void merge(Summary& a, const Summary& b) {
  if (a.verdict == 0 && b.verdict != 0) a.verdict = b.verdict, a.rank = b.rank, a.other = b.other;
  for (const auto& y : b.groups) {
    auto it = std::find_if(a.groups.begin(), a.groups.end(), [&](const GroupSum& x) { return x.group == y.group; });
    if (it == a.groups.end()) {
      a.groups.push_back(y);
      continue;
    }
    GroupSum& x = *it;
    if (x.manifest != y.manifest && a.verdict == 0)
      a.verdict = 1, a.rank = std::max(x.first, y.first), a.other = std::min(x.first, y.first);
    if (y.first < x.first) x.first = y.first, x.manifest = y.manifest;
    if (y.best >= 0 && (x.best < 0 || y.best_step > x.best_step || (y.best_step == x.best_step && y.best < x.best))) {
      x.at_best = (x.best >= 0 && y.best_step == x.best_step) ? x.at_best + y.at_best : y.at_best;
      x.best = y.best, x.best_step = y.best_step;
    } else if (y.best >= 0 && y.best_step == x.best_step) {
      x.at_best += y.at_best;
    }
    x.healthy += y.healthy;
    if (y.first_fresh >= 0 && (x.first_fresh < 0 || y.first_fresh < x.first_fresh)) x.first_fresh = y.first_fresh;
  }
  std::sort(a.groups.begin(), a.groups.end(), [](const GroupSum& x, const GroupSum& y) { return x.group < y.group; });
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const std::vector<int64_t>* v : {static_cast<const std::vector<int64_t>*>(&a.ranks), &b.ranks})
    for (size_t i = 0; i + 1 < v->size(); i += 2) pairs.emplace_back((*v)[i], (*v)[i + 1]);
  std::sort(pairs.begin(), pairs.end());
  a.ranks.clear();
  for (auto [r, g] : pairs) a.ranks.push_back(r), a.ranks.push_back(g);
}

// Words of an agreement message's fixed-size head: its length, then the summary's first
// words. A summary is 4 + 8 per replica group + 2 per listed rank words: one group with up to
// 5 replaced ranks (data parallelism) or two groups with one fit; a longer one sends the rest
// as a second message.
constexpr size_t kHeadWords = 24;

// Sends posted without waiting for their receivers, and the buffers they read: waited for
// once the restore is done (or, errors ignored, when an error unwinds it: every one is
// received inside its peer's agreement, and a failed peer revokes the communicator, which
// fails them at once), so that a rank that hands the verdict down goes straight on to its
// own part of the transfer.
class PostedSends {
 public:
  PostedSends() = default;
  PostedSends(const PostedSends&) = delete;
  PostedSends& operator=(const PostedSends&) = delete;
  ~PostedSends() {
    for (Work& w : works_) {
      try {
        w.wait();
      } catch (const Error&) {
      }
    }
  }
  /// Posts `w` (words) to `to`; the buffer lives until the send completed.
  void send(Communicator& comm, std::vector<int64_t> w, int to, int tag) {
    const std::vector<int64_t>& b = buffers_.emplace_back(std::move(w));
    works_.push_back(comm.send_async(b.data(), b.size() * sizeof(int64_t), DataType::UInt8, to, tag));
  }
  /// Waits for every posted send; throws the first failure.
  void wait_all() {
    for (Work& w : works_) w.wait();
    works_.clear();
    buffers_.clear();
  }

 private:
  std::deque<std::vector<int64_t>> buffers_;  // a deque: growing it moves no buffer
  std::vector<Work> works_;
};

// Reduces every rank's summary to rank 0 (merge) and hands rank 0's result back to all.
// `messages` and `bytes` count what this rank sent and received. One message per tree edge
// (the head), posted without waiting for the receiver: with N processes on a few cores every
// blocking hand-over costs the receiver's and then the sender's wake-up, and the tree's depth
// multiplies that (64 ranks on 2 cores: 22-42 ms for the agreement with a length message and
// a blocking send per edge).
Summary agree(Communicator& comm, Summary mine, PostedSends& posted, uint64_t& messages, uint64_t& bytes) {
  const int me = comm.rank(), n = comm.size();
  auto send = [&](const std::vector<int64_t>& w, int to) {
    std::vector<int64_t> head(kHeadWords, 0);
    head[0] = static_cast<int64_t>(w.size());
    const size_t first = std::min(w.size(), kHeadWords - 1);
    std::copy_n(w.begin(), first, head.begin() + 1);
    posted.send(comm, std::move(head), to, kAgreeTag);
    messages += 1, bytes += kHeadWords * sizeof(int64_t);
    if (w.size() > first) {
      posted.send(comm, std::vector<int64_t>(w.begin() + static_cast<std::ptrdiff_t>(first), w.end()), to, kAgreeTag);
      messages += 1, bytes += (w.size() - first) * sizeof(int64_t);
    }
  };
  auto recv = [&](int from) {
    std::vector<int64_t> head(kHeadWords);
    comm.recv(head.data(), kHeadWords * sizeof(int64_t), DataType::UInt8, from, kAgreeTag);
    messages += 1, bytes += kHeadWords * sizeof(int64_t);
    auto malformed = [&](const std::string& what) {
      return Error(Code::Internal,
                   "recovery::State::restore: rank " + std::to_string(from) + " sent a malformed agreement message (" +
                       what + ")",
                   me, from);
    };
    // A summary holds a few words per replica group and per replaced rank.
    constexpr int64_t kMaxWords = int64_t{1} << 24;
    if (head[0] < 4 || head[0] > kMaxWords) throw malformed(std::to_string(head[0]) + " words");
    const size_t len = static_cast<size_t>(head[0]), first = std::min(len, kHeadWords - 1);
    std::vector<int64_t> w(head.begin() + 1, head.begin() + 1 + static_cast<std::ptrdiff_t>(first));
    if (len > first) {
      w.resize(len);
      comm.recv(w.data() + first, (len - first) * sizeof(int64_t), DataType::UInt8, from, kAgreeTag);
      messages += 1, bytes += (len - first) * sizeof(int64_t);
    }
    // The group count sizes what unpack() reads; the rest is (rank, group) pairs.
    const int64_t groups = w[3];
    const size_t ng = groups < 0 ? len : static_cast<size_t>(groups);
    if (ng > (len - 4) / kGroupWords || (len - 4 - ng * kGroupWords) % 2 != 0)
      throw malformed(std::to_string(groups) + " groups in " + std::to_string(len) + " words");
    return w;
  };
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if (me & mask) {
      send(mine.pack(), me - mask);
      break;
    }
    if (me + mask < n) merge(mine, Summary::unpack(recv(me + mask)));
  }
  // Down the same tree: from the parent, then to the children below the bit it came on.
  std::vector<int64_t> all;
  if (me == 0) all = mine.pack();
  else all = recv(me - mask);
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (me + mask < n) send(all, me + mask);
  return Summary::unpack(all);
}

bool recoverable(Code c) { return c == Code::PeerFailed || c == Code::Aborted || c == Code::Timeout; }

}  // namespace

struct State::Impl {
  Communicator* comm = nullptr;
  int group = 0;
  struct Entry {
    std::string name;
    void* data;
    size_t bytes;
  };
  std::vector<Entry> entries;  // registered buffers in order; "step" is not among them
  uint64_t step = 0;
  // Set once a restore delivered "step", the commit of the transfer: until then a
  // replacement reports itself fresh, so a restore cut short by its donor's death is redone
  // in full from another donor.
  bool restored = false;
  std::function<void(const std::string&, int)> on_sent;  // test hook, see State::on_sent
};

State::State(Communicator& comm, int replica_group) : impl_(std::make_unique<Impl>()) {
  if (!comm.valid()) throw Error(Code::InvalidArgument, "recovery::State: the communicator is not valid");
  impl_->comm = &comm;
  impl_->group = replica_group;
}

State::~State() = default;

void State::add_bytes(const std::string& name, void* data, size_t bytes) {
  if (name == "step")
    throw Error(Code::InvalidArgument,
                "recovery::State::add: a buffer named 'step' is already registered (State::step())",
                impl_->comm->rank());
  for (const auto& e : impl_->entries)
    if (e.name == name)
      throw Error(Code::InvalidArgument, "recovery::State::add: a buffer named '" + name + "' is already registered",
                  impl_->comm->rank());
  if (data == nullptr && bytes > 0)
    throw Error(Code::InvalidArgument, "recovery::State::add: buffer '" + name + "' is null", impl_->comm->rank());
  impl_->entries.push_back({name, data, bytes});
}

uint64_t& State::step() { return impl_->step; }

void State::on_sent(std::function<void(const std::string& name, int receiver)> hook) {
  impl_->on_sent = std::move(hook);
}

size_t State::bytes() const {
  size_t n = sizeof impl_->step;
  for (const auto& e : impl_->entries) n += e.bytes;
  return n;
}

void State::restore() {
  Communicator& comm = *impl_->comm;
  const int me = comm.rank();
  detail::Membership mem(comm.impl());
  const uint64_t waits0 = mem.peer_waits();
  uint64_t messages = 0, agree_bytes = 0;
  Info mine{};
  mine.step = impl_->step;
  mine.manifest = 0xcbf29ce484222325ull;
  mine.manifest = fnv1a(mine.manifest, "step", 5);
  for (const auto& e : impl_->entries) {
    mine.manifest = fnv1a(mine.manifest, e.name.data(), e.name.size() + 1);
    mine.manifest = fnv1a(mine.manifest, &e.bytes, sizeof e.bytes);
  }
  mine.bytes = bytes();
  mine.group = impl_->group;
  mine.fresh = (is_replacement() && !impl_->restored) ? 1 : 0;
  Summary own;
  GroupSum gs{impl_->group, me, static_cast<int64_t>(mine.manifest), -1, 0, 0, 0, -1};
  if (mine.fresh) {
    gs.first_fresh = me;
    own.ranks = {me, impl_->group};
  } else {
    gs.best = me, gs.best_step = static_cast<int64_t>(mine.step), gs.healthy = 1, gs.at_best = 1;
  }
  own.groups.push_back(gs);
  PostedSends posted;
  const Summary plan = agree(comm, own, posted, messages, agree_bytes);
  enum Verdict : int64_t { kOk = 0, kMismatch = 1, kNoReplica = 2 };
  Summary verdict = plan;
  if (verdict.verdict == kOk)
    for (const auto& x : plan.groups)
      if (x.healthy == 0) {
        verdict.verdict = kNoReplica, verdict.rank = x.first_fresh, verdict.other = x.group;
        break;
      }
  if (verdict.verdict == kMismatch)
    throw Error(Code::InvalidArgument,
                "recovery::State::restore: rank " + std::to_string(verdict.rank) +
                    " registered different buffers than rank " + std::to_string(verdict.other) +
                    " of its replica group; register the same names and sizes in the same order on every replica",
                me, static_cast<int>(verdict.rank == me ? verdict.other : verdict.rank));  // the other one
  if (verdict.verdict == kNoReplica)
    throw Error(Code::Unavailable,
                "recovery::State::restore: no healthy replica holds the state of rank(s) " +
                    std::to_string(verdict.rank) + " (replica group " + std::to_string(verdict.other) +
                    "): every member was replaced; a checkpoint is needed",
                me, static_cast<int>(verdict.rank));
  // Ranks behind their group's donor (a commit barrier that completed on some ranks only)
  // are rare; a second round names them only when the counts say there are some.
  const GroupSum* mg = plan.find(impl_->group);
  std::vector<int64_t> behind;
  bool any_behind = false;
  for (const auto& x : plan.groups) any_behind |= x.at_best < x.healthy;
  const bool me_behind = !mine.fresh && static_cast<int64_t>(mine.step) < mg->best_step;
  if (any_behind) {
    Summary b;
    if (me_behind) b.ranks = {me, impl_->group};
    behind = agree(comm, b, posted, messages, agree_bytes).ranks;
  }
  int donor = -1;
  std::vector<int> receivers;
  if (mine.fresh || me_behind) donor = static_cast<int>(mg->best);
  if (mg->best == me) {
    // Fresh and behind ranks of this group, in rank order (a rank is never both).
    std::vector<int> cand;
    for (const std::vector<int64_t>* v : {&plan.ranks, static_cast<const std::vector<int64_t>*>(&behind)})
      for (size_t i = 0; i + 1 < v->size(); i += 2)
        if ((*v)[i + 1] == impl_->group) cand.push_back(static_cast<int>((*v)[i]));
    std::sort(cand.begin(), cand.end());
    receivers = cand;
  }

  // The step goes last: it is the commit of the transfer. A donor that dies halfway leaves
  // the receiver with its old step (a replacement: fresh, restored still false), so the next
  // restore sees it behind and sends everything again; sent first, it would mark stale
  // buffers with the new step and they would pass for up to date (issue 18 item 7).
  uint64_t moved = 0;
  if (!receivers.empty()) {
    for (int r : receivers) {
      for (const auto& e : impl_->entries) {
        comm.send(e.data, e.bytes, DataType::UInt8, r, kStateTag);
        moved += e.bytes;
        ++messages;
        if (impl_->on_sent) impl_->on_sent(e.name, r);
      }
      comm.send(&impl_->step, sizeof impl_->step, DataType::UInt8, r, kStateTag);
      moved += sizeof impl_->step;
      ++messages;
    }
  } else if (donor >= 0) {
    for (const auto& e : impl_->entries) {
      comm.recv(e.data, e.bytes, DataType::UInt8, donor, kStateTag);
      moved += e.bytes;
      ++messages;
    }
    uint64_t step = 0;
    comm.recv(&step, sizeof step, DataType::UInt8, donor, kStateTag);
    moved += sizeof step;
    ++messages;
    impl_->step = step;
  }
  posted.wait_all();
  impl_->restored = true;
  detail::EpochState& epochs = detail::Membership(comm.impl()).context().epochs();
  std::lock_guard<std::mutex> g(epochs.mu);
  epochs.report.restored_ns = now_ns();
  epochs.report.restored_bytes = moved;
  epochs.report.peer_waits += mem.peer_waits() - waits0 + messages;
  epochs.report.agree_bytes = agree_bytes;
  epochs.report.agree_rounds = any_behind ? 2 : 1;
}

void run(Communicator& comm, State& state, uint64_t total_steps, const StepFunctions& fns, const RunOptions& opts) {
  if (!fns.compute || !fns.apply)
    throw Error(Code::InvalidArgument, "recovery::run: both StepFunctions::compute and ::apply are required",
                comm.rank());
  // A rank whose first setup a failure interrupted was rebuilt inside init(): it joins the
  // replacement's restore like any survivor (epoch > 0 before its first step).
  bool need_restore = is_replacement() || comm.epoch() > 0;
  int recoveries = 0;
  for (;;) {
    try {
      if (need_restore) {
        state.restore();
        need_restore = false;
        if (opts.on_recovered) opts.on_recovered(last_report(comm));
      }
      if (state.step() >= total_steps) break;
      fns.compute(state.step());
      comm.barrier();  // the commit point: every rank has the step's reduced gradients
    } catch (const Error& e) {
      if (!recoverable(e.code()) || ++recoveries > opts.max_recoveries) throw;
      STRATA_LOG(Info, "rank " << comm.rank() << ": " << (need_restore ? "restore" : "step")
                               << " failed, recovering: " << e.what());
      if (opts.on_failure) opts.on_failure();
      // A failure during the rebuild moves the job to a newer epoch: rebuild again.
      for (;;) {
        try {
          comm.recover();
          break;
        } catch (const Error& again) {
          if (!recoverable(again.code()) || ++recoveries > opts.max_recoveries) throw;
        }
      }
      need_restore = true;
      continue;
    }
    fns.apply(state.step());
    ++state.step();
  }
}

}  // namespace strata::recovery

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
#include <functional>
#include <string>

#include "coll/membership.hpp"

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

// Who sends to whom, decided by rank 0 from every rank's Info. In each replica group the
// donor is the healthy member that applied the most steps (lowest rank on ties); the
// receivers are the fresh members and those behind it.
std::vector<int64_t> make_plan(const std::vector<Info>& all) {
  const int n = static_cast<int>(all.size());
  std::vector<int64_t> plan(3 + static_cast<size_t>(n), -1);
  plan[0] = 0;
  int64_t* donor_of = plan.data() + 3;
  std::vector<int> groups;
  for (const auto& i : all) groups.push_back(i.group);
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  for (int g : groups) {
    int best = -1, first = -1, first_fresh = -1;
    for (int r = 0; r < n; ++r) {
      if (all[r].group != g) continue;
      if (first < 0) first = r;
      if (all[r].manifest != all[first].manifest) {
        plan[0] = 1, plan[1] = r, plan[2] = first;
        return plan;
      }
      if (all[r].fresh) {
        if (first_fresh < 0) first_fresh = r;
      } else if (best < 0 || all[r].step > all[best].step) {
        best = r;
      }
    }
    if (best < 0) {
      plan[0] = 2, plan[1] = first_fresh, plan[2] = g;
      return plan;
    }
    for (int r = 0; r < n; ++r)
      if (all[r].group == g && (all[r].fresh || all[r].step < all[best].step)) donor_of[r] = best;
  }
  return plan;
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
  const int me = comm.rank(), n = comm.size();
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
  // Rank 0 plans and broadcasts the plan, so a replacement talks to rank 0 and its donor
  // only (an all_gather would make it map every peer's memory first).
  std::vector<Info> all(me == 0 ? static_cast<size_t>(n) : 1);
  comm.gather(&mine, all.data(), sizeof(Info), DataType::UInt8, 0);
  // plan = [verdict, rank, other, donor of rank 0, donor of rank 1, ...]; donor -1 = none.
  enum Verdict : int64_t { kOk = 0, kMismatch = 1, kNoReplica = 2 };
  std::vector<int64_t> plan(3 + static_cast<size_t>(n), -1);
  if (me == 0) plan = make_plan(all);
  comm.broadcast(plan.data(), plan.data(), plan.size(), DataType::Int64, 0);
  if (plan[0] == kMismatch)
    throw Error(Code::InvalidArgument,
                "recovery::State::restore: rank " + std::to_string(plan[1]) +
                    " registered different buffers than rank " + std::to_string(plan[2]) +
                    " of its replica group; register the same names and sizes in the same order on every replica",
                me, static_cast<int>(plan[1]));
  if (plan[0] == kNoReplica)
    throw Error(Code::Unavailable,
                "recovery::State::restore: no healthy replica holds the state of rank(s) " + std::to_string(plan[1]) +
                    " (replica group " + std::to_string(plan[2]) +
                    "): every member was replaced; a checkpoint is needed",
                me, static_cast<int>(plan[1]));
  const int64_t* donor_of = plan.data() + 3;
  const int donor = static_cast<int>(donor_of[me]);
  std::vector<int> receivers;
  for (int r = 0; r < n; ++r)
    if (donor_of[r] == me) receivers.push_back(r);

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
        if (impl_->on_sent) impl_->on_sent(e.name, r);
      }
      comm.send(&impl_->step, sizeof impl_->step, DataType::UInt8, r, kStateTag);
      moved += sizeof impl_->step;
    }
  } else if (donor >= 0) {
    for (const auto& e : impl_->entries) {
      comm.recv(e.data, e.bytes, DataType::UInt8, donor, kStateTag);
      moved += e.bytes;
    }
    uint64_t step = 0;
    comm.recv(&step, sizeof step, DataType::UInt8, donor, kStateTag);
    moved += sizeof step;
    impl_->step = step;
  }
  impl_->restored = true;
  detail::EpochState& epochs = detail::Membership(comm.impl()).context().epochs();
  std::lock_guard<std::mutex> g(epochs.mu);
  epochs.report.restored_ns = now_ns();
  epochs.report.restored_bytes = moved;
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

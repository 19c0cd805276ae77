// The torch.distributed backend "strata": a c10d::ProcessGroup over a strata::Communicator.
//
// This is the only file that depends on torch (1.13's c10d ProcessGroup/Work API); it is
// built into its own extension, `_strata_torch`, only when torch and its C++ headers are
// found. strata/_torch.py makes the communicator (rendezvous) and registers the backend.
//
// Execution: every operation except send becomes a StrataWork in the process group's queue,
// run exactly once and in issue order (so every rank runs them in the same order), either by
// the group's executor thread or by a caller that waits for it: a blocking torch call
// (dist.all_reduce(t)) runs its operation on its own thread, with no hand-off (see Executor).
// Sends are posted at once (strata's send_async) and complete when the receiver has copied,
// so an isend can never sit in a queue behind the recv that would match the peer's isend.
//
// Memory: tensors from torch's allocator are external buffers to Strata (staged through the
// heap, one copy in and one out); tensors from comm.empty_tensor(), or allocated while the
// HeapAllocator below is installed, live in the registered heap and move with no copy.
// Element types pass through as bytes for the operations that only move data, so those
// accept every dtype; reductions need a Strata reduction type.

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <strata/strata.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

namespace strata::torch_backend {

namespace py = pybind11;

// ---- types and checks ----------------------------------------------------------------------

std::optional<DataType> reduction_type(at::ScalarType t) {
  switch (t) {
    case at::kChar: return DataType::Int8;
    case at::kByte: return DataType::UInt8;
    case at::kInt: return DataType::Int32;
    case at::kLong: return DataType::Int64;
    case at::kHalf: return DataType::Float16;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kFloat: return DataType::Float32;
    case at::kDouble: return DataType::Float64;
    default: return std::nullopt;
  }
}

ReduceOp reduce_op(const c10d::ReduceOp& op, const char* call) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Prod;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    case c10d::ReduceOp::BAND: return ReduceOp::BAnd;
    case c10d::ReduceOp::BOR: return ReduceOp::BOr;
    case c10d::ReduceOp::BXOR: return ReduceOp::BXor;
    default:
      TORCH_CHECK(false, "strata backend: ", call,
                  " supports ReduceOp SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR (not PREMUL_SUM, which gloo "
                  "refuses too)");
  }
}

void check_tensor(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.device().is_cpu(), "strata backend: ", call, " needs CPU tensors, got one on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "strata backend: ", call, " needs dense (strided) tensors");
  TORCH_CHECK(t.is_contiguous(), "strata backend: ", call, " needs contiguous tensors (call .contiguous())");
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* call) {
  TORCH_CHECK(ts.size() == 1, "strata backend: ", call, " takes exactly one tensor per call, got ", ts.size());
  check_tensor(ts[0], call);
  return ts[0];
}

DataType reduce_type(const at::Tensor& t, const char* call) {
  auto dt = reduction_type(t.scalar_type());
  TORCH_CHECK(dt, "strata backend: ", call, " cannot reduce ", t.scalar_type(),
              " tensors (supported: int8, uint8, int32, int64, float16, bfloat16, float32, float64)");
  return *dt;
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

/// How a call that only moves data describes a tensor to Strata: its elements and their type
/// where Strata has the type, so that a mismatch between ranks is told in the caller's
/// elements and types (it was told in bytes); else (bool, complex) its bytes.
struct Elems {
  size_t count;  // units of `dt`
  DataType dt;
  size_t unit;  // bytes per unit
};
Elems elems(const at::Tensor& t) {
  if (auto dt = reduction_type(t.scalar_type()))
    return {static_cast<size_t>(t.numel()), *dt, static_cast<size_t>(t.element_size())};
  return {nbytes(t), DataType::UInt8, 1};
}

CollOptions coll_options(std::chrono::milliseconds timeout) {
  CollOptions o;
  if (timeout.count() > 0) o.timeout = timeout;  // kUnsetTimeout (-1): the communicator's
  return o;
}

/// One contiguous tensor holding `parts` back to back, or an empty tensor when they are not
/// adjacent in one storage (then the caller copies through a temporary).
at::Tensor as_one_block(const std::vector<at::Tensor>& parts) {
  if (parts.empty()) return {};
  const auto& first = parts[0];
  auto* expect = static_cast<char*>(first.data_ptr());
  for (const auto& p : parts) {
    if (!p.is_contiguous() || p.scalar_type() != first.scalar_type() || !p.device().is_cpu() ||
        !p.storage().is_alias_of(first.storage()) || static_cast<char*>(p.data_ptr()) != expect)
      return {};
    expect += nbytes(p);
  }
  int64_t total = 0;
  for (const auto& p : parts) total += p.numel();
  return first.as_strided({total}, {1});
}

at::Tensor flat_cat(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  flat.reserve(parts.size());
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

void copy_out(const at::Tensor& block, std::vector<at::Tensor>& parts) {
  int64_t off = 0;
  for (auto& p : parts) {
    p.copy_(block.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
}

// ---- work and executor ---------------------------------------------------------------------

class Executor;

/// A queued operation: runs once (on the executor, or on a thread that waits for it).
class StrataWork : public c10d::Work {
 public:
  StrataWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
             std::function<void()> body, std::weak_ptr<Executor> exec)
      : Work(rank, type, title),
        outputs_(std::move(outputs)),
        body_(std::move(body)),
        exec_(std::move(exec)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  /// When the work was queued (the executor gives waiters a head start, see Executor).
  std::chrono::steady_clock::time_point queued_at = std::chrono::steady_clock::now();

  /// Runs the operation (in issue order: the executor lets one thread do so at a time).
  void execute() {
    try {
      body_();
    } catch (...) {
      error_ = std::current_exception();
    }
    body_ = nullptr;  // drops the tensors the body captured
  }
  /// Completes the future, which runs its callbacks on this thread: they may start and wait
  /// for more work (torch's PowerSGD hook does), so no thread runs this holding the executor.
  void complete() {
    // The future first: whoever returns from wait() may read it at once.
    if (error_) future_->setError(error_);
    else future_->markCompleted(c10::IValue(outputs_));
    finish(error_);
  }
  /// Taken from the queue by a thread that runs it (guarded by the executor's lock).
  bool taken = false;
  /// Completion without side effects (the executor asks under its lock).
  bool done() { return c10d::Work::isCompleted(); }

  bool wait(std::chrono::milliseconds timeout) override;
  bool isCompleted() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  /// The sender of a receive (dist.recv without src reports it); set by the body.
  int sourceRank() const override {
    TORCH_CHECK(source_ && *source_ >= 0, "strata backend: sourceRank() is known only for a completed receive");
    return *source_;
  }
  /// Where the body of a receive writes its sender.
  void track_source(std::shared_ptr<std::atomic<int>> s) { source_ = std::move(s); }

 private:
  std::shared_ptr<std::atomic<int>> source_;
  std::exception_ptr error_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> body_;
  // Weak: the executor's thread may drop the last reference to a work, and must never be
  // the one that destroys (and joins) itself. The process group owns the executor.
  std::weak_ptr<Executor> exec_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// Runs queued works in issue order, each exactly once, on its own thread or on the thread
/// of a caller that waits for one of them.
///
/// A blocking torch call (dist.all_reduce(t)) waits right after queueing: that caller runs
/// the work itself, with no hand-off between threads. Waking the executor's thread for every
/// such call would cost two context switches on the caller's critical path (measured: tens
/// of microseconds on a loaded 2-core machine), so while works keep coming the thread is not
/// woken per work; it looks at the queue every kTick and starts a work nobody has claimed
/// once it has been queued for `grace`. Anyone who will wait for a work without calling
/// Work::wait (a future, as DDP's hooks use; a polling isCompleted()) kicks it awake to start
/// the work at once. After kLinger without works the thread sleeps until the next one.
///
/// A work's future is completed outside the executor's hold (busy_ is for running works
/// only): its callbacks may queue more work and wait for it. When every executor thread is
/// inside such a callback and work waits in the queue, another thread is started (gloo runs
/// works on a pool; a single thread deadlocked PowerSGD's hook, which waits inside `then`).
class Executor {
 public:
  explicit Executor(std::chrono::microseconds grace) : grace_(grace) {
    threads_.emplace_back([this] { loop(); });
  }
  ~Executor() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;  // no thread is started from here on
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();  // runs whatever is still queued first
  }

  void enqueue(c10::intrusive_ptr<StrataWork> w) {
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(w));
      last_active_ = Clock::now();
      wake = sleeping_;
      add_thread_if_stuck();
    }
    if (wake) cv_.notify_all();
  }

  /// Start queued work now: someone waits for it by other means than Work::wait.
  void kick() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (q_.empty()) return;
      kicked_ = true;
      add_thread_if_stuck();
    }
    cv_.notify_all();
  }

  /// Returns once `w` has run and completed: runs it on this thread, after what was queued
  /// before it, unless another thread has taken it.
  void run_through(StrataWork* w) {
    std::unique_lock<std::mutex> lk(mu_);
    ++waiters_;
    for (;;) {
      cv_.wait(lk, [&] { return w->done() || (!w->taken && !busy_); });
      if (w->done()) break;
      // Nobody runs anything and `w` is still queued: run the works up to it.
      const bool last = q_.front().get() == w;
      serve(lk);
      if (last) break;
    }
    --waiters_;
    const bool wake = waiters_ > 0 || (kicked_ && !q_.empty());
    lk.unlock();
    if (wake) cv_.notify_all();
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kTick = std::chrono::milliseconds(2);
  static constexpr auto kLinger = std::chrono::milliseconds(200);

  /// Runs the work at the front of the queue, then completes it; called and returns with
  /// `lk` held, released while the work runs and while its future's callbacks run.
  void serve(std::unique_lock<std::mutex>& lk) {
    busy_ = true;
    c10::intrusive_ptr<StrataWork> next = std::move(q_.front());
    q_.pop_front();
    next->taken = true;
    lk.unlock();
    next->execute();
    lk.lock();
    busy_ = false;
    ++completing_;
    // A callback may wait for queued work by a future it took before (nothing to kick then):
    // keep a thread free for the queue. At most one more for a stream of works whose futures
    // have no callbacks, since it stays, counted idle, for the next.
    add_thread_if_stuck();
    lk.unlock();
    cv_.notify_all();  // the next work may start while this one's callbacks run
    next->complete();
    next.reset();  // outside the lock: may free tensors
    lk.lock();
    --completing_;
    last_active_ = Clock::now();
    if (waiters_ > 0) cv_.notify_all();  // a waiter of this work (or of its place in the queue)
  }

  /// With `mu_` held: starts another executor thread if work is queued, nothing runs and
  /// every thread is completing a future (whose callbacks may wait for that work).
  void add_thread_if_stuck() {
    if (stop_ || q_.empty() || busy_ || idle_ > 0 || completing_ == 0) return;
    ++idle_;  // counted from now, so that calls before it runs start no more
    threads_.emplace_back([this] { loop(/*counted=*/true); });
  }

  void loop(bool counted = false) {
    std::unique_lock<std::mutex> lk(mu_);
    if (counted) --idle_;
    for (;;) {
      if (busy_ || q_.empty()) {
        if (stop_ && q_.empty()) return;
        ++idle_;
        if (Clock::now() - last_active_ < kLinger) {
          cv_.wait_for(lk, kTick);
        } else {
          sleeping_ = true;
          cv_.wait(lk);
          sleeping_ = false;
        }
        --idle_;
        continue;
      }
      const auto start = q_.front()->queued_at + grace_;
      if (!stop_ && !kicked_ && Clock::now() < start) {
        ++idle_;
        cv_.wait_until(lk, start);
        --idle_;
        continue;
      }
      kicked_ = false;
      serve(lk);
      if (waiters_ > 0) cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<StrataWork>> q_;
  bool busy_ = false;      // a thread is running a work taken from q_
  int idle_ = 0;           // executor threads waiting for work
  int completing_ = 0;     // threads completing a work's future (its callbacks may block)
  bool sleeping_ = false;  // the executor thread waits without a timeout
  bool kicked_ = false;
  bool stop_ = false;
  int waiters_ = 0;
  Clock::time_point last_active_ = Clock::now();
  const std::chrono::microseconds grace_;
  std::vector<std::thread> threads_;  // last: they start after the members they use exist
};

bool StrataWork::wait(std::chrono::milliseconds timeout) {
  // Gone only when the process group is: its destructor ran every queued work.
  auto exec = exec_.lock();
  if (timeout.count() != 0) {  // kNoTimeout is 0
    // Bounded: the executor runs it while this thread waits at most `timeout` (Work::wait
    // throws "Operation timed out!" then, as gloo's does); running it here could not be cut short.
    if (exec) exec->kick();
    return Work::wait(timeout);
  }
  if (exec) exec->run_through(this);
  return Work::wait(timeout);
}

bool StrataWork::isCompleted() {
  if (done()) return true;
  if (auto exec = exec_.lock()) exec->kick();  // polled: someone waits for it
  return false;
}

c10::intrusive_ptr<c10::ivalue::Future> StrataWork::getFuture() {
  if (auto exec = exec_.lock()) exec->kick();  // waited for through the future
  return future_;
}

/// A send: posted at once; complete when the receiver has copied. Its future completes when
/// the work is waited for or found complete by isCompleted().
class SendWork : public c10d::Work {
 public:
  SendWork(int rank, strata::Work handle, at::Tensor tensor)
      : c10d::Work(rank, c10d::OpType::SEND, "strata:send"),
        handle_(std::move(handle)),
        tensor_(std::move(tensor)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  bool isCompleted() override {
    if (!done_) {
      try {
        if (!handle_.test()) return false;
        settle(nullptr);
      } catch (...) {
        settle(std::current_exception());
      }
    }
    return true;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    if (!done_) {
      try {
        if (timeout.count() > 0) {
          if (!handle_.wait_for(timeout))
            TORCH_CHECK(false, "strata backend: send still running after ", timeout.count(), " ms");
        } else {
          handle_.wait();
        }
        settle(nullptr);
      } catch (const c10::Error&) {
        throw;
      } catch (...) {
        settle(std::current_exception());
      }
    }
    return Work::wait(timeout);
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  void settle(std::exception_ptr error) {
    std::lock_guard<std::mutex> g(settle_mu_);
    if (done_) return;
    done_ = true;
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(std::vector<at::Tensor>{tensor_}));
    finish(error);
  }
  strata::Work handle_;
  at::Tensor tensor_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex settle_mu_;
  std::atomic<bool> done_{false};
};

// ---- monitored barrier and sparse all_reduce ------------------------------------------------

/// Tag of the monitored barrier's messages: torch users' tags are not negative.
constexpr int kMonitoredBarrierTag = -0x4d42;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

/// gloo's monitored barrier over point-to-point messages (see monitoredBarrier).
void monitored_barrier(Communicator& c, int rank, int size, std::chrono::milliseconds timeout, bool wait_all) {
  using Clock = std::chrono::steady_clock;
  uint8_t token = 0;
  CollOptions o;
  o.timeout = timeout;
  if (rank != 0) {
    try {
      c.send(&token, 1, DataType::UInt8, 0, kMonitoredBarrierTag, o);
      c.recv(&token, 1, DataType::UInt8, 0, kMonitoredBarrierTag, o);
    } catch (const Error& e) {
      TORCH_CHECK(false, "strata backend: rank ", rank, " was not released from monitoredBarrier by rank 0 within ",
                  timeout.count(), " ms: ", e.what());
    }
    return;
  }
  const auto end = Clock::now() + timeout;
  std::vector<int> failed;
  for (int r = 1; r < size; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    o.timeout = std::max(left, std::chrono::milliseconds(1));
    try {
      c.recv(&token, 1, DataType::UInt8, r, kMonitoredBarrierTag, o);
    } catch (const Error& e) {
      if (e.code() != Code::Timeout && e.code() != Code::PeerFailed) throw;
      failed.push_back(r);
      if (!wait_all) break;
    }
  }
  // gloo's wording: "Ranks" whenever every missing rank is named.
  TORCH_CHECK(failed.empty(), "[Rank 0]: ", wait_all ? "Ranks " : "Rank ", rank_list(failed),
              " failed to pass monitoredBarrier in ", timeout.count(), " ms");
  o.timeout = timeout;
  std::vector<strata::Work> releases;
  for (int r = 1; r < size; ++r)
    releases.push_back(c.send_async(&token, 1, DataType::UInt8, r, kMonitoredBarrierTag, o));
  for (auto& w : releases) w.wait();
}

/// Sum of every rank's sparse COO tensor, coalesced, as gloo computes it: every rank gathers
/// every rank's indices and values (all_gather_v) and coalesces their union.
at::Tensor sparse_all_reduce_sum(Communicator& c, const at::Tensor& input, const CollOptions& o) {
  const int n = c.size();
  at::Tensor in = input.coalesce();
  const int64_t sparse_dim = in.sparse_dim(), dense_dim = in.dense_dim();
  // Shape agreement first: [sparse_dim, dense_dim, nnz, sizes...] from every rank.
  std::vector<int64_t> meta = {sparse_dim, dense_dim, in._nnz()};
  for (auto d : in.sizes()) meta.push_back(d);
  const size_t m = meta.size();
  std::vector<int64_t> all(m * static_cast<size_t>(n));
  c.all_gather(meta.data(), all.data(), m, DataType::Int64, o);
  std::vector<int64_t> nnz(n);
  for (int r = 0; r < n; ++r) {
    const int64_t* row = all.data() + static_cast<size_t>(r) * m;
    for (size_t k = 0; k < m; ++k)
      if (k != 2 && row[k] != meta[k])
        TORCH_CHECK(false,
                    "strata backend: sparse allreduce needs the same sizes, sparse and dense dims on every rank; "
                    "rank ",
                    r, " differs from rank ", c.rank());
    nnz[r] = row[2];
  }
  const int64_t total = std::accumulate(nnz.begin(), nnz.end(), int64_t{0});
  // Indices are [sparse_dim, nnz]: gathered as [nnz, sparse_dim] rows, one block per rank.
  at::Tensor idx = in._indices().t().contiguous();
  at::Tensor all_idx = at::empty({total, sparse_dim}, idx.options());
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = static_cast<size_t>(nnz[r] * sparse_dim);
  c.all_gather_v(idx.data_ptr(), all_idx.data_ptr(), counts.data(), DataType::Int64, o);
  at::Tensor vals = in._values().contiguous();
  std::vector<int64_t> vshape = vals.sizes().vec();
  vshape[0] = total;
  at::Tensor all_vals = at::empty(vshape, vals.options());
  int64_t row_elems = 1;
  for (size_t k = 1; k < vshape.size(); ++k) row_elems *= vshape[k];
  for (int r = 0; r < n; ++r) counts[r] = static_cast<size_t>(nnz[r] * row_elems) * vals.element_size();
  c.all_gather_v(vals.data_ptr(), all_vals.data_ptr(), counts.data(), DataType::UInt8, o);
  return at::sparse_coo_tensor(all_idx.t(), all_vals, in.sizes(), in.options()).coalesce();
}

// ---- the process group ---------------------------------------------------------------------

class ProcessGroupStrata : public c10d::ProcessGroup {
 public:
  ProcessGroupStrata(Communicator comm, int rank, int size, std::chrono::microseconds grace)
      : ProcessGroup(rank, size), comm_(std::move(comm)), exec_(std::make_shared<Executor>(grace)) {
    TORCH_CHECK(comm_.rank() == rank && comm_.size() == size, "strata backend: communicator is rank ", comm_.rank(),
                " of ", comm_.size(), " but torch asked for rank ", rank, " of ", size);
  }
  ~ProcessGroupStrata() override {
    // Runs what is still queued, then joins. Without the GIL: the executor may drop the last
    // reference to a tensor whose Python object needs it (destroy_process_group() with
    // un-waited works deadlocked here).
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release nogil;
      exec_.reset();
    } else {
      exec_.reset();
    }
  }

  const std::string getBackendName() const override { return "strata"; }
  const Communicator& communicator() const { return comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    Refusal refusal(*this);
    at::Tensor t = single(tensors, "broadcast");
    int root = static_cast<int>(opts.rootRank);
    auto o = coll_options(opts.timeout);
    return submit(
        c10d::OpType::BROADCAST, "strata:broadcast", {t},
        [c = comm_, t, root, o]() mutable {
          const Elems e = elems(t);
          c.broadcast(t.data_ptr(), t.data_ptr(), e.count, e.dt, root, o);
        },
        [] {});
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    Refusal refusal(*this);
    if (tensors.size() == 1 && tensors[0].layout() == at::kSparse) {
      refusal.ops = 3;  // sparse_all_reduce_sum: the sizes, then the indices and the values
      return sparse_allreduce(tensors[0], opts);
    }
    at::Tensor t = single(tensors, "allreduce");
    DataType dt = reduce_type(t, "allreduce");
    ReduceOp op = reduce_op(opts.reduceOp, "allreduce");
    auto o = coll_options(opts.timeout);
    return submit(
        c10d::OpType::ALLREDUCE, "strata:all_reduce", {t},
        [c = comm_, t, dt, op, o]() mutable {
          c.all_reduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), dt, op, o);
        },
        [] {});
  }

  /// Sparse COO all_reduce: SUM only, like gloo; the result replaces the tensor's contents.
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& t, const c10d::AllreduceOptions& opts) {
    TORCH_CHECK(t.device().is_cpu(), "strata backend: allreduce needs CPU tensors, got one on ", t.device());
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
                "strata backend: sparse allreduce supports ReduceOp SUM only (as gloo)");
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::ALLREDUCE, "strata:sparse_all_reduce", {t}, [c = comm_, t, o]() mutable {
      at::Tensor sum = sparse_all_reduce_sum(c, t, o);
      t.copy_(sum);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    Refusal refusal(*this);
    TORCH_CHECK(!tensors.empty(), "strata backend: allreduce_coalesced needs at least one tensor");
    for (const auto& t : tensors) {
      check_tensor(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                  "strata backend: allreduce_coalesced needs tensors of one dtype");
    }
    DataType dt = reduce_type(tensors[0], "allreduce_coalesced");
    ReduceOp op = reduce_op(opts.reduceOp, "allreduce_coalesced");
    auto o = coll_options(opts.timeout);
    return submit(
        c10d::OpType::ALLREDUCE_COALESCED, "strata:all_reduce_coalesced", tensors,
        [c = comm_, ts = tensors, dt, op, o]() mutable {
          at::Tensor flat = flat_cat(ts);
          c.all_reduce(flat.data_ptr(), flat.data_ptr(), static_cast<size_t>(flat.numel()), dt, op, o);
          copy_out(flat, ts);
        },
        [] {});
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    Refusal refusal(*this);
    at::Tensor t = single(tensors, "reduce");
    DataType dt = reduce_type(t, "reduce");
    ReduceOp op = reduce_op(opts.reduceOp, "reduce");
    int root = static_cast<int>(opts.rootRank);
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::REDUCE, "strata:reduce", {t}, [c = comm_, t, dt, op, root, o]() mutable {
      c.reduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), dt, op, root, o);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    Refusal refusal(*this);
    at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "strata backend: allgather needs one output list of ", size_, " tensors");
    for (const auto& t : outputs[0]) {
      // Any strided output (gloo takes them too): those that do not form one block of the
      // input's layout are written through a temporary.
      TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided,
                  "strata backend: allgather needs dense CPU output tensors");
      TORCH_CHECK(t.numel() == in.numel() && t.scalar_type() == in.scalar_type(),
                  "strata backend: allgather outputs must match the input's size and dtype");
    }
    auto o = coll_options(opts.timeout);
    std::vector<at::Tensor> outs = outputs[0];
    return submit(
        c10d::OpType::ALLGATHER, "strata:all_gather", outs,
        [c = comm_, in, outs, me = rank_, o]() mutable {
          at::Tensor block = as_one_block(outs);
          // An input inside the block but not at this rank's place there (a view of another
          // rank's output) would be overwritten while peers read it: through a temporary.
          if (block.defined()) {
            const char* b = static_cast<const char*>(block.data_ptr());
            const char* p = static_cast<const char*>(in.data_ptr());
            const size_t total = nbytes(block), mine = static_cast<size_t>(me) * nbytes(in);
            if (p + nbytes(in) > b && p < b + total && p != b + mine) block = at::Tensor();
          }
          const bool direct = block.defined();
          if (!direct) block = at::empty({in.numel() * static_cast<int64_t>(outs.size())}, in.options());
          const Elems e = elems(in);
          c.all_gather(in.data_ptr(), block.data_ptr(), e.count, e.dt, o);
          if (!direct) copy_out(block, outs);
        },
        [in, outs]() mutable {
          for (auto& t : outs) t.copy_(in);
        });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    Refusal refusal(*this);
    check_tensor(input, "_allgather_base");
    check_tensor(output, "_allgather_base");
    TORCH_CHECK(output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
                "strata backend: _allgather_base output must hold world_size x input elements of its dtype");
    auto o = coll_options(opts.timeout);
    return submit(
        c10d::OpType::_ALLGATHER_BASE, "strata:all_gather_base", {output},
        [c = comm_, in = input, out = output, o]() mutable {
          const Elems e = elems(in);
          c.all_gather(in.data_ptr(), out.data_ptr(), e.count, e.dt, o);
        },
        [in = input, out = output]() mutable {
          for (int64_t r = 0; r < out.numel() / std::max<int64_t>(in.numel(), 1); ++r)
            out.view({-1}).narrow(0, r * in.numel(), in.numel()).copy_(in.view({-1}));
        });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    Refusal refusal(*this);
    refusal.ops = inputs.size();
    // One all_gather per input: simple, and the same order on every rank.
    TORCH_CHECK(outputs.size() == static_cast<size_t>(size_), "strata backend: allgather_coalesced needs ", size_,
                " output lists");
    auto o = coll_options(opts.timeout);
    std::vector<at::Tensor> flat_outs;
    for (auto& l : outputs) {
      TORCH_CHECK(l.size() == inputs.size(), "strata backend: allgather_coalesced output lists must match the inputs");
      for (auto& t : l) {
        check_tensor(t, "allgather_coalesced");
        flat_outs.push_back(t);
      }
    }
    for (const auto& t : inputs) check_tensor(t, "allgather_coalesced");
    return submit(
        c10d::OpType::ALLGATHER_COALESCED, "strata:all_gather_coalesced", flat_outs,
        [c = comm_, ins = inputs, outs = outputs, o]() mutable {
          for (size_t i = 0; i < ins.size(); ++i) {
            at::Tensor block = at::empty({ins[i].numel() * static_cast<int64_t>(outs.size())}, ins[i].options());
            const Elems e = elems(ins[i]);
            c.all_gather(ins[i].data_ptr(), block.data_ptr(), e.count, e.dt, o);
            for (size_t r = 0; r < outs.size(); ++r)
              outs[r][i].view({-1}).copy_(block.narrow(0, static_cast<int64_t>(r) * ins[i].numel(), ins[i].numel()));
          }
        });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    Refusal refusal(*this);
    at::Tensor in = single(inputs, "gather");
    int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                  "strata backend: gather needs one output list of ", size_, " tensors at the root");
      outs = outputs[0];
      for (const auto& t : outs) {
        check_tensor(t, "gather");
        TORCH_CHECK(t.numel() == in.numel() && t.scalar_type() == in.scalar_type(),
                    "strata backend: gather outputs must match the input's size and dtype");
      }
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                  "strata backend: gather takes output tensors only at the root");
    }
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::GATHER, "strata:gather", outs, [c = comm_, in, outs, root, o]() mutable {
      at::Tensor block;
      if (!outs.empty()) block = at::empty({in.numel() * static_cast<int64_t>(outs.size())}, in.options());
      const Elems e = elems(in);
      c.gather(in.data_ptr(), block.defined() ? block.data_ptr() : nullptr, e.count, e.dt, root, o);
      if (block.defined()) copy_out(block, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    Refusal refusal(*this);
    at::Tensor out = single(outputs, "scatter");
    int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> ins;
    if (rank_ == root) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                  "strata backend: scatter needs one input list of ", size_, " tensors at the root");
      ins = inputs[0];
      for (const auto& t : ins) {
        check_tensor(t, "scatter");
        TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                    "strata backend: scatter inputs must match the output's size and dtype");
      }
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                  "strata backend: scatter takes input tensors only at the root");
    }
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::SCATTER, "strata:scatter", {out}, [c = comm_, out, ins, root, o]() mutable {
      at::Tensor block;
      if (!ins.empty()) block = flat_cat(ins);
      const Elems e = elems(out);
      c.scatter(block.defined() ? block.data_ptr() : nullptr, out.data_ptr(), e.count, e.dt, root, o);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    Refusal refusal(*this);
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "strata backend: reduce_scatter needs one input list of ", size_, " tensors");
    for (const auto& t : inputs[0]) {
      check_tensor(t, "reduce_scatter");
      TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                  "strata backend: reduce_scatter inputs must match the output's size and dtype");
    }
    DataType dt = reduce_type(out, "reduce_scatter");
    ReduceOp op = reduce_op(opts.reduceOp, "reduce_scatter");
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::REDUCE_SCATTER, "strata:reduce_scatter", {out},
                  [c = comm_, out, ins = inputs[0], dt, op, o]() mutable {
                    at::Tensor block = as_one_block(ins);
                    if (!block.defined()) block = flat_cat(ins);
                    c.reduce_scatter(block.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), dt, op, o);
                  });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    Refusal refusal(*this);
    check_tensor(input, "_reduce_scatter_base");
    check_tensor(output, "_reduce_scatter_base");
    TORCH_CHECK(input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
                "strata backend: _reduce_scatter_base input must hold world_size x output elements of its dtype");
    DataType dt = reduce_type(output, "_reduce_scatter_base");
    ReduceOp op = reduce_op(opts.reduceOp, "_reduce_scatter_base");
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::_REDUCE_SCATTER_BASE, "strata:reduce_scatter_base", {output},
                  [c = comm_, in = input, out = output, dt, op, o]() mutable {
                    c.reduce_scatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), dt, op, o);
                  });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    Refusal refusal(*this);
    check_tensor(input, "alltoall_base");
    check_tensor(output, "alltoall_base");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "strata backend: alltoall_base needs one dtype");
    auto o = coll_options(opts.timeout);
    const auto n = static_cast<size_t>(size_);
    if (output_splits.empty() && input_splits.empty()) {
      TORCH_CHECK(input.numel() == output.numel() && static_cast<size_t>(input.numel()) % n == 0,
                  "strata backend: all_to_all_single without split sizes needs equal input and output sizes, a "
                  "multiple of the world size");
      return submit(c10d::OpType::ALLTOALL_BASE, "strata:all_to_all", {output},
                    [c = comm_, in = input, out = output, n, o]() mutable {
                      const Elems e = elems(in);
                      c.all_to_all(in.data_ptr(), out.data_ptr(), e.count / n, e.dt, o);
                    });
    }
    // Split sizes count rows of dim 0; Strata counts units of the tensor's Elems.
    const Elems e = elems(input);
    auto byte_counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      std::vector<size_t> counts(n);
      const int64_t rows = t.dim() ? t.size(0) : 1;
      const size_t row_bytes = rows ? elems(t).count / static_cast<size_t>(rows) : 0;
      if (splits.empty()) {
        TORCH_CHECK(rows % size_ == 0, "strata backend: all_to_all_single ", which, " has ", rows,
                    " rows, not a multiple of the world size");
        for (auto& c : counts) c = static_cast<size_t>(rows / size_) * row_bytes;
      } else {
        TORCH_CHECK(splits.size() == n, "strata backend: all_to_all_single ", which, " split sizes need ", n,
                    " entries");
        int64_t total = 0;
        for (size_t j = 0; j < n; ++j) {
          TORCH_CHECK(splits[j] >= 0, "strata backend: negative split size");
          counts[j] = static_cast<size_t>(splits[j]) * row_bytes;
          total += splits[j];
        }
        TORCH_CHECK(total == rows, "strata backend: all_to_all_single ", which, " split sizes add up to ", total,
                    " but the tensor has ", rows, " rows");
      }
      return counts;
    };
    auto sc = byte_counts(input, input_splits, "input");
    auto rc = byte_counts(output, output_splits, "output");
    std::vector<size_t> sd(n, 0), rd(n, 0);
    for (size_t j = 1; j < n; ++j) {
      sd[j] = sd[j - 1] + sc[j - 1];
      rd[j] = rd[j - 1] + rc[j - 1];
    }
    return submit(c10d::OpType::ALLTOALL_BASE, "strata:all_to_all_v", {output},
                  [c = comm_, in = input, out = output, sc, sd, rc, rd, dt = e.dt, o]() mutable {
                    c.all_to_all_v(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(), dt, o);
                  });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    Refusal refusal(*this);
    const auto n = static_cast<size_t>(size_);
    TORCH_CHECK(outputs.size() == n && inputs.size() == n, "strata backend: all_to_all needs ", n,
                " input and output tensors");
    for (size_t j = 0; j < n; ++j) {
      check_tensor(inputs[j], "all_to_all");
      check_tensor(outputs[j], "all_to_all");
      TORCH_CHECK(
          inputs[j].scalar_type() == inputs[0].scalar_type() && outputs[j].scalar_type() == inputs[0].scalar_type(),
          "strata backend: all_to_all needs one dtype");
    }
    std::vector<size_t> sc(n), rc(n), sd(n, 0), rd(n, 0);
    const DataType dt = elems(inputs[0]).dt;
    for (size_t j = 0; j < n; ++j) {
      sc[j] = elems(inputs[j]).count;
      rc[j] = elems(outputs[j]).count;
      if (j) {
        sd[j] = sd[j - 1] + sc[j - 1];
        rd[j] = rd[j - 1] + rc[j - 1];
      }
    }
    auto o = coll_options(opts.timeout);
    return submit(c10d::OpType::ALLTOALL, "strata:all_to_all", outputs,
                  [c = comm_, ins = inputs, outs = outputs, sc, sd, rc, rd, dt, o]() mutable {
                    at::Tensor in = flat_cat(ins);
                    int64_t total = 0;
                    for (const auto& t : outs) total += t.numel();
                    at::Tensor out = at::empty({total}, outs[0].options());
                    c.all_to_all_v(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(), dt, o);
                    copy_out(out, outs);
                  });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    at::Tensor t = single(tensors, "send");
    // Posted now (see the file comment); the tensor stays referenced by the work.
    const Elems e = elems(t);
    strata::Work h = comm_.send_async(t.data_ptr(), e.count, e.dt, dst, tag);
    return c10::make_intrusive<SendWork>(rank_, std::move(h), t);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    at::Tensor t = single(tensors, "recv");
    auto source = std::make_shared<std::atomic<int>>(-1);
    auto w = make_work(c10d::OpType::RECV, "strata:recv", {t}, [c = comm_, t, src, tag, source]() mutable {
      const Elems e = elems(t);
      c.recv(t.data_ptr(), e.count, e.dt, src, tag);
      source->store(src);
    });
    w->track_source(source);
    exec_->enqueue(w);
    return w;
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    at::Tensor t = single(tensors, "recv");
    auto source = std::make_shared<std::atomic<int>>(-1);
    auto w = make_work(c10d::OpType::RECVANYSOURCE, "strata:recv_any", {t}, [c = comm_, t, tag, source]() mutable {
      const Elems e = elems(t);
      source->store(c.recv_any(t.data_ptr(), e.count, e.dt, tag));
    });
    w->track_source(source);
    exec_->enqueue(w);
    return w;
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    // gloo's protocol: every other rank reports to rank 0 and waits for its release; rank 0
    // names the ranks that did not report within the timeout (the first, or all of them with
    // waitAllRanks). In the queue like any operation, so that it keeps its place in order.
    const auto timeout = opts.timeout.count() > 0 ? opts.timeout : comm_.timeout();
    auto w = make_work(c10d::OpType::BARRIER, "strata:monitored_barrier", {},
                       [c = comm_, timeout, waitAllRanks, rank = rank_, size = size_]() mutable {
                         monitored_barrier(c, rank, size, timeout, waitAllRanks);
                       });
    exec_->enqueue(w);
    w->wait(std::chrono::milliseconds(0));  // 0: no time limit (the body has its own)
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    Refusal refusal(*this);
    auto o = coll_options(opts.timeout);
    return submit(
        c10d::OpType::BARRIER, "strata:barrier", {}, [c = comm_, o]() mutable { c.barrier(o); }, [] {});
  }

 private:
  /// Opens every collective: when the backend's own checks throw before the call reached
  /// submit(), the call is refused in the order of operations (a barrier marked as refused is
  /// queued behind the earlier work, strata::detail::refuse_call), so that the peers' matching
  /// calls fail naming this rank instead of waiting for it until the timeout.
  class Refusal {
   public:
    explicit Refusal(ProcessGroupStrata& pg) : pg_(pg), uncaught_(std::uncaught_exceptions()) {
      pg_.submitted_ = false;
    }
    Refusal(const Refusal&) = delete;
    Refusal& operator=(const Refusal&) = delete;
    ~Refusal() {
      // Local mode: the peers are not there to meet a refusal (the call fails on this rank only).
      if (pg_.submitted_ || std::uncaught_exceptions() == uncaught_ || ops == 0 ||
          pg_.mode_->local.load(std::memory_order_acquire))
        return;
      try {
        auto w = pg_.make_work(c10d::OpType::BARRIER, "strata:refused", {}, [impl = pg_.comm_.impl(), n = ops] {
          for (size_t i = 0; i < n; ++i) strata::detail::refuse_call(impl);
        });
        pg_.exec_->enqueue(w);
      } catch (...) {  // already unwinding: the caller's own error is what matters
      }
    }

    /// The collectives the call would have issued (one refusal each, so that the next call
    /// meets the peers' next one): the sparse all_reduce and the coalesced all_gather issue more.
    size_t ops = 1;

   private:
    ProcessGroupStrata& pg_;
    int uncaught_;
  };
  bool submitted_ = false;  // set by submit(), read by Refusal (one thread issues a group's calls)

  c10::intrusive_ptr<StrataWork> make_work(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                           std::function<void()> body) {
    return c10::make_intrusive<StrataWork>(rank_, type, title, std::move(outputs), std::move(body), exec_);
  }
  /// Queues `body`, tagged with the recovery generation it was issued in (see discard_pending).
  /// In local mode the operation is answered by `local` on this rank alone (see set_local);
  /// operations without a local answer are refused then.
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                        std::function<void()> body, std::function<void()> local = nullptr) {
    submitted_ = true;  // a refusal from here on is not this call's checks (local mode: no peers)
    if (mode_->local.load(std::memory_order_acquire)) {
      TORCH_CHECK(local, "strata backend: ", title,
                  " cannot run while this replacement rank catches up (before recovery_run restores the state): "
                  "the surviving ranks are not there to answer it");
      body = std::move(local);
    }
    const uint64_t gen = mode_->generation.load(std::memory_order_acquire);
    auto guarded = [mode = mode_, gen, title, body = std::move(body)]() {
      try {
        if (mode->generation.load(std::memory_order_acquire) != gen)
          throw Error(Code::PeerFailed, "operation issued before the group's recovery was discarded");
        body();
      } catch (const Error& e) {
        // The marker survives torch's rethrows (autograd, DDP's reducer turn any error into a
        // RuntimeError carrying what()): strata.recovery_run recognises a recoverable failure by it.
        if (e.code() != Code::PeerFailed && e.code() != Code::Aborted && e.code() != Code::Timeout) throw;
        const char* name = e.code() == Code::PeerFailed ? "PeerFailed"
                           : e.code() == Code::Aborted  ? "Aborted"
                                                        : "Timeout";
        throw Error(e.code(), std::string("[strata ") + name + "] " + title + ": " + e.what(), e.rank(), e.peer());
      }
    };
    auto w = make_work(type, title, std::move(outputs), std::move(guarded));
    exec_->enqueue(w);
    return w;
  }

 public:
  /// Before Communicator::recover(): every operation queued so far fails with PeerFailed
  /// instead of running on the rebuilt communicator (their peers discarded theirs too); returns
  /// once none of them is left in the queue.
  void discard_pending() {
    mode_->generation.fetch_add(1, std::memory_order_acq_rel);
    auto w = make_work(c10d::OpType::BARRIER, "strata:discard_pending", {}, [] {});
    exec_->enqueue(w);
    exec_->run_through(w.get());
  }
  /// Local mode: collectives complete on this rank alone (broadcast and all_reduce leave the
  /// tensor as it is, all_gather copies the input to every slot). A replacement is in it until
  /// its state is restored: what its setup (DDP's constructor) would receive comes with the
  /// restore, and the survivors, inside recover(), never issue the matching calls.
  void set_local(bool on) { mode_->local.store(on, std::memory_order_release); }
  bool local() const { return mode_->local.load(std::memory_order_acquire); }

 private:
  struct Mode {
    std::atomic<uint64_t> generation{0};
    std::atomic<bool> local{false};
  };
  std::shared_ptr<Mode> mode_ = std::make_shared<Mode>();
  Communicator comm_;
  std::shared_ptr<Executor> exec_;
};

// ---- heap allocator ----------------------------------------------------------------------

/// torch's CPU allocator over a communicator's heap: every CPU tensor allocated while it is
/// installed lives in registered memory, so collectives on it (DDP's gradient buckets
/// included) move with no copy. Each block keeps the heap alive (Buffer owns a reference).
class HeapAllocator final : public c10::Allocator {
 public:
  explicit HeapAllocator(Communicator comm) : comm_(std::move(comm)) {}
  c10::DataPtr allocate(size_t n) const override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    auto* block = new Buffer<uint8_t>(comm_.alloc<uint8_t>(n));
    return {block->data(), block, &release, c10::Device(c10::DeviceType::CPU)};
  }

 private:
  static void release(void* block) { delete static_cast<Buffer<uint8_t>*>(block); }
  mutable Communicator comm_;
};

}  // namespace strata::torch_backend

// ---- module ----------------------------------------------------------------------------------

PYBIND11_MODULE(_strata_torch, m) {
  namespace py = pybind11;
  using strata::torch_backend::HeapAllocator;
  using strata::torch_backend::ProcessGroupStrata;
  m.doc() = "torch.distributed backend 'strata' (C++ part; registered by the strata package)";
  // The base class must be registered with pybind before we derive from it.
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupStrata, c10::intrusive_ptr<ProcessGroupStrata>, c10d::ProcessGroup>(m, "ProcessGroupStrata",
                                                                                             py::dynamic_attr())
      .def(py::init([](py::capsule comm, int rank, int size, int grace_us) {
             if (std::string(comm.name()) != "strata.Communicator")
               throw std::invalid_argument("ProcessGroupStrata needs Communicator._capsule()");
             return c10::make_intrusive<ProcessGroupStrata>(*comm.get_pointer<strata::Communicator>(), rank, size,
                                                            std::chrono::microseconds(grace_us));
           }),
           py::arg("comm"), py::arg("rank"), py::arg("size"), py::arg("grace_us") = 100)
      .def("_strata_discard_pending", &ProcessGroupStrata::discard_pending, py::call_guard<py::gil_scoped_release>(),
           "Fails every queued operation (recovery is about to rebuild the communicator).")
      .def_property("_strata_local", &ProcessGroupStrata::local, &ProcessGroupStrata::set_local,
                    "Local mode: collectives complete on this rank alone (a replacement catching up).");

  // Allocators installed here are never destroyed: tensors may outlive the switch back, and
  // torch keeps a raw pointer while one is installed.
  static c10::Allocator* original = nullptr;
  m.def(
      "use_heap_allocator",
      [](py::object comm) {
        if (!original) original = c10::GetCPUAllocator();
        if (comm.is_none()) {
          c10::SetCPUAllocator(original);
          return;
        }
        auto cap = comm.cast<py::capsule>();
        if (std::string(cap.name()) != "strata.Communicator")
          throw std::invalid_argument("use_heap_allocator needs Communicator._capsule() or None");
        c10::SetCPUAllocator(new HeapAllocator(*cap.get_pointer<strata::Communicator>()));
      },
      py::arg("comm"),
      "Makes torch allocate CPU tensors in the communicator's heap (None: back to torch's allocator).");
  m.def("heap_allocator_active", [] { return dynamic_cast<HeapAllocator*>(c10::GetCPUAllocator()) != nullptr; });
}

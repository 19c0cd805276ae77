#pragma once
// Strata public API: communicators, buffers registered on allocation, collectives.
// Everything a user includes; internals stay in src/.

#include <strata/types.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata {

namespace detail {
struct CommImpl;
struct ContextImpl;
struct WorkState;
/// Frees heap memory owned by `ctx` (Buffer's destructor).
void heap_free(const std::shared_ptr<ContextImpl>& ctx, void* p, bool symmetric) noexcept;
[[noreturn]] void throw_invalid(const std::string& message);
/// InvalidArgument from rank `rank` of `comm` (for a check in a header, before the library
/// sees the call): the message and Error::rank() name the rank.
/// Refuses the call too: see refuse_call.
[[noreturn]] void throw_invalid_on(const std::shared_ptr<CommImpl>& comm, const std::string& message);
/// Takes the place of a collective this rank refuses (its arguments are invalid) in the order of
/// operations, so that the peers' matching calls fail naming this rank instead of waiting for it.
void refuse_call(const std::shared_ptr<CommImpl>& comm);
/// `message` with the rank that raised it: "all_gather: out has ..." becomes
/// "all_gather on rank 1: out has ..."; a message that does not start with a call's name gets
/// " (on rank 1)" at its end.
std::string on_rank(const std::string& message, int rank);

/// A contiguous range of elements: Buffer<T>, std::vector<T>, std::span<T>, std::array.
template <class R>
concept Contiguous = requires(R& r) {
  {r.data()};
  { r.size() } -> std::convertible_to<size_t>;
}
&&std::is_pointer_v<decltype(std::declval<R&>().data())>;
template <class R>
using elem_t = std::remove_pointer_t<decltype(std::declval<R&>().data())>;
}  // namespace detail

/// Algorithm choice for a collective; Auto picks by size and rank count.
enum class Algorithm : uint8_t { Auto, OneShot, TwoShot };

/// Per-call options.
struct CollOptions {
  std::chrono::milliseconds timeout{0};  ///< 0: the communicator's timeout (STRATA_TIMEOUT)
  Algorithm algorithm = Algorithm::Auto;
};

/// Overrides for init(); unset fields come from the environment (STRATA_*, torchrun,
/// Open MPI or Slurm variables).
struct InitOptions {
  std::optional<int> rank;
  std::optional<int> size;
  std::string store;                     ///< "host:port" of the rendezvous store
  std::string token;                     ///< job token the store requires
  std::string job_id;                    ///< unique per job
  std::string host_id;                   ///< ranks with equal host ids share memory
  std::chrono::milliseconds timeout{0};  ///< default deadline of every wait; 0 = STRATA_TIMEOUT
};

/// Counters of one communicator, for tests and tuning.
struct Stats {
  uint64_t ops = 0;           ///< operations completed
  uint64_t staged_bytes = 0;  ///< bytes copied through internal staging buffers (0 on heap buffers)
  uint64_t direct_bytes = 0;  ///< bytes moved directly between ranks' own buffers
  uint64_t cma_bytes = 0;     ///< bytes moved with single-copy CMA from/to registered external buffers
  uint64_t temp_bytes = 0;    ///< bytes an in-place one-shot all_reduce or all_to_all formed in a temporary
};

/// Handle of an asynchronous operation. Copyable; all copies see the same operation.
class Work {
 public:
  Work() = default;
  /// Blocks until the operation completes; throws strata::Error if it failed.
  void wait();
  /// Waits at most `d`; true when complete (throws if it failed), false if still running.
  bool wait_for(std::chrono::milliseconds d);
  /// Non-blocking: true when complete (throws if it failed).
  bool test();
  /// Code of a completed operation; Ok while still running.
  Code status() const;
  /// True once the operation has finished, successfully or not.
  bool completed() const;

  explicit Work(std::shared_ptr<detail::WorkState> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<detail::WorkState> state_;
};

/// Memory from a communicator's registered heap: every local peer can read and write it, so
/// collectives on it move data directly between the ranks' own buffers. Move-only; frees
/// itself. Contents are zero on first use of each page, unspecified after reuse.
template <class T>
class Buffer {
 public:
  using value_type = T;
  Buffer() = default;
  Buffer(std::shared_ptr<detail::ContextImpl> ctx, T* p, size_t n, bool symmetric)
      : ctx_(std::move(ctx)), ptr_(p), size_(n), symmetric_(symmetric) {}
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (ptr_) detail::heap_free(ctx_, ptr_, symmetric_);
  }

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return size_; }
  T* begin() { return ptr_; }
  T* end() { return ptr_ + size_; }
  const T* begin() const { return ptr_; }
  const T* end() const { return ptr_ + size_; }
  T& operator[](size_t i) { return ptr_[i]; }
  const T& operator[](size_t i) const { return ptr_[i]; }
  std::span<T> span() { return {ptr_, size_}; }
  /// Sub-range [offset, offset + count); throws InvalidArgument when out of bounds.
  std::span<T> view(size_t offset, size_t count) {
    if (offset > size_ || count > size_ - offset)
      detail::throw_invalid("Buffer::view(" + std::to_string(offset) + ", " + std::to_string(count) +
                            ") is outside a buffer of " + std::to_string(size_) + " elements");
    return {ptr_ + offset, count};
  }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    std::swap(symmetric_, o.symmetric_);
  }
  std::shared_ptr<detail::ContextImpl> ctx_;
  T* ptr_ = nullptr;
  size_t size_ = 0;
  bool symmetric_ = false;
};

/// External memory registered with a communicator (see Communicator::register_buffer).
/// Move-only; unregisters itself.
class Registration {
 public:
  Registration() = default;
  Registration(std::shared_ptr<detail::CommImpl> comm, void* p, size_t bytes)
      : comm_(std::move(comm)), ptr_(p), bytes_(bytes) {}
  Registration(Registration&& o) noexcept
      : comm_(std::move(o.comm_)), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  Registration& operator=(Registration&& o) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration();
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  std::shared_ptr<detail::CommImpl> comm_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A group of ranks that run collectives together. Cheap to copy (shared handle).
/// Operations on one communicator must be issued in the same order on every rank.
class Communicator {
 public:
  Communicator() = default;
  explicit Communicator(std::shared_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}

  bool valid() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  /// Rank among the members on this host, and their number.
  int local_rank() const;
  int local_size() const;
  /// Global (world) rank of member `r` of this communicator.
  int global_rank(int r) const;
  /// Default deadline of every wait.
  std::chrono::milliseconds timeout() const;
  Stats stats() const;

  // ---- memory ------------------------------------------------------------------------------
  /// Local, cheap, registered on allocation (no collective).
  template <class T>
  Buffer<T> alloc(size_t count) {
    const size_t bytes = bytes_of(count, sizeof(T), "alloc");
    return Buffer<T>(context(), static_cast<T*>(alloc_bytes(bytes, alignof(T) < 64 ? 64 : alignof(T))), count, false);
  }
  /// Collective: the same offset in every rank's symmetric arena.
  template <class T>
  Buffer<T> alloc_symmetric(size_t count) {
    const size_t bytes = bytes_of(count, sizeof(T), "alloc_symmetric");
    return Buffer<T>(context(), static_cast<T*>(alloc_symmetric_bytes(bytes)), count, true);
  }
  /// count * elem_size; throws InvalidArgument naming `what` when the product overflows.
  size_t bytes_of(size_t count, size_t elem_size, const char* what) const;
  /// Untyped allocation for bindings; free with free_bytes.
  void* alloc_bytes(size_t bytes, size_t alignment = 64);
  void* alloc_symmetric_bytes(size_t bytes);
  /// free_bytes: blocks until this rank's part is done (see the comment above the group).
  void free_bytes(void* p);
  /// Registers external memory so peers can read it with a single copy (CMA) where the
  /// kernel allows it; unregistered external buffers are staged through internal buffers.
  Registration register_buffer(void* ptr, size_t bytes);
  /// True when [p, p + bytes) lies in this rank's registered heap.
  bool is_heap(const void* p, size_t bytes) const;

  // ---- collectives, untyped (pointer, count, DataType) -----------------------------------
  // count is elements. `in == out` means in place. Blocking calls return when this rank's
  // part is done and its buffers may be reused; _async twins return a Work.
  /// all_reduce: blocks until this rank's part is done (see the comment above the group).
  void all_reduce(const void* in, void* out, size_t count, DataType dt, ReduceOp op, const CollOptions& o = {});
  /// Nonblocking twin of all_reduce(): returns a Work at once; the copy engine runs the operation.
  Work all_reduce_async(const void* in, void* out, size_t count, DataType dt, ReduceOp op, const CollOptions& o = {});
  /// Result only at `root` (out may be null elsewhere).
  void reduce(const void* in, void* out, size_t count, DataType dt, ReduceOp op, int root, const CollOptions& o = {});
  /// Nonblocking twin of reduce(): returns a Work at once; the copy engine runs the operation.
  Work reduce_async(const void* in, void* out, size_t count, DataType dt, ReduceOp op, int root,
                    const CollOptions& o = {});
  /// Root's `in` is copied to every rank's `out` (in is ignored elsewhere; in == out is usual).
  void broadcast(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o = {});
  /// Nonblocking twin of broadcast(): returns a Work at once; the copy engine runs the operation.
  Work broadcast_async(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o = {});
  /// out = concatenation of every rank's `count` elements (out holds size() * count).
  void all_gather(const void* in, void* out, size_t count, DataType dt, const CollOptions& o = {});
  /// Nonblocking twin of all_gather(): returns a Work at once; the copy engine runs the operation.
  Work all_gather_async(const void* in, void* out, size_t count, DataType dt, const CollOptions& o = {});
  /// Rank r contributes counts[r] elements; out is their concatenation.
  void all_gather_v(const void* in, void* out, const size_t* counts, DataType dt, const CollOptions& o = {});
  /// Nonblocking twin of all_gather_v(): returns a Work at once; the copy engine runs the operation.
  Work all_gather_v_async(const void* in, void* out, const size_t* counts, DataType dt, const CollOptions& o = {});
  /// in holds size() * count elements; rank r gets the reduction of block r.
  void reduce_scatter(const void* in, void* out, size_t count, DataType dt, ReduceOp op, const CollOptions& o = {});
  /// Nonblocking twin of reduce_scatter(): returns a Work at once; the copy engine runs the operation.
  Work reduce_scatter_async(const void* in, void* out, size_t count, DataType dt, ReduceOp op,
                            const CollOptions& o = {});
  /// Block r has counts[r] elements (blocks contiguous in `in`).
  void reduce_scatter_v(const void* in, void* out, const size_t* counts, DataType dt, ReduceOp op,
                        const CollOptions& o = {});
  /// Nonblocking twin of reduce_scatter_v(): returns a Work at once; the copy engine runs the operation.
  Work reduce_scatter_v_async(const void* in, void* out, const size_t* counts, DataType dt, ReduceOp op,
                              const CollOptions& o = {});
  /// Block j of `in` (count elements) goes to rank j, landing in block `rank()` of its out.
  void all_to_all(const void* in, void* out, size_t count, DataType dt, const CollOptions& o = {});
  /// Nonblocking twin of all_to_all(): returns a Work at once; the copy engine runs the operation.
  Work all_to_all_async(const void* in, void* out, size_t count, DataType dt, const CollOptions& o = {});
  /// Send send_counts[j] elements at send_displs[j] to rank j; receive recv_counts[j] at
  /// recv_displs[j] from rank j. recv_counts[j] must equal rank j's send_counts[rank()].
  void all_to_all_v(const void* in, const size_t* send_counts, const size_t* send_displs, void* out,
                    const size_t* recv_counts, const size_t* recv_displs, DataType dt, const CollOptions& o = {});
  /// Nonblocking twin of all_to_all_v(): returns a Work at once; the copy engine runs the operation.
  Work all_to_all_v_async(const void* in, const size_t* send_counts, const size_t* send_displs, void* out,
                          const size_t* recv_counts, const size_t* recv_displs, DataType dt, const CollOptions& o = {});
  /// Root's out (size() * count) receives every rank's block.
  void gather(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o = {});
  /// Nonblocking twin of gather(): returns a Work at once; the copy engine runs the operation.
  Work gather_async(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o = {});
  /// Rank r receives block r of root's in (size() * count).
  void scatter(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o = {});
  /// Nonblocking twin of scatter(): returns a Work at once; the copy engine runs the operation.
  Work scatter_async(const void* in, void* out, size_t count, DataType dt, int root, const CollOptions& o = {});
  /// barrier: blocks until this rank's part is done (see the comment above the group).
  void barrier(const CollOptions& o = {});
  /// Nonblocking twin of barrier(): returns a Work at once; the copy engine runs the operation.
  Work barrier_async(const CollOptions& o = {});
  /// Point to point. Messages between a pair of ranks match in order; tag, type and count
  /// must agree. send completes when the receiver has copied the data (rendezvous): a
  /// blocking send to a rank that first does a blocking send to us deadlocks (until the
  /// timeout), as with MPI_Ssend; use send_async.
  void send(const void* buf, size_t count, DataType dt, int peer, int tag = 0, const CollOptions& o = {});
  /// Nonblocking twin of send(): posts now; the Work completes when the receiver has the data.
  Work send_async(const void* buf, size_t count, DataType dt, int peer, int tag = 0, const CollOptions& o = {});
  /// recv: blocks until this rank's part is done (see the comment above the group).
  void recv(void* buf, size_t count, DataType dt, int peer, int tag = 0, const CollOptions& o = {});
  /// Nonblocking twin of recv(): returns a Work at once; the copy engine runs the operation.
  Work recv_async(void* buf, size_t count, DataType dt, int peer, int tag = 0, const CollOptions& o = {});
  /// Receives the oldest message carrying `tag` that any rank sent to this one and returns
  /// the sender's rank. Only each sender's oldest unreceived message is a candidate, so one
  /// sender's messages still arrive in the order it sent them; type and count must agree with
  /// the message taken. Within one host and across hosts alike.
  int recv_any(void* buf, size_t count, DataType dt, int tag = 0, const CollOptions& o = {});

  // ---- collectives, typed (any contiguous range: Buffer<T>, std::vector<T>, std::span<T>) ----
  /// Typed all_reduce over any contiguous range; element type gives the DataType.
  template <detail::Contiguous R>
  void all_reduce(R&& inout, ReduceOp op, const CollOptions& o = {}) {
    all_reduce(inout.data(), inout.data(), inout.size(), dtype_of_v<detail::elem_t<R>>, op, o);
  }
  /// Nonblocking twin of all_reduce(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous R>
  Work all_reduce_async(R&& inout, ReduceOp op, const CollOptions& o = {}) {
    return all_reduce_async(inout.data(), inout.data(), inout.size(), dtype_of_v<detail::elem_t<R>>, op, o);
  }
  /// Typed all_reduce over any contiguous range; element type gives the DataType.
  template <detail::Contiguous I, detail::Contiguous O>
  void all_reduce(I&& in, O&& out, ReduceOp op, const CollOptions& o = {}) {
    check_same<I, O>();
    need(out.size() >= in.size(), "all_reduce: out", out.size(), in.size());
    all_reduce(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<O>>, op, o);
  }
  /// Nonblocking twin of all_reduce(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work all_reduce_async(I&& in, O&& out, ReduceOp op, const CollOptions& o = {}) {
    check_same<I, O>();
    need(out.size() >= in.size(), "all_reduce: out", out.size(), in.size());
    return all_reduce_async(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<O>>, op, o);
  }
  /// Typed broadcast over any contiguous range; element type gives the DataType.
  template <detail::Contiguous R>
  void broadcast(R&& buf, int root, const CollOptions& o = {}) {
    broadcast(buf.data(), buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, root, o);
  }
  /// Nonblocking twin of broadcast(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous R>
  Work broadcast_async(R&& buf, int root, const CollOptions& o = {}) {
    return broadcast_async(buf.data(), buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, root, o);
  }
  /// Typed reduce over any contiguous range; element type gives the DataType.
  template <detail::Contiguous I, detail::Contiguous O>
  void reduce(I&& in, O&& out, ReduceOp op, int root, const CollOptions& o = {}) {
    check_same<I, O>();
    if (rank() == root) need(out.size() >= in.size(), "reduce: out at root", out.size(), in.size());
    reduce(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<I>>, op, root, o);
  }
  /// Nonblocking twin of reduce(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work reduce_async(I&& in, O&& out, ReduceOp op, int root, const CollOptions& o = {}) {
    check_same<I, O>();
    if (rank() == root) need(out.size() >= in.size(), "reduce: out at root", out.size(), in.size());
    return reduce_async(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<I>>, op, root, o);
  }
  /// Typed all_gather over any contiguous range; element type gives the DataType.
  template <detail::Contiguous I, detail::Contiguous O>
  void all_gather(I&& in, O&& out, const CollOptions& o = {}) {
    check_same<I, O>();
    need(out.size() >= in.size() * size(), "all_gather: out", out.size(), in.size() * size());
    all_gather(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Nonblocking twin of all_gather(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work all_gather_async(I&& in, O&& out, const CollOptions& o = {}) {
    check_same<I, O>();
    need(out.size() >= in.size() * size(), "all_gather: out", out.size(), in.size() * size());
    return all_gather_async(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Typed all_gather_v: rank r contributes counts[r] elements (in holds this rank's), out
  /// their concatenation; counts has one entry per rank.
  template <detail::Contiguous I, detail::Contiguous O>
  void all_gather_v(I&& in, O&& out, std::span<const size_t> counts, const CollOptions& o = {}) {
    check_v(in, out, counts, "all_gather_v", false);
    all_gather_v(in.data(), out.data(), counts.data(), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Nonblocking twin of all_gather_v(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work all_gather_v_async(I&& in, O&& out, std::span<const size_t> counts, const CollOptions& o = {}) {
    check_v(in, out, counts, "all_gather_v", false);
    return all_gather_v_async(in.data(), out.data(), counts.data(), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Typed reduce_scatter over any contiguous range; element type gives the DataType.
  template <detail::Contiguous I, detail::Contiguous O>
  void reduce_scatter(I&& in, O&& out, ReduceOp op, const CollOptions& o = {}) {
    check_same<I, O>();
    need(in.size() >= out.size() * size(), "reduce_scatter: in", in.size(), out.size() * size());
    reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<detail::elem_t<I>>, op, o);
  }
  /// Nonblocking twin of reduce_scatter(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work reduce_scatter_async(I&& in, O&& out, ReduceOp op, const CollOptions& o = {}) {
    check_same<I, O>();
    need(in.size() >= out.size() * size(), "reduce_scatter: in", in.size(), out.size() * size());
    return reduce_scatter_async(in.data(), out.data(), out.size(), dtype_of_v<detail::elem_t<I>>, op, o);
  }
  /// Typed reduce_scatter_v: block r of in has counts[r] elements (in holds them all); this
  /// rank's out gets the reduction of its block; counts has one entry per rank.
  template <detail::Contiguous I, detail::Contiguous O>
  void reduce_scatter_v(I&& in, O&& out, std::span<const size_t> counts, ReduceOp op, const CollOptions& o = {}) {
    check_v(in, out, counts, "reduce_scatter_v", true);
    reduce_scatter_v(in.data(), out.data(), counts.data(), dtype_of_v<detail::elem_t<I>>, op, o);
  }
  /// Nonblocking twin of reduce_scatter_v(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work reduce_scatter_v_async(I&& in, O&& out, std::span<const size_t> counts, ReduceOp op, const CollOptions& o = {}) {
    check_v(in, out, counts, "reduce_scatter_v", true);
    return reduce_scatter_v_async(in.data(), out.data(), counts.data(), dtype_of_v<detail::elem_t<I>>, op, o);
  }
  /// in and out hold size() equal blocks.
  template <detail::Contiguous I, detail::Contiguous O>
  void all_to_all(I&& in, O&& out, const CollOptions& o = {}) {
    all_to_all(in.data(), out.data(), a2a_block(in, out), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Nonblocking twin of all_to_all(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work all_to_all_async(I&& in, O&& out, const CollOptions& o = {}) {
    return all_to_all_async(in.data(), out.data(), a2a_block(in, out), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Typed all_to_all_v: send_counts[j] elements at send_displs[j] of in go to rank j;
  /// recv_counts[j] from rank j land at recv_displs[j] of out; each vector has one entry per rank.
  template <detail::Contiguous I, detail::Contiguous O>
  void all_to_all_v(I&& in, std::span<const size_t> send_counts, std::span<const size_t> send_displs, O&& out,
                    std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                    const CollOptions& o = {}) {
    check_a2av(in, send_counts, send_displs, out, recv_counts, recv_displs);
    all_to_all_v(in.data(), send_counts.data(), send_displs.data(), out.data(), recv_counts.data(), recv_displs.data(),
                 dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Nonblocking twin of all_to_all_v(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work all_to_all_v_async(I&& in, std::span<const size_t> send_counts, std::span<const size_t> send_displs, O&& out,
                          std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                          const CollOptions& o = {}) {
    check_a2av(in, send_counts, send_displs, out, recv_counts, recv_displs);
    return all_to_all_v_async(in.data(), send_counts.data(), send_displs.data(), out.data(), recv_counts.data(),
                              recv_displs.data(), dtype_of_v<detail::elem_t<I>>, o);
  }
  /// Typed gather over any contiguous range; element type gives the DataType.
  template <detail::Contiguous I, detail::Contiguous O>
  void gather(I&& in, O&& out, int root, const CollOptions& o = {}) {
    check_same<I, O>();
    if (rank() == root) need(out.size() >= in.size() * size(), "gather: out at root", out.size(), in.size() * size());
    gather(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<I>>, root, o);
  }
  /// Nonblocking twin of gather(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work gather_async(I&& in, O&& out, int root, const CollOptions& o = {}) {
    check_same<I, O>();
    if (rank() == root) need(out.size() >= in.size() * size(), "gather: out at root", out.size(), in.size() * size());
    return gather_async(in.data(), out.data(), in.size(), dtype_of_v<detail::elem_t<I>>, root, o);
  }
  /// Typed scatter over any contiguous range; element type gives the DataType.
  template <detail::Contiguous I, detail::Contiguous O>
  void scatter(I&& in, O&& out, int root, const CollOptions& o = {}) {
    check_same<I, O>();
    if (rank() == root) need(in.size() >= out.size() * size(), "scatter: in at root", in.size(), out.size() * size());
    scatter(in.data(), out.data(), out.size(), dtype_of_v<detail::elem_t<I>>, root, o);
  }
  /// Nonblocking twin of scatter(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous I, detail::Contiguous O>
  Work scatter_async(I&& in, O&& out, int root, const CollOptions& o = {}) {
    check_same<I, O>();
    if (rank() == root) need(in.size() >= out.size() * size(), "scatter: in at root", in.size(), out.size() * size());
    return scatter_async(in.data(), out.data(), out.size(), dtype_of_v<detail::elem_t<I>>, root, o);
  }
  /// Typed send over any contiguous range; element type gives the DataType.
  template <detail::Contiguous R>
  void send(R&& buf, int peer, int tag = 0, const CollOptions& o = {}) {
    send(buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, peer, tag, o);
  }
  /// Nonblocking twin of send(): posts now; the Work completes when the receiver has the data.
  template <detail::Contiguous R>
  Work send_async(R&& buf, int peer, int tag = 0, const CollOptions& o = {}) {
    return send_async(buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, peer, tag, o);
  }
  /// Typed recv over any contiguous range; element type gives the DataType.
  template <detail::Contiguous R>
  void recv(R&& buf, int peer, int tag = 0, const CollOptions& o = {}) {
    recv(buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, peer, tag, o);
  }
  /// Nonblocking twin of recv(): returns a Work at once; the copy engine runs the operation.
  template <detail::Contiguous R>
  Work recv_async(R&& buf, int peer, int tag = 0, const CollOptions& o = {}) {
    return recv_async(buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, peer, tag, o);
  }
  /// Typed recv_any over any contiguous range; returns the sender's rank.
  template <detail::Contiguous R>
  int recv_any(R&& buf, int tag = 0, const CollOptions& o = {}) {
    return recv_any(buf.data(), buf.size(), dtype_of_v<detail::elem_t<R>>, tag, o);
  }

  // ---- groups and lifetime -----------------------------------------------------------------
  /// Collective over this communicator: members with the same color form a new communicator,
  /// ordered by (key, rank). color < 0: not a member (returns an invalid Communicator).
  Communicator split(int color, int key) const;
  /// Fails every pending and later operation of this communicator with Aborted, now.
  void abort();
  /// After PeerFailed in a job run by `strata run --ft`: waits for the controller's new
  /// epoch, meets the replacement rank(s) and rebuilds this (world) communicator, keeping
  /// everything that did not touch a failed rank. Operations queued before it fail.
  /// Sub-communicators stay revoked: destroy them and split again. Unavailable outside --ft.
  void recover();
  /// The failure epoch this communicator was last (re)built for; 0 before any failure.
  uint64_t epoch() const;
  /// Waits for pending work and releases this handle's resources (other copies become invalid).
  void destroy();

  const std::shared_ptr<detail::CommImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<detail::ContextImpl> context() const;
  template <class A, class B>
  static void check_same() {
    static_assert(std::is_same_v<std::remove_const_t<detail::elem_t<A>>, std::remove_const_t<detail::elem_t<B>>>,
                  "in and out must have the same element type");
  }
  void need(bool ok, const char* what, size_t have, size_t want) const {
    if (!ok)
      detail::throw_invalid_on(
          impl_, std::string(what) + " has " + std::to_string(have) + " elements, needs " + std::to_string(want));
  }
  // The typed all_to_all's block: in and out hold size() equal blocks.
  template <class I, class O>
  size_t a2a_block(const I& in, const O& out) const {
    check_same<I, O>();
    size_t n = static_cast<size_t>(size());
    if (in.size() % n != 0 || out.size() < in.size())
      detail::throw_invalid_on(impl_, "all_to_all: in has " + std::to_string(in.size()) +
                                          " elements, not a multiple of " + std::to_string(n) + " ranks, or out (" +
                                          std::to_string(out.size()) + ") is smaller");
    return in.size() / n;
  }
  // The typed v-forms' own checks (the library checks the counts against the peers').
  void need_per_rank(std::span<const size_t> v, const char* call, const char* what) const {
    if (v.size() != static_cast<size_t>(size()))
      detail::throw_invalid_on(impl_, std::string(call) + ": " + what + " has " + std::to_string(v.size()) +
                                          " entries, one per rank needs " + std::to_string(size()));
  }
  template <class I, class O>
  void check_v(const I& in, const O& out, std::span<const size_t> counts, const char* call, bool scatter) const {
    check_same<I, O>();
    need_per_rank(counts, call, "counts");
    size_t total = 0;
    for (size_t c : counts) total += c;
    const size_t mine = counts[static_cast<size_t>(rank())];
    const std::string at = std::string(call) + (scatter ? ": in" : ": out");
    if (scatter) {
      need(in.size() >= total, at.c_str(), in.size(), total);
      need(out.size() >= mine, (std::string(call) + ": out (counts[rank])").c_str(), out.size(), mine);
    } else {
      need(in.size() >= mine, (std::string(call) + ": in (counts[rank])").c_str(), in.size(), mine);
      need(out.size() >= total, at.c_str(), out.size(), total);
    }
  }
  template <class I, class O>
  void check_a2av(const I& in, std::span<const size_t> sc, std::span<const size_t> sd, const O& out,
                  std::span<const size_t> rc, std::span<const size_t> rd) const {
    check_same<I, O>();
    need_per_rank(sc, "all_to_all_v", "send_counts");
    need_per_rank(sd, "all_to_all_v", "send_displs");
    need_per_rank(rc, "all_to_all_v", "recv_counts");
    need_per_rank(rd, "all_to_all_v", "recv_displs");
    for (size_t j = 0; j < sc.size(); ++j) {
      need(sd[j] <= in.size() && sc[j] <= in.size() - sd[j], "all_to_all_v: in", in.size(), sd[j] + sc[j]);
      need(rd[j] <= out.size() && rc[j] <= out.size() - rd[j], "all_to_all_v: out", out.size(), rd[j] + rc[j]);
    }
  }
  std::shared_ptr<detail::CommImpl> impl_;
};

/// Joins the job described by the environment (or `opts`) and returns the world communicator.
/// Throws strata::Error (Unavailable when the store cannot be reached in time,
/// InvalidArgument for an inconsistent placement).
Communicator init(const InitOptions& opts = {});

}  // namespace strata

#pragma once
// What the files of the `_strata` extension share: the Python-side communicator (PyComm) and
// its Work handle, the timeout parser, and the bind_* functions module.cpp calls in order
// (the order in which pybind11 sees the classes is the one their signatures are written in).
//   module.cpp       PYBIND11_MODULE: enums, errors, dtypes, init, the store server
//   comm.cpp         Work, Communicator (properties, groups, lifetime)
//   memory.cpp       heap arrays, Registration of external arrays
//   collectives.cpp  every collective and point-to-point call, and the option parsers (to_ms)
//   recovery.cpp     RecoveryReport, State, the recovery functions
//   interop.cpp      numpy/torch arrays, dtypes, errors (interop.hpp); moe.cpp: MoeBuffer
//
// GIL: every call that can block (collectives, Work.wait, init, split, recover,
// State.restore, allocation of fresh pages) runs with the GIL released. Pointers are taken
// from the arrays before that, and the arrays stay referenced by the caller (blocking), by
// the communicator's pending list (async) or by the State until the memory is no longer used.

#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "interop.hpp"

namespace strata::python {

/// Seconds (int, float or datetime.timedelta) to milliseconds; None gives 0 (the default).
std::chrono::milliseconds to_ms(py::handle t, const char* what);

/// An async operation in flight and the arrays it reads or writes.
struct Pending {
  Work work;
  py::object keep;  // the arrays the operation reads or writes
};

/// Handle of an operation started with async_op=True.
class PyWork {
 public:
  PyWork(Work w, py::object result) : work_(std::move(w)), result_(std::move(result)) {}

  /// Waits without the GIL; returns the result array. Python's signal handlers run every
  /// 50 ms meanwhile, so Ctrl-C raises KeyboardInterrupt here (the operation goes on).
  py::object wait() {
    for (;;) {
      bool done = false;
      {
        py::gil_scoped_release nogil;
        done = work_.wait_for(std::chrono::milliseconds(50));
      }
      if (done) return result_;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }
  /// Waits at most `seconds` without the GIL; true when complete. 0 polls, as test() does.
  bool wait_for(py::handle seconds) {
    if ((PyFloat_Check(seconds.ptr()) || PyIndex_Check(seconds.ptr())) && seconds.cast<double>() == 0.0)
      return work_.test();
    auto ms = to_ms(seconds, "wait_for: seconds");
    py::gil_scoped_release nogil;
    return work_.wait_for(ms);
  }
  /// Non-blocking completion check.
  bool test() { return work_.test(); }
  /// True once finished, successfully or not.
  bool completed() const { return work_.completed(); }
  /// Code of a finished operation.
  Code status() const { return work_.status(); }
  /// The array the operation writes (None when none).
  py::object result() const { return result_; }

 private:
  Work work_;
  py::object result_;
};

/// strata.Communicator: the C++ handle plus the async operations whose arrays it keeps alive.
class PyComm {
 public:
  explicit PyComm(Communicator c) : comm_(std::move(c)) {}
  PyComm(const PyComm&) = delete;
  PyComm& operator=(const PyComm&) = delete;
  ~PyComm() { drain(); }

  /// The communicator; InvalidArgument once destroyed (or while destroy() runs).
  Communicator& comm() {
    if (closing_ || !comm_.valid()) invalid("this Communicator was destroyed");
    return comm_;
  }

  /// Held by a call for as long as it may use the communicator without the GIL: destroy() from
  /// another thread meanwhile aborts the call (it fails with Aborted) and waits for it to
  /// return, instead of freeing what the call still uses.
  class InUse {
   public:
    explicit InUse(PyComm& c) : c_(c) { c_.in_use_.fetch_add(1, std::memory_order_acq_rel); }
    ~InUse() { c_.in_use_.fetch_sub(1, std::memory_order_acq_rel); }
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

   private:
    PyComm& c_;
  };
  /// The handle, valid or not.
  const Communicator& handle() const { return comm_; }

  /// Forgets finished async operations (and so releases their arrays).
  void prune();

  /// Set when a call reached dispatch: its argument checks passed (collectives.cpp, Refusing).
  bool dispatched = false;

  /// Runs `fn(async)` without the GIL. Blocking: returns `result`. Async: returns a Work and
  /// keeps `keep` alive until the operation has completed.
  template <class F>
  py::object dispatch(bool async, py::object result, py::object keep, F&& fn) {
    InUse in_use(*this);
    dispatched = true;
    prune();
    if (!async) {
      {
        Interruptible ctrl_c;
        py::gil_scoped_release nogil;
        fn(false);
      }
      return result;
    }
    Work w;
    {
      py::gil_scoped_release nogil;
      w = fn(true);
    }
    pending_.push_back({w, std::move(keep)});
    return py::cast(PyWork(std::move(w), std::move(result)));
  }

  /// Waits for every pending operation; errors are dropped (each Work reports its own).
  void drain() noexcept;

  /// Drains, then releases the communicator (without the GIL). Calls that other threads have
  /// in progress fail with Aborted and are waited for; later calls raise InvalidArgument.
  void destroy();

 private:
  Communicator comm_;
  std::atomic<int> in_use_{0};
  bool closing_ = false;  // read and written under the GIL
  std::deque<Pending> pending_;
};

/// The pybind11 class of strata.Communicator.
using CommClass = py::class_<PyComm, std::shared_ptr<PyComm>>;

/// Adds Work (comm.cpp).
void bind_work(py::module_& m);
/// Adds Registration (memory.cpp).
void bind_registration(py::module_& m);
/// Adds Communicator with all its methods (comm.cpp; memory and collectives from their files).
void bind_communicator(py::module_& m);
/// Adds empty, zeros, empty_tensor, zeros_tensor, is_heap and register to `comm` (memory.cpp).
void bind_memory(CommClass& comm);
/// Adds every collective and send/recv to `comm` (collectives.cpp).
void bind_collectives(CommClass& comm);
/// Adds RecoveryReport, State and the recovery functions (recovery.cpp).
void bind_recovery(py::module_& m);

}  // namespace strata::python

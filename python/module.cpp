// The `_strata` extension: strata.init(), Communicator with every collective over numpy
// arrays and torch tensors (blocking, or async returning a Work), heap-backed arrays, the
// failure-recovery primitives (recover, State) and the rendezvous store server.
// strata/__init__.py re-exports it with the Python-side glue.
//
// GIL: every call that can block (collectives, Work.wait, init, split, recover,
// State.restore, allocation of fresh pages) runs with the GIL released. Pointers are taken
// from the arrays before that, and the arrays stay referenced by the caller (blocking), by
// the communicator's pending list (async) or by the State until the memory is no longer used.

#include <pybind11/stl.h>

#include <cmath>
#include <deque>
#include <numeric>
#include <optional>

#include <strata/recovery.hpp>

#include "bootstrap/store.hpp"  // the store server (internal API: the bindings are in-tree)
#include "coll/counts.hpp"       // v-collective counts (shared with the collectives)
#include "interop.hpp"

namespace strata::python {
namespace {

// ---- options -------------------------------------------------------------------------------

/// Seconds (int, float or datetime.timedelta) to milliseconds; None gives 0 (the default).
std::chrono::milliseconds to_ms(py::handle t, const char* what) {
  if (t.is_none()) return std::chrono::milliseconds(0);
  double s;
  if (py::hasattr(t, "total_seconds")) s = t.attr("total_seconds")().cast<double>();
  else if (PyFloat_Check(t.ptr()) || PyIndex_Check(t.ptr())) s = t.cast<double>();
  else invalid(std::string(what) + " must be seconds (int or float) or a datetime.timedelta");
  if (!(s > 0) || !std::isfinite(s))
    invalid(std::string(what) + " must be positive, got " + py::repr(t).cast<std::string>());
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(s * 1000)));
}

CollOptions make_opts(py::handle timeout, py::handle algorithm) {
  CollOptions o;
  o.timeout = to_ms(timeout, "timeout");
  if (algorithm.is_none()) return o;
  if (py::isinstance<Algorithm>(algorithm)) {
    o.algorithm = algorithm.cast<Algorithm>();
    return o;
  }
  std::string a = py::str(algorithm);
  if (a == "auto") o.algorithm = Algorithm::Auto;
  else if (a == "one_shot") o.algorithm = Algorithm::OneShot;
  else if (a == "two_shot") o.algorithm = Algorithm::TwoShot;
  else invalid("algorithm must be 'auto', 'one_shot' or 'two_shot', not " + py::repr(algorithm).cast<std::string>());
  return o;
}

std::vector<size_t> to_counts(py::handle seq, int n, const std::string& what) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq)) {
    // numpy arrays of counts are fine too.
    if (!py::hasattr(seq, "__len__")) invalid(what + " must be a sequence of " + std::to_string(n) + " integers");
  }
  std::vector<size_t> v;
  for (auto x : seq) {
    auto c = x.cast<long long>();
    if (c < 0) invalid(what + " has a negative entry (" + std::to_string(c) + ")");
    v.push_back(static_cast<size_t>(c));
  }
  if (static_cast<int>(v.size()) != n)
    invalid(what + " has " + std::to_string(v.size()) + " entries, one per rank needs " + std::to_string(n));
  return v;
}

using strata::coll::max_end;
using strata::coll::prefix_sums;

std::string shape_str(const std::vector<py::ssize_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

void same_dtype(const ArrayView& a, const ArrayView& b, const std::string& call) {
  if (a.dtype != b.dtype)
    invalid(call + ": in has dtype " + to_string(a.dtype) + " but out has " + to_string(b.dtype) +
            " (they must be equal)");
}

void need_count(const ArrayView& v, size_t want, const std::string& what) {
  if (v.count != want)
    invalid(what + " has " + std::to_string(v.count) + " elements (shape " + shape_str(v.shape) + "), needs " +
            std::to_string(want));
}

// ---- Work ----------------------------------------------------------------------------------

struct Pending {
  Work work;
  py::object keep;  // the arrays the operation reads or writes
};

/// Handle of an operation started with async_op=True.
class PyWork {
 public:
  PyWork(Work w, py::object result) : work_(std::move(w)), result_(std::move(result)) {}

  py::object wait() {
    {
      py::gil_scoped_release nogil;
      work_.wait();
    }
    return result_;
  }
  bool wait_for(py::handle seconds) {
    auto ms = to_ms(seconds, "wait_for: seconds");
    py::gil_scoped_release nogil;
    return work_.wait_for(ms);
  }
  bool test() { return work_.test(); }
  bool completed() const { return work_.completed(); }
  Code status() const { return work_.status(); }
  py::object result() const { return result_; }

 private:
  Work work_;
  py::object result_;
};

// ---- Communicator --------------------------------------------------------------------------

/// True once `w` has finished, successfully or not. test() also completes a send whose
/// receiver has copied (sends complete when observed).
bool finished(Work& w) {
  if (w.completed()) return true;
  try {
    return w.test();
  } catch (const Error&) {
    return true;  // failed: the caller learns it from its own Work
  }
}

class PyComm {
 public:
  explicit PyComm(Communicator c) : comm_(std::move(c)) {}
  PyComm(const PyComm&) = delete;
  PyComm& operator=(const PyComm&) = delete;
  ~PyComm() { drain(); }

  Communicator& comm() {
    if (!comm_.valid()) invalid("this Communicator was destroyed");
    return comm_;
  }
  const Communicator& handle() const { return comm_; }

  /// Forgets finished async operations (and so releases their arrays).
  void prune() {
    while (!pending_.empty() && finished(pending_.front().work)) pending_.pop_front();
    if (pending_.size() > 64) std::erase_if(pending_, [](Pending& p) { return finished(p.work); });
  }

  /// Runs `fn(async)` without the GIL. Blocking: returns `result`. Async: returns a Work and
  /// keeps `keep` alive until the operation has completed.
  template <class F>
  py::object dispatch(bool async, py::object result, py::object keep, F&& fn) {
    prune();
    if (!async) {
      {
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
  void drain() noexcept {
    if (pending_.empty()) return;
    try {
      py::gil_scoped_release nogil;
      for (auto& p : pending_) {
        try {
          p.work.wait();
        } catch (...) {
        }
      }
    } catch (...) {
    }
    pending_.clear();
  }

  void destroy() {
    drain();
    if (comm_.valid()) {
      py::gil_scoped_release nogil;
      comm_.destroy();
    }
  }

 private:
  Communicator comm_;
  std::deque<Pending> pending_;
};

// Each binding below: inspect the arrays (with the GIL), check sizes, then dispatch a lambda
// that calls the blocking or the _async form of the C++ API.

py::object all_reduce(PyComm& self, py::handle a, py::handle op, py::handle out, bool async, py::handle timeout,
                      py::handle algorithm) {
  const bool in_place = out.is_none();
  ArrayView in = view_of(a, "all_reduce: a", in_place);
  ArrayView o = in_place ? in : view_of(out, "all_reduce: out", true);
  if (!in_place) {
    same_dtype(in, o, "all_reduce");
    need_count(o, in.count, "all_reduce: out");
  }
  ReduceOp rop = parse_op(op);
  CollOptions opts = make_opts(timeout, algorithm);
  Communicator& c = self.comm();
  const void* ip = in.data;
  void* outp = o.data;
  size_t n = in.count;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj), [&c, ip, outp, n, dt, rop, opts](bool as) {
    if (as) return c.all_reduce_async(ip, outp, n, dt, rop, opts);
    c.all_reduce(ip, outp, n, dt, rop, opts);
    return Work();
  });
}

py::object reduce(PyComm& self, py::handle a, int root, py::handle op, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  const bool is_root = c.rank() == root;
  const bool in_place = out.is_none();
  ArrayView in = view_of(a, "reduce: a", in_place && is_root);
  ArrayView o = in;
  void* outp = nullptr;
  if (is_root) {
    if (!in_place) {
      o = view_of(out, "reduce: out", true);
      same_dtype(in, o, "reduce");
      need_count(o, in.count, "reduce: out");
    }
    outp = o.data;
  }
  ReduceOp rop = parse_op(op);
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  size_t n = in.count;
  DataType dt = in.dtype;
  py::object result = is_root ? o.obj : py::none();
  return self.dispatch(async, result, py::make_tuple(in.obj, o.obj), [&c, ip, outp, n, dt, rop, root, opts](bool as) {
    if (as) return c.reduce_async(ip, outp, n, dt, rop, root, opts);
    c.reduce(ip, outp, n, dt, rop, root, opts);
    return Work();
  });
}

py::object broadcast(PyComm& self, py::handle a, int root, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  const bool is_root = c.rank() == root;
  ArrayView in, o;
  if (out.is_none()) {
    in = view_of(a, "broadcast: a", true);
    o = in;
  } else {
    o = view_of(out, "broadcast: out", true);
    if (a.is_none() && !is_root) {
      in = o;  // non-root ranks need no input
    } else {
      in = view_of(a, "broadcast: a", false);
      same_dtype(in, o, "broadcast");
      need_count(o, in.count, "broadcast: out");
    }
  }
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  size_t n = o.count;
  DataType dt = o.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj), [&c, ip, outp, n, dt, root, opts](bool as) {
    if (as) return c.broadcast_async(ip, outp, n, dt, root, opts);
    c.broadcast(ip, outp, n, dt, root, opts);
    return Work();
  });
}

py::object all_gather(PyComm& self, py::handle a, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  ArrayView in = view_of(a, "all_gather: a", false);
  const size_t n = static_cast<size_t>(c.size());
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) {
    std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(n)};
    shape.insert(shape.end(), in.shape.begin(), in.shape.end());
    out_obj = heap_like(c, in, shape);
  }
  ArrayView o = view_of(out_obj, "all_gather: out", true);
  same_dtype(in, o, "all_gather");
  need_count(o, n * in.count, "all_gather: out");
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  size_t cnt = in.count;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj), [&c, ip, outp, cnt, dt, opts](bool as) {
    if (as) return c.all_gather_async(ip, outp, cnt, dt, opts);
    c.all_gather(ip, outp, cnt, dt, opts);
    return Work();
  });
}

py::object all_gather_v(PyComm& self, py::handle a, py::handle counts_obj, py::handle out, bool async,
                        py::handle timeout) {
  Communicator& c = self.comm();
  auto counts = to_counts(counts_obj, c.size(), "all_gather_v: counts");
  ArrayView in = view_of(a, "all_gather_v: a", false);
  need_count(in, counts[c.rank()], "all_gather_v: a (counts[rank])");
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) out_obj = heap_like(c, in, {static_cast<py::ssize_t>(total)});
  ArrayView o = view_of(out_obj, "all_gather_v: out", true);
  same_dtype(in, o, "all_gather_v");
  need_count(o, total, "all_gather_v: out (sum of counts)");
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj),
                       [&c, ip, outp, counts = std::move(counts), dt, opts](bool as) {
                         if (as) return c.all_gather_v_async(ip, outp, counts.data(), dt, opts);
                         c.all_gather_v(ip, outp, counts.data(), dt, opts);
                         return Work();
                       });
}

py::object reduce_scatter(PyComm& self, py::handle a, py::handle op, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  ArrayView in = view_of(a, "reduce_scatter: a", false);
  const size_t n = static_cast<size_t>(c.size());
  if (in.count % n != 0)
    invalid("reduce_scatter: a has " + std::to_string(in.count) + " elements, not a multiple of " + std::to_string(n) +
            " ranks");
  const size_t k = in.count / n;
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) {
    std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(k)};
    if (!in.shape.empty() && in.shape[0] % static_cast<py::ssize_t>(n) == 0) {
      shape = in.shape;
      shape[0] /= static_cast<py::ssize_t>(n);
    }
    out_obj = heap_like(c, in, shape);
  }
  ArrayView o = view_of(out_obj, "reduce_scatter: out", true);
  same_dtype(in, o, "reduce_scatter");
  need_count(o, k, "reduce_scatter: out");
  ReduceOp rop = parse_op(op);
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj), [&c, ip, outp, k, dt, rop, opts](bool as) {
    if (as) return c.reduce_scatter_async(ip, outp, k, dt, rop, opts);
    c.reduce_scatter(ip, outp, k, dt, rop, opts);
    return Work();
  });
}

py::object reduce_scatter_v(PyComm& self, py::handle a, py::handle counts_obj, py::handle op, py::handle out,
                            bool async, py::handle timeout) {
  Communicator& c = self.comm();
  auto counts = to_counts(counts_obj, c.size(), "reduce_scatter_v: counts");
  ArrayView in = view_of(a, "reduce_scatter_v: a", false);
  need_count(in, std::accumulate(counts.begin(), counts.end(), size_t{0}), "reduce_scatter_v: a (sum of counts)");
  const size_t mine = counts[c.rank()];
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) out_obj = heap_like(c, in, {static_cast<py::ssize_t>(mine)});
  ArrayView o = view_of(out_obj, "reduce_scatter_v: out", true);
  same_dtype(in, o, "reduce_scatter_v");
  need_count(o, mine, "reduce_scatter_v: out (counts[rank])");
  ReduceOp rop = parse_op(op);
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj),
                       [&c, ip, outp, counts = std::move(counts), dt, rop, opts](bool as) {
                         if (as) return c.reduce_scatter_v_async(ip, outp, counts.data(), dt, rop, opts);
                         c.reduce_scatter_v(ip, outp, counts.data(), dt, rop, opts);
                         return Work();
                       });
}

py::object all_to_all(PyComm& self, py::handle a, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  const bool in_place = !out.is_none() && out.is(a);
  ArrayView in = view_of(a, "all_to_all: a", in_place);
  const size_t n = static_cast<size_t>(c.size());
  if (in.count % n != 0)
    invalid("all_to_all: a has " + std::to_string(in.count) + " elements, not a multiple of " + std::to_string(n) +
            " ranks");
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) out_obj = heap_like(c, in, in.shape);
  ArrayView o = in_place ? in : view_of(out_obj, "all_to_all: out", true);
  same_dtype(in, o, "all_to_all");
  need_count(o, in.count, "all_to_all: out");
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  size_t k = in.count / n;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj), [&c, ip, outp, k, dt, opts](bool as) {
    if (as) return c.all_to_all_async(ip, outp, k, dt, opts);
    c.all_to_all(ip, outp, k, dt, opts);
    return Work();
  });
}

/// recv_counts[j] = rank j's send_counts[rank]: one all_to_all of the counts.
std::vector<size_t> exchange_counts(Communicator& c, const std::vector<size_t>& send_counts) {
  const size_t n = send_counts.size();
  Buffer<uint64_t> s = c.alloc<uint64_t>(n), r = c.alloc<uint64_t>(n);
  for (size_t i = 0; i < n; ++i) s[i] = send_counts[i];
  {
    py::gil_scoped_release nogil;
    c.all_to_all(s.data(), r.data(), 1, DataType::UInt64);
  }
  return std::vector<size_t>(r.begin(), r.end());
}

py::object all_to_all_v(PyComm& self, py::handle a, py::handle send_counts_obj, py::handle recv_counts_obj,
                        py::handle out, py::handle send_displs_obj, py::handle recv_displs_obj, bool async,
                        py::handle timeout) {
  Communicator& c = self.comm();
  const int n = c.size();
  const bool in_place = !out.is_none() && out.is(a);
  ArrayView in = view_of(a, "all_to_all_v: a", in_place);
  auto sc = to_counts(send_counts_obj, n, "all_to_all_v: send_counts");
  auto sd = send_displs_obj.is_none() ? prefix_sums(sc) : to_counts(send_displs_obj, n, "all_to_all_v: send_displs");
  if (max_end(sc, sd) > in.count)
    invalid("all_to_all_v: a has " + std::to_string(in.count) + " elements but send_counts/send_displs reach " +
            std::to_string(max_end(sc, sd)));
  auto rc =
      recv_counts_obj.is_none() ? exchange_counts(c, sc) : to_counts(recv_counts_obj, n, "all_to_all_v: recv_counts");
  auto rd = recv_displs_obj.is_none() ? prefix_sums(rc) : to_counts(recv_displs_obj, n, "all_to_all_v: recv_displs");
  const size_t need = max_end(rc, rd);
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) out_obj = heap_like(c, in, {static_cast<py::ssize_t>(need)});
  ArrayView o = in_place ? in : view_of(out_obj, "all_to_all_v: out", true);
  same_dtype(in, o, "all_to_all_v");
  if (o.count < need)
    invalid("all_to_all_v: out has " + std::to_string(o.count) + " elements but recv_counts/recv_displs reach " +
            std::to_string(need));
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  void* outp = o.data;
  DataType dt = in.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj),
                       [&c, ip, outp, sc = std::move(sc), sd = std::move(sd), rc = std::move(rc), rd = std::move(rd),
                        dt, opts](bool as) {
                         if (as)
                           return c.all_to_all_v_async(ip, sc.data(), sd.data(), outp, rc.data(), rd.data(), dt, opts);
                         c.all_to_all_v(ip, sc.data(), sd.data(), outp, rc.data(), rd.data(), dt, opts);
                         return Work();
                       });
}

py::object gather(PyComm& self, py::handle a, int root, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  ArrayView in = view_of(a, "gather: a", false);
  const bool is_root = c.rank() == root;
  const size_t n = static_cast<size_t>(c.size());
  ArrayView o;
  void* outp = nullptr;
  py::object result = py::none();
  if (is_root) {
    py::object out_obj = py::reinterpret_borrow<py::object>(out);
    if (out.is_none()) {
      std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(n)};
      shape.insert(shape.end(), in.shape.begin(), in.shape.end());
      out_obj = heap_like(c, in, shape);
    }
    o = view_of(out_obj, "gather: out", true);
    same_dtype(in, o, "gather");
    need_count(o, n * in.count, "gather: out");
    outp = o.data;
    result = o.obj;
  }
  CollOptions opts = make_opts(timeout, py::none());
  const void* ip = in.data;
  size_t cnt = in.count;
  DataType dt = in.dtype;
  return self.dispatch(async, result, py::make_tuple(in.obj, result), [&c, ip, outp, cnt, dt, root, opts](bool as) {
    if (as) return c.gather_async(ip, outp, cnt, dt, root, opts);
    c.gather(ip, outp, cnt, dt, root, opts);
    return Work();
  });
}

py::object scatter(PyComm& self, py::handle a, int root, py::handle out, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  const bool is_root = c.rank() == root;
  const size_t n = static_cast<size_t>(c.size());
  ArrayView in;
  const void* ip = nullptr;
  py::object out_obj = py::reinterpret_borrow<py::object>(out);
  if (is_root) {
    if (a.is_none()) invalid("scatter: a (the array to scatter) is required at the root");
    in = view_of(a, "scatter: a", false);
    if (in.count % n != 0)
      invalid("scatter: a has " + std::to_string(in.count) + " elements, not a multiple of " + std::to_string(n) +
              " ranks");
    if (out.is_none()) {
      std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(in.count / n)};
      if (!in.shape.empty() && in.shape[0] == static_cast<py::ssize_t>(n))
        shape.assign(in.shape.begin() + 1, in.shape.end());
      out_obj = heap_like(c, in, shape);
    }
    ip = in.data;
  } else if (out.is_none()) {
    invalid("scatter: out is required on ranks other than the root (rank " + std::to_string(c.rank()) + ", root " +
            std::to_string(root) + ")");
  }
  ArrayView o = view_of(out_obj, "scatter: out", true);
  if (is_root) {
    same_dtype(in, o, "scatter");
    need_count(in, n * o.count, "scatter: a");
  }
  CollOptions opts = make_opts(timeout, py::none());
  void* outp = o.data;
  size_t cnt = o.count;
  DataType dt = o.dtype;
  return self.dispatch(async, o.obj, py::make_tuple(in.obj, o.obj), [&c, ip, outp, cnt, dt, root, opts](bool as) {
    if (as) return c.scatter_async(ip, outp, cnt, dt, root, opts);
    c.scatter(ip, outp, cnt, dt, root, opts);
    return Work();
  });
}

py::object barrier(PyComm& self, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  CollOptions opts = make_opts(timeout, py::none());
  return self.dispatch(async, py::none(), py::none(), [&c, opts](bool as) {
    if (as) return c.barrier_async(opts);
    c.barrier(opts);
    return Work();
  });
}

py::object send(PyComm& self, py::handle a, int peer, int tag, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  ArrayView v = view_of(a, "send: a", false);
  CollOptions opts = make_opts(timeout, py::none());
  const void* p = v.data;
  size_t n = v.count;
  DataType dt = v.dtype;
  return self.dispatch(async, py::none(), v.obj, [&c, p, n, dt, peer, tag, opts](bool as) {
    if (as) return c.send_async(p, n, dt, peer, tag, opts);
    c.send(p, n, dt, peer, tag, opts);
    return Work();
  });
}

py::object recv(PyComm& self, py::handle a, int peer, int tag, bool async, py::handle timeout) {
  Communicator& c = self.comm();
  ArrayView v = view_of(a, "recv: a", true);
  CollOptions opts = make_opts(timeout, py::none());
  void* p = v.data;
  size_t n = v.count;
  DataType dt = v.dtype;
  return self.dispatch(async, v.obj, v.obj, [&c, p, n, dt, peer, tag, opts](bool as) {
    if (as) return c.recv_async(p, n, dt, peer, tag, opts);
    c.recv(p, n, dt, peer, tag, opts);
    return Work();
  });
}

// ---- registration of external arrays -------------------------------------------------------

/// Keeps an external array registered (single-copy CMA for peers) until closed.
class PyRegistration {
 public:
  PyRegistration(Registration r, py::object keep) : reg_(std::move(r)), keep_(std::move(keep)) {}
  void close() {
    reg_ = Registration();
    keep_ = py::none();
  }
  bool active() const { return reg_.data() != nullptr; }

 private:
  Registration reg_;
  py::object keep_;
};

// ---- failure recovery ----------------------------------------------------------------------

/// recovery::State over numpy arrays and torch tensors. The C++ State keeps raw pointers to
/// the registered memory and to the communicator, so this object holds references to both:
/// nothing restore() writes into can be freed while the State lives.
class PyState {
 public:
  PyState(std::shared_ptr<PyComm> comm, int replica_group) : comm_(std::move(comm)) {
    if (!comm_) invalid("State: comm must be a strata.Communicator, not None");
    state_ = std::make_unique<recovery::State>(comm_->comm(), replica_group);
  }

  void add(const std::string& name, py::handle a) {
    not_busy("add");
    // Writable: a replacement or a rank behind receives its state into this very memory.
    ArrayView v = view_of(a, "State.add: '" + name + "'", true);
    state_->add_bytes(name, v.data, v.bytes());
    names_.push_back(name);
    arrays_.append(v.obj);
  }

  uint64_t step() const { return state_->step(); }
  void set_step(uint64_t s) {
    not_busy("setting step");
    state_->step() = s;
  }

  void restore() {
    not_busy("restore");
    busy_ = true;
    try {
      py::gil_scoped_release nogil;
      state_->restore();
    } catch (...) {
      busy_ = false;
      throw;
    }
    busy_ = false;
  }

  size_t nbytes() const { return state_->bytes(); }
  py::list names() const {
    py::list l;
    l.append("step");
    for (const auto& n : names_) l.append(n);
    return l;
  }

 private:
  // restore() runs without the GIL and writes into the registered memory; another thread
  // changing the registrations meanwhile would race with it. Checked with the GIL held.
  void not_busy(const char* what) const {
    if (busy_) invalid(std::string("State: ") + what + " while restore() runs in another thread");
  }

  std::shared_ptr<PyComm> comm_;
  std::vector<std::string> names_;
  py::list arrays_;
  bool busy_ = false;
  // After comm_ and arrays_, so it is destroyed before what it points to.
  std::unique_ptr<recovery::State> state_;
};

py::dict report_dict(const recovery::Report& r) {
  py::dict d;
  d["epoch"] = r.epoch;
  d["failed"] = r.failed;
  d["replacement"] = r.replacement;
  d["injected_ns"] = r.injected_ns;
  d["detected_ns"] = r.detected_ns;
  d["spawned_ns"] = r.spawned_ns;
  d["seen_ns"] = r.seen_ns;
  d["rebuild_start_ns"] = r.rebuild_start_ns;
  d["joined_ns"] = r.joined_ns;
  d["rebuilt_ns"] = r.rebuilt_ns;
  d["restored_ns"] = r.restored_ns;
  d["restored_bytes"] = r.restored_bytes;
  return d;
}

}  // namespace
}  // namespace strata::python

// ---- module ----------------------------------------------------------------------------------

namespace py = pybind11;
using namespace strata;
using namespace strata::python;

PYBIND11_MODULE(_strata, m) {
  m.doc() = "Strata: collectives over a shared-memory heap (C++ extension; use the `strata` package)";

  py::enum_<Code>(m, "Code", "Error codes; each tells the caller how to recover.")
      .value("Ok", Code::Ok)
      .value("InvalidArgument", Code::InvalidArgument)
      .value("Timeout", Code::Timeout)
      .value("PeerFailed", Code::PeerFailed)
      .value("Aborted", Code::Aborted)
      .value("Unavailable", Code::Unavailable)
      .value("Internal", Code::Internal);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("SUM", ReduceOp::Sum)
      .value("PROD", ReduceOp::Prod)
      .value("MIN", ReduceOp::Min)
      .value("MAX", ReduceOp::Max)
      .value("AVG", ReduceOp::Avg);
  py::enum_<Algorithm>(m, "Algorithm")
      .value("AUTO", Algorithm::Auto)
      .value("ONE_SHOT", Algorithm::OneShot)
      .value("TWO_SHOT", Algorithm::TwoShot);
  register_errors(m);

  m.def(
      "dtype_size", [](py::handle dt) { return dtype_size(parse_dtype(dt)); }, py::arg("dtype"),
      "Bytes per element of a dtype (string, numpy or torch dtype).");
  m.def(
      "dtype_name", [](py::handle dt) { return std::string(to_string(parse_dtype(dt))); }, py::arg("dtype"),
      "Strata's name of a dtype ('float32', 'bfloat16', ...).");

  py::class_<PyWork>(m, "Work", "Handle of an operation started with async_op=True.")
      .def("wait", &PyWork::wait,
           "Blocks (without the GIL) until the operation completes; returns its result array (None when it has "
           "none). Raises strata.Error if it failed.")
      .def("wait_for", &PyWork::wait_for, py::arg("seconds"),
           "Waits at most `seconds`; True when complete (raises if it failed), False if still running.")
      .def("test", &PyWork::test, "Non-blocking: True when complete (raises if it failed).")
      .def("completed", &PyWork::completed, "True once the operation has finished, successfully or not.")
      .def_property_readonly("status", &PyWork::status, "Code of a finished operation; Code.Ok while running.")
      .def_property_readonly("result", &PyWork::result, "The array the operation writes (None when none).");

  py::class_<PyRegistration>(m, "Registration", "An external array registered for single-copy (CMA) access by peers.")
      .def("close", &PyRegistration::close, "Unregisters the array.")
      .def_property_readonly("active", &PyRegistration::active)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyRegistration& r, py::args) { r.close(); });

  py::class_<PyComm, std::shared_ptr<PyComm>> comm(m, "Communicator", "A group of ranks running collectives together.");
  comm.def_property_readonly("rank", [](PyComm& s) { return s.comm().rank(); })
      .def_property_readonly("size", [](PyComm& s) { return s.comm().size(); })
      .def_property_readonly("local_rank", [](PyComm& s) { return s.comm().local_rank(); })
      .def_property_readonly("local_size", [](PyComm& s) { return s.comm().local_size(); })
      .def_property_readonly("valid", [](PyComm& s) { return s.handle().valid(); })
      .def_property_readonly(
          "timeout", [](PyComm& s) { return s.comm().timeout().count() / 1000.0; },
          "Default deadline of every wait, in seconds.")
      .def(
          "global_rank", [](PyComm& s, int r) { return s.comm().global_rank(r); }, py::arg("rank"))
      .def(
          "stats",
          [](PyComm& s) {
            Stats st = s.comm().stats();
            py::dict d;
            d["ops"] = st.ops;
            d["staged_bytes"] = st.staged_bytes;
            d["direct_bytes"] = st.direct_bytes;
            d["cma_bytes"] = st.cma_bytes;
            d["temp_bytes"] = st.temp_bytes;
            return d;
          },
          "Counters: ops, staged_bytes, direct_bytes, cma_bytes, temp_bytes.")
      // memory
      .def(
          "empty",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            return heap_numpy(s.comm(), parse_shape(shape), parse_dtype(dtype), false);
          },
          py::arg("shape"), py::arg("dtype") = "float32",
          "A numpy array in the registered heap (contents unspecified): collectives on it are zero-copy.")
      .def(
          "zeros",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            return heap_numpy(s.comm(), parse_shape(shape), parse_dtype(dtype), true);
          },
          py::arg("shape"), py::arg("dtype") = "float32", "Like empty(), filled with zeros.")
      .def(
          "empty_tensor",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            return heap_tensor(s.comm(), parse_shape(shape), parse_dtype(dtype), false);
          },
          py::arg("shape"), py::arg("dtype") = "float32", "A torch tensor in the registered heap (bfloat16 included).")
      .def(
          "zeros_tensor",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            return heap_tensor(s.comm(), parse_shape(shape), parse_dtype(dtype), true);
          },
          py::arg("shape"), py::arg("dtype") = "float32", "Like empty_tensor(), filled with zeros.")
      .def(
          "is_heap",
          [](PyComm& s, py::handle a) {
            ArrayView v = view_of(a, "is_heap: a", false);
            return s.comm().is_heap(v.data, v.bytes());
          },
          py::arg("a"), "True when the array lies in this rank's registered heap.")
      .def(
          "register",
          [](PyComm& s, py::handle a) {
            ArrayView v = view_of(a, "register: a", false);
            return PyRegistration(s.comm().register_buffer(v.data, v.bytes()), v.obj);
          },
          py::arg("a"),
          "Registers an external array so peers read it with a single copy (CMA); returns a Registration "
          "(a context manager) that keeps the array alive until closed.")
      // collectives
      .def("all_reduce", &all_reduce, py::arg("a"), py::arg("op") = "sum", py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(), py::arg("algorithm") = py::none(),
           "Reduces `a` over all ranks: in place, or into `out`. Returns the result array, or a Work when "
           "async_op=True.")
      .def("reduce", &reduce, py::arg("a"), py::arg("root") = 0, py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Reduces `a` over all ranks into the root's `out` (or `a`). Returns the result at the root, None "
           "elsewhere.")
      .def("broadcast", &broadcast, py::arg("a"), py::arg("root") = 0, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Copies the root's `a` to every rank's `a` (or `out`; then `a` may be None off the root).")
      .def("all_gather", &all_gather, py::arg("a"), py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Concatenates every rank's `a`: out has shape (size, *a.shape) (a new heap array when out is None).")
      .def("all_gather_v", &all_gather_v, py::arg("a"), py::arg("counts"), py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Rank r contributes counts[r] elements; out (1-D) is their concatenation.")
      .def("reduce_scatter", &reduce_scatter, py::arg("a"), py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "`a` holds size() equal blocks; rank r gets the reduction of block r.")
      .def("reduce_scatter_v", &reduce_scatter_v, py::arg("a"), py::arg("counts"), py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Block r of `a` has counts[r] elements; rank r gets their reduction.")
      .def("all_to_all", &all_to_all, py::arg("a"), py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Block j of `a` goes to rank j, landing in block rank of its out (out=a: in place).")
      .def("all_to_all_v", &all_to_all_v, py::arg("a"), py::arg("send_counts"), py::arg("recv_counts") = py::none(),
           py::kw_only(), py::arg("out") = py::none(), py::arg("send_displs") = py::none(),
           py::arg("recv_displs") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Sends send_counts[j] elements to rank j. recv_counts=None exchanges the counts first.")
      .def("gather", &gather, py::arg("a"), py::arg("root") = 0, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "The root's out (size, *a.shape) receives every rank's `a`; None elsewhere.")
      .def("scatter", &scatter, py::arg("a"), py::arg("root") = 0, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Rank r receives block r of the root's `a` into `out` (required off the root; a may be None there).")
      .def("barrier", &barrier, py::kw_only(), py::arg("async_op") = false, py::arg("timeout") = py::none())
      .def("send", &send, py::arg("a"), py::arg("peer"), py::arg("tag") = 0, py::kw_only(), py::arg("async_op") = false,
           py::arg("timeout") = py::none(),
           "Sends `a` to `peer` (completes when the peer has received it; use async_op for overlapping sends).")
      .def("recv", &recv, py::arg("a"), py::arg("peer"), py::arg("tag") = 0, py::kw_only(), py::arg("async_op") = false,
           py::arg("timeout") = py::none(), "Receives into `a` from `peer`; returns a.")
      // groups and lifetime
      .def(
          "split",
          [](PyComm& s, int color, std::optional<int> key) -> std::shared_ptr<PyComm> {
            Communicator& c = s.comm();
            int k = key ? *key : c.rank();
            Communicator child;
            {
              py::gil_scoped_release nogil;
              child = c.split(color, k);
            }
            if (!child.valid()) return nullptr;
            return std::make_shared<PyComm>(std::move(child));
          },
          py::arg("color"), py::arg("key") = py::none(),
          "Collective: ranks with equal color form a new communicator ordered by (key, rank); color < 0 "
          "returns None.")
      .def(
          "abort", [](PyComm& s) { s.comm().abort(); },
          "Fails every pending and later operation of this communicator with strata.Aborted, now.")
      .def(
          "recover",
          [](PyComm& s) {
            Communicator& c = s.comm();
            {
              py::gil_scoped_release nogil;
              c.recover();
            }
            // recover() failed whatever was queued before it: release those arrays now.
            s.drain();
          },
          "After a failure under `strata run --ft`: waits (without the GIL) for the new epoch, meets the "
          "replacement rank(s) and rebuilds this world communicator in place. Raises Unavailable outside --ft, "
          "InvalidArgument on a sub-communicator (destroy it and split again), and PeerFailed/Timeout when "
          "another failure interrupts the rebuild (call it again).")
      .def_property_readonly(
          "epoch", [](PyComm& s) { return s.comm().epoch(); },
          "The failure epoch this communicator was last (re)built for; 0 before any failure.")
      .def("destroy", &PyComm::destroy,
           "Waits for pending work and releases the communicator (heap arrays stay valid).")
      .def(
          "_capsule",
          [](PyComm& s) {
            auto* copy = new Communicator(s.comm());
            return py::capsule(copy, "strata.Communicator", [](PyObject* cap) {
              delete static_cast<Communicator*>(PyCapsule_GetPointer(cap, "strata.Communicator"));
            });
          },
          "A PyCapsule holding a copy of the C++ handle (for the torch backend extension).")
      .def("__repr__", [](PyComm& s) {
        if (!s.handle().valid()) return std::string("<strata.Communicator (destroyed)>");
        return "<strata.Communicator rank " + std::to_string(s.handle().rank()) + " of " +
               std::to_string(s.handle().size()) + ">";
      });

  // Failure recovery (C++: strata/recovery.hpp). The step loop, recovery_run, is Python code
  // in strata/__init__.py built on these.
  py::class_<recovery::Report>(m, "RecoveryReport",
                               "Timings of the last recovery this process took part in. Times are CLOCK_REALTIME "
                               "nanoseconds (strata.now_ns()); 0 means unknown. epoch 0: no recovery yet.")
      .def_readonly("epoch", &recovery::Report::epoch, "The epoch the job moved to.")
      .def_readonly("failed", &recovery::Report::failed, "World ranks replaced in this epoch.")
      .def_readonly("replacement", &recovery::Report::replacement, "This process is one of the replacements.")
      .def_readonly("injected_ns", &recovery::Report::injected_ns, "When mark_failure() was called, if it was.")
      .def_readonly("detected_ns", &recovery::Report::detected_ns, "When the controller noticed the failure.")
      .def_readonly("spawned_ns", &recovery::Report::spawned_ns, "When the controller started the replacement.")
      .def_readonly("seen_ns", &recovery::Report::seen_ns,
                    "When this rank saw the revoke (survivors) or started (replacements).")
      .def_readonly("rebuild_start_ns", &recovery::Report::rebuild_start_ns, "When this rank began to rebuild.")
      .def_readonly("joined_ns", &recovery::Report::joined_ns, "When every rank had arrived in the epoch.")
      .def_readonly("rebuilt_ns", &recovery::Report::rebuilt_ns, "When the world communicator was usable again.")
      .def_readonly("restored_ns", &recovery::Report::restored_ns, "When State.restore() finished on this rank.")
      .def_readonly("restored_bytes", &recovery::Report::restored_bytes,
                    "State bytes this rank sent or received in restore().")
      .def("to_dict", &report_dict, "The fields as a dict.")
      .def("__repr__", [](const recovery::Report& r) {
        std::string failed;
        for (int f : r.failed) failed += (failed.empty() ? "" : ", ") + std::to_string(f);
        return "<strata.RecoveryReport epoch " + std::to_string(r.epoch) + ", failed [" + failed + "]" +
               (r.replacement ? ", replacement" : "") + ", restored_bytes " + std::to_string(r.restored_bytes) + ">";
      });

  py::class_<PyState>(m, "State",
                      "The training state a replacement rank needs, registered by name (recovery::State). Every "
                      "member of a replica group (ranks with equal replica_group; by default all) must register the "
                      "same buffers, with the same sizes, in the same order, and hold identical contents.")
      .def(py::init<std::shared_ptr<PyComm>, int>(), py::arg("comm"), py::arg("replica_group") = 0,
           "`comm` is the world communicator; ranks with the same replica_group are replicas of each other.")
      .def("add", &PyState::add, py::arg("name"), py::arg("array"),
           "Registers a writable C-contiguous numpy array or CPU torch tensor (parameters, optimizer state, data "
           "cursor, RNG state...). restore() overwrites it in place; the State keeps it alive. Heap arrays "
           "(comm.empty) move with no copy. InvalidArgument for a name already registered.")
      .def_property("step", &PyState::step, &PyState::set_step,
                    "Completed steps; part of the state (restored with it).")
      .def("restore", &PyState::restore,
           "Collective, after comm.recover() (or at the start of a replacement): every rank whose state is "
           "missing or behind receives all buffers from a healthy replica that applied the most steps. Releases "
           "the GIL. InvalidArgument when replicas registered different buffers, Unavailable when no healthy "
           "replica is left in a group.")
      .def_property_readonly("nbytes", &PyState::nbytes, "Bytes registered, step included.")
      .def_property_readonly("names", &PyState::names, "Registered names in order, 'step' first.");

  m.def("is_replacement", &recovery::is_replacement,
        "True in a process that `strata run --ft` started to replace a failed rank.");
  m.def(
      "mark_failure", [](PyComm& c) { recovery::mark_failure(c.comm()); }, py::arg("comm"),
      "Records 'a failure is being injected now' for the next recovery's report (injected_ns). For "
      "fault-injection tests: call it right before the deliberate kill.");
  m.def(
      "last_recovery", [](PyComm& c) { return recovery::last_report(c.comm()); }, py::arg("comm"),
      "RecoveryReport of the last recovery of comm's job as seen by this process (epoch 0: none yet).");
  m.def("now_ns", &recovery::now_ns, "CLOCK_REALTIME now in nanoseconds: the clock of RecoveryReport.");

  m.def(
      "init",
      [](std::optional<int> rank, std::optional<int> size, std::string store, std::string token, std::string job_id,
         py::handle timeout, std::string host_id) {
        InitOptions o;
        o.rank = rank;
        o.size = size;
        o.store = std::move(store);
        o.token = std::move(token);
        o.job_id = std::move(job_id);
        o.host_id = std::move(host_id);
        o.timeout = to_ms(timeout, "timeout");
        Communicator c;
        {
          py::gil_scoped_release nogil;
          c = strata::init(o);
        }
        return std::make_shared<PyComm>(std::move(c));
      },
      py::arg("rank") = py::none(), py::arg("size") = py::none(), py::arg("store") = "", py::arg("token") = "",
      py::arg("job_id") = "", py::arg("timeout") = py::none(), py::arg("host_id") = "",
      "Joins the job and returns the world communicator (low level; use strata.init).");

  bind_moe(m, [](py::handle c) { return c.cast<PyComm&>().comm(); });

  // The rendezvous store, for jobs whose ranks are not started by `strata run`.
  py::class_<bootstrap::StoreServer>(m, "StoreServer", "A rendezvous store served by a thread of this process.")
      .def(py::init([](const std::string& host, int port, std::string token) {
             if (port < 0 || port > 65535) invalid("StoreServer: port must be 0-65535");
             py::gil_scoped_release nogil;
             return value_or_throw(bootstrap::StoreServer::start(host, static_cast<uint16_t>(port), std::move(token)));
           }),
           py::arg("host") = "127.0.0.1", py::arg("port") = 0, py::arg("token") = "")
      .def_property_readonly("port", &bootstrap::StoreServer::port)
      .def("stop", &bootstrap::StoreServer::stop, py::call_guard<py::gil_scoped_release>());
}

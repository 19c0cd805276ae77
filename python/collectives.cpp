// strata.Communicator's collectives and point-to-point calls over numpy arrays and torch
// tensors: the argument parsing they share (timeouts, algorithm, counts, shape checks) and one
// function per call. Each one inspects the arrays (with the GIL), checks sizes, then dispatches
// a lambda that calls the blocking or the _async form of the C++ API.

#include <algorithm>
#include <cmath>
#include <numeric>

#include "bindings.hpp"
#include "coll/counts.hpp"  // v-collective counts (shared with the collectives)

namespace strata::python {

/// Seconds (int, float or datetime.timedelta) to milliseconds; None gives 0 (the default).
std::chrono::milliseconds to_ms(py::handle t, const char* what) {
  if (t.is_none()) return std::chrono::milliseconds(0);
  double s;
  if (py::hasattr(t, "total_seconds")) s = t.attr("total_seconds")().cast<double>();
  else if (PyFloat_Check(t.ptr()) || PyIndex_Check(t.ptr())) s = t.cast<double>();
  else invalid(std::string(what) + " must be seconds (int or float) or a datetime.timedelta");
  if (!(s > 0)) invalid(std::string(what) + " must be positive, got " + py::repr(t).cast<std::string>());
  // float('inf') or timedelta.max: no deadline (Deadline::after saturates at max()).
  if (!std::isfinite(s) || s * 1000 >= 9e18) return std::chrono::milliseconds::max();
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(s * 1000)));
}

namespace {

// ---- options -------------------------------------------------------------------------------

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
    const long long c = int_arg(x, what + " entry");
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

// ---- the calls -----------------------------------------------------------------------------

py::object all_reduce(PyComm& self, py::handle a, py::handle op, py::handle out, py::handle async_arg,
                      py::handle timeout, py::handle algorithm) {
  const bool async = flag_arg(async_arg, "all_reduce: async_op");
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

py::object reduce(PyComm& self, py::handle a, py::handle root_arg, py::handle op, py::handle out, py::handle async_arg,
                  py::handle timeout) {
  const int root = int32_arg(root_arg, "reduce: root");
  const bool async = flag_arg(async_arg, "reduce: async_op");
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

py::object broadcast(PyComm& self, py::handle a, py::handle root_arg, py::handle out, py::handle async_arg,
                     py::handle timeout) {
  const int root = int32_arg(root_arg, "broadcast: root");
  const bool async = flag_arg(async_arg, "broadcast: async_op");
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

py::object all_gather(PyComm& self, py::handle a, py::handle out, py::handle async_arg, py::handle timeout) {
  const bool async = flag_arg(async_arg, "all_gather: async_op");
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

py::object all_gather_v(PyComm& self, py::handle a, py::handle counts_obj, py::handle out, py::handle async_arg,
                        py::handle timeout) {
  const bool async = flag_arg(async_arg, "all_gather_v: async_op");
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

py::object reduce_scatter(PyComm& self, py::handle a, py::handle op, py::handle out, py::handle async_arg,
                          py::handle timeout) {
  const bool async = flag_arg(async_arg, "reduce_scatter: async_op");
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
                            py::handle async_arg, py::handle timeout) {
  const bool async = flag_arg(async_arg, "reduce_scatter_v: async_op");
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

py::object all_to_all(PyComm& self, py::handle a, py::handle out, py::handle async_arg, py::handle timeout) {
  const bool async = flag_arg(async_arg, "all_to_all: async_op");
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
                        py::handle out, py::handle send_displs_obj, py::handle recv_displs_obj, py::handle async_arg,
                        py::handle timeout) {
  const bool async = flag_arg(async_arg, "all_to_all_v: async_op");
  Communicator& c = self.comm();
  const int n = c.size();
  const bool in_place = !out.is_none() && out.is(a);
  ArrayView in = view_of(a, "all_to_all_v: a", in_place);
  auto sc = to_counts(send_counts_obj, n, "all_to_all_v: send_counts");
  auto sd = send_displs_obj.is_none() ? prefix_sums(sc) : to_counts(send_displs_obj, n, "all_to_all_v: send_displs");
  if (max_end(sc, sd) > in.count)
    invalid("all_to_all_v: a has " + std::to_string(in.count) + " elements but send_counts/send_displs reach " +
            std::to_string(max_end(sc, sd)));
  // The count exchange is a collective of its own: an error inside it is not this call's
  // refusal (it failed on every rank), so Refusing must not add one. After it the peers go on
  // to the data phase, and an error found from here on is refused in its place.
  std::vector<size_t> rc;
  if (recv_counts_obj.is_none()) {
    self.dispatched = true;
    rc = exchange_counts(c, sc);
    self.dispatched = false;
  } else {
    rc = to_counts(recv_counts_obj, n, "all_to_all_v: recv_counts");
  }
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

py::object gather(PyComm& self, py::handle a, py::handle root_arg, py::handle out, py::handle async_arg,
                  py::handle timeout) {
  const int root = int32_arg(root_arg, "gather: root");
  const bool async = flag_arg(async_arg, "gather: async_op");
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

py::object scatter(PyComm& self, py::handle a, py::handle root_arg, py::handle out, py::handle async_arg,
                   py::handle timeout) {
  const int root = int32_arg(root_arg, "scatter: root");
  const bool async = flag_arg(async_arg, "scatter: async_op");
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

py::object barrier(PyComm& self, py::handle async_arg, py::handle timeout) {
  const bool async = flag_arg(async_arg, "barrier: async_op");
  Communicator& c = self.comm();
  CollOptions opts = make_opts(timeout, py::none());
  return self.dispatch(async, py::none(), py::none(), [&c, opts](bool as) {
    if (as) return c.barrier_async(opts);
    c.barrier(opts);
    return Work();
  });
}

py::object send(PyComm& self, py::handle a, py::handle peer_arg, py::handle tag_arg, py::handle async_arg,
                py::handle timeout) {
  const int peer = int32_arg(peer_arg, "send: peer"), tag = int32_arg(tag_arg, "send: tag");
  const bool async = flag_arg(async_arg, "send: async_op");
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

py::object recv(PyComm& self, py::handle a, py::handle peer_arg, py::handle tag_arg, py::handle async_arg,
                py::handle timeout) {
  const int peer = int32_arg(peer_arg, "recv: peer"), tag = int32_arg(tag_arg, "recv: tag");
  const bool async = flag_arg(async_arg, "recv: async_op");
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

int recv_any(PyComm& self, py::handle a, py::handle tag_arg, py::handle timeout) {
  const int tag = int32_arg(tag_arg, "recv_any: tag");
  Communicator& c = self.comm();
  ArrayView v = view_of(a, "recv_any: a", true);
  CollOptions opts = make_opts(timeout, py::none());
  PyComm::InUse in_use(self);
  py::gil_scoped_release nogil;  // v.obj keeps the array alive meanwhile
  return c.recv_any(v.data, v.count, v.dtype, tag, opts);
}

/// A collective whose own checks (before dispatch) refuse the call: the refusal takes the
/// call's place in the order of operations (detail::refuse_call), so that the peers' matching
/// calls fail naming this rank instead of waiting for it. An error from the C++ call itself
/// (after dispatch) was refused there already.
template <auto F>
struct Refusing;
template <class... A, py::object (*F)(PyComm&, A...)>
struct Refusing<F> {
  static py::object call(PyComm& self, A... a) {
    PyComm::InUse in_use(self);
    self.dispatched = false;
    try {
      return F(self, std::forward<A>(a)...);
    } catch (const Error& e) {
      if (e.code() == Code::InvalidArgument && !self.dispatched && self.handle().valid()) {
        detail::refuse_call(self.handle().impl());
        rethrow_on_rank(e, self.handle().rank());
      }
      throw;
    } catch (const std::exception&) {
      // A Python error while reading the arguments (an object whose __len__ or __index__
      // raised, a cast that failed): refused all the same, or the peers would meet this rank's
      // next call.
      if (!self.dispatched && self.handle().valid()) detail::refuse_call(self.handle().impl());
      throw;
    }
  }
};

}  // namespace

void bind_collectives(CommClass& comm) {
  comm.def("all_reduce", &Refusing<&all_reduce>::call, py::arg("a"), py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           py::arg("algorithm") = py::none(),
           "Reduces `a` over all ranks: in place, or into `out`. Returns the result array, or a Work when "
           "async_op=True.")
      .def("reduce", &Refusing<&reduce>::call, py::arg("a"), py::arg("root") = 0, py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Reduces `a` over all ranks into the root's `out` (or `a`). Returns the result at the root, None "
           "elsewhere.")
      .def("broadcast", &Refusing<&broadcast>::call, py::arg("a"), py::arg("root") = 0, py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Copies the root's `a` to every rank's `a` (or `out`; then `a` may be None off the root).")
      .def("all_gather", &Refusing<&all_gather>::call, py::arg("a"), py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Concatenates every rank's `a`: out has shape (size, *a.shape) (a new heap array when out is None).")
      .def("all_gather_v", &Refusing<&all_gather_v>::call, py::arg("a"), py::arg("counts"), py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Rank r contributes counts[r] elements; out (1-D) is their concatenation.")
      .def("reduce_scatter", &Refusing<&reduce_scatter>::call, py::arg("a"), py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "`a` holds size() equal blocks; rank r gets the reduction of block r.")
      .def("reduce_scatter_v", &Refusing<&reduce_scatter_v>::call, py::arg("a"), py::arg("counts"),
           py::arg("op") = "sum", py::kw_only(), py::arg("out") = py::none(), py::arg("async_op") = false,
           py::arg("timeout") = py::none(), "Block r of `a` has counts[r] elements; rank r gets their reduction.")
      .def("all_to_all", &Refusing<&all_to_all>::call, py::arg("a"), py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Block j of `a` goes to rank j, landing in block rank of its out (out=a: in place).")
      .def("all_to_all_v", &Refusing<&all_to_all_v>::call, py::arg("a"), py::arg("send_counts"),
           py::arg("recv_counts") = py::none(), py::kw_only(), py::arg("out") = py::none(),
           py::arg("send_displs") = py::none(), py::arg("recv_displs") = py::none(), py::arg("async_op") = false,
           py::arg("timeout") = py::none(),
           "Sends send_counts[j] elements to rank j. recv_counts=None exchanges the counts first.")
      .def("gather", &Refusing<&gather>::call, py::arg("a"), py::arg("root") = 0, py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "The root's out (size, *a.shape) receives every rank's `a`; None elsewhere.")
      .def("scatter", &Refusing<&scatter>::call, py::arg("a"), py::arg("root") = 0, py::kw_only(),
           py::arg("out") = py::none(), py::arg("async_op") = false, py::arg("timeout") = py::none(),
           "Rank r receives block r of the root's `a` into `out` (required off the root; a may be None there).")
      .def("barrier", &Refusing<&barrier>::call, py::kw_only(), py::arg("async_op") = false,
           py::arg("timeout") = py::none())
      .def("send", &send, py::arg("a"), py::arg("peer"), py::arg("tag") = 0, py::kw_only(), py::arg("async_op") = false,
           py::arg("timeout") = py::none(),
           "Sends `a` to `peer` (completes when the peer has received it; use async_op for overlapping sends).")
      .def("recv", &recv, py::arg("a"), py::arg("peer"), py::arg("tag") = 0, py::kw_only(), py::arg("async_op") = false,
           py::arg("timeout") = py::none(), "Receives into `a` from `peer`; returns a.")
      .def("recv_any", &recv_any, py::arg("a"), py::arg("tag") = 0, py::kw_only(), py::arg("timeout") = py::none(),
           "Receives into `a` the oldest message with `tag` from any rank of this host; returns the sender's rank.");
}

}  // namespace strata::python

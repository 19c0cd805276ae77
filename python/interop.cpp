// numpy / torch interop and the exception family of the `_strata` extension.

#include "interop.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "common/process.hpp"  // set_interrupt_check (internal API: the bindings are in-tree)

namespace strata::python {

void invalid(const std::string& message) { throw Error(Code::InvalidArgument, message); }

void rethrow_on_rank(const Error& e, int rank) {
  if (e.rank() >= 0) throw;
  throw Error(e.code(), detail::on_rank(e.what(), rank), rank, e.peer());
}

bool flag_arg(py::handle h, const std::string& what) {
  // What pybind11's bool argument took: True/False, None, and numbers (numpy's bool and
  // integers among them, through their truth value); a string or a list is a mistake.
  if (h.is_none()) return false;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  PyNumberMethods* num = Py_TYPE(h.ptr())->tp_as_number;
  if (num && num->nb_bool) {
    const int t = PyObject_IsTrue(h.ptr());
    if (t >= 0) return t == 1;
    PyErr_Clear();
  }
  invalid(what + " must be True or False, not " + py::repr(h).cast<std::string>());
}

long long int_arg(py::handle h, const std::string& what) {
  // int and anything with __index__ (numpy integers); bool is an int in Python but never meant
  // as a rank or count here, and a float would be truncated silently.
  py::object index;
  if (!py::isinstance<py::bool_>(h) && (py::isinstance<py::int_>(h) || py::hasattr(h, "__index__"))) {
    try {
      index = h.attr("__index__")();
    } catch (const py::error_already_set&) {
    }
  }
  if (!index) invalid(what + " must be an integer, not " + py::repr(h).cast<std::string>());
  try {
    return index.cast<long long>();
  } catch (const py::cast_error&) {
    invalid(what + " = " + py::repr(h).cast<std::string>() + " is out of range");
  }
}

int int32_arg(py::handle h, const std::string& what) {
  const long long v = int_arg(h, what);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    invalid(what + " = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

namespace {

struct DtypeName {
  const char* name;
  DataType type;
};
// Canonical names first (to_string(DataType) gives the same), then aliases.
// "float" and "int" are left to numpy (float64, int64), as a numpy user expects.
constexpr std::array<DtypeName, 12> kDtypeNames{{
    {"int8", DataType::Int8},
    {"uint8", DataType::UInt8},
    {"int32", DataType::Int32},
    {"uint32", DataType::UInt32},
    {"int64", DataType::Int64},
    {"uint64", DataType::UInt64},
    {"float16", DataType::Float16},
    {"bfloat16", DataType::BFloat16},
    {"float32", DataType::Float32},
    {"float64", DataType::Float64},
    {"half", DataType::Float16},
    {"double", DataType::Float64},
}};

std::string text(py::handle h) { return py::str(h).cast<std::string>(); }

const char* kSupported = "int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64";

bool name_to_dtype(std::string name, DataType& out) {
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  for (const auto& d : kDtypeNames)
    if (name == d.name) {
      out = d.type;
      return true;
    }
  return false;
}

DataType from_numpy(const py::dtype& d, const std::string& what) {
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (!d.attr("isnative").cast<bool>())
    invalid(what + " has a non-native byte order (" + text(d) +
            "); convert it with .astype(its_dtype.newbyteorder('='))");
  if (kind == 'i' && size == 1) return DataType::Int8;
  if (kind == 'i' && size == 4) return DataType::Int32;
  if (kind == 'i' && size == 8) return DataType::Int64;
  if (kind == 'u' && size == 1) return DataType::UInt8;
  if (kind == 'u' && size == 4) return DataType::UInt32;
  if (kind == 'u' && size == 8) return DataType::UInt64;
  if (kind == 'f' && size == 2) return DataType::Float16;
  if (kind == 'f' && size == 4) return DataType::Float32;
  if (kind == 'f' && size == 8) return DataType::Float64;
  invalid(what + " has dtype " + text(d) + ", which Strata does not support (supported: " + kSupported +
          "; bfloat16 through torch tensors)");
}

DataType from_torch(py::handle dtype, const std::string& what) {
  std::string name = py::str(dtype);
  DataType t;
  if (name_to_dtype(name, t)) return t;
  invalid(what + " has dtype " + name + ", which Strata does not support (supported: " + kSupported + ")");
}

bool is_torch_dtype(py::handle obj) {
  py::handle type = reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()));
  return py::str(type.attr("__module__")).cast<std::string>() == "torch" &&
         py::str(type.attr("__name__")).cast<std::string>() == "dtype";
}

}  // namespace

DataType parse_dtype(py::handle spec) {
  if (py::isinstance<py::str>(spec)) {
    std::string name = spec.cast<std::string>();
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    DataType t;
    if (name_to_dtype(lower, t)) return t;
    // numpy spellings such as "f4" or "<i8".
    try {
      return from_numpy(py::dtype(name), "dtype '" + name + "'");
    } catch (const py::error_already_set&) {
      invalid("unknown dtype '" + name + "' (supported: " + kSupported + ")");
    }
  }
  if (is_torch_dtype(spec)) return from_torch(spec, "dtype");
  try {
    return from_numpy(py::dtype::from_args(py::reinterpret_borrow<py::object>(spec)), "dtype");
  } catch (const py::error_already_set&) {
    invalid("cannot interpret " + py::repr(spec).cast<std::string>() + " as a dtype (supported: " + kSupported + ")");
  }
}

py::dtype numpy_dtype(DataType t) {
  if (t == DataType::BFloat16)
    invalid("numpy has no bfloat16: use comm.empty_tensor(shape, torch.bfloat16) for a heap-backed bfloat16 tensor");
  return py::dtype(std::string(to_string(t)));
}

py::object torch_dtype(DataType t) {
  if (t == DataType::UInt32 || t == DataType::UInt64)
    invalid(std::string("torch has no ") + to_string(t) + " tensors; use a numpy array (comm.empty)");
  return py::module_::import("torch").attr(to_string(t));
}

ReduceOp parse_op(py::handle spec) {
  if (py::isinstance<ReduceOp>(spec)) return spec.cast<ReduceOp>();
  if (py::isinstance<py::str>(spec)) {
    std::string s = spec.cast<std::string>();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "sum") return ReduceOp::Sum;
    if (s == "prod" || s == "product") return ReduceOp::Prod;
    if (s == "min") return ReduceOp::Min;
    if (s == "max") return ReduceOp::Max;
    if (s == "avg" || s == "mean") return ReduceOp::Avg;
    if (s == "band") return ReduceOp::BAnd;
    if (s == "bor") return ReduceOp::BOr;
    if (s == "bxor") return ReduceOp::BXor;
  }
  invalid("unknown reduction op " + py::repr(spec).cast<std::string>() +
          " (use 'sum', 'prod', 'min', 'max', 'avg', 'band', 'bor', 'bxor' or strata.ReduceOp)");
}

// ---- arrays --------------------------------------------------------------------------------

bool is_torch_tensor(py::handle obj) {
  // A tensor can only exist once torch is imported; never import it ourselves here.
  static PyObject* tensor_type = nullptr;
  if (!tensor_type) {
    PyObject* modules = PyImport_GetModuleDict();
    PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed
    if (!torch) return false;
    PyObject* t = PyObject_GetAttrString(torch, "Tensor");  // new reference, kept for good
    if (!t) {
      PyErr_Clear();  // torch still importing
      return false;
    }
    tensor_type = t;
  }
  int r = PyObject_IsInstance(obj.ptr(), tensor_type);
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

ArrayView view_of(py::handle obj, const std::string& what, bool writable) {
  ArrayView v;
  v.obj = py::reinterpret_borrow<py::object>(obj);
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    v.dtype = from_numpy(a.dtype(), what);
    if (!(a.flags() & py::array::c_style))
      invalid(what + " is not C-contiguous (shape " + py::str(obj.attr("shape")).cast<std::string>() + ", strides " +
              py::str(obj.attr("strides")).cast<std::string>() +
              "); Strata needs contiguous memory: pass np.ascontiguousarray(x), or allocate with comm.empty()");
    if (writable && !a.writeable()) invalid(what + " is read-only, but this call writes into it");
    v.data = static_cast<char*>(const_cast<void*>(a.data()));
    v.count = static_cast<size_t>(a.size());
    v.shape.assign(a.shape(), a.shape() + a.ndim());
    return v;
  }
  if (is_torch_tensor(obj)) {
    v.is_torch = true;
    if (obj.attr("is_sparse").cast<bool>()) invalid(what + " is a sparse tensor; Strata needs dense tensors");
    std::string device = py::str(obj.attr("device").attr("type"));
    if (device != "cpu") invalid(what + " is on device '" + device + "'; Strata moves CPU memory only");
    v.dtype = from_torch(obj.attr("dtype"), what);
    if (!obj.attr("is_contiguous")().cast<bool>())
      invalid(what + " is not contiguous (shape " + py::str(obj.attr("shape")).cast<std::string>() + ", stride " +
              py::str(obj.attr("stride")()).cast<std::string>() +
              "); Strata needs contiguous memory: pass x.contiguous(), or allocate with comm.empty_tensor()");
    v.data = reinterpret_cast<char*>(obj.attr("data_ptr")().cast<uintptr_t>());
    v.count = obj.attr("numel")().cast<size_t>();
    for (auto d : obj.attr("shape")) v.shape.push_back(d.cast<py::ssize_t>());
    return v;
  }
  invalid(what + " must be a numpy.ndarray or a torch.Tensor, not " +
          py::str(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).cast<std::string>());
}

std::vector<py::ssize_t> parse_shape(py::handle spec) {
  std::vector<py::ssize_t> shape;
  auto dim = [&](py::handle d) {
    const long long v = int_arg(d, "shape " + py::repr(spec).cast<std::string>() + ": a dimension");
    if (v > std::numeric_limits<py::ssize_t>::max())
      invalid("shape " + py::repr(spec).cast<std::string>() + " is too large");
    shape.push_back(static_cast<py::ssize_t>(v));
  };
  if (PyIndex_Check(spec.ptr())) {
    dim(spec);
  } else if (py::isinstance<py::sequence>(spec) && !py::isinstance<py::str>(spec)) {
    for (auto d : spec) dim(d);
  } else {
    invalid("shape must be an int or a sequence of ints, not " + py::repr(spec).cast<std::string>());
  }
  for (auto d : shape)
    if (d < 0) invalid("shape " + py::repr(spec).cast<std::string>() + " has a negative dimension");
  return shape;
}

namespace {

/// The bytes of an array of `shape` with elements of `esize` bytes; InvalidArgument when more
/// than an array can hold (numpy's limit: the largest ssize_t).
size_t array_bytes(const std::vector<py::ssize_t>& shape, size_t esize) {
  size_t n = esize;
  bool zero = false;
  bool over = false;
  for (auto d : shape) {
    zero = zero || d == 0;
    over = over || __builtin_mul_overflow(n, static_cast<size_t>(d), &n);
  }
  if (zero) return 0;
  if (over || n > static_cast<size_t>(std::numeric_limits<py::ssize_t>::max())) {
    std::string s;
    for (auto d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
    invalid("shape (" + s + ") of " + std::to_string(esize) + "-byte elements is larger than an array can be");
  }
  return n;
}

/// Heap array of `shape` with numpy dtype `dt` (element size `esize`).
py::array heap_block(Communicator& comm, const std::vector<py::ssize_t>& shape, const py::dtype& dt, size_t esize,
                     bool zero) {
  const size_t bytes = array_bytes(shape, esize);
  auto buf = std::make_unique<Buffer<uint8_t>>();
  {
    py::gil_scoped_release nogil;
    *buf = comm.alloc<uint8_t>(bytes);
    // First touch of fresh pages is slow (about 10 us per page here): do it without the GIL.
    if (zero && bytes) std::memset(buf->data(), 0, bytes);
  }
  void* data = buf->data();
  // The capsule owns the heap block; numpy keeps it as the array's base, torch.from_numpy
  // keeps the array, so the block lives as long as any view of it.
  py::capsule owner(buf.release(), "strata.HeapBlock", [](PyObject* cap) {
    delete static_cast<Buffer<uint8_t>*>(PyCapsule_GetPointer(cap, "strata.HeapBlock"));
  });
  return py::array(dt, shape, data, owner);
}

}  // namespace

py::array heap_numpy(Communicator& comm, const std::vector<py::ssize_t>& shape, DataType t, bool zero) {
  return heap_block(comm, shape, numpy_dtype(t), dtype_size(t), zero);
}

py::object heap_tensor(Communicator& comm, const std::vector<py::ssize_t>& shape, DataType t, bool zero) {
  py::object tdtype = torch_dtype(t);  // imports torch; rejects uint32/uint64
  py::module_ torch = py::module_::import("torch");
  if (t == DataType::BFloat16) {
    py::array a = heap_block(comm, shape, py::dtype("int16"), 2, zero);
    return torch.attr("from_numpy")(a).attr("view")(tdtype);
  }
  return torch.attr("from_numpy")(heap_numpy(comm, shape, t, zero));
}

py::object heap_like(Communicator& comm, const ArrayView& like, const std::vector<py::ssize_t>& shape) {
  if (like.is_torch) return heap_tensor(comm, shape, like.dtype, false);
  return heap_numpy(comm, shape, like.dtype, false);
}

// ---- errors --------------------------------------------------------------------------------

namespace {

// Indexed by Code; [0] (Ok) holds the base class strata.Error.
std::array<PyObject*, 7> g_errors{};

PyObject* new_error(py::module_& m, const char* name, const char* doc, PyObject* bases) {
  std::string full = std::string("strata.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (!cls) throw py::error_already_set();
  m.attr(name) = py::handle(cls);  // the module holds a reference; ours is kept for good
  return cls;
}

// The exception a Python signal handler raised while a wait of the library slept (SIGINT's
// KeyboardInterrupt): the wait ended with Aborted, and the call raises this instead. Read and
// written under the GIL.
PyObject *g_interrupt_type = nullptr, *g_interrupt_value = nullptr, *g_interrupt_tb = nullptr;

/// The library's interrupt check (set_interrupt_check): Python runs signal handlers on its main
/// thread only, so that thread, every 50 ms of a sleeping wait, takes the GIL and runs them.
thread_local bool t_interruptible = false;  // inside an Interruptible call

bool python_interrupted() {
  if (!t_interruptible) return false;
  thread_local std::chrono::steady_clock::time_point next{};
  const auto now = std::chrono::steady_clock::now();
  if (now < next) return false;
  next = now + std::chrono::milliseconds(50);
  if (::gettid() != ::getpid() || !Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return false;
#else
  if (_Py_IsFinalizing()) return false;
#endif
  const PyGILState_STATE gil = PyGILState_Ensure();
  bool raised = false;
  if (PyErr_CheckSignals() != 0) {
    raised = true;
    if (g_interrupt_type == nullptr) PyErr_Fetch(&g_interrupt_type, &g_interrupt_value, &g_interrupt_tb);
    else PyErr_Clear();
  }
  PyGILState_Release(gil);
  return raised;
}

void raise(const Error& e) {
  if (e.code() == Code::Aborted && g_interrupt_type != nullptr) {
    PyErr_Restore(g_interrupt_type, g_interrupt_value, g_interrupt_tb);  // steals the references
    g_interrupt_type = g_interrupt_value = g_interrupt_tb = nullptr;
    return;
  }
  auto idx = static_cast<size_t>(e.code());
  PyObject* cls = idx < g_errors.size() && g_errors[idx] ? g_errors[idx] : g_errors[0];
  py::object inst = py::reinterpret_steal<py::object>(PyObject_CallFunction(cls, "s", e.what()));
  if (!inst) return;  // the call set an error already
  inst.attr("code") = py::cast(e.code());
  inst.attr("rank") = e.rank();
  inst.attr("peer") = e.peer();
  PyErr_SetObject(cls, inst.ptr());
}

}  // namespace

Interruptible::Interruptible() : outer_(t_interruptible) { t_interruptible = true; }
Interruptible::~Interruptible() { t_interruptible = outer_; }

void register_errors(py::module_& m) {
  PyObject* base = new_error(m, "Error",
                             "Base of every Strata error. Attributes: code (strata.Code), rank (the rank that "
                             "raised it, -1 if unknown), peer (the other rank involved, -1 if none).",
                             PyExc_RuntimeError);
  g_errors[0] = base;
  auto sub = [&](Code c, const char* name, const char* doc, PyObject* extra) {
    PyObject* bases = extra ? PyTuple_Pack(2, base, extra) : PyTuple_Pack(1, base);
    g_errors[static_cast<size_t>(c)] = new_error(m, name, doc, bases);
    Py_DECREF(bases);
  };
  sub(Code::InvalidArgument, "InvalidArgument",
      "A bad argument, or a mismatch between the ranks' calls. Fix the call; the communicator stays usable.",
      PyExc_ValueError);
  sub(Code::Timeout, "Timeout", "A peer did not arrive before the deadline. The communicator is unusable.",
      PyExc_TimeoutError);
  sub(Code::PeerFailed, "PeerFailed", "A peer process died. The communicator is unusable.", nullptr);
  sub(Code::Aborted, "Aborted", "abort() was called, or the communicator was revoked.", nullptr);
  sub(Code::Unavailable, "Unavailable", "The store or a peer could not be reached in time; retry or fix the launch.",
      PyExc_ConnectionError);
  sub(Code::Internal, "Internal", "A bug in Strata; please report it.", nullptr);

  set_interrupt_check(&python_interrupted);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise(e);
    }
  });
}

}  // namespace strata::python

#pragma once
// numpy / torch interop for the `_strata` extension: data types both ways, a view of any
// array taking part in a call, arrays that live in a communicator's registered heap, and
// the strata.Error exception family.
//
// torch is never linked here: tensors are inspected through their Python attributes, and
// torch is imported only when a caller asks for a tensor (empty_tensor) or passes one.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <strata/strata.hpp>

#include <functional>
#include <string>
#include <vector>

namespace strata::python {

namespace py = pybind11;

/// Throws strata::Error(InvalidArgument, message): the binding's own argument errors take
/// the same path (and the same Python class) as the library's.
[[noreturn]] void invalid(const std::string& message);
/// Rethrows `e`, the error being handled, naming `rank` when it names none (the binding's own
/// checks do not know it), as the library's errors do.
[[noreturn]] void rethrow_on_rank(const Error& e, int rank);

/// Held by a blocking call of this module around the library's wait (the GIL released): only
/// such a wait, on the main thread, takes the GIL now and then to run Python's signal handlers
/// (Ctrl-C). Other waits (the torch backend's, the copy engine's) never reach for the GIL.
class Interruptible {
 public:
  Interruptible();
  ~Interruptible();
  Interruptible(const Interruptible&) = delete;
  Interruptible& operator=(const Interruptible&) = delete;

 private:
  bool outer_;
};

/// A flag argument (True/False, numpy.bool_) read by the call itself rather than by pybind11, so
/// that a wrong type is an InvalidArgument the call's refusal covers (pybind11 would raise a
/// TypeError before the call, and the peers' matching calls would meet this rank's next one).
bool flag_arg(py::handle h, const std::string& what);
/// An integer argument (int, numpy integers; not bool, not float), likewise.
long long int_arg(py::handle h, const std::string& what);
/// An integer argument that must fit an int (a rank, a tag).
int int32_arg(py::handle h, const std::string& what);

// ---- data types ----------------------------------------------------------------------------

/// The DataType named by `spec`: a string ("float32", "bfloat16", ...), a numpy dtype or
/// scalar type (np.float32), or a torch dtype (torch.bfloat16).
DataType parse_dtype(py::handle spec);
/// numpy dtype of `t`. bfloat16 has none: InvalidArgument pointing at empty_tensor.
py::dtype numpy_dtype(DataType t);
/// torch dtype of `t` (imports torch). uint32/uint64 have none in torch.
py::object torch_dtype(DataType t);

ReduceOp parse_op(py::handle spec);

// ---- arrays --------------------------------------------------------------------------------

/// A C-contiguous numpy array or CPU torch tensor, as the library sees it.
struct ArrayView {
  py::object obj = py::none();  // the array itself (kept alive by async work)
  char* data = nullptr;
  size_t count = 0;  // elements
  DataType dtype = DataType::UInt8;
  bool is_torch = false;
  std::vector<py::ssize_t> shape;
  size_t bytes() const { return count * dtype_size(dtype); }
};

/// Inspects `obj`. `what` names the argument in error messages ("all_reduce: out").
/// InvalidArgument for anything but a C-contiguous numpy array or a strided CPU tensor, for a
/// dtype Strata does not reduce, and for a read-only array when `writable`.
ArrayView view_of(py::handle obj, const std::string& what, bool writable);

/// True when `obj` is a torch.Tensor (without importing torch).
bool is_torch_tensor(py::handle obj);

/// A new array of `shape` and `t` in `comm`'s registered heap; the array's base owns the
/// heap block (freed when the last view of it goes away). `zero` fills it with zeros.
py::array heap_numpy(Communicator& comm, const std::vector<py::ssize_t>& shape, DataType t, bool zero);
/// The same as a torch tensor (torch.from_numpy over a heap array; bfloat16 through int16).
py::object heap_tensor(Communicator& comm, const std::vector<py::ssize_t>& shape, DataType t, bool zero);
/// A heap array like `like` (numpy in, numpy out; tensor in, tensor out).
py::object heap_like(Communicator& comm, const ArrayView& like, const std::vector<py::ssize_t>& shape);

/// Shape from an int or a sequence of ints.
std::vector<py::ssize_t> parse_shape(py::handle spec);

// ---- errors --------------------------------------------------------------------------------

/// Creates strata.Error and its subclasses in `m` and registers the translator from
/// strata::Error (thrown by the library or by the binding) to them.
void register_errors(py::module_& m);

// ---- moe -----------------------------------------------------------------------------------

/// Adds MoeBuffer and MoeDispatch (python/moe.cpp); `comm_of` gets the C++ communicator of a
/// strata.Communicator.
void bind_moe(py::module_& m, std::function<Communicator(py::handle)> comm_of);

}  // namespace strata::python

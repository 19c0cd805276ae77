// Memory of strata.Communicator: numpy arrays and torch tensors in the registered heap (zero-copy
// for collectives) and the registration of external arrays for single-copy (CMA) reads.

#include "bindings.hpp"

namespace strata::python {
namespace {

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

}  // namespace

void bind_registration(py::module_& m) {
  py::class_<PyRegistration>(m, "Registration", "An external array registered for single-copy (CMA) access by peers.")
      .def("close", &PyRegistration::close, "Unregisters the array.")
      .def_property_readonly("active", &PyRegistration::active)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyRegistration& r, py::args) { r.close(); });
}

void bind_memory(CommClass& comm) {
  comm.def(
          "empty",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            PyComm::InUse in_use(s);  // allocates without the GIL
            return heap_numpy(s.comm(), parse_shape(shape), parse_dtype(dtype), false);
          },
          py::arg("shape"), py::arg("dtype") = "float32",
          "A numpy array in the registered heap (contents unspecified): collectives on it are zero-copy.")
      .def(
          "zeros",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            PyComm::InUse in_use(s);  // allocates without the GIL
            return heap_numpy(s.comm(), parse_shape(shape), parse_dtype(dtype), true);
          },
          py::arg("shape"), py::arg("dtype") = "float32", "Like empty(), filled with zeros.")
      .def(
          "empty_tensor",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            PyComm::InUse in_use(s);  // allocates without the GIL
            return heap_tensor(s.comm(), parse_shape(shape), parse_dtype(dtype), false);
          },
          py::arg("shape"), py::arg("dtype") = "float32", "A torch tensor in the registered heap (bfloat16 included).")
      .def(
          "zeros_tensor",
          [](PyComm& s, py::handle shape, py::handle dtype) {
            PyComm::InUse in_use(s);  // allocates without the GIL
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
          "(a context manager) that keeps the array alive until closed.");
}

}  // namespace strata::python

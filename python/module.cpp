// The `_strata` extension: strata.init(), Communicator with every collective over numpy
// arrays and torch tensors (blocking, or async returning a Work), heap-backed arrays, the
// failure-recovery primitives (recover, State) and the rendezvous store server.
// strata/__init__.py re-exports it with the Python-side glue. This file is the module's
// table of contents; bindings.hpp says which file binds what, and how the GIL is handled.

#include <optional>

#include "bindings.hpp"
#include "bootstrap/store.hpp"  // the store server (internal API: the bindings are in-tree)

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
      .value("AVG", ReduceOp::Avg)
      .value("BAND", ReduceOp::BAnd)
      .value("BOR", ReduceOp::BOr)
      .value("BXOR", ReduceOp::BXor);
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

  bind_work(m);
  bind_registration(m);
  bind_communicator(m);
  bind_recovery(m);

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

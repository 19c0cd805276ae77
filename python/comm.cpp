// strata.Communicator and its Work handle: properties, counters, groups (split) and lifetime
// (abort, recover, destroy). Its memory and collective methods come from memory.cpp and
// collectives.cpp.

#include <optional>
#include <thread>

#include "bindings.hpp"

namespace strata::python {
namespace {

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

}  // namespace

void PyComm::prune() {
  while (!pending_.empty() && finished(pending_.front().work)) pending_.pop_front();
  if (pending_.size() > 64) std::erase_if(pending_, [](Pending& p) { return finished(p.work); });
}

void PyComm::drain() noexcept {
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

void PyComm::destroy() {
  if (closing_) return;  // another thread is destroying it
  closing_ = true;
  // A call of another thread is inside the communicator (waiting for its peers, say): fail it
  // now rather than after its deadline, and let it return before what it uses is freed.
  if (in_use_.load(std::memory_order_acquire) > 0 && comm_.valid()) comm_.abort();
  drain();
  py::gil_scoped_release nogil;
  while (in_use_.load(std::memory_order_acquire) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (comm_.valid()) comm_.destroy();
}

void bind_work(py::module_& m) {
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
}

void bind_communicator(py::module_& m) {
  CommClass comm(m, "Communicator", "A group of ranks running collectives together.");
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
          "Counters: ops, staged_bytes, direct_bytes, cma_bytes, temp_bytes.");
  bind_memory(comm);
  bind_collectives(comm);
  // groups and lifetime
  comm.def(
          "split",
          [](PyComm& s, py::handle color_arg, py::handle key_arg) -> std::shared_ptr<PyComm> {
            Communicator& c = s.comm();
            PyComm::InUse in_use(s);
            int color = 0, k = 0;
            try {
              color = int32_arg(color_arg, "split: color");
              k = key_arg.is_none() ? c.rank() : int32_arg(key_arg, "split: key");
            } catch (const Error& e) {
              // Refused, like a collective's bad argument: the peers' split fails naming this
              // rank instead of pairing with this rank's next call.
              detail::refuse_call(s.handle().impl());
              rethrow_on_rank(e, s.handle().rank());
            }
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
              PyComm::InUse in_use(s);
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
}

}  // namespace strata::python

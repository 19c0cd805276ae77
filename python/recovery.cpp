// Failure recovery (C++: strata/recovery.hpp): RecoveryReport, State over numpy arrays and
// torch tensors, and the module functions around them. The step loop, recovery_run, is Python
// code in strata/__init__.py built on these; Communicator.recover is in comm.cpp.

#include <strata/recovery.hpp>

#include "bindings.hpp"
#include "common/env.hpp"  // Env::ft: whether `strata run --ft` started this process

namespace strata::python {
namespace {

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
  // Taken as a Python int, so that a negative or oversized value is named here rather than
  // refused by the argument conversion with a bare TypeError.
  void set_step(const py::int_& s) {
    not_busy("setting step");
    const unsigned long long v = PyLong_AsUnsignedLongLong(s.ptr());
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();  // negative or past 64 bits: say which rather than raise OverflowError
      invalid("State.step must be a whole number from 0 to 2**64 - 1 (completed steps), got " +
              std::string(py::repr(s)));
    }
    state_->step() = v;
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
  d["premapped"] = r.premapped;
  return d;
}

}  // namespace

void bind_recovery(py::module_& m) {
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
      .def_readonly("premapped", &recovery::Report::premapped,
                    "Peers whose memory a hot spare had mapped before it took this rank.")
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
  m.def(
      "under_ft", [] { return Env::get().ft; },
      "True in a process that `strata run --ft` started (a recovery controller replaces failed ranks).");
  m.def("now_ns", &recovery::now_ns, "CLOCK_REALTIME now in nanoseconds: the clock of RecoveryReport.");
}

}  // namespace strata::python

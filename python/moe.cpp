// strata.moe from Python: Buffer(comm, ...).dispatch(x, topk_idx, topk_w, schedule) returns a
// Dispatch whose arrays are views of the receive window (no copy); combine(y, d) reduces the
// expert outputs back to the tokens. numpy arrays or CPU torch tensors (bfloat16: torch only,
// numpy has no such type); results come back as the kind of array x was.

#include <pybind11/stl.h>
#include <optional>

#include <strata/moe.hpp>

#include <memory>

#include "interop.hpp"

namespace strata::python {
namespace {

moe::Schedule parse_schedule(const std::string& s) {
  if (s == "prefill") return moe::Schedule::Prefill;
  if (s == "decode") return moe::Schedule::Decode;
  if (s == "relay") return moe::Schedule::Relay;
  invalid("moe: schedule must be 'prefill', 'decode' or 'relay', not '" + s + "'");
}

struct PyMoeBuffer {
  std::unique_ptr<moe::Buffer> buf;
  moe::Config cfg;
  int rank = -1;  // of the communicator: named in the errors of the binding's own checks
  moe::Buffer& get() {
    if (!buf) invalid("moe.Buffer was closed");
    return *buf;
  }
};

/// Called in the handler of an exception the binding's own checks of a MoE call threw: refuses
/// the call (`refuse`, without the GIL) so that the peers' matching call fails naming this rank,
/// then rethrows, naming it. Not for an Error other than InvalidArgument (the call's failure,
/// not its arguments'): that is rethrown as it is.
template <class F>
[[noreturn]] void refuse_and_rethrow(PyMoeBuffer& b, F&& refuse) {
  try {
    throw;
  } catch (const Error& e) {
    if (e.code() != Code::InvalidArgument) throw;
    {
      py::gil_scoped_release nogil;
      refuse(b.get());
    }
    rethrow_on_rank(e, b.rank);
  } catch (const std::exception&) {  // a Python error while reading an argument
    {
      py::gil_scoped_release nogil;
      refuse(b.get());
    }
    throw;
  }
}

struct PyDispatch {
  moe::Dispatch d;
  py::object owner;  // the PyMoeBuffer: views of the window keep it alive
  bool torch = false;
  DataType dtype = DataType::Float32;

  /// rows x hidden elements at row `first` of the window, as numpy or torch.
  py::object rows(size_t first, std::vector<py::ssize_t> shape) const {
    const size_t es = dtype_size(dtype);
    void* p = d.window ? d.window + first * d.hidden * es : nullptr;
    if (dtype == DataType::BFloat16 || torch) {
      py::module_ torch_mod = py::module_::import("torch");
      py::dtype store = dtype == DataType::BFloat16 ? py::dtype("int16") : numpy_dtype(dtype);
      py::array a(store, shape, p, owner);
      py::object t = torch_mod.attr("from_numpy")(a);
      return dtype == DataType::BFloat16 ? t.attr("view")(torch_dtype(dtype)) : t;
    }
    return py::array(numpy_dtype(dtype), shape, p, owner);
  }
};

ArrayView checked(py::handle a, const std::string& what, DataType want, size_t elems, bool writable) {
  ArrayView v = view_of(a, what, writable);
  if (v.dtype != want) invalid(what + " has dtype " + to_string(v.dtype) + ", expected " + to_string(want));
  if (v.count != elems)
    invalid(what + " has " + std::to_string(v.count) + " elements, expected " + std::to_string(elems));
  return v;
}

}  // namespace

void bind_moe(py::module_& m, std::function<Communicator(py::handle)> comm_of) {
  py::class_<PyDispatch>(m, "MoeDispatch",
                         "Rows received for this rank's experts: views of the moe.Buffer's window, valid until its "
                         "next dispatch.")
      .def_property_readonly("schedule", [](const PyDispatch& s) { return std::string(moe::to_string(s.d.schedule)); })
      .def_property_readonly(
          "masked", [](const PyDispatch& s) { return s.d.masked(); }, "True for the Decode layout [L][R][M][H]")
      .def_property_readonly("local_experts", [](const PyDispatch& s) { return s.d.local_experts; })
      .def_property_readonly(
          "dropped", [](const PyDispatch& s) { return s.d.handle.dropped(); },
          "Per token: selections dropped because their expert's rank failed (mask_failed_ranks); after combine "
          "it also counts those lost to a rank that died before publishing its outputs")
      .def_property_readonly(
          "failed_ranks", [](const PyDispatch& s) { return s.d.failed_ranks; }, "Ranks masked in this dispatch")
      .def_property_readonly(
          "total_rows", [](const PyDispatch& s) { return s.d.total_rows; },
          "Rows of the whole layout (what y must hold)")
      .def(
          "count",
          [](const PyDispatch& s, int l, std::optional<int> src) {
            if (l < 0 || l >= s.d.local_experts) invalid("moe: local expert " + std::to_string(l) + " out of range");
            if (src && (*src < 0 || *src >= s.d.ranks))
              invalid("moe: source rank " + std::to_string(*src) + " out of range");
            return src ? s.d.count(l, *src) : s.d.count(l);
          },
          py::arg("l"), py::arg("src") = py::none(), "Rows for local expert l (from rank src, or all)")
      .def(
          "offset",
          [](const PyDispatch& s, int l, int src) {
            if (l < 0 || l >= s.d.local_experts || src < 0 || src >= s.d.ranks) invalid("moe: (l, src) out of range");
            return s.d.offset(l, src);
          },
          py::arg("l"), py::arg("src") = 0, "First row of expert l's rows from rank src")
      .def_property_readonly(
          "window",
          [](const PyDispatch& s) {
            return s.rows(0, {static_cast<py::ssize_t>(s.d.total_rows), static_cast<py::ssize_t>(s.d.hidden)});
          },
          "The whole layout [total_rows, hidden]; expert outputs may be written here in place")
      .def(
          "expert_x",
          [](const PyDispatch& s, int l) {
            if (l < 0 || l >= s.d.local_experts) invalid("moe: local expert " + std::to_string(l) + " out of range");
            auto H = static_cast<py::ssize_t>(s.d.hidden);
            if (s.d.masked()) return s.rows(s.d.offset(l), {s.d.ranks, static_cast<py::ssize_t>(s.d.max_tokens), H});
            return s.rows(s.d.offset(l), {static_cast<py::ssize_t>(s.d.count(l)), H});
          },
          py::arg("l"), "Expert l's rows: [count(l), hidden] (compact) or [R, max_tokens, hidden] (masked)");

  py::class_<PyMoeBuffer>(m, "MoeBuffer",
                          "Expert-parallel dispatch/combine of one MoE layer (strata::moe::Buffer). Collective.")
      .def(py::init([comm_of](py::handle comm, py::handle num_experts, py::handle hidden, py::handle max_tokens,
                              py::handle topk, py::handle dtype, py::handle expert_alignment,
                              py::handle mask_failed_ranks, py::handle renormalize) {
             auto b = std::make_unique<PyMoeBuffer>();
             Communicator c = comm_of(comm);
             b->rank = c.rank();
             // The constructor is collective: an argument this rank cannot read still joins it,
             // with a config that fails there, so that the peers fail naming this rank instead of
             // waiting for it; this rank raises its own error.
             std::optional<Error> mine;
             try {
               auto size_arg = [](py::handle h, const char* what) {
                 const long long v = int_arg(h, std::string("moe.Buffer: ") + what);
                 if (v < 0) invalid(std::string("moe.Buffer: ") + what + " = " + std::to_string(v) + " is negative");
                 return static_cast<size_t>(v);
               };
               b->cfg = {.num_experts = int32_arg(num_experts, "moe.Buffer: num_experts"),
                         .hidden = size_arg(hidden, "hidden"),
                         .max_tokens = size_arg(max_tokens, "max_tokens"),
                         .topk = int32_arg(topk, "moe.Buffer: topk"),
                         .dtype = parse_dtype(dtype),
                         .expert_alignment = size_arg(expert_alignment, "expert_alignment"),
                         .mask_failed_ranks = flag_arg(mask_failed_ranks, "moe.Buffer: mask_failed_ranks"),
                         .renormalize = flag_arg(renormalize, "moe.Buffer: renormalize")};
             } catch (const Error& e) {
               mine = e;
               b->cfg = moe::Config{};            // num_experts = 0: refused on every rank
             } catch (const std::exception& e) {  // a Python error while reading an argument
               mine = Error(Code::InvalidArgument, std::string("moe.Buffer: ") + e.what());
               b->cfg = moe::Config{};
             }
             try {
               py::gil_scoped_release nogil;
               b->buf = std::make_unique<moe::Buffer>(c, b->cfg);
             } catch (const Error& e) {
               if (mine) rethrow_on_rank(*mine, b->rank);
               throw;
             }
             return b;
           }),
           py::arg("comm"), py::kw_only(), py::arg("num_experts"), py::arg("hidden"), py::arg("max_tokens"),
           py::arg("topk"), py::arg("dtype") = "bfloat16", py::arg("expert_alignment") = 1,
           py::arg("mask_failed_ranks") = false, py::arg("renormalize") = false)
      .def(
          "dispatch",
          [](py::object self, py::handle x, py::handle topk_idx, py::handle topk_w, py::handle schedule) {
            auto& b = self.cast<PyMoeBuffer&>();
            const auto& cfg = b.cfg;
            // A schedule this rank cannot read refuses as the default one, prefill.
            moe::Schedule s = moe::Schedule::Prefill;
            ArrayView xv, iv, wv;
            size_t T = 0;
            try {
              if (!py::isinstance<py::str>(schedule))
                invalid("moe.dispatch: schedule must be 'prefill', 'decode' or 'relay', not " +
                        py::repr(schedule).cast<std::string>());
              s = parse_schedule(schedule.cast<std::string>());
              xv = view_of(x, "moe.dispatch: x", false);
              if (xv.dtype != cfg.dtype)
                invalid("moe.dispatch: x has dtype " + std::string(to_string(xv.dtype)) + ", the buffer was made for " +
                        to_string(cfg.dtype));
              // [T, hidden]; a flat array of T * hidden elements is taken too.
              if (xv.shape.size() > 1 && static_cast<size_t>(xv.shape.back()) != cfg.hidden)
                invalid("moe.dispatch: x has shape " + py::str(x.attr("shape")).cast<std::string>() +
                        ", expected [T, hidden = " + std::to_string(cfg.hidden) + "]");
              if (xv.count % cfg.hidden != 0)
                invalid("moe.dispatch: x has " + std::to_string(xv.count) +
                        " elements, not a multiple of hidden = " + std::to_string(cfg.hidden));
              T = xv.count / cfg.hidden;
              iv = checked(topk_idx, "moe.dispatch: topk_idx", DataType::Int64, T * cfg.topk, false);
              wv = checked(topk_w, "moe.dispatch: topk_w", DataType::Float32, T * cfg.topk, false);
            } catch (const std::exception&) {
              // A call these checks refuse still takes its place, so that the peers fail naming
              // this rank instead of waiting for it (moe::Buffer::refuse_dispatch).
              refuse_and_rethrow(b, [s](moe::Buffer& m) { m.refuse_dispatch(s); });
            }
            PyDispatch out;
            {
              py::gil_scoped_release nogil;
              out.d = b.get().dispatch(xv.data, T, reinterpret_cast<const int64_t*>(iv.data),
                                       reinterpret_cast<const float*>(wv.data), s);
            }
            out.owner = self;
            out.torch = xv.is_torch;
            out.dtype = cfg.dtype;
            return out;
          },
          py::arg("x"), py::arg("topk_idx"), py::arg("topk_w"), py::arg("schedule") = "prefill",
          "x [T, hidden], topk_idx [T, topk] int64 (-1: none), topk_w [T, topk] float32. Returns a MoeDispatch.")
      .def(
          "combine",
          [](PyMoeBuffer& b, py::handle d_obj, py::object y, py::object out) {
            const auto& cfg = b.cfg;
            const auto H = static_cast<py::ssize_t>(cfg.hidden);
            ArrayView yv, ov;
            const PyDispatch* dp = nullptr;
            try {
              if (!py::isinstance<PyDispatch>(d_obj))
                invalid("moe.combine: d must be the MoeDispatch a dispatch of this buffer returned, not " +
                        py::repr(d_obj).cast<std::string>());
              dp = &d_obj.cast<const PyDispatch&>();
              if (y.is_none()) y = dp->rows(0, {static_cast<py::ssize_t>(dp->d.total_rows), H});  // in place
              yv = checked(y, "moe.combine: y", cfg.dtype, view_of(y, "moe.combine: y", false).count, false);
              if (yv.count < dp->d.total_rows * cfg.hidden)
                invalid("moe.combine: y has " + std::to_string(yv.count) +
                        " elements, needs total_rows * hidden = " + std::to_string(dp->d.total_rows * cfg.hidden));
              if (out.is_none()) {
                std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(dp->d.num_tokens), H};
                if (dp->torch || cfg.dtype == DataType::BFloat16) {
                  py::module_ torch = py::module_::import("torch");
                  out = torch.attr("empty")(py::tuple(py::cast(shape)), py::arg("dtype") = torch_dtype(cfg.dtype));
                } else {
                  out = py::array(numpy_dtype(cfg.dtype), shape);
                }
              }
              ov = checked(out, "moe.combine: out", cfg.dtype, dp->d.num_tokens * cfg.hidden, true);
            } catch (const std::exception&) {
              // As in dispatch: the peers' matching combine fails naming this rank.
              refuse_and_rethrow(b, [](moe::Buffer& m) { m.refuse_combine(); });
            }
            {
              py::gil_scoped_release nogil;
              b.get().combine(yv.data, dp->d.handle, ov.data);
            }
            return out;
          },
          py::arg("d"), py::arg("y") = py::none(), py::kw_only(), py::arg("out") = py::none(),
          "out[t] = sum_k w[t,k] * y[slot(t,k)] (float32, rounded once). y: expert outputs in d's layout "
          "(default: d.window, written in place). Returns out [T, hidden].")
      .def(
          "traffic",
          [](PyMoeBuffer& b) {
            const moe::Traffic t = b.get().traffic();
            py::dict d;
            d["dispatch_bytes"] = t.dispatch_bytes;
            d["combine_bytes"] = t.combine_bytes;
            d["record_bytes"] = t.record_bytes;
            d["rows_sent"] = t.rows_sent;
            d["remote_selections"] = t.remote_selections;
            d["calls"] = t.calls;
            return d;
          },
          "What this rank sent to other hosts so far (dict of byte and row counts; zeros within one host).")
      .def(
          "close",
          [](PyMoeBuffer& b) {
            py::gil_scoped_release nogil;
            b.buf.reset();
          },
          "Frees the windows (collective: every rank closes together).");
}

}  // namespace strata::python

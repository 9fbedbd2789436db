// The extension module peertrain._peertrain: Session (session.h) for Python, on anything
// with the buffer protocol that holds float32 in C order (NumPy arrays, the .numpy() view
// of a CPU torch tensor). Inputs are read in place, never copied; each call returns a new
// array. Blocking calls release the GIL while they wait; the non-blocking ones return a
// Handle whose wait(timeout) gives the result. peertrain/__init__.py is the public API.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>

#include "peertrain/core/error.h"
#include "session.h"

namespace py = pybind11;
using peertrain::Error;
using peertrain::ErrorKind;
using peertrain::python::Session;

namespace {

std::unique_ptr<Session> g_session;

Session& session(const char* call) {
  if (!g_session) throw std::runtime_error(std::string("peertrain.") + call + "() called before peertrain.init()");
  return *g_session;
}

// A float32, C-contiguous view of `tensor`, or a TypeError / ValueError naming `call`.
struct FloatView {
  py::buffer_info info;
  std::span<const float> values;
  std::vector<py::ssize_t> shape;
};

FloatView view_of(const py::object& tensor, const char* call) {
  if (!PyObject_CheckBuffer(tensor.ptr()))
    throw py::type_error(
        std::string("peertrain.") + call + "(): expected a NumPy array or another buffer of float32, got " +
        std::string(py::str(py::type::of(tensor).attr("__name__"))) + " (for a torch tensor use peertrain.torch)");
  FloatView v{py::reinterpret_borrow<py::buffer>(tensor).request(), {}, {}};
  if (v.info.format != py::format_descriptor<float>::format())
    throw py::type_error(std::string("peertrain.") + call + "(): peertrain supports float32 tensors; got format '" +
                         v.info.format + "' (convert with .astype(numpy.float32) or .float())");
  py::ssize_t stride = sizeof(float);
  for (py::ssize_t d = v.info.ndim - 1; d >= 0; --d) {
    if (v.info.shape[d] > 1 && v.info.strides[d] != stride)
      throw py::value_error(std::string("peertrain.") + call +
                            "(): the tensor is not contiguous (use numpy.ascontiguousarray or .contiguous())");
    stride *= v.info.shape[d];
  }
  v.values = {static_cast<const float*>(v.info.ptr), static_cast<std::size_t>(v.info.size)};
  v.shape = v.info.shape;
  return v;
}

py::array_t<float> like(const FloatView& v) { return py::array_t<float>(v.shape); }
std::span<float> span_of(py::array_t<float>& a) { return {a.mutable_data(), static_cast<std::size_t>(a.size())}; }

// The result of a non-blocking call: the future, the input kept alive until it is done,
// and the output (None for barrier). A call that reads the input while it runs holds the
// input's buffer export as well: while it is held, an array('f') refuses to grow and a
// NumPy array to resize (BufferError), so the worker never reads freed memory.
class Handle {
 public:
  Handle(std::shared_future<void> done, py::object keep, py::object result,
         std::unique_ptr<py::buffer_info> reading = nullptr)
      : done_(std::move(done)), keep_(std::move(keep)), result_(std::move(result)), reading_(std::move(reading)) {}
  py::object wait(std::optional<double> timeout_s) {
    {
      py::gil_scoped_release release;
      if (timeout_s && done_.wait_for(std::chrono::duration<double>(*timeout_s)) != std::future_status::ready)
        throw Error(ErrorKind::kTimeout, "the call did not finish within " + std::to_string(*timeout_s) + " s");
      done_.wait();
    }
    reading_.reset();  // done: the export is released (with the GIL held)
    done_.get();       // rethrows the call's error
    keep_ = py::none();
    return result_;
  }
  bool done() const { return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  // A handle dropped unwaited waits: the call still reads the input and writes the output.
  ~Handle() {
    if (done_.valid() && !done()) {
      py::gil_scoped_release release;
      done_.wait();
    }
    reading_.reset();  // after the wait, and with the GIL held again
  }
  Handle(Handle&&) = default;

 private:
  std::shared_future<void> done_;
  py::object keep_, result_;
  std::unique_ptr<py::buffer_info> reading_;
};

// Runs `call` on the session's worker, waiting without the GIL.
void run_blocking(std::shared_future<void> done) {
  {
    py::gil_scoped_release release;
    done.wait();
  }
  done.get();
}

std::shared_future<void> submit_neighbor_allreduce(const FloatView& v, py::array_t<float>& out,
                                                   std::optional<double> self_weight,
                                                   std::optional<std::map<int, double>> src_weights) {
  Session& s = session("neighbor_allreduce");
  const auto in = v.values;
  const auto target = span_of(out);
  return s.submit(
      [&s, in, target, self_weight, src_weights] { s.neighbor_allreduce(in, target, self_weight, src_weights); });
}

}  // namespace

PYBIND11_MODULE(_peertrain, m) {
  m.doc() = "peertrain's peer runtime for Python (see the package peertrain)";
  static py::exception<Error> base(m, "Error", PyExc_RuntimeError);
  static py::exception<Error> lost(m, "PeerLostError", base.ptr());
  static py::exception<Error> timeout(m, "TimeoutError", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      switch (e.kind()) {
        case ErrorKind::kPeerLost:
          PyErr_SetString(lost.ptr(), e.what());
          break;
        case ErrorKind::kTimeout:
          PyErr_SetString(timeout.ptr(), e.what());
          break;
        case ErrorKind::kInvalidArgument:
        case ErrorKind::kParse:
          PyErr_SetString(PyExc_ValueError, e.what());
          break;
        default:
          PyErr_SetString(base.ptr(), e.what());
      }
    }
  });

  m.def(
      "init",
      [](const std::string& topology, int rank, const std::string& secret_file, double peer_timeout,
         double connect_timeout) {
        if (g_session)
          throw std::runtime_error(
              "peertrain.init() was already called in this process (call peertrain.shutdown() first)");
        py::gil_scoped_release release;
        g_session = std::make_unique<Session>(
            peertrain::python::SessionOptions{topology, rank, secret_file, peer_timeout, connect_timeout});
      },
      py::arg("topology"), py::arg("rank"), py::arg("secret_file") = "", py::arg("peer_timeout") = 60.0,
      py::arg("connect_timeout") = 60.0);
  m.def("is_initialized", [] { return g_session != nullptr; });
  m.def("shutdown", [] {
    if (!g_session) return;
    py::gil_scoped_release release;
    g_session.reset();
  });
  m.def("rank", [] { return session("rank").rank(); });
  m.def("size", [] { return session("size").size(); });
  m.def("neighbors", [] { return session("neighbors").neighbors(); });
  m.def("mixing_weights", [] {
    Session& s = session("mixing_weights");
    return std::make_pair(s.self_weight(), s.neighbor_weights());
  });
  m.def("spectral_gap", [] { return session("spectral_gap").spectral_gap(); });
  m.def("mixing_matrix", [] {
    // W as a dense n×n array (W(0) for a time-varying topology): the oracle for tests.
    const auto& w = session("mixing_matrix").topology().mixing;
    py::array_t<double> out({w.rows(), w.cols()});
    auto a = out.mutable_unchecked<2>();
    for (py::ssize_t i = 0; i < w.rows(); ++i)
      for (py::ssize_t j = 0; j < w.cols(); ++j) a(i, j) = 0;
    for (int k = 0; k < w.outerSize(); ++k)
      for (peertrain::topology::SparseMatrix::InnerIterator it(w, k); it; ++it) a(it.row(), it.col()) = it.value();
    return out;
  });
  m.def("lost_peers", [] { return session("lost_peers").lost(); });

  py::class_<Handle>(m, "Handle", "A non-blocking call: wait(timeout=None) returns its result or raises its error.")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none())
      .def("done", &Handle::done);

  m.def(
      "neighbor_allreduce",
      [](const py::object& tensor, std::optional<double> self_weight,
         std::optional<std::map<int, double>> src_weights) {
        const FloatView v = view_of(tensor, "neighbor_allreduce");
        py::array_t<float> out = like(v);
        run_blocking(submit_neighbor_allreduce(v, out, self_weight, std::move(src_weights)));
        return out;
      },
      py::arg("tensor"), py::arg("self_weight") = py::none(), py::arg("src_weights") = py::none());
  m.def(
      "neighbor_allreduce_nonblocking",
      [](const py::object& tensor, std::optional<double> self_weight,
         std::optional<std::map<int, double>> src_weights) {
        FloatView v = view_of(tensor, "neighbor_allreduce_nonblocking");
        py::array_t<float> out = like(v);
        auto done = submit_neighbor_allreduce(v, out, self_weight, std::move(src_weights));
        // The worker reads v.values until it is done: the export goes with the handle.
        return Handle(std::move(done), tensor, out, std::make_unique<py::buffer_info>(std::move(v.info)));
      },
      py::arg("tensor"), py::arg("self_weight") = py::none(), py::arg("src_weights") = py::none());

  auto allreduce = [](const py::object& tensor, bool average, const char* name) {
    const FloatView v = view_of(tensor, name);
    py::array_t<float> out = like(v);
    std::copy(v.values.begin(), v.values.end(), out.mutable_data());
    Session& s = session(name);
    const auto target = span_of(out);
    return std::make_pair(s.submit([&s, target, average] { s.allreduce(target, average); }), out);
  };
  m.def(
      "allreduce",
      [allreduce](const py::object& tensor, bool average) {
        auto [done, out] = allreduce(tensor, average, "allreduce");
        run_blocking(done);
        return out;
      },
      py::arg("tensor"), py::arg("average") = true);
  m.def(
      "allreduce_nonblocking",
      [allreduce](const py::object& tensor, bool average) {
        auto [done, out] = allreduce(tensor, average, "allreduce_nonblocking");
        return Handle(done, tensor, out);
      },
      py::arg("tensor"), py::arg("average") = true);

  auto broadcast = [](const py::object& tensor, int root, const char* name) {
    const FloatView v = view_of(tensor, name);
    py::array_t<float> out = like(v);
    std::copy(v.values.begin(), v.values.end(), out.mutable_data());
    Session& s = session(name);
    const auto target = span_of(out);
    return std::make_pair(s.submit([&s, target, root] { s.broadcast(target, root); }), out);
  };
  m.def(
      "broadcast",
      [broadcast](const py::object& tensor, int root) {
        auto [done, out] = broadcast(tensor, root, "broadcast");
        run_blocking(done);
        return out;
      },
      py::arg("tensor"), py::arg("root"));
  m.def(
      "broadcast_nonblocking",
      [broadcast](const py::object& tensor, int root) {
        auto [done, out] = broadcast(tensor, root, "broadcast_nonblocking");
        return Handle(done, tensor, out);
      },
      py::arg("tensor"), py::arg("root"));
  m.def("barrier", [] {
    Session& s = session("barrier");
    run_blocking(s.submit([&s] { s.barrier(); }));
  });
  m.def(
      "consensus_distance",
      [](const py::object& tensor) {
        const FloatView v = view_of(tensor, "consensus_distance");
        Session& s = session("consensus_distance");
        double result = 0;
        const auto in = v.values;
        run_blocking(s.submit([&s, in, &result] { result = s.consensus_distance(in); }));
        return result;
      },
      py::arg("tensor"));
}

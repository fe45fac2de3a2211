// The Engine's Python bindings, shared by ringcomm._core (host transports)
// and ringcomm._cuda (device transports): each module compiles the engine and
// registers these classes as module-local types, so the two never clash and
// the Python layer drives both through the same methods.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine.h"
#include "inproc_transport.h"
#include "py_errors.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;


// Owns an Engine; close() stops it deterministically (before MPI_Finalize).
// Shared, so that a collective running on another thread when close() is
// called keeps the engine alive until it returns (the last owner destroys it).
struct EngineHandle {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<InprocWorld> world, world2;  // keep in-process worlds alive
  Engine& get() { return *shared(); }
  std::shared_ptr<Engine> shared() {
    std::shared_ptr<Engine> e = engine;
    if (!e) throw_invalid("communicator is closed");
    return e;
  }
};

inline Task make_task(int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root, int algo) {
  Task t;
  t.algo = algo;
  t.coll = Coll(coll);
  t.in = reinterpret_cast<const void*>(in);
  t.out = reinterpret_cast<void*>(out);
  t.count = count;
  t.dtype = DType(dtype);
  t.op = Op(op);
  t.root = root;
  return t;
}

// The in-process world, opaque to Python.
struct WorldHandle {
  std::shared_ptr<InprocWorld> world;
};

inline Options make_options(double timeout, size_t segment_bytes, int window) {
  Options o;
  o.timeout_s = timeout;
  o.segment_bytes = segment_bytes;
  o.window = window;
  if (!(timeout > 0)) throw_invalid("timeout must be positive");
  if (segment_bytes == 0 || segment_bytes > (size_t(1) << 30))
    throw_invalid("segment_bytes must be between 1 and 2**30");
  if (window < 2) throw_invalid("window must be at least 2");
  return o;
}


// Registers Work, Tracer, InprocWorld, Engine and inproc_world() in `m`.
inline void bind_engine(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work", py::module_local())
      .def("wait", &Work::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>(),
           "Block (GIL released) until complete or timeout; True when complete.")
      .def("is_completed", &Work::is_completed)
      .def_property_readonly("on_device", [](Work& w) { return bool(w.device()); })
      .def("synchronize",
           [](Work& w, double timeout) {
             EventPtr e = w.done_event();
             if (!e) return true;
             auto deadline = timeout < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                              std::chrono::duration<double>(timeout));
             return e->synchronize(deadline);
           },
           py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>(),
           "Device collectives: block until the result is ready on the device (after wait()); False on timeout.")
      .def("wait_stream",
           [](Work& w, uintptr_t stream) {
             if (EventPtr e = w.done_event()) w.device()->wait_external(stream, e);
           },
           py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
           "Device collectives: make `stream` wait for the result (after wait()); no host blocking.")
      .def_property_readonly("seq", &Work::seq)
      .def("error", [](Work& w) -> py::object {
        const RingError* e = w.error();
        if (!e) return py::none();
        return error_object(*e);
      });

  py::class_<Tracer, std::shared_ptr<Tracer>>(m, "Tracer", py::module_local())
      .def(py::init<bool>(), py::arg("values") = false)
      .def("take",
           [](Tracer& t) {
             py::list out;
             for (const TraceStep& s : t.take()) {
               py::dict d;
               d["seq"] = s.seq;
               d["collective"] = coll_name(Coll(s.coll));
               d["dtype"] = dtype_name(DType(s.dtype));
               d["phase"] = s.phase;
               d["step"] = s.step;
               d["rank"] = s.rank;
               d["send_peer"] = s.send_peer;
               d["send_chunk"] = s.send_chunk;
               d["send_bytes"] = s.send_bytes;
               d["recv_peer"] = s.recv_peer;
               d["recv_chunk"] = s.recv_chunk;
               d["recv_bytes"] = s.recv_bytes;
               d["t_start_ns"] = s.t_start_ns;
               d["t_end_ns"] = s.t_end_ns;
               d["values"] = py::bytes(s.values.data(), s.values.size());
               out.append(d);
             }
             return out;
           },
           "Recorded steps so far, as dicts (and forget them).");

  py::class_<WorldHandle>(m, "InprocWorld", py::module_local());
  m.def("inproc_world", [](int n) { return WorldHandle{make_inproc_world(n)}; }, py::arg("nranks"));

  py::class_<EngineHandle>(m, "Engine", py::module_local())
      .def_property_readonly("rank", [](EngineHandle& h) { return h.get().rank(); })
      .def_property_readonly("size", [](EngineHandle& h) { return h.get().size(); })
      .def_property_readonly("transport", [](EngineHandle& h) { return h.get().transport_name(); })
      .def_property_readonly("closed", [](EngineHandle& h) { return !h.engine; })
      .def("submit",
           [](EngineHandle& h, int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root,
              int algo, uintptr_t stream) {
             Engine& e = h.get();
             Task t = make_task(coll, in, out, count, dtype, op, root, algo);
             if (auto dev = e.device()) t.after = dev->record_external(stream);
             return e.submit(t);
           },
           py::arg("coll"), py::arg("in_ptr"), py::arg("out_ptr"), py::arg("count"), py::arg("dtype"),
           py::arg("op"), py::arg("root"), py::arg("algo") = 0, py::arg("stream") = 0,
           "Queue a collective; returns its Work. Device engines: it starts after the work queued so far on "
           "`stream` (the caller's, as an integer handle).")
      .def("run",
           [](EngineHandle& h, int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root,
              int algo) {
             Task t = make_task(coll, in, out, count, dtype, op, root, algo);
             std::shared_ptr<Engine> e = h.shared();
             // Device collectives must keep their arrays until the device is
             // done with them, which only a Work can track: use submit().
             if (e->device()) throw_invalid("run() is for host engines; device engines use submit()");
             std::shared_ptr<Work> w;
             {
               py::gil_scoped_release nogil;
               w = e->run_sync(t);
               e.reset();  // if close() ran meanwhile, the engine is destroyed here, without the GIL
             }
             if (const RingError* err = w->error()) throw *err;
           },
           py::arg("coll"), py::arg("in_ptr"), py::arg("out_ptr"), py::arg("count"), py::arg("dtype"),
           py::arg("op"), py::arg("root"), py::arg("algo") = 0,
           "Run a host collective to completion (on this thread when the engine is idle); raises on failure.")
      .def_property_readonly("device",
                             [](EngineHandle& h) -> py::object {
                               auto d = h.get().device();
                               if (!d) return py::none();
                               return py::str(d->name());
                             },
                             "Name of the device payload lives on (None: host memory).")
      .def("make_tracer", [](EngineHandle&, bool values) { return std::make_shared<Tracer>(values); },
           py::arg("values") = false, "A step tracer of this module's type, for set_tracer().")
      .def("traffic",
           [](EngineHandle& h) {
             auto cells = h.get().ledger().snapshot();
             const int n = h.get().size();
             py::array_t<uint64_t> a({int(Coll::kCount), n, 2, 4});
             auto v = a.mutable_unchecked<4>();
             for (int c = 0; c < int(Coll::kCount); ++c)
               for (int p = 0; p < n; ++p)
                 for (int k = 0; k < 2; ++k) {
                   const Counters& x = cells[(size_t(c) * n + p) * 2 + k];
                   v(c, p, k, 0) = x.bytes_sent;
                   v(c, p, k, 1) = x.msgs_sent;
                   v(c, p, k, 2) = x.bytes_recv;
                   v(c, p, k, 3) = x.msgs_recv;
                 }
             return a;
           },
           "Ledger as uint64[collective, peer, (payload, control), (bytes_sent, msgs_sent, bytes_recv, msgs_recv)]")
      .def("abort", [](EngineHandle& h) { return h.get().abort(); })
      .def("check_peers",
           [](EngineHandle& h) -> py::object {
             std::unique_ptr<RingError> e;
             {
               py::gil_scoped_release nogil;
               e = h.get().check_peers();
             }
             if (!e) return py::none();
             return error_object(*e);
           },
           "Device engines: the failure a peer reported since the last collective, else None.")
      .def("set_tracer", [](EngineHandle& h, std::shared_ptr<Tracer> t) { h.get().set_tracer(std::move(t)); },
           py::arg("tracer").none(true))
      .def("reset_traffic", [](EngineHandle& h) { h.get().ledger().reset(); })
      .def("set_segment_bytes", [](EngineHandle& h, size_t b) { h.get().set_segment_bytes(b); })
      .def("set_timeout", [](EngineHandle& h, double s) { h.get().set_timeout(s); })
      .def_property_readonly("segment_bytes", [](EngineHandle& h) { return h.get().options().segment_bytes; })
      .def_property_readonly("timeout", [](EngineHandle& h) { return h.get().options().timeout_s; })
      .def_property_readonly("aborted", [](EngineHandle& h) { return h.get().aborted(); })
      .def_property_readonly("abort_reason", [](EngineHandle& h) { return h.get().abort_reason(); })
      .def("close",
           [](EngineHandle& h) {
             std::shared_ptr<Engine> e = std::move(h.engine);
             py::gil_scoped_release nogil;
             e.reset();  // drains queued work and joins the worker, unless a collective still runs
           },
           "Finish queued collectives and stop the worker thread.");

}

}  // namespace bind
}  // namespace ringcomm

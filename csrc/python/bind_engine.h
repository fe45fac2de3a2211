// The Engine's Python bindings, shared by ringcomm._core (host transports)
// and ringcomm._cuda (device transports): each module compiles the engine and
// registers these classes as module-local types, so the two never clash and
// the Python layer drives both through the same methods. bind_engine() is
// the list of areas, each registered by its own header: calls
// (bind_calls.h), records (bind_records.h), point-to-point (bind_p2p.h),
// shared memory (bind_shm.h); the engine's own state here. What they hold
// and how they wait: handles.h; the conversions: converters.h; Ctrl-C:
// signals.h; errors: py_errors.h. Engines are made by the transport table
// (bind_transports.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/bind_calls.h"
#include "python/bind_p2p.h"
#include "python/bind_records.h"
#include "python/bind_shm.h"
#include "python/handles.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// The Engine's identity, deadlines, abort and close.
inline void def_engine_state(py::class_<EngineHandle>& engine) {
  engine
      .def_property_readonly("rank", [](EngineHandle& h) { return h.get().rank(); })
      .def_property_readonly("size", [](EngineHandle& h) { return h.get().size(); })
      .def_property_readonly("transport", [](EngineHandle& h) { return h.get().transport_name(); })
      .def_property_readonly("closed", [](EngineHandle& h) { return !h.engine; })
      .def_property_readonly("device",
                             [](EngineHandle& h) -> py::object {
                               auto d = h.get().device();
                               if (!d) return py::none();
                               return py::str(d->name());
                             },
                             "Name of the device payload lives on (None: host memory).")
      .def("abort", [](EngineHandle& h, bool by_interrupt) { return h.get().abort(by_interrupt); },
           py::arg("by_interrupt") = false)
      .def_property_readonly("running_here", [](EngineHandle& h) { return h.engine && h.engine->running_here(); },
                             "A collective runs inline on this thread (abort() must not wait then).")
      .def("set_peers",
           [](EngineHandle& h, std::vector<EngineHandle*> peers) {
             // In-process: a timeout names what the peer it waited for is doing.
             std::vector<std::weak_ptr<Engine>> ws;
             for (EngineHandle* p : peers) ws.push_back(p ? p->engine : nullptr);
             h.get().set_peer_state([ws](int r) -> std::string {
               if (r < 0 || size_t(r) >= ws.size()) return "";
               if (auto e = ws[size_t(r)].lock()) return e->flight_summary();
               return "its communicator is closed";
             });
           },
           "In-process worlds: the engines of every rank, in rank order.")
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
      .def("set_segment_bytes", [](EngineHandle& h, size_t b) { h.get().set_segment_bytes(b); })
      .def("set_timeout", [](EngineHandle& h, double s) { h.get().set_timeout(s); })
      .def("set_auto_limits",
           [](EngineHandle& h, size_t rd, size_t hd, size_t reduce) { h.get().set_auto_limits(rd, hd, reduce); },
           py::arg("rd_max"), py::arg("hd_max"), py::arg("reduce_max") = 0)
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

// Registers every area's types and functions, and the Engine, in `m`.
inline void bind_engine(py::module_& m) {
  bind_runtime(m);
  bind_calls(m);
  bind_records(m);
  py::class_<WorldHandle>(m, "InprocWorld", py::module_local());
  m.def("inproc_world", [](int n) { return WorldHandle{make_inproc_world(n)}; }, py::arg("nranks"));
  bind_shm(m);
  bind_p2p(m);
  py::class_<EngineHandle> engine(m, "Engine", py::module_local());
  def_engine_p2p(engine);
  def_engine_state(engine);
  def_engine_calls(engine);
  def_engine_records(engine);
  def_engine_windows(engine);
}

}  // namespace bind
}  // namespace ringcomm

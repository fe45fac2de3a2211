// Registration of what an engine records: the step tracer, the traffic
// ledger, the flight recorder and the last algorithm that ran (records out:
// converters.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/handles.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

inline void bind_records(py::module_& m) {
  py::class_<Tracer, std::shared_ptr<Tracer>>(m, "Tracer", py::module_local())
      .def(py::init<bool>(), py::arg("values") = false)
      .def("take",
           [](Tracer& t) { return trace_list(t.take()); },
           "Recorded steps so far, as dicts (and forget them).");
}

// The Engine's records: tracer, ledger, flight recorder, last algorithm.
inline void def_engine_records(py::class_<EngineHandle>& engine) {
  engine
      .def("make_tracer", [](EngineHandle&, bool values) { return std::make_shared<Tracer>(values); },
           py::arg("values") = false, "A step tracer of this module's type, for set_tracer().")
      .def("set_tracer", [](EngineHandle& h, std::shared_ptr<Tracer> t) { h.get().set_tracer(std::move(t)); },
           py::arg("tracer").none(true))
      .def("traffic",
           [](EngineHandle& h) { return traffic_array(h.get().ledger().snapshot(), h.get().size()); },
           "Ledger as uint64[collective, peer, (payload, control), (bytes_sent, msgs_sent, bytes_recv, msgs_recv)]")
      .def("reset_traffic", [](EngineHandle& h) { h.get().ledger().reset(); })
      .def("flight_record", [](EngineHandle& h) { return flight_list(h.get().flight_record()); },
           "The last K collectives, oldest first, as dicts (see ringcomm.Communicator.flight_record).")
      .def("flight_summary", [](EngineHandle& h) { return h.get().flight_summary(); })
      .def("set_flight_records", [](EngineHandle& h, size_t k) { h.get().set_flight_records(k); })
      .def("last_algorithm", [](EngineHandle& h) { return std::string(algo_name(Algo(h.get().last_algo()))); });
}

}  // namespace bind
}  // namespace ringcomm

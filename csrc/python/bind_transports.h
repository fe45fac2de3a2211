// The transport table: every way this module makes an engine, one row
// each (transport name, the factory Python calls, what the transport can
// do), registered by bind_transports() and exported as transports(). A
// factory keeps its own Python signature (ringcomm/ passes what its launch
// needs: an MPI communicator, worker addresses from a store, an in-process
// world); what every factory shares, the options and the engine made with
// the GIL released, is engine_over() (handles.h).
//
// Adding a transport: its files in transports/ (found by the build), one
// def_*_engine function and one row below (host_transports(); a device
// transport in bind_cuda.h's device_transports()).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "python/handles.h"
#include "transports/inproc_transport.h"
#include "transports/mpi_transport.h"
#include "transports/stream_emu.h"
#include "transports/ucx_api.h"
#include "transports/ucx_transport.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// What a transport can do, as its row says.
struct TransportCaps {
  const char* launch;   // how its ranks meet: "mpi" (an MPI communicator), "store" (addresses a
                        // launcher's store handed out), "threads" (ranks of one process)
  const char* payload;  // where its payload may live: "host", "emulated" (stream_emu.h), "cuda"
  bool between_hosts;   // whether its ranks may be on several hosts
};

// One row: `define` registers the factory under the name `factory`.
struct TransportRow {
  const char* transport;  // what Engine.transport of its engines starts with
  const char* factory;
  TransportCaps caps;
  void (*define)(py::module_& m, const char* factory);
};

// Registers every row's factory, and transports(): the table as dicts.
inline void bind_transports(py::module_& m, std::vector<TransportRow> rows) {
  for (const TransportRow& row : rows) row.define(m, row.factory);
  m.def("transports",
        [rows] {
          py::list table;
          for (const TransportRow& row : rows) {
            py::dict d;
            d["transport"] = row.transport;
            d["factory"] = row.factory;
            d["launch"] = row.caps.launch;
            d["payload"] = row.caps.payload;
            d["between_hosts"] = row.caps.between_hosts;
            table.append(std::move(d));
          }
          return table;
        },
        "The transport table: per way of making an engine, the transport, its factory in this module, how its "
        "ranks meet (launch), where payload may live and whether ranks may be on several hosts.");
}

// ---- the host transports' factories -----------------------------------------

inline void def_mpi_engine(py::module_& m, const char* name) {
  m.def(name,
        [](uintptr_t comm_handle, double timeout, size_t segment_bytes, int window) {
          // (MPI_Comm_dup is collective: made without the GIL)
          return engine_over(make_options(timeout, segment_bytes, window),
                             [&] { return make_mpi_transport(comm_handle); });
        },
        py::arg("comm_handle"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"));
}

inline void def_inproc_engine(py::module_& m, const char* name) {
  m.def(name,
        [](const WorldHandle& world, int rank, double timeout, size_t segment_bytes, int window, bool emulate_device,
           double jitter_us, const WorldHandle* grouped_payload) {
          const Options o = make_options(timeout, segment_bytes, window);
          std::unique_ptr<EngineHandle> h;
          if (grouped_payload) {
            h = engine_over(o, [&] {
              return make_emulated_grouped_transport(world.world, grouped_payload->world, rank, jitter_us);
            });
            h->world2 = grouped_payload->world;
          } else {
            h = engine_over(o, [&] {
              std::shared_ptr<Device> dev = emulate_device ? make_emulated_device(rank, jitter_us) : nullptr;
              return make_inproc_transport(world.world, rank, dev);
            });
          }
          h->world = world.world;
          return h;
        },
        py::arg("world"), py::arg("rank"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"),
        py::arg("emulate_device") = false, py::arg("jitter_us") = 0.0, py::arg("grouped_payload") = nullptr,
        "An in-process rank; with emulate_device, its payload path is the emulated device (stream_emu.h); with "
        "grouped_payload (a second world), the emulated NCCL transport.");
}

inline void def_ucx_engine(py::module_& m, const char* name) {
  m.def(name,
        [](UcxWorkerHandle& worker, std::vector<std::string> addresses, int rank, double timeout,
           size_t segment_bytes, int window) {
          const Options o = make_options(timeout, segment_bytes, window);
          std::shared_ptr<UcxWorker> w = worker.take();
          return engine_over(o, [&] { return make_ucx_transport(std::move(w), addresses, rank); });
        },
        py::arg("worker"), py::arg("addresses"), py::arg("rank"), py::arg("timeout"), py::arg("segment_bytes"),
        py::arg("window"), "An engine over UCX; addresses[r] is rank r's worker address.");
}

inline void def_ucx_emulated_nccl_engine(py::module_& m, const char* name) {
  m.def(name,
        [](UcxWorkerHandle& control, std::vector<std::string> control_addresses, UcxWorkerHandle& payload,
           std::vector<std::string> payload_addresses, int rank, double timeout, size_t segment_bytes, int window,
           double jitter_us) {
          const Options o = make_options(timeout, segment_bytes, window);
          std::shared_ptr<UcxWorker> c = control.take(), p = payload.take();
          return engine_over(o, [&] {
            return make_emulated_grouped_transport(make_ucx_transport(std::move(c), control_addresses, rank),
                                                   make_ucx_transport(std::move(p), payload_addresses, rank), rank,
                                                   jitter_us, timeout);
          });
        },
        py::arg("control"), py::arg("control_addresses"), py::arg("payload"), py::arg("payload_addresses"),
        py::arg("rank"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"), py::arg("jitter_us") = 0.0,
        "The NCCL transport's store launch with the emulated device: control messages over UCX (`control`'s "
        "worker), the payload in NCCL-like groups on the emulated device's transfer queue over a second UCX "
        "worker (`payload`).");
}

// The rows both modules have: UCX (its engines need no MPI launch).
inline std::vector<TransportRow> ucx_transports() {
  return {
      {"ucx", "ucx_engine", {"store", "host", true}, def_ucx_engine},
      {"grouped", "ucx_emulated_nccl_engine", {"store", "emulated", true}, def_ucx_emulated_nccl_engine},
  };
}

// ringcomm._core's table.
inline std::vector<TransportRow> host_transports() {
  std::vector<TransportRow> rows = {
      {"mpi", "mpi_engine", {"mpi", "host", true}, def_mpi_engine},
      {"inproc", "inproc_engine", {"threads", "host or emulated", false}, def_inproc_engine},
  };
  for (const TransportRow& row : ucx_transports()) rows.push_back(row);
  return rows;
}

// UCX the library, in both modules: the worker (made before the addresses
// are swapped) and what `ringcomm info` asks.
inline void bind_ucx(py::module_& m) {
  py::class_<UcxWorkerHandle>(m, "UcxWorker", py::module_local())
      .def_property_readonly("address",
                             [](const UcxWorkerHandle& h) {
                               if (!h.worker) throw_invalid("this UCX worker was already given to an engine");
                               return py::bytes(ucx_worker_address(*h.worker));
                             },
                             "This worker's address, to give every peer on this host (bytes).")
      .def_property_readonly("net_address",
                             [](const UcxWorkerHandle& h) {
                               if (!h.worker) throw_invalid("this UCX worker was already given to an engine");
                               return py::bytes(ucx_worker_address(*h.worker, true));
                             },
                             "Its network devices' address alone, to give the peers on other hosts (bytes): "
                             "they reach this worker over the network, never through shared memory.");
  m.def("ucx_worker", [] { return UcxWorkerHandle{make_ucx_worker()}; },
        "A UCP context and worker (UCX loaded on first use; raises TransportError when it cannot be).");
  m.def("ucx_in_process", &ucx::in_process, "Whether a libucp.so.0 is already loaded in this process.");
  m.def("ucx_version", &ucx_version, "UCX's version string (raises TransportError when UCX cannot be loaded).");
}

}  // namespace bind
}  // namespace ringcomm

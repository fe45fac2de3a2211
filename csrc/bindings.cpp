// pybind11 bindings of ringcomm._core. Thin by design: convert arguments,
// release the GIL around anything that may block, translate errors into the
// exception classes of ringcomm.errors. The documented API is in Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "engine.h"
#include "py_errors.h"
#include "inproc_transport.h"
#include "mpi_transport.h"
#include "plan.h"
#include "reducer.h"

namespace py = pybind11;
using namespace ringcomm;

namespace {


// Owns an Engine; close() stops it deterministically (before MPI_Finalize).
// Shared, so that a collective running on another thread when close() is
// called keeps the engine alive until it returns (the last owner destroys it).
struct EngineHandle {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<InprocWorld> world;  // keeps an in-process world alive
  Engine& get() { return *shared(); }
  std::shared_ptr<Engine> shared() {
    std::shared_ptr<Engine> e = engine;
    if (!e) throw_invalid("communicator is closed");
    return e;
  }
};

Task make_task(int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root, int algo) {
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

Options make_options(double timeout, size_t segment_bytes, int window) {
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

// ---- DLPack (the ABI is fixed by the standard; only what we read) -------
struct DLDevice { int32_t device_type, device_id; };
struct DLDataType { uint8_t code, bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor { DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*); };
struct DLPackVersion { uint32_t major, minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;

// Reads a DLPack capsule without consuming it: the caller keeps the capsule
// alive while the memory is in use, and its destructor frees the tensor.
py::dict dlpack_info(py::capsule cap) {
  const char* name = cap.name();
  const DLTensor* t = nullptr;
  bool readonly = false;
  if (name && std::strcmp(name, "dltensor") == 0) {
    t = &static_cast<DLManagedTensor*>(cap.get_pointer())->dl_tensor;
  } else if (name && std::strcmp(name, "dltensor_versioned") == 0) {
    auto* v = static_cast<DLManagedTensorVersioned*>(cap.get_pointer());
    if (v->version.major != 1) throw_invalid("unsupported DLPack major version " + std::to_string(v->version.major));
    t = &v->dl_tensor;
    readonly = (v->flags & kDLFlagReadOnly) != 0;
  } else {
    throw_invalid("not a DLPack capsule (or one already consumed)");
  }
  py::dict d;
  d["ptr"] = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  d["device_type"] = t->device.device_type;
  d["device_id"] = t->device.device_id;
  d["code"] = int(t->dtype.code);
  d["bits"] = int(t->dtype.bits);
  d["lanes"] = int(t->dtype.lanes);
  py::list shape, strides;
  for (int i = 0; i < t->ndim; ++i) shape.append(t->shape[i]);
  d["shape"] = py::tuple(shape);
  if (t->strides) {
    for (int i = 0; i < t->ndim; ++i) strides.append(t->strides[i]);
    d["strides"] = py::tuple(strides);
  } else {
    d["strides"] = py::none();
  }
  d["readonly"] = readonly;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "ringcomm native core (private; use the ringcomm package)";

  register_error_translator();

  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &Work::wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>(),
           "Block (GIL released) until complete or timeout; True when complete.")
      .def("is_completed", &Work::is_completed)
      .def_property_readonly("seq", &Work::seq)
      .def("error", [](Work& w) -> py::object {
        const RingError* e = w.error();
        if (!e) return py::none();
        return error_object(*e);
      });

  py::class_<Tracer, std::shared_ptr<Tracer>>(m, "Tracer")
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

  py::class_<WorldHandle>(m, "InprocWorld");
  m.def("inproc_world", [](int n) { return WorldHandle{make_inproc_world(n)}; }, py::arg("nranks"));

  py::class_<EngineHandle>(m, "Engine")
      .def_property_readonly("rank", [](EngineHandle& h) { return h.get().rank(); })
      .def_property_readonly("size", [](EngineHandle& h) { return h.get().size(); })
      .def_property_readonly("transport", [](EngineHandle& h) { return h.get().transport_name(); })
      .def_property_readonly("closed", [](EngineHandle& h) { return !h.engine; })
      .def("submit",
           [](EngineHandle& h, int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root,
              int algo) { return h.get().submit(make_task(coll, in, out, count, dtype, op, root, algo)); },
           py::arg("coll"), py::arg("in_ptr"), py::arg("out_ptr"), py::arg("count"), py::arg("dtype"),
           py::arg("op"), py::arg("root"), py::arg("algo") = 0, "Queue a collective; returns its Work.")
      .def("run",
           [](EngineHandle& h, int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root,
              int algo) {
             Task t = make_task(coll, in, out, count, dtype, op, root, algo);
             std::shared_ptr<Engine> e = h.shared();
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
           "Run a collective to completion (on this thread when the engine is idle); raises on failure.")
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

  m.def("mpi_engine",
        [](uintptr_t comm_handle, double timeout, size_t segment_bytes, int window) {
          Options o = make_options(timeout, segment_bytes, window);
          auto h = std::make_unique<EngineHandle>();
          {
            py::gil_scoped_release nogil;  // MPI_Comm_dup is collective
            h->engine = std::make_shared<Engine>(make_mpi_transport(comm_handle), o);
          }
          return h;
        },
        py::arg("comm_handle"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"));

  m.def("inproc_engine",
        [](const WorldHandle& world, int rank, double timeout, size_t segment_bytes, int window) {
          Options o = make_options(timeout, segment_bytes, window);
          auto h = std::make_unique<EngineHandle>();
          h->engine = std::make_shared<Engine>(make_inproc_transport(world.world, rank), o);
          h->world = world.world;
          return h;
        },
        py::arg("world"), py::arg("rank"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"));

  // Address of a C-contiguous buffer (numpy arrays included), or None when
  // the object cannot export one cheaply; ~10x faster than __array_interface__.
  m.def("address", [](py::handle obj) -> py::object {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      return py::none();
    }
    uintptr_t p = reinterpret_cast<uintptr_t>(view.buf);
    PyBuffer_Release(&view);
    return py::int_(p);
  });
  m.def("mpi_library_version", &mpi_library_version);
  m.def("dlpack_info", &dlpack_info, py::arg("capsule"));

  m.def("ring_plan",
        [](size_t count, int n, size_t elem_size, size_t segment_bytes) {
          RingPlan p(count, n, elem_size, segment_bytes);
          py::list chunks, segs;
          for (int c = 0; c < n; ++c) {
            chunks.append(py::make_tuple(p.chunk_begin(c), p.chunk_count(c)));
            py::list s;
            for (int k = 0; k < p.segments(); ++k) s.append(py::make_tuple(p.seg_begin(c, k), p.seg_count(c, k)));
            segs.append(s);
          }
          py::list rs, ag;
          for (int r = 0; r < n; ++r) {
            py::list a, b;
            for (int s = 0; s + 1 < n; ++s) {
              a.append(py::make_tuple(p.rs_send_chunk(r, s), p.rs_recv_chunk(r, s)));
              b.append(py::make_tuple(p.ag_send_chunk(r, s), p.ag_recv_chunk(r, s)));
            }
            rs.append(a);
            ag.append(b);
          }
          py::dict d;
          d["segments"] = p.segments();
          d["chunks"] = chunks;
          d["segment_spans"] = segs;
          d["reduce_scatter_schedule"] = rs;
          d["all_gather_schedule"] = ag;
          return d;
        },
        py::arg("count"), py::arg("nranks"), py::arg("elem_size"), py::arg("segment_bytes"),
        "The ring plan as plain data (for tests and teaching).");

  // Raw-pointer entry points of the host reducer, for tests (bfloat16 has no
  // buffer-protocol format, so arrays are passed as addresses).
  m.def("reduce",
        [](int dtype, int op, uintptr_t dst, uintptr_t a, uintptr_t b, size_t count) {
          auto red = make_cpu_reducer(DType(dtype), Op(op));
          py::gil_scoped_release nogil;
          red->reduce(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(a),
                      reinterpret_cast<const void*>(b), count);
        },
        py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"),
        "dst = a (op) b elementwise with the host reducer (for tests).");
  m.def("finalize",
        [](int dtype, int op, uintptr_t buf, size_t count, int nranks) {
          make_cpu_reducer(DType(dtype), Op(op))->finalize(reinterpret_cast<void*>(buf), count, nranks);
        },
        py::arg("dtype"), py::arg("op"), py::arg("buf"), py::arg("count"), py::arg("nranks"),
        "Apply the op's final step (avg: divide by nranks) in place (for tests).");
}

// ringcomm._core's own functions beside the engine: array addresses and
// DLPack capsules read natively, the MPI library's version, the ring plan as
// plain data and the host reducer's raw entry points (for tests and
// teaching).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "algorithms/plan.h"
#include "core/reducer.h"
#include "python/handles.h"
#include "transports/mpi_transport.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

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
inline py::dict dlpack_info(py::capsule cap) {
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

// The ring plan as plain data.
inline py::dict ring_plan_dict(size_t count, int n, size_t elem_size, size_t segment_bytes) {
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
}

inline void bind_host(py::module_& m) {
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
  m.attr("MAX_ELEMENTS") = py::int_(kMaxElements);
  m.def("mpi_library_version", &mpi_library_version);
  m.def("dlpack_info", &dlpack_info, py::arg("capsule"));

  m.def("ring_plan", &ring_plan_dict,
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

}  // namespace bind
}  // namespace ringcomm

// ringcomm._cuda's part beside the engine: its device transports' rows of
// the transport table (bind_transports.h), NCCL's own collectives as a
// baseline, the reduction kernels' raw entry points, and what `ringcomm
// info` and the tests ask about the machine. Importing the module needs
// neither a GPU nor a driver: cudart is linked statically and queried lazily.
#pragma once

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "cuda/checks.h"
#include "cuda/device_cuda.h"
#include "cuda/reducer_cuda.h"
#include "cuda/vector_split.h"
#include "python/bind_transports.h"
#include "transports/cuda/nccl_transport.h"
#include "transports/inproc_transport.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

inline ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u32: return ncclUint32;
    case DType::u64: return ncclUint64;
    default: throw_invalid(std::string("NCCL has no type for ") + dtype_name(d) + " (the baseline only; ringcomm's own kernels take it)");
  }
}

inline ncclRedOp_t nccl_op(Op op) {
  switch (op) {
    case Op::sum: return ncclSum;
    case Op::prod: return ncclProd;
    case Op::min: return ncclMin;
    case Op::max: return ncclMax;
    case Op::avg: return ncclAvg;
    default: throw_invalid(std::string("NCCL has no op '") + op_name(op) + "'");
  }
}

// NCCL's own collectives on a communicator of their own: the baseline the
// benchmark compares the ring against (never used by ringcomm's engines).
class NcclBaseline {
 public:
  NcclBaseline(uintptr_t comm_handle, int gpu) : gpu_(gpu), comm_(nccl_comm_init(comm_handle, gpu)) {}
  ~NcclBaseline() { close(); }
  void close() {
    if (!comm_) return;
    DeviceGuard g(gpu_, std::nothrow);
    ncclCommFinalize(comm_);
    ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  ncclComm_t get() {
    if (!comm_) throw_invalid("NCCL baseline communicator is closed");
    return comm_;
  }
  int gpu() const { return gpu_; }

 private:
  int gpu_;
  ncclComm_t comm_ = nullptr;
};

// The GPU that owns device memory at `ptr`; the current one for an empty array's null pointer.
inline int device_of(uintptr_t ptr) {
  cudaPointerAttributes a;
  if (ptr && cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(ptr)) == cudaSuccess &&
      (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged))
    return a.device;
  cudaGetLastError();
  int cur = 0;
  RC_CUDA(cudaGetDevice(&cur));
  return cur;
}

// ---- the device transports' factories ---------------------------------------

inline void def_nccl_engine(py::module_& m, const char* name) {
  m.def(name,
        [](uintptr_t comm_handle, int gpu, double timeout, size_t segment_bytes, int window) {
          // (collective over the MPI communicator: made without the GIL)
          return engine_over(make_options(timeout, segment_bytes, window),
                             [&] { return make_nccl_transport(comm_handle, gpu); });
        },
        py::arg("comm_handle"), py::arg("gpu"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"),
        "This process's rank of a ring over NCCL point-to-point on GPU `gpu` (collective over the MPI comm).");
}

inline void def_nccl_engine_ucx(py::module_& m, const char* name) {
  m.def(name,
        [](UcxWorkerHandle& worker, std::vector<std::string> addresses, int rank, int gpu, std::string unique_id,
           double timeout, size_t segment_bytes, int window) {
          const Options o = make_options(timeout, segment_bytes, window);
          std::shared_ptr<UcxWorker> w = worker.take();
          // (collective: ncclCommInitRank waits for every rank)
          return engine_over(o, [&] {
            return make_nccl_transport(make_ucx_transport(std::move(w), addresses, rank), gpu, unique_id);
          });
        },
        py::arg("worker"), py::arg("addresses"), py::arg("rank"), py::arg("gpu"), py::arg("unique_id"),
        py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"),
        "A ring over NCCL point-to-point on GPU `gpu` without MPI: control messages over UCX (addresses[r]: rank "
        "r's worker address), the NCCL communicator joined with `unique_id` (every rank the same).");
}

// Direct copies between different GPUs where the hardware allows (else
// CUDA stages them through the host).
inline void enable_peer_access(const std::vector<int>& gpus) {
  for (int a : gpus)
    for (int b : gpus) {
      int ok = 0;
      if (a != b && cudaDeviceCanAccessPeer(&ok, a, b) == cudaSuccess && ok) {
        DeviceGuard g(a);
        cudaDeviceEnablePeerAccess(b, 0);
      }
      cudaGetLastError();  // "already enabled" is fine
    }
}

inline void def_inproc_gpu_engines(py::module_& m, const char* name) {
  m.def(name,
        [](const std::vector<int>& gpus, double timeout, size_t segment_bytes, int window) {
          Options o = make_options(timeout, segment_bytes, window);
          const int n = int(gpus.size());
          auto world = make_inproc_world(n);
          enable_peer_access(gpus);
          std::vector<std::unique_ptr<EngineHandle>> out;
          for (int r = 0; r < n; ++r) {
            auto h = std::make_unique<EngineHandle>();
            h->engine = std::make_shared<Engine>(
                make_inproc_transport(world, r, std::make_shared<CudaDevice>(gpus[size_t(r)])), o);
            h->world = world;
            out.push_back(std::move(h));
          }
          return out;
        },
        py::arg("gpus"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"),
        "In-process ranks, rank r on GPU gpus[r] (several ranks may share a GPU).");
}

// ringcomm._cuda's table: UCX's rows (as in _core), then the device transports.
inline std::vector<TransportRow> device_transports() {
  std::vector<TransportRow> rows = ucx_transports();
  rows.push_back({"nccl", "nccl_engine", {"mpi", "cuda", true}, def_nccl_engine});
  rows.push_back({"nccl", "nccl_engine_ucx", {"store", "cuda", true}, def_nccl_engine_ucx});
  rows.push_back({"inproc", "inproc_engines", {"threads", "cuda", false}, def_inproc_gpu_engines});
  return rows;
}

// ---- NCCL: its unique id, its own collectives (the baseline), its version

inline void bind_nccl(py::module_& m) {
  m.def("nccl_unique_id", [] { return py::bytes(nccl_unique_id()); }, "A new NCCL unique id (bytes).");
  py::class_<NcclBaseline>(m, "NcclBaseline")
      .def(py::init([](uintptr_t comm_handle, int gpu) {
             py::gil_scoped_release nogil;
             return std::make_unique<NcclBaseline>(comm_handle, gpu);
           }),
           py::arg("comm_handle"), py::arg("gpu"))
      .def("all_reduce",
           [](NcclBaseline& b, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, uintptr_t stream) {
             DeviceGuard g(b.gpu());
             RC_NCCL(ncclAllReduce(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), count,
                                   nccl_type(DType(dtype)), nccl_op(Op(op)), b.get(), external_stream(stream)));
           },
           py::arg("in_ptr"), py::arg("out_ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"),
           py::arg("stream") = 0)
      .def("reduce_scatter",
           [](NcclBaseline& b, uintptr_t in, uintptr_t out, size_t recvcount, int dtype, int op, uintptr_t stream) {
             DeviceGuard g(b.gpu());
             RC_NCCL(ncclReduceScatter(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), recvcount,
                                       nccl_type(DType(dtype)), nccl_op(Op(op)), b.get(), external_stream(stream)));
           },
           py::arg("in_ptr"), py::arg("out_ptr"), py::arg("recvcount"), py::arg("dtype"), py::arg("op"),
           py::arg("stream") = 0, "NCCL's equal-chunk reduce-scatter (count = recvcount * nranks).")
      .def("all_gather",
           [](NcclBaseline& b, uintptr_t in, uintptr_t out, size_t sendcount, int dtype, uintptr_t stream) {
             DeviceGuard g(b.gpu());
             RC_NCCL(ncclAllGather(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), sendcount,
                                   nccl_type(DType(dtype)), b.get(), external_stream(stream)));
           },
           py::arg("in_ptr"), py::arg("out_ptr"), py::arg("sendcount"), py::arg("dtype"), py::arg("stream") = 0)
      .def("close", &NcclBaseline::close);
  m.def("nccl_version", [] {
    int v = 0;
    if (!nccl_available()) return 0;  // loaded at run time (nccl_api.h): 0 = not found
    RC_NCCL(ncclGetVersion(&v));
    return v;
  });
  m.def("nccl_missing", [] {
    std::string why;
    return nccl_available(&why) ? std::string() : why;
  }, "Why libnccl.so.2 cannot be loaded (empty if it can).");
}

// ---- the device: GPUs, the runtime, the kernels' raw entry points ----------

inline void bind_device(py::module_& m) {
  m.def("vector_split", [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t n, size_t elem) {
    VectorSplit s = vector_split(dst, a, b, n, elem);
    return py::make_tuple(s.head, s.words, s.tail);
  }, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("n"), py::arg("elem"),
     "How the kernels split n elements at these addresses: (scalar head, 16-byte words, scalar tail).");
  m.def("set_device", [](int gpu) { RC_CUDA(cudaSetDevice(gpu)); }, py::arg("gpu"),
        "Make `gpu` the calling thread's current device (what cupy and torch allocate on).");
  m.def("pointer_device", [](uintptr_t ptr) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(ptr)) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
  }, py::arg("ptr"), "GPU that owns device memory at `ptr`, or -1 for host memory.");

  m.def("device_count", [] {
    int n = 0;
    // No driver or no device is not an error here: it means "no GPU".
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  });
  m.def("device_error", [] {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    cudaGetLastError();
    return std::string(rc == cudaSuccess ? "" : cudaGetErrorString(rc));
  }, "Why device_count() is 0, in the runtime's words (empty if it is not).");
  m.def("runtime_version", [] {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
  });
  m.def("reduce",
        [](int dtype, int op, uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, uintptr_t stream) {
          DeviceGuard g(device_of(dst));  // the kernel runs on the GPU that owns dst, whatever is current
          auto red = make_cuda_reducer(DType(dtype), Op(op), reinterpret_cast<cudaStream_t>(stream));
          red->reduce(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(a),
                      reinterpret_cast<const void*>(b), count);
        },
        py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"),
        py::arg("stream") = 0, "Enqueue dst = a (op) b on `stream` (device pointers).");
  m.def("finalize",
        [](int dtype, int op, uintptr_t buf, size_t count, int nranks, uintptr_t stream) {
          DeviceGuard g(device_of(buf));
          make_cuda_reducer(DType(dtype), Op(op), reinterpret_cast<cudaStream_t>(stream))
              ->finalize(reinterpret_cast<void*>(buf), count, nranks);
        },
        py::arg("dtype"), py::arg("op"), py::arg("buf"), py::arg("count"), py::arg("nranks"),
        py::arg("stream") = 0, "Enqueue the op's final step (avg: divide by nranks).");
  m.def("synchronize", [](uintptr_t stream) {
    py::gil_scoped_release nogil;
    RC_CUDA(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  }, py::arg("stream") = 0);
}

}  // namespace bind
}  // namespace ringcomm

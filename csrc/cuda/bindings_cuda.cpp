// pybind11 bindings of ringcomm._cuda: the device side that exists so far
// (the reduction kernels), plus what `ringcomm info` and the tests need to
// know about the machine. Importing this module needs neither a GPU nor a
// driver: cudart is linked statically and queried lazily.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pybind11/pybind11.h>

#include "../py_errors.h"
#include "checks.h"
#include "reducer_cuda.h"

namespace py = pybind11;
using namespace ringcomm;

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "ringcomm device core (private; use ringcomm.cuda)";
  register_error_translator();

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
  m.def("nccl_version", [] {
    int v = 0;
    RC_NCCL(ncclGetVersion(&v));
    return v;
  });
  m.def("reduce",
        [](int dtype, int op, uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, uintptr_t stream) {
          auto red = make_cuda_reducer(DType(dtype), Op(op), reinterpret_cast<cudaStream_t>(stream));
          red->reduce(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(a),
                      reinterpret_cast<const void*>(b), count);
        },
        py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"),
        py::arg("stream") = 0, "Enqueue dst = a (op) b on `stream` (device pointers).");
  m.def("finalize",
        [](int dtype, int op, uintptr_t buf, size_t count, int nranks, uintptr_t stream) {
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

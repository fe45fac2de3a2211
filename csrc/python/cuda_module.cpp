// pybind11 bindings of ringcomm._cuda: engines whose payload lives on GPUs
// (in-process ranks on one or more GPUs, NCCL across processes), NCCL's own
// collectives as a baseline, the reduction kernels, and what `ringcomm info`
// and the tests need to know about the machine. Importing this module needs
// neither a GPU nor a driver: cudart is linked statically and queried lazily.
#include <pybind11/pybind11.h>

#include "python/bind_cuda.h"
#include "python/bind_algorithms.h"
#include "python/bind_engine.h"
#include "python/bind_transports.h"

using namespace ringcomm;
using namespace ringcomm::bind;

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "ringcomm device core (private; use ringcomm.cuda)";
  register_error_translator();
  bind_engine(m);
  bind_algorithms(m);
  bind_ucx(m);
  bind_transports(m, device_transports());
  bind_nccl(m);
  bind_device(m);
}

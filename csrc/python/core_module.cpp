// pybind11 bindings of ringcomm._core. Thin by design: convert arguments,
// release the GIL around anything that may block, translate errors into the
// exception classes of ringcomm.errors. The documented API is in Python.
#include <pybind11/pybind11.h>

#include "python/bind_algorithms.h"
#include "python/bind_engine.h"
#include "python/bind_host.h"
#include "python/bind_transports.h"

using namespace ringcomm;
using namespace ringcomm::bind;

PYBIND11_MODULE(_core, m) {
  m.doc() = "ringcomm native core (private; use the ringcomm package)";
  register_error_translator();
  bind_engine(m);
  bind_algorithms(m);
  bind_ucx(m);
  bind_transports(m, host_transports());
  bind_host(m);
}

// RingError -> the matching exception class of ringcomm.errors, for every
// pybind11 module of the package (_core and _cuda).
#pragma once

#include <pybind11/pybind11.h>

#include "core/vocabulary.h"

namespace ringcomm {

inline pybind11::object error_object(const RingError& e) {
  return pybind11::module_::import("ringcomm.errors")
      .attr("_from_native")(int(e.kind), e.what(), e.rank, e.peer, e.seq, e.origin, int(e.cause));
}

inline void register_error_translator() {
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const RingError& e) {
      pybind11::object err = error_object(e);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    }
  });
}

}  // namespace ringcomm

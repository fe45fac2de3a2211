// RingError -> the matching exception class of ringcomm.errors, for every
// pybind11 module of the package (_core and _cuda).
#pragma once

#include <pybind11/pybind11.h>

#include "core/quarantine.h"
#include "core/vocabulary.h"

namespace ringcomm {

inline pybind11::object error_object(const RingError& e) {
  return pybind11::module_::import("ringcomm.errors")
      .attr("_from_native")(int(e.kind), e.what(), e.rank, e.peer, e.seq, e.origin, int(e.cause));
}

// A failed collective's error as a Python exception; with `hold` (requests
// that outlived it may still use the caller's arrays) attached as `_hold`,
// for ringcomm.comm to keep those arrays alive.
inline pybind11::object failure_object(const RingError& e, std::shared_ptr<Hold> hold) {
  pybind11::object err = error_object(e);
  if (hold && hold->pending.load() > 0) err.attr("_hold") = pybind11::cast(hold);
  return err;
}

[[noreturn]] inline void raise_object(pybind11::object err) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw pybind11::error_already_set();
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

// Ctrl-C for waits that run with the GIL released (the engine's bindings).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>

#include "core/quarantine.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// Ctrl-C while a collective waits with the GIL released: Python's C signal
// handler only sets a flag, which PyErr_CheckSignals() turns into the
// KeyboardInterrupt (running the Python-level handler). Waits poll this
// every 100 ms (Link::wait_for, Engine::wait_interruptible); the exception
// is kept and raised once the collective has failed and the ring was told.
// Only the main thread runs Python signal handlers, so other threads get no
// check at all.
struct SignalCheck {
  bool fired = false;
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  std::function<bool()> fn;
  SignalCheck() {
    fn = [this] {
      if (fired) return true;
      py::gil_scoped_acquire g;
      if (PyErr_CheckSignals() == 0) return false;
      PyErr_Fetch(&type, &value, &tb);
      fired = true;
      return true;
    };
  }
  ~SignalCheck() {  // never raised (it cannot happen, but leak nothing)
    if (type || value || tb) {
      py::gil_scoped_acquire g;
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
    }
  }
  // With the GIL held: raise the kept exception; with `hold` (requests of
  // the interrupted collective still in flight) attached as `_hold`, like a
  // RingcommError, so the Python layer keeps the arrays they use.
  [[noreturn]] void raise(std::shared_ptr<Hold> hold = nullptr) {
    PyErr_NormalizeException(&type, &value, &tb);
    if (hold && hold->pending.load() > 0 && value) {
      py::object v = py::reinterpret_borrow<py::object>(value);
      try {
        v.attr("_hold") = py::cast(hold);
      } catch (const py::error_already_set&) {
      }
    }
    PyErr_Restore(type, value, tb);
    type = value = tb = nullptr;
    throw py::error_already_set();
  }
};

// Python's main thread (threading.main_thread().ident, set at import by
// ringcomm._native): the only one that runs signal handlers.
inline unsigned long& main_thread_ident() {
  static unsigned long ident = PyThread_get_thread_ident();
  return ident;
}
inline bool on_main_thread() { return PyThread_get_thread_ident() == main_thread_ident(); }

}  // namespace bind
}  // namespace ringcomm

// What the bindings hold and how they wait, shared by every registration
// header (bind_*.h) of both modules: the engine's handle, the in-process
// world's, an arena block, a UCX worker before an engine takes it over; a
// host collective run to completion and the point-to-point waits, Ctrl-C
// polled on the main thread (signals.h), failures raised (py_errors.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <utility>

#include "core/shm_window.h"
#include "engine/engine.h"
#include "engine/p2p.h"
#include "python/converters.h"
#include "python/py_errors.h"
#include "python/signals.h"
#include "transports/inproc_transport.h"
#include "transports/ucx_api.h"
#include "transports/ucx_transport.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// Owns an Engine; close() stops it deterministically (before MPI_Finalize).
// Shared, so that a collective running on another thread when close() is
// called keeps the engine alive until it returns (the last owner destroys it).
struct EngineHandle {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<InprocWorld> world, world2;  // keep in-process worlds alive
  Engine& get() { return *shared(); }
  std::shared_ptr<Engine> shared() {
    std::shared_ptr<Engine> e = engine;
    if (!e) throw_invalid("communicator is closed");
    return e;
  }
};

// The in-process world, opaque to Python.
struct WorldHandle {
  std::shared_ptr<InprocWorld> world;
};

// An engine over the transport `make_transport()` returns, made with the GIL
// released: joining a transport may be collective (MPI_Comm_dup,
// ncclCommInitRank, the in-process world's ranks meeting). The options are
// made by the caller first, so that a bad one raises before anything (a UCX
// worker, say) is taken.
template <class MakeTransport>
std::unique_ptr<EngineHandle> engine_over(const Options& o, MakeTransport make_transport) {
  auto h = std::make_unique<EngineHandle>();
  py::gil_scoped_release nogil;
  h->engine = std::make_shared<Engine>(make_transport(), o);
  return h;
}

// Run a host collective to completion (on this thread when the engine is
// idle), polling Ctrl-C on the main thread; raises the failure.
inline void call_host(EngineHandle& h, const Task& t) {
  std::shared_ptr<Engine> e = h.shared();
  // Device collectives must keep their arrays until the device is
  // done with them, which only a Work can track: use submit().
  if (e->device()) throw_invalid("run() is for host engines; device engines use submit()");
  std::shared_ptr<Work> w;
  if (on_main_thread()) {
    SignalCheck check;
    {
      py::gil_scoped_release nogil;
      w = e->submit_and_wait(t, &check.fn);
      e.reset();  // if close() ran meanwhile, the engine is destroyed here, without the GIL
    }
    if (check.fired) check.raise(w->hold());  // the communicator is aborted and the ring told
  } else {
    py::gil_scoped_release nogil;
    w = e->submit_and_wait(t);
    e.reset();
  }
  if (const RingError* err = w->error()) raise_object(failure_object(*err, w->hold()));
}

// Wait for a point-to-point op (GIL released), Ctrl-C checked on the main
// thread; raises its failure. Returns true once complete.
inline bool wait_p2p(P2POp& op, double timeout) {
  bool done;
  if (on_main_thread()) {
    SignalCheck check;
    bool fired = false;
    {
      py::gil_scoped_release nogil;
      done = op.wait(timeout, &check.fn, &fired);
    }
    if (fired) check.raise(op.hold());
  } else {
    py::gil_scoped_release nogil;
    done = op.wait(timeout);
  }
  if (done)
    if (const RingError* err = op.error()) raise_object(failure_object(*err, op.hold()));
  return done;
}

// Wait for a sendrecv's ops, the receive first, then raise: a Ctrl-C
// either wait caught, else the first failure. A failure of one aborts the
// communicator, which ends the other's wait within 100 ms. The error raised
// carries, as `_hold`, the claims of the ops whose requests are still in
// flight (a tuple: quarantine.keep holds both arrays while any is).
inline int wait_sendrecv(SendRecv& sr) {
  std::exception_ptr raise;
  bool ctrl_c = false;
  std::vector<std::shared_ptr<Hold>> holds;
  for (P2POp* op : {sr.recv.get(), sr.send.get()}) {
    if (!op) continue;
    try {
      wait_p2p(*op, -1.0);
    } catch (py::error_already_set& e) {
      const bool interrupt = e.matches(PyExc_KeyboardInterrupt);
      if (!raise || (interrupt && !ctrl_c)) raise = std::current_exception();
      ctrl_c = ctrl_c || interrupt;
    } catch (...) {
      if (!raise) raise = std::current_exception();
    }
    if (auto h = op->hold(); h && h->pending.load() > 0) holds.push_back(std::move(h));
  }
  if (!raise) raise = sr.error;
  if (sr.hold) holds.push_back(sr.hold);
  if (!raise) return sr.recv ? sr.recv->source() : sr.source;
  if (holds.empty()) std::rethrow_exception(raise);
  py::object err;
  try {
    std::rethrow_exception(raise);
  } catch (py::error_already_set& e) {
    err = e.value();
  } catch (const RingError& e) {
    err = error_object(e);
  } catch (const std::exception& e) {  // (a device error in a wait: no RingcommError, but arrays in use)
    err = py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what());
  }
  err.attr("_hold") = py::tuple(py::cast(holds));
  raise_object(err);
}

// A block of the shared arena, as Python's arrays view it (comm.empty).
struct ArenaBlock {
  ArenaBlock(std::shared_ptr<ShmWindow> w, size_t off, size_t n) : window(std::move(w)), offset(off), bytes(n) {}
  ~ArenaBlock() { window->arena_free(offset); }
  std::shared_ptr<ShmWindow> window;  // keeps the mapping alive while an array views it
  size_t offset, bytes;
};

// A UCP context and worker waiting for its peers' addresses; an engine
// takes it over (the handle is empty afterwards).
struct UcxWorkerHandle {
  std::shared_ptr<UcxWorker> worker;
  std::shared_ptr<UcxWorker> take() {
    if (!worker) throw_invalid("this UCX worker was already given to an engine");
    return std::move(worker);
  }
};

}  // namespace bind
}  // namespace ringcomm

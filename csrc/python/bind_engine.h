// The Engine's Python bindings, shared by ringcomm._core (host transports)
// and ringcomm._cuda (device transports): each module compiles the engine and
// registers these classes as module-local types, so the two never clash and
// the Python layer drives both through the same methods. This file is the
// registration list; the conversions are in converters.h, Ctrl-C in
// signals.h, errors in py_errors.h.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/quarantine.h"
#include "engine/engine.h"
#include "engine/p2p.h"
#include "transports/shm_segment.h"
#include "python/converters.h"
#include "python/py_errors.h"
#include "python/signals.h"
#include "transports/inproc_transport.h"
#include "transports/stream_emu.h"
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

// Registers Work, Tracer, InprocWorld, Engine and inproc_world() in `m`.
inline void bind_engine(py::module_& m) {
  m.def("set_main_thread", [](unsigned long ident) { main_thread_ident() = ident; }, py::arg("ident"));
  m.def("quarantined", [] { return Quarantine::instance().reap(); },
        "Requests of failed collectives still in flight (after releasing those that completed).");
  m.def("quarantine_drain", [](double seconds) { return Quarantine::instance().drain(seconds); },
        py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
        "Release completed quarantined requests until none is left or `seconds` pass; returns how many remain.");
  m.def("leak", [](py::object o) { o.inc_ref(); },
        "Keep `o` alive until the process ends (arrays a request still in flight may use at exit).");
  py::class_<Call>(m, "Call", py::module_local(),
                   "One collective call as the engine takes it (ringcomm/door.py fills it).")
      .def(py::init([](int coll, int dtype, int op, int algo, uintptr_t in, uintptr_t out, size_t count, int root,
                       std::vector<int64_t> counts, std::vector<int64_t> out_counts,
                       std::vector<uintptr_t> in_places, std::vector<uintptr_t> out_places) {
             Call c{coll, dtype, op, algo, in, out, count, root, {}, {}, {}, {}};
             c.counts = std::move(counts);
             c.out_counts = std::move(out_counts);
             c.in_places = std::move(in_places);
             c.out_places = std::move(out_places);
             return c;
           }),
           py::arg("coll"), py::arg("dtype"), py::arg("op"), py::arg("algo"), py::arg("in_ptr"),
           py::arg("out_ptr"), py::arg("count"), py::arg("root"), py::arg("counts") = std::vector<int64_t>(),
           py::arg("out_counts") = std::vector<int64_t>(), py::arg("in_places") = std::vector<uintptr_t>(),
           py::arg("out_places") = std::vector<uintptr_t>())
      .def_readonly("coll", &Call::coll)
      .def_readonly("dtype", &Call::dtype)
      .def_readonly("op", &Call::op)
      .def_readonly("algo", &Call::algo)
      .def_readonly("in_ptr", &Call::in)
      .def_readonly("out_ptr", &Call::out)
      .def_readonly("count", &Call::count)
      .def_readonly("root", &Call::root)
      .def_readonly("counts", &Call::counts)
      .def_readonly("out_counts", &Call::out_counts)
      .def_readonly("in_places", &Call::in_places)
      .def_readonly("out_places", &Call::out_places);
  m.def("register_vocab",
        [](py::dict ops, py::dict algorithms) {
          vocab_tables().ops = ops;
          vocab_tables().algorithms = algorithms;
        },
        py::arg("ops"), py::arg("algorithms"),
        "Let the fast lanes take op and algorithm names: ringcomm.vocab's OPS and ALGORITHMS.");
  m.def("register_torch",
        [](py::object tensor_type, py::dict codes) {
          torch_types().tensor = tensor_type;
          torch_types().codes = codes;
        },
        py::arg("tensor_type"), py::arg("codes"),
        "Let the fast lane take torch CPU tensors: torch.Tensor and {torch.dtype: DType code}.");
  py::class_<Hold, std::shared_ptr<Hold>>(m, "Hold", py::module_local())
      .def_property_readonly("pending", [](Hold& h) { return h.pending.load(); },
                             "Quarantined requests of a failed collective that may still use its caller's arrays.");

  py::class_<Work, std::shared_ptr<Work>>(m, "Work", py::module_local())
      .def("wait",
           [](Work& w, double timeout, EngineHandle* h) {
             // On the main thread, with the engine: interruptible (Ctrl-C
             // aborts the communicator, then raises KeyboardInterrupt).
             if (!h || !h->engine || !on_main_thread()) {
               py::gil_scoped_release nogil;
               return w.wait(timeout);
             }
             std::shared_ptr<Engine> e = h->engine;
             SignalCheck check;
             bool fired = false, done;
             {
               py::gil_scoped_release nogil;
               done = e->wait_interruptible(w, timeout, check.fn, &fired);
               e.reset();
             }
             if (fired) check.raise(w.hold());
             return done;
           },
           py::arg("timeout") = -1.0, py::arg("engine") = nullptr,
           "Block (GIL released) until complete or timeout; True when complete. With `engine`, on the main "
           "thread: Ctrl-C aborts that communicator and raises KeyboardInterrupt.")
      .def("hold", &Work::hold, "After a failure: the Hold on the caller's arrays, or None.")
      .def("is_completed", &Work::is_completed)
      .def_property_readonly("on_device", [](Work& w) { return bool(w.device()); })
      .def("synchronize",
           [](Work& w, double timeout) {
             EventPtr e = w.done_event();
             if (!e) return true;
             auto deadline = timeout < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                              std::chrono::duration<double>(timeout));
             return e->synchronize(deadline);
           },
           py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>(),
           "Device collectives: block until the result is ready on the device (after wait()); False on timeout.")
      .def("wait_stream",
           [](Work& w, uintptr_t stream) {
             if (EventPtr e = w.done_event()) w.device()->wait_external(stream, e);
           },
           py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
           "Device collectives: make `stream` wait for the result (after wait()); no host blocking.")
      .def_property_readonly("seq", &Work::seq)
      .def("error", [](Work& w) -> py::object {
        const RingError* e = w.error();
        if (!e) return py::none();
        return error_object(*e);
      });

  py::class_<Tracer, std::shared_ptr<Tracer>>(m, "Tracer", py::module_local())
      .def(py::init<bool>(), py::arg("values") = false)
      .def("take",
           [](Tracer& t) { return trace_list(t.take()); },
           "Recorded steps so far, as dicts (and forget them).");

  py::class_<WorldHandle>(m, "InprocWorld", py::module_local());
  m.def("inproc_world", [](int n) { return WorldHandle{make_inproc_world(n)}; }, py::arg("nranks"));
  py::class_<ArenaBlock, std::shared_ptr<ArenaBlock>>(m, "ArenaBlock", py::buffer_protocol(), py::module_local(),
                                                      "A block of this rank's part of the shared arena; freed "
                                                      "when the last array viewing it is gone.")
      .def_buffer([](ArenaBlock& b) {
        return py::buffer_info(b.window->arena(b.window->rank()) + b.offset, 1, "B", 1, {py::ssize_t(b.bytes)}, {1});
      })
      .def_readonly("offset", &ArenaBlock::offset)
      .def_readonly("nbytes", &ArenaBlock::bytes);
  py::class_<ShmWindow, std::shared_ptr<ShmWindow>>(m, "ShmWindow", py::module_local(),
                                                    "A shared-memory window of the ranks of one host.")
      .def_property_readonly("rank", &ShmWindow::rank)
      .def_property_readonly("size", &ShmWindow::size)
      .def_property_readonly("slot_bytes", &ShmWindow::slot_bytes)
      .def_property_readonly("label", &ShmWindow::label)
      .def_property("single_copy_min", &ShmWindow::single_copy_min, &ShmWindow::set_single_copy_min,
                    "Blocks of at least this many bytes are read straight from the peers' arrays (single copy; "
                    "2**64-1: never). Set alike on every rank, before any collective (ringcomm/shm/).")
      .def_property("single_copy_min_4k", &ShmWindow::single_copy_min_4k, &ShmWindow::set_single_copy_min_4k,
                    "The same for blocks that lie in 4 KiB pages: all_to_all's (the sender asks the kernel) and "
                    "all_gather's (every rank asks of its input; all agree in one sync); the slots below it. Set "
                    "alike on every rank, before any collective (ringcomm/shm/).")
      .def(
          "small_pages",
          [](const ShmWindow& w, uintptr_t address, size_t bytes) {
            return w.small_pages(reinterpret_cast<const void*>(address), bytes);
          },
          py::arg("address"), py::arg("nbytes"),
          "Does this process's memory at [address, address + nbytes) lie in 4 KiB pages, as the kernel says of "
          "its middle page? (What all_to_all's sender asks; False where the kernel cannot tell.)")
      .def("probe_single_copy", &ShmWindow::probe_single_copy, py::call_guard<py::gil_scoped_release>(),
           "Can this rank read every peer's memory (process_vm_readv)? Call once every rank has attached.")
      .def_property_readonly("has_arena", &ShmWindow::has_arena)
      .def_property_readonly("arena_bytes", &ShmWindow::arena_bytes)
      .def("arena_alloc",
           [](std::shared_ptr<ShmWindow> w, size_t bytes) {
             const size_t off = w->arena_alloc(bytes);
             return std::make_shared<ArenaBlock>(w, off, bytes);
           },
           py::arg("nbytes"), "A block of this rank's part of the arena (symmetric: same order, same offsets).");
  py::class_<ShmFile, std::shared_ptr<ShmFile>>(m, "ShmFile", py::module_local())
      .def_static("create", &ShmFile::create, py::arg("bytes"), py::arg("rank"),
                  py::call_guard<py::gil_scoped_release>(),
                  "An unnamed file in /dev/shm (mode 0600), locked (flock), its pages reserved (posix_fallocate).")
      .def_static("open", &ShmFile::open, py::arg("path"), py::arg("dev"), py::arg("ino"), py::arg("bytes"),
                  py::arg("rank"), py::call_guard<py::gil_scoped_release>(),
                  "Open the segment another rank made: /proc/<pid>/fd/<fd> or its /dev/shm name, checked to be "
                  "that file (device, inode, size, owner).")
      .def("link", &ShmFile::link, py::arg("name"), "Give the creator's file a name in /dev/shm.")
      .def("close", &ShmFile::close, "Close the descriptor (the lock goes; mappings stay).")
      .def_property_readonly("fd", &ShmFile::fd)
      .def_property_readonly("dev", &ShmFile::dev)
      .def_property_readonly("ino", &ShmFile::ino)
      .def_property_readonly("bytes", &ShmFile::bytes);
  m.def("shm_arena_map", &shm_arena_map, py::arg("window"), py::arg("file"), py::arg("per_rank"),
        py::call_guard<py::gil_scoped_release>(), "Map the window's shared arena from its file.");
  m.def("shm_local_arena", &shm_local_arena, py::arg("windows"), py::arg("per_rank"),
        "In-process windows: one arena over plain memory.");
  m.def("shm_bytes", &ShmWindow::bytes_for, py::arg("nranks"), py::arg("slot_bytes"),
        "Bytes of a shared segment for nranks ranks with slots of slot_bytes.");
  m.def("shm_window", &shm_window, py::arg("file"), py::arg("rank"), py::arg("nranks"), py::arg("slot_bytes"),
        py::arg("create"), py::call_guard<py::gil_scoped_release>(),
        "The window over a shared segment's file: laid out (create) or checked.");
  m.def("shm_remove", &shm_remove, py::arg("name"), "Unlink a shared segment's name (mappings stay).");
  m.def("shm_sweep", &shm_sweep, py::call_guard<py::gil_scoped_release>(),
        "Remove this user's named segments (/dev/shm/ringcomm-*.flock) whose creator is gone; their names.");
  m.def("shm_local_windows", &shm_local_windows, py::arg("nranks"), py::arg("slot_bytes"),
        "One window per in-process rank over one mapping.");

  py::class_<P2POp, std::shared_ptr<P2POp>>(m, "P2POp", py::module_local())
      .def("wait", &wait_p2p, py::arg("timeout") = -1.0,
           "Progress and block (GIL released) until complete or `timeout` s (negative: until it ends, bounded by "
           "the communicator's deadline); raises its failure; True when complete.")
      .def("is_completed", &P2POp::is_completed)
      .def("poll", &P2POp::poll, py::call_guard<py::gil_scoped_release>(),
           "Progress without blocking unless another thread waits for it; True when complete (a failure is "
           "kept in error(), not raised).")
      .def("test", [](P2POp& op) { return wait_p2p(op, 0.0); }, "Progress without blocking; True when complete.")
      .def_property_readonly("source", &P2POp::source, "The sender's rank (after completion; a send: its peer).")
      .def_property_readonly("is_send", &P2POp::is_send)
      .def("hold", &P2POp::hold)
      .def("error", [](P2POp& op) -> py::object {
        const RingError* e = op.error();
        if (!e) return py::none();
        return error_object(*e);
      });

  py::class_<EngineHandle>(m, "Engine", py::module_local())
      .def("p2p",
           [](EngineHandle& h, bool send, int peer, uintptr_t ptr, size_t count, int dtype, int tag, uintptr_t stream) {
             auto e = h.shared();
             if (!e->device()) return p2p_post(e, send, peer, reinterpret_cast<void*>(ptr), count, DType(dtype), tag);
             py::gil_scoped_release nogil;  // a device op waits for its copy out here
             auto op = p2p_post(e, send, peer, reinterpret_cast<void*>(ptr), count, DType(dtype), tag, stream);
             e.reset();  // (without the GIL, as everywhere an engine may be destroyed)
             return op;
           },
           py::arg("send"), py::arg("peer"), py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("tag"),
           py::arg("stream") = 0,
           "Post a point-to-point send or receive (peer -1: any source); returns its P2POp. `stream`: a device "
           "communicator's caller stream, which the copy of the buffer is ordered after.")
      .def_property_readonly(
          "p2p_limits",
          [](EngineHandle& h) {
            const P2PLimits l = p2p_limits(*h.shared()->shared_transport());
            return py::make_tuple(l.max_tag, l.max_bytes);
          },
          "(largest tag, largest message in bytes) a point-to-point op carries on this communicator's transport")
      .def("p2p_run",
           [](EngineHandle& h, bool send, int peer, uintptr_t ptr, size_t count, int dtype, int tag, uintptr_t stream) {
             std::shared_ptr<P2POp> op;
             if (!h.shared()->device()) {
               op = p2p_post(h.shared(), send, peer, reinterpret_cast<void*>(ptr), count, DType(dtype), tag);
             } else {
               auto e = h.shared();
               py::gil_scoped_release nogil;  // a device op waits for its copy out here
               op = p2p_post(e, send, peer, reinterpret_cast<void*>(ptr), count, DType(dtype), tag, stream);
               e.reset();
             }
             wait_p2p(*op, -1.0);
             return op->source();
           },
           py::arg("send"), py::arg("peer"), py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("tag"),
           py::arg("stream") = 0,
           "Post and wait; returns the sender's rank (a send: its peer). Raises on failure.")
      .def("p2p_now",
           [](EngineHandle& h, bool send, py::handle x, py::handle peer, py::handle tag) -> int {
             // The fast lane of a blocking send/recv (host_p2p_call, then
             // p2p_run_now): -2 means "not described here", and the Python
             // adapter runs instead. Else the source rank (a send: its peer).
             std::shared_ptr<Engine> e = h.engine;
             if (!e || e->device()) return -2;
             int dtype = 0, p = 0, tag_ = 0;
             size_t count = 0;
             uintptr_t ptr = 0;
             if (!host_p2p_call(x, peer, tag, send, e->rank(), e->size(), dtype, count, ptr, p, tag_)) return -2;
             std::shared_ptr<P2POp> op;
             const int src = p2p_run_now(e, send, p, reinterpret_cast<void*>(ptr), count, DType(dtype), tag_, &op);
             if (!op) return src;
             e.reset();  // the op holds the engine while it waits
             wait_p2p(*op, -1.0);
             return op->source();
           },
           py::arg("send"), py::arg("x"), py::arg("peer"), py::arg("tag"),
           "Blocking send/recv of a numpy array or torch CPU tensor described natively; returns the source rank, "
           "or -2 when the arguments need the Python adapter (ringcomm/door.py).")
      .def("p2p_sendrecv",
           [](EngineHandle& h, uintptr_t sptr, size_t scount, int sdtype, int dst, int stag, uintptr_t rptr,
              size_t rcount, int rdtype, int src, int rtag, uintptr_t sstream, uintptr_t rstream) {
             auto e = h.shared();
             SendRecv sr;
             {
               py::gil_scoped_release nogil;  // a device op waits for its copy out here
               sr = p2p_sendrecv(e, reinterpret_cast<void*>(sptr), scount, DType(sdtype), dst, stag,
                                 reinterpret_cast<void*>(rptr), rcount, DType(rdtype), src, rtag, sstream, rstream);
               e.reset();
             }
             return wait_sendrecv(sr);
           },
           py::arg("sptr"), py::arg("scount"), py::arg("sdtype"), py::arg("dst"), py::arg("stag"), py::arg("rptr"),
           py::arg("rcount"), py::arg("rdtype"), py::arg("src"), py::arg("rtag"), py::arg("sstream") = 0,
           py::arg("rstream") = 0,
           "Send to `dst` and receive from `src` (-1: any source) together (p2p_sendrecv), wait for both; returns "
           "the sender's rank. Raises a Ctrl-C, else the first failure. `sstream`, `rstream`: on a device "
           "communicator, the streams each array's copy is ordered after.")
      .def("p2p_sendrecv_now",
           [](EngineHandle& h, py::handle x, py::handle dst, py::handle out, py::handle src, py::handle stag,
              py::handle rtag) -> int {
             // Communicator.sendrecv's fast lane (host_p2p_call for each
             // side): -2 means "not described here", and the Python adapter
             // runs instead. Else the receive's source rank.
             std::shared_ptr<Engine> e = h.engine;
             if (!e || e->device()) return -2;
             int sd = 0, p = 0, st = 0, rd = 0, q = 0, rt = 0;
             size_t sc = 0, rc = 0;
             uintptr_t sp = 0, rp = 0;
             if (!host_p2p_call(x, dst, stag, true, e->rank(), e->size(), sd, sc, sp, p, st, true) ||
                 !host_p2p_call(out, src, rtag, false, e->rank(), e->size(), rd, rc, rp, q, rt, true))
               return -2;
             SendRecv sr = p2p_sendrecv(e, reinterpret_cast<void*>(sp), sc, DType(sd), p, st,
                                        reinterpret_cast<void*>(rp), rc, DType(rd), q, rt);
             if (!sr.send && !sr.recv && !sr.error) return sr.source;  // both done on the spot
             e.reset();  // the ops hold the engine while they wait
             return wait_sendrecv(sr);
           },
           py::arg("x"), py::arg("dst"), py::arg("out"), py::arg("src"), py::arg("tag"), py::arg("recv_tag"),
           "Communicator.sendrecv of numpy arrays or torch CPU tensors described natively; returns the source "
           "rank, or -2 when the arguments need the Python adapter (ringcomm/door.py).")
      .def("p2p_post_now",
           [](EngineHandle& h, bool send, py::handle x, py::handle peer, py::handle tag) -> py::object {
             // isend/irecv's fast lane (host_p2p_call, then p2p_post): None
             // means "not described here", and the Python adapter runs instead.
             std::shared_ptr<Engine> e = h.engine;
             if (!e || e->device()) return py::none();
             int dtype = 0, p = 0, tag_ = 0;
             size_t count = 0;
             uintptr_t ptr = 0;
             if (!host_p2p_call(x, peer, tag, send, e->rank(), e->size(), dtype, count, ptr, p, tag_)) return py::none();
             return py::cast(p2p_post(e, send, p, reinterpret_cast<void*>(ptr), count, DType(dtype), tag_));
           },
           py::arg("send"), py::arg("x"), py::arg("peer"), py::arg("tag"),
           "Post a send/receive of a numpy array or torch CPU tensor described natively; returns its P2POp, or "
           "None when the arguments need the Python adapter (ringcomm/door.py).")
      .def_property_readonly("rank", [](EngineHandle& h) { return h.get().rank(); })
      .def_property_readonly("size", [](EngineHandle& h) { return h.get().size(); })
      .def_property_readonly("transport", [](EngineHandle& h) { return h.get().transport_name(); })
      .def_property_readonly("closed", [](EngineHandle& h) { return !h.engine; })
      .def("submit",
           [](EngineHandle& h, const Call& c, uintptr_t stream) {
             Engine& e = h.get();
             Task t = make_task(c);
             if (auto dev = e.device()) t.after = dev->record_external(stream);
             return e.submit(t);
           },
           py::arg("call"), py::arg("stream") = 0,
           "Queue a collective; returns its Work. Device engines: it starts after the work queued so far on "
           "`stream` (the caller's, as an integer handle).")
      .def("run", [](EngineHandle& h, const Call& c) { call_host(h, make_task(c)); }, py::arg("call"),
           "Run a host collective to completion (on this thread when the engine is idle); raises on failure.")
      .def("run_all_reduce",
           [](EngineHandle& h, py::handle x, py::handle out, py::handle op, py::handle algo) {
             // The fast lane (host_all_reduce_call): False means "not described
             // here", and the Python adapter runs instead.
             Call c;
             if (!host_all_reduce_call(x, out, vocab_code(vocab_tables().ops, op, -1),
                                       vocab_code(vocab_tables().algorithms, algo, -2), c))
               return false;
             call_host(h, make_task(c));
             return true;
           },
           py::arg("x"), py::arg("out"), py::arg("op"), py::arg("algo"),
           "Synchronous all_reduce of numpy arrays or torch CPU tensors described natively (op and algo: names "
           "or codes); False when the arrays need the Python adapter (ringcomm/door.py).")
      .def("run_barrier",
           [](EngineHandle& h, int algo) {
             Call c;  // (no payload: nothing to describe)
             c.coll = int(Coll::barrier);
             c.algo = algo;
             call_host(h, make_task(c));
           },
           py::arg("algo"), "Synchronous barrier on a host communicator (the fast lane of comm.barrier).")
      .def("run_rooted",
           [](EngineHandle& h, int coll, py::handle x, py::handle out, int root, py::handle op, py::handle algo) {
             // broadcast, reduce, gather, scatter, all_to_all's fast lane (host_rooted_call).
             Call c;
             Engine& e = h.get();
             if (e.device() || !host_rooted_call(Coll(coll), x, out, root, vocab_code(vocab_tables().ops, op, -1),
                                                 vocab_code(vocab_tables().algorithms, algo, -2), e.rank(),
                                                 e.size(), c))
               return false;
             call_host(h, make_task(c));
             return true;
           },
           py::arg("coll"), py::arg("x"), py::arg("out"), py::arg("root"), py::arg("op"), py::arg("algo"),
           "Synchronous broadcast, reduce, gather, scatter or all_to_all (equal blocks, out given) of numpy "
           "arrays or torch CPU tensors, described natively; False when the Python adapter must run.")
      .def("run_all_to_all_v",
           [](EngineHandle& h, py::handle x, py::handle out, py::handle splits, py::handle out_splits, int algo,
              size_t max_block_bytes) {
             // all_to_all with per-peer splits' fast lane (host_all_to_all_v_call).
             Call c;
             Engine& e = h.get();
             if (e.device() || !host_all_to_all_v_call(x, out, splits, out_splits, algo, max_block_bytes, e.rank(),
                                                       e.size(), c))
               return false;
             call_host(h, make_task(c));
             return true;
           },
           py::arg("x"), py::arg("out"), py::arg("splits"), py::arg("out_splits"), py::arg("algo"),
           py::arg("max_block_bytes"),
           "Synchronous all_to_all with per-peer splits (lists of ints) of numpy arrays or torch CPU tensors, "
           "out given, described natively; False when the Python adapter must run.")
      .def("run_halves",
           [](EngineHandle& h, bool scatter, py::handle x, py::handle out, py::handle op, py::handle algo) {
             // reduce_scatter (scatter) or all_gather's fast lane (host_halves_call).
             Call c;
             Engine& e = h.get();
             if (e.device() ||
                 !host_halves_call(scatter ? Coll::reduce_scatter : Coll::all_gather, x, out,
                                   vocab_code(vocab_tables().ops, op, -1),
                                   vocab_code(vocab_tables().algorithms, algo, -2), e.rank(), e.size(), c))
               return false;
             call_host(h, make_task(c));
             return true;
           },
           py::arg("scatter"), py::arg("x"), py::arg("out"), py::arg("op"), py::arg("algo"),
           "Synchronous reduce_scatter / all_gather of 1-D numpy arrays with out= given, described natively; "
           "False when the Python adapter must run.")
      .def_property_readonly("device",
                             [](EngineHandle& h) -> py::object {
                               auto d = h.get().device();
                               if (!d) return py::none();
                               return py::str(d->name());
                             },
                             "Name of the device payload lives on (None: host memory).")
      .def("make_tracer", [](EngineHandle&, bool values) { return std::make_shared<Tracer>(values); },
           py::arg("values") = false, "A step tracer of this module's type, for set_tracer().")
      .def("traffic",
           [](EngineHandle& h) { return traffic_array(h.get().ledger().snapshot(), h.get().size()); },
           "Ledger as uint64[collective, peer, (payload, control), (bytes_sent, msgs_sent, bytes_recv, msgs_recv)]")
      .def("abort", [](EngineHandle& h, bool by_interrupt) { return h.get().abort(by_interrupt); },
           py::arg("by_interrupt") = false)
      .def_property_readonly("running_here", [](EngineHandle& h) { return h.engine && h.engine->running_here(); },
                             "A collective runs inline on this thread (abort() must not wait then).")
      .def("flight_record", [](EngineHandle& h) { return flight_list(h.get().flight_record()); },
           "The last K collectives, oldest first, as dicts (see ringcomm.Communicator.flight_record).")
      .def("flight_summary", [](EngineHandle& h) { return h.get().flight_summary(); })
      .def("set_flight_records", [](EngineHandle& h, size_t k) { h.get().set_flight_records(k); })
      .def("set_peers",
           [](EngineHandle& h, std::vector<EngineHandle*> peers) {
             // In-process: a timeout names what the peer it waited for is doing.
             std::vector<std::weak_ptr<Engine>> ws;
             for (EngineHandle* p : peers) ws.push_back(p ? p->engine : nullptr);
             h.get().set_peer_state([ws](int r) -> std::string {
               if (r < 0 || size_t(r) >= ws.size()) return "";
               if (auto e = ws[size_t(r)].lock()) return e->flight_summary();
               return "its communicator is closed";
             });
           },
           "In-process worlds: the engines of every rank, in rank order.")
      .def("check_peers",
           [](EngineHandle& h) -> py::object {
             std::unique_ptr<RingError> e;
             {
               py::gil_scoped_release nogil;
               e = h.get().check_peers();
             }
             if (!e) return py::none();
             return error_object(*e);
           },
           "Device engines: the failure a peer reported since the last collective, else None.")
      .def("set_tracer", [](EngineHandle& h, std::shared_ptr<Tracer> t) { h.get().set_tracer(std::move(t)); },
           py::arg("tracer").none(true))
      .def("reset_traffic", [](EngineHandle& h) { h.get().ledger().reset(); })
      .def("set_segment_bytes", [](EngineHandle& h, size_t b) { h.get().set_segment_bytes(b); })
      .def("set_timeout", [](EngineHandle& h, double s) { h.get().set_timeout(s); })
      .def("set_auto_limits",
           [](EngineHandle& h, size_t rd, size_t hd, size_t reduce) { h.get().set_auto_limits(rd, hd, reduce); },
           py::arg("rd_max"), py::arg("hd_max"), py::arg("reduce_max") = 0)
      .def("attach_window",
           [](EngineHandle& h, std::shared_ptr<ShmWindow> w, bool for_auto, size_t flat_max) {
             if (w->size() != h.get().size() || w->rank() != h.get().rank())
               throw_invalid("the window's ranks differ from the communicator's");
             h.get().attach_window(std::move(w), for_auto, flat_max);
           },
           py::arg("window"), py::arg("for_auto"), py::arg("flat_max"))
      .def("watch_processes",
           [](EngineHandle& h, std::vector<int> pids) {
             if (int(pids.size()) != h.get().size())
               throw_invalid("watch_processes needs one pid per rank (0: not watched)");
             h.get().watch_processes(std::move(pids));
           },
           py::arg("pids"))
      .def("set_shm_auto",
           [](EngineHandle& h, bool for_auto, size_t flat_max, std::vector<size_t> shm_max,
              std::vector<size_t> shm_from) {
             h.get().set_shm_auto(for_auto, flat_max, shm_max, shm_from);
           },
           py::arg("for_auto"), py::arg("flat_max"), py::arg("shm_max") = std::vector<size_t>{},
           py::arg("shm_from") = std::vector<size_t>{},
           "Whether auto runs in the window, the one-sync limit (all_reduce, reduce), and per collective "
           "(all_reduce, reduce_scatter, all_gather, broadcast, reduce, gather, scatter, all_to_all: ringcomm.shm."
           "COLLECTIVES) the largest buffer auto runs there, and the size from which it runs there again.")
      .def("attach_hierarchy",
           [](EngineHandle& h, std::shared_ptr<ShmWindow> local, std::vector<int> members, EngineHandle& cross,
              std::vector<int> cross_members, std::vector<int> layout) {
             const int hosts = cross.get().size(), per = local->size();
             if (int(members.size()) != per || int(cross_members.size()) != hosts ||
                 layout.size() != size_t(hosts) * size_t(per) || int(layout.size()) != h.get().size())
               throw_invalid("attach_hierarchy: member lists do not match the window and the cross engine");
             HostLayout lay{hosts, per, std::move(layout)};
             for (int q = 0; q < hosts; ++q)  // the layout agrees with this rank's own two groups
               if (lay.at(q, local->rank()) != cross_members[size_t(q)])
                 throw_invalid("attach_hierarchy: the layout disagrees with the ranks between hosts");
             for (int l = 0; l < per; ++l)
               if (lay.at(cross.get().rank(), l) != members[size_t(l)])
                 throw_invalid("attach_hierarchy: the layout disagrees with this host's ranks");
             local->set_members(std::move(members));
             h.get().attach_hierarchy(std::move(local), cross.shared(), std::move(cross_members), std::move(lay));
           },
           py::arg("window"), py::arg("members"), py::arg("cross"), py::arg("cross_members"), py::arg("layout"),
           "Ranks on several hosts: this host's window (members: their ranks), the engine between hosts "
           "(cross_members: its ranks' ranks here), and layout[h * L + l]: the rank of local index l on host h.")
      .def_property_readonly("hierarchical", [](EngineHandle& h) { return h.get().hierarchical(); })
      .def_property_readonly("last_algorithm_between_hosts",
                             [](EngineHandle& h) -> py::object {
                               const int a = h.get().cross_last_algo();
                               return a < 0 ? py::object(py::none()) : py::object(py::str(algo_name(Algo(a))));
                             })
      .def("traffic_between_hosts",
           [](EngineHandle& h) { return traffic_array(h.get().cross_traffic(), h.get().size()); },
           "The inter-host part of a hierarchical communicator's ledger (by this communicator's ranks).")
      .def_property_readonly("has_window", [](EngineHandle& h) { return h.get().has_window(); })
      .def_property_readonly("window", [](EngineHandle& h) { return h.get().window(); })
      .def_property_readonly("shm_auto", [](EngineHandle& h) { return h.get().shm_auto(); })
      .def_property_readonly("shm_flat_max", [](EngineHandle& h) { return h.get().shm_flat_max(); })
      .def("last_algorithm", [](EngineHandle& h) { return std::string(algo_name(Algo(h.get().last_algo()))); })
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

}

// A UCP context and worker waiting for its peers' addresses; an engine
// takes it over (the handle is empty afterwards).
struct UcxWorkerHandle {
  std::shared_ptr<UcxWorker> worker;
  std::shared_ptr<UcxWorker> take() {
    if (!worker) throw_invalid("this UCX worker was already given to an engine");
    return std::move(worker);
  }
};

// UCX's part of both modules: the worker (made before the addresses are
// swapped), an engine over it (ringcomm._core; ringcomm._cuda adds one whose
// payload goes over NCCL), and what `ringcomm info` asks.
inline void bind_ucx(py::module_& m) {
  py::class_<UcxWorkerHandle>(m, "UcxWorker", py::module_local())
      .def_property_readonly("address",
                             [](const UcxWorkerHandle& h) {
                               if (!h.worker) throw_invalid("this UCX worker was already given to an engine");
                               return py::bytes(ucx_worker_address(*h.worker));
                             },
                             "This worker's address, to give every peer (bytes).");
  m.def("ucx_worker", [] { return UcxWorkerHandle{make_ucx_worker()}; },
        "A UCP context and worker (UCX loaded on first use; raises TransportError when it cannot be).");
  m.def("ucx_engine",
        [](UcxWorkerHandle& worker, std::vector<std::string> addresses, int rank, double timeout,
           size_t segment_bytes, int window) {
          Options o = make_options(timeout, segment_bytes, window);
          auto h = std::make_unique<EngineHandle>();
          std::shared_ptr<UcxWorker> w = worker.take();
          py::gil_scoped_release nogil;
          h->engine = std::make_shared<Engine>(make_ucx_transport(std::move(w), addresses, rank), o);
          return h;
        },
        py::arg("worker"), py::arg("addresses"), py::arg("rank"), py::arg("timeout"), py::arg("segment_bytes"),
        py::arg("window"), "An engine over UCX; addresses[r] is rank r's worker address.");
  m.def("ucx_emulated_nccl_engine",
        [](UcxWorkerHandle& control, std::vector<std::string> control_addresses, UcxWorkerHandle& payload,
           std::vector<std::string> payload_addresses, int rank, double timeout, size_t segment_bytes, int window,
           double jitter_us) {
          Options o = make_options(timeout, segment_bytes, window);
          auto h = std::make_unique<EngineHandle>();
          std::shared_ptr<UcxWorker> c = control.take(), p = payload.take();
          py::gil_scoped_release nogil;
          h->engine = std::make_shared<Engine>(
              make_emulated_grouped_transport(make_ucx_transport(std::move(c), control_addresses, rank),
                                              make_ucx_transport(std::move(p), payload_addresses, rank), rank,
                                              jitter_us, timeout),
              o);
          return h;
        },
        py::arg("control"), py::arg("control_addresses"), py::arg("payload"), py::arg("payload_addresses"),
        py::arg("rank"), py::arg("timeout"), py::arg("segment_bytes"), py::arg("window"), py::arg("jitter_us") = 0.0,
        "The NCCL transport's store launch with the emulated device: control messages over UCX (`control`'s "
        "worker), the payload in NCCL-like groups on the emulated device's transfer queue over a second UCX "
        "worker (`payload`).");
  m.def("ucx_in_process", &ucx::in_process, "Whether a libucp.so.0 is already loaded in this process.");
  m.def("ucx_version", &ucx_version, "UCX's version string (raises TransportError when UCX cannot be loaded).");
}

}  // namespace bind

}  // namespace ringcomm

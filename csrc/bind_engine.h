// The Engine's Python bindings, shared by ringcomm._core (host transports)
// and ringcomm._cuda (device transports): each module compiles the engine and
// registers these classes as module-local types, so the two never clash and
// the Python layer drives both through the same methods.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine.h"
#include "inproc_transport.h"
#include "py_errors.h"
#include "quarantine.h"

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

// One collective call, described and checked by the array adapter
// (ringcomm/door.py, or host_all_reduce_call below for the common case):
// the only thing the Python layer hands the engine. Buffers per collective
// are Engine::submit's; `count` is always the full buffer's length.
struct Call {
  int coll = 0;       // Coll
  int dtype = 0;      // DType
  int op = 0;         // Op
  int algo = 0;       // Algo, or Algo::automatic
  uintptr_t in = 0;   // addresses (host or device memory)
  uintptr_t out = 0;
  size_t count = 0;
  int root = 0;
};

inline Task make_task(const Call& c) {
  Task t;
  t.algo = c.algo;
  t.coll = Coll(c.coll);
  t.in = reinterpret_cast<const void*>(c.in);
  t.out = reinterpret_cast<void*>(c.out);
  t.count = c.count;
  t.dtype = DType(c.dtype);
  t.op = Op(c.op);
  t.root = c.root;
  return t;
}

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

// A failed collective's error as a Python exception; with `hold` (requests
// that outlived it may still use the caller's arrays) attached as `_hold`,
// for ringcomm.comm to keep those arrays alive.
inline py::object failure_object(const RingError& e, std::shared_ptr<Hold> hold) {
  py::object err = error_object(e);
  if (hold && hold->pending.load() > 0) err.attr("_hold") = py::cast(hold);
  return err;
}

[[noreturn]] inline void raise_object(py::object err) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw py::error_already_set();
}

// Run a host collective to completion (on this thread when the engine is
// idle), polling Ctrl-C on the main thread; raises the failure.
inline void run_host(EngineHandle& h, const Task& t) {
  std::shared_ptr<Engine> e = h.shared();
  // Device collectives must keep their arrays until the device is
  // done with them, which only a Work can track: use submit().
  if (e->device()) throw_invalid("run() is for host engines; device engines use submit()");
  std::shared_ptr<Work> w;
  if (on_main_thread()) {
    SignalCheck check;
    {
      py::gil_scoped_release nogil;
      w = e->run_sync(t, &check.fn);
      e.reset();  // if close() ran meanwhile, the engine is destroyed here, without the GIL
    }
    if (check.fired) check.raise(w->hold());  // the communicator is aborted and the ring told
  } else {
    py::gil_scoped_release nogil;
    w = e->run_sync(t);
    e.reset();
  }
  if (const RingError* err = w->error()) raise_object(failure_object(*err, w->hold()));
}

// The array adapter's fast lane, for the common call: a synchronous
// all_reduce of host arrays, numpy ndarrays or torch CPU tensors, described
// here in about 0.3 us instead of the 3 us of the Python adapter
// (ringcomm/door.py). It fills the same Call, with the same checks: both
// arrays of one family, C-contiguous, of one supported dtype and shape, the
// output writable, in place or not overlapping, `op` valid for the dtype.
// False when any of it fails or is unusual (a numpy bfloat16, whose type
// number is not fixed; torch before it was registered): the caller then
// takes the Python adapter, whose errors say what is wrong.
struct TorchTypes {
  py::object tensor;  // torch.Tensor (set by register_torch, on the first torch array)
  py::dict codes;     // torch.dtype -> DType code
};
inline TorchTypes& torch_types() {
  static TorchTypes* t = new TorchTypes();  // never destroyed: outlives the interpreter's teardown
  return *t;
}

inline bool numpy_array(py::handle x, bool writable, int& dtype, size_t& count, uintptr_t& ptr) {
  auto a = py::reinterpret_borrow<py::array>(x);
  constexpr int c_contig = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_;
  if (!(a.flags() & c_contig) || (writable && !a.writeable())) return false;
  const py::dtype d = a.dtype();
  // Native byte order only ('=' or '|'; the explicit native letter too).
  constexpr char native = __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__ ? '>' : '<';
  const char bo = d.byteorder();
  if (bo != '=' && bo != '|' && bo != native) return false;
  const ssize_t size = d.itemsize();
  switch (d.num()) {  // numpy type numbers (fixed by numpy's ABI)
    case 23: dtype = int(DType::f16); break;  // NPY_HALF
    case 11: dtype = int(DType::f32); break;  // NPY_FLOAT
    case 12: dtype = int(DType::f64); break;  // NPY_DOUBLE
    case 1: dtype = int(DType::i8); break;    // NPY_BYTE
    case 2: dtype = int(DType::u8); break;    // NPY_UBYTE
    case 5: case 7: case 9:                   // NPY_INT, NPY_LONG, NPY_LONGLONG
      if (size == 4) dtype = int(DType::i32);
      else if (size == 8) dtype = int(DType::i64);
      else return false;
      break;
    default: return false;
  }
  count = size_t(a.size());
  ptr = reinterpret_cast<uintptr_t>(a.data());
  return true;
}

inline bool torch_tensor(py::handle x, int& dtype, size_t& count, uintptr_t& ptr) {
  static const py::str is_cpu("is_cpu"), dtype_attr("dtype"), is_contiguous("is_contiguous"),
      data_ptr("data_ptr"), numel("numel");
  if (!x.attr(is_cpu).cast<bool>()) return false;
  PyObject* code = PyDict_GetItem(torch_types().codes.ptr(), x.attr(dtype_attr).ptr());  // borrowed
  if (!code || !x.attr(is_contiguous)().cast<bool>()) return false;
  dtype = int(PyLong_AsLong(code));
  count = x.attr(numel)().cast<size_t>();
  ptr = x.attr(data_ptr)().cast<uintptr_t>();
  return true;
}

inline bool host_all_reduce_call(py::handle x, py::handle out, int op, int algo, Call& c) {
  int dout = -1;
  size_t nout = 0;
  if (py::isinstance<py::array>(x)) {
    if (!py::isinstance<py::array>(out) || !numpy_array(x, false, c.dtype, c.count, c.in) ||
        !numpy_array(out, true, dout, nout, c.out))
      return false;
    auto a = py::reinterpret_borrow<py::array>(x), b = py::reinterpret_borrow<py::array>(out);
    if (a.ndim() != b.ndim()) return false;
    for (ssize_t i = 0; i < a.ndim(); ++i)
      if (a.shape(i) != b.shape(i)) return false;
  } else {
    const py::object& tensor = torch_types().tensor;
    if (!tensor || !PyObject_IsInstance(x.ptr(), tensor.ptr()) || !torch_tensor(x, c.dtype, c.count, c.in))
      return false;
    if (out.is(x)) {
      dout = c.dtype, nout = c.count, c.out = c.in;
    } else {
      static const py::str shape("shape");
      if (!PyObject_IsInstance(out.ptr(), tensor.ptr()) || !torch_tensor(out, dout, nout, c.out) ||
          !x.attr(shape).equal(out.attr(shape)))
        return false;
    }
  }
  if (dout != c.dtype || nout != c.count) return false;
  if (op < 0 || op >= int(Op::kCount) || (Op(op) == Op::avg && !dtype_is_floating(DType(c.dtype)))) return false;
  if (algo < int(Algo::automatic) || algo >= int(Algo::kCount)) return false;
  const size_t bytes = c.count * dtype_size(DType(c.dtype));
  if (c.in != c.out && c.in < c.out + bytes && c.out < c.in + bytes) return false;  // partial overlap
  c.coll = int(Coll::all_reduce);
  c.op = op;
  c.algo = algo;
  c.root = 0;
  return true;
}

inline py::list flight_list(const std::vector<FlightRecord>& recs) {
  static const char* states[] = {"queued", "running", "done", "failed"};
  static const char* phases[] = {"reduce_scatter", "all_gather", "broadcast", "gather", "scatter",
                                 "fold", "exchange", "unfold"};
  py::list out;
  for (const FlightRecord& r : recs) {
    py::dict d;
    d["seq"] = r.seq;
    d["collective"] = coll_name(Coll(r.coll));
    d["count"] = r.count;
    const bool has_dtype = Coll(r.coll) != Coll::barrier;
    d["dtype"] = has_dtype ? py::object(py::str(dtype_name(DType(r.dtype)))) : py::object(py::none());
    const bool has_op = Coll(r.coll) == Coll::all_reduce || Coll(r.coll) == Coll::reduce_scatter;
    d["op"] = has_op ? py::object(py::str(op_name(Op(r.op)))) : py::object(py::none());
    d["root"] = Coll(r.coll) == Coll::broadcast ? py::object(py::int_(r.root)) : py::object(py::none());
    d["algorithm"] = algo_name(Algo(r.algo));
    d["state"] = states[int(r.state)];
    d["t_issue"] = double(r.t_issue_ns) * 1e-9;
    d["t_start"] = r.t_start_ns ? py::object(py::float_(double(r.t_start_ns) * 1e-9)) : py::object(py::none());
    d["t_end"] = r.t_end_ns ? py::object(py::float_(double(r.t_end_ns) * 1e-9)) : py::object(py::none());
    d["phase"] = r.phase >= 0 && r.phase < int(Phase::kCount) ? py::object(py::str(phases[r.phase])) : py::object(py::none());
    d["step"] = r.step >= 0 ? py::object(py::int_(r.step)) : py::object(py::none());
    d["segment"] = r.segment >= 0 ? py::object(py::int_(r.segment)) : py::object(py::none());
    const bool waiting = r.waiting != 0 && r.peer >= 0;
    d["waiting_for"] = waiting ? py::object(py::int_(r.peer)) : py::object(py::none());
    d["waiting_to"] = waiting ? py::object(py::str(r.waiting == 1 ? "receive" : "send")) : py::object(py::none());
    d["waiting_what"] = waiting ? py::object(py::str(r.what)) : py::object(py::none());
    d["waiting_since"] = waiting ? py::object(py::float_(double(r.wait_since_ns) * 1e-9)) : py::object(py::none());
    d["bytes_sent"] = r.bytes_sent;
    d["bytes_received"] = r.bytes_received;
    d["error"] = r.error.empty() ? py::object(py::none()) : py::object(py::str(r.error));
    out.append(d);
  }
  return out;
}

// The in-process world, opaque to Python.
struct WorldHandle {
  std::shared_ptr<InprocWorld> world;
};

inline Options make_options(double timeout, size_t segment_bytes, int window) {
  Options o;
  o.timeout_s = timeout;
  o.segment_bytes = segment_bytes;
  o.window = window;
  if (!(timeout > 0)) throw_invalid("timeout must be positive");
  if (segment_bytes == 0 || segment_bytes > (size_t(1) << 30))
    throw_invalid("segment_bytes must be between 1 and 2**30");
  if (window < 2) throw_invalid("window must be at least 2");
  return o;
}


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
      .def(py::init([](int coll, int dtype, int op, int algo, uintptr_t in, uintptr_t out, size_t count, int root) {
             return Call{coll, dtype, op, algo, in, out, count, root};
           }),
           py::arg("coll"), py::arg("dtype"), py::arg("op"), py::arg("algo"), py::arg("in_ptr"),
           py::arg("out_ptr"), py::arg("count"), py::arg("root"))
      .def_readonly("coll", &Call::coll)
      .def_readonly("dtype", &Call::dtype)
      .def_readonly("op", &Call::op)
      .def_readonly("algo", &Call::algo)
      .def_readonly("in_ptr", &Call::in)
      .def_readonly("out_ptr", &Call::out)
      .def_readonly("count", &Call::count)
      .def_readonly("root", &Call::root);
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
           [](Tracer& t) {
             py::list out;
             for (const TraceStep& s : t.take()) {
               py::dict d;
               d["seq"] = s.seq;
               d["collective"] = coll_name(Coll(s.coll));
               d["dtype"] = dtype_name(DType(s.dtype));
               d["phase"] = s.phase;
               d["step"] = s.step;
               d["rank"] = s.rank;
               d["send_peer"] = s.send_peer;
               d["send_chunk"] = s.send_chunk;
               d["send_bytes"] = s.send_bytes;
               d["recv_peer"] = s.recv_peer;
               d["recv_chunk"] = s.recv_chunk;
               d["recv_bytes"] = s.recv_bytes;
               d["t_start_ns"] = s.t_start_ns;
               d["t_end_ns"] = s.t_end_ns;
               d["values"] = py::bytes(s.values.data(), s.values.size());
               out.append(d);
             }
             return out;
           },
           "Recorded steps so far, as dicts (and forget them).");

  py::class_<WorldHandle>(m, "InprocWorld", py::module_local());
  m.def("inproc_world", [](int n) { return WorldHandle{make_inproc_world(n)}; }, py::arg("nranks"));

  py::class_<EngineHandle>(m, "Engine", py::module_local())
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
      .def("run", [](EngineHandle& h, const Call& c) { run_host(h, make_task(c)); }, py::arg("call"),
           "Run a host collective to completion (on this thread when the engine is idle); raises on failure.")
      .def("run_all_reduce",
           [](EngineHandle& h, py::handle x, py::handle out, int op, int algo) {
             // The fast lane (host_all_reduce_call): False means "not described
             // here", and the Python adapter runs instead.
             Call c;
             if (!host_all_reduce_call(x, out, op, algo, c)) return false;
             run_host(h, make_task(c));
             return true;
           },
           py::arg("x"), py::arg("out"), py::arg("op"), py::arg("algo"),
           "Synchronous all_reduce of numpy arrays or torch CPU tensors described natively; False when the "
           "arrays need the Python adapter (ringcomm/door.py).")
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
           [](EngineHandle& h) {
             auto cells = h.get().ledger().snapshot();
             const int n = h.get().size();
             py::array_t<uint64_t> a({int(Coll::kCount), n, 2, 4});
             auto v = a.mutable_unchecked<4>();
             for (int c = 0; c < int(Coll::kCount); ++c)
               for (int p = 0; p < n; ++p)
                 for (int k = 0; k < 2; ++k) {
                   const Counters& x = cells[(size_t(c) * n + p) * 2 + k];
                   v(c, p, k, 0) = x.bytes_sent;
                   v(c, p, k, 1) = x.msgs_sent;
                   v(c, p, k, 2) = x.bytes_recv;
                   v(c, p, k, 3) = x.msgs_recv;
                 }
             return a;
           },
           "Ledger as uint64[collective, peer, (payload, control), (bytes_sent, msgs_sent, bytes_recv, msgs_recv)]")
      .def("abort", [](EngineHandle& h) { return h.get().abort(); })
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
      .def("set_auto_limits", [](EngineHandle& h, size_t rd, size_t hd) { h.get().set_auto_limits(rd, hd); },
           py::arg("rd_max"), py::arg("hd_max"))
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

}  // namespace bind
}  // namespace ringcomm

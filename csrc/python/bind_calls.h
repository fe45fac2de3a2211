// Registration of the collectives' side: the process-wide switches (main
// thread, quarantine, the fast lanes' vocabularies), the Call every
// collective arrives as, its Work and Hold, and the Engine's calls (submit,
// run and the fast lanes that describe numpy arrays and torch CPU tensors
// natively: converters.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/quarantine.h"
#include "python/handles.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// set_main_thread, the quarantine, leak, and the vocabularies the fast lanes read.
inline void bind_runtime(py::module_& m) {
  m.def("set_main_thread", [](unsigned long ident) { main_thread_ident() = ident; }, py::arg("ident"));
  m.def("quarantined", [] { return Quarantine::instance().reap(); },
        "Requests of failed collectives still in flight (after releasing those that completed).");
  m.def("quarantine_drain", [](double seconds) { return Quarantine::instance().drain(seconds); },
        py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
        "Release completed quarantined requests until none is left or `seconds` pass; returns how many remain.");
  m.def("leak", [](py::object o) { o.inc_ref(); },
        "Keep `o` alive until the process ends (arrays a request still in flight may use at exit).");
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
}

// Call, Hold and Work.
inline void bind_calls(py::module_& m) {
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
}

// The Engine's collectives: submit, run, and the synchronous fast lanes.
inline void def_engine_calls(py::class_<EngineHandle>& engine) {
  engine
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
      .def("run_same_shape",
           [](EngineHandle& h, int coll, py::handle x, py::handle out, py::handle op, py::handle algo) {
             // The fast lane of all_reduce, scan and exscan (host_same_shape_call):
             // False means "not described here", and the Python adapter runs instead.
             Call c;
             if (coll != int(Coll::all_reduce) && coll != int(Coll::scan) && coll != int(Coll::exscan)) return false;
             if (!host_same_shape_call(Coll(coll), x, out, vocab_code(vocab_tables().ops, op, -1),
                                       vocab_code(vocab_tables().algorithms, algo, -2), c))
               return false;
             call_host(h, make_task(c));
             return true;
           },
           py::arg("coll"), py::arg("x"), py::arg("out"), py::arg("op"), py::arg("algo"),
           "Synchronous all_reduce, scan or exscan (coll: its code) of numpy arrays or torch CPU tensors "
           "described natively (op and algo: names or codes); False when the arrays need the Python adapter "
           "(ringcomm/door.py).")
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
           "False when the Python adapter must run.");
}

}  // namespace bind
}  // namespace ringcomm

// Registration of point-to-point: the P2POp a send or receive returns, and
// the Engine's posts, runs, sendrecv and their fast lanes (engine/p2p.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/handles.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

inline void bind_p2p(py::module_& m) {
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

}

// The Engine's point-to-point posts and waits (pointers: the Python adapter's).
inline void def_engine_p2p_posts(py::class_<EngineHandle>& engine) {
  engine
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
           "communicator, the streams each array's copy is ordered after.");
}

// Their fast lanes: numpy arrays and torch CPU tensors described natively
// (host_p2p_call); the Python adapter runs where they decline.
inline void def_engine_p2p_fast_lanes(py::class_<EngineHandle>& engine) {
  engine
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
           "None when the arguments need the Python adapter (ringcomm/door.py).");
}

// The Engine's point-to-point methods.
inline void def_engine_p2p(py::class_<EngineHandle>& engine) {
  def_engine_p2p_posts(engine);
  def_engine_p2p_fast_lanes(engine);
}

}  // namespace bind
}  // namespace ringcomm

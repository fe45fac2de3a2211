// Converters between Python objects and the engine's types, for both
// modules: arguments in (a call's Task, Options, numpy arrays checked for the
// fast path), records out (flight records, trace steps, the ledger). No
// signal handling and no registration here: signals.h, bind_engine.h.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "core/flight.h"
#include "core/ledger.h"
#include "core/link.h"
#include "core/trace.h"
#include "engine/engine.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// ---- in ---------------------------------------------------------------------
inline Task make_task(int coll, uintptr_t in, uintptr_t out, size_t count, int dtype, int op, int root, int algo) {
  Task t;
  t.algo = algo;
  t.coll = Coll(coll);
  t.in = reinterpret_cast<const void*>(in);
  t.out = reinterpret_cast<void*>(out);
  t.count = count;
  t.dtype = DType(dtype);
  t.op = Op(op);
  t.root = root;
  return t;
}

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



// all_reduce(x, out=y) of numpy arrays, checked as the Python adapter
// (_arrays.py, comm.py) would: both C-contiguous ndarrays of one supported
// dtype and shape, the output writable, in place or not overlapping, `op`
// valid for the dtype. False when any of it fails (or is unusual, like
// bfloat16, whose numpy type number is not fixed): the caller then takes the
// Python path, whose errors say what is wrong.
inline bool numpy_all_reduce_args(py::handle x, py::handle out, int op, size_t& count, int& dtype,
                                  uintptr_t& in_ptr, uintptr_t& out_ptr) {
  if (!py::isinstance<py::array>(x) || !py::isinstance<py::array>(out)) return false;
  auto a = py::reinterpret_borrow<py::array>(x), b = py::reinterpret_borrow<py::array>(out);
  constexpr int c_contig = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_;
  if (!(a.flags() & c_contig) || !(b.flags() & c_contig) || !b.writeable()) return false;
  const py::dtype da = a.dtype(), db = b.dtype();
  const int num = da.num();
  if (db.num() != num || da.itemsize() != db.itemsize()) return false;
  // Native byte order only ('=' or '|'; the explicit native letter too).
  constexpr char native = __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__ ? '>' : '<';
  for (char bo : {da.byteorder(), db.byteorder()})
    if (bo != '=' && bo != '|' && bo != native) return false;
  const ssize_t size = da.itemsize();
  switch (num) {  // numpy type numbers (fixed by numpy's ABI)
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
  if (op < 0 || op >= int(Op::kCount) || (Op(op) == Op::avg && dtype >= int(DType::i8))) return false;
  if (a.ndim() != b.ndim()) return false;
  for (ssize_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) != b.shape(i)) return false;
  count = size_t(a.size());
  in_ptr = reinterpret_cast<uintptr_t>(a.data());
  out_ptr = reinterpret_cast<uintptr_t>(b.mutable_data());
  const size_t bytes = count * size_t(size);
  if (in_ptr != out_ptr && in_ptr < out_ptr + bytes && out_ptr < in_ptr + bytes) return false;  // partial overlap
  return true;
}

// ---- out --------------------------------------------------------------------
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


// A tracer's steps as dicts (Tracer.take()).
inline py::list trace_list(const std::vector<TraceStep>& steps) {
  py::list out;
  for (const TraceStep& s : steps) {
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
}

// The ledger (a snapshot of n peers) as
// uint64[collective, peer, (payload, control), (bytes_sent, msgs_sent, bytes_recv, msgs_recv)].
inline py::array_t<uint64_t> traffic_array(const std::vector<Counters>& cells, int n) {
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
}

}  // namespace bind
}  // namespace ringcomm

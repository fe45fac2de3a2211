// Converters between Python objects and the engine's types, for both
// modules: arguments in (the one Call struct every collective arrives as and
// its Task, Options, the fast lane that describes numpy arrays and torch CPU
// tensors), records out (flight records, trace steps, the ledger). No
// signal handling and no registration here: signals.h, bind_engine.h.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "algorithms/plan.h"
#include "core/flight.h"
#include "core/ledger.h"
#include "core/link.h"
#include "core/trace.h"
#include "engine/engine.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

// ---- in ---------------------------------------------------------------------
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
  std::vector<int64_t> counts, out_counts;  // per-rank counts / all_to_all splits (Task)
  std::vector<uintptr_t> in_places, out_places;  // blocks in arrays of their own (Task)
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
  t.counts = c.counts;
  t.out_counts = c.out_counts;
  t.in_places = c.in_places;
  t.out_places = c.out_places;
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

// The vocabulary's names -> codes (ringcomm/vocab.py's OPS and ALGORITHMS,
// registered once at import: register_vocab). The fast lanes take the
// caller's op and algorithm as given and look them up here: one dict
// lookup in C each, where Python's spent about 60 ns per call on two.
// Anything that is not one of the table's names (an int code included: the
// API takes names) is `missing`: the lane declines and the Python adapter
// explains.
struct VocabTables {
  py::dict ops, algorithms;
};
inline VocabTables& vocab_tables() {
  static VocabTables* t = new VocabTables();  // never destroyed: outlives the interpreter's teardown
  return *t;
}
inline int vocab_code(const py::dict& table, py::handle key, int missing) {
  PyObject* k = key.ptr();
  if (!PyUnicode_CheckExact(k) || !table) return missing;
  PyObject* v = PyDict_GetItemWithError(table.ptr(), k);  // borrowed
  if (!v) {
    PyErr_Clear();
    return missing;
  }
  return int(PyLong_AsLong(v));
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
    case 0: dtype = int(DType::b8); break;    // NPY_BOOL
    case 3: dtype = int(DType::i16); break;   // NPY_SHORT
    case 4: dtype = int(DType::u16); break;   // NPY_USHORT
    case 5: case 7: case 9:                   // NPY_INT, NPY_LONG, NPY_LONGLONG
      if (size == 4) dtype = int(DType::i32);
      else if (size == 8) dtype = int(DType::i64);
      else return false;
      break;
    case 6: case 8: case 10:                  // NPY_UINT, NPY_ULONG, NPY_ULONGLONG
      if (size == 4) dtype = int(DType::u32);
      else if (size == 8) dtype = int(DType::u64);
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
  if (op < 0 || op >= int(Op::kCount) || !op_fits(DType(c.dtype), Op(op))) return false;
  if (algo < int(Algo::automatic) || algo >= int(Algo::kCount)) return false;
  const size_t bytes = c.count * dtype_size(DType(c.dtype));
  if (c.in != c.out && c.in < c.out + bytes && c.out < c.in + bytes) return false;  // partial overlap
  c.coll = int(Coll::all_reduce);
  c.op = op;
  c.algo = algo;
  c.root = 0;
  return true;
}

// The same fast lane for reduce_scatter (`x` the full buffer, `out` this
// rank's chunk) and all_gather (`x` this rank's chunk, `out` the full
// buffer): 1-D numpy ndarrays of one supported dtype, C-contiguous, `out`
// writable and apart from `x`, the chunk of the split rule's size. False for
// anything else (torch tensors, other shapes, overlap): the Python adapter.
inline bool host_halves_call(Coll coll, py::handle x, py::handle out, int op, int algo, int rank, int size, Call& c) {
  if (!py::isinstance<py::array>(x) || !py::isinstance<py::array>(out)) return false;
  auto a = py::reinterpret_borrow<py::array>(x), b = py::reinterpret_borrow<py::array>(out);
  if (a.ndim() != 1 || b.ndim() != 1) return false;
  int dout = -1;
  size_t nin = 0, nout = 0;
  if (!numpy_array(x, false, c.dtype, nin, c.in) || !numpy_array(out, true, dout, nout, c.out) || dout != c.dtype)
    return false;
  const size_t total = coll == Coll::reduce_scatter ? nin : nout;
  const size_t mine = split_size(total, size_t(size), size_t(rank));
  if ((coll == Coll::reduce_scatter ? nout : nin) != mine) return false;
  if (coll == Coll::reduce_scatter &&
      (op < 0 || op >= int(Op::kCount) || !op_fits(DType(c.dtype), Op(op))))
    return false;
  if (algo < int(Algo::automatic) || algo >= int(Algo::kCount)) return false;
  const size_t es = dtype_size(DType(c.dtype));
  if (c.in < c.out + nout * es && c.out < c.in + nin * es) return false;  // overlap: the adapter decides
  c.coll = int(coll);
  c.count = total;
  c.op = coll == Coll::reduce_scatter ? op : 0;
  c.algo = algo;
  c.root = 0;
  return true;
}

// One host array of either family: a numpy ndarray or a torch CPU tensor,
// C-contiguous, of a supported dtype (numpy: writable when asked).
inline bool host_array(py::handle x, bool writable, int& dtype, size_t& count, uintptr_t& ptr) {
  if (py::isinstance<py::array>(x)) return numpy_array(x, writable, dtype, count, ptr);
  const py::object& tensor = torch_types().tensor;
  return tensor && PyObject_IsInstance(x.ptr(), tensor.ptr()) == 1 && torch_tensor(x, dtype, count, ptr);
}

// The same fast lane for the rooted and personalized collectives with equal
// blocks (ringcomm/door.py's broadcast, reduce, gather, scatter, all_to_all
// without counts or splits), the output given: the door's checks, and False
// for anything it would refuse or treat specially (out missing, a partial
// overlap, counts that do not divide), so its errors stay the only ones.
// Only the arrays this rank uses are looked at (as the door does: off the
// root, reduce's and gather's `out` and scatter's `x` are ignored).
inline bool host_rooted_call(Coll coll, py::handle x, py::handle out, int root, int op, int algo, int rank,
                             int size, Call& c) {
  if (algo < int(Algo::automatic) || algo >= int(Algo::kCount) || root < 0 || root >= size) return false;
  const bool at_root = rank == root;
  int dx = -1, dout = -1;
  size_t nx = 0, nout = 0;
  uintptr_t px = 0, pout = 0;
  auto overlap = [&](size_t es) { return px < pout + nout * es && pout < px + nx * es; };
  switch (coll) {
    case Coll::broadcast:  // in place; written off the root
      if (!host_array(x, !at_root, dx, nx, px)) return false;
      c.dtype = dx, c.count = nx, c.in = c.out = px;
      break;
    case Coll::reduce:
      if (op < 0 || op >= int(Op::kCount) || !host_array(x, at_root && out.is_none(), dx, nx, px)) return false;
      if (!op_fits(DType(dx), Op(op))) return false;
      if (at_root && !out.is_none()) {
        if (!host_array(out, true, dout, nout, pout) || dout != dx || nout != nx) return false;
        if (pout != px && overlap(dtype_size(DType(dx)))) return false;
        if (py::isinstance<py::array>(x) != py::isinstance<py::array>(out) ||
            !x.attr("shape").equal(out.attr("shape")))
          return false;
      } else if (at_root) {
        pout = px;
      }
      c.dtype = dx, c.count = nx, c.in = px, c.out = at_root ? pout : 0, c.op = op;
      break;
    case Coll::gather: {  // the root's out: every block, this rank's at rank * block (or x is that block)
      if (!host_array(x, false, dx, nx, px)) return false;
      if (at_root) {
        if (!host_array(out, true, dout, nout, pout) || dout != dx || nout != nx * size_t(size)) return false;
        const size_t es = dtype_size(DType(dx));
        if (overlap(es) && px != pout + size_t(rank) * nx * es) return false;
      }
      c.dtype = dx, c.count = nx * size_t(size), c.in = px, c.out = at_root ? pout : 0;
      break;
    }
    case Coll::scatter: {  // the root's x: every block; out: this rank's
      if (!host_array(out, true, dout, nout, pout)) return false;
      if (at_root) {
        if (!host_array(x, false, dx, nx, px) || dx != dout || nx != nout * size_t(size)) return false;
        const size_t es = dtype_size(DType(dx));
        if (overlap(es) && pout != px + size_t(rank) * nout * es) return false;
      }
      c.dtype = dout, c.count = nout * size_t(size), c.in = at_root ? px : 0, c.out = pout;
      break;
    }
    case Coll::all_to_all:
      if (!host_array(x, false, dx, nx, px) || !host_array(out, true, dout, nout, pout) || dout != dx ||
          nout != nx || nx % size_t(size) || overlap(dtype_size(DType(dx))))
        return false;
      c.dtype = dx, c.count = nx, c.in = px, c.out = pout;
      break;
    default:
      return false;
  }
  c.coll = int(coll);
  c.algo = algo;
  c.root = coll == Coll::all_to_all ? 0 : root;
  return true;
}

// all_to_all with per-peer splits (torch's all_to_all_single with split
// sizes, every MoE dispatch): `splits` and `out_splits` lists or tuples of
// `size` exact Python ints >= 0 summing to x's and out's lengths, the block
// a rank sends itself fitting its own (splits[rank] == out_splits[rank]),
// every block at most `max_block_bytes` (one message each); x and out of
// one dtype, apart. The Python adapter's description costs about 9 us here,
// a fifth of a 1 MiB exchange at N = 2. False for anything else: the
// adapter then runs and names what is wrong.
inline bool int_list(py::handle h, int size, std::vector<int64_t>& v) {
  if (!PyList_CheckExact(h.ptr()) && !PyTuple_CheckExact(h.ptr())) return false;
  if (PySequence_Fast_GET_SIZE(h.ptr()) != size) return false;
  PyObject** items = PySequence_Fast_ITEMS(h.ptr());
  v.resize(size_t(size));
  for (int i = 0; i < size; ++i) {
    if (!PyLong_CheckExact(items[i])) return false;  // bool, numpy ints, floats: the adapter
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(items[i], &overflow);
    if (overflow || x < 0 || size_t(x) > kMaxElements) return false;
    v[size_t(i)] = x;
  }
  return true;
}

inline bool host_all_to_all_v_call(py::handle x, py::handle out, py::handle splits, py::handle out_splits, int algo,
                                   size_t max_block_bytes, int rank, int size, Call& c) {
  if (algo != int(Algo::automatic) && algo != int(Algo::pairwise) && algo != int(Algo::shm)) return false;
  int dx = -1, dout = -1;
  size_t nx = 0, nout = 0;
  uintptr_t px = 0, pout = 0;
  if (!host_array(x, false, dx, nx, px) || !host_array(out, true, dout, nout, pout) || dout != dx) return false;
  const size_t es = dtype_size(DType(dx));
  if (px < pout + nout * es && pout < px + nx * es) return false;  // overlapping
  if (!int_list(splits, size, c.counts) || !int_list(out_splits, size, c.out_counts)) return false;
  if (c.counts[size_t(rank)] != c.out_counts[size_t(rank)]) return false;
  size_t sent = 0, received = 0;  // (each at most kMaxElements, and so is every partial sum: no wrap-around)
  for (int p = 0; p < size; ++p) {
    const size_t s = size_t(c.counts[size_t(p)]), r = size_t(c.out_counts[size_t(p)]);
    if (p != rank && (s * es > max_block_bytes || r * es > max_block_bytes)) return false;
    sent += s, received += r;
    if (sent > kMaxElements || received > kMaxElements) return false;
  }
  if (sent != nx || received != nout) return false;
  c.coll = int(Coll::all_to_all), c.dtype = dx, c.count = nx, c.in = px, c.out = pout, c.root = 0, c.algo = algo;
  return true;
}

// The same fast lane for a blocking send or recv: `x` one numpy ndarray or
// torch CPU tensor (C-contiguous, a supported dtype; a receive's writable),
// `peer` an int in range and not this rank (a receive: or None, any source),
// `tag` a non-negative int. False for anything else or unusual: the caller
// takes the Python adapter, whose errors say what is wrong.
// `to_self`: sendrecv, where the peer may be this rank (a copy).
inline bool host_p2p_call(py::handle x, py::handle peer, py::handle tag, bool send, int rank, int size, int& dtype,
                          size_t& count, uintptr_t& ptr, int& p, int& t, bool to_self = false) {
  if (peer.is_none()) {
    if (send) return false;
    p = kAnySource;
  } else {
    if (!PyLong_CheckExact(peer.ptr())) return false;  // bool, numpy ints: the adapter
    int overflow = 0;
    const long v = PyLong_AsLongAndOverflow(peer.ptr(), &overflow);
    if (overflow || v < 0 || v >= size || (v == rank && !to_self)) return false;
    p = int(v);
  }
  if (!PyLong_CheckExact(tag.ptr())) return false;
  int overflow = 0;
  const long v = PyLong_AsLongAndOverflow(tag.ptr(), &overflow);
  if (overflow || v < 0 || v > 0x7fffffffL) return false;
  t = int(v);
  if (py::isinstance<py::array>(x)) return numpy_array(x, !send, dtype, count, ptr);
  const py::object& tensor = torch_types().tensor;
  return tensor && PyObject_IsInstance(x.ptr(), tensor.ptr()) == 1 && torch_tensor(x, dtype, count, ptr);
}

inline py::list flight_list(const std::vector<FlightRecord>& recs) {
  static const char* states[] = {"queued", "running", "done", "failed"};
  static const char* phases[] = {"reduce_scatter", "all_gather", "broadcast", "gather", "scatter",
                                 "fold", "exchange", "unfold", "tree", "all_to_all"};
  py::list out;
  for (const FlightRecord& r : recs) {
    py::dict d;
    d["seq"] = r.seq;
    d["collective"] = coll_name(Coll(r.coll));
    d["count"] = r.count;
    const bool has_dtype = Coll(r.coll) != Coll::barrier;
    d["dtype"] = has_dtype ? py::object(py::str(dtype_name(DType(r.dtype)))) : py::object(py::none());
    const bool has_op = coll_reduces(Coll(r.coll));
    d["op"] = has_op ? py::object(py::str(op_name(Op(r.op)))) : py::object(py::none());
    // A p2p op's record keeps its peer in `root` and its tag in `algo`
    // (engine/p2p.cpp): here they are named peer (None: any source) and tag.
    const bool p2p = Coll(r.coll) == Coll::send || Coll(r.coll) == Coll::recv;
    d["root"] = !p2p && coll_has_root(Coll(r.coll)) ? py::object(py::int_(r.root)) : py::object(py::none());
    d["algorithm"] = p2p ? py::object(py::none()) : py::object(py::str(algo_name(Algo(r.algo))));
    d["peer"] = p2p && r.root >= 0 ? py::object(py::int_(r.root)) : py::object(py::none());
    d["tag"] = p2p ? py::object(py::int_(r.algo)) : py::object(py::none());
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

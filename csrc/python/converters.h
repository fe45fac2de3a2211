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
// (ringcomm/door.py, or host_same_shape_call below for the common case):
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

// The DType of a numpy type number (fixed by numpy's ABI) of `size` bytes,
// or -1 where ringcomm has none.
inline int numpy_dtype(int num, ssize_t size) {
  struct Row { int num; DType dtype; };
  static const Row fixed[] = {
      {23, DType::f16},  // NPY_HALF
      {11, DType::f32},  // NPY_FLOAT
      {12, DType::f64},  // NPY_DOUBLE
      {1, DType::i8},    // NPY_BYTE
      {2, DType::u8},    // NPY_UBYTE
      {0, DType::b8},    // NPY_BOOL
      {3, DType::i16},   // NPY_SHORT
      {4, DType::u16},   // NPY_USHORT
  };
  for (const Row& row : fixed)
    if (row.num == num) return int(row.dtype);
  const bool is_signed = num == 5 || num == 7 || num == 9;       // NPY_INT, NPY_LONG, NPY_LONGLONG
  const bool is_unsigned = num == 6 || num == 8 || num == 10;    // NPY_UINT, NPY_ULONG, NPY_ULONGLONG
  if (!(is_signed || is_unsigned) || (size != 4 && size != 8)) return -1;
  if (is_signed) return int(size == 4 ? DType::i32 : DType::i64);
  return int(size == 4 ? DType::u32 : DType::u64);
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
  const int code = numpy_dtype(d.num(), d.itemsize());
  if (code < 0) return false;
  dtype = code;
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

// Whether an op code is one the fast lanes take for `dtype`, and an
// algorithm code one they pass on.
inline bool op_code_fits(int dtype, int op) {
  return op >= 0 && op < int(Op::kCount) && op_fits(DType(dtype), Op(op));
}
inline bool algo_code_valid(int algo) { return algo >= int(Algo::automatic) && algo < int(Algo::kCount); }

// all_reduce's two numpy arrays: C-contiguous, `out` writable, the same shape.
inline bool numpy_same_shape(py::handle x, py::handle out, Call& c, int& dout, size_t& nout) {
  if (!py::isinstance<py::array>(out) || !numpy_array(x, false, c.dtype, c.count, c.in) ||
      !numpy_array(out, true, dout, nout, c.out))
    return false;
  auto a = py::reinterpret_borrow<py::array>(x), b = py::reinterpret_borrow<py::array>(out);
  if (a.ndim() != b.ndim()) return false;
  for (ssize_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) != b.shape(i)) return false;
  return true;
}

// all_reduce's two torch CPU tensors (or one, in place): the same shape.
inline bool torch_same_shape(py::handle x, py::handle out, Call& c, int& dout, size_t& nout) {
  const py::object& tensor = torch_types().tensor;
  if (!tensor || !PyObject_IsInstance(x.ptr(), tensor.ptr()) || !torch_tensor(x, c.dtype, c.count, c.in))
    return false;
  if (out.is(x)) {
    dout = c.dtype, nout = c.count, c.out = c.in;
    return true;
  }
  static const py::str shape("shape");
  return PyObject_IsInstance(out.ptr(), tensor.ptr()) && torch_tensor(out, dout, nout, c.out) &&
         x.attr(shape).equal(out.attr(shape));
}

// all_reduce, scan and exscan (an output of the input's shape, an op):
// exscan's avg is left to the door, whose error says why.
inline bool host_same_shape_call(Coll coll, py::handle x, py::handle out, int op, int algo, Call& c) {
  int dout = -1;
  size_t nout = 0;
  const bool arrays = py::isinstance<py::array>(x) ? numpy_same_shape(x, out, c, dout, nout)
                                                   : torch_same_shape(x, out, c, dout, nout);
  if (!arrays || dout != c.dtype || nout != c.count) return false;
  if (!op_code_fits(c.dtype, op) || !algo_code_valid(algo)) return false;
  if (op == int(Op::avg) && !coll_takes_avg(coll)) return false;
  const size_t bytes = c.count * dtype_size(DType(c.dtype));
  if (c.in != c.out && c.in < c.out + bytes && c.out < c.in + bytes) return false;  // partial overlap
  c.coll = int(coll);
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
  if (coll == Coll::reduce_scatter && !op_code_fits(c.dtype, op)) return false;
  if (!algo_code_valid(algo)) return false;
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
// The two arrays of a rooted call as host_rooted_call reads them.
struct RootedArrays {
  py::handle x, out;
  int rank, size;
  bool at_root;
  int dx = -1, dout = -1;
  size_t nx = 0, nout = 0;
  uintptr_t px = 0, pout = 0;
  bool overlap(size_t es) const { return px < pout + nout * es && pout < px + nx * es; }
  bool take_x(bool writable) { return host_array(x, writable, dx, nx, px); }
  bool take_out() { return host_array(out, true, dout, nout, pout); }
};

// broadcast: in place; written off the root.
inline bool rooted_broadcast(RootedArrays& a, Call& c) {
  if (!a.take_x(!a.at_root)) return false;
  c.dtype = a.dx, c.count = a.nx, c.in = c.out = a.px;
  return true;
}

// reduce: the root's out (or x, in place) gets the sums.
inline bool rooted_reduce(RootedArrays& a, int op, Call& c) {
  const bool own_out = a.at_root && !a.out.is_none();
  if (op < 0 || op >= int(Op::kCount) || !a.take_x(a.at_root && a.out.is_none())) return false;
  if (!op_fits(DType(a.dx), Op(op))) return false;
  if (own_out) {
    if (!a.take_out() || a.dout != a.dx || a.nout != a.nx) return false;
    if (a.pout != a.px && a.overlap(dtype_size(DType(a.dx)))) return false;
    if (py::isinstance<py::array>(a.x) != py::isinstance<py::array>(a.out) ||
        !a.x.attr("shape").equal(a.out.attr("shape")))
      return false;
  } else if (a.at_root) {
    a.pout = a.px;
  }
  c.dtype = a.dx, c.count = a.nx, c.in = a.px, c.out = a.at_root ? a.pout : 0, c.op = op;
  return true;
}

// gather: the root's out holds every block, this rank's at rank * block (or x is that block).
inline bool rooted_gather(RootedArrays& a, Call& c) {
  if (!a.take_x(false)) return false;
  if (a.at_root) {
    if (!a.take_out() || a.dout != a.dx || a.nout != a.nx * size_t(a.size)) return false;
    const size_t es = dtype_size(DType(a.dx));
    if (a.overlap(es) && a.px != a.pout + size_t(a.rank) * a.nx * es) return false;
  }
  c.dtype = a.dx, c.count = a.nx * size_t(a.size), c.in = a.px, c.out = a.at_root ? a.pout : 0;
  return true;
}

// scatter: the root's x holds every block; out gets this rank's.
inline bool rooted_scatter(RootedArrays& a, Call& c) {
  if (!a.take_out()) return false;
  if (a.at_root) {
    if (!a.take_x(false) || a.dx != a.dout || a.nx != a.nout * size_t(a.size)) return false;
    const size_t es = dtype_size(DType(a.dx));
    if (a.overlap(es) && a.pout != a.px + size_t(a.rank) * a.nout * es) return false;
  }
  c.dtype = a.dout, c.count = a.nout * size_t(a.size), c.in = a.at_root ? a.px : 0, c.out = a.pout;
  return true;
}

// all_to_all with equal blocks: x and out of one length that n divides, apart.
inline bool rooted_all_to_all(RootedArrays& a, Call& c) {
  if (!a.take_x(false) || !a.take_out() || a.dout != a.dx || a.nout != a.nx || a.nx % size_t(a.size) ||
      a.overlap(dtype_size(DType(a.dx))))
    return false;
  c.dtype = a.dx, c.count = a.nx, c.in = a.px, c.out = a.pout;
  return true;
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
  if (!algo_code_valid(algo) || root < 0 || root >= size) return false;
  RootedArrays a{x, out, rank, size, rank == root};
  bool described = false;
  switch (coll) {
    case Coll::broadcast: described = rooted_broadcast(a, c); break;
    case Coll::reduce: described = rooted_reduce(a, op, c); break;
    case Coll::gather: described = rooted_gather(a, c); break;
    case Coll::scatter: described = rooted_scatter(a, c); break;
    case Coll::all_to_all: described = rooted_all_to_all(a, c); break;
    default: break;
  }
  if (!described) return false;
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

// `v` as a Python object when `has`, else None.
template <class T>
py::object some(bool has, T v) {
  return has ? py::object(py::cast(v)) : py::object(py::none());
}
inline py::object seconds(uint64_t ns) { return some(ns != 0, double(ns) * 1e-9); }

// What was called: collective, size, dtype, op, root or peer, algorithm or tag.
inline void flight_call_fields(py::dict& d, const FlightRecord& r) {
  const Coll coll = Coll(r.coll);
  d["seq"] = r.seq;
  d["collective"] = coll_name(coll);
  d["count"] = r.count;
  // (names looked up only where the code is one: a barrier's dtype, a p2p op's tag are not)
  d["dtype"] = coll != Coll::barrier ? py::object(py::str(dtype_name(DType(r.dtype)))) : py::object(py::none());
  d["op"] = coll_reduces(coll) ? py::object(py::str(op_name(Op(r.op)))) : py::object(py::none());
  // A p2p op's record keeps its peer in `root` and its tag in `algo`
  // (engine/p2p.cpp): here they are named peer (None: any source) and tag.
  const bool p2p = coll == Coll::send || coll == Coll::recv;
  d["root"] = some(!p2p && coll_has_root(coll), r.root);
  d["algorithm"] = p2p ? py::object(py::none()) : py::object(py::str(algo_name(Algo(r.algo))));
  d["peer"] = some(p2p && r.root >= 0, r.root);
  d["tag"] = some(p2p, r.algo);
}

// How far it got: state, times, phase, step, segment, what it waits for.
inline void flight_progress_fields(py::dict& d, const FlightRecord& r) {
  static const char* states[] = {"queued", "running", "done", "failed"};
  static const char* phases[] = {"reduce_scatter", "all_gather", "broadcast", "gather", "scatter",
                                 "fold", "exchange", "unfold", "tree", "all_to_all"};
  d["state"] = states[int(r.state)];
  d["t_issue"] = double(r.t_issue_ns) * 1e-9;
  d["t_start"] = seconds(r.t_start_ns);
  d["t_end"] = seconds(r.t_end_ns);
  const bool has_phase = r.phase >= 0 && r.phase < int(Phase::kCount);
  d["phase"] = has_phase ? py::object(py::str(phases[r.phase])) : py::object(py::none());
  d["step"] = some(r.step >= 0, r.step);
  d["segment"] = some(r.segment >= 0, r.segment);
  const bool waiting = r.waiting != 0 && r.peer >= 0;
  d["waiting_for"] = some(waiting, r.peer);
  d["waiting_to"] = some(waiting, std::string(r.waiting == 1 ? "receive" : "send"));
  d["waiting_what"] = some(waiting, std::string(r.what));
  d["waiting_since"] = some(waiting, double(r.wait_since_ns) * 1e-9);
}

inline py::list flight_list(const std::vector<FlightRecord>& recs) {
  py::list out;
  for (const FlightRecord& r : recs) {
    py::dict d;
    flight_call_fields(d, r);
    flight_progress_fields(d, r);
    d["bytes_sent"] = r.bytes_sent;
    d["bytes_received"] = r.bytes_received;
    d["error"] = some(!r.error.empty(), r.error);
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

// The table of algorithms (algorithms/registry.h) for Python:
// _core.algorithm_table() (and _cuda's), read by ringcomm/algorithms.py, and
// the vocabulary's codes (dtypes, ops, collectives, algorithms), so Python's copies are
// checked against the enums (ringcomm/algorithms.py).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "algorithms/registry.h"

#include <vector>

namespace ringcomm {
namespace bind {

inline void bind_algorithms(pybind11::module_& m) {
  namespace py = pybind11;
  m.def(
      "algorithm_table",
      [] {
        size_t n = 0;
        const AlgoRow* rows = algorithm_rows(&n);
        py::list out;
        for (size_t i = 0; i < n; ++i) {
          const AlgoRow& r = rows[i];
          py::list needs;
          for (uint32_t bit = 1; bit && bit <= r.needs; bit <<= 1)
            if (r.needs & bit) needs.append(need_name(bit));
          py::dict d;
          d["collective"] = coll_name(r.coll);
          d["algorithm"] = algo_name(r.algo);
          d["path"] = path_name(r.path);
          d["host"] = true;
          d["device"] = r.path == AlgoPath::messages;
          d["needs"] = py::tuple(needs);
          d["auto"] = r.auto_ok;
          d["finalize_avg"] = r.finalize_avg;
          d["traffic"] = r.traffic;
          out.append(d);
        }
        return out;
      },
      "The engine's table of algorithms: one dict per (collective, algorithm) it runs (algorithms/registry.h).");
  m.def(
      "closed_form",
      [](int coll, int algo, int n, int rank, size_t count, size_t es, size_t segment_bytes) {
        const AlgoRow* r = find_algorithm(Coll(coll), Algo(algo));
        if (!r || !r->closed_form) throw_invalid("this row has no native closed form");
        if (n < 1 || rank < 0 || rank >= n) throw_invalid("rank out of range");
        std::vector<int64_t> sent(size_t(n), 0), received(size_t(n), 0);
        r->closed_form(n, rank, count, es, segment_bytes, sent.data(), received.data());
        py::dict s, v;
        for (int p = 0; p < n; ++p) {
          if (sent[size_t(p)]) s[py::int_(p)] = sent[size_t(p)];
          if (received[size_t(p)]) v[py::int_(p)] = received[size_t(p)];
        }
        return py::make_tuple(s, v);
      },
      "A row's own closed form (traffic \"native\"): ({peer: bytes sent}, {peer: bytes received}) of one rank.");
  m.def("hierarchical_pieces", [](size_t count, int local, size_t es) {
        if (local < 1 || es < 1) throw_invalid("local and es must be at least 1");
        return hierarchical_pieces(count, local, es);
      },
      "How many pieces the hierarchical all_reduce of `count` elements of `es` bytes, `local` ranks per host, "
      "pipelines (shm_hierarchical.cpp).");
  m.def(
      "vocabulary_codes",
      [] {
        py::dict dtypes, ops, colls, algos;
        for (int t = 0; t < int(DType::kCount); ++t) dtypes[dtype_name(DType(t))] = t;
        for (int o = 0; o < int(Op::kCount); ++o) ops[op_name(Op(o))] = o;
        for (int c = 0; c < int(Coll::kCount); ++c) colls[coll_name(Coll(c))] = c;
        algos[algo_name(Algo::automatic)] = int(Algo::automatic);
        for (int a = 0; a < int(Algo::kCount); ++a) algos[algo_name(Algo(a))] = a;
        py::dict d;
        d["dtypes"] = dtypes;
        d["ops"] = ops;
        d["collectives"] = colls;
        d["algorithms"] = algos;
        return d;
      },
      "The dtype, op, collective and algorithm codes of csrc/core/vocabulary.h, by name.");
}

}  // namespace bind
}  // namespace ringcomm

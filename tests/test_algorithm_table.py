"""The table of algorithms (csrc/algorithms/registry.h, ringcomm/algorithms.py):
Python's lists are its rows, and the engine runs exactly what it lists."""

import numpy as np
import pytest

import ringcomm
from ringcomm import algorithms, vocab
from ringcomm._native import core
from ringcomm.errors import InvalidArgument


def test_vocabulary_codes_are_the_native_ones():
    native = core.vocabulary_codes()
    assert dict(native["collectives"]) == vocab.COLLECTIVES
    assert dict(native["algorithms"]) == vocab.ALGORITHMS
    assert dict(native["dtypes"]) == vocab.DTYPES
    assert dict(native["ops"]) == vocab.OPS


def test_rows_name_known_codes_once():
    keys = [(r["collective"], r["algorithm"]) for r in algorithms.TABLE]
    assert len(keys) == len(set(keys))
    for coll, algo in keys:
        assert coll in vocab.COLLECTIVES and coll not in vocab.P2P and algo in vocab.ALGORITHMS and algo != "auto"
    assert {r["collective"] for r in algorithms.TABLE} == set(vocab.COLLECTIVES) - set(vocab.P2P)
    # reduce_scatter's algorithms leave sums: the engine divides avg after them, and only there
    assert {r["collective"] for r in algorithms.TABLE if r["finalize_avg"]} == {"reduce_scatter"}


def test_lists_are_lookups():
    assert algorithms.names("gather") == ("linear", "shm")
    assert algorithms.names("reduce") == ("ring", "binomial", "shm", "shm_flat")
    assert algorithms.names("all_reduce", path="messages", auto=True) == \
        ("ring", "recursive_doubling", "halving_doubling")
    assert algorithms.collectives("halving_doubling") == ("all_reduce", "reduce_scatter", "all_gather")
    assert not algorithms.auto_ok("all_reduce", "naive") and algorithms.auto_ok("reduce", "binomial")
    from ringcomm.benchmark.impls import BENCH_ALGORITHMS
    assert {"shm", "shm_flat"} <= set(BENCH_ALGORITHMS) and "hierarchical" not in BENCH_ALGORITHMS


def _call(comm, coll, algo):
    x = np.arange(8, dtype=np.float32)
    if coll == "all_reduce":
        return comm.all_reduce(x, algorithm=algo)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x, algorithm=algo)
    if coll == "all_gather":
        return comm.all_gather(x[:4], out=np.empty(8, np.float32), algorithm=algo)
    if coll == "broadcast":
        return comm.broadcast(x, 0, algorithm=algo)
    return comm.barrier(algorithm=algo)


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"])
def test_the_engine_runs_what_the_table_lists(coll):
    # On 2 in-process ranks without a window: every row on the message path
    # that needs nothing runs (and is what ran); every algorithm without a
    # row for the collective is refused before anything moves.
    def body(comm):
        for algo in vocab.ALGORITHMS:
            if algo == "auto":
                continue
            r = algorithms.row(coll, algo)
            if r is not None and r["path"] == "messages" and set(r["needs"]) <= {"pow2"}:
                _call(comm, coll, algo)
                assert comm.last_algorithm == algo, (coll, algo)
            elif r is None:
                with pytest.raises(InvalidArgument):
                    _call(comm, coll, algo)
        return comm.traffic().bytes_sent("all_reduce") >= 0
    assert all(ringcomm.run_local(2, body, timeout=20))

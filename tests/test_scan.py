"""scan and exscan (issue 51): every op and dtype against numpy, both
algorithms, world sizes 1-7, counts around the segment size; exscan's rank 0
gets the op's identity; the ledger equals the rows' closed forms; bad input
is refused before any byte moves; a mismatch across ranks is an error."""

from __future__ import annotations

import numpy as np
import pytest

import ringcomm
from ringcomm import traffic, vocab
from ringcomm.errors import InvalidArgument, MismatchError

ALGOS = ("recursive_doubling", "linear", "auto")
NP_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def data(rank: int, count: int, dtype: str, op: str) -> np.ndarray:
    """Rank-dependent values that every op keeps exact (small integers; prod
    stays within range: ones and twos; bool: a rank- and index-dependent pattern)."""
    i = np.arange(count)
    if dtype == "bool":
        return ((i * 7 + rank * 3) % 5 < 3)
    if op == "prod":
        v = 1 + ((i + rank) % 3 == 0)
    elif op in ("band", "bor", "bxor"):
        v = (i * 13 + rank * 29 + 5) % 127
    else:
        v = (i * 5 + rank * 11) % 17 + (1 if vocab.itemsize(dtype) > 1 or dtype in vocab.FLOATING else 0)
        if op in ("min", "max") and dtype in vocab.FLOATING:
            v = v - 8.0  # negatives too
        elif op in ("min", "max") and dtype.startswith("int"):
            v = v - 8
    return np.asarray(v).astype(vocab.NUMPY[dtype])


def identity(op: str, dtype: str):
    dt = vocab.NUMPY[dtype]
    if dtype == "bool":
        return op in ("prod", "min", "band")
    if op == "prod":
        return dt.type(1)
    if op == "min":
        return dt.type(np.inf) if dtype in vocab.FLOATING else np.iinfo(dt).max
    if op == "max":
        return dt.type(-np.inf) if dtype in vocab.FLOATING else np.iinfo(dt).min
    if op == "band":
        return dt.type(-1) if dtype.startswith("int") else np.iinfo(dt).max
    return dt.type(0)


def expect(coll: str, rank: int, count: int, dtype: str, op: str) -> np.ndarray:
    """By hand: ranks 0..r (scan) or 0..r-1 (exscan) folded in rank order."""
    dt = vocab.NUMPY[dtype]
    last = rank if coll == "scan" else rank - 1
    if last < 0:
        return np.full(count, identity(op, dtype), dtype=dt)
    if dtype == "bool":
        f = {"sum": np.logical_or, "max": np.logical_or, "prod": np.logical_and, "min": np.logical_and,
             "band": np.logical_and, "bor": np.logical_or, "bxor": np.logical_xor}[op]
    else:
        f = NP_OPS["sum" if op == "avg" else op]
    acc = data(0, count, dtype, op).astype(np.float64 if dtype == "bfloat16" else dt)
    for q in range(1, last + 1):
        acc = f(acc, data(q, count, dtype, op).astype(acc.dtype))
    if op == "avg":
        acc = acc / (last + 1)
    return acc.astype(dt)


def check(coll: str, rank: int, got, count, dtype, op, algorithm) -> list[str]:
    want = expect(coll, rank, count, dtype, op)
    got = np.asarray(got)
    a, b = got.astype(np.float64) if dtype in vocab.FLOATING else got, \
        want.astype(np.float64) if dtype in vocab.FLOATING else want
    if dtype in ("float16", "bfloat16") and op == "avg":
        bad = np.flatnonzero(~np.isclose(a, b, rtol=1e-2))
    else:
        bad = np.flatnonzero(a != b)
    if bad.size:
        i = int(bad[0])
        return [f"{coll} {algorithm} op={op} dtype={dtype} count={count}: rank {rank} index {i}: got {got[i]!r}, "
                f"expected {want[i]!r} ({bad.size} wrong)"]
    return []


def run_cases(comm, colls, counts, combos, algorithms):
    errs = []
    for coll in colls:
        for count in counts:
            for dtype, op in combos:
                if coll == "exscan" and op == "avg":
                    continue
                for algorithm in algorithms:
                    x = data(comm.rank, count, dtype, op)
                    keep = x.copy()
                    out = np.empty_like(x)
                    getattr(comm, coll)(x, op, out=out, algorithm=algorithm)
                    errs += check(coll, comm.rank, out, count, dtype, op, algorithm)
                    if not np.array_equal(x, keep):
                        errs.append(f"{coll}: rank {comm.rank}'s input changed")
                    y = x.copy()  # in place
                    getattr(comm, coll)(y, op, algorithm=algorithm)
                    errs += check(coll, comm.rank, y, count, dtype, op, algorithm + " (in place)")
    return errs


def combos():
    return [(d, o) for d in vocab.DTYPES for o in vocab.OPS if vocab.op_fits(d, o)]


def flat(results):
    return [e for r in results for e in r]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7])
def test_every_dtype_and_op(n):
    errs = flat(ringcomm.run_local(n, run_cases, ("scan", "exscan"), [0, 1, 13], combos(), ALGOS[:2]))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [3, 4, 5])
def test_counts_around_segments(n):
    # segment_bytes=16: 4 float32 per segment; 4k +- 1, a prime, many segments
    counts = [3, 4, 5, 31, 257]
    errs = flat(ringcomm.run_local(n, run_cases, ("scan", "exscan"), counts,
                                   [("float32", "sum"), ("int64", "max"), ("float64", "avg")], ALGOS,
                                   segment_bytes=16))
    assert not errs, "\n".join(errs[:20])


def test_emulated_device():
    errs = flat(ringcomm.run_local(4, run_cases, ("scan", "exscan"), [0, 1, 37],
                                   [("float32", "sum"), ("int32", "min"), ("float64", "avg"), ("uint8", "band")],
                                   ALGOS[:2], device="emulated", jitter_us=20.0, segment_bytes=32))
    assert not errs, "\n".join(errs[:20])


def test_auto_picks_by_size():
    def body(comm):
        got = []
        for count in (16, 1 << 16):
            comm.scan(np.ones(count, np.float32))
            got.append(comm.last_algorithm)
        return got
    for got in ringcomm.run_local(3, body):
        assert got == ["recursive_doubling", "linear"]


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "linear"])
@pytest.mark.parametrize("n", [3, 5])
def test_ledger_equals_closed_form(n, algorithm):
    count = 101

    def body(comm):
        out = []
        for coll in ("scan", "exscan"):
            comm.reset_traffic()
            comm.scan if coll == "scan" else None
            getattr(comm, coll)(np.arange(count, dtype=np.float64) + comm.rank, algorithm=algorithm)
            t = comm.traffic()
            out.append((t.per_peer("bytes_sent", coll), t.per_peer("bytes_received", coll)))
        return out
    for r, got in enumerate(ringcomm.run_local(n, body, segment_bytes=64)):
        for coll, (sent, received) in zip(("scan", "exscan"), got):
            e = traffic.expected(coll, count, "float64", n, r, algorithm=algorithm)
            assert {p: b for p, b in sent.items() if b} == e.sent, (coll, r)
            assert {p: b for p, b in received.items() if b} == e.received, (coll, r)


def test_exscan_avg_and_bad_input_refused_before_any_byte_moves():
    def body(comm):
        before = comm.traffic().bytes_sent(kind="all")
        msgs = []
        for call in (lambda: comm.exscan(np.ones(4), "avg"),
                     lambda: comm.scan(np.ones(4, np.int32), "avg"),
                     lambda: comm.scan(np.ones(4), out=np.ones(5)),
                     lambda: comm.scan(np.ones(4), algorithm="ring")):
            with pytest.raises(InvalidArgument) as info:
                call()
            msgs.append(str(info.value))
        moved = comm.traffic().bytes_sent(kind="all") - before
        x = np.full(3, comm.rank + 1.0)
        comm.scan(x)
        return msgs, moved, x.tolist()
    for r, (msgs, moved, x) in enumerate(ringcomm.run_local(2, body)):
        assert moved == 0
        assert "avg" in msgs[0] and "exscan" in msgs[0]
        assert "ring" in msgs[3] and "scan" in msgs[3]
        assert x == [[1.0] * 3, [3.0] * 3][r]


def test_mismatch_is_an_error_not_a_hang():
    def body(comm):
        try:
            comm.scan(np.ones(5 + (comm.rank == 1), np.float32), algorithm="linear")
        except ringcomm.RingcommError as e:
            return type(e).__name__
        return "ok"
    got = ringcomm.run_local(3, body, timeout=20)
    assert "ok" not in got, got
    assert any(g == MismatchError.__name__ for g in got), got


def test_offsets_example():
    """docs/examples/uneven_offsets.py: exscan of per-rank counts gives each rank's offset."""
    import runpy
    import os
    mod = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "docs", "examples", "uneven_offsets.py"))
    for n in (1, 3, 4):
        for r, (offset, total, gathered) in enumerate(ringcomm.run_local(n, mod["body"])):
            counts = [mod["my_count"](q) for q in range(n)]
            assert offset == sum(counts[:r]) and total == sum(counts)
            assert gathered == [v for q in range(n) for v in mod["my_items"](q)]


def test_fast_lane_runs_scan_and_exscan_and_declines_the_rest():
    # Synchronous scan / exscan of numpy arrays go through the native fast
    # lane (Engine.run_same_shape, as all_reduce does): results as by hand.
    # What the door must explain (exscan's avg, another collective's code) is
    # declined on every rank at once, nothing issued; the door then refuses
    # exscan's avg with its own error.
    C = vocab.COLLECTIVES

    def body(comm):
        r, e = comm.rank, comm._engine
        errs = []
        for coll in ("scan", "exscan"):
            for op, dtype in (("sum", "int64"), ("max", "float32"), ("prod", "float64")):
                x = data(r, 13, dtype, op)
                out = np.zeros_like(x)
                if not e.run_same_shape(C[coll], x, out, op, "auto"):
                    errs.append(f"rank {r}: {coll} {op} {dtype} declined")
                errs += check(coll, r, out, 13, dtype, op, "fast lane")
                y = x.copy()  # in place
                e.run_same_shape(C[coll], y, y, op, "recursive_doubling")
                errs += check(coll, r, y, 13, dtype, op, "fast lane, in place")
        x = data(r, 5, "float32", "avg")
        if e.run_same_shape(C["exscan"], x, np.zeros_like(x), "avg", "auto"):
            errs.append(f"rank {r}: exscan avg taken by the fast lane")
        if e.run_same_shape(C["reduce_scatter"], x, np.zeros_like(x), "sum", "auto"):
            errs.append(f"rank {r}: reduce_scatter taken by the same-shape lane")
        with pytest.raises(InvalidArgument, match="avg"):
            comm.exscan(x, op="avg")
        comm.scan(x, op="avg")  # the communicator still works
        errs += check("scan", r, x, 5, "float32", "avg", "after the declines")
        return errs

    assert flat(ringcomm.run_local(3, body)) == []

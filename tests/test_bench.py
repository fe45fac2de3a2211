"""The benchmark harness: pure parts, a smoke run through `ringcomm bench`, a planted error."""

import importlib.util
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

from ringcomm import benchmark
from ringcomm.tuning import costmodel
from ringcomm.config import parse_size
from tiers import slow_except


def test_size_parsing():
    assert parse_size("8") == 8 and parse_size("64K") == 65536 and parse_size("4M") == 4 << 20
    assert parse_size("1G") == 1 << 30 and parse_size("2KiB") == 2048 and parse_size(512) == 512
    with pytest.raises(ValueError):
        parse_size("4X")
    assert benchmark.size_list(8, 64 << 20, 4)[:3] == [8, 32, 128]
    assert benchmark.size_list(8, 64 << 20, 4)[-1] == 32 << 20
    assert benchmark.size_list(1 << 20, 1 << 20, 2) == [1 << 20]
    with pytest.raises(ValueError):
        benchmark.size_list(0, 10, 2)


def test_busbw_factors_are_the_nccl_tests_ones():
    assert benchmark.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert benchmark.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert benchmark.bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert benchmark.bus_factor("all_reduce", 1) == 0


def test_model_fit_recovers_synthetic_parameters():
    alpha, beta = 12e-6, 0.4e-9
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for n in (2, 4, 7):
            sizes = np.array([8, 1024, 65536, 1 << 20, 16 << 20], float)
            t = costmodel.Model(alpha, beta).predict(coll, n, sizes)
            m = costmodel.fit(coll, n, sizes, t)
            assert m.alpha == pytest.approx(alpha, rel=1e-6) and m.beta == pytest.approx(beta, rel=1e-6)
    # noisy data still lands close, and the crossover is where the two terms meet
    rng = np.random.default_rng(0)
    sizes = np.geomspace(8, 64 << 20, 20)
    t = costmodel.Model(alpha, beta).predict("all_reduce", 4, sizes) * rng.uniform(0.95, 1.05, sizes.size)
    m = costmodel.fit("all_reduce", 4, sizes, t)
    assert m.alpha == pytest.approx(alpha, rel=0.15) and m.beta == pytest.approx(beta, rel=0.15)
    x = costmodel.crossover_bytes(m, "all_reduce", 4)
    assert 6 * m.alpha == pytest.approx(1.5 * x * m.beta)


def test_check_data_reference_is_exact():
    for dtype in ("bfloat16", "float16", "int8", "float32"):
        for op in ("sum", "prod", "min", "max"):
            exp = benchmark.check_expected(dtype, op, 4, 100)
            assert exp.dtype == benchmark.vocab.NUMPY[dtype] and exp.size == 100


def test_check_data_from_one_period_equals_the_formula():
    # check_data and check_expected repeat one period of the reducing
    # patterns; the direct formulas (numpy over the whole index) must agree
    from ringcomm import vocab
    for dtype in ("bfloat16", "float16", "int8", "uint8", "int32", "float64"):
        for op in ("sum", "avg", "prod", "min", "max"):
            if op == "avg" and dtype not in vocab.FLOATING:
                continue
            for count in (1, 3, 7, 36, 1001):
                i = np.arange(count, dtype=np.int64)
                xs = []
                for rank in range(3):
                    v = {"sum": (rank + 1) * (i % 5 + 1) % 9, "avg": (rank + 1) * (i % 5 + 1) % 9,
                         "prod": np.where((i + rank) % 3 == 0, 2, 1)}.get(op, (rank * 3 + i) % 7)
                    want = v.astype(vocab.NUMPY[dtype])
                    got = benchmark.check_data(dtype, op, rank, count)
                    assert got.dtype == want.dtype and np.array_equal(got, want), (dtype, op, count, rank)
                    xs.append(want.astype(np.float64))
                x = np.stack(xs)
                red = {"sum": x.sum(0), "avg": x.sum(0), "prod": x.prod(0), "min": x.min(0), "max": x.max(0)}[op]
                want = red.astype(vocab.NUMPY[dtype])
                if op == "avg":
                    compute = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else vocab.NUMPY[dtype]
                    want = (want.astype(compute) / compute.type(3)).astype(vocab.NUMPY[dtype])
                got = benchmark.check_expected(dtype, op, 3, count)
                assert got.dtype == want.dtype and np.array_equal(got, want), (dtype, op, count)


def run_bench(*args, env=None, timeout=300):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "ringcomm.cli", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, env=e)


def test_smoke_run_n2(tmp_path):
    out = tmp_path / "b.json"
    res = run_bench("-N", "2", "-b", "8", "-e", "64K", "-f", "16", "-r", "2", "--collective", "all",
                    "--impl", "ringcomm,mpi,mpi-ring", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.load(open(out))
    benchmark.validate_json(doc)
    rows = doc["rows"]
    assert {r["impl"] for r in rows} == {"ringcomm", "mpi", "mpi-ring"}
    assert {r["collective"] for r in rows} == set(benchmark.COLLECTIVES)  # the ring's three, issue 23's five, scan and exscan
    assert {r["collective"] for r in rows if r["impl"] == "mpi-ring"} == {"all_reduce", "reduce_scatter", "all_gather"}
    assert all(r["wrong"] == 0 for r in rows)
    ours = [r for r in rows if r["impl"] == "ringcomm"]
    assert ours and all(r["sent_per_rank"] == r["expected_sent"] for r in ours)
    assert "out of bounds values : 0 OK" in res.stdout
    # over MPI point-to-point auto ran recursive doubling at these sizes: the
    # ring's alpha-beta fit has no ring rows, the alpha-beta-gamma fit of what
    # ran is there (algorithms the model has no terms for, as issue 24's
    # shared-memory ones, stay out of the fit)
    from ringcomm.tuning import selection
    ran = {r["algorithm"] for r in ours if r["collective"] == "all_reduce"}
    if ran <= set(selection.ALGORITHMS):
        assert "all_reduce algorithms: model fitted here: alpha=" in res.stdout
    if {r["algorithm"] for r in ours if r["collective"] == "reduce_scatter"} <= {"ring", None}:
        assert "model reduce_scatter: alpha" in res.stdout


@pytest.mark.slow
def test_compare_algorithms_n4(tmp_path):
    # auto beside each forced algorithm; the per-size column names what auto
    # ran, the ledger matches that algorithm's closed form, the footer fits
    # the alpha-beta-gamma model and compares auto with the best forced one.
    from ringcomm.tuning import selection
    # over MPI point-to-point (RINGCOMM_TRANSPORT=mpi where the library has
    # issue 24's shared-memory path): the algorithms the model chooses among
    out = tmp_path / "b.json"
    res = run_bench("-N", "4", "-b", "8", "-e", "1M", "-f", "32", "-r", "2", "--target-ms", "5",
                    "--impl", "ringcomm", "--compare-algorithms", "--json", str(out),
                    env={"RINGCOMM_TRANSPORT": "mpi"})
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.load(open(out))["rows"]
    assert {r["impl"] for r in rows} == {"ringcomm", "rc-ring", "rc-rd", "rc-hd"}
    forced = {"rc-ring": "ring", "rc-rd": "recursive_doubling", "rc-hd": "halving_doubling"}
    costs = selection.costs_for("mpi", 4)  # what init() on 4 ranks chooses by (measured times, if tuned)
    for r in rows:
        want = forced.get(r["impl"]) or selection.best(costs, 4, r["size"])
        assert r["algorithm"] == want, (r["impl"], r["size"], r["algorithm"], want)
        assert r["sent_per_rank"] == r["expected_sent"] and r["wrong"] == 0, r
    assert "auto / best forced algorithm: at most" in res.stdout
    assert "all_reduce algorithms: model fitted here: alpha=" in res.stdout
    assert "by this run's times (forced algorithms), auto would run recursive doubling up to" in res.stdout
    assert f"auto ran by: {costs}" in res.stdout


def test_planted_wrong_result_is_counted_and_fails(tmp_path):
    out = tmp_path / "b.json"
    res = run_bench("-N", "2", "-b", "1K", "-e", "1K", "-r", "1", "--impl", "ringcomm,corrupt",
                    "--json", str(out), env={"RINGCOMM_BENCH_TEST_IMPLS": "1"})
    assert res.returncode != 0
    rows = json.load(open(out))["rows"]
    bad = [r for r in rows if r["impl"] == "corrupt"]
    assert bad and all(r["wrong"] == 1 for r in bad), bad
    assert all(r["wrong"] == 0 for r in rows if r["impl"] == "ringcomm")
    assert "FAILED" in res.stdout


def test_json_schema_validation_rejects_incomplete_documents():
    with pytest.raises(ValueError):
        benchmark.validate_json({"rows": []})


def test_device_choice_selects_the_implementations():
    assert benchmark.parse([]).impl == ["ringcomm", "mpi", "mpi-ring", "gloo"]
    with pytest.raises(SystemExit, match="cannot run with --device host"):
        benchmark.parse(["--impl", "ringcomm,nccl"])
    import ringcomm.cuda as rcuda
    try:
        import cupy  # noqa: F401
        have_cupy = True
    except ImportError:
        have_cupy = False
    if have_cupy and rcuda.available():
        args = benchmark.parse(["--device", "cuda"])
        assert args.impl == ["ringcomm", "nccl"]
        with pytest.raises(SystemExit, match="cannot run with --device cuda"):
            benchmark.parse(["--device", "cuda", "--impl", "mpi"])
    else:  # no GPU stack: a clear refusal, not a traceback
        with pytest.raises(SystemExit, match="--device cuda"):
            benchmark.parse(["--device", "cuda"])


def test_mpi_baselines_skip_what_mpi_cannot_run():
    # Allgather needs equal chunks: a count not divisible by N is not run
    # (it once crashed mpi-ring's launch with mpi4py's "cannot infer count").
    from ringcomm.benchmark.impls import Case, MpiImpl, MpiRingImpl
    for cls in (MpiImpl, MpiRingImpl):
        impl = object.__new__(cls)  # supports() needs no MPI
        assert not impl.supports(Case("all_gather", 5, "float32", "sum", False, 2, 0))
        assert impl.supports(Case("all_gather", 6, "float32", "sum", False, 2, 0))
        assert impl.supports(Case("all_reduce", 5, "float32", "sum", False, 2, 0))
    assert MpiRingImpl.supports(object.__new__(MpiRingImpl), Case("reduce_scatter", 5, "float32", "sum", False, 2, 0))
    # MPI reduces bools by its logical ops only: MPI_SUM or MPI_BAND on MPI_C_BOOL is
    # MPI_ERR_OP (mpi-ring once ran them and crashed `-d bool` and `-d all`)
    for cls in (MpiImpl, MpiRingImpl):
        impl = object.__new__(cls)
        for op in ("sum", "band"):
            assert not impl.supports(Case("all_reduce", 6, "bool", op, False, 2, 0)), (cls, op)
        assert impl.supports(Case("all_reduce", 6, "uint8", "bxor", False, 2, 0))
        assert impl.supports(Case("all_gather", 6, "bool", "sum", False, 2, 0))  # (moving bools is fine)


# ---- the bitwise ops (band, bor, bxor) -----------------------------------------------------------

BITWISE_NP = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def test_bitwise_check_data_and_its_reference():
    # The reference is numpy's own reduction in the dtype itself (check_expected
    # reduces in int64); one period repeated equals the pattern over the whole
    # index; at every world size one host runs, each rank changes the result
    # somewhere and the result is not the same at every index (else a block
    # delivered to the wrong place or a rank left out would pass).
    for dtype in ("int8", "uint8", "int16", "int32", "int64", "uint64", "bool"):
        for op in BITWISE_NP:
            for n in (1, 2, 3, 4, 5, 7, 8, 16):
                count = 1001
                x = np.stack([benchmark.check_data(dtype, op, r, count) for r in range(n)])
                assert x.dtype == benchmark.vocab.NUMPY[dtype]
                if dtype == "bool":
                    assert set(np.unique(x.view(np.uint8))) <= {0, 1}
                want = BITWISE_NP[op].reduce(x, 0)
                got = benchmark.check_expected(dtype, op, n, count)
                assert got.dtype == want.dtype and np.array_equal(got, want), (dtype, op, n)
                assert len(np.unique(want)) > 1, (dtype, op, n)
                for r in range(n if n > 1 else 0):
                    assert not np.array_equal(BITWISE_NP[op].reduce(np.delete(x, r, 0), 0), want), (dtype, op, n, r)
    # the periodic pattern equals its formula over a long index (the period is what the check repeats)
    i = np.arange(5000)
    for rank in (0, 1, 6):
        hit, bit = (rank + i) % 3 == 0, 1 << ((rank + i) % 7)
        assert np.array_equal(benchmark.check_data("int32", "band", rank, i.size), np.where(hit, 127 ^ bit, 127))
        assert np.array_equal(benchmark.check_data("int32", "bor", rank, i.size), np.where(hit, bit, 0))
        assert np.array_equal(benchmark.check_data("int64", "bxor", rank, i.size),
                              ((rank * 3 + i) % 7 * 19 + rank * 5) % 128)
        assert np.array_equal(benchmark.check_data("bool", "band", rank, i.size), np.where(hit, 127 ^ bit, 127) & 1)
        assert np.array_equal(benchmark.check_data("bool", "bxor", rank, i.size), ((rank + i) % 7 == 0) | hit)


def test_bitwise_ops_fit_integer_and_bool_dtypes_only():
    assert {"band", "bor", "bxor"} <= set(benchmark.parse(["-o", "all"]).ops)
    # an op named alone must fit a chosen dtype (once this ran nothing and said OK)
    with pytest.raises(SystemExit, match="op band fits none of the dtypes float32"):
        benchmark.parse(["-o", "band"])
    with pytest.raises(SystemExit, match="op avg fits none of the dtypes int32"):
        benchmark.parse(["-o", "avg", "-d", "int32"])
    assert benchmark.parse(["-o", "band,sum", "-d", "float32,int8"]).ops == ["band", "sum"]
    # a collective that only moves data takes any op (it uses none)
    assert benchmark.parse(["-o", "band", "--collective", "gather"]).ops == ["band"]
    from ringcomm.benchmark.impls import Case, NcclImpl
    assert not NcclImpl.supports(object.__new__(NcclImpl), Case("all_reduce", 6, "int32", "band", False, 2, 0))


def test_bitwise_ops_run_and_check_n2(tmp_path):
    # band, bor, bxor through ringcomm, Open MPI (MPI_BAND...) and gloo (ReduceOp.BAND...) on
    # integers and bool, each result checked; the planted wrong element is counted
    from ringcomm.benchmark.impls import torch_available
    impls = "ringcomm,mpi,corrupt" + (",gloo" if torch_available() else "")
    out = tmp_path / "b.json"
    res = run_bench("-N", "2", "-b", "4K", "-e", "4K", "-r", "1", "--iters", "2", "--collective", "all_reduce,reduce",
                    "-d", "int32,uint8,bool", "-o", "band,bor,bxor", "--impl", impls, "--json", str(out),
                    env={"RINGCOMM_BENCH_TEST_IMPLS": "1"})
    assert res.returncode != 0  # the planted error fails the run
    rows = json.load(open(out))["rows"]
    for impl in impls.split(","):
        got = {(r["collective"], r["dtype"], r["op"]) for r in rows if r["impl"] == impl}
        dtypes = ("int32", "uint8") if impl == "mpi" else ("int32", "uint8", "bool")  # (MPI: no bool op)
        want = {(c, d, o) for c in ("all_reduce", "reduce") for d in dtypes for o in BITWISE_NP}
        assert got == want, (impl, got ^ want)
    assert all(r["wrong"] == 0 for r in rows if r["impl"] != "corrupt")
    assert all(r["wrong"] == 1 for r in rows if r["impl"] == "corrupt" and r["dtype"] != "bool" and not r["inplace"])
    ours = [r for r in rows if r["impl"] == "ringcomm"]
    assert all(r["sent_per_rank"] == r["expected_sent"] > 0 for r in ours)


# ---- issue 23: reduce, gather, scatter, all_to_all, sendrecv -----------------------

NEW = ("reduce", "gather", "scatter", "all_to_all", "sendrecv")


def test_new_collectives_only_with_collective_and_their_busbw_factors():
    assert benchmark.parse([]).collectives == ["all_reduce"]  # the default run is unchanged
    assert benchmark.parse(["--collective", "all"]).collectives == list(benchmark.COLLECTIVES)
    assert set(NEW) <= set(benchmark.COLLECTIVES)
    with pytest.raises(SystemExit, match="unknown collective"):
        benchmark.parse(["--collective", "alltoall"])
    for n in (2, 4, 8):  # nccl-tests: reduce 1, gather/scatter/alltoall (n-1)/n, sendrecv 1
        assert benchmark.bus_factor("reduce", n) == 1 and benchmark.bus_factor("sendrecv", n) == 1
        for c in ("gather", "scatter", "all_to_all"):
            assert benchmark.bus_factor(c, n) == pytest.approx((n - 1) / n)
    # equal blocks: the count is a multiple of n, at least n
    assert benchmark.count_for(4, "float32", 4, "gather") == 4
    assert benchmark.count_for(1000, "float32", 3, "all_to_all") == 249
    assert benchmark.count_for(1000, "float32", 3, "reduce") == 250
    # data that only moves is not periodic: a block from the wrong place shows
    for dtype in ("int8", "bfloat16", "float32"):
        x = benchmark.check_data(dtype, "none", 1, 64)
        assert not np.array_equal(x[:32], x[32:]) and not np.array_equal(x, benchmark.check_data(dtype, "none", 0, 64))


def test_new_collectives_run_and_check_n2(tmp_path):
    from ringcomm.benchmark.impls import torch_available
    impls = "ringcomm,mpi,mpi-ring" + (",gloo" if torch_available() else "")
    out = tmp_path / "b.json"
    res = run_bench("-N", "2", "-b", "4K", "-e", "4K", "-r", "1", "--iters", "2", "--collective", ",".join(NEW),
                    "--impl", impls, "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.load(open(out))
    benchmark.validate_json(doc)
    rows = doc["rows"]
    assert {r["collective"] for r in rows} == set(NEW)
    # Open MPI's ring parameters cover the ring's three only: no mpi-ring launch or rows here
    assert "mpi-ring" not in {r["impl"] for r in rows}
    for coll in NEW:
        got = {r["impl"] for r in rows if r["collective"] == coll}
        want = {"ringcomm", "mpi"} | ({"gloo"} if torch_available() and coll != "sendrecv" else set())
        assert got == want, (coll, got)
    assert all(r["wrong"] == 0 for r in rows)
    ours = [r for r in rows if r["impl"] == "ringcomm"]
    assert ours and all(r["sent_per_rank"] == r["expected_sent"] and r["sent_per_rank"] > 0 for r in ours)
    for r in rows:
        f = 1.0 if r["collective"] in ("reduce", "sendrecv") else 0.5
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * f)
    # reduce runs in place too; the others out-of-place only
    assert {r["collective"] for r in rows if r["inplace"]} == {"reduce"}
    assert "out of bounds values : 0 OK" in res.stdout
    assert "reduce: baseline time / ringcomm time" not in res.stdout  # only from 1 MiB up


def test_scan_and_exscan_against_mpi_scan_and_exscan_n3(tmp_path):
    # Issue 51: ringcomm's scan/exscan beside MPI_Scan/MPI_Exscan (gloo has
    # none), out of place and in place, checked against numpy's prefix over
    # ranks 0..r (exscan's rank 0: ringcomm's identity; MPI's is undefined,
    # unchecked), ringcomm's ledger against the closed form; no exscan avg.
    out = tmp_path / "b.json"
    res = run_bench("-N", "3", "-b", "8", "-e", "128K", "-f", "128", "-r", "1", "--iters", "2",
                    "--collective", "scan,exscan", "-o", "sum,max,avg,band", "-d", "float64,int32",
                    "--impl", "ringcomm,mpi", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.load(open(out))["rows"]
    assert {(r["collective"], r["impl"]) for r in rows} == {(c, i) for c in ("scan", "exscan")
                                                             for i in ("ringcomm", "mpi")}
    assert {r["inplace"] for r in rows if r["impl"] == "ringcomm"} == {False, True}
    assert not [r for r in rows if r["collective"] == "exscan" and r["op"] == "avg"]
    assert {r["op"] for r in rows if r["collective"] == "scan" and r["impl"] == "ringcomm"} == \
        {"sum", "max", "avg", "band"}
    assert all(r["wrong"] == 0 for r in rows)
    ours = [r for r in rows if r["impl"] == "ringcomm"]
    assert all(r["sent_per_rank"] == r["expected_sent"] and r["sent_per_rank"] > 0 for r in ours)


@pytest.mark.slow
def test_planted_wrong_result_in_the_new_collectives_is_counted(tmp_path):
    out = tmp_path / "b.json"
    res = run_bench("-N", "2", "-b", "1K", "-e", "1K", "-r", "1", "--iters", "1", "--collective", ",".join(NEW),
                    "--impl", "ringcomm,corrupt", "--json", str(out), env={"RINGCOMM_BENCH_TEST_IMPLS": "1"})
    assert res.returncode != 0
    rows = json.load(open(out))["rows"]
    bad = {r["collective"]: r["wrong"] for r in rows if r["impl"] == "corrupt" and not r["inplace"]}
    assert bad == {c: 1 for c in NEW}, bad
    assert all(r["wrong"] == 0 for r in rows if r["impl"] == "ringcomm")


# ---- issue 24: the concurrent memcpy reference, the barrier, hot and cold modes ---------------


def test_llc_is_read_from_sysfs(tmp_path):
    from ringcomm.benchmark.harness import _parse_cache_size, llc_info
    assert _parse_cache_size("491520K") == 480 << 20 and _parse_cache_size("32M") == 32 << 20
    assert _parse_cache_size("48K\n") == 48 << 10 and _parse_cache_size("1024") == 1024
    for i, (level, kind, size) in enumerate(((1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K"),
                                             (3, "Unified", "32768K"))):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", "0-7")):
            (d / name).write_text(f"{value}\n")
    got = llc_info(str(tmp_path))
    assert got["bytes"] == 32 << 20 and got["level"] == 3 and got["shared_cpus"] == "0-7"
    here = llc_info()  # this machine: sysfs or getconf, or says it does not know
    assert here["bytes"] is None or here["bytes"] > 0


def test_cold_pool_exceeds_the_llc_and_reuses_no_byte_early():
    from ringcomm.benchmark.harness import ColdPool, cold_pool_bytes, llc_info, slot_bytes
    llc = llc_info()["bytes"] or (32 << 20)
    for full in (4, 65536, 1 << 20, 64 << 20):
        pool = cold_pool_bytes(llc, full)
        assert pool >= 2 * llc + 2 * slot_bytes(full) and pool % 4096 == 0
    assert cold_pool_bytes(llc, 1 << 20, override=8 << 20) == (8 << 20) + 2 * slot_bytes(1 << 20)
    # a small pool, slots of changing sizes: a byte comes back only after
    # reuse_distance bytes of other slots (the cursor wraps in byte order)
    largest = 3 * 4096
    p = ColdPool(np, cold_pool_bytes(0, largest, override=40960), reuse_distance=40960)
    assert not p.buf.any()  # touched (zeros) at allocation
    last_use, taken = {}, 0
    for i in range(200):
        size = slot_bytes((1 + i % 3) * 2048)
        off = p.take(size)
        assert 0 <= off and off + size <= p.nbytes
        for page in range(off // 4096, (off + size) // 4096):
            if page in last_use:
                assert taken - last_use[page] >= p.reuse_distance, (i, page)
            last_use[page] = taken
        taken += size


class _FakeWorld:
    """One rank; counts barriers (Bench.timed's MPI calls are no-ops here)."""
    size, rank = 1, 0

    def __init__(self):
        self.barriers = 0

    def Barrier(self):
        self.barriers += 1

    def allreduce(self, x, op=None):
        return x

    def Allreduce(self, send, recv, op=None):
        pass


def _fake_bench(mode_pool=None):
    import argparse

    from ringcomm.benchmark.harness import Bench
    from ringcomm.benchmark.impls import Impl, MemcpyImpl

    world = _FakeWorld()
    log = []

    class Recorder(Impl):
        name = "rec"

        def __init__(self, name):
            self.name = name

        def run(self, c):
            if not c.inplace:
                np.copyto(c.recv, c.send)  # all_reduce on one rank
            log.append((self.name, world.barriers, c.recv.ctypes.data, world.timing))

    class CountingMemcpy(MemcpyImpl):
        def run(self, c):
            super().run(c)
            log.append(("memcpy", world.barriers, c.recv.ctypes.data, world.timing))

    b = object.__new__(Bench)
    b.args = argparse.Namespace(warmup=2, iters=4, reps=3, target_ms=1, sizes=[4096], dtypes=["float32"],
                                collectives=["all_reduce"], cold_pool_bytes=mode_pool)
    b.w, b.n, b.rank, b.device, b.xp = world, 1, 0, "host", np
    b.impls = [Recorder("a"), Recorder("b")]
    b.memcpy = CountingMemcpy(b)
    b.pool = b.llc = None
    b.rows, b.total_wrong = [], 0
    world.timing = False

    def timed(impl, next_case, iters, _timed=b.timed):  # the warm-up, estimate and timed loops
        world.timing = True
        try:
            return _timed(impl, next_case, iters)
        finally:
            world.timing = False
    b.timed = timed
    return b, log


@pytest.mark.parametrize("mode", slow_except(["hot"], ["hot", "cold"]))
def test_every_timed_iteration_of_every_impl_follows_its_own_barrier(mode):
    b, log = _fake_bench(mode_pool=1 << 20)
    count, results = b.measure("all_reduce", 4096, "float32", "sum", mode)
    assert {k for k in results} == {("a", False), ("a", True), ("b", False), ("b", True), ("memcpy", False)}
    assert all(r["wrong"] == 0 for r in results.values())
    # per pass and impl: 1 check run, then warm-up 2 + estimate 1 + reps 3 x (1 untimed + iters 4), each
    # after a barrier
    timed = [e for e in log if e[3]]
    assert len(log) - len(timed) == 4  # the correctness runs: one per impl and pass, outside the loops
    barriers = [e[1] for e in timed]
    assert barriers == sorted(barriers) and len(set(barriers)) == len(barriers), "two runs shared a barrier"
    per_impl = {name: sum(1 for e in timed if e[0] == name) for name in ("a", "b", "memcpy")}
    assert per_impl == {"a": 2 * 18, "b": 2 * 18, "memcpy": 2 * 18}, per_impl
    addrs = {name: [e[2] for e in timed if e[0] == name] for name in ("a", "b", "memcpy")}
    if mode == "hot":  # the same buffers every iteration (one pair per pass), and every impl the same ones
        assert all(len(set(a)) == 2 for a in addrs.values()), addrs
        assert set(addrs["a"]) == set(addrs["b"]), addrs
    else:  # cold: every iteration on buffers no other iteration used lately
        every = [e[2] for e in timed]
        assert all(x != y for x, y in zip(every, every[1:]))
        assert b.cold_info()["reuse_distance_bytes"] >= 1 << 20
    assert all(r["mode"] == mode for r in results.values())


def test_each_impl_runs_about_target_ms_a_repetition():
    """--iters 0: the iteration count is each implementation's own (from its
    one-iteration estimate, the slowest rank's), not the slowest
    implementation's for all: a fast one ran a handful of iterations next to
    gloo, where what the block before it left weighed."""
    b, log = _fake_bench()
    b.args.iters, b.args.target_ms = 0, 10
    est = {"a": 1e-3, "b": 1e-4, "memcpy": 2e-4}  # seconds per iteration, as timed() would say
    timed = b.timed

    def fake_timed(impl, next_case, iters):
        timed(impl, next_case, iters)
        return est[impl.name]
    b.timed = fake_timed
    count, results = b.measure("all_reduce", 4096, "float32", "sum", "hot")
    assert {k[0]: r["iters"] for k, r in results.items() if k[0] != "memcpy"} == {"a": 10, "b": 100}, results


def test_an_impl_that_writes_nothing_is_wrong_after_one_that_was_right():
    """The implementations share their buffers (so their pages are the same):
    the output is cleared before each one's check, so a result left by the
    one before does not pass for the next one's."""
    b, log = _fake_bench()

    class Idle(b.impls[0].__class__):
        def run(self, c):
            pass
    b.impls = [b.impls[0], Idle("idle")]
    count, results = b.measure("all_reduce", 4096, "float32", "sum", "hot")
    assert results[("a", False)]["wrong"] == 0
    assert results[("idle", False)]["wrong"] == count, results[("idle", False)]


def test_mode_options():
    assert benchmark.parse([]).modes == ["hot"]  # the default run stays hot
    assert benchmark.parse(["--mode", "both"]).modes == ["hot", "cold"]
    assert benchmark.parse(["--mode", "cold", "--cold-pool", "64M"]).cold_pool_bytes == 64 << 20
    with pytest.raises(SystemExit):
        benchmark.parse(["--mode", "lukewarm"])
    with pytest.raises(SystemExit, match="--mode cold"):
        benchmark.parse(["--mode", "both", "--device", "cuda"])


def test_memcpy_reference_and_both_modes_n2(tmp_path):
    from ringcomm.benchmark.harness import llc_info
    out = tmp_path / "b.json"
    res = run_bench("-N", "2", "-b", "4K", "-e", "64K", "-f", "16", "-r", "2", "--iters", "3", "--mode", "both",
                    "--impl", "ringcomm,mpi", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.load(open(out))
    benchmark.validate_json(doc)
    rows = doc["rows"]
    assert {(r["impl"], r["mode"]) for r in rows} == {(m, mode) for m in ("ringcomm", "mpi")
                                                      for mode in ("hot", "cold")}
    for r in rows:  # the reference is there and sane, and the column is busbw over it
        assert 0.01 < r["memcpy_gbps"] < 10000 and r["memcpy_us"] > 0, r
        assert r["busbw_per_memcpy"] == pytest.approx(r["busbw_gbps"] / r["memcpy_gbps"])
        assert r["memcpy_gbps"] == pytest.approx(r["size"] / r["memcpy_us"] / 1e3)
        assert 0 < r["busbw_per_memcpy"] < 100 and r["wrong"] == 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 1.0)  # all_reduce, N = 2: 2(N-1)/N = 1
    # one memcpy reference per size and mode, shared by every row of that size
    for mode in ("hot", "cold"):
        for size in (4096, 65536):
            refs = {r["memcpy_gbps"] for r in rows if r["mode"] == mode and r["size"] == size}
            assert len(refs) == 1, (mode, size, refs)
    # the cold pool exceeds the last-level cache: a byte comes back after 2 x LLC
    cold, llc = doc["cold"], llc_info()["bytes"]
    if llc:
        assert cold["llc_bytes"] == llc
    assert cold["reuse_distance_bytes"] >= 2 * cold["llc_bytes"] and cold["pool_bytes"] > cold["llc_bytes"]
    assert set(doc["modes"]) == {"hot", "cold"}
    # both tables, each with the memcpy line and the /memcpy column, and both summaries
    text = res.stdout
    assert "# mode hot:" in text and "# mode cold:" in text
    assert "# all_reduce (hot)" in text and "# all_reduce (cold)" in text
    assert text.count("/memcpy") >= 4
    memcpy_lines = [ln for ln in text.splitlines() if ln.split()[4:5] == ["memcpy"] and ln.rstrip().endswith("ref")]
    assert len(memcpy_lines) == 2 * 2, memcpy_lines
    assert "# ---- mode hot ----" in text and "# ---- mode cold ----" in text
    assert text.count("# all_reduce: busbw / memcpy (2 ranks copying at once") == 2
    assert "out of bounds values : 0 OK" in text


def test_reduce_scatter_and_all_gather_run_the_library_default_under_auto(monkeypatch):
    # under --algorithm auto the benchmark measures what auto runs (issue 24's
    # shared-memory path, where the library has it), not a forced ring
    import argparse

    import ringcomm
    from ringcomm.benchmark.impls import Case, RingcommImpl
    calls = []

    class FakeComm:
        size, rank, last_algorithm = 2, 0, None

        def reduce_scatter(self, x, op, out=None, **kw):
            calls.append(("reduce_scatter", kw))

        def all_gather(self, x, out=None, **kw):
            calls.append(("all_gather", kw))

    monkeypatch.setattr(ringcomm, "init", lambda device=None: FakeComm())
    for algorithm, want in (("auto", {}), ("ring", {"algorithm": "ring"}),
                            ("halving_doubling", {"algorithm": "halving_doubling"}),
                            ("recursive_doubling", {"algorithm": "ring"})):
        ctx = argparse.Namespace(device="host", args=argparse.Namespace(algorithm=algorithm))
        impl = RingcommImpl(ctx)
        calls.clear()
        for coll in ("reduce_scatter", "all_gather"):
            c = Case(coll, 8, "float32", "sum", False, 2, 0)
            c.send, c.recv = np.zeros(8, np.float32), np.zeros(8, np.float32)
            impl.run(c)
        assert calls == [("reduce_scatter", want), ("all_gather", want)], (algorithm, calls)


def test_algorithm_fit_leaves_out_what_the_model_does_not_know():
    # auto may run an algorithm selection's model has no terms for (issue 24's
    # "shm"): the footer fits the others and still compares auto per size
    # (it raised ValueError on rank 0 and left the other ranks waiting)
    from ringcomm.benchmark.report import fit_algorithms
    rows = []
    for size in (65536, 1 << 20, 4 << 20):
        for impl, alg, us in (("ringcomm", "shm", 10.0), ("rc-ring", "ring", 30.0),
                              ("rc-rd", "recursive_doubling", 25.0), ("rc-hd", "halving_doubling", 28.0)):
            rows.append({"collective": "all_reduce", "inplace": False, "impl": impl, "algorithm": alg,
                         "size": size, "dtype": "float32", "op": "sum", "time_us": us * size / 65536})
    lines = []
    out = fit_algorithms(rows, 2, lines)
    text = "\n".join(lines)
    assert "model fitted here" in text and "not in this fit (the model has no terms for them): shm" in text
    assert out["auto_over_best_max"] == pytest.approx(10 / 25)
    assert sum(1 for ln in lines if ln.split()[2:3] == ["shm"]) == 3, text


@pytest.mark.parametrize("script,args", slow_except([
    ("shm_rooted.py", ["4096", "4096", "1"]), ("all_to_all_v.py", ["4096", "4096", "1", "--small-pages"]),
    ("a2a_pages.py", ["small", "huge", "4096", "300000"])], [
    ("shm_rooted.py", ["4096", "4096", "1"]),
    ("all_to_all_v.py", ["4096", "4096", "1", "--small-pages"]),
    ("a2a_pages.py", ["small", "huge", "4096", "300000"]),
    ("a2a_pages.py", ["--collective", "scatter", "huge", "small", "300000"]),
    ("a2a_pages.py", ["--collective", "gather", "small", "small", "300000"]),
    ("a2a_pages.py", ["--collective", "all_gather", "small", "huge", "300000"]),
    ("a2a_pages.py", ["--collective", "reduce", "small", "small", "300000"]),
]))
def test_window_benchmarks_run_and_check_their_results(script, args):
    # The window's benchmark scripts (bench/README.md's tables come from
    # them) check every implementation's result against numpy before timing
    # it and exit non-zero naming the rank and index: a tiny run each, N = 2.
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "2", "--", sys.executable,
                          os.path.join(bench, script)] + args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [line.split() for line in res.stdout.splitlines()
            if line.split()[:1] and (line.split()[0][0].isdigit() or line.split()[0] in benchmark.COLLECTIVES)]
    assert rows, res.stdout
    if script == "a2a_pages.py":  # bytes, single, slots, chosen, mpi and two ratios: every time measured
        assert len(rows) == len(args) - args.index(next(a for a in args if a[0].isdigit())), res.stdout
        assert all(len(r) == 7 and all(float(v) > 0 for v in r) for r in rows), res.stdout


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="bench/handoff.py pins its two processes to two cores")
def test_handoff_measures_both_modes_per_launch():
    # bench/handoff.py (bench/README.md, "The slots' handoff"): one row per
    # launch, both modes timed (positive), the ratio their quotient.
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    res = subprocess.run([sys.executable, os.path.join(bench, "handoff.py"), "64K", "--launches", "2"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1", "2"], res.stdout
    for _, written, unchanged, ratio in rows:
        assert float(written) > 0 and float(unchanged) > 0, res.stdout
        # (the ratio is of the unrounded medians, the columns rounded to 0.1 us)
        assert float(ratio) == pytest.approx(float(written) / float(unchanged), rel=0.05, abs=0.02), res.stdout


@pytest.mark.slow
def test_launches_reports_every_launchs_ratio_and_fails_on_a_bad_row(tmp_path):
    # bench/launches.py (bench/README.md, "The same over six launches
    # each"): one ratio per launch for every collective, size and baseline,
    # median and range from them; a wrong row or a ledger off its closed
    # form makes it fail.
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    out = tmp_path / "l.json"
    res = subprocess.run([sys.executable, os.path.join(bench, "launches.py"), "-k", "2", "--json", str(out), "--",
                          "-n", "2", "-b", "64K", "-e", "64K", "--reps", "2", "--target-ms", "2", "--impl",
                          "ringcomm,mpi", "--collective", "reduce,sendrecv"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["faults"] == [] and got["launches"] == 2
    keys = {(r["collective"], r["size"], r["inplace"], r["baseline"]) for r in got["rows"]}
    assert keys == {("reduce", 65536, False, "mpi"), ("reduce", 65536, True, "mpi"), ("sendrecv", 65536, False, "mpi")}
    for r in got["rows"]:
        assert len(r["ratios"]) == 2 and all(v > 0 for v in r["ratios"]), r
        line = next(x for x in res.stdout.splitlines() if x.split()[:4] == [
            r["collective"], str(r["size"]), "in" if r["inplace"] else "out", r["baseline"]])
        assert float(line.split()[4]) == pytest.approx(statistics.median(r["ratios"]), abs=0.006), line
    spec = importlib.util.spec_from_file_location("launches", os.path.join(bench, "launches.py"))
    launches = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launches)
    rows = [{"collective": "reduce", "size": 8, "inplace": False, "impl": "ringcomm", "time_us": 2.0, "wrong": 0,
             "sent_per_rank": 8, "expected_sent": 8},
            {"collective": "reduce", "size": 8, "inplace": False, "impl": "mpi", "time_us": 3.0, "wrong": 0}]
    assert launches.ratios(rows) == {("reduce", 8, False, "mpi"): 1.5} and launches.faults(rows) == []
    rows[0]["sent_per_rank"], rows[1]["wrong"] = 16, 2
    assert len(launches.faults(rows)) == 2

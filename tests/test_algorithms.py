"""The all_reduce family (recursive doubling, halving-doubling, ring, naive)
and algorithm="auto": every algorithm passes the shared suite (exact results
and ledger == traffic.expected for the algorithm that ran), auto follows the
cost model's decision table, and ranks that disagree still fail cleanly."""

import math
import re
import time

import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import InvalidArgument, MismatchError, RingcommError
from ringcomm.tuning import selection
from tiers import slow_except

PAIRWISE = ["recursive_doubling", "halving_doubling"]


def flat(results):
    return [e for errs in results for e in errs]


def cases(comm, algorithm, prime=False):
    n = comm.size
    errs = suite.run_cases(comm, [0, 1, max(n - 1, 0), n + 1, 101], algorithm=algorithm)
    comm.segment_bytes = 16  # many segments per message: windows, slots, in-place waits
    errs += suite.run_cases(comm, [7 * n + 3], algorithm=algorithm)
    if prime:
        comm.segment_bytes = 65536
        errs += suite.run_cases(comm, [100003], suite.COMBOS[::3], algorithm=algorithm)
    return errs


@pytest.mark.parametrize("algorithm", PAIRWISE + ["naive"])
# (the slow tier: every size to 8, primes 11 and 13, 12, and 16; 9, 10, 14 and
# 15 added 2.5 min to CI and nothing those do not cover)
@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], [*range(1, 9), 11, 12, 13, 16]))
def test_every_algorithm_passes_the_suite_in_process(n, algorithm):
    errs = flat(ringcomm.run_local(n, cases, algorithm, n in (3, 4, 6, 8, 13)))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("device", ["emulated", "emulated-nccl"])
@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], [1, 2, 3, 4, 5, 8]))
def test_every_algorithm_passes_the_suite_on_the_emulated_device_path(n, device):
    # Device memory: the fingerprint to a peer beyond the neighbours goes on
    # its own (host memory) and is checked before the payload's receive is
    # posted. "emulated-nccl" issues payload in NCCL-like groups, one at a
    # time per rank: a pairwise schedule that could deadlock NCCL hangs here.
    def body(comm):
        errs = []
        for a in PAIRWISE + ["naive"]:
            comm.segment_bytes = 1 << 20
            errs += suite.run_cases(comm, [0, 1, n + 1, 101], [("float32", "sum"), ("int32", "max"),
                                                               ("float16", "avg")], algorithm=a)
            comm.segment_bytes = 16
            errs += suite.run_cases(comm, [7 * n + 3], [("float32", "sum"), ("int8", "min")], algorithm=a)
        comm.all_reduce(np.ones(4, np.float32))
        if comm.last_algorithm != "ring":  # nothing measured says another one is faster on a device
            errs.append(f"rank {comm.rank}: auto ran {comm.last_algorithm} on a device communicator")
        return errs
    errs = flat(ringcomm.run_local(n, body, device=device, jitter_us=50, timeout=60))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("device", ["emulated", "emulated-nccl"])
@pytest.mark.parametrize("case", ["count", "algorithm"])
def test_a_mismatch_on_the_device_path_fails_on_every_rank(device, case):
    # count: rank 2's count differs, and its partners are not its left
    # neighbour: the fingerprint on the check channel catches it, naming both
    # calls. algorithm: rank 1 runs recursive doubling, the others the ring.
    # No hang: every rank gets an error within seconds.
    def body(comm):
        if case == "count":
            count, algorithm = 10 + 2 * (comm.rank == 2), "recursive_doubling"
        else:
            count, algorithm = 300, "recursive_doubling" if comm.rank == 1 else "ring"
        t0 = time.monotonic()
        try:
            comm.all_reduce(np.ones(count, np.float32), algorithm=algorithm)
        except RingcommError as exc:
            return type(exc).__name__, str(exc), time.monotonic() - t0
        return None, comm.last_algorithm, time.monotonic() - t0
    for r, (kind, msg, dt) in enumerate(ringcomm.run_local(4, body, device=device, timeout=20)):
        assert kind is not None and dt < 10, f"rank {r}: {kind}: {msg} ({dt:.1f} s)"
        assert "disagree" in msg, f"rank {r}: {msg}"
        if case == "count" and r in (0, 3):  # rank 2's partners (2^1 = 3, 2^2 = 0) check it themselves
            assert re.search("count=10.*count=12|count=12.*count=10", msg), f"rank {r}: {msg}"


def test_results_are_bitwise_identical_on_every_rank_for_every_algorithm():
    # Non-exact float data: the algorithms add in different orders, but each
    # gives every rank the same bits (partners add the same two values).
    def body(comm, algorithm):
        rng = np.random.default_rng(comm.rank)
        x = rng.standard_normal(1001).astype(np.float32)
        comm.all_reduce(x, algorithm=algorithm)
        return x
    for n in (3, 5, 6, 8):
        for a in PAIRWISE + ["ring", "naive"]:
            outs = ringcomm.run_local(n, body, a)
            for r in range(1, n):
                bad = np.flatnonzero(outs[r].view(np.uint32) != outs[0].view(np.uint32))
                assert not bad.size, f"{a} n={n}: rank {r} differs from rank 0 at index {bad[0]}"


def test_auto_follows_the_cost_model_on_both_sides_of_every_crossover():
    # uint8: any byte size. At each limit L the model's choice changes between
    # L and L + 1 bytes; the engine must agree with selection.best everywhere.
    def body(comm):
        costs = comm.costs
        rd, hd = selection.auto_limits(costs, comm.size)
        sizes = sorted({1, 2, 64, 4096, 1 << 20, rd, rd + 1, hd, hd + 1} - {0})
        got = []
        for b in sizes:
            if b > 8 << 20:
                continue
            comm.all_reduce(np.ones(b, np.uint8), op="max")
            got.append((b, comm.last_algorithm, selection.best(costs, comm.size, b)))
        return got
    for n in (2, 3, 4, 5, 8):
        for b, ran, model in ringcomm.run_local(n, body)[0]:
            assert ran == model, f"n={n}, {b} bytes: auto ran {ran}, the model says {model}"


def test_decision_table_is_never_far_from_the_models_best():
    # Independent of auto_limits' algebra: evaluate every algorithm's
    # predicted time on a fine grid; what auto picks must be within the
    # documented margin of the fastest, and the ring must hold large sizes.
    bound = 1 / (1 - selection.MARGIN) * (1 + 1e-9)
    for costs in list(selection.DEFAULTS.values()) + [selection.Costs(5e-6, 1e-10, 3e-10),
                                                      selection.Costs(1e-6, 1e-9, 0.0)]:
        for n in range(2, 65):
            rd, hd = selection.auto_limits(costs, n)
            assert 0 <= rd <= hd < 1 << 40, (costs, n, rd, hd)
            for b in sorted({int(x) for x in np.geomspace(1, 1 << 34, 300)} | {rd, rd + 1, hd, hd + 1}):
                if b <= 0:
                    continue
                t = {a: float(selection.predict(costs, a, n, b)) for a in selection.AUTO_CANDIDATES}
                pick = selection.best(costs, n, b)
                assert pick == ("recursive_doubling" if b <= rd else "halving_doubling" if b <= hd else "ring")
                assert t[pick] <= min(t.values()) * bound, (costs, n, b, pick, t)
            assert selection.best(costs, n, 1 << 34) == "ring"


def test_fit_recovers_known_constants():
    true = selection.Costs(alpha=3e-6, beta=1 / 5e9, gamma=1 / 2e9)
    rows = [{"algorithm": a, "n": n, "bytes": b, "seconds": float(selection.predict(true, a, n, b))}
            for a in selection.ALGORITHMS for n in (2, 3, 4) for b in (8, 4096, 1 << 20, 1 << 24)]
    got = selection.fit(rows)
    for name in ("alpha", "beta", "gamma"):
        assert math.isclose(getattr(got, name), getattr(true, name), rel_tol=1e-6), (name, got)


def test_tuned_constants_are_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert selection.costs_for("mpi") == selection.DEFAULTS["mpi"]
    mine = selection.Costs(9e-6, 1e-9, 2e-9)
    path = selection.save("inproc", mine)
    assert path.startswith(str(tmp_path))
    assert selection.costs_for("inproc") == mine
    assert ringcomm.run_local(2, lambda comm: comm.costs)[0] == mine


# Times shaped like this machine's at N = 4 (ringcomm tune): recursive
# doubling wins small, halving-doubling medium, the ring large.
TUNE_SIZES = [8, 256, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20]
TUNE_US = {"ring": [13.4, 17.2, 28.5, 51.7, 70.1, 140.7, 504.5, 1777.1, 8804.3],
           "recursive_doubling": [10.0, 12.6, 18.1, 23.4, 36.9, 122.9, 704.4, 3202.4, 17443.1],
           "halving_doubling": [14.9, 15.2, 21.0, 37.6, 52.8, 107.9, 436.3, 1711.5, 9333.8]}


def tune_rows(n, us=TUNE_US, sizes=TUNE_SIZES):
    return [{"algorithm": a, "n": n, "bytes": b, "seconds": t * 1e-6}
            for a, ts in us.items() for b, t in zip(sizes, ts)]


def test_measured_times_choose_the_fastest_at_every_size_measured():
    m = selection.Measured.from_rows(tune_rows(4), 4)
    rd, hd = selection.auto_limits(m, 4)
    assert 65536 <= rd < 262144 and 4 << 20 <= hd < 16 << 20, (rd, hd)
    for i, b in enumerate(TUNE_SIZES):
        fastest = min(TUNE_US, key=lambda a: TUNE_US[a][i])
        assert selection.best(m, 4, b) == fastest, (b, fastest)
        for a in TUNE_US:  # interpolation passes through every measurement
            assert math.isclose(float(selection.predict(m, a, 4, b)), TUNE_US[a][i] * 1e-6, rel_tol=1e-9)
    assert selection.best(m, 4, 1 << 30) == "ring"  # beyond what was measured: the ring
    with pytest.raises(ValueError, match="measured on 4 ranks"):
        selection.auto_limits(m, 8)


def test_measured_times_with_noise_stay_near_the_fastest():
    # 5% multiplicative noise on every measurement: what auto picks at each
    # measured size is within 10% of the fastest there.
    rng = np.random.default_rng(7)
    for trial in range(20):
        us = {a: [t * (1 + 0.05 * rng.uniform(-1, 1)) for t in ts] for a, ts in TUNE_US.items()}
        m = selection.Measured.from_rows(tune_rows(4, us), 4)
        for i, b in enumerate(TUNE_SIZES):
            pick = selection.best(m, 4, b)
            assert us[pick][i] <= 1.1 * min(v[i] for v in us.values()), (trial, b, pick)


def test_costs_for_uses_measurements_on_the_same_number_of_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shared = selection.Costs(2e-6, 1e-10, 0.0)
    selection.save("inproc", shared, {"rows": tune_rows(4)})
    got = selection.costs_for("inproc", 4)
    assert isinstance(got, selection.Measured) and got.n == 4
    assert selection.costs_for("inproc", 3) == shared  # not measured there: the fitted constants
    assert selection.costs_for("inproc") == shared
    assert selection.costs_for("mpi", 4) == selection.DEFAULTS["mpi"]
    # A file whose rows lack an algorithm is not a table to choose by.
    selection.save("inproc", shared, {"rows": [r for r in tune_rows(4) if r["algorithm"] != "halving_doubling"]})
    assert selection.costs_for("inproc", 4) == shared
    selection.save("inproc", shared, {"rows": [dict(r, seconds=-1.0) for r in tune_rows(4)]})
    assert selection.costs_for("inproc", 4) == shared


def test_auto_follows_measured_times_in_a_communicator(tmp_path, monkeypatch):
    # run_local(4) reads the rows measured on 4 ranks; the engine switches
    # algorithm exactly at the limits derived from them.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    selection.save("inproc", selection.Costs(2e-6, 1e-10, 0.0), {"rows": tune_rows(4)})

    def body(comm):
        assert isinstance(comm.costs, selection.Measured)
        rd, hd = selection.auto_limits(comm.costs, comm.size)
        got = []
        for b in (1, rd, rd + 1, hd, hd + 1):
            comm.all_reduce(np.ones(b, np.uint8), op="max")
            got.append((b, comm.last_algorithm, selection.best(comm.costs, comm.size, b)))
        return got
    got = ringcomm.run_local(4, body, timeout=60)[0]
    assert [ran for _, ran, _ in got] == ["recursive_doubling", "recursive_doubling", "halving_doubling",
                                          "halving_doubling", "ring"], got
    for b, ran, model in got:
        assert ran == model, (b, ran, model)


@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 4, 5]))
def test_ranks_that_choose_different_algorithms_fail_on_every_rank(n):
    # Rank 1's count is small (recursive doubling), the others' large (ring):
    # no hang, and every rank gets an error naming the disagreement.
    def body(comm):
        count = 3 if comm.rank == 1 else 300000
        t0 = time.monotonic()
        try:
            comm.all_reduce(np.ones(count, np.float32))
        except RingcommError as exc:
            return type(exc).__name__, str(exc), time.monotonic() - t0
        return None, comm.last_algorithm, time.monotonic() - t0
    try:
        out = ringcomm.run_local(n, body, timeout=20)
    except RingcommError as exc:
        pytest.fail(f"run_local raised instead of returning each rank's error: {exc}")
    for r, (kind, msg, dt) in enumerate(out):
        assert kind is not None, f"rank {r} completed ({msg})"
        assert dt < 10, f"rank {r} took {dt:.1f} s"
        assert "disagree" in msg, f"rank {r}: {kind}: {msg}"


@pytest.mark.parametrize("algorithm", PAIRWISE)
def test_a_count_mismatch_within_one_algorithm_names_both_calls(algorithm):
    def body(comm):
        with pytest.raises(MismatchError, match="count=10.*count=12|count=12.*count=10"):
            comm.all_reduce(np.ones(10 + 2 * (comm.rank == 2), np.float32), algorithm=algorithm)
        return True
    # rank 2's partners are not its left neighbour: the fingerprint in their
    # first message is what catches it.
    assert all(ringcomm.run_local(4, body, timeout=20))


@pytest.mark.parametrize("what", ["dtype", "op"])
@pytest.mark.parametrize("n", slow_except([4], [2, 4, 5]))
@pytest.mark.parametrize("algorithm", PAIRWISE)
def test_a_mismatch_of_equal_message_sizes_is_caught_by_the_stamp_and_named_on_every_rank(algorithm, n, what):
    # Same count and item size, so every message has the size the others
    # expect: only the stamp each message carries (a hash of its call) tells
    # them apart. Rank n-2's partners are not its left neighbour (on two
    # ranks there is no header at all). Every rank names both calls.
    culprit = n - 2

    def body(comm):
        odd = comm.rank == culprit
        x = np.arange(1, 65, dtype=np.int32 if odd and what == "dtype" else np.float32)
        y = np.full(64, -1, x.dtype)
        with pytest.raises(MismatchError) as info:
            comm.all_reduce(x, out=y, op="max" if odd and what == "op" else "sum", algorithm=algorithm)
        text = str(info.value)
        want = ("int32", "float32") if what == "dtype" else ("op=max", "op=sum")
        assert all(w in text for w in want), f"rank {comm.rank}: {text}"
        return True
    assert all(ringcomm.run_local(n, body, timeout=20))


def test_invalid_algorithm_choices_are_refused_before_anything_moves():
    def body(comm):
        x = np.ones(6, np.float32)
        with pytest.raises(InvalidArgument, match="unknown algorithm 'tree'"):
            comm.all_reduce(x, algorithm="tree")
        with pytest.raises(InvalidArgument, match="power-of-two"):
            comm.reduce_scatter(x, algorithm="halving_doubling")
        # (recursive doubling runs all_reduce, scan and exscan: the error lists what all_gather runs)
        with pytest.raises(InvalidArgument, match=r"'recursive_doubling' does not run all_gather \(all_gather: ring, "
                                                  r"halving_doubling, shm, zero_copy, hierarchical\)"):
            comm.all_gather(x[:2], out=np.empty(6, np.float32), algorithm="recursive_doubling")
        comm.all_reduce(x)  # the communicator still works
        return comm.traffic().bytes_sent("reduce_scatter") + comm.traffic().bytes_sent("all_gather")
    assert ringcomm.run_local(3, body) == [0, 0, 0]


@pytest.mark.parametrize("tuned", [False, True])
def test_ringcomm_info_prints_the_crossover_table(tmp_path, monkeypatch, tuned):
    import subprocess
    import sys
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if tuned:  # measured on 4 ranks: that row comes from the times (marked), the others from the constants
        selection.save("mpi", selection.Costs(2e-6, 1e-10, 0.0), {"rows": tune_rows(4)})
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "info"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "crossover" in res.stdout
    for n in (2, 3, 4, 64):
        costs = selection.costs_for("mpi", n)
        assert isinstance(costs, selection.Measured) == (tuned and n == 4)
        rd, hd = selection.auto_limits(costs, n)
        line = next(ln for ln in res.stdout.splitlines() if ln.split()[:1] == [str(n)])
        assert line.split()[1:] == [str(rd), str(hd)] + (["*"] if tuned and n == 4 else []), line


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algorithm", ["auto"] + PAIRWISE)
def test_a_zero_count_against_a_nonzero_one_fails_on_every_rank(n, algorithm):
    # The rank with nothing to send still checks its neighbour's call (on two
    # ranks the others' header rides in a payload message it never receives).
    def body(comm):
        t0 = time.monotonic()
        with pytest.raises(MismatchError, match="count=0.*count=5|count=5.*count=0"):
            comm.all_reduce(np.ones(0 if comm.rank == 0 else 5, np.float32), algorithm=algorithm)
        return time.monotonic() - t0
    assert max(ringcomm.run_local(n, body, timeout=20)) < 10


@pytest.mark.parametrize("n", slow_except([2, 5], [2, 4, 5]))
def test_every_rank_gets_the_same_bits_with_nan_and_signed_zeros(n):
    # max(1, NaN) and max(NaN, 1) differ, as do min(+0, -0) and min(-0, +0),
    # and a sum of two NaNs keeps one operand's payload: partners must combine
    # in the same order (found by review: recursive doubling once did not).
    def body(comm, algorithm, op):
        r = comm.rank
        nan = np.frombuffer(np.uint32(0x7FC00000 + r + 1).tobytes(), np.float32)[0]  # a NaN per rank
        x = np.array([nan if r == n - 1 else 1.0, 0.0 if r % 2 else -0.0, nan, float(r)], np.float32)
        comm.all_reduce(x, op, algorithm=algorithm)
        return x.view(np.uint32).copy()
    for algorithm in ("ring", "recursive_doubling", "halving_doubling", "naive"):
        for op in ("max", "min", "sum"):
            outs = ringcomm.run_local(n, body, algorithm, op)
            for r in range(1, n):
                bad = np.flatnonzero(outs[r] != outs[0])
                assert not bad.size, f"{algorithm} {op} n={n}: rank {r} differs from rank 0 at index {bad[0]}: " \
                                     f"{outs[r][bad[0]]:#x} vs {outs[0][bad[0]]:#x}"


def test_fast_path_and_python_path_raise_the_same_errors():
    def body(comm):
        errs = []
        for kw in ({"algorithm": ["ring"]}, {"algorithm": "tree"}, {"op": ["sum"]}, {"op": "mean"}):
            with pytest.raises(InvalidArgument):
                comm.all_reduce(np.ones(4, np.float32), **kw)
            errs.append(comm.aborted)
        return errs
    assert ringcomm.run_local(2, body) == [[False] * 4] * 2


@pytest.mark.slow
def test_ringcomm_tune_measures_writes_and_auto_reads_it(tmp_path):
    # End to end: `ringcomm tune` on 2 MPI ranks writes the constants and its
    # measurements; a communicator of 2 ranks then chooses by those times.
    import os
    import subprocess
    import sys
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "tune", "-n", "2"], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "auto on 2 ranks (measured)" in res.stdout, res.stdout
    probe = ("import ringcomm.tuning.selection as s; m = s.costs_for('mpi', 2); i = s.costs_for('inproc', 2); "
             "print(type(m).__name__, m.n, len(m.sizes()), type(i).__name__, type(s.costs_for('mpi', 3)).__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["Measured", "2", str(len(__import__("ringcomm.tuning.tune").tuning.tune.SIZES)), "Measured",
                                  "Costs"], out.stdout + out.stderr


def _with_nans(r, count, dtype):
    """Rank r's values (exact in every floating dtype), with NaN where
    (3i + 5r) % 3n == 0 (n ranks, count = 2n + 9): about half the indices
    have a NaN on some rank, the others on none."""
    i, n = np.arange(count), (count - 9) // 2
    x = ((i * 5 + r * 11) % 23 - 11).astype(np.float64)
    x[(3 * i + 5 * r) % (3 * n) == 0] = np.nan
    return x.astype(ringcomm.vocab.NUMPY[dtype])


@pytest.mark.parametrize("device", [None, "emulated"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_min_and_max_return_nan_wherever_a_rank_has_one(n, device):
    """min/max with NaN are numpy's minimum/maximum (and torch's): NaN wherever
    any rank has one, the same bits on every rank (all_reduce), whatever the
    algorithm. With
    `<` alone a NaN survived only as the first operand: ranks disagreed, and
    halving-doubling could even return a value smaller than a third rank's."""
    count = 2 * n + 9
    runs = [("all_reduce", a) for a in ["ring", "naive"] + PAIRWISE] + [("reduce_scatter", "ring"),
                                                                          ("reduce", "binomial"), ("reduce", "ring")]
    if device is None:
        runs += [("all_reduce", "shm"), ("all_reduce", "shm_flat"), ("reduce_scatter", "shm"), ("reduce", "shm")]

    def body(comm):
        r, errs, bits = comm.rank, [], {}
        for dtype in ringcomm.vocab.FLOATING:
            for op, red in (("max", np.maximum), ("min", np.minimum)):
                want = red.reduce([_with_nans(q, count, dtype).astype(np.float64) for q in range(n)])
                lo = ringcomm.vocab.chunk_offset(count, n, r)
                for coll, algorithm in runs:
                    x = _with_nans(r, count, dtype)
                    if coll == "all_reduce":
                        got, ref = comm.all_reduce(x, op=op, algorithm=algorithm), want
                    elif coll == "reduce_scatter":
                        got = comm.reduce_scatter(x, op=op, algorithm=algorithm)
                        ref = want[lo:lo + got.size]
                    else:
                        got, ref = comm.reduce(x, root=n - 1, op=op, algorithm=algorithm), want
                        if r != n - 1:
                            continue
                    if coll == "all_reduce":
                        bits[(algorithm, dtype, op)] = np.asarray(got).tobytes()
                    got = np.asarray(got).astype(np.float64)
                    bad = np.flatnonzero(~((got == ref) | (np.isnan(got) & np.isnan(ref))))
                    if bad.size:
                        i = int(bad[0])
                        errs.append(f"rank {r}: {coll} {algorithm} {dtype} {op}: index {i} is {got[i]}, want {ref[i]}"
                                    f" ({bad.size} wrong)")
        return errs, bits
    kw = {"device": device, "jitter_us": 20} if device else {}
    out = ringcomm.run_local(n, body, timeout=60, **kw)
    errs = [e for es, _ in out for e in es]
    assert not errs, "\n".join(errs[:20])
    for r, (_, bits) in enumerate(out):
        differ = [k for k in bits if bits[k] != out[0][1][k]]
        assert not differ, f"rank {r}: all_reduce bits differ from rank 0's in {differ[:5]}"

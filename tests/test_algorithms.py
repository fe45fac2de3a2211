"""The all_reduce family (recursive doubling, halving-doubling, ring, naive)
and algorithm="auto": every algorithm passes the shared suite (exact results
and ledger == traffic.expected for the algorithm that ran), auto follows the
cost model's decision table, and ranks that disagree still fail cleanly."""

import math
import time

import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import InvalidArgument, MismatchError, RingcommError, selection

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
@pytest.mark.parametrize("n", list(range(1, 17)))
def test_every_algorithm_passes_the_suite_in_process(n, algorithm):
    errs = flat(ringcomm.run_local(n, cases, algorithm, n in (3, 4, 6, 8, 13)))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16])
def test_every_algorithm_passes_the_suite_on_the_emulated_device_path_or_is_refused(n):
    # A device communicator runs the ring: the pairwise algorithms are refused
    # there with a clear error (their fingerprints cannot ride in device memory).
    def body(comm):
        errs = suite.run_cases(comm, [0, 1, n + 1], [("float32", "sum"), ("int32", "max")], algorithm="auto")
        for a in PAIRWISE:
            with pytest.raises(InvalidArgument, match="host communicators only"):
                comm.all_reduce(np.ones(4, np.float32), algorithm=a)
        return errs
    errs = flat(ringcomm.run_local(n, body, device="emulated", timeout=60))
    assert not errs, "\n".join(errs[:20])


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


@pytest.mark.parametrize("n", [2, 3, 4, 5])
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


def test_invalid_algorithm_choices_are_refused_before_anything_moves():
    def body(comm):
        x = np.ones(6, np.float32)
        with pytest.raises(InvalidArgument, match="unknown algorithm 'tree'"):
            comm.all_reduce(x, algorithm="tree")
        with pytest.raises(InvalidArgument, match="power-of-two"):
            comm.reduce_scatter(x, algorithm="halving_doubling")
        with pytest.raises(InvalidArgument, match="all_reduce only"):
            comm.all_gather(x[:2], out=np.empty(6, np.float32), algorithm="recursive_doubling")
        comm.all_reduce(x)  # the communicator still works
        return comm.traffic().bytes_sent("reduce_scatter") + comm.traffic().bytes_sent("all_gather")
    assert ringcomm.run_local(3, body) == [0, 0, 0]


def test_ringcomm_info_prints_the_crossover_table():
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "info"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "crossover" in res.stdout
    costs = selection.costs_for("mpi")
    for n in (2, 3, 64):
        rd, hd = selection.auto_limits(costs, n)
        line = next(ln for ln in res.stdout.splitlines() if ln.split()[:1] == [str(n)])
        assert line.split()[1:3] == [str(rd), str(hd)], line


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


@pytest.mark.parametrize("n", [2, 4, 5])
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

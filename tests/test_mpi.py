"""The shared suite and the error paths on the MPI transport, under real Open MPI.

Each test marked ``parallel`` is launched by the mpi-pytest plugin under
``mpiexec -n N`` (it starts mpiexec itself when pytest runs serially). Every
rank collects its failures and all ranks assert on the union, so a failure
on any rank is reported, with its rank, by the rank that prints.
"""

import time

import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import CollectiveTimeout, CommunicatorAborted, MismatchError
from tiers import slow_except


def assert_no_errors_anywhere(errs):
    from mpi4py import MPI
    everyone = [e for es in MPI.COMM_WORLD.allgather(errs) for e in es]
    assert not everyone, "\n".join(everyone[:30])


def guarded(fn, *args):
    """Run fn; turn an exception into a failure message so every rank still
    reaches the final allgather (an escaped exception would leave the others
    waiting there)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        from mpi4py import MPI
        return [f"rank {MPI.COMM_WORLD.rank}: {type(exc).__name__}: {exc}"]


@pytest.mark.parallel([1, 2, 3, 4, 5])
@pytest.mark.slow_nprocs(1, 2, 4, 5)
def test_suite_over_mpi():
    def body():
        comm = ringcomm.init()
        n = comm.size
        assert comm.transport == "mpi"
        errs = suite.run_cases(comm, [0, 1, max(n - 1, 0), n + 1])
        comm.segment_bytes = 16
        errs += suite.run_cases(comm, [7 * n + 3])
        comm.segment_bytes = 65536
        errs += suite.run_cases(comm, [100003])
        errs += suite.run_broadcasts(comm, [0, 1, n + 1, 100003], dtypes=["float32", "int8", "bfloat16"])
        errs += suite.run_barrier(comm)
        comm.close()
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel([2, 3])
@pytest.mark.slow_nprocs(2)
def test_reduce_gather_scatter_all_to_all_over_mpi():
    def body():
        import collectives_suite as cs
        comm = ringcomm.init()
        n = comm.size
        errs = cs.run_all(comm, [0, 1, max(n - 1, 0), n + 1, 101])
        few = [("float32", "sum"), ("bfloat16", "avg"), ("int8", "prod"), ("int64", "max")]
        # both paths whatever auto picks: messages, and the window's (one host here)
        if not comm.shared_memory:
            errs.append(f"rank {comm.rank}: no shared-memory window")
        for algorithms in ("p2p", "shm"):
            errs += cs.run_all(comm, [0, 1, n + 1, 101, 70001], reduce_combos=few, algorithms=algorithms)
        comm.segment_bytes = 16
        errs += cs.run_all(comm, [7 * n + 3], reduce_combos=few[:3])
        comm.close()
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel([1, 2, 3, 5])
def test_scan_and_exscan_over_mpi_point_to_point():
    # Issue 51's prefix reductions over MPI messages alone (transport "mpi":
    # no shared-memory window; the window's case is in the test above, by
    # collectives_suite.run_all): both algorithms and auto, a few dtypes and
    # ops, counts 0, 1, n + 1, 101 (a prime), several segments, and auto's
    # pipeline above recursive doubling's limit (64 KiB); numpy's prefix and
    # the ledger's closed form.
    def body():
        import collectives_suite as cs
        comm = ringcomm.init(transport="mpi")
        n = comm.size
        if comm.shared_memory:
            return [f"rank {comm.rank}: transport='mpi' has a shared-memory window"]
        few = [("float32", "sum"), ("bfloat16", "avg"), ("int8", "prod"), ("int64", "max"), ("uint16", "band"),
               ("bool", "bxor"), ("float64", "min")]
        errs = cs.run_scan(comm, [0, 1, n + 1, 101], few)
        comm.segment_bytes = 16
        errs += cs.run_scan(comm, [7 * n + 3], few[:4])
        comm.segment_bytes = 1 << 20
        errs += cs.run_scan(comm, [20011], few[:2], algorithms=("auto",))  # float32: 78 KiB, the pipeline
        comm.close()
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel([2, 3])
@pytest.mark.slow  # every size: variants of the mismatch over MPI (test_mismatch_over_mpi_raises_on_every_rank stays)
def test_all_to_all_splits_mismatch_over_mpi_is_an_error():
    comm = ringcomm.init(timeout=30)
    n = comm.size
    out_splits = [1] * n if comm.rank != 1 else [0, 1] + [1] * (n - 2)
    t0 = time.monotonic()
    with pytest.raises((MismatchError, CommunicatorAborted)):
        comm.all_to_all(np.zeros(n, np.int32), [1] * n, out_splits)
        comm.barrier()  # a rank whose blocks all matched hears of it here
    assert time.monotonic() - t0 < 10


@pytest.mark.parallel([2, 3])
@pytest.mark.slow  # every size: variants of the mismatch over MPI (test_mismatch_over_mpi_raises_on_every_rank stays)
def test_all_to_all_block_larger_than_expected_over_mpi_lands_nothing():
    # Rank n-1 sends rank 0 twice the block rank 0 expects. Open MPI's
    # single-copy path would write a larger message in full past the
    # receive; the block's size is in the message's tag, so it never matches.
    comm = ringcomm.init(timeout=30)
    n, r, B = comm.size, comm.rank, 4096
    m = [[B + 256 * ((q + 2 * p) % 3) for p in range(n)] for q in range(n)]  # uneven, consistent
    splits = list(m[r])
    if r == n - 1:
        splits[0] *= 2
    out_splits = [m[q][r] for q in range(n)]
    total = sum(out_splits)
    out = np.full(total + 65536, -7.0, np.float32)
    t0 = time.monotonic()
    with pytest.raises((MismatchError, CommunicatorAborted)) as e:
        comm.all_to_all(np.full(sum(splits), r + 1.0, np.float32), splits, out_splits, out=out[:total])
        comm.barrier()
    assert time.monotonic() - t0 < 10
    past = np.flatnonzero(out[total:] != -7.0)
    assert past.size == 0, f"rank {r}: {past.size} elements past out changed, first at {total + past[0]}"
    if r == 0:
        want = f"rank {n - 1} sends {8 * m[n - 1][0]} bytes to rank 0, which expects {4 * m[n - 1][0]}"
        assert e.type is MismatchError and want in str(e.value), str(e.value)


@pytest.mark.parallel([2, 3, 5])
@pytest.mark.slow_nprocs(3, 5)
def test_async_over_mpi():
    def body():
        comm = ringcomm.init()
        n, errs = comm.size, []
        xs = [np.arange(5000, dtype=np.float64) * (comm.rank + 1) + k for k in range(5)]
        works = [comm.all_reduce(x, async_op=True) for x in xs]
        for w in reversed(works):
            w.wait()
        for k, x in enumerate(xs):
            errs += suite.compare(x, np.arange(5000) * (n * (n + 1) // 2) + n * k, f"async work {k}", comm.rank)
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel([2, 3, 5])
@pytest.mark.slow_nprocs(2, 5)
def test_mismatch_over_mpi_raises_on_every_rank():
    comm = ringcomm.init(timeout=30)
    t0 = time.monotonic()
    with pytest.raises(MismatchError, match="count=10.*count=11|count=11.*count=10"):
        comm.all_reduce(np.zeros(10 + (comm.rank == 1), np.float32))
    assert time.monotonic() - t0 < 10
    with pytest.raises(CommunicatorAborted):
        comm.all_reduce(np.zeros(3))


@pytest.mark.parallel([2, 3])
@pytest.mark.slow_nprocs(3)
def test_missing_rank_times_out_over_mpi():
    comm = ringcomm.init(timeout=1.0)
    last = comm.size - 1
    if comm.rank != last:
        t0 = time.monotonic()
        with pytest.raises((CollectiveTimeout, CommunicatorAborted)) as info:
            comm.all_reduce(np.ones(100))
        assert time.monotonic() - t0 < 10
        if comm.rank == 0 and comm.last_algorithm.startswith("shm"):
            # In shared memory every rank waits for the missing one: whichever
            # deadline passes first publishes it, with the missing rank named
            # (in the window, or through the ring, which the window's wait
            # also listens to: "waited for rank 2" / "waiting for rank 2").
            assert f"for rank {last}" in str(info.value), info.value
        elif comm.rank == 0:  # waited for the header of its left neighbour, the missing rank
            assert isinstance(info.value, CollectiveTimeout)
            assert info.value.peer == last and f"rank {last}" in str(info.value)
        t1 = time.monotonic()
        with pytest.raises(CommunicatorAborted):
            comm.all_reduce(np.ones(100))
        assert time.monotonic() - t1 < 0.5
    else:
        # Alive and holding its communicator past the others' deadline: a
        # rank that closed it would be named at once instead (test_faults.py).
        time.sleep(3.0)


@pytest.mark.parallel(3)
def test_abort_over_mpi():
    comm = ringcomm.init(timeout=30)
    if comm.rank == 1:
        time.sleep(0.3)
        comm.abort()
    else:
        t0 = time.monotonic()
        with pytest.raises(CommunicatorAborted, match="rank 1 aborted"):
            comm.all_reduce(np.ones(1000))
        assert time.monotonic() - t0 < 10


@pytest.mark.parallel(2)
def test_duplicated_communicator_keeps_traffic_apart():
    from mpi4py import MPI
    comm = ringcomm.init()
    # The application's own message on COMM_WORLD with a tag ringcomm might use
    # must not be matched by ringcomm (it works on a duplicate).
    peer = 1 - MPI.COMM_WORLD.rank
    req = MPI.COMM_WORLD.isend(b"app", dest=peer, tag=0x5243)
    x = np.arange(6, dtype=np.float32)
    comm.all_reduce(x)
    assert MPI.COMM_WORLD.recv(source=peer, tag=0x5243) == b"app"
    req.wait()
    np.testing.assert_array_equal(x, 2 * np.arange(6, dtype=np.float32))


@pytest.mark.parallel([3, 4])
@pytest.mark.slow  # every size: variants of the mismatch over MPI (test_mismatch_over_mpi_raises_on_every_rank stays)
def test_naive_mismatch_over_mpi_is_detected_before_any_oversized_receive():
    # Rank 0 receives from every rank in the master-centric algorithm; a peer
    # with a larger count must be caught by its fingerprint, not overrun a buffer.
    comm = ringcomm.init(timeout=30)
    t0 = time.monotonic()
    with pytest.raises(MismatchError, match="count=1000.*count=2000|count=2000.*count=1000"):
        comm.all_reduce(np.ones(1000 + 1000 * (comm.rank == 1)), algorithm="naive")
    assert time.monotonic() - t0 < 10


# (collective, algorithm, world sizes it runs on)
DISAGREEING_CALLS = [("all_reduce", "ring", None), ("all_reduce", "recursive_doubling", None),
                     ("all_reduce", "halving_doubling", None), ("all_reduce", "naive", None),
                     ("all_gather", "halving_doubling", (2, 4)), ("reduce_scatter", "halving_doubling", (2, 4)),
                     ("all_gather", "ring", None)]


@pytest.mark.parallel([2, 3, 4])
@pytest.mark.slow  # every size: variants of the mismatch over MPI (test_mismatch_over_mpi_raises_on_every_rank stays)
def test_a_peer_with_a_larger_count_never_writes_past_the_output():
    # Open MPI 5.0's single-copy path (smsc/cma) writes a message larger than
    # the posted receive in full, past the buffer, though it reports
    # MPI_ERR_TRUNCATE (tests/scripts/mpi_truncation.py shows it). Rank 1
    # calls with 8x the others' count, in messages well above the eager
    # limit: every rank must fail with MismatchError, naming both counts, and
    # no byte past any rank's output may change.
    from mpi4py import MPI
    rank, n = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size

    def one(coll, algorithm):
        comm = ringcomm.init(timeout=20)
        base = 16384 * n
        count = base * (8 if rank == 1 else 1)
        out_len = {"all_reduce": count, "all_gather": count, "reduce_scatter": count // n}[coll]
        in_len = {"all_reduce": count, "all_gather": count // n, "reduce_scatter": count}[coll]
        guard = 1 << 20
        big = np.full(out_len + guard, -7.0, np.float32)
        x = np.arange(in_len, dtype=np.float32) + rank
        errs = []
        try:
            getattr(comm, coll)(x, out=big[:out_len], algorithm=algorithm)
            errs.append(f"rank {rank}: {coll}/{algorithm} completed")
        except MismatchError as exc:
            if not (f"count={base}" in str(exc) and f"count={base * 8}" in str(exc)):
                errs.append(f"rank {rank}: {coll}/{algorithm}: the error does not name both calls: {exc}")
        except CommunicatorAborted as exc:
            errs.append(f"rank {rank}: {coll}/{algorithm}: aborted, not a mismatch: {exc}")
        changed = np.flatnonzero(big[out_len:] != -7.0)
        if changed.size:
            errs.append(f"rank {rank}: {coll}/{algorithm}: {changed.size * 4} bytes past the output overwritten, "
                        f"from index {out_len + changed[0]}")
        MPI.COMM_WORLD.Barrier()
        return errs

    def body():
        errs = []
        for coll, algorithm, sizes in DISAGREEING_CALLS:
            if sizes is None or n in sizes:
                errs += one(coll, algorithm)
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel([2, 4])
@pytest.mark.slow  # every size: variants of the mismatch over MPI (test_mismatch_over_mpi_raises_on_every_rank stays)
def test_a_dtype_mismatch_of_equal_sizes_is_caught_by_the_tag_over_mpi():
    # float32 against int32, same count: every message has the expected
    # size; only its MPI tag (the call's stamp) differs. Named on every rank.
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank

    def body():
        errs = []
        for algorithm in ("recursive_doubling", "halving_doubling"):
            comm = ringcomm.init(timeout=20)
            x = np.arange(1, 65, dtype=np.int32 if rank == 0 else np.float32)
            try:
                comm.all_reduce(x, algorithm=algorithm)
                errs.append(f"rank {rank}: {algorithm} completed")
            except MismatchError as exc:
                if not ("int32" in str(exc) and "float32" in str(exc)):
                    errs.append(f"rank {rank}: {algorithm}: the error does not name both calls: {exc}")
            MPI.COMM_WORLD.Barrier()
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel([2, 3, 4])
@pytest.mark.slow_nprocs(2, 4)
def test_peers_running_ahead_into_the_next_call_are_not_taken_for_another_call():
    # A receive kept waiting probes what comes next from its peer, and a
    # message of another stamp there makes it cancel itself: only a cancel
    # that takes (nothing matched yet) proves the other call. Here the peers
    # legitimately race ahead: one rank at a time lags (sleeps) before each
    # call, so the others' next-call messages queue up while receives of this
    # call wait, matched or not, eager and rendezvous sizes alike. Every call
    # must complete with exact results.
    from mpi4py import MPI
    rank, n = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size

    def body():
        errs = []
        comm = ringcomm.init(timeout=30)
        comm.segment_bytes = 16384
        for i in range(48):
            algorithm = ("ring", "recursive_doubling", "halving_doubling", "naive")[i % 4]
            count = (1, 1000, 3001, 70001)[(i // 4) % 4]
            if rank == (i // 2) % n:
                time.sleep(0.003)
            base = (np.arange(count, dtype=np.int64) % 997) + i
            got = comm.all_reduce((base + 7 * rank).astype(np.int32), algorithm=algorithm)
            want = (n * base + 7 * n * (n - 1) // 2).astype(np.int32)
            bad = np.flatnonzero(got != want)
            if bad.size:
                errs.append(f"rank {rank}: call {i} ({algorithm}, count {count}): index {bad[0]} is "
                            f"{got[bad[0]]}, expected {want[bad[0]]}")
        comm.close()
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parallel(3)
def test_abort_from_a_watchdog_thread_over_mpi():
    import threading
    comm = ringcomm.init(timeout=30)
    if comm.rank == 1:
        time.sleep(1.0)  # joins late: the others must already have given up
        with pytest.raises(CommunicatorAborted):
            comm.all_reduce(np.ones(10))
        return
    timer = threading.Timer(0.3, comm.abort)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(CommunicatorAborted):
        comm.all_reduce(np.ones(10))
    timer.join()
    assert time.monotonic() - t0 < 5


@pytest.mark.parallel([1, 2, 3, 4, 5])
@pytest.mark.slow_nprocs(1, 2, 3, 4)
def test_every_algorithm_over_mpi():
    # The other all_reduce algorithms (tests/test_algorithms.py has them in
    # process): all dtypes and ops, sizes 0, 1, N+-1, a prime, many segments,
    # and the ledger of each call against its closed form.
    def body():
        comm = ringcomm.init()
        n, errs = comm.size, []
        for algorithm in ("recursive_doubling", "halving_doubling", "naive"):
            comm.segment_bytes = 1 << 20
            errs += suite.run_cases(comm, [0, 1, max(n - 1, 0), n + 1, 101], algorithm=algorithm)
            comm.segment_bytes = 16
            errs += suite.run_cases(comm, [7 * n + 3], algorithm=algorithm)
            comm.segment_bytes = 65536
            errs += suite.run_cases(comm, [100003], suite.COMBOS[::3], algorithm=algorithm)
        comm.close()
        return errs
    assert_no_errors_anywhere(guarded(body))


@pytest.mark.parametrize("n", slow_except([3], [2, 3, 4]))
def test_all_reduce_does_not_allocate_per_call(tmp_path, n):
    # Every malloc on the calling thread is counted (a preloaded shim), so
    # this holds for our objects, MPI's and Python's alike: after warm-up,
    # a numpy all_reduce of any algorithm makes none per call. A few in
    # hundreds of calls remain (a queue or free list growing once to a new
    # high-water mark, mostly with 4 ranks sharing 2 cores); before the
    # recycling it was 3 or more per call.
    import json
    import os
    import subprocess
    import sys

    from ringcomm.launch import mpirun_command
    here = os.path.join(os.path.dirname(__file__), "scripts")
    shim = tmp_path / "malloc_count.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), os.path.join(here, "malloc_count.c")],
                   check=True)
    cmd = mpirun_command(n, [sys.executable, os.path.join(here, "alloc_per_call.py")], ["-x", "LD_PRELOAD"])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, LD_PRELOAD=str(shim)))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ranks = [json.loads(ln[6:]) for ln in res.stdout.splitlines() if ln.startswith("ALLOC ")]
    assert len(ranks) == n, res.stdout
    bad = [f"rank {d['rank']}: {case}: {v} mallocs in {d['reps']} calls" for d in ranks
           for case, v in d["cases"].items() if not isinstance(v, int) or v > d["reps"] // 50]
    assert not bad, "\n".join(bad)

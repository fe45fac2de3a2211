"""The shared suite on the in-process transport, plus errors, async and array types."""

import array
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import (CollectiveTimeout, CommunicatorAborted, InvalidArgument, MismatchError,
                      WaitTimeout)
from tiers import slow_except

WORLD_SIZES = list(range(1, 17)) + [32, 64]


def flat(results):
    return [e for errs in results for e in errs]


@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], WORLD_SIZES))
def test_small_counts_every_dtype_and_op(n):
    combos = suite.COMBOS if n <= 32 else suite.COVER
    errs = flat(ringcomm.run_local(n, suite.run_cases, [0, 1, max(n - 1, 0), n + 1], combos))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [2, 3])
def test_bool_reads_any_nonzero_byte_as_true_and_writes_0_or_1(n):
    # A bool array made by reinterpreting bytes (numpy .view(bool), torch
    # .view(torch.bool)) may hold any byte: it is True wherever not 0, as
    # numpy reads it, and every reduced byte is 0 or 1 (one rank reduces
    # nothing: its bytes are copied as they are).
    def body(comm):
        raw = np.array([0, 1, 2, 255, 0, 128], np.uint8) * (1 if comm.rank == 0 else 0)
        got = {op: comm.all_reduce(raw.copy().view(bool), op=op).view(np.uint8).tolist() for op in ("sum", "max")}
        every = (np.array([3, 1, 2, 255, 7, 128], np.uint8) - np.uint8(comm.rank)).view(bool)  # rank r: a 0 at r
        got["min"] = comm.all_reduce(every.copy(), op="min").view(np.uint8).tolist()
        got["prod"] = comm.all_reduce(every.copy(), op="prod").view(np.uint8).tolist()
        return got
    for got in ringcomm.run_local(n, body):
        assert got["sum"] == got["max"] == [0, 1, 1, 1, 0, 1], got
        assert got["min"] == got["prod"] == [1, 0, int(n < 3), 1, 1, 1], got


@pytest.mark.parametrize("dtype", ["int16", "uint16", "uint32", "uint64", "int8", "int32", "int64"])
def test_integer_sum_and_product_wrap_like_numpy(dtype):
    # Sums and products wrap modulo 2^bits, as numpy's; a 16-bit product is
    # computed in unsigned int (C++ promotes uint16 to int, where 65535 *
    # 65535 would overflow: undefined), checked against numpy at the extremes.
    dt = np.dtype(dtype)
    info = np.iinfo(dt)
    base = np.array([info.max, info.min, info.max // 2 + 1, 3, -1 if info.min else 1], dtype=object).astype(dt)

    def body(comm):
        mine = base + np.array([0, 0, comm.rank, comm.rank, 0]).astype(dt)
        return {op: comm.all_reduce(mine.copy(), op=op).tolist() for op in ("sum", "prod", "min", "max")}
    rows = np.stack([base + np.array([0, 0, r, r, 0]).astype(dt) for r in range(3)])
    with np.errstate(over="ignore"):
        want = {"sum": np.add.reduce(rows, 0, dtype=dt), "prod": np.multiply.reduce(rows, 0, dtype=dt),
                "min": rows.min(0), "max": rows.max(0)}
    for rank, got in enumerate(ringcomm.run_local(3, body)):
        for op, w in want.items():
            assert got[op] == w.tolist(), f"rank {rank}: {dtype} {op}: {got[op]} != numpy's {w.tolist()}"


@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], WORLD_SIZES))
def test_many_segments(n):
    # 16-byte segments: every chunk is cut into many pipelined messages.
    combos = suite.COMBOS if n <= 32 else suite.COVER
    errs = flat(ringcomm.run_local(n, suite.run_cases, [7 * n + 3], combos, segment_bytes=16))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], WORLD_SIZES))
def test_prime_count(n):
    # A prime above 10**5 with 64 KiB segments: uneven chunks, several segments each.
    combos = suite.COMBOS if n <= 16 else [("float32", "sum"), ("bfloat16", "avg"), ("int8", "prod"),
                                            ("uint8", "max"), ("float16", "min")]
    errs = flat(ringcomm.run_local(n, suite.run_cases, [100003], combos, segment_bytes=65536))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_broadcast_and_barrier(n):
    def body(comm):
        errs = suite.run_broadcasts(comm, [0, 1, n + 1, 1000])
        comm.segment_bytes = 24
        errs += suite.run_broadcasts(comm, [7 * n + 5], dtypes=["float32", "int8", "bfloat16"])
        return errs + suite.run_barrier(comm)
    errs = flat(ringcomm.run_local(n, body))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_barrier_waits_for_everyone(n):
    entered = [None] * n

    def body(comm):
        time.sleep(0.05 * comm.rank)
        entered[comm.rank] = time.monotonic()
        comm.barrier()
        return time.monotonic()

    left = ringcomm.run_local(n, body)
    assert min(left) >= max(entered), "a rank left the barrier before the last one entered"


@pytest.mark.parametrize("n", [1, 3, 4])
def test_async_works_complete_in_order_with_correct_results(n):
    def body(comm):
        works, arrays = [], []
        for k in range(6):
            x = np.arange(1000, dtype=np.int64) * (comm.rank + 1) + k
            arrays.append(x)
            works.append(comm.all_reduce(x, async_op=True))
        seqs = [w.seq for w in works]
        for w in reversed(works):
            w.wait()
        assert seqs == sorted(seqs)
        ranks_sum = n * (n + 1) // 2
        for k, x in enumerate(arrays):
            np.testing.assert_array_equal(x, np.arange(1000) * ranks_sum + n * k, err_msg=f"rank {comm.rank} work {k}")
        return all(w.is_completed() for w in works)
    assert all(ringcomm.run_local(n, body))


# ---- bad input: rejected before any byte moves -------------------------------

BAD = [
    ("unsupported dtype", lambda c: c.all_reduce(np.zeros(4, np.complex64)), "unsupported dtype complex64"),
    ("float8 dtype", lambda c: c.all_reduce(np.zeros(4, ml_dtypes.float8_e4m3fn)), "unsupported dtype float8_e4m3fn"),
    ("avg on bool", lambda c: c.all_reduce(np.zeros(4, bool), op="avg"), "avg"),
    ("byte-swapped", lambda c: c.all_reduce(np.zeros(4, ">f4")), "unsupported dtype"),
    ("non-contiguous", lambda c: c.all_reduce(np.zeros(8, np.float32)[::2]), "not C-contiguous"),
    ("read-only in place", lambda c: c.all_reduce(np.zeros(4, np.float32).setflags(write=False)
                                                  or _ro(np.zeros(4, np.float32))), "read-only"),
    ("read-only out", lambda c: c.all_reduce(np.zeros(4, np.float32), out=_ro(np.zeros(4, np.float32))), "read-only"),
    ("out wrong shape", lambda c: c.all_reduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32)), "5 elements"),
    ("out wrong dtype", lambda c: c.all_reduce(np.zeros(4, np.float32), out=np.zeros(4, np.float64)), "dtype float64"),
    ("out overlaps", lambda c: (lambda b: c.all_reduce(b[:4], out=b[2:6]))(np.zeros(8, np.float32)), "overlaps"),
    ("avg on ints", lambda c: c.all_reduce(np.zeros(4, np.int32), op="avg"), "avg"),
    ("band on floats", lambda c: c.all_reduce(np.zeros(4, np.float32), op="band"), "'band' needs an integer or bool"),
    ("bxor on bfloat16 reduce_scatter", lambda c: c.reduce_scatter(np.zeros(4, ml_dtypes.bfloat16), op="bxor"),
     "'bxor' needs an integer or bool dtype, got bfloat16"),
    ("unknown op", lambda c: c.all_reduce(np.zeros(4, np.float32), op="mean"), "unknown op"),
    ("root out of range", lambda c: c.broadcast(np.zeros(4), root=c.size), "root"),
    ("negative root", lambda c: c.broadcast(np.zeros(4), root=-1), "root"),
    ("rs out wrong size", lambda c: c.reduce_scatter(np.zeros(10, np.float32), out=np.zeros(10, np.float32)), "expected"),
    ("ag wrong chunk", lambda c: c.all_gather(np.zeros(3, np.float32), out=np.zeros(10, np.float32)), "split rule"),
    ("not an array", lambda c: c.all_reduce([1, 2, 3]), "expected a numpy array"),
]


def _ro(a):
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("name,call,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_rejected_before_any_byte_moves(name, call, message):
    def body(comm):
        before = comm.traffic()
        with pytest.raises(InvalidArgument, match=message) as info:
            call(comm)
        after = comm.traffic()
        moved = after.bytes_sent(kind="all") - before.bytes_sent(kind="all")
        # the communicator is still healthy: the next collective works
        x = np.full(4, comm.rank + 1.0)
        comm.all_reduce(x)
        return str(info.value), moved, x.tolist()
    for msg, moved, x in ringcomm.run_local(2, body):
        assert moved == 0
        assert x == [3.0] * 4


def test_bad_input_message_says_what_was_expected():
    def body(comm):
        with pytest.raises(InvalidArgument) as info:
            comm.all_reduce(np.zeros(4, np.float32), out=np.zeros((2, 2), np.float32))
        return str(info.value)
    (msg,) = ringcomm.run_local(1, body)
    assert "shape (2, 2)" in msg and "(4,)" in msg


# ---- ranks that disagree ----------------------------------------------------

# In each case one rank (the last, or the first) disagrees with the others.
MISMATCHES = {
    "count": lambda c: c.all_reduce(np.zeros(10 + (c.rank == 1), np.float32)),
    "dtype": lambda c: c.all_reduce(np.zeros(10, np.float64 if c.rank == c.size - 1 else np.float32)),
    "op": lambda c: c.all_reduce(np.zeros(10, np.float32), op="max" if c.rank == 0 else "sum"),
    "collective": lambda c: (c.reduce_scatter(np.zeros(12, np.float32)) if c.rank == 1
                             else c.all_reduce(np.zeros(12, np.float32))),
    "root": lambda c: c.broadcast(np.zeros(5), root=1 if c.rank == c.size - 1 else 0),
}


@pytest.mark.parametrize("what", list(MISMATCHES))
@pytest.mark.parametrize("n", slow_except([4], [2, 4, 5]))
def test_mismatch_raises_on_every_rank_quickly(what, n):
    def body(comm):
        t0 = time.monotonic()
        try:
            MISMATCHES[what](comm)
            comm.barrier()  # broadcast: ranks upstream of the culprit learn at their next call
        except (MismatchError, CommunicatorAborted) as exc:
            err = exc
        else:
            err = None
        elapsed = time.monotonic() - t0
        t1 = time.monotonic()
        with pytest.raises(CommunicatorAborted):
            comm.all_reduce(np.zeros(3))
        return err, elapsed, time.monotonic() - t1
    results = ringcomm.run_local(n, body, timeout=30)
    for rank, (err, elapsed, again) in enumerate(results):
        assert isinstance(err, MismatchError), f"rank {rank}: {err!r}"
        assert elapsed < 10, f"rank {rank} took {elapsed:.1f} s to notice"
        assert again < 1, f"rank {rank}: the call after the abort took {again:.1f} s"
        text = str(err)
        assert "ranks disagree" in text and "rank " in text
    text = str(results[0][0])
    if what == "count":
        assert "count=10" in text and "count=11" in text
    if what == "dtype":
        assert "float64" in text and "float32" in text
    if what == "op":
        assert "op=max" in text and "op=sum" in text
    if what == "collective":
        assert "reduce_scatter" in text and "all_reduce" in text


def test_all_gather_without_out_checks_counts_on_every_rank():
    def body(comm):
        x = np.zeros(3 if comm.rank == 0 else 2, np.float32)  # 3,2,2: the split of 7
        y = np.zeros(1 if comm.rank == 0 else 3, np.float32)  # 1,3,3: not the split of 7 (3,2,2)
        got = comm.all_gather(x)
        with pytest.raises(InvalidArgument, match="split rule"):
            comm.all_gather(y)
        return got.size
    assert ringcomm.run_local(3, body) == [7, 7, 7]


# ---- timeouts and aborts ----------------------------------------------------

@pytest.mark.parametrize("timeout", [float("inf"), 1e300, 86400.0 * 999999999])  # the last: torch's timedelta.max
def test_a_timeout_of_never_never_times_out(timeout):
    # Deadlines are int64 nanoseconds in the engine: these wrapped, and every
    # wait timed out at once ("timed out after inf s").
    def body(comm):
        x = np.arange(10, dtype=np.float64) * (comm.rank + 1)
        comm.all_reduce(x)
        return bool(np.array_equal(x, np.arange(10) * 3.0)), comm.timeout
    got = ringcomm.run_local(2, body, timeout=timeout)
    assert all(ok for ok, _ in got), got
    assert all(t == ringcomm.config.MAX_TIMEOUT for _, t in got), got


def test_default_segment_is_1_MiB_on_hosts_and_64_MiB_on_gpus(monkeypatch):
    # On a GPU each message costs the host far more than the device's copy of
    # 1 MiB (config.DEFAULT_GPU_SEGMENT_BYTES); the emulated devices are host memory.
    monkeypatch.delenv("RINGCOMM_SEGMENT_BYTES", raising=False)
    assert ringcomm.run_local(2, lambda c: c.segment_bytes) == [1 << 20] * 2
    assert ringcomm.run_local(2, lambda c: c.segment_bytes, device="emulated") == [1 << 20] * 2
    assert ringcomm.config.settings(gpu=True).segment_bytes == 64 << 20
    assert [ringcomm.config.on_gpu(d) for d in (None, "emulated", "emulated-nccl", "cuda", 0, [0, 1])] == \
        [False, False, False, True, True, True]
    monkeypatch.setenv("RINGCOMM_SEGMENT_BYTES", "2M")  # the environment wins over either default
    assert ringcomm.config.settings(gpu=True).segment_bytes == 2 << 20
    assert ringcomm.config.settings(segment_bytes="3K", gpu=True).segment_bytes == 3072  # and the argument over it


def test_rank_that_never_joins_makes_the_others_time_out():
    def body(comm):
        if comm.rank == 2:
            return None
        if comm.rank == 1:
            # Rank 1 waits for rank 0 (its step-1 chunk needs rank 2's). Had it
            # started with rank 0, its deadline would fall microseconds from
            # rank 0's, and which of the two fires first would be the
            # scheduler's choice (a failure 3 times in 6 under load): 0.3 s
            # later, rank 0's deadline comes first.
            time.sleep(0.3)
        t0 = time.monotonic()
        try:
            # the ring: rank 0 waits for rank 2, its left neighbour, and times out
            comm.all_reduce(np.arange(1000, dtype=np.float32), algorithm="ring")
        except (CollectiveTimeout, CommunicatorAborted) as exc:
            return exc, time.monotonic() - t0
        return "completed", 0
    results = ringcomm.run_local(3, body, timeout=1.0)
    (e0, t0), (e1, t1) = results[0], results[1]
    assert isinstance(e0, CollectiveTimeout), e0
    assert e0.peer == 2 and e0.rank == 0 and "rank 2" in str(e0)
    assert 0.9 < t0 < 10
    assert isinstance(e1, (CollectiveTimeout, CommunicatorAborted)) and t1 < 10
    assert "rank 2" in str(e1) or "rank 0" in str(e1)


def test_after_a_timeout_later_calls_raise_at_once():
    def body(comm):
        if comm.rank == 1:
            return None
        with pytest.raises(CollectiveTimeout):
            comm.barrier()
        t0 = time.monotonic()
        with pytest.raises(CommunicatorAborted, match="timed out"):
            comm.all_reduce(np.zeros(4))
        return time.monotonic() - t0
    assert ringcomm.run_local(2, body, timeout=0.5)[0] < 0.2


def test_abort_reaches_waiting_ranks_fast():
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.2)
            comm.abort()
            return None
        t0 = time.monotonic()
        with pytest.raises(CommunicatorAborted, match="rank 1 aborted"):
            comm.all_reduce(np.zeros(100))
        return time.monotonic() - t0
    res = ringcomm.run_local(3, body, timeout=30)
    assert res[0] < 5 and res[2] < 5


def test_run_local_reraises_and_does_not_hang():
    def body(comm):
        if comm.rank == 0:
            raise KeyError("boom")
        comm.all_reduce(np.zeros(10))
    t0 = time.monotonic()
    with pytest.raises(KeyError):
        ringcomm.run_local(3, body, timeout=30)
    assert time.monotonic() - t0 < 5


def test_work_wait_timeout_while_a_peer_is_late():
    gate = threading.Event()

    def body(comm):
        if comm.rank == 1:
            gate.wait()
        w = comm.all_reduce(np.ones(4), async_op=True)
        if comm.rank == 0:
            with pytest.raises(WaitTimeout):
                w.wait(timeout=0.2)
            gate.set()
        return w.wait().tolist()
    assert ringcomm.run_local(2, body) == [[2.0] * 4] * 2


# ---- array types: zero copy -------------------------------------------------

def test_buffer_protocol_objects_in_place():
    def body(comm):
        a = array.array("f", [comm.rank + 1.0] * 5)
        comm.all_reduce(a)
        b = bytearray([comm.rank + 1] * 3)
        comm.all_reduce(b, op="max")
        return list(a), list(b)
    for a, b in ringcomm.run_local(3, body):
        assert a == [6.0] * 5 and b == [3] * 3


def test_torch_cpu_tensors_zero_copy():
    torch = pytest.importorskip("torch")

    def body(comm):
        out = {}
        for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
            x = torch.arange(10, dtype=dt) + comm.rank
            ptr = x.data_ptr()
            comm.all_reduce(x)
            assert x.data_ptr() == ptr
            out[str(dt)] = x.tolist()
        g = torch.nn.Parameter(torch.ones(6) * (comm.rank + 1))
        comm.all_reduce(g.data, op="avg")
        rs = comm.reduce_scatter(torch.arange(7, dtype=torch.float64))
        assert isinstance(rs, torch.Tensor) and rs.dtype == torch.float64
        with pytest.raises(InvalidArgument, match="not contiguous"):
            comm.all_reduce(torch.zeros(4, 4).t())
        ag = comm.all_gather(torch.full((2,), float(comm.rank)), out=torch.empty(4))
        return out, g.data.tolist(), rs.tolist(), ag.tolist()
    res = ringcomm.run_local(2, body)
    for r, (out, g, rs, ag) in enumerate(res):
        for k, v in out.items():
            assert v == [2 * i + 1 for i in range(10)], (r, k)
        assert g == [1.5] * 6
        assert rs == ([0.0, 2.0, 4.0, 6.0] if r == 0 else [8.0, 10.0, 12.0])
        assert ag == [0.0, 0.0, 1.0, 1.0]


def test_abort_interrupts_a_collective_that_is_waiting():
    # A watchdog on another thread aborts while the collective waits for a
    # rank that never comes: it fails at once, not at its deadline.
    def body(comm):
        if comm.rank == 1:
            return None
        timer = threading.Timer(0.3, comm.abort)
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(CommunicatorAborted, match="aborted"):
            comm.all_reduce(np.ones(10))
        timer.join()
        return time.monotonic() - t0
    res = ringcomm.run_local(3, body, timeout=30)
    assert res[0] < 5 and res[2] < 5, res


@pytest.mark.parametrize("n", [3, 4])
def test_naive_all_reduce_count_mismatch_is_a_mismatch_not_an_overrun(n):
    def body(comm):
        try:
            comm.all_reduce(np.ones(1000 + 1000 * (comm.rank == 1)), algorithm="naive")
        except MismatchError as exc:
            return str(exc)
        return "completed"
    for rank, msg in enumerate(ringcomm.run_local(n, body, timeout=30)):
        assert "count=1000" in msg and "count=2000" in msg, f"rank {rank}: {msg}"


def test_close_from_another_thread_while_a_collective_runs():
    # The running collective keeps the engine alive; close() does not pull it
    # out from under it, and later calls say the communicator is closed.
    def body(comm):
        if comm.rank == 1:
            return None
        closer = threading.Timer(0.2, comm.close)
        closer.start()
        with pytest.raises(CollectiveTimeout):
            comm.all_reduce(np.ones(10))
        closer.join()
        with pytest.raises(InvalidArgument, match="closed"):
            comm.all_reduce(np.ones(10))
        return True
    assert ringcomm.run_local(2, body, timeout=1.0)[0] is True


def test_dlpack_read_only_flag_is_honoured():
    # A DLPack 1.0 producer marks read-only memory: usable as an input,
    # refused where ringcomm would write.
    class Producer:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    def body(comm):
        ro = np.arange(6, dtype=np.float32) + comm.rank
        ro.setflags(write=False)
        got = comm.reduce_scatter(Producer(ro))           # read only: fine
        with pytest.raises(InvalidArgument, match="read-only"):
            comm.all_reduce(Producer(ro))                 # in place would write: refused
        return np.asarray(got).tolist()
    assert ringcomm.run_local(2, body) == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]


def test_all_gather_without_out_keeps_the_input_family_and_dtype():
    torch = pytest.importorskip("torch")

    def body(comm):
        mine = torch.full((comm.rank + 1,), float(comm.rank), dtype=torch.float32)
        got = comm.all_gather(mine)  # counts 1, 2, 3: the split rule for 6 over 3 ranks needs 2, 2, 2
        return got
    with pytest.raises(ringcomm.InvalidArgument, match="split rule"):
        ringcomm.run_local(3, body)

    def body2(comm):
        mine = torch.full((2,), float(comm.rank), dtype=torch.float32)
        return comm.all_gather(mine)
    for got in ringcomm.run_local(3, body2):
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        assert got.tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]

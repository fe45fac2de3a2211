"""The device path on a CPU: the shared suite over in-process ranks whose
payload goes through the emulated device (csrc/transports/stream_emu.h): every copy and
reduction is enqueued on a per-rank queue run by its own thread, ordered only
by events, exactly as on GPU streams. A random delay before each queued
operation (jitter) lets queues run ahead of each other, so a missing ordering
edge in the transport, the engine or the algorithms shows up as wrong data."""

import time

import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import InvalidArgument, traffic
from tiers import slow_except

SIZES = [1, 2, 3, 4, 5, 8]


def flat(results):
    return [e for errs in results for e in errs]


def run(n, fn, *args, **kw):
    kw.setdefault("timeout", 60)
    kw.setdefault("device", "emulated")
    return ringcomm.run_local(n, fn, *args, **kw)


@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], SIZES))
def test_small_counts_every_dtype_and_op(n):
    errs = flat(run(n, suite.run_cases, [0, 1, max(n - 1, 0), n + 1], jitter_us=20))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", slow_except([2, 3], SIZES))
def test_many_segments_with_jitter(n):
    # 16-byte segments: many units in flight, slots reused, sends overlapping
    # reductions; the jitter reorders the queues' progress from run to run.
    combos = [("float32", "sum"), ("int32", "prod"), ("float16", "avg"), ("int8", "max"), ("bfloat16", "min")]
    errs = flat(run(n, suite.run_cases, [7 * n + 3, 61], combos, segment_bytes=16, jitter_us=200))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_prime_count(n):
    combos = [("float32", "sum"), ("int64", "sum"), ("float64", "avg")]
    errs = flat(run(n, suite.run_cases, [100003], combos, segment_bytes=65536, jitter_us=100))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_broadcast_and_barrier(n):
    def body(comm):
        comm.segment_bytes = 24
        return (suite.run_broadcasts(comm, [0, 1, n + 1, 7 * n + 5], ["float32", "int8", "bfloat16"])
                + suite.run_barrier(comm))
    errs = flat(run(n, body, jitter_us=50))
    assert not errs, "\n".join(errs[:20])


def test_work_wait_returns_before_the_device_is_done_and_synchronize_after():
    """The emulated device really is asynchronous: once the host has enqueued
    the collective (Work's native wait) the queues may not have run it yet;
    synchronize() is what guarantees the result. Without this, the suite above
    would prove nothing about ordering."""
    def body(comm):
        x = np.full(64, comm.rank + 1, np.float64)
        w = comm.all_reduce(x, async_op=True)
        assert w._native.wait(30.0)          # everything enqueued (host side)
        early = x.copy()                     # the device queue is still sleeping on its jitter
        w.synchronize(timeout=30)
        return early.tolist(), x.tolist()
    for early, final in run(2, body, jitter_us=50_000):
        assert final == [3.0] * 64
        assert early != final, "the emulated queue ran synchronously: the ordering tests would be vacuous"


@pytest.mark.parametrize("n", [2, 3])
def test_async_works_complete_in_order_with_correct_results(n):
    def body(comm):
        xs = [np.arange(50, dtype=np.float32) * (k + 1) + comm.rank for k in range(5)]
        works = [comm.all_reduce(x, async_op=True) for x in xs]
        outs = [w.synchronize(timeout=60) for w in works]
        base = np.arange(50, dtype=np.float32)
        return all(np.array_equal(o, base * (k + 1) * n + sum(range(n))) for k, o in enumerate(outs))
    assert all(run(n, body, jitter_us=100))


def test_ledger_is_the_same_as_on_the_host():
    def body(comm):
        comm.all_reduce(np.arange(1000, dtype=np.float32), algorithm="ring")  # what a device runs
        t = comm.traffic()
        return t.bytes_sent("all_reduce"), t.bytes_received("all_reduce")
    dev = run(4, body)
    host = ringcomm.run_local(4, body)
    assert dev == host
    assert dev[0] == (2 * 3 * 1000 * 4 // 4,) * 2


@pytest.mark.parametrize("algorithm", ["naive", "recursive_doubling", "halving_doubling"])
def test_every_algorithm_moves_the_same_payload_as_on_the_host(algorithm):
    # Per peer, byte for byte and message for message. Only the fingerprints
    # (control) travel differently: on their own, in host memory.
    def body(comm):
        comm.all_reduce(np.arange(1000, dtype=np.float32), algorithm=algorithm)
        t = comm.traffic()
        return (t.per_peer("bytes_sent", "all_reduce"), t.per_peer("bytes_received", "all_reduce"),
                t.per_peer("msgs_sent", "all_reduce"))
    for n in (3, 4, 5):
        dev, host = run(n, body), ringcomm.run_local(n, body)
        for r in range(n):
            assert dev[r] == host[r], (n, r, dev[r], host[r])
            assert dev[r][0] == traffic.expected("all_reduce", 1000, "float32", n, r, algorithm=algorithm).sent


def test_trace_records_steps_but_not_device_values():
    def body(comm):
        with comm.trace(values=True) as t:
            comm.all_reduce(np.arange(12, dtype=np.int32))
        return t.steps
    for steps in run(3, body):
        assert len(steps) == 2 * (3 - 1)
        assert all(s.values is None for s in steps)  # device memory is not read by the host


def test_device_property_and_transport_name():
    def body(comm):
        return comm.device, comm.transport
    assert run(2, body) == [("emulated:0", "inproc(emulated:0)"), ("emulated:1", "inproc(emulated:1)")]
    assert ringcomm.run_local(1, body) == [(None, "inproc")]


def test_close_waits_for_the_queues():
    """Closing a communicator drains its device queue before the memory the
    queue may still use goes away (no crash, result complete)."""
    def body(comm):
        x = np.full(1000, comm.rank, np.float32)
        w = comm.all_reduce(x, async_op=True)
        w._native.wait(30.0)
        comm.close()
        return float(x[0])
    t0 = time.monotonic()
    assert run(2, body, jitter_us=2000) == [1.0, 1.0]
    assert time.monotonic() - t0 < 30


def test_host_memory_behind_cuda_array_interface_is_refused():
    """An object claiming __cuda_array_interface__ whose pointer is not GPU
    memory (here: no GPU at all, or host memory) is refused with a reason."""
    buf = np.zeros(8, np.float32)

    class Fake:
        __cuda_array_interface__ = {"shape": (8,), "typestr": "<f4", "data": (buf.ctypes.data, False),
                                    "version": 3, "strides": None, "stream": None}

    def body(comm):
        with pytest.raises(InvalidArgument, match="not on a GPU"):
            comm.all_reduce(Fake())
        return True
    assert all(ringcomm.run_local(2, body))


def test_gpu_communicators_without_a_gpu_fail_clearly():
    import ringcomm.cuda as rcuda
    if rcuda.available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(InvalidArgument, match="GPU|_cuda"):
        ringcomm.run_local(2, lambda comm: None, device="cuda")
    with pytest.raises(InvalidArgument, match="device must be"):
        ringcomm.run_local(2, lambda comm: None, device="tpu")


@pytest.mark.parametrize("device", ["emulated", "emulated-nccl"])
def test_mismatch_and_abort_end_quickly_on_the_device_path(device):
    from ringcomm import CommunicatorAborted, MismatchError

    def body(comm):
        x = np.zeros(100 + (comm.rank == 1), np.float32)  # rank 1 disagrees on the count
        t0 = time.monotonic()
        try:
            comm.all_reduce(x)
            return "no error", time.monotonic() - t0
        except (MismatchError, CommunicatorAborted) as e:
            return type(e).__name__, time.monotonic() - t0
    t0 = time.monotonic()
    res = run(3, body, timeout=30, jitter_us=100, device=device)
    assert all(kind == "MismatchError" for kind, _ in res), res
    assert time.monotonic() - t0 < 10, res


# ---------------------------------------------------------------------------
# The NCCL transport's own grouping and ordering code (grouped_transport.cpp),
# over the emulated device with NCCL-like groups: a group blocks its queue
# until all of its messages matched. Segments are kept above the in-process
# transport's 256-byte eager limit, so no send completes without its receive
# (as with NCCL) and a wrong grouping deadlocks instead of slipping through.

@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], [1, 2, 3, 4, 5, 8]))
def test_grouped_transport_suite(n):
    combos = [("float32", "sum"), ("int32", "prod"), ("float64", "avg"), ("int8", "max"), ("bfloat16", "min"),
              ("float16", "sum"), ("uint8", "min"), ("int64", "sum")]
    errs = flat(run(n, suite.run_cases, [0, 1, n + 1, 300 * n + 7], combos, segment_bytes=512,
                    jitter_us=100, device="emulated-nccl"))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "halving_doubling", "naive"])
@pytest.mark.parametrize("n", slow_except([3, 8], [2, 3, 4, 5, 8]))
def test_grouped_transport_runs_every_algorithm_asked_for(n, algorithm):
    # auto runs the ring on a device; the others run when asked for. Each
    # exchange's send and receive must fall in one group on both partners:
    # halving_doubling numbered its receives after its sends, and returned
    # wrong sums at N = 2 (deadlocked at N = 3) here, silently on NCCL.
    combos = [("float32", "sum"), ("int32", "prod"), ("float64", "avg"), ("int8", "max")]
    errs = flat(run(n, suite.run_cases, [1, n + 1, 300 * n + 7], combos, segment_bytes=512, jitter_us=50,
                    device="emulated-nccl", algorithm=algorithm, timeout=20))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_grouped_transport_broadcast_barrier_and_zero_byte_segments(n):
    def body(comm):
        comm.segment_bytes = 512
        errs = suite.run_broadcasts(comm, [0, 1, 700 * n + 5], ["float32", "int8"]) + suite.run_barrier(comm)
        # count n-1: one rank's chunk is empty, so units with a send and no
        # receive (and the reverse) occur on every rank
        errs += suite.run_cases(comm, [n - 1, 2 * n - 1], [("float64", "sum")])
        return errs
    errs = flat(run(n, body, jitter_us=100, device="emulated-nccl"))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("device", ["emulated", "emulated-nccl"])
@pytest.mark.parametrize("n", slow_except([1, 2, 3], [1, 2, 3, 4, 5]))
def test_reduce_gather_scatter_all_to_all_on_the_device_paths(n, device):
    # Issue 23's collectives over the device path: every copy and reduction
    # queued with jitter ("emulated"), or payload in NCCL-like groups that
    # block until all their messages matched ("emulated-nccl"): results and
    # the ledger as on the host (collectives_suite checks both).
    import collectives_suite as cs

    def body(comm):
        comm.segment_bytes = 512  # several segments per message
        return cs.run_all(comm, [0, 1, n + 1, 101, 300 * n + 7],
                          reduce_combos=[("float32", "sum"), ("bfloat16", "avg"), ("int8", "prod"), ("int64", "max")])
    errs = flat(run(n, body, device=device, jitter_us=50 if device == "emulated" else 0))
    assert not errs, "\n".join(errs[:20])

"""GPU side: the extension builds wherever the toolchain is, imports without a
GPU, and (on a machine with a GPU) the kernels match the host reducer bit for bit."""

import glob
import os
import shutil
import sys

import numpy as np
import pytest

import ringcomm
import ringcomm.cuda as rcuda
from ringcomm.vocab import DTYPES, FLOATING, NUMPY, OPS, op_fits
from ringcomm._native import core
from ringcomm.errors import InvalidArgument


def toolchain_present() -> bool:
    return bool(shutil.which("nvcc") or os.access("/usr/local/cuda/bin/nvcc", os.X_OK))


def nccl_wheel_present() -> bool:
    return any(glob.glob(os.path.join(p, "nvidia", "nccl", "lib", "libnccl.so*")) for p in sys.path)


def test_extension_is_built_where_the_toolchain_is():
    # nvcc alone is enough to build it: NCCL is loaded at run time (nccl_api.h).
    if os.environ.get("RINGCOMM_CUDA", "auto").lower() in ("0", "off", "no", "false"):
        pytest.skip("RINGCOMM_CUDA=0")
    if not toolchain_present():
        pytest.skip("no nvcc on this machine: ringcomm._cuda is optional")
    assert rcuda.built(), rcuda.status()
    assert rcuda._cuda.runtime_version() > 0
    if nccl_wheel_present() or os.environ.get("NCCL_HOME"):
        assert rcuda._cuda.nccl_version() > 0, rcuda._cuda.nccl_missing()


def test_no_gpu_degrades_to_clear_errors():
    assert isinstance(rcuda.status(), str) and rcuda.status()
    x = np.zeros(4, np.float32)
    with pytest.raises(InvalidArgument, match="CUDA array|not built"):
        rcuda.reduce(x, x, x)
    if not rcuda.available():
        assert rcuda.device_count() == 0


NO_GPU = "the GPU tests need a GPU (`ringcomm info` says what ringcomm._cuda found)"


@pytest.fixture
def _need_gpu():
    # One skip call, so pytest -ra folds every GPU test into one short line.
    if not rcuda.available():
        pytest.skip(NO_GPU)


gpu = pytest.mark.usefixtures("_need_gpu")
CASES = [(d, o) for d in DTYPES for o in OPS if op_fits(d, o)]


def host_reduce(dtype, op, a, b):
    dst = np.empty_like(a)
    core.reduce(DTYPES[dtype], OPS[op], dst.ctypes.data, a.ctypes.data, b.ctypes.data, a.size)
    return dst


def random_pair(dtype, n, rng):
    dt = NUMPY[dtype]
    if dtype in FLOATING:
        return (rng.standard_normal(n) * 100).astype(dt), (rng.standard_normal(n) * 100).astype(dt)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(dt), rng.integers(0, 2, n).astype(dt)
    info = np.iinfo(dt)  # dtype=: uint64's top half is out of int64's range
    return (rng.integers(info.min, info.max, n, endpoint=True, dtype=dt),
            rng.integers(info.min, info.max, n, endpoint=True, dtype=dt))


@gpu
@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("n,offset", [(0, 0), (1, 0), (7, 0), (33, 1), (4099, 0), (4099, 3), ((1 << 20) + 5, 0)])
def test_kernels_match_the_host_reducer_bitwise(dtype, op, n, offset):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(n + offset)
    a, b = random_pair(dtype, n + offset, rng)
    want = host_reduce(dtype, op, a[offset:], b[offset:])
    width = NUMPY[dtype].itemsize
    da = cupy.asarray(a.view(np.uint8)).view(cupy.uint8)[offset * width:]  # offset: the scalar (misaligned) path
    db = cupy.asarray(b.view(np.uint8)).view(cupy.uint8)[offset * width:]
    dd = cupy.empty_like(da)
    rcuda.reduce(Typed(dd, dtype), Typed(da, dtype), Typed(db, dtype), op)
    cupy.cuda.get_current_stream().synchronize()
    got = cupy.asnumpy(dd).view(NUMPY[dtype])
    bad = np.flatnonzero(np.any(got.view(np.uint8).reshape(n, width) != want.view(np.uint8).reshape(n, width), 1))
    assert bad.size == 0, f"{dtype} {op} n={n}: index {bad[0]}: device {got[bad[0]]!r}, host {want[bad[0]]!r}"


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_avg_finalize_matches_host(dtype):
    cupy = pytest.importorskip("cupy")
    x = (np.arange(1000) - 300).astype(NUMPY[dtype])
    want = x.copy()
    core.finalize(DTYPES[dtype], OPS["avg"], want.ctypes.data, want.size, 7)
    raw = cupy.asarray(x.view(np.uint8))
    rcuda.finalize(Typed(raw, dtype), "avg", 7)
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(raw), want.view(np.uint8))


# ---------------------------------------------------------------------------
# The ring on the GPU: the shared suite over in-process ranks on one GPU
# (NCCL refuses two ranks on one GPU), stream semantics, bad input, NCCL.

class CupyArrays:
    """suite.py's array adapter for cupy (cupy has no bfloat16: that dtype is
    covered by test_bfloat16_on_device below)."""
    dtypes = [d for d in DTYPES if d != "bfloat16"]

    @staticmethod
    def put(a):
        import cupy
        return cupy.asarray(a)

    @staticmethod
    def get(x):
        import cupy
        return cupy.asnumpy(x)

    @staticmethod
    def full(count, value, dtype):
        import cupy
        return cupy.full(count, value, dtype=dtype)


def flat(results):
    return [e for errs in results for e in errs]


def on_gpu(n, fn, *args, **kw):
    import ringcomm
    kw.setdefault("timeout", 60)
    return ringcomm.run_local(n, fn, *args, device="cuda", **kw)


@gpu
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_suite_on_one_gpu_every_dtype_and_op(n):
    pytest.importorskip("cupy")
    import suite
    errs = flat(on_gpu(n, suite.run_cases, [0, 1, max(n - 1, 0), n + 1, 1000], arrays=CupyArrays))
    assert not errs, "\n".join(errs[:20])


@gpu
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_suite_on_one_gpu_many_segments_and_prime(n):
    pytest.importorskip("cupy")
    import suite
    combos = [("float32", "sum"), ("int32", "prod"), ("float16", "avg"), ("int8", "max"), ("float64", "min")]
    errs = flat(on_gpu(n, suite.run_cases, [7 * n + 3], combos, segment_bytes=16, arrays=CupyArrays))
    errs += flat(on_gpu(n, suite.run_cases, [100003], combos, segment_bytes=65536, arrays=CupyArrays))
    errs += flat(on_gpu(n, lambda c: suite.run_broadcasts(c, [0, 1, 7 * n + 5], ["float32", "int8"],
                                                          arrays=CupyArrays) + suite.run_barrier(c)))
    assert not errs, "\n".join(errs[:20])


@gpu
@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "halving_doubling", "naive"])
def test_every_algorithm_on_one_gpu(n, algorithm):
    # The fingerprint to a peer beyond the neighbours goes on its own in host
    # memory on a device (csrc/core/link.cpp): each algorithm's full suite on GPU
    # memory, many segments included.
    pytest.importorskip("cupy")
    import suite
    combos = [("float32", "sum"), ("int32", "max"), ("float16", "avg"), ("int8", "min")]
    errs = flat(on_gpu(n, suite.run_cases, [0, 1, n + 1, 1000], combos, arrays=CupyArrays, algorithm=algorithm))
    errs += flat(on_gpu(n, suite.run_cases, [7 * n + 3], combos[:2], segment_bytes=16, arrays=CupyArrays,
                        algorithm=algorithm))
    assert not errs, "\n".join(errs[:20])


class Typed:
    """A typed __cuda_array_interface__ over raw cupy bytes (cupy has no bfloat16)."""

    def __init__(self, raw, dtype):
        self.raw = raw
        self.dtype = NUMPY[dtype]
        self.__cuda_array_interface__ = {"shape": (raw.size // self.dtype.itemsize,), "typestr": self.dtype.str,
                                         "data": (raw.data.ptr, False), "version": 3, "strides": None,
                                         "stream": 1}


@gpu
@pytest.mark.parametrize("n", [2, 3])
def test_bfloat16_on_device(n):
    cupy = pytest.importorskip("cupy")
    import suite

    def body(comm):
        errs = []
        for op in ("sum", "prod", "min", "max", "avg"):
            count = 1001
            mine = suite.rank_data("bfloat16", op, n, count, [comm.rank])[0]
            x = Typed(cupy.asarray(mine.view(np.uint8)), "bfloat16")
            out = Typed(cupy.zeros(count * 2, cupy.uint8), "bfloat16")
            comm.all_reduce(x, op, out=out)
            cupy.cuda.Stream.null.synchronize()
            got = cupy.asnumpy(out.raw).view(NUMPY["bfloat16"])
            errs += suite.compare(got, suite.reference("bfloat16", op, n, count), f"bfloat16 {op}", comm.rank)
        return errs
    errs = flat(on_gpu(n, body))
    assert not errs, "\n".join(errs)


SPIN = r'''
extern "C" __global__ void spin_then_fill(float* x, int n, float value, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = value;
}
'''


@gpu
def test_stream_order_producer_collective_consumer():
    """A slow producer kernel (about 1 s) on the caller's stream writes the
    input; the collective must see its values (ordered after it), and a
    consumer queued on that stream after wait() must see the result. wait()
    must not block the host: right after it returns, the producer is still
    running (its completion event is not done)."""
    cupy = pytest.importorskip("cupy")
    import threading
    kernel = cupy.RawKernel(SPIN, "spin_then_fill")
    n = 3
    gate = threading.Barrier(n)

    def body(comm):
        cycles = int(cupy.cuda.Device().attributes["ClockRate"]) * 1000  # ~1 s (ClockRate is in kHz)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            warm = cupy.zeros(256, cupy.float32)
            kernel((1,), (32,), (warm, cupy.int32(warm.size), cupy.float32(1), cupy.int64(1)))  # compile first
            comm.all_reduce(warm)
            stream.synchronize()
            x = cupy.zeros(1 << 20, cupy.float32)
            gate.wait()
            kernel((64,), (256,), (x, cupy.int32(x.size), cupy.float32(comm.rank + 1), cupy.int64(cycles)))
            produced = cupy.cuda.Event()
            produced.record(stream)
            w = comm.all_reduce(x, async_op=True)
            w.wait()
            still_running = not produced.done
            y = x * 2  # consumer, same stream, after wait()
            stream.synchronize()
        return still_running, float(y.min()), float(y.max())
    for still_running, lo, hi in on_gpu(n, body):
        assert lo == hi == 2 * sum(range(1, n + 1)), (lo, hi)
        assert still_running, "wait() blocked the host until the producer finished"


@gpu
def test_point_to_point_on_gpus_ordered_after_the_producer():
    """send/recv of GPU arrays (through host memory, csrc/engine/p2p.h): the
    send copies out after a slow producer (about 0.2 s) on the caller's
    non-blocking stream, so the receiver gets the produced values; wait()
    has them in place when it returns."""
    cupy = pytest.importorskip("cupy")
    kernel = cupy.RawKernel(SPIN, "spin_then_fill")
    n = 3

    def body(comm):
        r = comm.rank
        cycles = int(cupy.cuda.Device().attributes["ClockRate"]) * 200  # ~0.2 s
        with cupy.cuda.Stream(non_blocking=True) as s:
            x = cupy.zeros(1 << 18, cupy.float32)
            kernel((64,), (256,), (x, cupy.int32(x.size), cupy.float32(r + 1), cupy.int64(cycles)))
            y = cupy.full(1 << 18, -1, cupy.float32)
            works = comm.batch_isend_irecv([ringcomm.P2POp("irecv", y, (r - 1) % n),
                                            ringcomm.P2POp("isend", x, (r + 1) % n)])
            for w in works:
                w.wait()
            got = cupy.asnumpy(y)
            s.synchronize()
        return float(got.min()), float(got.max()), works[0].source
    for r, (lo, hi, src) in enumerate(on_gpu(n, body)):
        want = float((r - 1) % n + 1)
        assert lo == hi == want and src == (r - 1) % n, f"rank {r}: got {lo}..{hi} from {src}, want {want}"


@gpu
def test_a_copy_with_itself_past_its_deadline_keeps_the_arrays():
    """sendrecv with itself on a GPU is a copy queued after a slow producer
    (torch.cuda._sleep, about a second) on the caller's stream; with a 0.2 s
    timeout it raises CollectiveTimeout while the copy stays queued. The
    error's claim keeps both tensors referenced, so the late copy lands in
    live memory, with the produced values."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import gc
    import weakref
    from ringcomm import quarantine

    def body(comm):
        held = quarantine.held_arrays()
        x, out = torch.zeros(1 << 18, device="cuda"), torch.full((1 << 18,), -1.0, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # (cycles: about a second at 1.5-2 GHz)
        x.fill_(5)
        gone = weakref.ref(out)
        with pytest.raises(ringcomm.CollectiveTimeout, match="sendrecv with itself"):
            comm.sendrecv(x, 0, out, 0)
        del x, out
        gc.collect()
        kept = gone()
        assert kept is not None, "out was let go while the copy was queued"
        assert quarantine.held_arrays() == held + 1, quarantine.held_arrays()
        torch.cuda.synchronize()
        return float(kept.min()), float(kept.max())
    assert on_gpu(1, body, timeout=0.2) == [(5.0, 5.0)]


@gpu
def test_synchronous_call_is_ordered_on_the_current_stream():
    cupy = pytest.importorskip("cupy")

    def body(comm):
        with cupy.cuda.Stream(non_blocking=True) as s:
            x = cupy.arange(4096, dtype=cupy.float64) * (comm.rank + 1)
            comm.all_reduce(x)
            z = x + 0  # queued after the collective on the same stream
            s.synchronize()
        return cupy.asnumpy(z)
    for z in on_gpu(4, body):
        assert np.array_equal(z, np.arange(4096) * 10.0)


@gpu
def test_torch_cuda_tensors_when_torch_has_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")

    def body(comm):
        x = torch.arange(1000, dtype=torch.bfloat16, device="cuda") * 0 + (comm.rank + 1)
        comm.all_reduce(x)
        rs = comm.reduce_scatter(torch.arange(12, dtype=torch.float32, device="cuda"))
        torch.cuda.current_stream().synchronize()
        return float(x.float().min()), float(x.float().max()), rs.device.type, rs.cpu().tolist()
    res = on_gpu(3, body)
    for r, (lo, hi, dev, rs) in enumerate(res):
        assert lo == hi == 6.0 and dev == "cuda"
        assert rs == [3.0 * v for v in range(12)][4 * r:4 * r + 4]


@gpu
def test_bad_device_input_is_rejected_before_any_byte_moves():
    cupy = pytest.importorskip("cupy")

    def body(comm):
        msgs = []
        before = comm.traffic()
        for call in (lambda: comm.all_reduce(np.ones(8, np.float32)),                               # host array
                     lambda: comm.all_reduce(cupy.ones(8, cupy.float32), out=np.ones(8, np.float32)),  # mixed
                     lambda: comm.all_reduce(cupy.ones((4, 4), cupy.float32)[:, 1]),                 # strided
                     lambda: comm.all_reduce(cupy.ones(8, cupy.complex64))):                          # dtype
            try:
                call()
                msgs.append(None)
            except InvalidArgument as e:
                msgs.append(str(e))
        moved = (comm.traffic() - before).bytes_sent()
        return msgs, moved, comm.device
    for msgs, moved, where in on_gpu(2, body):
        assert moved == 0
        assert "host memory" in msgs[0] and where in msgs[0]
        assert "host memory" in msgs[1]
        assert "contiguous" in msgs[2]
        assert "dtype" in msgs[3]


@gpu
def test_array_on_another_gpu_is_rejected():
    cupy = pytest.importorskip("cupy")
    if rcuda.device_count() < 2:
        pytest.skip("needs two GPUs")

    def body(comm):
        with cupy.cuda.Device(1 - int(comm.device.split(":")[1])):
            x = cupy.ones(8, cupy.float32)
        with pytest.raises(InvalidArgument, match="but this communicator is on"):
            comm.all_reduce(x)
        return True
    import ringcomm
    assert all(ringcomm.run_local(2, body, device=[0, 1]))


@gpu
def test_gpu_communicators_default_to_64_MiB_segments(monkeypatch):
    # config.DEFAULT_GPU_SEGMENT_BYTES: 4 MiB segments left an H200 ring 8.4x
    # its bytes-moved bound, host-bound (bench/gpu_ring.py); 64 MiB 1.6x.
    monkeypatch.delenv("RINGCOMM_SEGMENT_BYTES", raising=False)
    assert on_gpu(2, lambda c: c.segment_bytes) == [64 << 20] * 2


@gpu
def test_host_communicator_rejects_gpu_arrays():
    cupy = pytest.importorskip("cupy")
    import ringcomm

    def body(comm):
        with pytest.raises(InvalidArgument, match="moves host memory"):
            comm.all_reduce(cupy.ones(8, cupy.float32))
        return True
    assert all(ringcomm.run_local(2, body))


@gpu
def test_nccl_transport_runs_the_suite_with_one_rank_per_gpu():
    """NCCL point-to-point across processes, one GPU each (N = number of GPUs,
    at most 4; N = 1 on a single-GPU machine: the engine, the stream semantics
    and NCCL's initialisation, without payload messages)."""
    pytest.importorskip("cupy")
    import subprocess
    n = min(rcuda.device_count(), 4)
    script = os.path.join(os.path.dirname(__file__), "scripts", "nccl_suite.py")
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), sys.executable, script],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("OK") == n, res.stdout


@gpu
def test_cuda_dlpack_producers_are_accepted():
    """An array known only through DLPack (device type CUDA): read zero-copy,
    ordered through the stream it is asked to export for."""
    cupy = pytest.importorskip("cupy")

    class OnlyDLPack:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    def body(comm):
        x = cupy.arange(100, dtype=cupy.float32) + comm.rank
        comm.all_reduce(OnlyDLPack(x))
        cupy.cuda.Stream.null.synchronize()
        return cupy.asnumpy(x)
    for got in on_gpu(2, body):
        assert np.array_equal(got, 2 * np.arange(100, dtype=np.float32) + 1)

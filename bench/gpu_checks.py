"""The GPU checks that are not unit tests, one subcommand each (bench/gpu_check.sh
runs them all and tabulates them). Each prints its evidence, then one line
``FIGURE <text>`` and exits 0 when its goal is met, 1 when not, 2 when it
cannot run (no GPU, a missing package).

    python bench/gpu_checks.py kernels    # bit-equality with the host / cupy, every dtype and op,
                                          # offsets 1..15, more than 2^31 elements
    python bench/gpu_checks.py streams    # producer on a side stream (cupy, torch); scratch growth
                                          # queued behind a 0.5 s kernel must not block the host
    python bench/gpu_checks.py nccl       # under mpirun -n 1: NCCL end to end with one rank
    python bench/gpu_checks.py sanitize   # small awkward sizes, for compute-sanitizer (pool off)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

import ringcomm
import ringcomm.cuda as rcuda
from ringcomm.vocab import DTYPES, FLOATING, NUMPY, OPS, op_fits
from ringcomm._native import core


def need_gpu():
    if not rcuda.available():
        print(f"FIGURE cannot run: ringcomm._cuda is {rcuda.status()}")
        sys.exit(2)
    try:
        import cupy
    except ImportError:
        print("FIGURE cannot run: cupy is not installed")
        sys.exit(2)
    return cupy


class View:
    """A typed __cuda_array_interface__ at byte offset `off` of a raw cupy
    buffer (cupy has no bfloat16; offsets make misaligned starts)."""

    def __init__(self, raw, off: int, n: int, dtype: str):
        dt = NUMPY[dtype]
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": dt.str, "data": (raw.data.ptr + off, False),
                                         "version": 3, "strides": None}
        self.dtype = dt


def host_reduce(dtype, op, a, b):
    dst = np.empty_like(a)
    core.reduce(DTYPES[dtype], OPS[op], dst.ctypes.data, a.ctypes.data, b.ctypes.data, a.size)
    return dst


def kernels(args) -> int:
    cupy = need_gpu()
    rng = np.random.default_rng(0)
    cases, bad = 0, []
    for dtype in DTYPES:
        es = NUMPY[dtype].itemsize
        for op in OPS:
            if not op_fits(dtype, op):
                continue
            for n in (1, 7, 33, 4099, (1 << 20) + 3):
                shifts = [(0, 0, 0)]
                if n in (7, 33, 4099):  # offsets 1..15 elements, shared, and disagreeing between dst, a, b
                    shifts += [(k, k, k) for k in range(1, 16)] + [(1, 2, 3), (3, 0, 5), (0, 7, 2)]
                for sd, sa, sb in shifts:
                    if dtype in FLOATING:
                        a = (rng.standard_normal(n) * 100).astype(NUMPY[dtype])
                        b = (rng.standard_normal(n) * 100).astype(NUMPY[dtype])
                    elif NUMPY[dtype] == np.bool_:
                        a = rng.integers(0, 2, n).astype(np.bool_)
                        b = rng.integers(0, 2, n).astype(np.bool_)
                    else:  # dtype=: uint64's top half is out of int64's range
                        info = np.iinfo(NUMPY[dtype])
                        a = rng.integers(info.min, info.max, n, endpoint=True, dtype=NUMPY[dtype])
                        b = rng.integers(info.min, info.max, n, endpoint=True, dtype=NUMPY[dtype])
                    raw = [cupy.zeros((n + 16) * es, cupy.uint8) for _ in range(3)]
                    raw[1][sa * es:(sa + n) * es] = cupy.asarray(a.view(np.uint8))
                    raw[2][sb * es:(sb + n) * es] = cupy.asarray(b.view(np.uint8))
                    d = View(raw[0], sd * es, n, dtype)
                    rcuda.reduce(d, View(raw[1], sa * es, n, dtype), View(raw[2], sb * es, n, dtype), op)
                    if op == "avg":
                        rcuda.finalize(d, op, 3)
                    got = cupy.asnumpy(raw[0][sd * es:(sd + n) * es]).view(NUMPY[dtype])
                    want = host_reduce(dtype, op, a, b)
                    if op == "avg":
                        core.finalize(DTYPES[dtype], OPS[op], want.ctypes.data, n, 3)
                    cases += 1
                    if got.view(np.uint8).tobytes() != want.view(np.uint8).tobytes():
                        bad.append(f"{dtype} {op} n={n} offsets={sd, sa, sb}")
    print(f"{cases} kernel cases against the host reducer: {len(bad)} differ")
    for line in bad[:20]:
        print("  DIFFERS:", line)
    # More than 2^31 elements: 64-bit indexing in every kernel path (cupy as the reference).
    big = []
    for dtype, op, ref in (("uint8", "sum", lambda a, b: a + b), ("float32", "max", cupy.maximum)):
        n = (1 << 31) + 5
        a = (cupy.arange(n, dtype=cupy.int64) % 251).astype(NUMPY[dtype])
        b = ((cupy.arange(n, dtype=cupy.int64) * 7) % 241).astype(NUMPY[dtype])
        d = cupy.empty_like(a)
        t0 = time.perf_counter()
        rcuda.reduce(d, a, b, op)
        cupy.cuda.get_current_stream().synchronize()
        dt = time.perf_counter() - t0
        ok = bool(cupy.array_equal(d, ref(a, b)))
        big.append(ok)
        print(f"{dtype} {op} over {n} elements ({3 * n * a.itemsize / 2**30:.1f} GiB moved): "
              f"{'equal' if ok else 'DIFFERENT'} to cupy, {dt * 1e3:.1f} ms")
        del a, b, d
        cupy.get_default_memory_pool().free_all_blocks()
    good = not bad and all(big)
    print(f"FIGURE {cases - len(bad)}/{cases} cases bit-identical incl. offsets 1..15; "
          f"2^31+5 elements: {'ok' if all(big) else 'WRONG'}")
    return 0 if good else 1


SPIN = r'''
extern "C" __global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
}
'''


def streams(args) -> int:
    cupy = need_gpu()
    results = []
    spin = cupy.RawKernel(SPIN, "spin")
    half_second = int(cupy.cuda.Device().attributes["ClockRate"]) * 500  # ClockRate is in kHz

    # (a) cupy: producer kernel on a side stream, then the collective on that stream.
    def producer_cupy(comm):
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            x = cupy.zeros(1 << 20, cupy.float32)
            spin((1,), (1,), (cupy.int64(half_second // 5),))
            x += comm.rank + 1  # queued behind the spin: the collective must wait for it
            comm.all_reduce(x)
            y = x * 1
            s.synchronize()
        return float(y.min()), float(y.max())
    n = 3
    res = ringcomm.run_local(n, producer_cupy, device="cuda")
    ok_a = all(lo == hi == n * (n + 1) // 2 for lo, hi in res)
    results.append(("cupy producer on a side stream", ok_a, ""))

    # (b) torch: the same with torch's side stream and torch.cuda._sleep.
    try:
        import torch
        if torch.cuda.is_available():
            def producer_torch(comm):
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    x = torch.zeros(1 << 20, device="cuda")
                    torch.cuda._sleep(half_second // 5)
                    x += comm.rank + 1
                    comm.all_reduce(x)
                    y = x.clone()
                s.synchronize()
                return float(y.min()), float(y.max())
            res = ringcomm.run_local(n, producer_torch, device="cuda")
            results.append(("torch producer on a side stream", all(lo == hi == 6.0 for lo, hi in res), ""))
        else:
            results.append(("torch producer on a side stream", None, "torch without CUDA"))
    except ImportError:
        results.append(("torch producer on a side stream", None, "no torch"))

    # (c) scratch growth behind an unrelated 0.5 s kernel: the host must not wait for it.
    gate = threading.Barrier(2)
    host_ms = [0.0, 0.0]

    def growth(comm):
        x = cupy.ones(1 << 10, cupy.float32)
        comm.reduce_scatter(x)  # scratch exists now (small)
        cupy.cuda.get_current_stream().synchronize()
        other = cupy.cuda.Stream(non_blocking=True)
        gate.wait()
        with other:
            spin((1,), (1,), (cupy.int64(half_second),))  # unrelated work, 0.5 s
        big = cupy.ones(1 << 26, cupy.float32)  # 256 MiB: the scratch must grow
        t0 = time.perf_counter()
        out = comm.reduce_scatter(big)  # enqueued, returns once queued
        host_ms[comm.rank] = (time.perf_counter() - t0) * 1e3
        cupy.cuda.get_current_stream().synchronize()
        other.synchronize()
        return float(out.min()) == float(out.max()) == 2.0
    ok = ringcomm.run_local(2, growth, device="cuda")
    worst = max(host_ms)
    results.append(("scratch growth behind a 0.5 s kernel", all(ok) and worst < 200,
                    f"host blocked {worst:.1f} ms"))

    for name, ok, note in results:
        print(f"{name}: {'ok' if ok else ('skipped' if ok is None else 'FAILED')} {note}")
    passed = all(ok is not False for _, ok, _ in results)
    print(f"FIGURE producers ordered ({sum(1 for _, o, _ in results[:2] if o)}/2 libraries); "
          f"scratch growth blocked the host {worst:.1f} ms (goal < 200 ms, the kernel ran 500 ms)")
    return 0 if passed else 1


def nccl(args) -> int:
    cupy = need_gpu()
    from mpi4py import MPI
    t0 = time.perf_counter()
    comm = ringcomm.init(device="cuda", timeout=60)
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    comm.all_reduce(x)
    rs = comm.reduce_scatter(cupy.arange(1000, dtype=cupy.float64))
    ag = comm.all_gather(cupy.arange(10, dtype=cupy.int32))
    cupy.cuda.get_current_stream().synchronize()
    ok = bool((x == cupy.arange(1 << 20, dtype=cupy.float32)).all()) and int(rs.size) == 1000 and int(ag.size) == 10
    gpu = int(comm.device.split(":")[1])
    base = rcuda._cuda.NcclBaseline(MPI._handleof(MPI.COMM_WORLD), gpu)
    y = cupy.arange(1 << 20, dtype=cupy.float32)
    out = cupy.empty_like(y)
    base.all_reduce(y.data.ptr, out.data.ptr, y.size, DTYPES["float32"], OPS["sum"],
                    cupy.cuda.get_current_stream().ptr)
    cupy.cuda.get_current_stream().synchronize()
    ok = ok and bool((out == y).all())
    base.close()
    comm.close()
    dt = time.perf_counter() - t0
    print(f"NCCL {rcuda._cuda.nccl_version()}: unique id over MPI, ringcomm's collectives over the NCCL transport, "
          f"NCCL's own all_reduce, teardown: {'ok' if ok else 'WRONG'}")
    print(f"FIGURE one rank end to end in {dt:.1f} s, results {'exact' if ok else 'WRONG'}")
    return 0 if ok else 1


def nccl_store(args) -> int:
    """The device path without MPI: a store launch (init(store=...)), NCCL's
    unique id through the store, control messages over UCX."""
    cupy = need_gpu()
    import tempfile

    import torch.distributed as dist
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        comm = ringcomm.init(store=dist.FileStore(os.path.join(d, "store"), 1), rank=0, size=1, device="cuda",
                             timeout=60)
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        comm.all_reduce(x)
        rs = comm.reduce_scatter(cupy.arange(1000, dtype=cupy.float64))
        ag = comm.all_gather(cupy.arange(10, dtype=cupy.int32))
        cupy.cuda.get_current_stream().synchronize()
        ok = bool((x == cupy.arange(1 << 20, dtype=cupy.float32)).all()) and int(rs.size) == 1000 and \
            int(ag.size) == 10 and "mpi4py.MPI" not in sys.modules
        what = comm.transport
        comm.close()
    print(f"store launch on {what}: unique id through a FileStore, control over UCX, no MPI: "
          f"{'ok' if ok else 'WRONG'}")
    print(f"FIGURE one rank end to end in {time.perf_counter() - t0:.1f} s, results {'exact' if ok else 'WRONG'}")
    return 0 if ok else 1


def sanitize(args) -> int:
    cupy = need_gpu()
    cupy.cuda.set_allocator(None)  # every array its own cudaMalloc: bounds the sanitizer can see
    bad = []

    def body(comm):
        n = comm.size
        for count in (1, 7, 33, 4099):
            for dtype in ("float32", "float16", "int8", "float64"):
                dt = NUMPY[dtype]
                base = (np.arange(count) % 13).astype(dt)
                x = cupy.asarray(base * (comm.rank + 1))
                comm.all_reduce(x)
                rs = comm.reduce_scatter(cupy.asarray(base))
                mine = np.array_split(base, n)[comm.rank]
                ag = comm.all_gather(cupy.asarray(mine), out=cupy.empty(count, dt))
                b = cupy.asarray(base) if comm.rank == 1 % n else cupy.zeros(count, dt)
                comm.broadcast(b, root=1 % n)
                cupy.cuda.get_current_stream().synchronize()
                for what, got, want in (("all_reduce", x, base * (n * (n + 1) // 2)),
                                        ("reduce_scatter", rs, np.array_split(base * n, n)[comm.rank]),
                                        ("all_gather", ag, base), ("broadcast", b, base)):
                    if not np.array_equal(cupy.asnumpy(got), want.astype(dt)):
                        bad.append(f"rank {comm.rank}: {what} {dtype} count={count}")
        return True
    ringcomm.run_local(3, body, device="cuda", segment_bytes=64)
    print(f"FIGURE 3 ranks x 4 sizes x 4 dtypes x 4 collectives with 64-byte segments: "
          f"{len(bad)} wrong results (memory errors: see compute-sanitizer's summary)")
    for line in bad[:10]:
        print("  WRONG:", line)
    return 0 if not bad else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["kernels", "streams", "nccl", "nccl_store", "sanitize"])
    args = ap.parse_args()
    return {"kernels": kernels, "streams": streams, "nccl": nccl, "nccl_store": nccl_store,
            "sanitize": sanitize}[args.check](args)


if __name__ == "__main__":
    sys.exit(main())

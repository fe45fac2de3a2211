"""Collective benchmark in the spirit of nccl-tests: ringcomm against Open MPI and Gloo.

Run under MPI (``mpirun -n 4 python bench/collectives.py ...``) or let
``ringcomm bench [-n N] ...`` launch the ranks. Every implementation works on
the same numpy buffers in the same run; repetitions are interleaved across
implementations (round-robin, rotating the order) because shared machines
drift; the time of one repetition is the maximum over ranks; the table shows
the median and the 10th/90th percentiles over repetitions.

Correctness is checked outside the timed loop on exactly predictable data:
``#wrong`` is the exact number of wrong elements over all ranks, and any
wrong element makes the exit status non-zero.

An implementation is a class with ``supports`` and ``run`` (see ``Impl``);
``IMPLS`` maps names to them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from . import _dtypes, costmodel
from .config import parse_size

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
OPS = ("sum", "prod", "min", "max", "avg")
# Open MPI (coll/tuned) parameters that force its ring algorithm per collective.
RING_MCA = {"all_reduce": ("coll_tuned_allreduce_algorithm", "4"),
            "reduce_scatter": ("coll_tuned_reduce_scatter_algorithm", "3"),
            "all_gather": ("coll_tuned_allgather_algorithm", "4")}


# ---------------------------------------------------------------------------
# pure helpers (unit-tested in tests/test_bench.py)

def size_list(begin: int, end: int, factor: float) -> list[int]:
    """Sizes in bytes from begin to end (inclusive), multiplying by factor."""
    if begin <= 0 or end < begin or factor <= 1:
        raise ValueError(f"bad size range: -b {begin} -e {end} -f {factor} (need 0 < b <= e, f > 1)")
    out, s = [], begin
    while s <= end:
        out.append(int(s))
        s *= factor
    return out


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests busbw = algbw * factor: 2(n-1)/n for all_reduce, (n-1)/n for RS and AG."""
    return costmodel.volume_factor(collective, n)


def count_for(nbytes: int, dtype: str, n: int) -> int:
    """Element count of the full buffer: nbytes in whole elements, at least one
    (ranks beyond the count get empty chunks, as the split rule says)."""
    return max(1, nbytes // _dtypes.itemsize(dtype))


def check_data(dtype: str, op: str, rank: int, count: int) -> np.ndarray:
    """Exactly predictable input of `rank`: partial results are exact in every dtype."""
    i = np.arange(count, dtype=np.int64)
    if op in ("sum", "avg"):
        v = (rank + 1) * (i % 5 + 1) % 9
    elif op == "prod":
        v = np.where((i + rank) % 3 == 0, 2, 1)
    else:
        v = (rank * 3 + i) % 7
    return v.astype(_dtypes.NUMPY[dtype])


def check_expected(dtype: str, op: str, n: int, count: int) -> np.ndarray:
    x = np.stack([check_data(dtype, op, r, count).astype(np.float64) for r in range(n)])
    red = {"sum": x.sum(0), "avg": x.sum(0), "prod": x.prod(0), "min": x.min(0), "max": x.max(0)}[op]
    out = red.astype(_dtypes.NUMPY[dtype])
    if op == "avg":
        compute = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else _dtypes.NUMPY[dtype]
        out = (out.astype(compute) / compute.type(n)).astype(_dtypes.NUMPY[dtype])
    return out


def split(count: int, n: int, r: int) -> tuple[int, int]:
    """(offset, length) of chunk r under the split rule."""
    base, extra = divmod(count, n)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def summarize(samples) -> dict:
    s = np.asarray(samples, dtype=float)
    return {"median": float(np.median(s)), "p10": float(np.percentile(s, 10)),
            "p90": float(np.percentile(s, 90)), "reps": int(s.size)}


ROW_KEYS = ("collective", "impl", "size", "count", "dtype", "op", "inplace", "time_us", "p10_us", "p90_us",
            "algbw_gbps", "busbw_gbps", "pct_memcpy", "wrong", "sent_per_rank", "expected_sent")


def validate_json(doc: dict) -> None:
    """Raise ValueError unless `doc` has the schema --json writes."""
    for key in ("version", "machine", "args", "memcpy_gbps", "rows", "models"):
        if key not in doc:
            raise ValueError(f"missing key {key!r}")
    for row in doc["rows"]:
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"row misses {missing}")


# ---------------------------------------------------------------------------
# implementations

@dataclass
class Case:
    collective: str
    count: int       # elements of the full buffer
    dtype: str
    op: str
    inplace: bool
    n: int
    rank: int
    send: np.ndarray = field(repr=False, default=None)
    recv: np.ndarray = field(repr=False, default=None)

    @property
    def chunk(self) -> tuple[int, int]:
        return split(self.count, self.n, self.rank)

    def input_view(self) -> np.ndarray:
        """What the rank contributes (inside recv for in-place, as nccl-tests does)."""
        off, ln = self.chunk
        if self.collective == "all_reduce":
            return self.recv if self.inplace else self.send
        if self.collective == "reduce_scatter":
            return self.send
        return self.recv[off:off + ln] if self.inplace else self.send

    def output_view(self) -> np.ndarray:
        if self.collective == "reduce_scatter" and self.inplace:
            off, ln = self.chunk
            return self.send[off:off + ln]
        return self.recv


class Impl:
    name = "?"

    def supports(self, case: Case) -> bool:
        return True

    def run(self, case: Case) -> None:
        raise NotImplementedError

    def output_view(self, case: Case) -> np.ndarray:
        """Where this implementation leaves the result (nccl-tests' convention by default)."""
        return case.output_view()

    def close(self) -> None:
        pass


class RingcommImpl(Impl):
    name = "ringcomm"

    def __init__(self, ctx):
        import ringcomm
        self.comm = ringcomm.init(device=None if ctx.device == "host" else "cuda")

    def run(self, c: Case) -> None:
        if c.collective == "all_reduce":
            if c.inplace:
                self.comm.all_reduce(c.recv, c.op)
            else:
                self.comm.all_reduce(c.send, c.op, out=c.recv)
        elif c.collective == "reduce_scatter":
            self.comm.reduce_scatter(c.send, c.op, out=c.output_view())
        else:
            self.comm.all_gather(c.input_view(), out=c.recv)

    def sent_bytes(self, c: Case) -> int:
        before = self.comm.traffic()
        self.run(c)
        return (self.comm.traffic() - before).bytes_sent(c.collective)

    def close(self) -> None:
        self.comm.close()


class MpiImpl(Impl):
    """Open MPI's own collectives through mpi4py (its default algorithm choice;
    launched with coll_tuned ring parameters for 'mpi-ring')."""
    name = "mpi"
    _OPS = None

    def __init__(self, ctx):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self._OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def supports(self, c: Case) -> bool:
        # MPI has no half types or average; Reduce_scatter_block needs equal chunks.
        if c.dtype in ("float16", "bfloat16") or c.op == "avg":
            return False
        return c.collective == "all_reduce" or c.count % c.n == 0

    def run(self, c: Case) -> None:
        MPI, op = self.MPI, self._OPS.get(c.op)
        if c.collective == "all_reduce":
            self.comm.Allreduce(MPI.IN_PLACE if c.inplace else c.send, c.recv, op=op)
        elif c.collective == "reduce_scatter":
            if c.inplace:
                self.comm.Reduce_scatter_block(MPI.IN_PLACE, c.send, op=op)
            else:
                self.comm.Reduce_scatter_block(c.send, c.recv, op=op)
        else:
            self.comm.Allgather(MPI.IN_PLACE if c.inplace else c.send, c.recv)

    def output_view(self, c: Case) -> np.ndarray:
        if c.collective == "reduce_scatter" and c.inplace:  # MPI_IN_PLACE: result at the buffer's start
            return c.send[:c.chunk[1]]
        return c.output_view()

    def close(self) -> None:
        self.comm.Free()


class MpiRingImpl(MpiImpl):
    """Launched with RING_MCA. Reduce-scatter goes through MPI_Reduce_scatter
    (per-rank counts): Open MPI has a ring for it, not for the _block variant."""
    name = "mpi-ring"

    def supports(self, c: Case) -> bool:
        return c.dtype not in ("float16", "bfloat16") and c.op != "avg"

    def run(self, c: Case) -> None:
        if c.collective != "reduce_scatter":
            return super().run(c)
        counts = [split(c.count, c.n, r)[1] for r in range(c.n)]
        if c.inplace:
            self.comm.Reduce_scatter(self.MPI.IN_PLACE, c.send, counts, op=self._OPS[c.op])
        else:
            self.comm.Reduce_scatter(c.send, c.recv, counts, op=self._OPS[c.op])


class GlooImpl(Impl):
    """torch.distributed with the gloo backend, on tensors sharing the numpy buffers."""
    name = "gloo"

    def __init__(self, ctx):
        import torch
        import torch.distributed as dist
        from mpi4py import MPI
        self.torch, self.dist = torch, dist
        w = MPI.COMM_WORLD
        port = w.bcast(_free_port() if w.rank == 0 else None)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w.rank, world_size=w.size)
        self._OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                     "max": dist.ReduceOp.MAX}
        self._rs_ok = None

    def supports(self, c: Case) -> bool:
        if c.op == "avg" or c.dtype == "bfloat16" and c.collective != "all_gather":
            return False
        if c.collective == "reduce_scatter":
            return False  # torch's gloo backend has no reduce_scatter
        return c.collective == "all_reduce" or c.count % c.n == 0

    def _t(self, a):
        if a.dtype == _dtypes.NUMPY["bfloat16"]:
            return self.torch.from_numpy(a.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(a)

    def run(self, c: Case) -> None:
        if c.collective == "all_reduce":
            if c.inplace:
                self.dist.all_reduce(self._t(c.recv), op=self._OPS[c.op])
            else:  # gloo reduces in place: copy in first, as a user would
                np.copyto(c.recv, c.send)
                self.dist.all_reduce(self._t(c.recv), op=self._OPS[c.op])
        else:
            self.dist.all_gather_into_tensor(self._t(c.recv), self._t(c.input_view()))

    def close(self) -> None:
        self.dist.destroy_process_group()


class NcclImpl(Impl):
    """NCCL's own ncclAllReduce / ncclReduceScatter / ncclAllGather (--device
    cuda), on a NCCL communicator of its own, on the same cupy buffers."""
    name = "nccl"

    def __init__(self, ctx):
        from mpi4py import MPI

        from . import cuda
        from .comm import _local_rank
        cuda.require()
        w = MPI.COMM_WORLD
        self.gpu = _local_rank(w)
        self.base = cuda._cuda.NcclBaseline(MPI._handleof(w), self.gpu)

    def supports(self, c: Case) -> bool:
        # NCCL's reduce-scatter and all-gather take equal chunks only.
        return c.collective == "all_reduce" or c.count % c.n == 0

    def run(self, c: Case) -> None:
        import cupy
        stream = cupy.cuda.get_current_stream().ptr
        dt, op = _dtypes.DTYPES[c.dtype], _dtypes.OPS[c.op]
        if c.collective == "all_reduce":
            src = c.recv if c.inplace else c.send
            self.base.all_reduce(src.data.ptr, c.recv.data.ptr, c.count, dt, op, stream)
        elif c.collective == "reduce_scatter":
            out = self.output_view(c)
            self.base.reduce_scatter(c.send.data.ptr, out.data.ptr, c.count // c.n, dt, op, stream)
        else:
            self.base.all_gather(c.input_view().data.ptr, c.recv.data.ptr, c.count // c.n, dt, stream)

    def close(self) -> None:
        self.base.close()


class CorruptImpl(RingcommImpl):
    """Test-only: ringcomm with one wrong element on rank 0 (checks that #wrong
    is counted and fails the run). Enabled by RINGCOMM_BENCH_TEST_IMPLS=1."""
    name = "corrupt"

    def run(self, c: Case) -> None:
        super().run(c)
        out = c.output_view()
        if self.comm.rank == 0 and out.size:
            out[0] = out[0] + np.ones(1, out.dtype)[0]


IMPLS = {"ringcomm": RingcommImpl, "mpi": MpiImpl, "mpi-ring": MpiRingImpl, "gloo": GlooImpl, "nccl": NcclImpl}
DEVICE_IMPLS = {"host": ("ringcomm", "mpi", "mpi-ring", "gloo", "corrupt"), "cuda": ("ringcomm", "nccl")}
if os.environ.get("RINGCOMM_BENCH_TEST_IMPLS") == "1":
    IMPLS["corrupt"] = CorruptImpl


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_available() -> bool:
    try:
        import torch.distributed  # noqa: F401
        return True
    except ImportError:
        return False


# ---------------------------------------------------------------------------
# measurement (runs on every rank)

def memcpy_gbps(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """Single-core copy bandwidth: bytes copied per second (best of reps)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timeit(lambda: np.copyto(dst, src)) for _ in range(reps))
    return nbytes / best / 1e9


def device_copy_gbps(nbytes: int = 256 << 20, reps: int = 10) -> float:
    """Device-to-device copy bandwidth on the current GPU: bytes copied per
    second (best of reps, timed with CUDA events)."""
    import cupy
    src = cupy.ones(nbytes, cupy.uint8)
    dst = cupy.empty_like(src)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    best = float("inf")
    for _ in range(reps):
        start.record()
        cupy.copyto(dst, src)
        end.record()
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return nbytes / best / 1e9


def _timeit(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Bench:
    def __init__(self, args, comm):
        self.args, self.w = args, comm
        self.n, self.rank = comm.size, comm.rank
        self.device = args.device
        if self.device == "cuda":  # buffers on this rank's GPU; timings end with a stream sync
            import cupy

            from .comm import _local_rank
            self.xp = cupy
            local, ngpu = _local_rank(comm), cupy.cuda.runtime.getDeviceCount()
            if local >= ngpu:
                raise SystemExit(f"ringcomm bench: --device cuda needs one GPU per rank; node rank {local} "
                                 f"but {ngpu} GPU(s)")
            cupy.cuda.Device(local).use()
        else:
            self.xp = np
        self.impls = []
        for name in args.impl:
            if name == "gloo" and not torch_available():
                if self.rank == 0:
                    print("# gloo: torch is not installed (pip install 'ringcomm[torch]'); skipped", flush=True)
                continue
            self.impls.append(IMPLS[name](self))
        self.rows: list[dict] = []
        self.total_wrong = 0

    def alloc(self, coll, count, dtype, op, inplace) -> Case:
        c = Case(coll, count, dtype, op, inplace, self.n, self.rank)
        dt = _dtypes.NUMPY[dtype]
        off, ln = c.chunk
        xp = self.xp
        if coll == "all_reduce":
            c.send, c.recv = xp.empty(count, dt), xp.empty(count, dt)
        elif coll == "reduce_scatter":
            c.send, c.recv = xp.empty(count, dt), xp.empty(ln, dt)
        else:
            c.send, c.recv = xp.empty(ln, dt), xp.empty(count, dt)
        c.send[...] = 0
        c.recv[...] = 0
        return c

    def fill(self, c: Case, impl: Impl):
        """Reset buffers to the check data (also before timing: same data every run)."""
        data = self.xp.asarray(check_data(c.dtype, c.op, self.rank, c.count))
        off, ln = c.chunk
        if c.collective == "all_gather":
            c.input_view()[...] = data[off:off + ln]
        elif c.collective == "all_reduce" and c.inplace:
            c.recv[...] = data
        else:
            c.send[...] = data

    def count_wrong(self, c: Case, impl: Impl) -> int:
        off, ln = c.chunk
        if c.collective == "all_gather":
            want = np.concatenate([check_data(c.dtype, c.op, q, c.count)[slice(*_span(c.count, self.n, q))]
                                   for q in range(self.n)])
            got = c.recv
        else:
            want = check_expected(c.dtype, c.op, self.n, c.count)
            got = impl.output_view(c)
            if c.collective == "reduce_scatter":
                want = want[off:off + ln]
        got = self.host(got)
        g = got.astype(np.float64) if got.dtype == _dtypes.NUMPY["bfloat16"] else got
        w = want.astype(np.float64) if want.dtype == _dtypes.NUMPY["bfloat16"] else want
        return int(np.count_nonzero(g != w))

    def host(self, a) -> np.ndarray:
        return a if self.xp is np else self.xp.asnumpy(a)

    def sync(self) -> None:
        """Wait for the GPU work queued so far on the current stream (--device cuda)."""
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def measure(self, coll, nbytes, dtype, op):
        count = count_for(nbytes, dtype, self.n)
        results = {}
        for inplace in (False, True):
            cases = {}
            for impl in self.impls:
                c = self.alloc(coll, count, dtype, op, inplace)
                if not impl.supports(c):
                    continue
                # correctness, outside the timed loop
                self.fill(c, impl)
                impl.run(c)
                wrong = self.w.allreduce(self.count_wrong(c, impl))
                sent = expected = None
                if isinstance(impl, RingcommImpl):
                    from .traffic import expected as exp
                    self.fill(c, impl)
                    sent = self.w.allreduce(impl.sent_bytes(c), op=_mpi_max())
                    expected = max(exp(coll, count, dtype, self.n, r).bytes_sent for r in range(self.n))
                cases[impl.name] = (impl, c, wrong, sent, expected)
            # warm-up and iteration count (from the slowest implementation)
            est = 0.0
            for impl, c, *_ in cases.values():
                for _ in range(self.args.warmup):
                    impl.run(c)
                self.sync()
                est = max(est, self.w.allreduce(_timeit(lambda impl=impl, c=c: (impl.run(c), self.sync())),
                                                op=_mpi_max()))
            iters = self.args.iters or max(1, min(1000, int(self.args.target_ms * 1e-3 / max(est, 1e-7))))
            samples = {name: [] for name in cases}
            names = list(cases)
            for rep in range(self.args.reps):
                order = names[rep % len(names):] + names[:rep % len(names)] if names else []
                for name in order:
                    impl, c = cases[name][0], cases[name][1]
                    self.w.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        impl.run(c)
                    self.sync()
                    t = (time.perf_counter() - t0) / iters
                    samples[name].append(self.w.allreduce(t, op=_mpi_max()))
            for name, (_, _, wrong, sent, expected) in cases.items():
                s = summarize(samples[name])
                results[(name, inplace)] = dict(s, wrong=wrong, sent=sent, expected=expected, iters=iters)
        return count, results


def _span(count, n, q):
    off, ln = split(count, n, q)
    return off, off + ln


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX


# ---------------------------------------------------------------------------
# reporting (rank 0)

def fmt_size(b: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return str(b)


def make_rows(coll, nbytes, count, dtype, op, results, n, memcpy) -> list[dict]:
    rows = []
    full = count * _dtypes.itemsize(dtype)
    for (name, inplace), r in results.items():
        t = r["median"]
        algbw = full / t / 1e9
        busbw = algbw * bus_factor(coll, n)
        rows.append({"collective": coll, "impl": name, "size": full, "count": count, "dtype": dtype, "op": op,
                     "inplace": inplace, "time_us": t * 1e6, "p10_us": r["p10"] * 1e6, "p90_us": r["p90"] * 1e6,
                     "iters": r["iters"], "reps": r["reps"], "algbw_gbps": algbw, "busbw_gbps": busbw,
                     "pct_memcpy": 100 * busbw / memcpy if memcpy else None, "wrong": r["wrong"],
                     "sent_per_rank": r["sent"], "expected_sent": r["expected"]})
    return rows


HEADER = (f"{'size':>9} {'count':>10} {'type':>8} {'redop':>5} {'impl':>9}  "
          f"{'time(us)':>10} {'p10':>9} {'p90':>9} {'algbw':>7} {'busbw':>7} {'%cpy':>5} {'#wrong':>6}  "
          f"{'time(us)':>10} {'busbw':>7} {'#wrong':>6}  {'sent/rank':>11} {'expected':>11}")


def print_size_block(rows: list[dict], out=sys.stdout) -> None:
    by_impl: dict = {}
    for r in rows:
        by_impl.setdefault(r["impl"], {})[r["inplace"]] = r
    for name, modes in by_impl.items():
        o, i = modes.get(False), modes.get(True)
        base = o or i
        line = (f"{fmt_size(base['size']):>9} {base['count']:>10} {base['dtype']:>8} {base['op']:>5} {name:>9}  ")
        if o:
            pct = f"{o['pct_memcpy']:5.0f}" if o["pct_memcpy"] is not None else "    -"
            line += (f"{o['time_us']:10.1f} {o['p10_us']:9.1f} {o['p90_us']:9.1f} {o['algbw_gbps']:7.2f} "
                     f"{o['busbw_gbps']:7.2f} {pct} {o['wrong']:6d}  ")
        else:
            line += f"{'n/a':>10} {'':>9} {'':>9} {'':>7} {'':>7} {'':>5} {'':>6}  "
        if i:
            line += f"{i['time_us']:10.1f} {i['busbw_gbps']:7.2f} {i['wrong']:6d}  "
        else:
            line += f"{'n/a':>10} {'':>7} {'':>6}  "
        if base.get("sent_per_rank") is not None:
            line += f"{base['sent_per_rank']:>11} {base['expected_sent']:>11}"
        print(line, file=out, flush=True)


def footer(rows: list[dict], n: int, lines: list[str]) -> dict:
    """Average busbw per (collective, impl) and ringcomm's ratio to each baseline."""
    summary = {}
    for coll in COLLECTIVES:
        sel = [r for r in rows if r["collective"] == coll and not r["inplace"]]
        if not sel:
            continue
        impls = sorted({r["impl"] for r in sel}, key=lambda x: (x != "ringcomm", x))
        avg = {m: float(np.mean([r["busbw_gbps"] for r in sel if r["impl"] == m])) for m in impls}
        lines.append(f"# {coll}: average busbw (out-of-place, all sizes): "
                     + ", ".join(f"{m} {v:.2f} GB/s" for m, v in avg.items()))
        ratios = {}
        for m in impls:
            if m == "ringcomm":
                continue
            # ratio over the sizes both ran, per size then geometric mean
            per = []
            for r in sel:
                if r["impl"] != "ringcomm":
                    continue
                other = [o for o in sel if o["impl"] == m and o["size"] == r["size"] and o["dtype"] == r["dtype"]
                         and o["op"] == r["op"]]
                if other:
                    per.append(r["busbw_gbps"] / other[0]["busbw_gbps"])
            if per:
                ratios[m] = float(np.exp(np.mean(np.log(per))))
        if ratios:
            lines.append(f"# {coll}: ringcomm busbw / baseline (geometric mean over sizes): "
                         + ", ".join(f"vs {m} {v:.2f}x" for m, v in ratios.items()))
        summary[coll] = {"avg_busbw": avg, "ratio": ratios}
    return summary


def fit_models(rows: list[dict], n: int, lines: list[str]) -> dict:
    models = {}
    for coll in COLLECTIVES:
        sel = sorted((r for r in rows if r["collective"] == coll and r["impl"] == "ringcomm" and not r["inplace"]),
                     key=lambda r: r["size"])
        if len(sel) < 2 or n == 1:
            continue
        sizes = np.array([r["size"] for r in sel], float)
        times = np.array([r["time_us"] * 1e-6 for r in sel])
        m = costmodel.fit(coll, n, sizes, times)
        cross = costmodel.crossover_bytes(m, coll, n)
        models[coll] = {"alpha_us": m.alpha * 1e6, "beta_ns_per_byte": m.beta * 1e9,
                        "bandwidth_gbps": m.bandwidth / 1e9, "crossover_bytes": cross}
        lines.append(f"# model {coll}: alpha = {m.alpha * 1e6:.2f} us/step, beta = {m.beta * 1e9:.4f} ns/B "
                     f"({m.bandwidth / 1e9:.2f} GB/s); latency = bandwidth term at {cross / 1024:.1f} KiB")
        lines.append(f"#   {'size':>9} {'measured(us)':>13} {'model(us)':>10} {'ratio':>6}")
        for r, p in zip(sel, m.predict(coll, n, sizes)):
            lines.append(f"#   {fmt_size(r['size']):>9} {r['time_us']:13.1f} {p * 1e6:10.1f} {r['time_us'] / (p * 1e6):6.2f}")
        for r, p in zip(sel, m.predict(coll, n, sizes)):
            r["model_us"] = float(p * 1e6)
    return models


def plot(rows: list[dict], n: int, path: str, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    colls = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
    fig, axes = plt.subplots(1, len(colls), figsize=(6 * len(colls), 4.5), squeeze=False)
    for ax, coll in zip(axes[0], colls):
        sel = [r for r in rows if r["collective"] == coll and not r["inplace"]]
        for impl in sorted({r["impl"] for r in sel}, key=lambda x: (x != "ringcomm", x)):
            pts = sorted((r["size"], r["busbw_gbps"]) for r in sel if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        mod = sorted((r["size"], r["size"] / (r["model_us"] * 1e-6) / 1e9 * bus_factor(coll, n))
                     for r in sel if r["impl"] == "ringcomm" and "model_us" in r)
        if mod:
            ax.plot([p[0] for p in mod], [p[1] for p in mod], "k--", label="ringcomm alpha-beta model")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("buffer size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{coll}, n={n}")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------
# entry points

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringcomm bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", default="4", help="smallest buffer (K/M/G suffixes; default 4)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest buffer (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier (default 4)")
    p.add_argument("-n", "--iters", type=int, default=0,
                   help="timed iterations per repetition (default 0: enough for ~--target-ms)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="warm-up iterations (default 2)")
    p.add_argument("-r", "--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--target-ms", type=float, default=20, help="time per repetition when -n 0 (default 20)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1), help="check results (default 1)")
    p.add_argument("-o", "--op", default="sum", help="sum, prod, min, max, avg or all (default sum)")
    p.add_argument("-d", "--datatype", default="float32", help=f"one of {', '.join(_dtypes.DTYPES)} or all")
    p.add_argument("--collective", default="all_reduce", help="all_reduce, reduce_scatter, all_gather or all")
    p.add_argument("--impl", default=None,
                   help="comma-separated implementations (default: ringcomm,mpi,mpi-ring,gloo on the host, "
                        "ringcomm,nccl with --device cuda)")
    p.add_argument("--device", default="host", choices=("host", "cuda"),
                   help="host: numpy buffers; cuda: cupy buffers on each rank's GPU, ringcomm over NCCL "
                        "point-to-point against NCCL's collectives (default host)")
    p.add_argument("--json", help="write every row plus machine and version info here")
    p.add_argument("--plot", help="write a PNG of busbw against size here (needs matplotlib)")
    p.add_argument("--progress", action="store_true",
                   help="progress bar on stderr (default: when `ringcomm bench` runs in a terminal)")
    p.add_argument("--extra-json", help=argparse.SUPPRESS)  # rows of a separate mpi-ring launch
    p.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
    return p


def parse(argv) -> argparse.Namespace:
    args = parser().parse_args(argv)
    args.sizes = size_list(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    args.ops = list(OPS) if args.op == "all" else args.op.split(",")
    args.dtypes = list(_dtypes.DTYPES) if args.datatype == "all" else args.datatype.split(",")
    args.collectives = list(COLLECTIVES) if args.collective == "all" else args.collective.split(",")
    if args.impl is None:
        args.impl = "ringcomm,nccl" if args.device == "cuda" else "ringcomm,mpi,mpi-ring,gloo"
    args.impl = [s for s in args.impl.split(",") if s]
    if args.device == "cuda":
        from . import cuda
        from .errors import InvalidArgument
        try:
            import cupy  # noqa: F401
            cuda.require()
        except ImportError:
            raise SystemExit("ringcomm bench: --device cuda needs cupy (pip install 'ringcomm[cuda13]')") from None
        except InvalidArgument as exc:
            raise SystemExit(f"ringcomm bench: --device cuda: {exc}") from None
        if "bfloat16" in args.dtypes:
            raise SystemExit("ringcomm bench: --device cuda uses cupy buffers, and cupy has no bfloat16; "
                             "choose other dtypes")
    wrong_place = [m for m in args.impl if m in IMPLS and m not in DEVICE_IMPLS[args.device]]
    if wrong_place:
        raise SystemExit(f"ringcomm bench: {wrong_place} cannot run with --device {args.device}; "
                         f"choose from {', '.join(DEVICE_IMPLS[args.device])}")
    for what, vals, ok in (("op", args.ops, OPS), ("dtype", args.dtypes, _dtypes.DTYPES),
                           ("collective", args.collectives, COLLECTIVES), ("impl", args.impl, IMPLS)):
        bad = [v for v in vals if v not in ok]
        if bad:
            raise SystemExit(f"ringcomm bench: unknown {what} {bad}; expected one of {', '.join(ok)}")
    return args


def machine_info() -> dict:
    from .cli import info
    d = info()
    try:
        import torch
        d["torch"] = torch.__version__
    except ImportError:
        d["torch"] = None
    d["hostname"] = platform.node()
    return d


def run_mpi(argv=None) -> int:
    """Entry point on every rank (under mpirun)."""
    args = parse(argv)
    from mpi4py import MPI
    w = MPI.COMM_WORLD
    n, rank = w.size, w.rank
    bench = Bench(args, w)
    if rank == 0:
        w.Barrier()
        memcpy = memcpy_gbps() if args.device == "host" else device_copy_gbps()
    else:
        w.Barrier()
        memcpy = None
    memcpy = w.bcast(memcpy)
    tty = args.progress  # under mpirun stdout may be a pty even when piped: the launcher decides
    if rank == 0 and not args.rows_only:
        print(f"# ringcomm bench: n={n}, impls {','.join(i.name for i in bench.impls)}, "
              f"{args.reps} interleaved reps, time = max over ranks, median [p10 p90]")
        what = "single-core memcpy" if args.device == "host" else "device-to-device copy (GPU 0)"
        print(f"# {what}: {memcpy:.2f} GB/s (reference for %cpy = busbw / copy bandwidth)")
    all_rows: list[dict] = []
    total = len(args.collectives) * len(args.dtypes) * len(args.ops) * len(args.sizes)
    done = 0
    for coll in args.collectives:
        if rank == 0 and not args.rows_only:
            print(f"#\n# {coll}{'':>52}out-of-place{'':>40}in-place")
            print("#" + HEADER[1:])
        for dtype in args.dtypes:
            for op in args.ops:
                if op == "avg" and dtype not in _dtypes.FLOATING or coll == "all_gather" and op != args.ops[0]:
                    done += len(args.sizes)
                    continue
                for nbytes in args.sizes:
                    count, results = bench.measure(coll, nbytes, dtype, op)
                    rows = make_rows(coll, nbytes, count, dtype, op if coll != "all_gather" else "none",
                                     results, n, memcpy)
                    all_rows += rows
                    done += 1
                    if rank == 0 and not args.rows_only:
                        if tty:
                            print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
                        print_size_block(rows)
                        if tty:
                            bar = int(30 * done / total)
                            print(f"[{'#' * bar}{'.' * (30 - bar)}] {done}/{total}", end="", file=sys.stderr,
                                  flush=True)
    if rank == 0 and tty:
        print(file=sys.stderr)
    wrong = sum(r["wrong"] for r in all_rows) if args.check else 0
    ledger_bad = [r for r in all_rows if r["sent_per_rank"] is not None and r["sent_per_rank"] != r["expected_sent"]]
    for impl in bench.impls:
        impl.close()
    if rank == 0:
        if args.extra_json and os.path.exists(args.extra_json):
            extra = json.load(open(args.extra_json))["rows"]
            all_rows += extra
            wrong += sum(r["wrong"] for r in extra) if args.check else 0
            if not args.rows_only:
                print("# mpi-ring (separate launch with Open MPI's ring algorithms forced):")
                for coll in args.collectives:
                    for key in sorted({(r["dtype"], r["op"], r["size"]) for r in extra if r["collective"] == coll}):
                        print_size_block([r for r in extra if r["collective"] == coll
                                          and (r["dtype"], r["op"], r["size"]) == key])
        lines: list[str] = []
        models = fit_models(all_rows, n, lines) if not args.rows_only else {}
        summary = footer(all_rows, n, lines) if not args.rows_only else {}
        if not args.rows_only:
            lines.append(f"# out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
            if ledger_bad:
                lines.append(f"# ledger != expected on {len(ledger_bad)} rows: FAILED")
            print("\n".join(lines), flush=True)
        if args.json:
            doc = {"version": 1, "machine": machine_info(), "args": {k: v for k, v in vars(args).items()},
                   "n": n, "memcpy_gbps": memcpy, "rows": all_rows, "models": models, "summary": summary}
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1, default=str)
        if args.plot and not args.rows_only:
            plot(all_rows, n, args.plot, f"ringcomm bench, n={n}, {platform.node()}")
    status = 1 if (wrong or ledger_bad) else 0
    return int(w.bcast(status))


def cli_main(argv) -> int:
    """`ringcomm bench [-n N] ...`: launch N ranks (default 4) through the
    installed Open MPI and run the benchmark; mpi-ring runs as a second launch
    with Open MPI's ring algorithms forced by MCA parameters."""
    from .cli import mpirun_command
    if "-h" in argv or "--help" in argv:
        print("usage: ringcomm bench [-n NRANKS] [benchmark options]\n\n"
              "  --np/-N NRANKS   ranks to launch (default 4)\n")
        parser().print_help()
        return 0
    nranks, rest, i = 4, [], 0
    while i < len(argv):
        if argv[i] in ("--np", "-N", "--nranks"):
            nranks, i = int(argv[i + 1]), i + 2
            continue
        rest.append(argv[i])
        i += 1
    args = parse(rest)  # validate before launching anything
    if sys.stdout.isatty() and "--progress" not in rest:
        rest.append("--progress")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        main_args = list(rest)
        if "mpi-ring" in args.impl:
            ring_json = os.path.join(tmp, "ring.json")
            ring_args = _replace_flag(rest, "--impl", "mpi-ring") + ["--json", ring_json, "--rows-only"]
            ring_args = _drop_flag(ring_args, "--plot")
            mca = []
            for coll in args.collectives:
                mca += ["--mca", *RING_MCA[coll]]
            cmd = mpirun_command(nranks, [sys.executable, "-m", "ringcomm.benchmark", *ring_args],
                                 ["--mca", "coll_tuned_use_dynamic_rules", "1", *mca])
            rc = subprocess.call(cmd, env=env)
            if rc != 0:
                return rc
            others = [m for m in args.impl if m != "mpi-ring"]
            main_args = _replace_flag(rest, "--impl", ",".join(others)) + ["--extra-json", ring_json]
        cmd = mpirun_command(nranks, [sys.executable, "-m", "ringcomm.benchmark", *main_args])
        return subprocess.call(cmd, env=env)


def _replace_flag(argv, flag, value):
    out, i, found = [], 0, False
    while i < len(argv):
        if argv[i] == flag:
            out += [flag, value]
            i += 2
            found = True
            continue
        if argv[i].startswith(flag + "="):
            out += [flag, value]
            i += 1
            found = True
            continue
        out.append(argv[i])
        i += 1
    return out if found else out + [flag, value]


def _drop_flag(argv, flag):
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 2
            continue
        if argv[i].startswith(flag + "="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out


if __name__ == "__main__":
    sys.exit(run_mpi())

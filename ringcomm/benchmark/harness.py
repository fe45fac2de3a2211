"""Measurement, on every rank: the copy-bandwidth reference, and ``Bench``,
which allocates the buffers of one case per implementation, checks the
result outside the timed loop (exact count of wrong elements, ringcomm's
traffic ledger against traffic.expected), then times interleaved
repetitions (round-robin, rotating the order; a repetition's time is the
maximum over ranks) and summarizes them (median, p10, p90)."""

from __future__ import annotations

import time

import numpy as np

from .. import vocab
from .checks import ROOT, check_data, check_expected, count_for, split
from .impls import IMPLS, Case, Impl, RingcommImpl, torch_available


def summarize(samples) -> dict:
    s = np.asarray(samples, dtype=float)
    return {"median": float(np.median(s)), "p10": float(np.percentile(s, 10)),
            "p90": float(np.percentile(s, 90)), "reps": int(s.size)}


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

            from ..world import local_rank
            self.xp = cupy
            local, ngpu = local_rank(comm), cupy.cuda.runtime.getDeviceCount()
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
                    print("# gloo: torch is not installed (pip install -e '.[bench]'); skipped", flush=True)
                continue
            self.impls.append(IMPLS[name](self))
        self.rows: list[dict] = []
        self.total_wrong = 0

    def alloc(self, coll, count, dtype, op, inplace) -> Case:
        c = Case(coll, count, dtype, op, inplace, self.n, self.rank)
        dt = vocab.NUMPY[dtype]
        off, ln = c.chunk
        xp = self.xp
        if coll in ("all_reduce", "reduce", "all_to_all", "sendrecv"):
            c.send, c.recv = xp.empty(count, dt), xp.empty(count, dt)
        elif coll == "gather":  # every rank allocates the root's output (only the root's is written)
            c.send, c.recv = xp.empty(c.block, dt), xp.empty(count, dt)
        elif coll == "scatter":  # every rank allocates the root's input (only the root's is read)
            c.send, c.recv = xp.empty(count, dt), xp.empty(c.block, dt)
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
        if c.collective in ("all_gather", "gather"):
            c.input_view()[...] = data[off:off + ln]
        elif c.collective in ("all_reduce", "reduce") and c.inplace:
            c.recv[...] = data
        else:
            c.send[...] = data

    def count_wrong(self, c: Case, impl: Impl) -> int:
        off, ln = c.chunk
        coll, n, b = c.collective, self.n, c.block
        if coll in ("reduce", "gather") and self.rank != ROOT:
            return 0  # only the root has a result
        if coll in ("all_gather", "gather"):
            want = np.concatenate([check_data(c.dtype, c.op, q, c.count)[slice(*_span(c.count, self.n, q))]
                                   for q in range(self.n)])
            got = c.recv
        elif coll == "scatter":  # block r of the root's input
            want, got = check_data(c.dtype, c.op, ROOT, c.count)[self.rank * b:(self.rank + 1) * b], c.recv
        elif coll == "all_to_all":  # block r of every rank's input, in rank order
            want = np.concatenate([check_data(c.dtype, c.op, q, c.count)[self.rank * b:(self.rank + 1) * b]
                                   for q in range(n)])
            got = c.recv
        elif coll == "sendrecv":  # rank-1's input
            want, got = check_data(c.dtype, c.op, (self.rank - 1) % n, c.count), c.recv
        else:
            want = check_expected(c.dtype, c.op, self.n, c.count)
            got = impl.output_view(c)
            if c.collective == "reduce_scatter":
                want = want[off:off + ln]
        got = self.host(got)
        g = got.astype(np.float64) if got.dtype == vocab.NUMPY["bfloat16"] else got
        w = want.astype(np.float64) if want.dtype == vocab.NUMPY["bfloat16"] else want
        return int(np.count_nonzero(g != w))

    def host(self, a) -> np.ndarray:
        return a if self.xp is np else self.xp.asnumpy(a)

    def sync(self) -> None:
        """Wait for the GPU work queued so far on the current stream (--device cuda)."""
        if self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def measure(self, coll, nbytes, dtype, op):
        count = count_for(nbytes, dtype, self.n, coll)
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
                sent = expected = algorithm = None
                if isinstance(impl, RingcommImpl):
                    self.fill(c, impl)
                    sent = self.w.allreduce(impl.sent_bytes(c), op=_mpi_max())
                    algorithm = impl.last_algorithm  # what ran (auto's choice), alike on every rank
                    expected = max(expected_sent(coll, count, dtype, self.n, r, algorithm) for r in range(self.n))
                cases[impl.name] = (impl, c, wrong, sent, expected, algorithm)
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
            for name, (_, _, wrong, sent, expected, algorithm) in cases.items():
                s = summarize(samples[name])
                results[(name, inplace)] = dict(s, wrong=wrong, sent=sent, expected=expected, iters=iters,
                                                algorithm=algorithm)
        return count, results


def expected_sent(coll, count, dtype, n, rank, algorithm) -> int:
    """Payload bytes `rank` sends in one call, by traffic.expected (the ledger check)."""
    from ..traffic import expected
    if coll == "sendrecv":  # one send to rank+1 (the receive is booked apart)
        return expected("send", count, dtype, n, rank, root=(rank + 1) % n).bytes_sent if n > 1 else 0
    if coll in ("reduce", "gather", "scatter", "all_to_all"):
        alg = algorithm if coll == "reduce" else "ring"
        return expected(coll, count, dtype, n, rank, root=ROOT, algorithm=alg).bytes_sent
    return expected(coll, count, dtype, n, rank, algorithm=algorithm).bytes_sent


def _span(count, n, q):
    off, ln = split(count, n, q)
    return off, off + ln


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX

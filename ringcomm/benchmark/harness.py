"""Measurement, on every rank: the copy-bandwidth references, and ``Bench``,
which allocates the buffers of one case (one pair, every implementation
on it: the same pages for all), checks each one's result outside the
timed loop (exact count of wrong elements, ringcomm's traffic ledger
against traffic.expected), then times interleaved
repetitions (round-robin, rotating the order) and summarizes them (median,
p10, p90).

Every timed iteration of every implementation, the memcpy reference
included, starts after the same ``MPI_Barrier`` on COMM_WORLD and is timed
on each rank from leaving the barrier to its end (GPU: a stream sync); an
iteration's time is the maximum over ranks, a repetition's the mean of its
iterations'.

Modes: "hot" runs every iteration on the same buffers (as DDP reduces
freshly written buckets); "cold" takes each iteration's buffers from the
next free bytes of a pool of at least twice the last-level cache per rank,
so no byte is used again before 2 x LLC of other buffers went through this
rank: no iteration finds its data in cache. The memcpy reference (every
rank copies a buffer of the collective's full size at the same moment)
runs in the same mode, interleaved with the implementations.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import numpy as np

from .. import vocab
from .checks import PREFIX, ROOT, check_data, check_expected, count_for, prefix_expected, split
from .impls import IMPLS, Case, Impl, MemcpyImpl, RingcommImpl, torch_available

MODES = ("hot", "cold")
COLD_LLC_FACTOR = 2   # the cold pool holds at least this many last-level caches per rank
PAGE = 4096


def _parse_cache_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def llc_info(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """The last-level cache of CPU 0: {"bytes", "level", "shared_cpus", "source"}.

    From sysfs (the highest-level data or unified cache), else `getconf
    LEVEL3_CACHE_SIZE` / `LEVEL2_CACHE_SIZE`; bytes is None when neither says."""
    best = None
    try:
        for d in sorted(os.listdir(root)):
            if not d.startswith("index"):
                continue
            path = os.path.join(root, d)
            read = lambda name: open(os.path.join(path, name)).read().strip()  # noqa: E731
            try:
                if read("type") == "Instruction":
                    continue
                level, size = int(read("level")), _parse_cache_size(read("size"))
            except (OSError, ValueError):
                continue
            try:
                shared = read("shared_cpu_list")
            except OSError:
                shared = "?"
            if best is None or level > best["level"]:
                best = {"bytes": size, "level": level, "shared_cpus": shared, "source": path}
    except OSError:
        pass
    if best is not None:
        return best
    for level in (3, 2):
        try:
            out = subprocess.run(["getconf", f"LEVEL{level}_CACHE_SIZE"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
            if out and int(out) > 0:
                return {"bytes": int(out), "level": level, "shared_cpus": "?", "source": "getconf"}
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
    return {"bytes": None, "level": None, "shared_cpus": "?", "source": "unknown"}


LLC_UNKNOWN_BYTES = 256 << 20  # assumed when the machine does not say (larger than most LLCs)


def _round_up(x: int, m: int = PAGE) -> int:
    return -(-x // m) * m


def slot_bytes(full_bytes: int) -> int:
    """The pool bytes one iteration takes: two page-aligned halves of the
    collective's full buffer (send in the first, receive in the second; every
    collective's buffers and the memcpy's source and destination fit)."""
    return 2 * _round_up(max(full_bytes, 1))


def cold_pool_bytes(llc_bytes: int, max_full_bytes: int, override: int | None = None) -> int:
    """Per-rank size of the cold pool: at least COLD_LLC_FACTOR x the LLC (or
    `override`), plus two slots of the largest buffer, so that whatever the
    size, a byte comes back only after at least 2 x LLC (or `override`) of
    other buffers, and at least two iterations fit."""
    base = override if override else COLD_LLC_FACTOR * llc_bytes
    return _round_up(base) + 2 * slot_bytes(max_full_bytes)


class ColdPool:
    """Per-rank pool; `take(nbytes)` returns the offset of the next free
    bytes, wrapping to 0 when they would run past the end (round robin in
    byte order across sizes, implementations and passes)."""

    def __init__(self, xp, nbytes: int, reuse_distance: int):
        self.nbytes, self.reuse_distance = nbytes, reuse_distance
        self.buf = xp.empty(nbytes, xp.uint8)
        self.buf.fill(0)  # first touch on this rank; zeros: no denormals, no NaN in any dtype
        self.cursor = 0

    def take(self, nbytes: int) -> int:
        if self.cursor + nbytes > self.nbytes:
            self.cursor = 0
        off, self.cursor = self.cursor, self.cursor + nbytes
        return off

    def view(self, off: int, count: int, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        return self.buf[off:off + count * dt.itemsize].view(dt)


def summarize(samples) -> dict:
    s = np.asarray(samples, dtype=float)
    return {"median": float(np.median(s)), "p10": float(np.percentile(s, 10)),
            "p90": float(np.percentile(s, 90)), "reps": int(s.size)}


def memcpy_gbps(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """Single-core copy bandwidth, one rank alone: bytes copied per second
    (best of reps). Kept in --json as "memcpy_gbps"; the table's reference is
    the concurrent memcpy measured per size (``MemcpyImpl``)."""
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
        self.memcpy = MemcpyImpl(self)
        self.pool: ColdPool | None = None
        self.llc = None

    def cold_pool(self) -> ColdPool:
        """The cold pool (allocated and touched on first use; the LLC taken as
        the largest any rank reports, so every rank's pool has the same size)."""
        if self.pool is None:
            from mpi4py import MPI
            llc = llc_info()
            known = self.w.allreduce(llc["bytes"] or 0, op=MPI.MAX)
            llc["assumed"] = not known
            llc["bytes"] = known or LLC_UNKNOWN_BYTES
            self.llc = llc
            largest = max(count_for(b, d, self.n, c) * vocab.itemsize(d)
                          for b in self.args.sizes for d in self.args.dtypes for c in self.args.collectives)
            override = getattr(self.args, "cold_pool_bytes", None)
            nbytes = cold_pool_bytes(llc["bytes"], largest, override)
            self.pool = ColdPool(self.xp, nbytes, reuse_distance=nbytes - 2 * slot_bytes(largest))
        return self.pool

    @staticmethod
    def shapes(coll, count, n, rank) -> tuple[int, int]:
        """Element counts of (send, recv) for a collective (the memcpy: count each)."""
        c = Case(coll, count, "uint8", "sum", False, n, rank)
        if coll in ("all_reduce", "reduce", "all_to_all", "sendrecv", "memcpy") + PREFIX:
            return count, count
        if coll == "gather":  # every rank allocates the root's output (only the root's is written)
            return c.block, count
        if coll == "scatter":  # every rank allocates the root's input (only the root's is read)
            return count, c.block
        if coll == "reduce_scatter":
            return count, c.chunk[1]
        return c.chunk[1], count

    def alloc(self, coll, count, dtype, op, inplace, pool_offset=None) -> Case:
        """The buffers of one case: fresh and zeroed, or (pool_offset given)
        views of the cold pool's slot at that offset, not touched here."""
        c = Case(coll, count, dtype, op, inplace, self.n, self.rank)
        dt = vocab.NUMPY[dtype]
        ns, nr = self.shapes(coll, count, self.n, self.rank)
        if pool_offset is not None:
            half = slot_bytes(count * vocab.itemsize(dtype)) // 2
            c.send, c.recv = self.pool.view(pool_offset, ns, dt), self.pool.view(pool_offset + half, nr, dt)
            return c
        c.send, c.recv = self.xp.empty(ns, dt), self.xp.empty(nr, dt)
        c.send[...] = 0
        c.recv[...] = 0
        return c

    def fill(self, c: Case, impl: Impl):
        """Reset the buffers to the check data, the output cleared (before
        each implementation's check and its ledger's count; the timed loops
        then run on what the calls leave)."""
        data = self.xp.asarray(check_data(c.dtype, c.op, self.rank, c.count))
        off, ln = c.chunk
        c.recv[...] = 0  # (the buffers are shared: not the last implementation's result)
        if c.collective in ("all_gather", "gather"):
            c.input_view()[...] = data[off:off + ln]
        elif c.collective in ("all_reduce", "reduce") + PREFIX and c.inplace:
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
        elif coll in PREFIX:  # ranks 0..r (scan) or 0..r-1 (exscan) reduced
            want, got = prefix_expected(coll, c.dtype, c.op, self.rank, c.count), impl.output_view(c)
            if want is None:  # exscan's rank 0: the op's identity (ringcomm), undefined (MPI)
                want = impl.exscan_rank0(c)
                if want is None:
                    return 0
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

    def timed(self, impl: Impl, next_case, iters: int) -> float:
        """Run `iters` iterations, each after the same barrier; return the mean
        over iterations of the slowest rank's time (barrier excluded)."""
        from mpi4py import MPI
        times = np.empty(iters)
        for k in range(iters):
            c = next_case()
            self.w.Barrier()
            t0 = time.perf_counter()
            impl.run(c)
            self.sync()
            times[k] = time.perf_counter() - t0
        self.w.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        return float(times.mean())

    def measure(self, coll, nbytes, dtype, op, mode="hot"):
        """Check, then time every implementation and the memcpy reference,
        interleaved. Results keyed (name, inplace); ("memcpy", False) is the
        reference, timed in each pass where some implementation ran and
        summarized over the repetitions of both passes."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {MODES}")
        count = count_for(nbytes, dtype, self.n, coll)
        full = count * vocab.itemsize(dtype)
        pool = self.cold_pool() if mode == "cold" else None
        results, ref_samples = {}, []
        for inplace in (False, True):
            cases = self._checked_cases(coll, count, dtype, op, inplace)

            def next_case(name, coll_of):
                """hot: the case's own buffers; cold: the pool's next slot."""
                if pool is None:
                    c = cases[name][1]
                    return lambda: c
                slot = slot_bytes(full)
                return lambda: self.alloc(coll_of, count, dtype, op, inplace, pool_offset=pool.take(slot))

            feeds = {name: next_case(name, "memcpy" if name == self.memcpy.name else coll) for name in cases}
            iters = self._iterations(cases, feeds)
            samples = self._interleaved(cases, feeds, iters)
            for name, (_, _, wrong, sent, expected, algorithm) in cases.items():
                if name == self.memcpy.name:
                    ref_samples += samples[name]
                    continue
                s = summarize(samples[name])
                results[(name, inplace)] = dict(s, wrong=wrong, sent=sent, expected=expected, iters=iters[name],
                                                algorithm=algorithm, mode=mode)
        if ref_samples:  # one reference per size: the memcpy's repetitions of both passes
            results[(self.memcpy.name, False)] = dict(summarize(ref_samples), wrong=0, sent=None, expected=None,
                                                      iters=None, algorithm=None, mode=mode)
        return count, results

    def _checked_cases(self, coll, count, dtype, op, inplace) -> dict:
        """Each implementation that runs this call, checked once outside the
        timed loop: name -> (impl, case, wrong elements, bytes sent, bytes
        expected, algorithm); and the memcpy reference where any runs."""
        cases = {}
        # One pair of buffers for every implementation: arrays allocated
        # apart lie apart (glibc's heap or mmap, at varying 2 MiB offsets),
        # so in transparent huge pages to varying extents, and the kernel
        # copies between processes (single copy, Open MPI's CMA) pin every
        # 4 KiB page (bench/README.md, "--mode hot").
        shared = self.alloc(coll, count, dtype, op, inplace)
        for impl in self.impls:
            c = dataclasses.replace(shared)  # (its own Case: an impl may keep views in it)
            if not impl.supports(c):
                continue
            # correctness, outside the timed loop (on the shared buffers, not the pool's)
            self.fill(c, impl)
            impl.run(c)
            wrong = self.w.allreduce(self.count_wrong(c, impl))
            sent = expected = algorithm = None
            if isinstance(impl, RingcommImpl):
                self.fill(c, impl)
                sent = self.w.allreduce(impl.sent_bytes(c), op=_mpi_max())
                algorithm = impl.last_algorithm  # what ran (auto's choice), alike on every rank
                window = getattr(impl.comm._engine, "window", None)
                limit = window.single_copy_min if window is not None else None
                expected = max(expected_sent(coll, count, dtype, self.n, r, algorithm, limit) for r in range(self.n))
            cases[impl.name] = (impl, c, wrong, sent, expected, algorithm)
        if cases:  # the reference: every rank copies the full buffer at once
            cases[self.memcpy.name] = (self.memcpy, self.alloc("memcpy", count, dtype, op, False),
                                       0, None, None, None)
        return cases

    def _iterations(self, cases: dict, feeds: dict) -> dict:
        """Warm-up, and each implementation's iteration count: about
        --target-ms a repetition each (the estimate is the slowest rank's,
        so every rank counts alike). From the slowest implementation's
        time, gloo's, the others ran about 5 iterations a repetition at
        4 MiB, in which what the block before left (the memcpy's dirty
        lines) weighed: listed first, ringcomm lost to Open MPI by up to
        1.4x, listed second it won (bench/README.md, "--mode hot")."""
        iters = {}
        for name, (impl, *_) in cases.items():
            if self.args.warmup:
                self.timed(impl, feeds[name], self.args.warmup)
            est = self.timed(impl, feeds[name], 1)
            iters[name] = self.args.iters or max(1, min(1000, int(self.args.target_ms * 1e-3 / max(est, 1e-7))))
        return iters

    def _interleaved(self, cases: dict, feeds: dict, iters: dict) -> dict:
        """The repetitions, the implementations in a rotating order: name -> seconds per repetition."""
        samples = {name: [] for name in cases}
        names = list(cases)
        for rep in range(self.args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)] if names else []
            for name in order:
                # One untimed call first: the caches as this implementation
                # leaves them, not as the one before (the memcpy, on its own
                # buffers; or another on the same ones) did.
                self.timed(cases[name][0], feeds[name], 1)
                samples[name].append(self.timed(cases[name][0], feeds[name], iters[name]))
        return samples

    def cold_info(self) -> dict | None:
        """What the cold pool is (None before cold mode ran)."""
        if self.pool is None:
            return None
        return {"llc_bytes": self.llc["bytes"], "llc_level": self.llc["level"], "llc_assumed": self.llc["assumed"],
                "llc_shared_cpus": self.llc["shared_cpus"], "pool_bytes": self.pool.nbytes,
                "reuse_distance_bytes": self.pool.reuse_distance}


def expected_sent(coll, count, dtype, n, rank, algorithm, single_copy_min=None) -> int:
    """Payload bytes `rank` sends in one call, by traffic.expected (the ledger
    check); `single_copy_min`: the window's limit (reduce "shm")."""
    from ..traffic import expected
    if coll == "sendrecv":  # one send to rank+1 (the receive is booked apart)
        return expected("send", count, dtype, n, rank, root=(rank + 1) % n).bytes_sent if n > 1 else 0
    if coll in ("reduce", "gather", "scatter", "all_to_all"):
        alg = algorithm if coll == "reduce" else "ring"
        return expected(coll, count, dtype, n, rank, root=ROOT, algorithm=alg,
                        single_copy_min=single_copy_min).bytes_sent
    return expected(coll, count, dtype, n, rank, algorithm=algorithm).bytes_sent


def _span(count, n, q):
    off, ln = split(count, n, q)
    return off, off + ln


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX

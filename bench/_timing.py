"""What the mpirun benchmark scripts of this folder share."""
import time

import numpy as np


def timed(w, fn, iters: int) -> float:
    """The median time of `fn` over `iters` calls, each after a barrier on the
    mpi4py communicator `w` (the same for every implementation compared),
    and the slowest rank's median (seconds)."""
    from mpi4py import MPI
    w.Barrier()
    ts = []
    for _ in range(iters):
        w.Barrier()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return w.allreduce(float(np.median(ts)), op=MPI.MAX)


def check_each(impls: dict, out: np.ndarray, want: np.ndarray, rank: int, what: str) -> None:
    """Run every implementation once and compare `out` (filled with -1
    first) with numpy's `want`; exit naming the rank, implementation and
    first wrong index."""
    for name, f in impls.items():
        out[:] = -1
        f()
        if not np.array_equal(out, want):
            bad = int(np.flatnonzero(out != want)[0])
            raise SystemExit(f"rank {rank}: {name} at {what}: index {bad} is {out[bad]}, want {want[bad]}")


_warm = False


def warm_up(w, impls: dict, seconds: float = 0.3) -> None:
    """Calls `impls` in turn for about `seconds` (the slowest rank's clock),
    once per process: on a VM here the first ~200 calls of a fresh job ran
    up to 3x slower, easing off over ~40 ms (no page faults after the
    first calls: the machine's own ramp), so the first size a script timed
    came out slow for whichever implementation it timed first."""
    global _warm
    if _warm:
        return
    from mpi4py import MPI
    t0 = time.perf_counter()
    while w.allreduce(time.perf_counter() - t0, op=MPI.MAX) < seconds:
        for f in impls.values():
            f()
    _warm = True


def interleaved(w, impls: dict, iters: int, reps: int) -> tuple[dict, dict]:
    """Each implementation of `impls` (name -> call) warmed up (the first
    time, the job too: warm_up), then timed `reps` times in turn (one rep
    of each before the next rep of any: drift of a shared machine falls on
    all alike). Returns ({name: [us per call of each rep]}, {name: median
    us})."""
    warm_up(w, impls)
    for f in impls.values():
        timed(w, f, 2)
    got = {k: [] for k in impls}
    for _ in range(reps):
        for k, f in impls.items():
            got[k].append(timed(w, f, iters) * 1e6)
    return got, {k: float(np.median(v)) for k, v in got.items()}

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

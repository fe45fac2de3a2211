"""all_reduce between the ranks of one host: shared memory against MPI.

    ringcomm run -n 2 python bench/shm_allreduce.py [MIN [MAX]]

Per size, interleaved repetitions (the same barrier before every timed
iteration of every implementation), the median over reps of the per-call
time (max over ranks), for:
  memcpy      every rank copies a buffer of the size at the same time (the
              memory system's rate, the reference: busbw / memcpy GB/s)
  shm         ringcomm auto (shm_flat up to 32 KiB, shm above)
  zero_copy   ringcomm on arrays from comm.empty (the shared arena)
  ring        ringcomm's ring over MPI point-to-point (algorithm="ring")
  mpi         MPI_Allreduce (Open MPI's own choice)
busbw = 2(N-1)/N * bytes / time; "hot" buffers (the same ones each call).
"""
import sys

import numpy as np
from mpi4py import MPI

import _timing  # (bench/, the script's folder)
import ringcomm

w = MPI.COMM_WORLD
comm = ringcomm.init()
n = comm.size
lo = int(float(sys.argv[1])) if len(sys.argv) > 1 else 8
hi = int(float(sys.argv[2])) if len(sys.argv) > 2 else 64 << 20
reps = 5


def timed(fn, iters):
    return _timing.timed(w, fn, iters)


size = lo
if comm.rank == 0:
    print(f"# N = {n}, hot buffers, median of {reps} interleaved reps of the median per-call time (max over ranks)")
    print(f"{'bytes':>10} {'memcpy GB/s':>11} " + " ".join(f"{k + ' us':>12} {'/memcpy':>7}" for k in
                                                   ("shm", "zero_copy", "ring", "mpi")))
while size <= hi:
    count = max(1, size // 4)
    x = np.ones(count, np.float32) * (comm.rank + 1)
    y = np.empty_like(x)
    z = comm.empty(count, "float32")
    z[:] = x
    src, dst = np.ones(count, np.float32), np.empty(count, np.float32)
    iters = max(3, min(2000, int(2e8 // max(size, 64) // 40)))
    impls = {
        "memcpy": lambda: np.copyto(dst, src),
        "shm": lambda: comm.all_reduce(x, out=y),
        "zero_copy": lambda: comm.all_reduce(z),
        "ring": lambda: comm.all_reduce(x, out=y, algorithm="ring"),
        "mpi": lambda: w.Allreduce(x, y),
    }
    for f in impls.values():
        f()
    res = {k: [] for k in impls}
    for _ in range(reps):
        for k, f in impls.items():
            res[k].append(timed(f, iters))
    med = {k: float(np.median(v)) for k, v in res.items()}
    nbytes = count * 4
    mem = nbytes / med["memcpy"] / 1e9
    if comm.rank == 0:
        row = f"{nbytes:>10} {mem:>11.1f} "
        for k in ("shm", "zero_copy", "ring", "mpi"):
            bus = 2 * (n - 1) / n * nbytes / med[k] / 1e9
            row += f"{med[k] * 1e6:>12.1f} {bus / mem:>7.2f}"
        print(row, flush=True)
    del z
    size *= 4
comm.close()

"""reduce, gather, scatter and all_to_all between the ranks of one host:
the shared-memory window against the message algorithms and Open MPI.

    ringcomm run -n 2 -- python bench/shm_rooted.py [MIN [MAX [REPS]]]

Per collective and size (bytes of the whole buffer: reduce's input, gather's
output, scatter's input, one rank's all_to_all input; float32, root 0),
interleaved repetitions (a barrier before every timed call of every
implementation), the median over 5 reps of the per-call median (max over
ranks), us:
  shm    ringcomm algorithm="shm" (the window's slots)
  p2p    ringcomm over point-to-point: reduce "binomial" (the tree);
         gather/scatter "linear"; all_to_all "pairwise"
  ring   reduce only: "ring" (reduce-scatter, then a gather to the root)
  auto   ringcomm's default; `chose` says what it ran
  mpi    Open MPI (MPI_Reduce, MPI_Gather, MPI_Scatter, MPI_Alltoall)
shm/p2p < 1: the window is faster; the largest size where it stays so
is what shm.SHM_MAX should hold for that collective (for reduce, p2p is
the tree, which auto runs up to 256 KiB: above, compare shm with ring). auto/mpi < 1:
ringcomm's default is faster than Open MPI's.
"""
import sys

import numpy as np
from mpi4py import MPI

import _timing  # (bench/, the script's folder)
import ringcomm

w = MPI.COMM_WORLD
comm = ringcomm.init()
n, r = comm.size, comm.rank
lo = int(float(sys.argv[1])) if len(sys.argv) > 1 else 1 << 10
hi = int(float(sys.argv[2])) if len(sys.argv) > 2 else 16 << 20
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5


if r == 0:
    print(f"# N = {n}, float32, root 0, median of {reps} interleaved reps (us per call, slowest rank)")
    print(f"{'collective':>11} {'bytes':>10} {'shm':>10} {'p2p':>10} {'ring':>10} {'auto':>10} {'mpi':>10} "
          f"{'shm/p2p':>8} {'auto/mpi':>8}  chose")
for coll in ("reduce", "gather", "scatter", "all_to_all"):
    size = lo
    while size <= hi:
        count = max(n, size // 4 // n * n)
        full = np.arange(count, dtype=np.float32) + r
        block = np.empty(count // n, np.float32)
        out = np.empty(count, np.float32)
        root_out = out if r == 0 else None
        if coll == "reduce":
            impls = {"shm": lambda: comm.reduce(full, out=out, algorithm="shm"),
                     "p2p": lambda: comm.reduce(full, out=out, algorithm="binomial"),
                     "ring": lambda: comm.reduce(full, out=out, algorithm="ring"),
                     "auto": lambda: comm.reduce(full, out=out),
                     "mpi": lambda: w.Reduce(full, root_out, root=0)}
        elif coll == "gather":
            impls = {"shm": lambda: comm.gather(block, out=root_out, algorithm="shm"),
                     "p2p": lambda: comm.gather(block, out=root_out, algorithm="linear"),
                     "auto": lambda: comm.gather(block, out=root_out),
                     "mpi": lambda: w.Gather(block, root_out, root=0)}
        elif coll == "scatter":
            impls = {"shm": lambda: comm.scatter(full, out=block, algorithm="shm"),
                     "p2p": lambda: comm.scatter(full, out=block, algorithm="linear"),
                     "auto": lambda: comm.scatter(full, out=block),
                     "mpi": lambda: w.Scatter(full if r == 0 else None, block, root=0)}
        else:
            impls = {"shm": lambda: comm.all_to_all(full, out=out, algorithm="shm"),
                     "p2p": lambda: comm.all_to_all(full, out=out, algorithm="pairwise"),
                     "auto": lambda: comm.all_to_all(full, out=out),
                     "mpi": lambda: w.Alltoall(full, out)}
        iters = max(3, min(500, int(2e8 // size // 20)))
        got, med = _timing.interleaved(w, impls, iters, reps)
        impls["auto"]()
        chose = comm.last_algorithm
        if r == 0:
            ring = f"{med['ring']:>10.1f}" if "ring" in med else f"{'-':>10}"
            print(f"{coll:>11} {size:>10} {med['shm']:>10.1f} {med['p2p']:>10.1f} {ring} {med['auto']:>10.1f} "
                  f"{med['mpi']:>10.1f} {med['shm'] / med['p2p']:>8.2f} {med['auto'] / med['mpi']:>8.2f}  {chose}",
                  flush=True)
        size *= 4
comm.close()

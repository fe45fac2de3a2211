"""The hierarchical collectives against the flat ones, on one machine split
into hosts.

    ringcomm run -n 4 -- python bench/hierarchical.py [PER_HOST [MIN [MAX]]]

RINGCOMM_HOST_ID splits the ranks into hosts of PER_HOST (default 2) in
blocked placement, so the "hosts" share memory inside and talk over MPI
point-to-point between (here Open MPI's shared-memory single copy: the
inter-host link is far faster than a network, so this shows the cost of
the extra steps, not the traffic saved; on real hosts the saving is the
(L-1)/L of the buffer that no longer leaves each host).

Per collective and size, interleaved repetitions (a barrier before every
timed call of every implementation), median over reps of the per-call
median time (max over ranks), and the range over reps:
  hierarchical  ringcomm algorithm="hierarchical"
  ring          ringcomm's ring over every rank (MPI point-to-point)
  mpi           Open MPI's own (Allreduce, Reduce_scatter_block, Allgather)
"""
import os
import sys

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
per_host = int(sys.argv[1]) if len(sys.argv) > 1 else 2
os.environ["RINGCOMM_HOST_ID"] = f"host{rank // per_host}"

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import _timing  # noqa: E402  (bench/, the script's folder)
import ringcomm  # noqa: E402

w = MPI.COMM_WORLD
comm = ringcomm.init()
n = comm.size
lo = int(float(sys.argv[2])) if len(sys.argv) > 2 else 8 << 10
hi = int(float(sys.argv[3])) if len(sys.argv) > 3 else 16 << 20
reps = 5


if not comm._engine.hierarchical:
    sys.exit(f"not hierarchical: {n} ranks in hosts of {per_host} (need at least 2 hosts of at least 2)")
if comm.rank == 0:
    print(f"# N = {n}, {n // per_host} hosts x {per_host} ranks (RINGCOMM_HOST_ID, blocked), float32 sum, "
          f"median [min..max] of {reps} interleaved reps, us per call (max over ranks)")
    print(f"{'collective':>14} {'bytes':>10} {'hierarchical':>24} {'ring':>24} {'mpi':>24} {'hier/ring':>9} "
          f"{'hier/mpi':>8}")
for coll in ("all_reduce", "reduce_scatter", "all_gather"):
    size = lo
    while size <= hi:
        count = size // 4 // n * n
        full = np.arange(count, dtype=np.float32) + comm.rank
        out = np.empty(count, np.float32)
        part = np.empty(count // n, np.float32)
        if coll == "all_reduce":
            impls = {"hierarchical": lambda: comm.all_reduce(full, out=out, algorithm="hierarchical"),
                     "ring": lambda: comm.all_reduce(full, out=out, algorithm="ring"),
                     "mpi": lambda: w.Allreduce(full, out)}
        elif coll == "reduce_scatter":
            impls = {"hierarchical": lambda: comm.reduce_scatter(full, out=part, algorithm="hierarchical"),
                     "ring": lambda: comm.reduce_scatter(full, out=part, algorithm="ring"),
                     "mpi": lambda: w.Reduce_scatter_block(full, part)}
        else:
            impls = {"hierarchical": lambda: comm.all_gather(part, out=out, algorithm="hierarchical"),
                     "ring": lambda: comm.all_gather(part, out=out, algorithm="ring"),
                     "mpi": lambda: w.Allgather(part, out)}
        iters = max(3, min(200, int(4e8 // size // 20)))
        got, med = _timing.interleaved(w, impls, iters, reps)
        if comm.rank == 0:
            cells = " ".join(f"{med[k]:>9.1f} [{min(v):.0f}..{max(v):.0f}]".rjust(24) for k, v in got.items())
            print(f"{coll:>14} {size:>10} {cells} {med['hierarchical'] / med['ring']:>9.2f} "
                  f"{med['hierarchical'] / med['mpi']:>8.2f}", flush=True)
        size *= 8
comm.close()

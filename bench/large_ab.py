# Usage: PYTHONPATH=<a build> mpirun -n N python bench/large_ab.py LABEL  (4 and 64 MiB: ringcomm vs MPI_Allreduce)
# Large all_reduce: ringcomm's default call vs MPI_Allreduce, interleaved, one job (a build A/B helper).
import sys, time, numpy as np
from mpi4py import MPI
import ringcomm
w = MPI.COMM_WORLD
comm = ringcomm.init(timeout=120)
line = []
for nbytes in (4 << 20, 64 << 20):
    x = np.ones(nbytes // 4, np.float32); y = np.empty_like(x)
    iters = 20 if nbytes == 4 << 20 else 3
    res = {"ringcomm": [], "mpi": []}
    for rep in range(5):
        for k in (("ringcomm", "mpi") if rep % 2 == 0 else ("mpi", "ringcomm")):
            w.Barrier(); t0 = time.perf_counter()
            for _ in range(iters):
                w.Allreduce(x, y) if k == "mpi" else comm.all_reduce(x, out=y)
            res[k].append(w.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
    r, m = np.median(res["ringcomm"]) * 1e3, np.median(res["mpi"]) * 1e3
    line.append(f"{nbytes >> 20} MiB: ringcomm {r:.2f} ms, MPI {m:.2f} ms, MPI/ringcomm {m / r:.2f}")
if w.rank == 0:
    print(f"{sys.argv[1]} N={w.size} " + "  ".join(line), flush=True)
comm.close()

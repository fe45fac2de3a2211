# Usage: PYTHONPATH=<a build> mpirun -n N python bench/lat_ab.py LABEL  (prints one line: ringcomm vs MPI_Allreduce)
# 8-byte (and 4 KiB) all_reduce: ringcomm's default call vs MPI_Allreduce, interleaved, in one job.
import sys, time, numpy as np
from mpi4py import MPI
import ringcomm
w = MPI.COMM_WORLD
comm = ringcomm.init(timeout=60)
out = {}
for nbytes in (8, 4096):
    x = np.ones(nbytes // 4, np.float32); y = np.empty_like(x)
    iters = 4000 if nbytes == 8 else 2000
    res = {"ringcomm": [], "mpi": []}
    for rep in range(7):
        for k in (("ringcomm", "mpi") if rep % 2 == 0 else ("mpi", "ringcomm")):
            w.Barrier(); t0 = time.perf_counter()
            if k == "mpi":
                for _ in range(iters): w.Allreduce(x, y)
            else:
                for _ in range(iters): comm.all_reduce(x, out=y)
            res[k].append(w.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
    out[nbytes] = {k: float(np.median(v)) * 1e6 for k, v in res.items()}
if w.rank == 0:
    alg = getattr(comm, "last_algorithm", "ring")
    print(f"{sys.argv[1]} N={w.size} " + "  ".join(
        f"{b}B: ringcomm {d['ringcomm']:.2f} us, MPI {d['mpi']:.2f} us, ratio {d['ringcomm']/d['mpi']:.2f}"
        for b, d in out.items()) + f"  (ringcomm ran {alg} at 4 KiB)", flush=True)
comm.close()

# Usage: mpirun -n 4 --oversubscribe python bench/cpu_bound.py
# 4 MiB all_reduce: wall time (max over ranks) and CPU time (user+sys, summed over ranks) per call, medians of 3
# interleaved repetitions. cpu/wall = 2.00 means both cores are busy for the whole call: the time is the work.
import resource, time, numpy as np
from mpi4py import MPI
import ringcomm
w = MPI.COMM_WORLD
comm = ringcomm.init(timeout=60)
x = np.arange((4 << 20) // 4, dtype=np.float32); y = np.empty_like(x)
out = {}
for rep in range(3):
    for k, f in (("mpi", lambda: w.Allreduce(x, y)), ("rc-auto", lambda: comm.all_reduce(x, out=y)),
                 ("rc-ring", lambda: comm.all_reduce(x, out=y, algorithm="ring")),
                 ("rc-hd", lambda: comm.all_reduce(x, out=y, algorithm="halving_doubling"))):
        f(); w.Barrier()
        r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
        for _ in range(40): f()
        wall = (time.perf_counter() - t0) / 40
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / 40
        wall = w.allreduce(wall, op=MPI.MAX); cpu = w.allreduce(cpu, op=MPI.SUM)
        out.setdefault(k, []).append((wall, cpu))
if w.rank == 0:
    for k, v in out.items():
        wl = np.median([a for a, _ in v]); c = np.median([b for _, b in v])
        print(f"{k:8s} wall {wl*1e3:.2f} ms  cpu (all ranks) {c*1e3:.2f} ms  cpu/wall {c/wl:.2f}")
comm.close()

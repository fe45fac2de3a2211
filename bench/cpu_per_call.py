# Usage: mpirun -n N python bench/cpu_per_call.py {rc|mpi}  (8-byte all_reduce: time and CPU per call, per rank)
# With more ranks than cores the time of a small collective is the CPU every rank burns (working and
# waiting) divided by the cores: this prints both, from getrusage around the timed loop.
import resource
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm

w = MPI.COMM_WORLD
comm = ringcomm.init(timeout=60)
x = np.ones(2, np.float32)
y = np.empty_like(x)
f = (lambda: w.Allreduce(x, y)) if sys.argv[1] == "mpi" else (lambda: comm.all_reduce(x, out=y))
for _ in range(2000):
    f()
N = 50000
w.Barrier()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(N):
    f()
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
t = w.allreduce(t1 - t0, op=MPI.MAX)
stats = w.gather(((r1.ru_utime - r0.ru_utime) / N * 1e6, (r1.ru_stime - r0.ru_stime) / N * 1e6,
                  (r1.ru_nvcsw - r0.ru_nvcsw) / N, (r1.ru_nivcsw - r0.ru_nivcsw) / N), root=0)
if w.rank == 0:
    print(sys.argv[1], f"{t / N * 1e6:.2f} us/call; per call per rank (user us, sys us, voluntary cs, involuntary cs):",
          " | ".join("%.2f %.2f %.2f %.2f" % s for s in stats))
comm.close()

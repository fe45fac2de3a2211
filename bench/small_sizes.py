# Usage: mpirun -n N python bench/small_sizes.py  (one line per size: ringcomm's default all_reduce vs MPI_Allreduce, us, interleaved)
# Finds Open MPI's inline-send boundary: a message of up to 256 B (btl_sm_max_inline_send) goes out inline;
# recursive doubling's first message carries the 48-byte fingerprint, so payloads of 209-256 B cross it.
import time, numpy as np
from mpi4py import MPI
import ringcomm
w = MPI.COMM_WORLD
comm = ringcomm.init(timeout=60)
res = []
for nb in (64, 192, 200, 208, 212, 216, 224, 256, 300, 400, 1024):
    x = np.arange(nb // 4, dtype=np.float32); y = np.empty_like(x)
    t = {"rc": [], "mpi": []}
    for rep in range(5):
        for k in ("rc", "mpi"):
            w.Barrier(); t0 = time.perf_counter()
            for _ in range(3000):
                if k == "mpi": w.Allreduce(x, y)
                else: comm.all_reduce(x, out=y)
            t[k].append(w.allreduce((time.perf_counter() - t0) / 3000, op=MPI.MAX))
    if w.rank == 0: print(nb, " ".join(f"{k}={np.median(v)*1e6:.2f}" for k, v in t.items()), comm.last_algorithm, flush=True)
comm.close()

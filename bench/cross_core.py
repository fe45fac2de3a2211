"""How fast one rank reads what another rank just wrote (shared memory), next
to a copy of its own cached data: the bound on a shared-memory collective in
cache, where every byte must cross cores (issue 24's /memcpy goal).

    ringcomm run -n 2 python bench/cross_core.py

Rank 0 writes a buffer in a /dev/shm mapping (its lines are then in its
cache), both barrier, rank 1 copies it out (cross-core read), then copies
that copy (local). Median of 200 rounds per size.
"""
import mmap
import os
import time

import numpy as np
from mpi4py import MPI

w = MPI.COMM_WORLD
r = w.rank
name = f"/dev/shm/ringcomm-cross-core-{os.getuid()}-{os.getppid()}"
if r == 0:
    with open(name, "wb") as f:
        f.truncate(64 << 20)
w.Barrier()
with open(name, "r+b") as f:
    m = mmap.mmap(f.fileno(), 64 << 20)
w.Barrier()
if r == 0:
    os.unlink(name)  # mapped by both: nothing left behind
buf = np.frombuffer(m, dtype=np.uint8)
for size in (32 << 10, 256 << 10, 2 << 20, 16 << 20):
    a = buf[:size]
    loc, loc2 = np.empty(size, np.uint8), np.empty(size, np.uint8)
    tx, tl = [], []
    for it in range(200):
        if r == 0:
            a[:] = it & 255
        w.Barrier()
        if r == 1:
            t0 = time.perf_counter()
            np.copyto(loc, a)
            t1 = time.perf_counter()
            np.copyto(loc2, loc)
            tx.append(t1 - t0)
            tl.append(time.perf_counter() - t1)
        w.Barrier()
    if r == 1:
        print(f"{size:>10} B  cross-core read {size / np.median(tx) / 1e9:5.1f} GB/s   "
              f"local copy {size / np.median(tl) / 1e9:5.1f} GB/s", flush=True)
del a, buf
m.close()

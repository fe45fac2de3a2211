"""How fast one rank reads what another rank just wrote (shared memory), next
to a copy of its own cached data: the bound on a shared-memory collective in
cache, where every byte must cross cores (issue 24's /memcpy goal).

    ringcomm run -n 2 python bench/cross_core.py

Rank 0 writes a buffer in a /dev/shm mapping (its lines are then in its
cache), both barrier, rank 1 copies it out (cross-core read), then copies
that copy (local). Then both at once, as an all_reduce's ranks do: each
writes its own buffer, both barrier, each copies the other's out (the
slower rank's time). Median of 200 rounds per size.

At N = 2 an all_reduce of B bytes must bring B bytes per rank across
cores (half to reduce, half to gather): busbw <= both (printed as "single
copy", a fraction of the local copy rate: the bound for any algorithm, the
kernel's copies between processes included). Staged through shared slots
it must also copy half its own input in: busbw <= B / (B / both + B / 2 /
local) ("staged").
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
for size in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20):
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
    half = size // 2
    mine, theirs = buf[r * half:(r + 1) * half], buf[(1 - r) * half:(2 - r) * half]
    got = np.empty(half, np.uint8)
    tb = []
    for it in range(200):
        mine[:] = (it + r) & 255
        w.Barrier()
        t0 = time.perf_counter()
        np.copyto(got, theirs)
        tb.append(w.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if r == 1:
        x, loc, both = size / np.median(tx), size / np.median(tl), half / np.median(tb)
        staged = 1 / (1 / both + 0.5 / loc)
        print(f"{size:>10} B  cross-core read {x / 1e9:5.1f} GB/s   both at once {both / 1e9:5.1f} GB/s per rank   "
              f"local copy {loc / 1e9:5.1f} GB/s   all_reduce bound (x local copy): single copy "
              f"{both / loc:4.2f}, staged {staged / loc:4.2f}", flush=True)
del a, buf, mine, theirs
m.close()

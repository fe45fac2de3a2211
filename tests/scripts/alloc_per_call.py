"""Mallocs on the calling thread per collective, after warm-up (run under
mpirun with tests/scripts/malloc_count.c preloaded). Prints one JSON line
per rank: {case: mallocs over REPS calls}."""
import ctypes
import json
import sys

import numpy as np

import ringcomm

REPS = 300
calls = ctypes.CDLL(None).malloc_calls
calls.restype = ctypes.c_ulong

comm = ringcomm.init(timeout=60)
n = comm.size
calls()  # ctypes sets up its first call here, not inside a measurement
cases = {}
for label, count, algorithm in [("8 B auto", 2, "auto"), ("4 KiB auto", 1024, "auto"),
                                ("4 KiB ring", 1024, "ring"), ("4 KiB rd", 1024, "recursive_doubling"),
                                ("4 KiB hd", 1024, "halving_doubling"), ("1 MiB ring", 1 << 18, "ring"),
                                ("1 MiB hd", 1 << 18, "halving_doubling")]:
    x = np.arange(count, dtype=np.float32) + comm.rank
    y = np.empty_like(x)
    for _ in range(20):  # warm-up: scratch, staging, free lists reach their size
        comm.all_reduce(x, out=y, algorithm=algorithm)
    before = calls()
    for _ in range(REPS):
        comm.all_reduce(x, out=y, algorithm=algorithm)
    cases[label] = calls() - before
    # the result is still right
    want = np.arange(count, dtype=np.float32) * n + n * (n - 1) / 2
    if not np.array_equal(y, want):
        cases[label] = f"wrong result at index {int(np.flatnonzero(y != want)[0])}"
print("ALLOC " + json.dumps({"rank": comm.rank, "n": n, "reps": REPS, "cases": cases}), flush=True)
comm.close()
sys.exit(0)

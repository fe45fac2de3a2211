"""A message left in Open MPI's queue while its sender waits in shared memory
(tests/test_faults.py, N = 4 over the TCP BTL).

Open MPI's TCP connects lazily and only its progress engine sends. A ring call
on 0 elements needs nothing back: rank 1 sends its header to rank 2 (the first
message on that connection) and goes on to the next call, in the shared-memory
window, where it waits for rank 2. Rank 2, late, waits for that header. Unless
the window's wait keeps MPI progressing, neither moves again (a deadlock
found in CI, about 1 run in 10 of the suite over TCP; deterministic here with
rank 2 late by half a second)."""

import time

import numpy as np

import ringcomm

comm = ringcomm.init(timeout=10)
x = np.zeros(0, np.float16)
comm.all_reduce(x)                        # in the window
if comm.rank == 2:
    time.sleep(0.5)
comm.reduce_scatter(x, algorithm="ring")  # over MPI: rank 1's header to rank 2 needs nothing back
comm.all_reduce(x)                        # in the window: rank 1 waits here for rank 2
y = np.arange(5, dtype=np.float32) + comm.rank
comm.all_reduce(y, algorithm="ring")
assert np.array_equal(y, np.arange(5) * comm.size + sum(range(comm.size))), y
print("RESULT ok", comm.rank, comm.last_algorithm, flush=True)
comm.close()

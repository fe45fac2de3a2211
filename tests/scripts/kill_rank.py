"""A rank killed with SIGKILL in the middle of a collective (tests/test_faults.py).

All ranks run large all_reduces in a loop; rank 1 is killed by a timer thread
while one is in flight. The survivors must end (Open MPI tears the job down,
or they raise) within 10 s; the test measures it from the "KILL" line.
"""

import os
import signal
import threading
import time

import numpy as np

import ringcomm

comm = ringcomm.init(timeout=60)
x = np.arange(4 << 20, dtype=np.float32)
comm.all_reduce(x)
if comm.rank == 1:
    def die():
        print(f"KILL {time.monotonic()}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Timer(0.5, die).start()
while True:
    comm.all_reduce(x)

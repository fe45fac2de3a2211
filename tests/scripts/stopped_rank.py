"""Rank 1 is stopped (SIGSTOP) in a 64 MiB all_reduce, or just before it:
rank 0 times out, and its error says what rank 1 was doing.

    stopped_rank.py ALGORITHM inside|before

``inside``: rank 1 enters call #2 first (rank 0 comes 0.8 s later) and a
thread of its own stops the process 0.3 s in, while it waits in the call;
``before``: rank 1 stops itself just before it calls #2. Rank 1 prints
``PID <pid>``, rank 0 ``RESULT {json}`` with its error; the test then
resumes rank 1 (SIGCONT), which ends with the abort rank 0 published.
"""
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import ringcomm

algorithm, when = sys.argv[1], sys.argv[2]
comm = ringcomm.init(timeout=2)
x = np.ones(16 << 20, np.float32)  # 64 MiB
comm.all_reduce(x, algorithm=algorithm)  # #1
if comm.rank == 1:
    print("PID", os.getpid(), flush=True)
    if when == "inside":
        threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGSTOP)), daemon=True).start()
    else:
        os.kill(os.getpid(), signal.SIGSTOP)
elif when == "inside":
    time.sleep(0.8)
out = {"rank": comm.rank}
try:
    comm.all_reduce(x, algorithm=algorithm)  # #2
except ringcomm.RingcommError as e:
    out["error"] = str(e)
print("RESULT " + json.dumps(out), flush=True)

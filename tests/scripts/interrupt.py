"""Ctrl-C under mpirun (tests/test_faults.py).

Rank 1 joins late (LATE seconds); rank 0 waits in a collective (MODE: "sync"
all_reduce, "async": all_reduce(async_op=True).wait(), or "handler": a sync
all_reduce with a SIGINT handler of its own that calls comm.abort(), which
must neither hang nor be ignored; "recv": a blocking recv from rank 1, which
never sends; "sendrecv": a sendrecv with rank 1) and is sent SIGINT by the test, which reads
each rank's "PID" line first. Rank 0 must raise
KeyboardInterrupt within 0.5 s of the signal; the other ranks must fail
within one trip of the ring, not at their deadline (timeout=60 here).
Each rank prints "RESULT {json}" with time.monotonic() stamps (one clock for
every process of the machine).

usage: interrupt.py MODE [LATE_S]
"""

import json
import os
import signal
import sys
import time

import numpy as np

import ringcomm
from ringcomm import RingcommError

mode = sys.argv[1]
late = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
comm = ringcomm.init(timeout=60)
x = np.arange(100_000, dtype=np.float32)
comm.all_reduce(x)  # everyone is up
print(f"PID {comm.rank} {os.getpid()}", flush=True)
out = {"rank": comm.rank}
if comm.rank == 1:
    time.sleep(late)
if mode == "handler" and comm.rank == 0:
    signal.signal(signal.SIGINT, lambda *_: comm.abort())  # runs inside the waiting collective
t0 = time.monotonic()
try:
    if mode == "async":
        comm.all_reduce(x, async_op=True).wait()
    elif mode == "recv" and comm.rank == 0:  # a point-to-point wait (rank 1 never sends)
        comm.recv(np.zeros(100_000, np.float32), 1, tag=7)
    elif mode == "sendrecv" and comm.rank == 0:  # both ways with rank 1 (its send too large to go eagerly)
        comm.sendrecv(x, 1, np.zeros(100_000, np.float32), 1, tag=7)
    else:
        comm.all_reduce(x)
    out["outcome"] = "completed"
except KeyboardInterrupt:
    out["outcome"] = "KeyboardInterrupt"
except RingcommError as exc:
    out["outcome"] = type(exc).__name__
    out["message"] = str(exc)[:300]
    out["origin"] = exc.origin
out["raised_at"] = time.monotonic()
out["waited_s"] = out["raised_at"] - t0
out["aborted"] = comm.aborted
# The interrupted call's send to the late rank cannot be withdrawn: it is
# quarantined, and its array (x) held until it completes.
from ringcomm import quarantine  # noqa: E402
out["quarantined"] = ringcomm.quarantined()
out["held_arrays"] = quarantine.held_arrays()
print("RESULT " + json.dumps(out), flush=True)
comm.close()

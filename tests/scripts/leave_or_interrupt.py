"""A rank that stops while its peers go on (tests/test_faults.py).

    leave_or_interrupt.py loop COUNT      every rank loops on all_reduce of
        COUNT float32 until it raises; the test sends SIGINT to one rank,
        which may land anywhere in the loop (mostly between two calls when
        they are short). Prints "PID rank pid" once all are in the loop.
    leave_or_interrupt.py close COUNT     rank 1 runs 5 all_reduces, closes
        its communicator and stays alive 5 s (as in MPI_Finalize); the
        others call a 6th.
    leave_or_interrupt.py exit COUNT      the same, but rank 1 returns from
        the script (interpreter exit closes it).

Every rank but a leaving one writes $RESULTS_DIR/<rank>.json: what it
raised, its message, when (time.monotonic(), one clock for the machine's
processes) and how long it had waited in the call that raised.
"""

import json
import os
import sys
import time

import numpy as np

import ringcomm

mode, count = sys.argv[1], int(sys.argv[2])
comm = ringcomm.init(timeout=60)
x = np.arange(count, dtype=np.float32)
out = {"rank": comm.rank, "transport": comm.transport}
comm.all_reduce(x)  # everyone is up
print(f"PID {comm.rank} {os.getpid()}", flush=True)
if mode != "loop":
    for _ in range(5):
        comm.all_reduce(x)
    if comm.rank == 1:
        if mode == "close":
            comm.close()
            time.sleep(5)
        sys.exit(0)
t0 = time.monotonic()
try:
    while True:
        t0 = time.monotonic()
        comm.all_reduce(x)
        if mode != "loop":
            break
    out["outcome"] = "completed"
except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt included
    out["outcome"] = type(exc).__name__
    out["message"] = str(exc)[:500]
    out["origin"] = getattr(exc, "origin", None)
    raise
finally:
    out["raised_at"] = time.monotonic()
    out["waited_s"] = out["raised_at"] - t0  # in the call that raised
    # (a file: a rank that then dies of the exception may end the job before
    # the launcher forwarded its output)
    with open(os.path.join(os.environ["RESULTS_DIR"], f"{comm.rank}.json"), "w") as f:
        json.dump(out, f)

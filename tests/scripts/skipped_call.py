"""Rank 1 skips a collective after one that ran in the shared-memory window:
rank 0's timeout must name rank 1's newest call (#1), which the window knows
(its header never came: a call in the window sends none)."""
import json
import time

import numpy as np

import ringcomm

comm = ringcomm.init(timeout=2)
comm.all_reduce(np.ones(8, np.float32))  # #1: in the window
out = {"rank": comm.rank, "first": comm.last_algorithm}
if comm.rank == 0:
    try:
        comm.all_reduce(np.ones(1 << 16, np.float32), algorithm="ring")  # #2, by messages; rank 1 skips it
    except ringcomm.RingcommError as e:
        out["error"] = str(e)
print("RESULT " + json.dumps(out), flush=True)
time.sleep(3 if comm.rank else 0)  # (rank 1 stays until rank 0 has given up)

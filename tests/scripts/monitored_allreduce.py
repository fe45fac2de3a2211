"""Run under `ringcomm run` with Open MPI's pml monitoring on: a few ringcomm
all_reduces, then print this rank's ledger as one JSON line."""
import json
import sys

import numpy as np

import ringcomm

count, iters = int(sys.argv[1]), int(sys.argv[2])
algorithm = sys.argv[3] if len(sys.argv) > 3 else "ring"
comm = ringcomm.init()
x = np.arange(count, dtype=np.float32)
for _ in range(iters):
    comm.all_reduce(x, algorithm=algorithm)
t = comm.traffic()
print("LEDGER " + json.dumps({
    "rank": comm.rank,
    "algorithm": comm.last_algorithm,
    "payload_sent": t.per_peer("bytes_sent", kind="payload"),
    "control_sent": t.per_peer("bytes_sent", kind="control"),
    "msgs_sent": t.per_peer("msgs_sent", kind="all"),
}), flush=True)
comm.close()

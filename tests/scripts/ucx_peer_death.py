"""A rank that dies in the middle of a loop of all_reduces over UCX
(tests/test_ucx.py): its peers must raise at once, naming it, not at the
deadline (timeout=30 here), and close their communicator without hanging.

Run under mpirun with --enable-recovery (else mpirun itself ends the job
when the rank dies) and RINGCOMM_TRANSPORT=ucx. argv: how the rank dies
("sigkill" or "exit": os._exit), and an empty folder. Rank 1 dies 0.5 s
into the loop; every other rank prints "RESULT {json}": the exception's
type and text, and how long after the death it came and its close took.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import ringcomm

how, folder = sys.argv[1], sys.argv[2]
comm = ringcomm.init(timeout=30)
rank, comm_size, transport = comm.rank, comm.size, comm.transport
x = np.ones(1 << 20, dtype=np.float32)  # 4 MiB: rendezvous messages, segments in flight when it dies
comm.all_reduce(x)
t_death = time.monotonic() + 0.5  # one clock for every process of this host
if rank == 1:
    def die():
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(7)
    threading.Timer(0.5, die).start()
result = {"rank": rank, "transport": transport, "error": None}
try:
    while time.monotonic() < t_death + 60:  # (the loop ends by the error, or the test fails on "error": None)
        comm.all_reduce(x)
except ringcomm.RingcommError as e:
    result.update(error=type(e).__name__, text=str(e), after_s=round(time.monotonic() - t_death, 3))
t0 = time.monotonic()
comm.close()
del comm
result["close_s"] = round(time.monotonic() - t0, 3)
print("RESULT " + json.dumps(result), flush=True)
# Not MPI_Finalize: its fence would wait for the dead rank. And not before
# every survivor has printed: mpirun ends the job's other processes when one
# leaves without it.
open(os.path.join(folder, f"done.{rank}"), "w").close()
until = time.monotonic() + 30
while len(os.listdir(folder)) < comm_size - 1 and time.monotonic() < until:
    time.sleep(0.05)
os._exit(0)

"""One rank dies (tests/test_failfast.py): the others must raise
CommunicatorAborted naming it and its exception, and the job must end soon.

usage: failfast.py CASE [PEER]

Every rank does one all_reduce; then the last rank fails by CASE while the
others call a second all_reduce (PEER "wait"), or sleep 60 s outside
ringcomm (PEER "busy": nobody hears, the exit barrier's deadline ends the job).

  list   comm.all_reduce([1.0, 2.0]): InvalidArgument, uncaught
  raise  raise ValueError("boom on purpose")
  exit   sys.exit(1)

The failing rank prints ``FAILING <epoch seconds>`` to stderr just before it
fails; each other rank prints ``HEARD {json}`` when its call raises.
"""

import json
import sys
import time

import numpy as np

import ringcomm

case = sys.argv[1]
peer = sys.argv[2] if len(sys.argv) > 2 else "wait"
comm = ringcomm.init()
x = np.ones(4, np.float32)
comm.all_reduce(x)
if comm.rank == comm.size - 1:
    time.sleep(0.3)  # the others are waiting in their next call
    print(f"FAILING {time.time():.6f}", file=sys.stderr, flush=True)
    if case == "list":
        comm.all_reduce([1.0, 2.0])
    elif case == "raise":
        raise ValueError("boom on purpose")
    elif case == "exit":
        sys.exit(1)
    raise SystemExit(f"unknown case {case}")
if peer == "busy":
    time.sleep(60)
    sys.exit(0)
try:
    comm.all_reduce(x)
except ringcomm.CommunicatorAborted as e:
    print("HEARD " + json.dumps({"rank": comm.rank, "origin": e.origin, "t": time.time(),
                                 "message": str(e)}), file=sys.stderr, flush=True)
    raise
print(f"rank {comm.rank}: the second all_reduce returned", file=sys.stderr, flush=True)

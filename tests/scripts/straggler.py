"""A straggler under mpirun: the fault matrix of tests/test_faults.py.

Every rank runs all_reduces of COUNT float32 in a loop with a short timeout;
the last rank sleeps LATE seconds before call number CALL. The others time
out (or hear of it through the ring), then do what VARIANT says while the
straggler arrives:

  wait    stay alive (sleeping) until after it arrived, then exit
  next    keep calling collectives (each must fail at once), then exit
  close   close the communicator (with its quarantine of in-flight requests)
          and exit
  exit    exit at once (MPI_Finalize while the straggler still sleeps)

Each rank prints one line ``RESULT {json}`` with what it saw; the test reads
them. Every array a failed collective used is dropped and the memory reused
at once, so a late message that lands in freed memory or a send that reads
it crashes the process (the bug this guards against).

usage: straggler.py VARIANT [LATE_S] [COUNT] [CALL] [TIMEOUT_S]
"""

import gc
import json
import sys
import time

import numpy as np

import ringcomm
from ringcomm import RingcommError


def main() -> None:
    variant = sys.argv[1]
    late = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 64 * 1024
    call = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0

    comm = ringcomm.init(timeout=timeout)
    rank, n = comm.rank, comm.size
    straggler = n - 1
    out = {"rank": rank, "variant": variant, "calls_ok": 0}
    t_start = time.monotonic()
    for i in range(call + 1):
        if rank == straggler and i == call:
            time.sleep(late)
            out["arrived_s"] = time.monotonic() - t_start
        x = np.arange(count, dtype=np.float32) * (rank + 1)  # a fresh array every call
        t0 = time.monotonic()
        try:
            comm.all_reduce(x)
        except RingcommError as exc:
            out.update(error=type(exc).__name__, message=str(exc)[:400], error_after_s=time.monotonic() - t0,
                       origin=getattr(exc, "origin", None), peer=exc.peer, seq=exc.seq)
            break
        expect = np.arange(count, dtype=np.float32) * (n * (n + 1) // 2)
        if not np.array_equal(x, expect):
            out["wrong"] = i
            break
        out["calls_ok"] += 1
    # The failed call's array is given back to the program: it reuses it at
    # once (a sentinel it checks at the end: no late message may land in it).
    # Everything else is dropped and the heap churned, so memory a late send
    # could read from is reused too.
    reused = x
    reused[:] = -1.0
    del x
    gc.collect()
    junk = [np.full(count, 7, dtype=np.float32) for _ in range(8)]
    del junk

    if rank != straggler:
        if variant == "wait":
            time.sleep(late + 1.0)
        elif variant == "next":
            t_next, fast = time.monotonic(), []
            while time.monotonic() - t_next < late + 1.0:
                t0 = time.monotonic()
                try:
                    comm.all_reduce(np.ones(count, np.float32))
                    fast.append(-1.0)
                except RingcommError:
                    fast.append(time.monotonic() - t0)
                time.sleep(0.05)
            out["next_calls"] = len(fast)
            out["next_max_s"] = max(fast)
        elif variant == "close":
            t0 = time.monotonic()
            comm.close()
            out["close_s"] = time.monotonic() - t0
        # "exit": nothing more, MPI_Finalize runs at interpreter exit
    else:
        t0 = time.monotonic()
        comm.close()
        out["close_s"] = time.monotonic() - t0
    out["reused_intact"] = bool(np.all(reused == -1.0))
    out["pending_at_exit"] = ringcomm.quarantined()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

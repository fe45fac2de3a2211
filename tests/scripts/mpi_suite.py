"""The shared correctness suite over MPI as a plain script, for runs with
other Open MPI settings (tests/test_faults.py runs it over the TCP BTL, the
transport between machines). Prints "RESULT {json}" per rank."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import ringcomm  # noqa: E402
import suite  # noqa: E402

comm = ringcomm.init(timeout=60)
n = comm.size
errs, cases = [], 0
# Every case also checks the ledger against ringcomm.traffic.expected.
for sizes, seg in (([0, 1, max(n - 1, 0), n + 1], 1 << 20), ([7 * n + 3], 16), ([100003], 65536)):
    comm.segment_bytes = seg
    errs += suite.run_cases(comm, sizes)
    cases += len(sizes)
errs += suite.run_broadcasts(comm, [0, 1, n + 1, 100003], dtypes=["float32", "int8", "bfloat16"])
errs += suite.run_barrier(comm)
print("RESULT " + json.dumps({"rank": comm.rank, "cases": cases, "errors": errs}), flush=True)
comm.close()

"""ZeRO stages 1-3 against DDP under mpirun (tests/test_zero.py): the model of
tests/test_zero.py trained 4 steps per stage, float32 and float16; prints
"RESULT {json}" with the parameters that differ bitwise from DDP's (none)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import numpy as np  # noqa: E402

import ringcomm  # noqa: E402
from test_zero import train  # noqa: E402

comm = ringcomm.init(timeout=120)
diffs, cases = [], 0
for dtype in (np.float32, np.float16):
    ref = train(comm, 0, dtype)[0]
    for stage in (1, 2, 3):
        got = train(comm, stage, dtype, prefetch=(stage == 3))[0]
        cases += 1
        for i, (a, b) in enumerate(zip(ref, got)):
            if a.tobytes() != b.tobytes():
                diffs.append(f"rank {comm.rank} {np.dtype(dtype).name} stage {stage} parameter {i}")
print("RESULT " + json.dumps({"rank": comm.rank, "n": comm.size, "cases": cases, "differences": diffs}), flush=True)
comm.close()

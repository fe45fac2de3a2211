"""TorchZero (ZeRO-1/2/3 on a torch MLP) against DDP under mpirun
(tests/test_zero_torch.py): the model of tests/test_zero_torch.py trained 3
steps per stage, float32 and bfloat16; prints "RESULT {json}" with the
parameters that differ bitwise from the DDP reference (none)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import torch  # noqa: E402

import ringcomm  # noqa: E402
from test_zero_torch import differences, make_model, reference, train, unit_layout  # noqa: E402

comm = ringcomm.init(timeout=120)
diffs, cases = [], 0
for dtype in (torch.float32, torch.bfloat16):
    ref = reference(comm, dtype, unit_layout(make_model(dtype, 0)))
    for stage in (0, 1, 2, 3):
        got = train(comm, stage, dtype)[0]
        cases += 1
        diffs += differences(got, ref, f"rank {comm.rank} {dtype} stage {stage}")
print("RESULT " + json.dumps({"rank": comm.rank, "n": comm.size, "cases": cases, "differences": diffs}), flush=True)
comm.close()

"""torch.distributed backend "ringcomm" under real Open MPI, against gloo in the
same job (tests/scripts/torch_backend_check.py): every op (all reduce ops and
dtypes, sizes 0, 1, N-1, N+1, primes, multi-segment; sync and async; in-place
and non-contiguous forms), a subgroup, torch's DDP and FSDP2 (float32 and bf16
mixed precision) giving the same parameters as over gloo, the ledger against
what DDP moved, and errors reaching the caller within the group's timeout."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torch_backend_check.py")


@pytest.mark.parametrize("n", [2, 3])
def test_torch_backend_against_gloo(n):
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, SCRIPT]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    assert res.returncode == 0 and sorted(out) == list(range(n)), res.stdout[-3000:] + res.stderr[-3000:]
    fails = [f for d in out.values() for f in d["fails"]]
    assert not fails, "\n".join(fails)
    c = out[0]["counts"]
    for op in ("allreduce", "broadcast", "all_gather", "all_gather_single", "reduce_scatter",
               "reduce_scatter_single", "coalesced", "barrier", "unsupported", "ddp", "ledger", "fsdp2", "errors"):
        assert c.get(op, 0) > 0, f"no {op} cases ran"
    assert out[0]["env"] == {"RANK": "0", "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1"}
    print(f"\nn={n}: cases per op on rank 0 {c} (total {sum(c.values())}); DDP max |ringcomm - gloo| "
          f"{out[0]['ddp_diff']}; FSDP2 {out[0]['fsdp_diffs']}; ledger: {out[0]['ledger']}")


def test_backend_registered_on_import():
    import torch.distributed as dist

    import ringcomm.torch  # noqa: F401
    assert "RINGCOMM" in dist.Backend._plugins
    assert dist.Backend._plugins["RINGCOMM"].extended_api

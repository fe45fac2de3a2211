"""Point-to-point over MPI at 2 and 3 ranks, through `ringcomm run` (tests/scripts/p2p_mpi.py)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "p2p_mpi.py")


def run(n, *args):
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, SCRIPT, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    assert len(out) == n, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_p2p_over_mpi(n):
    out = run(n)
    errs = [e for d in out.values() for e in d["errors"]]
    assert not errs, errs


def test_p2p_size_mismatch_over_mpi_fails_both_sides():
    out = run(2, "mismatch")
    assert out[1]["mismatch"].startswith("MismatchError") and "40 bytes" in out[1]["mismatch"], out[1]
    assert out[0]["mismatch"] != "no error", out[0]
    # The sender is told which op failed where (not a collective that never ran).
    assert "rank 1's recv(count=8, dtype=float32, from rank 0, tag 3)" in out[0]["mismatch"], out[0]
    assert "all_reduce" not in out[0]["mismatch"], out[0]


@pytest.mark.parametrize("mode", ["tag", "tag_any"])
def test_p2p_tags_that_disagree_over_mpi_name_the_tag_sent(mode):
    """Rank 1 receives with tag 4 (from rank 0, or from any rank) what rank 0
    sent with tag 3: rank 1 times out naming the message that waits
    unreceived (its tag, size and dtype), and rank 0, in a barrier, hears
    which receive failed."""
    out = run(2, mode)
    got = out[1]["mismatch"]
    assert got.startswith("CollectiveTimeout"), out[1]
    assert ("a message from any rank" if mode == "tag_any" else "a message from rank 0") in got, out[1]
    assert "rank 0's next message to rank 1 has tag 3 (40 bytes (10 float32)) and waits unreceived" in got, out[1]
    assert out[0]["mismatch"] != "no error" and "tag 4" in out[0]["mismatch"], out[0]

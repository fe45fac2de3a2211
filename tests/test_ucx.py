"""The shared suites over the UCX transport, under real mpirun (N = 1..4):
tests/scripts/ucx_suite.py, one launch per phase, with RINGCOMM_TRANSPORT=ucx.
Skipped, with one reason, where UCX cannot be loaded."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ucx_suite.py")


@pytest.fixture(scope="module")
def ucx():
    """UCX's version, or the module skips (in a child: loading UCX here
    would put a copy in the test process that MPI's own could meet)."""
    res = subprocess.run([sys.executable, "-c", "from ringcomm import ucx; print(ucx.version())"],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        pytest.skip("UCX cannot be loaded: " + (lines[-1] if lines else f"exit {res.returncode}"))
    return res.stdout.strip()


def run(n, phase):
    env = dict(os.environ, RINGCOMM_TRANSPORT="ucx")
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, SCRIPT, phase]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    assert len(out) == n and res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    # UCX prints its warnings on stderr: none is expected (an unmatched
    # message left at close would be one).
    assert "UCX  WARN" not in res.stderr and "UCX  ERROR" not in res.stderr, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_suite_over_ucx(ucx, n):
    # Every collective and point-to-point at N ranks: results against numpy,
    # each call's ledger against traffic.expected, sizes 0, 1, N+-1, primes,
    # many segments; peers running ahead into the next call.
    out = run(n, "suite")
    assert all(d["transport"].startswith("ucx(") for d in out.values()), out
    errs = [e for d in out.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])


def test_faults_over_ucx(ucx):
    # A count and a dtype mismatch (MismatchError everywhere), a wrong-sized
    # point-to-point receive (both sides fail), a missing rank (a timeout
    # naming it), abort.
    out = run(3, "faults")
    errs = [e for d in out.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])


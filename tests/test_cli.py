"""The ringcomm command: info and run."""

import json
import subprocess
import sys

from ringcomm import cli


def ringcomm_cmd(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ringcomm.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_info_reports_versions_and_transports():
    res = ringcomm_cmd("info", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["ringcomm"] and "Open MPI" in d["mpi"]
    assert {"mpi", "inproc"} <= set(d["transports"])


def test_run_starts_n_ranks():
    code = "import ringcomm; c = ringcomm.init(); print('rank', c.rank, 'of', c.size)"
    res = ringcomm_cmd("run", "-n", "3", "--", "python", "-c", code)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(l for l in res.stdout.splitlines() if l.startswith("rank")) == [
        "rank 0 of 3", "rank 1 of 3", "rank 2 of 3"]


def test_run_defaults():
    cmd = cli.mpirun_command(64, ["python", "x.py"])
    assert cmd[1:3] == ["-n", "64"]
    assert "--oversubscribe" in cmd
    assert cmd[-2:] == [sys.executable, "x.py"]


def test_run_propagates_failure():
    res = ringcomm_cmd("run", "-n", "2", "--", "python", "-c", "import sys; sys.exit(3)")
    assert res.returncode != 0

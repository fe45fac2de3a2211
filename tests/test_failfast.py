"""A rank that dies of an uncaught exception or sys.exit(1) ends the job at
once, and every other rank's error names it and its exception
(ringcomm/_failfast.py), under real Open MPI.

Each case prints its figures (pytest -s): the job's wall time, and the time
from the failure (the failing rank's FAILING stamp) to the end of the job.
RINGCOMM_TIMEOUT is 120 s here: without fail-fast these jobs would last that
long (the peers' deadline), and Open MPI's shutdown with them.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from ringcomm.launch import mpirun_command
from tiers import slow_except

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "scripts", "failfast.py")
TIMEOUT = 120
ENV = dict(os.environ, RINGCOMM_TIMEOUT=str(TIMEOUT))
EXPECT = {"list": "InvalidArgument: all_reduce input: expected a numpy array",
          "raise": "ValueError: boom on purpose",
          "exit": "SystemExit(1)"}


def launch(n, case, peer="wait", runner=True):
    if runner:  # `ringcomm run`: the program runs under python -m ringcomm._failfast
        cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", "python", SCRIPT, case, peer]
    else:       # plain mpirun: only the hooks init() installs
        cmd = mpirun_command(n, [sys.executable, SCRIPT, case, peer])
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    end = time.time()
    wall = time.monotonic() - t0
    text = res.stdout + res.stderr
    stamps = [float(l.split()[1]) for l in res.stderr.splitlines() if l.startswith("FAILING ")]
    assert len(stamps) == 1, text[-4000:]
    heard = [json.loads(l[6:]) for l in res.stderr.splitlines() if l.startswith("HEARD ")]
    for h in heard:
        h["after_s"] = h["t"] - stamps[0]  # from the failure to this rank's error
    return res, text, wall, end - stamps[0], heard


@pytest.mark.parametrize("runner", [True, False], ids=["ringcomm-run", "plain-mpirun"])
@pytest.mark.parametrize("case", ["list", "raise", "exit"])
@pytest.mark.parametrize("n", slow_except([3], [2, 3]))
def test_a_rank_dying_ends_the_job_and_names_itself(n, case, runner):
    res, text, wall, after_failure, heard = launch(n, case, runner=runner)
    peers = ", ".join(f"{h['after_s'] * 1e3:.1f}" for h in heard)
    print(f"\nN={n} {case:5} {'ringcomm run' if runner else 'mpirun      '}: job {wall:.2f} s, "
          f"peers raised {peers} ms and the job ended "
          f"{after_failure:.2f} s after the failure; MPI_Abort used: {'MPI_ABORT' in text}")
    assert res.returncode != 0, text[-4000:]
    assert after_failure < 5.0, f"the job lasted {after_failure:.1f} s after the failure\n{text[-4000:]}"
    assert wall < TIMEOUT / 4
    failed = n - 1
    # every other rank raised CommunicatorAborted naming the failed rank and its exception
    assert sorted(h["rank"] for h in heard) == list(range(n - 1)), text[-4000:]
    for h in heard:
        assert h["origin"] == failed, h
        assert f"rank {failed} aborted the communicator" in h["message"], h
        assert "it died of" in h["message"] and EXPECT[case] in h["message"], h
        assert h["after_s"] < 1.0, h  # within one trip, not at the deadline
    assert "second all_reduce returned" not in text
    for bad in ("Segmentation", "core dumped"):
        assert bad not in text, text[-4000:]


@pytest.mark.parametrize("n", slow_except([3], [2, 3]))
def test_peers_busy_outside_ringcomm_are_ended_by_mpi_abort(n):
    # The others sleep 60 s outside any collective: nobody hears the ring, so
    # the failing rank's exit barrier gives up after GRACE and calls MPI_Abort.
    from ringcomm._failfast import GRACE
    res, text, wall, after_failure, heard = launch(n, "raise", peer="busy")
    print(f"\nN={n} busy peers: ended {after_failure:.2f} s after the failure (GRACE {GRACE} s)")
    assert res.returncode != 0
    assert "MPI_ABORT was invoked on rank" in text, text[-4000:]
    assert GRACE <= after_failure < GRACE + 5.0, text[-4000:]
    assert heard == []


def test_the_traceback_survives_a_hook_that_prints_after_ours(tmp_path):
    # torch.distributed's excepthook captures stderr while it calls ours and
    # prints the traceback (each line prefixed with the rank) after we return.
    # With no live communicator left, our MPI_Abort must wait for that
    # (the exit handler), else the job ends without the traceback.
    pytest.importorskip("torch")
    script = tmp_path / "torch_hook.py"
    script.write_text(
        "import gc, time, torch, torch.distributed as dist, ringcomm.torch\n"
        "dist.init_process_group('ringcomm')\n"
        "rank = dist.get_rank()\n"
        "t = torch.ones(2); dist.all_reduce(t)\n"
        "dist.destroy_process_group(); gc.collect()  # no communicator left\n"
        "if rank == 1:\n"
        "    raise ValueError('boom after destroy')\n"
        "time.sleep(60)\n")
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", "2", "--", "python", str(script)]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    wall = time.monotonic() - t0
    text = res.stdout + res.stderr
    assert res.returncode != 0, text[-4000:]
    assert "ValueError: boom after destroy" in text, text[-4000:]
    assert "MPI_ABORT was invoked on rank 1" in text, text[-4000:]
    assert wall < 30, f"the job lasted {wall:.1f} s (the other rank sleeps 60 s)\n{text[-4000:]}"


def test_runner_argv_wrapping():
    from ringcomm._failfast import wrap_argv
    assert wrap_argv(["python", "x.py", "a"]) == ["python", "-m", "ringcomm._failfast", "x.py", "a"]
    assert wrap_argv(["x.py"]) == ["python", "-m", "ringcomm._failfast", "x.py"]
    assert wrap_argv(["python3", "-u", "-X", "dev", "-m", "pkg.mod", "-v"]) == [
        "python3", "-u", "-X", "dev", "-m", "ringcomm._failfast", "-m", "pkg.mod", "-v"]
    assert wrap_argv(["python", "-c", "print(1)"]) == ["python", "-m", "ringcomm._failfast", "-c", "print(1)"]
    assert wrap_argv(["hostname"]) == ["hostname"]
    assert wrap_argv(["python"]) == ["python"]  # interactive: nothing to run


def test_runner_keeps_the_program_semantics(tmp_path):
    # sys.argv, sys.path[0], __name__, exit status, and a traceback without the runner's frames
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n"
                      "if sys.argv[1] == 'fail':\n    raise KeyError('k')\nsys.exit(int(sys.argv[1]))\n")
    ok = subprocess.run([sys.executable, "-m", "ringcomm._failfast", str(script), "3"], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 3
    assert ok.stdout.split() == ["__main__", "['3']", str(tmp_path)]
    bad = subprocess.run([sys.executable, "-m", "ringcomm._failfast", str(script), "fail"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1
    assert "KeyError: 'k'" in bad.stderr and "runpy" not in bad.stderr and "_failfast" not in bad.stderr


def test_runner_says_when_a_folder_shadows_the_package(tmp_path):
    # A script next to a folder named ringcomm/ (a checkout): with an editable
    # install (pip install -e .) plain python imports that folder and fails with
    # the AttributeError the README shows; `ringcomm run` says why first. With
    # the package on sys.path (PYTHONPATH, a regular install) nothing is
    # shadowed and nothing is said.
    (tmp_path / "ringcomm").mkdir()
    (tmp_path / "s.py").write_text("import ringcomm\nringcomm.run_local\n")
    plain = subprocess.run([sys.executable, str(tmp_path / "s.py")], capture_output=True, text=True, timeout=60)
    shadowed = "AttributeError: module 'ringcomm' has no attribute 'run_local'" in plain.stderr
    assert shadowed == (plain.returncode != 0), plain.stderr
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "1", "--", "python", "s.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    said = f"ringcomm: {tmp_path / 'ringcomm'} shadows the installed ringcomm" in res.stderr
    print(f"\nshadowed here: {shadowed}; ringcomm run said so: {said}")
    assert said == shadowed and (res.returncode != 0) == shadowed, res.stderr
    if "PYTHONPATH" not in os.environ:  # this suite's own install is editable (pip install -e ".[test]")
        assert shadowed

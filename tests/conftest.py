"""Test configuration shared by every test file.

MPI tests use the mpi-pytest plugin: a test marked ``@pytest.mark.parallel(n)``
is re-run by the plugin under ``mpiexec -n n``. The settings below make that
work unattended: the venv's Open MPI first on PATH, root allowed (CI runs as
root), oversubscription allowed, and short collective deadlines so that a bug
fails a test in seconds instead of hanging it.
"""

import os
import sys

_bin = os.path.dirname(sys.executable)
os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
os.environ.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
os.environ.setdefault("RINGCOMM_TIMEOUT", "60")

# The pytest process itself becomes an Open MPI singleton: the mpi-pytest
# plugin imports mpi4py.MPI as it loads. Its automatic loading is off
# (pyproject.toml: -p no:mpi-pytest); MPI starts here through ringcomm's door
# first, so that singleton runs with btl=self and leaves no
# /dev/shm/sm_segment.* file behind (Open MPI 5.0.11 never unlinks a
# singleton's; ringcomm/_singleton.py), then the plugin is loaded.
from ringcomm import _singleton  # noqa: E402

_singleton.mpi()
pytest_plugins = ["pytest_mpi.plugin"]


import pytest  # noqa: E402

NO_GPU_PREFIX = "the GPU tests need a GPU"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # pytest -ra lists skips per (file, line, reason): give every GPU test's
    # skip one location, so a machine without a GPU gets one short line.
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and isinstance(rep.longrepr, tuple) and NO_GPU_PREFIX in str(rep.longrepr[2]):
        rep.longrepr = (rep.fspath, 1, rep.longrepr[2])


# Nothing left behind (issue 25): no run of ringcomm, by any launcher or none,
# successful or failed, may leave a file in /dev/shm. Every launch of the suite
# (mpirun, torchrun, plain processes, faults) is covered by this one count.
LEAKS = ("ringcomm", "sm_segment", "ucx")


def _shm_names() -> set:
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith(LEAKS)}
    except OSError:
        return set()


_shm_at_start = _shm_names()


def _in_use() -> set:
    """Names in /dev/shm some live process maps now (another job's, or a job
    of ours still ending): not left behind."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        used.add(line[i + 9:].split(" (deleted)")[0].strip())
        except OSError:
            pass
    return used


def pytest_sessionfinish(session, exitstatus):
    import time
    if os.environ.get("_PYTEST_MPI_CHILD_PROCESS"):
        return  # a rank of mpi-pytest's job: the session that launched it counts, once the job is over
    left = _shm_names() - _shm_at_start
    if left:
        time.sleep(2)  # a file another job on this machine is still using goes away
        left &= _shm_names()
        left -= _in_use()
    if left:
        print(f"\nFAILED: the test session left {len(left)} file(s) in /dev/shm: {sorted(left)[:10]}",
              file=sys.stderr)
        session.exitstatus = 1

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
pytest_plugins = ["pytest_mpi.plugin", "shm_hygiene"]


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
# (mpirun, torchrun, plain processes, faults) is covered by one count at the
# end of the session, of the files this session's own processes made (another
# job on the machine cannot fail it): tests/shm_hygiene.py, loaded above.

"""Test configuration shared by every test file.

MPI tests use the mpi-pytest plugin: a test marked ``@pytest.mark.parallel(n)``
is re-run by the plugin under ``mpiexec -n n``. The settings below make that
work unattended: the venv's Open MPI first on PATH, root allowed (CI runs as
root), oversubscription allowed, and short collective deadlines so that a bug
fails a test in seconds instead of hanging it.

Two tiers (pyproject.toml's addopts: ``-m "not slow"``):

* the default tier, ``python -m pytest`` (the README's command, CI's first
  run): every collective, transport and failure kind at least once, with a
  cheap representative of each parametrization (world sizes 1, 2, 3 and one
  larger, one dtype sweep); aimed at about 10 minutes on an idle 2-core machine;
* the slow tier, marker ``slow`` (``@pytest.mark.slow`` on a test, or
  ``pytest.param(..., marks=pytest.mark.slow)`` on a case): the rest of each
  sweep (world sizes, sizes, dtypes), soaks, kills at random moments, the
  32- and 64-rank worlds, repeated variants. ``python -m pytest -m slow`` runs
  it (CI's second run), ``python -m pytest -m ""`` runs both.

Every test is in exactly one tier (slow or not), and tiering moves a test,
never drops it. Naming tests by node id (``pytest 'tests/test_inproc.py::test_many_segments[64]'``)
runs them whatever their tier.
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


def pytest_configure(config):
    # The tiers (docstring). A rank of mpi-pytest's job (it re-runs one test
    # by node id under mpiexec, with the same addopts) runs its test whatever
    # the tier; so does a run that names only node ids and leaves -m as the
    # default tier's.
    named = config.args and all("::" in a for a in config.args)
    if os.environ.get("_PYTEST_MPI_CHILD_PROCESS") or (named and config.option.markexpr == "not slow"):
        config.option.markexpr = ""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # @pytest.mark.slow_nprocs(4, 5) on a test marked parallel([...]): those
    # world sizes of it are in the slow tier (before -m selects the tier).
    for item in items:
        sizes = item.get_closest_marker("slow_nprocs")
        if sizes is not None:
            nprocs = getattr(item, "callspec", None) and item.callspec.params.get("_nprocs")
            if nprocs is None:
                raise pytest.UsageError(f"{item.nodeid}: slow_nprocs on a test not marked parallel with several sizes")
            if nprocs in sizes.args:
                item.add_marker(pytest.mark.slow)


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

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

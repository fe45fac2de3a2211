"""``python -m ringcomm.benchmark [options]``: one rank of the benchmark
(run under mpirun; `ringcomm bench` launches it)."""

import sys

from .cli import run_mpi

sys.exit(run_mpi())

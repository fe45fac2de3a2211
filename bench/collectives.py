"""nccl-tests-style collective benchmark: ringcomm vs Open MPI vs Gloo.

    mpirun -n 4 python bench/collectives.py -b 8 -e 64M -f 4
    ringcomm bench            # the same, launching 4 ranks itself (plus mpi-ring)

See bench/README.md for the columns; the harness is the ringcomm.benchmark package.
"""
import sys

from ringcomm.benchmark import run_mpi

if __name__ == "__main__":
    sys.exit(run_mpi())

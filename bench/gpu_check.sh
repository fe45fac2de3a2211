#!/usr/bin/env bash
# The GPU checks, as one script for a machine with a GPU (CUDA 13, the
# nvidia-nccl-cu13 and cupy-cuda13x wheels installed, no network needed if the
# build dependencies are there). Builds ringcomm with the CUDA extension, runs
# the GPU tests and the kernel bandwidth benchmark, prints a summary.
# Usage: bash bench/gpu_check.sh      (about 2-4 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
echo "== build (RINGCOMM_CUDA=1: a missing toolchain is an error)"
RINGCOMM_CUDA=1 $PY setup.py build_ext --inplace 2>&1 | grep "ringcomm setup" || exit 1
$PY -c "import ringcomm.cuda as c; print('cuda:', c.status()); assert c.available()" || exit 1
echo "== GPU tests"
$PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -5
tests=${PIPESTATUS[0]}
echo "== kernel bandwidth vs device-to-device copy (target ratio >= 0.9)"
$PY bench/gpu_kernels.py --bytes 256M --reps 20
bench=$?
echo "== summary: tests exit ${tests}, kernel bench exit ${bench}"
exit $(( tests || bench ))

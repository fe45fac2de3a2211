#!/usr/bin/env bash
# The GPU checks, as one script for a machine with a GPU (CUDA 13, the
# nvidia-nccl-cu13 and cupy-cuda13x wheels installed, no network needed if the
# build dependencies are there). Builds ringcomm with the CUDA extension, runs
# the GPU tests (kernels, the ring on one GPU through the in-process device
# transport at N = 1..8, stream semantics, bad input, NCCL transport with one
# rank per GPU), the kernel bandwidth benchmark, the in-process N = 4 ring
# against its bytes-moved bound and a short ringcomm-vs-NCCL benchmark; prints
# a summary. Usage: bash bench/gpu_check.sh      (about 3-5 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== build (RINGCOMM_CUDA=1: a missing toolchain is an error)"
RINGCOMM_CUDA=1 $PY setup.py build_ext --inplace 2>&1 | grep -E "ringcomm setup|error" || exit 1
$PY -c "import ringcomm.cuda as c; print('cuda:', c.status()); assert c.available()" || exit 1
echo "== GPU tests"
timeout 240 $PY -m pytest -q -p no:cacheprovider -x tests/test_cuda.py 2>&1 | tail -15
tests=${PIPESTATUS[0]}
echo "== kernel bandwidth vs device-to-device copy (target ratio >= 0.9)"
timeout 60 $PY bench/gpu_kernels.py --bytes 256M --reps 20
kern=$?
echo "== in-process ring all_reduce, N = 4 on one GPU, 256 MiB (target measured/bound <= 1.3)"
timeout 90 $PY bench/gpu_ring.py -n 4 --bytes 256M --reps 10
ring=$?
echo "== ringcomm over NCCL p2p vs NCCL's all_reduce, one rank per GPU"
NGPU=$($PY -c "import ringcomm.cuda as c; print(min(c.device_count(), 8))")
timeout 90 $PY -m ringcomm.cli bench -N "$NGPU" --device cuda -b 1M -e 256M -f 16 -r 3 2>&1 | tail -12
nccl=${PIPESTATUS[0]}
echo "== summary: tests exit ${tests}, kernel bench exit ${kern}, ring bench exit ${ring}, nccl bench exit ${nccl}"
exit $(( tests || kern || ring || nccl ))

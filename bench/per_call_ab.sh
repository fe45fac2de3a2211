#!/usr/bin/env bash
# Per-call cost of two builds side by side, alternating (this machine is noisy):
#   bash bench/per_call_ab.sh BEFORE_TREE AFTER_TREE [ROUNDS]
# Each tree is a checkout with its extension built in place (python setup.py
# build_ext --inplace). Per round and tree: bench/lat_ab.py at N = 2 and 4
# (8 B and 4 KiB all_reduce against MPI_Allreduce, interleaved in one job)
# and bench/torch_backend.py at N = 2 (the torch backend's all_reduce of 8 B,
# 4 MiB, 64 MiB against gloo and a direct comm.all_reduce; no rooted
# collectives, no DDP). Compare the same-job ratios, not absolute times:
# this machine's timings move together between runs.
set -u
before=$(realpath "$1"); after=$(realpath "$2"); rounds=${3:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd /tmp  # (no checkout on the path but the one PYTHONPATH names)
for round in $(seq "$rounds"); do
  for t in "before:$before" "after:$after"; do
    label=${t%%:*}; tree=${t#*:}
    for n in 2 4; do
      PYTHONPATH=$tree mpirun --oversubscribe -n $n -x PYTHONPATH python "$tree/bench/lat_ab.py" "$label-r$round" 2>&1 | grep "N="
    done
    PYTHONPATH=$tree mpirun --oversubscribe -n 2 -x PYTHONPATH python "$tree/bench/torch_backend.py" \
        --rooted-sizes "" --ddp-steps 0 --reps 7 2>&1 | grep -iv warn | sed "s/^/[$label-r$round] /"
  done
done

"""all_to_all in the shared-memory window: single copy or the slots, by the
pages the arrays lie in (the kernel pins every page it copies out of the
sender's array: which way is faster depends on them, and on the machine).

    ringcomm run -n 2 -- python bench/a2a_pages.py IN OUT SIZE [SIZE ...]

IN, OUT: "huge" (transparent huge pages asked for, as numpy does for arrays
from 4 MiB) or "small" (4 KiB pages, as torch's CPU tensors) for the input
and the output arrays; SIZE: bytes of one rank's input (float32, equal
blocks). Per size, 9 interleaved repetitions (a barrier before every timed
call), the median of the per-call medians (slowest rank), us:
  single  algorithm="shm" with every block by single copy (process_vm_readv)
  slots   algorithm="shm" with single copy off: every block through the slots
          (the equal blocks' rounds; the per-peer rounds auto runs for a
          block in 4 KiB pages from the limit measured the same within 4 %:
          bench/README.md, "The sender's pages")
  mpi     MPI_Alltoall
Every implementation's result is checked against numpy once.
"""
import sys

import numpy as np
from mpi4py import MPI

import _timing  # (bench/, the script's folder)
import ringcomm
from ringcomm.tuning.tune import array_in_pages

w = MPI.COMM_WORLD
comm = ringcomm.init()
n, r = comm.size, comm.rank
win = comm._engine.window
pages_in, pages_out = sys.argv[1], sys.argv[2]
if {pages_in, pages_out} - {"huge", "small"}:
    raise SystemExit("usage: a2a_pages.py huge|small huge|small SIZE [SIZE ...]")


def limits(single: int, f) -> None:
    """f() with the window's single-copy limits set to `single` (every rank alike)."""
    on = win.single_copy_min, win.single_copy_min_4k
    win.single_copy_min = win.single_copy_min_4k = single
    try:
        f()
    finally:
        win.single_copy_min, win.single_copy_min_4k = on


if r == 0:
    print(f"# N = {n}, all_to_all, input in {pages_in} pages, output in {pages_out} pages, "
          f"median of 9 interleaved reps (us per call, slowest rank)")
    print(f"{'bytes':>10} {'single':>10} {'slots':>10} {'mpi':>10} {'slots/single':>13}")
for size in [int(float(a)) for a in sys.argv[3:]]:
    total = size // 4 // n * n
    x = array_in_pages(total, pages_in == "huge")  # (madvise'd mappings of their own)
    x[:] = (np.arange(total) * 3 + 1000 * r) % 4099
    out = array_in_pages(total, pages_out == "huge")
    impls = {"single": lambda: limits(1, lambda: comm.all_to_all(x, out=out, algorithm="shm")),
             "slots": lambda: limits(1 << 62, lambda: comm.all_to_all(x, out=out, algorithm="shm")),
             "mpi": lambda: w.Alltoall(x, out)}
    k = total // n
    want = np.concatenate([((np.arange(total) * 3 + 1000 * q) % 4099)[r * k:(r + 1) * k] for q in range(n)])
    _timing.check_each(impls, out, want, r, f"{size} bytes")
    _timing.warm_up(w, impls)
    iters = max(3, min(500, int(2e8 // max(size, 1) // 20)))
    got, med = _timing.interleaved(w, impls, iters, 9)
    if r == 0:
        print(f"{size:>10} {med['single']:>10.1f} {med['slots']:>10.1f} {med['mpi']:>10.1f} "
              f"{med['slots'] / med['single']:>13.2f}", flush=True)
comm.close()

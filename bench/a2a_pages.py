"""A collective in the shared-memory window: single copy or the slots, by
the pages the arrays lie in (the kernel pins every page it copies out of, or
into, a peer's array: which way is faster depends on them, and on the
machine).

    ringcomm run -n 2 -- python bench/a2a_pages.py [--collective C] IN OUT SIZE [SIZE ...]

C: all_to_all (the default), scatter, gather, all_gather or reduce (root 0;
float32 sum, out of place).
IN, OUT: "huge" (transparent huge pages asked for, as numpy does for arrays
from 4 MiB) or "small" (4 KiB pages, as torch's CPU tensors) for the input
and the output arrays (scatter: the root's input; gather: the root's
output); SIZE (4096, 64K, 1M): bytes of one rank's all_to_all and reduce
input, of scatter's input and gather's and all_gather's output (float32,
equal blocks). Per size, 9
interleaved repetitions (a barrier before every timed call), the median of
the per-call medians (slowest rank), us:
  single  algorithm="shm" with every block by single copy (process_vm_readv,
          gather's process_vm_writev; reduce: its single-copy parts)
  slots   algorithm="shm" with single copy off: every block through the slots
          (all_to_all: the equal blocks' rounds; the per-peer rounds auto runs
          for a block in 4 KiB pages from the limit measured the same within
          4 %: bench/README.md, "The sender's pages")
  chosen  algorithm="shm" with the window's own limits: what auto runs in
          the window at that size (the 4 KiB rule: shm.cpp)
  mpi     MPI_Alltoall, MPI_Scatter, MPI_Gather, MPI_Allgather, MPI_Reduce
Every implementation's result is checked against numpy once.
"""
import sys

import numpy as np
from mpi4py import MPI

import _timing  # (bench/, the script's folder)
import ringcomm
from ringcomm.config import parse_size
from ringcomm.tuning.tune import array_in_pages

w = MPI.COMM_WORLD
comm = ringcomm.init()
n, r = comm.size, comm.rank
win = comm._engine.window
args = sys.argv[1:]
coll = "all_to_all"
if args[:1] == ["--collective"]:
    coll, args = args[1], args[2:]
if coll not in ("all_to_all", "scatter", "gather", "all_gather", "reduce") or len(args) < 3 or \
        {args[0], args[1]} - {"huge", "small"}:
    raise SystemExit("usage: a2a_pages.py [--collective all_to_all|scatter|gather|all_gather|reduce] "
                     "huge|small huge|small SIZE [SIZE ...]")
pages_in, pages_out = args[0], args[1]
try:
    sizes = [parse_size(a) for a in args[2:]]
except ValueError as e:
    raise SystemExit(f"a2a_pages.py: {e}") from None


def limits(single: int, f) -> None:
    """f() with the window's single-copy limits set to `single` (every rank alike)."""
    on = win.single_copy_min, win.single_copy_min_4k
    win.single_copy_min = win.single_copy_min_4k = single
    try:
        f()
    finally:
        win.single_copy_min, win.single_copy_min_4k = on


def data(count: int, q: int) -> np.ndarray:
    return ((np.arange(count) * 3 + 1000 * q) % 4099).astype(np.float32)


def case(total: int):
    """(ringcomm's call, MPI's call, the array the result lands in, numpy's result)."""
    k = total // n
    if coll == "all_to_all":
        x, out = array_in_pages(total, pages_in == "huge"), array_in_pages(total, pages_out == "huge")
        x[:] = data(total, r)
        want = np.concatenate([data(total, q)[r * k:(r + 1) * k] for q in range(n)])
        return (lambda: comm.all_to_all(x, out=out, algorithm="shm")), (lambda: w.Alltoall(x, out)), out, want
    if coll == "reduce":  # (values small enough that every float32 sum is exact)
        x, out = array_in_pages(total, pages_in == "huge"), array_in_pages(total, pages_out == "huge")
        x[:] = data(total, r)
        want = sum(data(total, q) for q in range(n)) if r == 0 else np.full(total, -1, np.float32)
        root_out = out if r == 0 else None
        return (lambda: comm.reduce(x, 0, out=root_out, algorithm="shm")), \
            (lambda: w.Reduce(x, root_out, root=0)), out, want
    if coll == "scatter":
        x = array_in_pages(total, pages_in == "huge") if r == 0 else None
        if r == 0:
            x[:] = data(total, 0)
        out = array_in_pages(k, pages_out == "huge")
        return (lambda: comm.scatter(x, out=out, algorithm="shm")), (lambda: w.Scatter(x, out, root=0)), out, \
            data(total, 0)[r * k:(r + 1) * k]
    x = array_in_pages(k, pages_in == "huge")
    x[:] = data(k, r)
    want = np.concatenate([data(k, q) for q in range(n)])
    if coll == "all_gather":
        out = array_in_pages(total, pages_out == "huge")
        return (lambda: comm.all_gather(x, out=out, algorithm="shm")), (lambda: w.Allgather(x, out)), out, want
    out = array_in_pages(total, pages_out == "huge")  # (gather: used on the root; elsewhere stays -1)
    root_out = out if r == 0 else None
    return (lambda: comm.gather(x, out=root_out, algorithm="shm")), (lambda: w.Gather(x, root_out, root=0)), \
        out, want if r == 0 else np.full(total, -1, np.float32)


if r == 0:
    print(f"# N = {n}, {coll}, input in {pages_in} pages, output in {pages_out} pages, "
          f"median of 9 interleaved reps (us per call, slowest rank)")
    print(f"{'bytes':>10} {'single':>10} {'slots':>10} {'chosen':>10} {'mpi':>10} {'slots/single':>13} "
          f"{'chosen/mpi':>11}")
for size in sizes:
    total = max(n, size // 4 // n * n)
    ours, mpi, out, want = case(total)
    impls = {"single": lambda: limits(1, ours), "slots": lambda: limits(1 << 62, ours), "chosen": ours, "mpi": mpi}
    _timing.check_each(impls, out, want, r, f"{coll} {size} bytes")
    _timing.warm_up(w, impls)
    iters = max(3, min(500, int(2e8 // max(size, 1) // 20)))
    got, med = _timing.interleaved(w, impls, iters, 9)
    if r == 0:
        print(f"{size:>10} {med['single']:>10.1f} {med['slots']:>10.1f} {med['chosen']:>10.1f} {med['mpi']:>10.1f} "
              f"{med['slots'] / med['single']:>13.2f} {med['chosen'] / med['mpi']:>11.2f}", flush=True)
comm.close()

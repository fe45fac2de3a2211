"""all_to_all with per-peer splits (torch's all_to_all_single with split
sizes, a mixture-of-experts dispatch): the shared-memory window by single
copy and through its slots against pairwise exchange over MPI
point-to-point and Open MPI's MPI_Alltoallv.

    ringcomm run -n 4 -- python bench/all_to_all_v.py [MIN [MAX [REPS]]] [--small-pages]

--small-pages: arrays in 4 KiB pages, as torch's CPU tensors (numpy asks
for transparent huge pages from 4 MiB, which makes single copy cheaper:
bench/README.md).

Sizes are one rank's input (bytes, float32), split unevenly but
deterministically: rank q sends rank p a share proportional to
1 + (q + 2p) % 3 (every rank's total the same, the blocks not). Per size,
interleaved repetitions (a barrier before every timed call of every
implementation), the median over REPS of the per-call median (slowest
rank), us:
  shm       ringcomm algorithm="shm" (blocks from the window's single-copy
            limit read straight from the peer's array, the others through
            the slots; sizes checked first)
  slots     the same with single copy off for the call: every block
            through the slots
  pairwise  ringcomm algorithm="pairwise" (n - 1 exchange steps over MPI)
  auto      ringcomm's default; `chose` says what it ran
  mpi       MPI_Alltoallv
Every call's result is checked against numpy once.
"""
import sys

import numpy as np

small_pages = "--small-pages" in sys.argv
if small_pages:
    sys.argv.remove("--small-pages")
from mpi4py import MPI

import _timing  # (bench/, the script's folder)
import ringcomm
from ringcomm.tuning.tune import array_in_pages

w = MPI.COMM_WORLD
comm = ringcomm.init()
n, r = comm.size, comm.rank
lo = int(float(sys.argv[1])) if len(sys.argv) > 1 else 8
hi = int(float(sys.argv[2])) if len(sys.argv) > 2 else 4 << 20
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 7


def splits_of(q: int, total: int) -> list[int]:
    """What rank q sends to each rank (elements, summing to `total`)."""
    weights = [1 + (q + 2 * p) % 3 for p in range(n)]
    s = [total * wt // sum(weights) for wt in weights]
    s[q] += total - sum(s)
    return s


def slots_only(f):
    """f() with the window's single copy off (every rank alike)."""
    window = comm._engine.window
    on, window.single_copy_min = window.single_copy_min, 1 << 62
    try:
        f()
    finally:
        window.single_copy_min = on


if r == 0:
    print(f"# N = {n}, float32, per-peer splits, median of {reps} interleaved reps (us per call, slowest rank)")
    print(f"{'bytes':>10} {'shm':>10} {'slots':>10} {'pairwise':>10} {'auto':>10} {'mpi':>10} {'shm/pw':>8} "
          f"{'auto/mpi':>8}  chose")
size = lo
while size <= hi:
    total = max(n, size // 4)
    m = [splits_of(q, total) for q in range(n)]
    send = m[r]
    recv = [m[q][r] for q in range(n)]
    x = (np.arange(total, dtype=np.float32) * 3 + 1000 * r) % 4099
    out = np.empty(sum(recv), np.float32)
    if small_pages:  # (madvise'd mappings of their own, never in huge pages)
        x, out = array_in_pages(total, False), array_in_pages(sum(recv), False)
        x[:] = (np.arange(total, dtype=np.float32) * 3 + 1000 * r) % 4099
    sdisp = np.concatenate([[0], np.cumsum(send)[:-1]]).astype(np.int64)
    rdisp = np.concatenate([[0], np.cumsum(recv)[:-1]]).astype(np.int64)
    impls = {"shm": lambda: comm.all_to_all(x, send, recv, out=out, algorithm="shm"),
             "slots": lambda: slots_only(lambda: comm.all_to_all(x, send, recv, out=out, algorithm="shm")),
             "pairwise": lambda: comm.all_to_all(x, send, recv, out=out, algorithm="pairwise"),
             "auto": lambda: comm.all_to_all(x, send, recv, out=out),
             "mpi": lambda: w.Alltoallv([x, send, sdisp, MPI.FLOAT], [out, recv, rdisp, MPI.FLOAT])}
    # every implementation's result, once, against numpy
    want = np.concatenate([((np.arange(total, dtype=np.float32) * 3 + 1000 * q) % 4099)
                           [sum(m[q][:r]):sum(m[q][:r + 1])] for q in range(n)])
    _timing.check_each(impls, out, want, r, f"{size} bytes")
    iters = max(3, min(500, int(2e8 // max(size, 1) // 20)))
    got, med = _timing.interleaved(w, impls, iters, reps)
    impls["auto"]()
    chose = comm.last_algorithm
    if r == 0:
        print(f"{size:>10} {med['shm']:>10.1f} {med['slots']:>10.1f} {med['pairwise']:>10.1f} {med['auto']:>10.1f} {med['mpi']:>10.1f} "
              f"{med['shm'] / med['pairwise']:>8.2f} {med['auto'] / med['mpi']:>8.2f}  {chose}", flush=True)
    size *= 8
comm.close()

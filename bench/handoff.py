"""How fast one core reads what another core just wrote: the cost of every
round through the shared-memory window's slots (and of single copy when the
sender's array is new), against reading bytes the reader read before (single
copy in a benchmark that sends the same array again).

    python bench/handoff.py [SIZE] [--launches K]

Two processes on two cores (the first two this process may run on) share a mapping of SIZE bytes (default
256 KiB, a slot). Per repetition, timed on the writer:
  written    the writer copies SIZE bytes into the mapping, raises a flag;
             the reader copies them out and answers (a slot's round: one
             core writes, the other reads)
  unchanged  the same without the writer's copy: the reader copies out
             bytes it copied before (its core still holds the lines, as a
             reader of an array sent again unchanged does)
Each launch prints the medians of 400 repetitions, us. --launches K starts
K fresh pairs of processes: on a virtual machine the first mode can differ
severalfold between launches (bench/README.md, "The slots' handoff").
"""
import argparse
import mmap
import os
import time

import numpy as np

from ringcomm.config import parse_size

REPS = 400


def one_launch(size: int, cores: tuple[int, int]) -> tuple[float, float]:
    shared = mmap.mmap(-1, size + 4096)
    flag = np.frombuffer(shared, np.int64, 2, 0)  # [request, answer]
    buf = np.frombuffer(shared, np.uint8, size, 4096)
    buf[:] = 0
    flag[:] = 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reader, on the second core
        os.close(r)
        os.sched_setaffinity(0, {cores[1]})
        mine = np.empty(size, np.uint8)
        mine[:] = 1
        os.write(w, b"x")
        give_up = time.monotonic() + 60  # (the writer died: never spin on forever)
        for k in range(1, 2 * REPS + 1):
            spins = 0
            while flag[0] != k:
                spins += 1
                if spins % 100000 == 0 and time.monotonic() > give_up:
                    os._exit(1)
            np.copyto(mine, buf)
            flag[1] = k
        os._exit(0)
    os.close(w)
    os.sched_setaffinity(0, {cores[0]})
    os.read(r, 1)
    src = np.full(size, 2, np.uint8)
    times = {"written": [], "unchanged": []}
    k = 0
    for mode in ("written", "unchanged"):
        for _ in range(REPS):
            k += 1
            t0 = time.perf_counter()
            if mode == "written":
                np.copyto(buf, src)
            flag[0] = k
            while flag[1] != k:
                pass
            times[mode].append(time.perf_counter() - t0)
    os.waitpid(pid, 0)
    return float(np.median(times["written"]) * 1e6), float(np.median(times["unchanged"]) * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("size", nargs="?", default="256K")
    p.add_argument("--launches", type=int, default=1)
    a = p.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("bench/handoff.py needs two cores")
    cores = (allowed[0], allowed[1])
    size = parse_size(a.size)
    print(f"# {size} B, cores {cores[0]} and {cores[1]}, {REPS} repetitions per mode, medians, us")
    print(f"{'launch':>6} {'written':>9} {'unchanged':>10} {'ratio':>6}")
    for i in range(a.launches):
        written, unchanged = one_launch(size, cores)
        print(f"{i + 1:>6} {written:>9.1f} {unchanged:>10.1f} {written / unchanged:>6.2f}", flush=True)


if __name__ == "__main__":
    main()

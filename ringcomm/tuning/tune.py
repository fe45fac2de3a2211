"""``ringcomm tune``: measure the cost model's constants on this machine.

Times every all_reduce algorithm at a few sizes (interleaved repetitions,
median of the slowest rank) over MPI (N ranks under mpirun) and in process,
fits alpha, beta and gamma to each set (selection.fit) and writes them,
with the measurements, to the cache file that ``algorithm="auto"`` reads
(selection.tune_path()). A communicator with as many ranks as a run here
chooses by those measurements (selection.Measured); others by the fitted
constants. Two ranks are enough to identify all three constants (recursive
doubling, the ring and the master-centric scheme weigh steps, bytes sent and
bytes reduced differently); the default also measures 4 ranks, which may
outnumber the cores and then cost what they cost there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import subprocess
import sys
import time

import numpy as np

from .. import algorithms
from . import selection
from ..launch import mpirun_command

SIZES = (8, 256, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


def measure(comm, sizes=SIZES, reps: int = 5, budget_s: float = 0.05, barrier=None) -> list[dict]:
    """Rows {"algorithm", "n", "bytes", "seconds"} measured on `comm` (every
    rank calls it; returns the same rows everywhere). `barrier(t)` returns
    the maximum of t over ranks (the MPI or in-process way)."""
    rows = []
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        y = np.empty_like(x)
        # Enough calls per sample that timer resolution and noise average out.
        comm.all_reduce(x, out=y, algorithm="ring")
        t0 = time.perf_counter()
        comm.all_reduce(x, out=y, algorithm="ring")
        one = barrier(time.perf_counter() - t0)
        iters = int(max(1, min(2000, budget_s / max(one, 1e-7))))
        samples = {a: [] for a in selection.ALGORITHMS}
        for _ in range(reps):  # interleaved: drift hits every algorithm alike
            for a in selection.ALGORITHMS:
                comm.all_reduce(x, out=y, algorithm=a)
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.all_reduce(x, out=y, algorithm=a)
                samples[a].append(barrier((time.perf_counter() - t0) / iters))
        for a, s in samples.items():
            rows.append({"algorithm": a, "n": comm.size, "bytes": int(x.nbytes), "seconds": float(np.median(s)),
                         "spread": float(np.max(s) - np.min(s))})
    return rows


def _slots_only(window, f) -> None:
    """f() with the window's single copy off (every rank calls it alike)."""
    on, on_4k = window.single_copy_min, window.single_copy_min_4k
    window.single_copy_min = window.single_copy_min_4k = selection.UNLIMITED
    try:
        f()
    finally:
        window.single_copy_min, window.single_copy_min_4k = on, on_4k


def _limit_4k(window, limit: int, f) -> None:
    """f() with the window's limit for blocks in 4 KiB pages at `limit`
    (every rank calls it alike): the single-copy limit (single copy whatever
    the pages), or UNLIMITED (such blocks through the slots, as auto runs them)."""
    on = window.single_copy_min_4k
    window.single_copy_min_4k = limit
    try:
        f()
    finally:
        window.single_copy_min_4k = on


def array_in_pages(count: int, huge: bool) -> np.ndarray:
    """`count` float32 (ones) in an anonymous mapping of their own, on a
    2 MiB boundary, which the kernel is asked to back with transparent huge
    pages (`huge`: as numpy asks for its arrays from 4 MiB) or never to (4 KiB
    pages, as torch's CPU tensors); touched. (madvise: with huge pages off,
    or memory too fragmented, the kernel gives 4 KiB pages anyway.)"""
    align = 2 << 20
    # Private: mmap's default for anonymous memory is MAP_SHARED, which the
    # kernel backs with shmem, whose huge pages shmem_enabled governs (often
    # never), not what a process's malloc'd arrays get.
    m = mmap.mmap(-1, count * 4 + align, flags=mmap.MAP_PRIVATE)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    whole = np.frombuffer(m, np.uint8)  # (keeps the mapping alive)
    at = -whole.ctypes.data % align
    a = whole[at:at + count * 4].view(np.float32)
    a[:] = 1
    return a


def _iters(fn, barrier, budget_s: float) -> int:
    """Calls per sample: enough that timer resolution and noise average out."""
    fn()
    t0 = time.perf_counter()
    fn()
    iters = int(max(1, min(2000, budget_s / max(barrier(time.perf_counter() - t0), 1e-7))))
    return iters


def measure_shm(comm, sizes=SIZES, reps: int = 7, budget_s: float = 0.05, barrier=None) -> list[dict]:
    """Rows {"collective", "algorithm", "n", "bytes", "seconds"} of the
    window's algorithms and their point-to-point rivals on `comm` (which has
    a shared-memory window), interleaved per repetition. `bytes`: the full
    buffer (all_reduce's, reduce_scatter's input, all_gather's output)."""
    n, rows = comm.size, []
    window = comm._engine.window
    slot = window.slot_bytes
    # (the window's large blocks go by single copy where it is on: what was
    # measured holds only while it is on, or off, as here; shm.tuned)
    single_copy = window.single_copy_min < selection.UNLIMITED
    for nbytes in sizes:
        count = max(n, nbytes // 4 // n * n)
        full, out_full = np.ones(count, np.float32), np.empty(count, np.float32)
        part, out_part = np.ones(count // n, np.float32), np.empty(count // n, np.float32)
        calls = {("all_reduce", a): (lambda a=a: comm.all_reduce(full, out=out_full, algorithm=a))
                 for a in ("shm", "ring", "recursive_doubling", "halving_doubling")}
        if 4 * count <= slot:
            calls[("all_reduce", "shm_flat")] = lambda: comm.all_reduce(full, out=out_full, algorithm="shm_flat")
        for a in ("shm", "ring"):
            calls[("reduce_scatter", a)] = lambda a=a: comm.reduce_scatter(full, out=out_part, algorithm=a)
            calls[("all_gather", a)] = lambda a=a: comm.all_gather(part, out=out_full, algorithm=a)
        # The rooted and personalized ones (root 0), against what auto runs
        # outside the window (ROOTED_RIVALS), as bench/shm_rooted.py times them.
        root_out = out_full if comm.rank == 0 else None
        if single_copy and 4 * count // n >= window.single_copy_min:
            # The same five through the slots alone (single copy off for the
            # call, on every rank alike): which is faster moves with the
            # machine and with the arrays' pages (choose_single_copy).
            for coll, f in (("reduce", lambda: comm.reduce(full, out=out_full, algorithm="shm")),
                            ("all_gather", lambda: comm.all_gather(part, out=out_full, algorithm="shm")),
                            ("gather", lambda: comm.gather(part, out=root_out, algorithm="shm")),
                            ("scatter", lambda: comm.scatter(full, out=out_part, algorithm="shm")),
                            ("all_to_all", lambda: comm.all_to_all(full, out=out_full, algorithm="shm"))):
                calls[(coll, "shm_slots")] = lambda f=f: _slots_only(window, f)
                if coll in ("all_gather", "all_to_all"):
                    # ("shm" is what auto runs, which for these numpy arrays
                    # in 4 KiB pages follows the 4 KiB limit (built in: the
                    # same as any block's, so the two rows agree there);
                    # single copy itself, with the 4 KiB limit at the other)
                    calls[(coll, "shm_single")] = lambda f=f: _limit_4k(window, window.single_copy_min, f)
            # all_to_all from arrays in 4 KiB pages, by single copy and
            # through the slots (choose_single_copy_4k; the sender asks the
            # kernel where its block lies, ShmWindow::small_pages).
            small, out_small = array_in_pages(count, False), array_in_pages(count, False)
            f = lambda: comm.all_to_all(small, out=out_small, algorithm="shm")  # noqa: E731
            calls[("all_to_all", "shm_4k_single")] = lambda f=f: _limit_4k(window, window.single_copy_min, f)
            calls[("all_to_all", "shm_4k_slots")] = lambda f=f: _limit_4k(window, selection.UNLIMITED, f)
        for a in ("shm", *ROOTED_RIVALS["reduce"]):
            calls[("reduce", a)] = lambda a=a: comm.reduce(full, out=out_full, algorithm=a)
        for a in ("shm", *ROOTED_RIVALS["gather"]):
            calls[("gather", a)] = lambda a=a: comm.gather(part, out=root_out, algorithm=a)
        for a in ("shm", *ROOTED_RIVALS["scatter"]):
            calls[("scatter", a)] = lambda a=a: comm.scatter(full, out=out_part, algorithm=a)
        for a in ("shm", *ROOTED_RIVALS["all_to_all"]):
            calls[("all_to_all", a)] = lambda a=a: comm.all_to_all(full, out=out_full, algorithm=a)
        iters = {k: _iters(f, barrier, budget_s) for k, f in calls.items()}
        samples = {k: [] for k in calls}
        for _ in range(reps):
            for k, f in calls.items():
                t0 = time.perf_counter()
                for _ in range(iters[k]):
                    f()
                samples[k].append(barrier((time.perf_counter() - t0) / iters[k]))
        for (coll, a), s in samples.items():
            rows.append({"collective": coll, "algorithm": a, "n": n, "bytes": 4 * count,
                         "seconds": float(np.median(s)), "single_copy": single_copy})
    return rows


# What auto may run outside the window, per collective (the table of
# algorithms: its rows on the message path that auto may pick): the window
# has to beat the faster of these.
RIVALS = {c: algorithms.names(c, path="messages", auto=True) for c in ("all_reduce", "reduce_scatter", "all_gather")}
ROOTED_RIVALS = {c: algorithms.names(c, path="messages", auto=True) for c in ("reduce", "gather", "scatter", "all_to_all")}

# The window loses a size only to a rival faster by more than this fraction:
# where the two are level, a shared machine's noise would otherwise flip
# the limits from one tune to the next (two tunes on a 2-core VM, N = 2:
# scatter's window and linear within 4-10 % of each other from 256 KiB up,
# and one tune put each on either side; bench/README.md).
SHM_MARGIN = 0.1


def shm_limits(rows: list[dict], n: int) -> dict:
    """From measure_shm's rows on `n` ranks: per collective the largest size
    up to which the window won (no rival faster by more than SHM_MARGIN) at
    every size measured (UNLIMITED when it won everywhere, 0 when it lost at
    the smallest); under "from", per
    collective the smallest size from which it won at every larger size
    measured (UNLIMITED when it lost at the largest), so auto runs the
    window at and below the one and at and above the other; flat_max, the
    largest size up to which shm_flat beat shm at every size (0: never);
    "single_copy_min", single copy's limit (choose_single_copy; absent when
    nothing was measured both ways), "single_copy_min_4k", all_to_all's for
    blocks in 4 KiB pages (choose_single_copy_4k; absent likewise), the
    window's times above taken as
    auto would then run it; and "single_copy", whether the limits hold
    with single copy on (it was on, rows from a tune that did not record it
    assumed so)."""
    mine_rows = [r for r in rows if r["n"] == n]
    t = {(r["collective"], r["algorithm"], r["bytes"]): r["seconds"] for r in mine_rows}
    sizes = sorted({b for (_, _, b) in t})
    single = choose_single_copy(t, n)
    out, again = {}, {}

    def window(coll, b):  # the window's time as auto would run it, single copy from `single` on
        if (coll, "shm_slots", b) in t and b // n < single:
            return t[(coll, "shm_slots", b)]
        return min(t[(coll, a, b)] for a in ("shm", "shm_flat") if (coll, a, b) in t)

    for coll, rivals in {**RIVALS, **ROOTED_RIVALS}.items():
        got = _window_limits(coll, rivals, t, sizes, window)
        if got is not None:  # (None: not measured, an older tune: the built-in limits)
            out[coll], again[coll] = got
    out["flat_max"] = _flat_max(t, sizes)
    out["from"] = again
    out["single_copy"] = all(r.get("single_copy", True) for r in mine_rows)
    if single is not None:
        out["single_copy_min"] = single
    single_4k = choose_single_copy_4k(t, n)
    if single_4k is not None:
        out["single_copy_min_4k"] = max(single_4k, out.get("single_copy_min", 0))
    return out


def _window_limits(coll: str, rivals, t: dict, sizes: list, window) -> tuple | None:
    """(the largest size up to which the window won for `coll`, the smallest
    from which it won at every larger size), over the sizes where the window
    and every rival were measured; None where none were."""
    have = [b for b in sizes if (coll, "shm", b) in t and all((coll, a, b) in t for a in rivals)]
    if not have:
        return None
    wins = [window(coll, b) <= (1 + SHM_MARGIN) * min(t[(coll, a, b)] for a in rivals) for b in have]
    lost = [i for i, w in enumerate(wins) if not w]
    upto = selection.UNLIMITED if not lost else (have[lost[0] - 1] if lost[0] else 0)
    again = have[lost[-1] + 1] if lost and lost[-1] + 1 < len(have) else (selection.UNLIMITED if lost else have[0])
    return upto, again


def _flat_max(t: dict, sizes: list) -> int:
    """The largest size up to which shm_flat beat shm at every size (0: never)."""
    flat = 0
    for b in sizes:
        if ("all_reduce", "shm_flat", b) not in t or t[("all_reduce", "shm_flat", b)] > t[("all_reduce", "shm", b)]:
            break
        flat = b
    return flat


def choose_single_copy(t: dict, n: int) -> int | None:
    """The window's single-copy limit (the smallest block, in bytes, read
    straight from a peer) that made reduce, all_gather, gather, scatter and
    all_to_all fastest over the sizes measured both ways (single copy and
    the slots alone: measure_shm's "shm" and "shm_slots"), summing each
    size's time relative to the faster of the two, so that no size weighs
    more for being large: one of the block sizes measured, or twice the
    largest (the slots at every size measured; single copy stays on above,
    where nothing was measured). all_to_all's per-peer blocks follow the
    same limit. Ties go to the smaller limit. None when
    nothing was measured both ways (single copy off, or an older tune).
    Single copy's time is the "shm_single" row where there is one (all_gather
    and all_to_all, whose "shm" may run the slots for arrays in 4 KiB pages)."""
    grid = [(c, b) for (c, a, b) in t if a == "shm_slots" and (c, "shm", b) in t]
    if not grid:
        return None

    def single(c, b):
        return t.get((c, "shm_single", b), t[(c, "shm", b)])

    def cost(limit):
        return sum((single(c, b) if b // n >= limit else t[(c, "shm_slots", b)])
                   / min(single(c, b), t[(c, "shm_slots", b)]) for c, b in grid)
    blocks = sorted({b // n for _, b in grid})
    return min([*blocks, 2 * blocks[-1]], key=cost)


def choose_single_copy_4k(t: dict, n: int) -> int | None:
    """all_to_all's single-copy limit for blocks in 4 KiB pages, from
    measure_shm's "shm_4k_single" and "shm_4k_slots" rows as
    choose_single_copy weighs them: one of the block sizes measured, or
    twice the largest (the slots at every size measured). None when
    nothing was measured both ways."""
    grid = sorted(b for (c, a, b) in t if (c, a) == ("all_to_all", "shm_4k_slots")
                  and ("all_to_all", "shm_4k_single", b) in t)
    if not grid:
        return None

    def cost(limit):
        return sum((t[("all_to_all", "shm_4k_single", b)] if b // n >= limit else t[("all_to_all", "shm_4k_slots", b)])
                   / min(t[("all_to_all", "shm_4k_single", b)], t[("all_to_all", "shm_4k_slots", b)]) for b in grid)
    blocks = [b // n for b in grid]
    return min([*blocks, 2 * blocks[-1]], key=cost)


def describe_single_copy(on: bool, sc: int | None, sc4k: int | None) -> str:
    """The window's single-copy limits in words (`ringcomm info`, `ringcomm
    tune`): `sc` the limit for any block (None: on, not measured), `sc4k` the
    one for blocks in 4 KiB pages (None: not measured)."""
    if not on:
        return "single copy off"
    said = "single copy " + ("on" if sc is None else f"from blocks of {sc} B")
    if sc4k is None:
        return said
    if sc is not None and sc4k <= sc:
        return said + " in any pages"
    return (said + "; blocks in 4 KiB pages (all_to_all, all_gather) " +
            ("through the slots" if sc4k >= selection.UNLIMITED else f"by single copy from {sc4k} B"))


def describe_shm_limits(lim: dict) -> list[str]:
    """shm_limits' result in words, a line per collective."""
    U = selection.UNLIMITED
    lines = []
    for coll, up in lim.items():
        if coll in ("from", "single_copy", "flat_max", "single_copy_min", "single_copy_min_4k"):
            continue
        again = lim["from"].get(coll, U)
        if up >= U or again <= up:
            where = "at any size"
        elif up == 0:
            where = "never" if again >= U else f"from {again} B"
        else:
            where = f"up to {up} B" + ("" if again >= U else f" and from {again} B")
        lines.append(f"{coll:<16}{where}")
    lines.append(f"all_reduce in one sync (shm_flat) up to {lim['flat_max']} B")
    return lines


def _mpi_worker() -> None:
    from mpi4py import MPI
    import ringcomm
    w = MPI.COMM_WORLD
    comm = ringcomm.init(timeout=120)
    rows = measure(comm, barrier=lambda t: w.allreduce(t, op=MPI.MAX))
    shm_rows = measure_shm(comm, barrier=lambda t: w.allreduce(t, op=MPI.MAX)) if comm.shared_memory else []
    if w.rank == 0:
        print("TUNE " + json.dumps(rows), flush=True)
        print("TUNESHM " + json.dumps(shm_rows), flush=True)
    comm.close()


def _inproc_rows(n: int) -> list[dict]:
    import threading

    import ringcomm
    lock = threading.Lock()
    state = {"round": 0, "vals": {}}
    cv = threading.Condition(lock)

    def barrier_max(rank):
        def f(t):  # all ranks post t; each gets the max (a tiny in-process allreduce of floats)
            with cv:
                r = state["round"]
                state["vals"].setdefault(r, []).append(t)
                if len(state["vals"][r]) == n:
                    state["round"] += 1
                    cv.notify_all()
                else:
                    cv.wait_for(lambda: state["round"] > r)
                return max(state["vals"][r])
        return f
    return ringcomm.run_local(n, lambda comm: measure(comm, barrier=barrier_max(comm.rank)), timeout=120)[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ringcomm tune", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", default="2,4", help="MPI world sizes to measure, comma-separated (default: 2,4)")
    p.add_argument("--no-mpi", action="store_true", help="only the in-process transport")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    args = p.parse_args(argv)
    ns = [int(v) for v in args.n.split(",")]
    results, shm_rows = {}, []
    if not args.no_mpi:
        got = _mpi_rows(ns)
        if got is None:
            return 1
        results["mpi"], shm_rows = got
    results["inproc"] = _inproc_rows(2)
    when = datetime.datetime.now().isoformat(timespec="seconds")
    for key, rows in results.items():
        costs = _report_costs(key, rows)
        if not args.dry_run:
            path = selection.save(key, costs, {"measured": when, "ranks": sorted({r["n"] for r in rows}),
                                               "rows": rows})
    limits = {str(n): _report_shm(shm_rows, n) for n in sorted({r["n"] for r in shm_rows})}
    if limits and not args.dry_run:
        path = selection.save_entry("shm", {"measured": when, "limits": limits, "rows": shm_rows})
    if not args.dry_run:
        print(f"written to {path}")
    return 0


def _mpi_rows(ns: list) -> tuple | None:
    """The MPI runs on each number of ranks: (cost-model rows, window rows),
    or None (said on stderr) where a run failed."""
    rows, shm_rows = [], []
    for n in ns:
        cmd = mpirun_command(n, [sys.executable, "-m", "ringcomm.tuning.tune", "_worker"])
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith("TUNE ")), None)
        if res.returncode or line is None:
            print(f"ringcomm tune: the MPI run on {n} ranks failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}",
                  file=sys.stderr)
            return None
        rows += json.loads(line[5:])
        shm_line = next((ln for ln in res.stdout.splitlines() if ln.startswith("TUNESHM ")), "TUNESHM []")
        shm_rows += json.loads(shm_line[8:])
    return rows, shm_rows


def _report_costs(key: str, rows: list):
    """The cost model fitted to one transport's rows, printed against them with auto's limits."""
    costs = selection.fit(rows)
    ranks = sorted({r["n"] for r in rows})
    print(f"{key}: {costs}   ({len(rows)} measurements, N = {ranks})")
    print(f"  {'algorithm':<20}{'n':>3}{'bytes':>10}{'measured us':>13}{'model us':>10}{'ratio':>7}")
    for r in rows:
        m = float(selection.predict(costs, r["algorithm"], r["n"], r["bytes"]))
        print(f"  {r['algorithm']:<20}{r['n']:>3}{r['bytes']:>10}{r['seconds'] * 1e6:>13.2f}"
              f"{m * 1e6:>10.2f}{m / r['seconds']:>7.2f}")
    for n in ranks:
        mrd, mhd = selection.auto_limits(costs, n)
        try:
            rd, hd = selection.auto_limits(selection.Measured.from_rows(rows, n), n)
        except ValueError as exc:  # e.g. a time of 0 (timer resolution): the lines decide on n ranks
            print(f"  auto on {n} ranks: the fitted lines ({mrd} B, {mhd} B): the measurements are unusable "
                  f"({exc})")
            continue
        print(f"  auto on {n} ranks (measured): recursive doubling up to {rd} B, halving-doubling up to {hd} B, "
              f"the ring above (the fitted lines alone would say {mrd} B, {mhd} B)")
    return costs


def _report_shm(shm_rows: list, n: int) -> dict:
    """The window's limits on n ranks (shm_limits), printed with the rows."""
    lim = shm_limits(shm_rows, n)
    print(f"shared memory on {n} ranks of one host ("
          + describe_single_copy(lim["single_copy"], lim.get("single_copy_min"), lim.get("single_copy_min_4k"))
          + "), auto runs the window:")
    for line in describe_shm_limits(lim):
        print("  " + line)
    print(f"  {'collective':<16}{'algorithm':<20}{'bytes':>10}{'measured us':>13}")
    for r in shm_rows:
        if r["n"] == n:
            print(f"  {r['collective']:<16}{r['algorithm']:<20}{r['bytes']:>10}{r['seconds'] * 1e6:>13.2f}")
    return lim


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        _mpi_worker()
    else:
        sys.exit(main())

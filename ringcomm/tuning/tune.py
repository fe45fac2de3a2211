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
import subprocess
import sys
import time

import numpy as np

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


def _mpi_worker() -> None:
    from mpi4py import MPI
    import ringcomm
    w = MPI.COMM_WORLD
    comm = ringcomm.init(timeout=120)
    rows = measure(comm, barrier=lambda t: w.allreduce(t, op=MPI.MAX))
    if w.rank == 0:
        print("TUNE " + json.dumps(rows), flush=True)
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
    results = {}
    if not args.no_mpi:
        rows = []
        for n in ns:
            cmd = mpirun_command(n, [sys.executable, "-m", "ringcomm.tuning.tune", "_worker"])
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            line = next((ln for ln in res.stdout.splitlines() if ln.startswith("TUNE ")), None)
            if res.returncode or line is None:
                print(f"ringcomm tune: the MPI run on {n} ranks failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}",
                      file=sys.stderr)
                return 1
            rows += json.loads(line[5:])
        results["mpi"] = rows
    results["inproc"] = _inproc_rows(2)
    when = datetime.datetime.now().isoformat(timespec="seconds")
    for key, rows in results.items():
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
        if not args.dry_run:
            path = selection.save(key, costs, {"measured": when, "ranks": ranks, "rows": rows})
    if not args.dry_run:
        print(f"written to {path}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        _mpi_worker()
    else:
        sys.exit(main())

"""ringcomm over UCX vs over MPI point-to-point, in one job: all_reduce at
8 B, 64 KiB, 4 MiB and 64 MiB, and point-to-point bandwidth at 4 MiB.
Two communicators (transport="ucx" and "mpi", no shared-memory window on
either), repetitions interleaved (ABAB...), so a neighbour's load hits both
alike; per size the median time per call over the repetitions, the spread
(min..max of the repetitions) and the ratio ucx/mpi. Results are checked
outside the timed loops. Run:

    ringcomm run -n 2 -- python bench/ucx_vs_mpi.py [reps]
"""

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm

SIZES = (8, 64 << 10, 4 << 20, 64 << 20)
P2P_BYTES = 4 << 20


def iters_for(nbytes):
    """Calls per repetition: tens of milliseconds at every size."""
    return {8: 5000, 64 << 10: 2000, 4 << 20: 50, 64 << 20: 5}.get(nbytes, 10)


def timed(world, fn, iters):
    """Seconds per call on the slowest rank."""
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return world.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def check_all_reduce(comm, nbytes):
    n, r = comm.size, comm.rank
    x = (np.arange(nbytes // 4, dtype=np.float32) % 251) + r
    comm.all_reduce(x)
    want = n * (np.arange(nbytes // 4, dtype=np.float32) % 251) + n * (n - 1) / 2
    if not np.array_equal(x, want):
        raise SystemExit(f"rank {r}: wrong all_reduce result over {comm.transport} at {nbytes} B")


def ping_pong(comm, buf):
    """One 4 MiB message each way between ranks 0 and 1 (others idle)."""
    if comm.rank == 0:
        comm.send(buf, 1)
        comm.recv(buf, 1)
    elif comm.rank == 1:
        comm.recv(buf, 0)
        comm.send(buf, 0)


def fmt(label, ts, unit=1e6):
    return f"{label} {statistics.median(ts) * unit:10.1f} [{min(ts) * unit:.1f}..{max(ts) * unit:.1f}]"


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 11
    world = MPI.COMM_WORLD
    comms = {"ucx": ringcomm.init(transport="ucx", timeout=120),
             "mpi": ringcomm.init(transport="mpi", timeout=120)}
    if world.rank == 0:
        print(f"# ringcomm all_reduce, N={world.size}: {comms['ucx'].transport} vs {comms['mpi'].transport}; "
              f"median [min..max] of {reps} repetitions, us per call", flush=True)
        print(f"# {'bytes':>10} {'ucx us':>30} {'mpi us':>30} {'ucx/mpi':>8} {'algorithm':>12}", flush=True)
    for nbytes in SIZES:
        for c in comms.values():
            check_all_reduce(c, nbytes)
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        iters = iters_for(nbytes)
        res = {"ucx": [], "mpi": []}
        for rep in range(reps):
            for k in (("ucx", "mpi") if rep % 2 == 0 else ("mpi", "ucx")):
                c = comms[k]
                res[k].append(timed(world, lambda: c.all_reduce(x, out=y), iters))
        if world.rank == 0:
            ratio = statistics.median(res["ucx"]) / statistics.median(res["mpi"])
            print(f"  {nbytes:>10} {fmt('', res['ucx']):>30} {fmt('', res['mpi']):>30} {ratio:8.2f} "
                  f"{comms['ucx'].last_algorithm:>12}", flush=True)
        del x, y
    if world.size >= 2:
        buf = np.zeros(P2P_BYTES // 4, np.float32)
        for k, c in comms.items():  # checked once, outside the timing
            if world.rank == 0:
                c.send(np.arange(buf.size, dtype=np.float32), 1)
            elif world.rank == 1:
                c.recv(buf, 0)
                if not np.array_equal(buf, np.arange(buf.size, dtype=np.float32)):
                    raise SystemExit(f"wrong p2p payload over {k}")
        iters = 50
        res = {"ucx": [], "mpi": []}
        for rep in range(reps):
            for k in (("ucx", "mpi") if rep % 2 == 0 else ("mpi", "ucx")):
                c = comms[k]
                res[k].append(timed(world, lambda: ping_pong(c, buf), iters))
        if world.rank == 0:
            # a round trip moves the message twice
            bw = {k: [2 * P2P_BYTES / t / 1e9 for t in v] for k, v in res.items()}
            print(f"# point-to-point {P2P_BYTES >> 20} MiB ping-pong, GB/s (median [min..max]): " + "  ".join(
                f"{k} {statistics.median(v):.2f} [{min(v):.2f}..{max(v):.2f}]" for k, v in bw.items())
                + f"  ucx/mpi {statistics.median(bw['ucx']) / statistics.median(bw['mpi']):.2f}", flush=True)
    for c in comms.values():
        c.close()


main()

"""8-byte send/recv ping-pong latency over MPI: ringcomm vs mpi4py Send/Recv on
the same buffers, interleaved repetitions, medians. Run:
    ringcomm run -n 2 -- python bench/p2p_latency.py [reps] [iters]
Verification (the echoed value) happens outside the timed loops."""

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import ringcomm


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    comm = ringcomm.init()
    mc = MPI.COMM_WORLD.Dup()
    r = comm.rank
    x = np.zeros(1, np.float64)

    def rc_loop():
        for _ in range(iters):
            if r == 0:
                comm.send(x, 1)
                comm.recv(x, 1)
            else:
                comm.recv(x, 0)
                comm.send(x, 0)

    def mpi_loop():
        for _ in range(iters):
            if r == 0:
                mc.Send(x, 1)
                mc.Recv(x, 1)
            else:
                mc.Recv(x, 0)
                mc.Send(x, 0)

    x[0] = 42.0 + r
    rc_loop()  # warm-up (both ranks)
    mpi_loop()
    res = {"ringcomm": [], "mpi4py": []}
    for rep in range(reps):
        for name, fn in (("ringcomm", rc_loop), ("mpi4py", mpi_loop)) if rep % 2 == 0 else \
                        (("mpi4py", mpi_loop), ("ringcomm", rc_loop)):
            mc.Barrier()
            t0 = time.perf_counter()
            fn()
            res[name].append((time.perf_counter() - t0) / iters / 2 * 1e6)  # one-way, us
    if r == 0:
        a, b = statistics.median(res["ringcomm"]), statistics.median(res["mpi4py"])
        print(f"8-byte one-way latency (half round trip), N=2, {reps} interleaved reps x {iters} round trips")
        print(f"  ringcomm send/recv  median {a:7.2f} us   (min {min(res['ringcomm']):.2f})")
        print(f"  mpi4py   Send/Recv  median {b:7.2f} us   (min {min(res['mpi4py']):.2f})")
        print(f"  ratio ringcomm/mpi4py: {a / b:.2f}  (goal <= 1.5)")
    comm.close()


main()

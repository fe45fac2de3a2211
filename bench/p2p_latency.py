"""8-byte send/recv ping-pong latency over MPI: ringcomm vs mpi4py Send/Recv on
the same buffers, interleaved repetitions, medians; then the 8-byte exchange
(both ranks send to and receive from each other at once): ringcomm's
sendrecv and its isend + irecv + two waits against mpi4py's Sendrecv. Run:
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

    o = 1 - r
    y = np.zeros(1, np.float64)

    def rc_sendrecv():
        for _ in range(iters):
            comm.sendrecv(x, o, y, o)

    def rc_isend_irecv():
        for _ in range(iters):
            s, q = comm.isend(x, o), comm.irecv(y, o)
            q.wait()
            s.wait()

    def mpi_sendrecv():
        for _ in range(iters):
            mc.Sendrecv(x, o, 0, y, o, 0)

    def measure(loops, per):
        for fn in loops.values():  # warm-up (both ranks)
            fn()
        res = {name: [] for name in loops}
        for rep in range(reps):
            for name in (list(loops) if rep % 2 == 0 else list(reversed(loops))):
                mc.Barrier()
                t0 = time.perf_counter()
                loops[name]()
                res[name].append((time.perf_counter() - t0) / iters / per * 1e6)
        return res

    x[0] = 42.0 + r
    res = measure({"ringcomm": rc_loop, "mpi4py": mpi_loop}, 2)  # one-way, us
    x[0] = 42.0 + r  # (the ping-pong echoed rank 0's value into both)
    ex = measure({"sendrecv": rc_sendrecv, "isend_irecv": rc_isend_irecv, "mpi4py": mpi_sendrecv}, 1)
    if y[0] != 42.0 + o:
        raise SystemExit(f"rank {r}: the exchange received {y[0]}, expected {42.0 + o}")
    if r == 0:
        a, b = statistics.median(res["ringcomm"]), statistics.median(res["mpi4py"])
        print(f"8-byte one-way latency (half round trip), N=2, {reps} interleaved reps x {iters} round trips")
        print(f"  ringcomm send/recv  median {a:7.2f} us   (min {min(res['ringcomm']):.2f})")
        print(f"  mpi4py   Send/Recv  median {b:7.2f} us   (min {min(res['mpi4py']):.2f})")
        print(f"  ratio ringcomm/mpi4py: {a / b:.2f}  (goal <= 1.5)")
        m = {k: statistics.median(v) for k, v in ex.items()}
        print(f"8-byte exchange (each rank sends to and receives from the other), {reps} reps x {iters}")
        print(f"  ringcomm sendrecv               median {m['sendrecv']:7.2f} us   (min {min(ex['sendrecv']):.2f})")
        print(f"  ringcomm isend+irecv+2 waits    median {m['isend_irecv']:7.2f} us   (min {min(ex['isend_irecv']):.2f})")
        print(f"  mpi4py   Sendrecv               median {m['mpi4py']:7.2f} us   (min {min(ex['mpi4py']):.2f})")
        print(f"  ratio sendrecv/mpi4py: {m['sendrecv'] / m['mpi4py']:.2f}, isend+irecv/mpi4py: "
              f"{m['isend_irecv'] / m['mpi4py']:.2f}")
    comm.close()


main()

"""The shared suites over the UCX transport (run by tests/test_ucx.py under
mpirun with RINGCOMM_TRANSPORT=ucx). One launch runs a whole phase, so the
file stays quick on a 2-core CI machine:

  suite   every collective (results against numpy, the ledger against
          traffic.expected exactly), sizes 0, 1, N-1, N+1, primes, many
          segments; point-to-point (ring shifts, all pairs, any source);
          peers racing ahead into the next call (not another call's message)
  faults  ranks that disagree on the call (count, then dtype of equal size:
          only the stamp tells), a wrong-sized point-to-point receive (both
          sides fail), a missing rank (a timeout naming it), abort

and, without MPI (tests/test_ucx.py starts the processes itself):

  emulated STORE RANK N   the suite phase over a store launch with
          device="emulated-nccl": the GPU store launch's structure on a CPU
          (control messages over UCX, the payload in NCCL-like groups on the
          emulated device over a second UCX worker), with jitter

Prints one "RESULT {json}" line per rank: {"rank", "transport", "errors"}.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import numpy as np  # noqa: E402

import collectives_suite as cs  # noqa: E402
import ringcomm  # noqa: E402
import suite  # noqa: E402
from ringcomm import CollectiveTimeout, CommunicatorAborted, MismatchError  # noqa: E402


def p2p_data(rank, count, salt=0):
    return ((np.arange(count) * 7 + 13 * rank + 3 * salt + 1) % 97).astype(np.float32)


def run_p2p(comm):
    """Ring shifts (eager and rendezvous sizes), all pairs, any source."""
    n, r = comm.size, comm.rank
    errs = []
    for count in (0, 1, 97, 300001):
        y = np.zeros(count, np.float32)
        ws = [comm.irecv(y, (r - 1) % n), comm.isend(p2p_data(r, count), (r + 1) % n)]
        for w in reversed(ws):
            w.wait()
        errs += suite.compare(y, p2p_data((r - 1) % n, count), f"p2p shift count={count}", r)
    ops, outs = [], {}
    for p in range(n):
        if p != r:
            outs[p] = np.zeros(1000, np.float32)
            ops += [ringcomm.P2POp("isend", p2p_data(r, 1000, p), p, 2), ringcomm.P2POp("irecv", outs[p], p, 2)]
    for w in comm.batch_isend_irecv(ops):
        w.wait()
    for p, y in outs.items():
        errs += suite.compare(y, p2p_data(p, 1000, r), f"p2p all pairs from {p}", r)
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            y = np.zeros(5, np.float32)
            s = comm.recv(y, None, tag=9)
            errs += suite.compare(y, p2p_data(s, 5), f"p2p any source from {s}", r)
            seen.add(s)
        if seen != set(range(1, n)):
            errs.append(f"rank 0: any source saw {sorted(seen)}")
    else:
        comm.send(p2p_data(r, 5), 0, tag=9)
    # Point-to-point from a user thread while collectives run on this one:
    # both reach the one UCP worker (its mutex, ucx_transport.cpp).
    import threading
    got = []

    def shifts():
        for k in range(6):
            y = np.zeros(100003, np.float32)
            ws = [comm.irecv(y, (r - 1) % n, tag=5), comm.isend(p2p_data(r, 100003, k), (r + 1) % n, tag=5)]
            for w in ws:
                w.wait()
            got.append((k, y))
    t = threading.Thread(target=shifts)
    t.start()
    for k in range(6):
        x = p2p_data(r, 70001, k)
        comm.all_reduce(x)
        errs += suite.compare(x, sum(p2p_data(q, 70001, k) for q in range(n)), f"all_reduce beside p2p {k}", r)
    t.join()
    if len(got) != 6:
        errs.append(f"rank {r}: the p2p thread did {len(got)} of 6 shifts")
    for k, y in got:
        errs += suite.compare(y, p2p_data((r - 1) % n, 100003, k), f"p2p shift beside all_reduce {k}", r)
    return errs


def run_suite(comm):
    n, r = comm.size, comm.rank
    errs = []
    for sizes, seg in (([0, 1, max(n - 1, 0), n + 1], 1 << 20), ([7 * n + 3], 16), ([100003], 65536)):
        comm.segment_bytes = seg
        errs += suite.run_cases(comm, sizes)
    errs += suite.run_broadcasts(comm, [0, 1, n + 1, 100003], dtypes=["float32", "int8", "bfloat16"])
    errs += suite.run_barrier(comm)
    comm.segment_bytes = 1 << 20
    errs += cs.run_all(comm, [0, 1, max(n - 1, 0), n + 1, 101])
    comm.segment_bytes = 16
    errs += cs.run_all(comm, [7 * n + 3], reduce_combos=[("float32", "sum"), ("bfloat16", "avg"), ("int8", "prod")])
    comm.segment_bytes = 1 << 20
    if n > 1:
        errs += run_p2p(comm)
    # One rank at a time lags before each call, so the others' messages of
    # the next call queue up while this call's receives wait: they must not
    # be taken for another call's (the probe-then-cancel proof).
    comm.segment_bytes = 16384
    for i in range(24):
        algorithm = ("ring", "recursive_doubling", "halving_doubling", "naive")[i % 4]
        count = (1, 1000, 3001, 70001)[(i // 4) % 4]
        if r == (i // 2) % n:
            time.sleep(0.003)
        base = (np.arange(count, dtype=np.int64) % 997) + i
        got = comm.all_reduce((base + 7 * r).astype(np.int32), algorithm=algorithm)
        errs += suite.compare(got, (n * base + 7 * n * (n - 1) // 2).astype(np.int32),
                              f"running ahead, call {i} ({algorithm}, count {count})", r)
    return errs


def expect(errs, r, what, fn, exc_types, check=None):
    """Run fn, which must raise one of exc_types (and pass check(exc))."""
    try:
        fn()
        errs.append(f"rank {r}: {what}: no error")
    except exc_types as e:
        bad = check(e) if check else None
        if bad:
            errs.append(f"rank {r}: {what}: {bad}: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001
        errs.append(f"rank {r}: {what}: unexpected {type(e).__name__}: {e}")


def run_faults(world):
    r, n = world.rank, world.size
    errs = []

    # Counts disagree: MismatchError naming both, everywhere, then the communicator is aborted.
    comm = ringcomm.init(timeout=20)
    expect(errs, r, "count mismatch", lambda: comm.all_reduce(np.zeros(10 + (r == 1), np.float32)), MismatchError,
           lambda e: None if ("count=10" in str(e) and "count=11" in str(e)) else "does not name both counts")
    expect(errs, r, "after a mismatch", lambda: comm.all_reduce(np.zeros(3)), CommunicatorAborted)
    world.Barrier()

    # dtypes disagree at equal sizes: every message has the size expected,
    # only its stamp (part of the UCP tag) differs.
    for algorithm in ("recursive_doubling", "ring"):
        comm = ringcomm.init(timeout=20)
        x = np.arange(1, 65, dtype=np.int32 if r == 0 else np.float32)
        expect(errs, r, f"dtype mismatch ({algorithm})", lambda: comm.all_reduce(x, algorithm=algorithm),
               MismatchError, lambda e: None if ("int32" in str(e) and "float32" in str(e)) else "does not name both")
        world.Barrier()

    # Rank 0 sends 10 float32 with tag 3 to rank 1, which receives `count`
    # with `tag` from `src` (after a barrier of all with `arrived`, so that
    # the message is there before its deadline starts); the others wait in
    # a barrier.
    def p2p_pair(count, tag, src=0, arrived=False):
        if r == 0:
            comm.send(np.arange(10, dtype=np.float32), 1, tag=3)
        if arrived:
            comm.barrier()
        if r == 1:
            comm.recv(np.zeros(count, np.float32), src, tag=tag)
        else:
            comm.barrier()

    # A point-to-point receive of the wrong size fails on both sides.
    comm = ringcomm.init(timeout=5)
    mismatch = lambda: p2p_pair(8, 3)  # noqa: E731
    if r == 1:
        expect(errs, r, "p2p size mismatch", mismatch, MismatchError,
               lambda e: None if "40 bytes" in str(e) else "does not name the message's size")
    elif r == 0:
        expect(errs, r, "p2p size mismatch (sender)", mismatch, ringcomm.RingcommError,
               lambda e: None if "recv(count=8" in str(e) else "does not name the receive")
    else:
        expect(errs, r, "p2p size mismatch (bystander)", mismatch, ringcomm.RingcommError)
    world.Barrier()

    # Tags that disagree (rank 1 receives with tag 4, from rank 0 and then
    # from any rank): its timeout names the message that waits unreceived
    # (a probe with the UCP tag's low bits, and for any rank the sender's
    # bits, masked out).
    told = "rank 0's next message to rank 1 has tag 3 (40 bytes (10 float32)) and waits unreceived"
    for src in (0, None):
        comm = ringcomm.init(timeout=1 if r == 1 else 10)
        wrong_tag = lambda: p2p_pair(10, 4, src, arrived=True)  # noqa: E731
        if r == 1:
            expect(errs, r, f"p2p tags disagree (from {src})", wrong_tag, CollectiveTimeout,
                   lambda e: None if told in str(e) else "does not name the message sent with another tag")
        else:
            expect(errs, r, f"p2p tags disagree (from {src}; sender, bystander)", wrong_tag, ringcomm.RingcommError,
                   lambda e: None if "tag 4" in str(e) else "does not name the receive")
        world.Barrier()

    # A missing rank: the others time out, and whichever waiting rank's
    # deadline passes first names it (the others hear of it through the ring).
    comm = ringcomm.init(timeout=1.0)
    last = n - 1
    if r != last:
        t0 = time.monotonic()

        def names_last(e):
            if time.monotonic() - t0 > 10:
                return "took too long"
            named = (isinstance(e, CollectiveTimeout) and e.peer == last) or f"waiting for rank {last}" in str(e)
            if not named:
                return f"does not name rank {last}"
            return None
        expect(errs, r, "missing rank", lambda: comm.all_reduce(np.ones(100)), (CollectiveTimeout, CommunicatorAborted),
               names_last)
    world.Barrier()

    # abort: the others fail at once with CommunicatorAborted naming rank 1.
    comm = ringcomm.init(timeout=30)
    if r == 1:
        time.sleep(0.3)
        comm.abort()
    else:
        t0 = time.monotonic()
        expect(errs, r, "abort", lambda: comm.all_reduce(np.ones(1000)), CommunicatorAborted,
               lambda e: None if "rank 1 aborted" in str(e) and time.monotonic() - t0 < 10 else "not rank 1's abort")
    world.Barrier()
    return errs


def main_emulated(store, rank, n):
    import torch.distributed as dist
    transport = ""
    try:
        comm = ringcomm.init(store=dist.FileStore(store, n), rank=rank, size=n, timeout=60, device="emulated-nccl",
                             jitter_us=20)
        transport = comm.transport
        errs = [] if comm.device == f"emulated:{rank}" else [f"rank {rank}: device {comm.device}"]
        errs += run_suite(comm)
        comm.close()
    except Exception as e:  # noqa: BLE001 - reported; the others raise at their deadline
        errs = [f"rank {rank}: {type(e).__name__}: {e}"]
    print("RESULT " + json.dumps({"rank": rank, "transport": transport, "errors": errs}), flush=True)


def main():
    phase = sys.argv[1]
    if phase == "emulated":
        return main_emulated(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    transport = ""
    try:
        if phase == "suite":
            comm = ringcomm.init(timeout=60)
            transport = comm.transport
            errs = run_suite(comm)
            comm.close()
        else:
            comm = ringcomm.init(timeout=20)
            transport = comm.transport
            errs = run_faults(world)
    except Exception as e:  # noqa: BLE001 - reported, and the others are not left waiting
        errs = [f"rank {world.rank}: {type(e).__name__}: {e}"]
        print("RESULT " + json.dumps({"rank": world.rank, "transport": transport, "errors": errs}), flush=True)
        world.Abort(1)
    print("RESULT " + json.dumps({"rank": world.rank, "transport": transport, "errors": errs}), flush=True)


if __name__ == "__main__":
    main()

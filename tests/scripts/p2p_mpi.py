"""Point-to-point over MPI (run by tests/test_p2p_mpi.py under `ringcomm run -n N`):
ring shifts (isend/irecv and sendrecv), all pairs, any source (also behind a receive from one rank), a
receive posted before a collective and waited after it, a large batch both ways, messages over the transport's limit;
with "mismatch" a size mismatch, with "tag" ("tag_any": from any rank) a receive whose sender used another tag.
Prints one RESULT line per rank: {"rank", "errors": [...], "mismatch": text}."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import ringcomm  # noqa: E402
import suite  # noqa: E402
from ringcomm import vocab  # noqa: E402


def data(rank, count, dtype, salt=0):
    return ((np.arange(count) * 7 + 13 * rank + 3 * salt + 1) % 97).astype(vocab.NUMPY[dtype])


def main():
    comm = ringcomm.init(timeout=20)
    r, n = comm.rank, comm.size
    errs = []

    def check(got, want, what):
        bad = np.flatnonzero(got.astype(np.float64) != want.astype(np.float64))
        if bad.size:
            errs.append(f"rank {r}: {what}: {bad.size} wrong, first at {bad[0]}: {got[bad[0]]} != {want[bad[0]]}")

    for count in (0, 1, 97, 300001):
        comm.segment_bytes = 4096
        for dtype in ("float32", "bfloat16", "int64"):
            y = np.zeros(count, vocab.NUMPY[dtype])
            ws = [comm.irecv(y, (r - 1) % n), comm.isend(data(r, count, dtype), (r + 1) % n)]
            for w in reversed(ws):
                w.wait()
            check(y, data((r - 1) % n, count, dtype), f"shift count={count} {dtype}")
            if ws[0].source != (r - 1) % n:
                errs.append(f"rank {r}: source {ws[0].source}")
            # sendrecv both ways round (rendezvous-sized at 300001: each rank's send waits for its receiver)
            z = np.zeros(count, vocab.NUMPY[dtype])
            src = comm.sendrecv(data(r, count, dtype, 1), (r - 1) % n, z, (r + 1) % n, tag=4)
            check(z, data((r + 1) % n, count, dtype, 1), f"sendrecv count={count} {dtype}")
            if src != (r + 1) % n:
                errs.append(f"rank {r}: sendrecv source {src}")
    ops, outs = [], {}
    for p in range(n):
        if p != r:
            outs[p] = np.zeros(1000, np.int32)
            ops += [ringcomm.P2POp("isend", data(r, 1000, "int32", p), p, 2), ringcomm.P2POp("irecv", outs[p], p, 2)]
    for w in comm.batch_isend_irecv(ops):
        w.wait()
    for p, y in outs.items():
        check(y, data(p, 1000, "int32", r), f"all pairs from {p}")
    if r == 0:
        got = set()
        for _ in range(n - 1):
            y = np.zeros(5, np.float64)
            s = comm.recv(y, None, tag=9)
            check(y, data(s, 5, "float64"), f"any source from {s}")
            got.add(s)
        if got != set(range(1, n)):
            errs.append(f"any source saw {sorted(got)}")
    else:
        comm.send(data(r, 5, "float64"), 0, tag=9)
    if n >= 3:  # an any-source receive behind one from rank 1 takes rank 2's message at once (MPI's order)
        got = suite.any_source_behind_one_rank(comm)
        if r == 0 and got != suite.ANY_SOURCE_BEHIND_ONE_RANK:
            errs.append(f"any source behind a receive from rank 1: {got}")
    # A receive posted before a collective takes its message during it (in the
    # window's waits, the ring's over MPI messages, an async one's).
    for how in ("auto", "ring", "async"):
        errs += suite.irecv_across_a_collective(comm, how)
    # Over 1 GiB (MPI's counts are ints): refused on both sides before a byte moves.
    big = np.empty(2**30 + 8, np.uint8)  # (never touched: no memory used)
    for what, call in (("send", comm.send), ("recv", comm.recv)):
        try:
            call(big, (r + 1) % n)
            errs.append(f"rank {r}: a {what} of 1 GiB + 8 bytes was not refused")
        except ringcomm.InvalidArgument as e:
            if "largest message (1073741824 bytes)" not in str(e):
                errs.append(f"rank {r}: {what} of 1 GiB + 8: {e}")
    if n >= 2:  # all_to_all's per-peer blocks are one message each: the same limit, checked before any moves
        splits, out_splits = [0] * n, [0] * n
        splits[(r + 1) % n], out_splits[(r - 1) % n] = 2**30 + 8, 2**30 + 8
        try:
            comm.all_to_all(big, splits=splits, out_splits=out_splits, out=np.empty(2**30 + 8, np.uint8))
            errs.append(f"rank {r}: an all_to_all block of 1 GiB + 8 bytes was not refused")
        except ringcomm.InvalidArgument as e:
            if "largest message (1073741824 bytes)" not in str(e):
                errs.append(f"rank {r}: all_to_all block of 1 GiB + 8: {e}")
    s = comm.all_reduce(np.ones(4, np.float32))
    check(s, np.full(4, n, np.float32), "all_reduce after p2p")
    t = comm.traffic()
    if t.bytes_sent("all_reduce", kind="payload") and t.bytes_received("send"):
        errs.append("p2p bytes booked under the wrong kind")
    mismatch = ""
    comm.timeout = 5
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode in ("mismatch", "tag", "tag_any"):
        wrong_tag = mode != "mismatch"  # rank 1 receives with tag 4 what rank 0 sent with tag 3
        if wrong_tag and r == 1:
            comm.timeout = 1  # (times out first; the others hear of it through the ring)
        try:
            if r == 0:
                comm.send(np.arange(10, dtype=np.float32), 1, tag=3)
            if wrong_tag:
                comm.barrier()  # (rank 0's message has arrived before rank 1's deadline starts)
            if r == 1:
                comm.recv(np.zeros(10 if wrong_tag else 8, np.float32), None if mode == "tag_any" else 0,
                          tag=4 if wrong_tag else 3)
            else:
                comm.barrier()
            mismatch = "no error"
        except ringcomm.RingcommError as e:
            mismatch = f"{type(e).__name__}: {e}"
    else:
        comm.close()
    print("RESULT " + json.dumps({"rank": r, "errors": errs, "mismatch": mismatch}), flush=True)


main()

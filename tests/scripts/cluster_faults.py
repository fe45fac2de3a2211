"""One rank of tests/test_cluster_faults.py: what it does while the test
pulls a host's cable, kills a host's ranks, makes the links lossy or one
link slow on an emulated cluster. Launched by the test in the hosts'
namespaces as ``ringcomm run --hosts`` launches ranks (torchrun's variables:
``ringcomm.init()`` bootstraps through the store on host 0; UCX over TCP
between hosts, shared memory within a host).

    cluster_faults.py PHASE FOLDER ARGS...

  loop COUNT TIMEOUT HOW  all_reduce of COUNT float32 in a loop, every result
                          against numpy, until a call raises (the test cuts a
                          link or kills ranks meanwhile); the collectives'
                          deadline TIMEOUT s, given to ``init(timeout=)``
                          (HOW "init") or set after it (``comm.timeout =``,
                          HOW "set"; the bootstrap then keeps 60 s).
                          FOLDER/running.<rank> (its pid) after the first call.
  timed COUNT REPEAT      REPEAT all_reduces of COUNT float32, each timed (the
                          slowest rank's time is the call's) and checked
  slow COUNT LAST         gather of COUNT float32 per rank to rank 0, scatter
                          from it, a ring all_reduce of COUNT, under
                          comm.trace(): their steps (peer, bytes, duration),
                          times, and their ledger per peer against the
                          closed form (ringcomm.traffic.expected); then (LAST
                          > 0) a last round: one gather of LAST float32 per
                          rank to rank 0, rank 2 late to it by 3 s, checked,
                          and close and exit at once ("t_end": when the
                          gather returned, on time.monotonic())

timed and slow run ROUNDS rounds (the last argument): between rounds each
rank writes FOLDER/done.<round>.<rank> and waits for FOLDER/go.<round+1>,
written by the test once it has changed the network.

Each rank writes FOLDER/result.<rank>.json (atomically): rank, host,
transport, "wrong" (results or ledger entries that differed from numpy or
the closed form, as text), the phase's figures, and "error" (type, text,
peer, origin, when: time.monotonic() at the raise, on the machine's one
clock that the test's cut or kill is measured on) where a call raised.
"""

import json
import os
import socket
import sys
import time
import traceback

import numpy as np

import ringcomm
from ringcomm import traffic


def write(folder: str, rank: int, result: dict) -> None:
    path = os.path.join(folder, f"result.{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def data(count: int, rank: int, it: int) -> np.ndarray:
    """Rank's input of call `it`: exact in float32 (every sum < 2**24), unlike any other rank's or call's."""
    return ((np.arange(count) % 1009) + 7 * rank + it % 5).astype(np.float32)


def want(count: int, size: int, it: int) -> np.ndarray:
    return (size * (np.arange(count) % 1009) + 7 * size * (size - 1) // 2 + size * (it % 5)).astype(np.float32)


def error_of(e: ringcomm.RingcommError) -> dict:
    return {"type": type(e).__name__, "text": str(e), "peer": e.peer, "origin": e.origin, "when": time.monotonic()}


def loop(comm, folder: str, count: int, out: dict) -> None:
    wrong, it = [], 0
    x = np.empty(count, np.float32)
    try:
        until = time.monotonic() + 90  # (no fault came: error None, and the test fails)
        while time.monotonic() < until:
            x[:] = data(count, comm.rank, it)
            comm.all_reduce(x)
            if not np.array_equal(x, want(count, comm.size, it)):
                wrong.append(f"all_reduce #{it}: {int(np.sum(x != want(count, comm.size, it)))} wrong elements")
            it += 1
            if it == 1:  # (whole when it appears: the test reads the pid at once)
                path = os.path.join(folder, f"running.{comm.rank}")
                with open(path + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(path + ".tmp", path)
    except ringcomm.RingcommError as e:
        out["error"] = error_of(e)
    out.update(calls=it, wrong=wrong)


def timed(comm, count: int, repeat: int) -> dict:
    times, wrong = [], []
    x = np.empty(count, np.float32)
    for it in range(repeat):
        x[:] = data(count, comm.rank, it)
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(x)
        times.append(time.perf_counter() - t0)
        if not np.array_equal(x, want(count, comm.size, it)):
            wrong.append(f"all_reduce #{it}")
    return {"times": times, "wrong": wrong}


def ledger_against_closed_form(comm, collective: str, count: int, algorithm: str) -> list[str]:
    """This rank's ledger of `collective` (payload bytes per peer) against traffic.expected."""
    t = comm.traffic()
    want_ = traffic.expected(collective, count, "float32", comm.size, comm.rank, root=0, algorithm=algorithm)
    got = {"sent": t.per_peer("bytes_sent", collective=collective), "received":
           t.per_peer("bytes_received", collective=collective)}
    errs = []
    for side, w in (("sent", want_.sent), ("received", want_.received)):
        g = {p: b for p, b in got[side].items() if b}
        if g != {p: b for p, b in w.items() if b}:
            errs.append(f"{collective} {side} per peer: ledger {g}, closed form {w}")
    return errs


def slow(comm, count: int) -> dict:
    n, rank = comm.size, comm.rank
    wrong = []
    block = lambda q, k: ((np.arange(count) % 1009) + k * q).astype(np.float32)  # noqa: E731
    x = data(count, rank, 0)
    whole = np.concatenate([block(q, 13) for q in range(n)]) if rank == 0 else None
    times = {}
    comm.barrier()
    comm.reset_traffic()
    with comm.trace() as t:
        t0 = time.perf_counter()
        got = comm.gather(block(rank, 11), root=0)
        times["gather"] = time.perf_counter() - t0
        if rank == 0 and not np.array_equal(np.asarray(got).reshape(-1),
                                            np.concatenate([block(q, 11) for q in range(n)])):
            wrong.append("gather")
        comm.barrier()
        t0 = time.perf_counter()
        mine = comm.scatter(whole, root=0, out=np.empty(count, np.float32))
        times["scatter"] = time.perf_counter() - t0
        if not np.array_equal(mine, block(rank, 13)):
            wrong.append("scatter")
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(x, algorithm="ring")
        times["all_reduce"] = time.perf_counter() - t0
        if not np.array_equal(x, want(count, n, 0)):
            wrong.append("all_reduce")
    for coll, c, algo in (("gather", n * count, "linear"), ("scatter", n * count, "linear"),
                          ("all_reduce", count, "ring")):
        wrong += ledger_against_closed_form(comm, coll, c, algo)
    tr = comm.traffic()
    steps = [{"collective": s.collective, "phase": s.phase, "step": s.step, "send_peer": s.send_peer,
              "send_bytes": s.send_bytes, "recv_peer": s.recv_peer, "recv_bytes": s.recv_bytes,
              "us": s.duration_us} for s in t]
    return {"wrong": wrong, "steps": steps, "times": times,
            "sent": {str(p): int(b) for p, b in tr.per_peer("bytes_sent").items()},
            "received": {str(p): int(b) for p, b in tr.per_peer("bytes_received").items()}}


def last(comm, count: int, out: dict) -> None:
    """One gather to rank 0, rank 2 late to it (a straggler), checked; when
    it returned (the caller closes its communicator and exits at once)."""
    block = lambda q: ((np.arange(count) % 1009) + 17 * q).astype(np.float32)  # noqa: E731
    if comm.rank == 2:
        time.sleep(3)
    got = comm.gather(block(comm.rank), root=0)
    out["t_end"] = time.monotonic()
    if comm.rank == 0 and not np.array_equal(np.asarray(got).reshape(-1),
                                             np.concatenate([block(q) for q in range(comm.size)])):
        out["wrong"].append("last gather")


def between_rounds(folder: str, rnd: int, rank: int) -> None:
    """Tell the test round `rnd` is over; wait (bounded) until it says the next may start."""
    open(os.path.join(folder, f"done.{rnd}.{rank}"), "w").close()
    until = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, f"go.{rnd + 1}")):
        if time.monotonic() > until:
            raise TimeoutError(f"rank {rank}: no go.{rnd + 1} from the test within 60 s")
        time.sleep(0.02)


def main():
    phase, folder = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    rank = int(os.environ["RANK"])
    out = {"rank": rank, "host": socket.gethostname(), "transport": "", "error": None, "wrong": []}
    try:
        if phase == "loop":
            count, deadline, how = int(args[0]), float(args[1]), args[2]
            comm = ringcomm.init(timeout=deadline if how == "init" else 60)
            if how == "set":
                comm.timeout = deadline
            out["transport"] = comm.transport
            loop(comm, folder, count, out)
        else:
            comm = ringcomm.init(timeout=60)
            out["transport"] = comm.transport
            rounds = []
            for rnd in range(int(args[-1])):
                if rnd:
                    between_rounds(folder, rnd - 1, rank)
                rounds.append(timed(comm, int(args[0]), int(args[1])) if phase == "timed" else slow(comm, int(args[0])))
            out["rounds"] = rounds
            out["wrong"] = [w for r in rounds for w in r["wrong"]]
            if phase == "slow" and int(args[1]):
                between_rounds(folder, len(rounds) - 1, rank)
                last(comm, int(args[1]), out)
        t0 = time.monotonic()
        comm.close()
        out["close_s"] = round(time.monotonic() - t0, 3)
    except (ringcomm.RingcommError, TimeoutError) as e:  # (outside a loop: the bootstrap, a round, close)
        out["error"] = out["error"] or {"type": type(e).__name__, "text": str(e), "when": time.monotonic()}
        out["outside_loop"] = traceback.format_exc(limit=-3)
    write(folder, rank, out)


if __name__ == "__main__":
    main()

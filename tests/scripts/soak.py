"""Soak: many mixed collectives (sync and async, all three collectives,
random sizes, a few dtypes), checking each result, and measuring resident
memory, threads and open file descriptors after a warm-up and at the end.
Run under mpirun, or with "local N" for in-process ranks.
Prints "RESULT {json}" per rank (in-process: one line for the process).

usage: soak.py CALLS [local N]
"""

import json
import os
import sys

import numpy as np

import ringcomm


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def threads() -> int:  # OS threads (the engines' workers are native threads)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def body(comm, calls: int, warmup: int, marks: dict) -> int:
    n, r = comm.size, comm.rank
    rng = np.random.default_rng(1234)  # the same sequence on every rank
    dtypes = [np.float32, np.float64, np.int32, np.int64]
    bad = 0
    pending = []
    for i in range(calls):
        if i == warmup:  # caches, pools and threads exist by now: measure from here
            comm.barrier()
            marks["warm"] = (rss_kib(), threads(), fds())
        kind = int(rng.integers(3))
        count = int(rng.choice([1, 7, n, 1000, 4099, 65536]))
        dt = dtypes[int(rng.integers(len(dtypes)))]
        use_async = bool(rng.integers(2))
        base = (np.arange(count) % 97).astype(dt)
        if kind == 0:
            x = base * (r + 1)
            res = comm.all_reduce(x, async_op=use_async)
            expect = base * (n * (n + 1) // 2)
        elif kind == 1:
            res = comm.reduce_scatter(base * (r + 1), async_op=use_async)
            expect = np.array_split(base * (n * (n + 1) // 2), n)[r]
        else:
            mine = np.ascontiguousarray(np.array_split(base, n)[r])
            res = comm.all_gather(mine, out=np.empty(count, dt), async_op=use_async)
            expect = base
        pending.append((res, expect))  # res: the result array, or a Work returning it
        if len(pending) >= 8 or i == calls - 1:
            for res, expect in pending:
                got = res.wait() if isinstance(res, ringcomm.Work) else res
                if not np.array_equal(got, expect):
                    bad += 1
            pending.clear()
    return bad


def main() -> None:
    calls = int(sys.argv[1])
    warmup = max(1, calls // 10)
    if len(sys.argv) > 3 and sys.argv[2] == "local":
        # Rounds of `calls` collectives on fresh in-process worlds: the first
        # warms up (allocator pools, caches); growth is measured over the rest.
        n = int(sys.argv[3])
        marks: dict = {}
        samples, bad = [], 0
        for _ in range(5):
            bad += sum(ringcomm.run_local(n, body, calls, warmup, marks))
            samples.append((rss_kib(), threads(), fds()))
        print("RESULT " + json.dumps({"rank": 0, "bad": bad, "calls": 5 * calls * n,
                                      # after round 2 (the allocator has settled), and at the end
                                      "rss_kib": [max(s[0] for s in samples[1:3]), samples[-1][0]],
                                      "threads": [samples[0][1], samples[-1][1]],
                                      "fds": [samples[0][2], samples[-1][2]]}), flush=True)
        return
    comm = ringcomm.init(timeout=60)
    marks = {}
    bad = body(comm, calls, warmup, marks)
    comm.barrier()
    end = (rss_kib(), threads(), fds())
    warm = marks.get("warm", end)
    print("RESULT " + json.dumps({"rank": comm.rank, "bad": bad, "calls": calls,
                                  "rss_kib": [warm[0], end[0]], "threads": [warm[1], end[1]],
                                  "fds": [warm[2], end[2]]}), flush=True)
    comm.close()


if __name__ == "__main__":
    main()

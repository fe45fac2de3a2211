"""The shared correctness suite: one set of cases, bound to every transport.

Inputs are exactly predictable functions of (rank, index) and small enough
that every partial result is exactly representable in every dtype, so the
ring's reduction order cannot matter and results are compared for exact
equality with a numpy reference. Never all-ones: a chunk delivered to the
wrong place or reduced twice changes the values.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np

from ringcomm import traffic
from ringcomm.vocab import FLOATING, NUMPY, op_fits

DTYPES = list(NUMPY)
OPS = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]
# Every dtype with every arithmetic op; the bitwise ops on five pairs only
# (the reducers are tested on every pair in test_reducer.py, and an algorithm
# does not know the op: all 27 pairs here would make every suite half as long
# again for nothing new).
BITWISE = [("int16", "band"), ("uint8", "bor"), ("uint64", "bor"), ("int32", "bxor"), ("bool", "bxor")]
COMBOS = [(d, o) for d in DTYPES for o in OPS[:5] if op_fits(d, o)] + BITWISE
# Every dtype and every op at least once (13 cases, not 56): for the largest
# in-process worlds (64 threads on a 2-core CI machine: each ring step is 64
# thread hand-offs), where what is new is the plan at that size, not the
# reduction kernels, which the full COMBOS test at every smaller size.
COVER = [("float16", "avg"), ("bfloat16", "prod"), ("float32", "sum"), ("float64", "min"),
         ("int8", "max"), ("uint8", "sum"), ("int32", "prod"), ("int64", "min"),
         ("int16", "band"), ("uint16", "prod"), ("uint32", "max"), ("uint64", "bor"), ("bool", "bxor")]
assert {d for d, _ in COVER} == set(DTYPES) and {o for _, o in COVER} == set(OPS) and set(COVER) <= set(COMBOS)


def rank_data(dtype: str, op: str, n: int, count: int, ranks) -> np.ndarray:
    """Inputs of the given ranks: array [len(ranks), count] of `dtype`."""
    r = np.asarray(ranks, dtype=np.int64)[:, None]
    i = np.arange(count, dtype=np.int64)[None, :]
    if dtype == "bool":
        # sum, max and bor are "or", prod, min and band "and": mostly False
        # (True) with a True (False) where some rank's pattern hits, so both
        # outcomes occur in every result and each depends on the rank.
        hit = (r * 7 + i * 13) % (n + 3) == 0
        return hit if op in ("sum", "max", "bor", "bxor") else ~hit
    if op in ("band", "bor", "bxor"):
        # A bit per rank and index (cleared for band, set for bor), or a
        # hash of rank and index together (bxor: a rank's part and an
        # index's part alone would cancel out over an even number of ranks,
        # making every index's result alike), over the type's whole width.
        bits = NUMPY[dtype].itemsize * 8
        u = np.dtype(f"uint{bits}")
        one = (np.uint64(1) << ((r * 5 + i * 3) % bits).astype(np.uint64))
        if op == "bxor":
            v = ((r + 1).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ i.astype(np.uint64)) * \
                np.uint64(0xBF58476D1CE4E5B9)
        else:
            v = ~one if op == "band" else one
        return v.astype(u).view(NUMPY[dtype])
    unsigned = dtype.startswith("uint")
    if op in ("sum", "avg"):
        # |value| * n stays <= 256: partial sums are exact even in bfloat16.
        amp = max(1, min(11, 256 // n // 2))
        v = (r * 7 + i * 13) % (2 * amp + 1)
        v = v if unsigned else v - amp
    elif op == "prod":
        # Mostly 1, sometimes 2 or -1: |product| <= 2**(n/7 + 1), exact everywhere.
        v = np.where((r + 3 * i) % 7 == 0, 2, 1)
        if not unsigned:
            v = np.where((2 * r + i) % 5 == 0, -v, v)
    else:
        v = (r * 31 + i * 17) % 101
        v = v if unsigned else v - 50
    return v.astype(NUMPY[dtype])


def reference(dtype: str, op: str, n: int, count: int, ranks=None) -> np.ndarray:
    """Reduction of all ranks' inputs (or of `ranks`' only: scan's prefix,
    avg then dividing by their number), computed independently in numpy."""
    ranks = range(n) if ranks is None else ranks
    x = rank_data(dtype, op, n, count, ranks)
    if dtype == "bool":
        red = {"bxor": np.logical_xor, "sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or}.get(
            op, np.logical_and)
        return red.reduce(x, axis=0) if count else np.empty(0, np.bool_)
    if op in ("band", "bor", "bxor"):
        red = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        return red.reduce(x, axis=0) if count else np.empty(0, NUMPY[dtype])
    if dtype not in FLOATING:
        wide = x.astype(np.int64)  # integer sum/prod wrap modulo 2**bits, like numpy
        red = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
        return red.reduce(wide, axis=0).astype(NUMPY[dtype]) if count else np.empty(0, NUMPY[dtype])
    wide = x.astype(np.float64)  # exact: all partial results are representable
    if op in ("sum", "avg"):
        s = wide.sum(axis=0)
    elif op == "prod":
        s = wide.prod(axis=0)
    else:
        s = (wide.min(axis=0) if op == "min" else wide.max(axis=0))
    s = s.astype(NUMPY[dtype])
    if op == "avg":  # the documented rule: sum, then divide by n in the compute type
        compute = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else NUMPY[dtype]
        s = (s.astype(compute) / compute.type(len(ranks))).astype(NUMPY[dtype])
    return s


def identity(dtype: str, op: str, count: int) -> np.ndarray:
    """The op's identity, `count` times (exscan's rank 0; MPI leaves it
    undefined, ringcomm documents it): 0 for sum, bor, bxor; 1 for prod; the
    largest value (+inf) for min, the smallest (-inf) for max; all ones for
    band; on bool: False for sum, max, bor, bxor, True for prod, min, band."""
    dt = NUMPY[dtype]
    if dtype == "bool":
        return np.full(count, op in ("prod", "min", "band"), np.bool_)
    if op == "prod":
        v = 1
    elif op in ("min", "max"):
        if dtype in FLOATING:
            v = np.inf if op == "min" else -np.inf
        else:
            v = np.iinfo(dt).max if op == "min" else np.iinfo(dt).min
    elif op == "band":
        return np.full(count, np.iinfo(f"uint{dt.itemsize * 8}").max, f"uint{dt.itemsize * 8}").view(dt)
    else:
        v = 0
    return np.full(count, v, dt)


def scan_reference(collective: str, dtype: str, op: str, n: int, count: int, rank: int) -> np.ndarray:
    """What `rank` gets from scan (ranks 0..rank folded) or exscan (ranks
    0..rank-1; rank 0: the identity), in numpy."""
    last = rank if collective == "scan" else rank - 1
    if last < 0:
        return identity(dtype, op, count)
    return reference(dtype, op, n, count, range(last + 1))


class HostArrays:
    """Where the suite's arrays live: numpy (host memory). Device suites pass
    an adapter with the same three methods (tests/test_cuda.py)."""
    dtypes = DTYPES

    @staticmethod
    def put(a: np.ndarray):
        return a

    @staticmethod
    def get(x) -> np.ndarray:
        return np.asarray(x)

    @staticmethod
    def full(count, value, dtype):
        return np.full(count, value, dtype=dtype)


class ArenaArrays(HostArrays):
    """The suite's arrays in the communicator's shared arena (comm.empty):
    its collectives then run zero copy. Every rank allocates in the same
    order (the suite's code is the same on every rank)."""

    def __init__(self, comm):
        self.comm = comm

    def put(self, a: np.ndarray):
        x = self.comm.empty(a.shape, a.dtype)
        x[...] = a
        return x

    def full(self, count, value, dtype):
        x = self.comm.empty(count, dtype)
        x[...] = value
        return x


_cache: dict = {}
_cache_lock = threading.Lock()


def cached_reference(dtype, op, n, count, collective="all_reduce", rank=0):
    """In-process ranks share one reference per case instead of n copies
    (scan and exscan: one per rank)."""
    prefix = collective in ("scan", "exscan")
    key = (dtype, op, n, count) + ((collective, rank) if prefix else ())
    with _cache_lock:
        if key not in _cache:
            if len(_cache) > 16 + (2 * n if prefix else 0):
                _cache.clear()
            _cache[key] = scan_reference(collective, dtype, op, n, count, rank) if prefix else \
                reference(dtype, op, n, count)
        return _cache[key]


def split(count, n, r):
    return count // n + (1 if r < count % n else 0)


def offset(count, n, r):
    return sum(split(count, n, q) for q in range(r))


def compare(got, want, what: str, rank: int) -> list[str]:
    got = np.asarray(got).reshape(-1)
    want = np.asarray(want).reshape(-1)
    if got.shape != want.shape:
        return [f"rank {rank}: {what}: result has {got.size} elements, expected {want.size}"]
    if got.dtype == ml_dtypes.bfloat16:
        got, want = got.astype(np.float32), want.astype(np.float32)
    bad = np.flatnonzero(got != want)
    if not bad.size:
        return []
    i = int(bad[0])
    return [f"rank {rank}: {what}: {bad.size} wrong elements, first at index {i}: "
            f"expected {want[i]!r}, got {got[i]!r}"]


# Each rank's host, where a communicator spans hosts and runs the hierarchy
# (a script on an emulated cluster sets it: tests/scripts/cluster_suite.py).
HOSTS: list | None = None


def _add(a: dict, b: dict) -> dict:
    return {p: a.get(p, 0) + b.get(p, 0) for p in set(a) | set(b) if a.get(p, 0) + b.get(p, 0)}


def check_traffic(comm, before, collective, count, dtype, what, root=0) -> list[str]:
    """The ledger delta of one call must equal traffic.expected exactly, per
    peer, for the algorithm that ran (``comm.last_algorithm``)."""
    delta = comm.traffic() - before
    if comm.last_algorithm == "hierarchical":
        intra, inter = traffic.expected_hierarchical(count, dtype, HOSTS, comm.rank,
                                                     comm.last_algorithm_between_hosts, collective)
        exp = traffic.Expected(_add(intra.sent, inter.sent), _add(intra.received, inter.received))
    else:
        exp = traffic.expected(collective, count, dtype, comm.size, comm.rank, root=root,
                               algorithm=comm.last_algorithm)
    sent = delta.per_peer("bytes_sent", collective)
    recv = delta.per_peer("bytes_received", collective)
    errs = []
    if sent != exp.sent or recv != exp.received:
        errs.append(f"rank {comm.rank}: {what}: ledger sent {sent} received {recv}, "
                    f"expected sent {exp.sent} received {exp.received}")
    for other in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        if other != collective and delta.bytes_sent(other) + delta.bytes_received(other):
            errs.append(f"rank {comm.rank}: {what}: traffic booked under {other}")
    return errs


def halves_algorithm(algorithm: str, n: int) -> str:
    """The algorithm reduce_scatter/all_gather run in a suite for `algorithm`:
    halving-doubling's halves where the split rule allows (n a power of two)."""
    if algorithm in ("shm", "shm_flat", "zero_copy"):
        return "zero_copy" if algorithm == "zero_copy" else "shm"
    return "halving_doubling" if algorithm == "halving_doubling" and n & (n - 1) == 0 else "ring"


def run_cases(comm, counts, combos=COMBOS, collectives=("all_reduce", "reduce_scatter", "all_gather"),
              arrays=HostArrays, algorithm="auto"):
    """Run every case on this rank; return failure messages (empty: all good).
    `algorithm` is passed to all_reduce (and to reduce_scatter/all_gather
    where it exists for them)."""
    n, r = comm.size, comm.rank
    halves = halves_algorithm(algorithm, n)
    put, get = arrays.put, arrays.get
    errs: list[str] = []
    for count in counts:
        for dtype, op in combos:
            if dtype not in arrays.dtypes:
                continue
            want = cached_reference(dtype, op, n, count)
            mine = rank_data(dtype, op, n, count, [r])[0]
            tag = f"n={n} count={count} {dtype} {op} seg={comm.segment_bytes} algorithm={algorithm}"
            if "all_reduce" in collectives:
                # in place
                x = put(mine.copy())
                before = comm.traffic()
                comm.all_reduce(x, op, algorithm=algorithm)
                if algorithm != "auto" and comm.last_algorithm != algorithm and n > 1:
                    errs.append(f"rank {r}: all_reduce {tag}: ran {comm.last_algorithm}")
                errs += compare(get(x), want, f"all_reduce in-place {tag}", r)
                errs += check_traffic(comm, before, "all_reduce", count, dtype, f"all_reduce {tag}")
                # out of place: input untouched
                x = put(mine.copy())
                out = arrays.full(count, 99, mine.dtype)
                comm.all_reduce(x, op, out=out, algorithm=algorithm)
                errs += compare(get(out), want, f"all_reduce out-of-place {tag}", r)
                errs += compare(get(x), mine, f"all_reduce out-of-place input modified {tag}", r)
            if "reduce_scatter" in collectives:
                x = put(mine.copy())
                before = comm.traffic()
                got = comm.reduce_scatter(x, op, algorithm=halves)
                lo = offset(count, n, r)
                errs += compare(get(got), want[lo:lo + split(count, n, r)], f"reduce_scatter {tag}", r)
                errs += compare(get(x), mine, f"reduce_scatter input modified {tag}", r)
                errs += check_traffic(comm, before, "reduce_scatter", count, dtype, f"reduce_scatter {tag}")
            if "all_gather" in collectives and op == "sum":
                lo = offset(count, n, r)
                x = put(mine[lo:lo + split(count, n, r)].copy())
                full = rank_data(dtype, op, n, count, range(n))
                gathered = np.concatenate([full[q][offset(count, n, q):offset(count, n, q) + split(count, n, q)]
                                           for q in range(n)]) if count else mine[:0]
                out = arrays.full(count, 77, mine.dtype)
                before = comm.traffic()
                comm.all_gather(x, out=out, algorithm=halves)
                errs += compare(get(out), gathered, f"all_gather {tag}", r)
                errs += check_traffic(comm, before, "all_gather", count, dtype, f"all_gather {tag}")
            if len(errs) > 20:
                return errs
    return errs


def run_broadcasts(comm, counts, dtypes=DTYPES, arrays=HostArrays, algorithm="auto") -> list[str]:
    n, r = comm.size, comm.rank
    errs = []
    for count in counts:
        for dtype in dtypes:
            if dtype not in arrays.dtypes:
                continue
            for root in sorted({0, n - 1, n // 2}):
                src = rank_data(dtype, "min", n, count, [root])[0]
                x = arrays.put(src.copy()) if r == root else arrays.full(count, 0, src.dtype)
                before = comm.traffic()
                comm.broadcast(x, root=root, algorithm=algorithm)
                tag = f"broadcast n={n} count={count} {dtype} root={root} seg={comm.segment_bytes} " \
                      f"algorithm={comm.last_algorithm}"
                errs += compare(arrays.get(x), src, tag, r)
                errs += check_traffic(comm, before, "broadcast", count, dtype, tag, root=root)
    return errs


def run_barrier(comm, algorithm="auto") -> list[str]:
    """Barrier: nobody leaves before everybody entered (checked with a shared
    clock for in-process ranks; for MPI just that it completes)."""
    before = comm.traffic()
    for _ in range(3):
        comm.barrier(algorithm=algorithm)
    d = comm.traffic() - before
    if d.bytes_sent("barrier") or d.bytes_received("barrier"):
        return [f"rank {comm.rank}: barrier moved payload bytes"]
    # the ring passes n-2 tokens per rank; in shared memory, flags alone
    want = 0 if comm.last_algorithm == "shm" else 3 * max(0, comm.size - 2)
    if d.msgs_sent("barrier") != want:
        return [f"rank {comm.rank}: barrier sent {d.msgs_sent('barrier')} tokens, expected {want}"]
    return []


def irecv_across_a_collective(comm, how: str, src: int = 0, dst: int = 1, count: int = 300001) -> list[str]:
    """Point-to-point beside a collective (tests/test_p2p.py, scripts/p2p_mpi.py,
    test_shm_hierarchy.py's hierarchical script): rank `dst` posts an irecv from `src`,
    runs an all_reduce, then waits; `src` sends (blocking, rendezvous-sized:
    it returns only once matched) and then joins the all_reduce. The
    collective's waits must match the pending receive (Link::set_p2p_progress),
    else a deadlock until the timeout. `how`: the all_reduce's algorithm, or
    "async" (issued with async_op=True first, the irecv posted while it runs).
    Returns this rank's errors."""
    r, n = comm.rank, comm.size
    algorithm = "auto" if how == "async" else how
    x = np.arange(count, dtype=np.float32) + r
    message = np.arange(count, dtype=np.float32) * 2 + 1
    errs = []
    if r == dst:
        y = np.zeros(count, np.float32)
        if how == "async":
            h = comm.all_reduce(x, async_op=True)
            w = comm.irecv(y, src, tag=21)
            s = h.wait()
        else:
            w = comm.irecv(y, src, tag=21)
            s = comm.all_reduce(x, algorithm=algorithm)
        w.wait()
        errs += compare(y, message, f"irecv across an all_reduce ({how})", r)
    else:
        if r == src:
            comm.send(message, dst, tag=21)
        s = comm.all_reduce(x, algorithm=algorithm)
    return errs + compare(s, np.arange(count, dtype=np.float32) * n + n * (n - 1) // 2, f"all_reduce ({how})", r)


def any_source_behind_one_rank(comm):
    """Point-to-point, MPI's matching order (3 ranks or more; tests/test_p2p.py
    and scripts/p2p_mpi.py): rank 0 posts a receive from rank 1, then one from
    any rank, same tag. Rank 2's message must go to the second at once,
    though the first still waits: rank 1 sends only after rank 0 has heard
    from rank 2. Returns, on rank 0, (source, data) of the any-source receive
    then of the other; None elsewhere."""
    r = comm.rank
    if r == 0:
        a, b = np.zeros(2), np.zeros(2)
        w1, w2 = comm.irecv(a, 1, tag=4), comm.irecv(b, None, tag=4)
        w2.wait()
        comm.send(np.full(2, 1.0), 1, tag=5)
        w1.wait()
        return w2.source, b.tolist(), w1.source, a.tolist()
    if r == 1:
        x = np.zeros(2)
        comm.recv(x, 0, tag=5)
        comm.send(x + 10, 0, tag=4)
    elif r == 2:
        comm.send(np.full(2, 2.0), 0, tag=4)
    return None


ANY_SOURCE_BEHIND_ONE_RANK = (2, [2.0, 2.0], 1, [11.0, 11.0])  # what rank 0 must see

"""The shared suite of reduce, gather, scatter, all_to_all, scan and exscan, bound to every
transport (tests/test_collectives.py in process, tests/test_mpi.py over MPI,
tests/scripts/ucx_suite.py over UCX, the shared-memory window in
tests/test_shm_collectives.py and tests/test_shm_processes.py). Data are exact, rank-dependent functions of (rank, index) from
suite.rank_data (never all-ones); results are compared with an independent
numpy reference, and each call's ledger with traffic.expected, per peer."""

from __future__ import annotations

import numpy as np

import suite
from ringcomm import traffic
from ringcomm.vocab import NUMPY

COPY_DTYPES = ["float32", "bfloat16", "int8", "int64", "float16", "bool", "uint16"]


def block_counts(count: int, n: int) -> list[int]:
    """Uneven per-rank counts (zeros included) derived from `count`."""
    return [(count + 3 * q) % 5 + (q % 2) * (count % 3) for q in range(n)]


def split_matrix(count: int, n: int) -> list[list[int]]:
    """splits[q][p]: elements rank q sends to rank p (zeros included)."""
    return [[(count + 3 * q + 5 * p) % 4 for p in range(n)] for q in range(n)]


def values(dtype: str, n: int, count: int, rank: int) -> np.ndarray:
    return suite.rank_data(dtype, "min", n, count, [rank])[0]


def ledger(comm, before, coll, count, dtype, what, root=0, counts=None, splits=None,
           segment_bytes=0) -> list[str]:
    delta = comm.traffic() - before
    window = getattr(comm._engine, "window", None)  # (reduce "shm": its single-copy limit decides the parts)
    exp = traffic.expected(coll, count, dtype, comm.size, comm.rank, root=root, algorithm=comm.last_algorithm,
                           counts=counts, splits=splits, single_copy_min=window.single_copy_min if window else None,
                           segment_bytes=segment_bytes)
    sent, recv = delta.per_peer("bytes_sent", coll), delta.per_peer("bytes_received", coll)
    errs = []
    if sent != exp.sent or recv != exp.received:
        errs.append(f"rank {comm.rank}: {what}: ledger sent {sent} received {recv}, "
                    f"expected sent {exp.sent} received {exp.received}")
    for other in traffic.COLLECTIVES:
        if other != coll and delta.bytes_sent(other) + delta.bytes_received(other):
            errs.append(f"rank {comm.rank}: {what}: traffic booked under {other}")
    return errs


def run_reduce(comm, counts, combos=suite.COMBOS, algorithms=("binomial", "ring", "auto")) -> list[str]:
    n, r = comm.size, comm.rank
    errs: list[str] = []
    for count in counts:
        for dtype, op in combos:
            want = suite.cached_reference(dtype, op, n, count)
            mine = suite.rank_data(dtype, op, n, count, [r])[0]
            for algorithm in algorithms:
                for root in sorted({0, n - 1, n // 2}):
                    tag = f"reduce n={n} count={count} {dtype} {op} root={root} algorithm={algorithm} " \
                          f"seg={comm.segment_bytes}"
                    x = mine.copy()
                    before = comm.traffic()
                    got = comm.reduce(x, root=root, op=op, algorithm=algorithm)
                    if algorithm != "auto" and comm.last_algorithm != algorithm:
                        errs.append(f"rank {r}: {tag}: ran {comm.last_algorithm}")
                    if r == root:
                        errs += suite.compare(got, want, f"{tag} (in place)", r)
                    else:
                        if got is not None:
                            errs.append(f"rank {r}: {tag}: returned {type(got).__name__}, expected None off the root")
                        errs += suite.compare(x, mine, f"{tag}: input modified off the root", r)
                    errs += ledger(comm, before, "reduce", count, dtype, tag, root=root)
                    if r == root and algorithm != "auto":  # out of place: the input untouched
                        x = mine.copy()
                        out = np.full(count, 99, mine.dtype)
                        comm.reduce(x, root=root, op=op, out=out, algorithm=algorithm)
                        errs += suite.compare(out, want, f"{tag} (out)", r)
                        errs += suite.compare(x, mine, f"{tag}: input modified by out=", r)
                    elif algorithm != "auto":
                        comm.reduce(mine.copy(), root=root, op=op, algorithm=algorithm)
            if len(errs) > 20:
                return errs
    return errs


def run_scan(comm, counts, combos=suite.COMBOS, algorithms=("recursive_doubling", "linear", "auto"),
             arrays=suite.HostArrays) -> list[str]:
    """scan and exscan of rank-dependent data against numpy's prefix over
    ranks 0..r (exscan: 0..r-1, rank 0 the op's identity; exscan has no avg),
    by each of `algorithms`, in place and out of place by turns (the input
    untouched), and each call's ledger against the row's closed form."""
    n, r = comm.size, comm.rank
    errs: list[str] = []
    for count in counts:
        for dtype, op in combos:
            if dtype not in arrays.dtypes:
                continue
            mine = suite.rank_data(dtype, op, n, count, [r])[0]
            for coll in ("scan", "exscan"):
                if coll == "exscan" and op == "avg":
                    continue
                want = suite.cached_reference(dtype, op, n, count, coll, r)
                for i, algorithm in enumerate(algorithms):
                    tag = f"{coll} n={n} count={count} {dtype} {op} algorithm={algorithm} seg={comm.segment_bytes}"
                    x = arrays.put(mine.copy())
                    before = comm.traffic()
                    if (i + count) % 2:
                        getattr(comm, coll)(x, op, algorithm=algorithm)
                        errs += suite.compare(arrays.get(x), want, f"{tag} (in place)", r)
                    else:
                        out = arrays.full(count, 99, mine.dtype)
                        getattr(comm, coll)(x, op, out=out, algorithm=algorithm)
                        errs += suite.compare(arrays.get(out), want, f"{tag} (out)", r)
                        errs += suite.compare(arrays.get(x), mine, f"{tag}: input modified", r)
                    errs += ran(comm, coll, algorithm, tag)
                    errs += ledger(comm, before, coll, count, dtype, tag, segment_bytes=comm.segment_bytes)
            if len(errs) > 20:
                return errs
    return errs


def ran(comm, coll, algorithm, tag) -> list[str]:
    """The algorithm asked for is the one that ran ("auto": any)."""
    if algorithm != "auto" and comm.size > 1 and comm.last_algorithm != algorithm:
        return [f"rank {comm.rank}: {coll} {tag}: ran {comm.last_algorithm}, asked for {algorithm}"]
    return []


def run_gather_scatter(comm, counts, dtypes=COPY_DTYPES, algorithm="auto") -> list[str]:
    n, r = comm.size, comm.rank
    errs: list[str] = []
    for count in counts:
        for dtype in dtypes:
            for uneven in (False, True):
                blocks = block_counts(count, n) if uneven else [count] * n
                cl = blocks if uneven else None
                total = sum(blocks)
                every = [values(dtype, n, blocks[q], q) for q in range(n)]
                whole = np.concatenate(every) if total else np.empty(0, NUMPY[dtype])
                for root in sorted({0, n - 1}):
                    tag = f"n={n} count={count} {dtype} counts={cl} root={root} seg={comm.segment_bytes} " \
                          f"algorithm={algorithm}"
                    # gather
                    x = every[r].copy()
                    before = comm.traffic()
                    got = comm.gather(x, root=root, counts=cl, algorithm=algorithm)
                    errs += ran(comm, "gather", algorithm, tag)
                    if r == root:
                        errs += suite.compare(got, whole, f"gather {tag}", r)
                    elif got is not None:
                        errs.append(f"rank {r}: gather {tag}: returned something off the root")
                    errs += suite.compare(x, every[r], f"gather {tag}: input modified", r)
                    errs += ledger(comm, before, "gather", total, dtype, f"gather {tag}", root, cl)
                    # scatter: the root's buffer is the concatenation
                    src = whole.copy() if r == root else None
                    out = np.full(blocks[r], 77, NUMPY[dtype])
                    before = comm.traffic()
                    got = comm.scatter(src, root=root, counts=cl, out=out, algorithm=algorithm)
                    errs += ran(comm, "scatter", algorithm, tag)
                    errs += suite.compare(got, every[r], f"scatter {tag}", r)
                    errs += ledger(comm, before, "scatter", total, dtype, f"scatter {tag}", root, cl)
                    # the root's list of arrays, one per block (torch's gather_list / scatter_list)
                    outs = [np.full(blocks[q], 66, NUMPY[dtype]) for q in range(n)] if r == root else None
                    before = comm.traffic()
                    got = comm.gather(every[r].copy(), root=root, counts=cl, out=outs, algorithm=algorithm)
                    errs += ran(comm, "gather", algorithm, tag)
                    if r == root:
                        if got is not outs:
                            errs.append(f"rank {r}: gather {tag} into a list: returned {type(got).__name__}")
                        for q in range(n):
                            errs += suite.compare(outs[q], every[q], f"gather {tag} into a list, block {q}", r)
                    errs += ledger(comm, before, "gather", total, dtype, f"gather {tag} into a list", root, cl)
                    src = [every[q].copy() for q in range(n)] if r == root else None
                    out = np.full(blocks[r], 78, NUMPY[dtype])
                    before = comm.traffic()
                    comm.scatter(src, root=root, counts=cl, out=out, algorithm=algorithm)
                    errs += suite.compare(out, every[r], f"scatter {tag} from a list", r)
                    errs += ledger(comm, before, "scatter", total, dtype, f"scatter {tag} from a list", root, cl)
            if len(errs) > 20:
                return errs
    return errs


def per_peer_algorithm(comm, algorithm: str) -> str:
    """What all_to_all with per-peer splits can run for a suite of
    `algorithm`: the window where there is one, else auto."""
    if algorithm == "pairwise":
        return algorithm
    w = getattr(comm._engine, "window", None)
    return algorithm if algorithm == "shm" and w is not None else "auto"


def run_all_to_all(comm, counts, dtypes=COPY_DTYPES, algorithm="auto") -> list[str]:
    """Equal blocks by `algorithm`; per-peer splits (one array, lists) by it
    where they can (per_peer_algorithm), else auto."""
    n, r = comm.size, comm.rank
    vee = per_peer_algorithm(comm, algorithm)
    errs: list[str] = []
    for count in counts:
        for dtype in dtypes:
            # equal blocks: `count` elements per block
            inputs = [values(dtype, n, count * n, q) for q in range(n)]
            want = np.concatenate([inputs[q][r * count:(r + 1) * count] for q in range(n)])
            tag = f"all_to_all n={n} block={count} {dtype} seg={comm.segment_bytes} algorithm={algorithm}"
            x = inputs[r].copy()
            before = comm.traffic()
            got = comm.all_to_all(x, algorithm=algorithm)
            errs += ran(comm, "all_to_all", algorithm, tag)
            errs += suite.compare(got, want, tag, r)
            errs += suite.compare(x, inputs[r], f"{tag}: input modified", r)
            errs += ledger(comm, before, "all_to_all", count * n, dtype, tag)
            # per-peer splits (lists of ints take the native description; an
            # array of splits, the Python adapter)
            errs += per_peer_case(comm, split_matrix(count, n), dtype, vee, f"seg={comm.segment_bytes}",
                                  as_array=count % 2 == 0)
            if len(errs) > 20:
                return errs
    return errs


def per_peer_case(comm, m, dtype, algorithm, note="", as_array=False) -> list[str]:
    """all_to_all with per-peer splits m[q][p] (elements rank q sends rank
    p), from one array and from lists of arrays (torch's list form: the same
    blocks, the same bytes), against numpy and the ledger's closed form."""
    n, r = comm.size, comm.rank
    ins = [values(dtype, n, sum(m[q]), q) for q in range(n)]
    offs = [np.concatenate([[0], np.cumsum(m[q])]).astype(int) for q in range(n)]
    want = np.concatenate([ins[q][offs[q][r]:offs[q][r + 1]] for q in range(n)])
    out_splits = [m[q][r] for q in range(n)]
    tag = f"all_to_all n={n} splits={m[r]} out_splits={out_splits} {dtype} {note} algorithm={algorithm}"
    out = np.full(sum(out_splits), 55, NUMPY[dtype])
    before = comm.traffic()
    comm.all_to_all(ins[r].copy(), np.array(m[r]) if as_array else m[r], out_splits, out=out, algorithm=algorithm)
    errs = ran(comm, "all_to_all", algorithm, tag)
    errs += suite.compare(out, want, tag, r)
    errs += ledger(comm, before, "all_to_all", sum(m[r]), dtype, tag, splits=m)
    blocks_in = [ins[r][offs[r][p]:offs[r][p + 1]].copy() for p in range(n)]
    outs = [np.full(out_splits[q], 44, NUMPY[dtype]) for q in range(n)]
    before = comm.traffic()
    got = comm.all_to_all(blocks_in, out=outs, algorithm=algorithm)
    errs += ran(comm, "all_to_all", algorithm, f"{tag} with lists")
    if got is not outs:
        errs.append(f"rank {r}: {tag} with lists: returned {type(got).__name__}")
    errs += suite.compare(np.concatenate(outs), want, f"{tag} with lists", r)
    errs += ledger(comm, before, "all_to_all", sum(m[r]), dtype, f"{tag} with lists", splits=m)
    return errs


def run_all_to_all_mixed(comm, algorithm="shm") -> list[str]:
    """Per-peer blocks of mixed sizes (empty, a few elements, 4-16 KB: with
    a small slot or single-copy limit, on both sides of them) by `algorithm`
    where it can run (per_peer_algorithm)."""
    n = comm.size
    m = [[((7 * q + 13 * p) % 5) * 1000 + (q + p) % 3 for p in range(n)] for q in range(n)]
    vee = per_peer_algorithm(comm, algorithm)
    return [e for dtype in ("float32", "int8") for e in per_peer_case(comm, m, dtype, vee, "mixed")]


# algorithms="p2p" forces the message algorithms, "shm" the window's (scan
# and exscan have no window algorithm: auto, by messages, beside the window)
ALGORITHMS = {"auto": (("binomial", "ring", "auto"), "auto", "auto", ("recursive_doubling", "linear", "auto")),
              "p2p": (("binomial", "ring"), "linear", "pairwise", ("recursive_doubling", "linear")),
              "shm": (("shm", "shm_flat"), "shm", "shm", ("auto",))}


def run_all(comm, counts, reduce_combos=suite.COMBOS, algorithms="auto") -> list[str]:
    reduce_algos, gs, a2a, scans = ALGORITHMS[algorithms]
    return (run_reduce(comm, counts, reduce_combos, reduce_algos) + run_gather_scatter(comm, counts, algorithm=gs)
            + run_all_to_all(comm, counts, algorithm=a2a)
            # scan and exscan: every dtype and op once (suite.COVER) where
            # reduce takes them all; tests/test_scan.py has every pair in process
            + run_scan(comm, counts, reduce_combos if len(reduce_combos) <= len(suite.COVER) else suite.COVER,
                       scans))

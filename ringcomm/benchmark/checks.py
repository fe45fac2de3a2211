"""What the benchmark runs and how it checks it: collectives, ops, the size
range, the bus-bandwidth factor, the element count of a size, and exactly
predictable check data with its expected result (every dtype, every op)."""

from __future__ import annotations

import numpy as np

from .. import vocab

from ..tuning import costmodel

# The ring's three (the alpha-beta fits and mpi-ring cover these), then the
# rooted, all-to-all and point-to-point ones. `--collective all`
# runs every one; the default run stays all_reduce.
RING_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
# The prefix reductions, against MPI_Scan / MPI_Exscan: a buffer
# in, one of the same size out, as all_reduce.
PREFIX = ("scan", "exscan")
OTHER_COLLECTIVES = ("reduce", "gather", "scatter", "all_to_all", "sendrecv") + PREFIX
COLLECTIVES = RING_COLLECTIVES + OTHER_COLLECTIVES
# Collectives that reduce (the op matters); the others only move data.
REDUCING = ("all_reduce", "reduce_scatter", "reduce") + PREFIX
# Equal blocks per rank: the count is rounded down to a multiple of n (as nccl-tests does).
BLOCKED = ("gather", "scatter", "all_to_all")
ROOT = 0  # the root of reduce, gather and scatter (nccl-tests' default -R 0)
OPS = ("sum", "prod", "min", "max", "avg", *vocab.BITWISE)  # (each where it fits a dtype: vocab.op_fits)


def size_list(begin: int, end: int, factor: float) -> list[int]:
    """Sizes in bytes from begin to end (inclusive), multiplying by factor."""
    if begin <= 0 or end < begin or factor <= 1:
        raise ValueError(f"bad size range: -b {begin} -e {end} -f {factor} (need 0 < b <= e, f > 1)")
    out, s = [], begin
    while s <= end:
        out.append(int(s))
        s *= factor
    return out


def op_runs(collective: str, dtype: str, op: str) -> bool:
    """Whether the bench runs `op` on `dtype` for a reducing `collective`:
    where the op fits the dtype, and never exscan's avg (refused: rank 0
    would average over no ranks)."""
    return vocab.op_fits(dtype, op) and not (collective == "exscan" and op == "avg")


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests busbw = algbw * factor: 2(n-1)/n for all_reduce, (n-1)/n for
    reduce_scatter, all_gather, gather, scatter and alltoall, 1 for reduce,
    sendrecv, scan and exscan (a rank sends and receives about the buffer
    once: the pipeline's volume; recursive doubling sends it log2(n) times)."""
    if collective in ("reduce", "sendrecv") + PREFIX:
        return 1.0
    if collective in BLOCKED:
        return (n - 1) / n
    return costmodel.volume_factor(collective, n)


def count_for(nbytes: int, dtype: str, n: int, collective: str = "all_reduce") -> int:
    """Element count of the full buffer: nbytes in whole elements, at least one
    (ranks beyond the count get empty chunks, as the split rule says). gather,
    scatter and all_to_all: a multiple of n, at least n (equal blocks; the
    size is the whole buffer of all ranks' blocks, as nccl-tests counts it)."""
    count = max(1, nbytes // vocab.itemsize(dtype))
    if collective in BLOCKED:
        count = max(n, count // n * n)
    return count


# Largest exactly representable pattern value per dtype (op "none": data that only moves).
_MOVE_MOD = {"int8": 127, "uint8": 255, "bfloat16": 256, "float16": 2048, "int16": 32749, "bool": 2}


def check_data(dtype: str, op: str, rank: int, count: int) -> np.ndarray:
    """Exactly predictable input of `rank`: partial results are exact in every dtype.

    op "none" (gather, scatter, all_to_all, sendrecv: nothing is reduced): a
    pattern of (rank, index) that is not periodic in the index, so a block
    delivered to the wrong place or from the wrong rank shows as wrong
    elements (the reducing patterns repeat every 3, 5, 7 or 21 elements: built
    from one period, which keeps the untimed checks of large buffers cheap)."""
    period = _PERIOD.get(op)
    if period is not None and count > period:
        return _repeat(check_data(dtype, op, rank, period), count)
    i = np.arange(count, dtype=np.int64)
    if op == "none":
        v = (i * 7919 + rank * 104729 + (i * i) % 65521) % _MOVE_MOD.get(dtype, 65521)
    elif op in ("sum", "avg"):
        v = (rank + 1) * (i % 5 + 1) % 9
    elif op == "prod":
        v = np.where((i + rank) % 3 == 0, 2, 1)
    elif op in ("min", "max"):
        v = (rank * 3 + i) % 7
    else:
        v = _bitwise_data(op, rank, i, dtype == "bool")
    return v.astype(vocab.NUMPY[dtype])


def _bitwise_data(op: str, rank: int, i: np.ndarray, bool_: bool) -> np.ndarray:
    """Values below 128 (every integer dtype holds them), 0 or 1 for bool.
    band and bor: a third of the ranks clear (band) or set (bor) one of
    seven bits at each index (bool: bit 0), so the result neither fills nor
    empties at the world sizes one host runs (up to 16: at most six of the
    seven bits) and every rank changes it somewhere; bxor: a value of rank
    and index (bool: its own, as bit 0 of that one cancels over 7 ranks)."""
    hit = (rank + i) % 3 == 0
    bit = np.left_shift(1, (rank + i) % 7)
    if op == "band":
        v = np.where(hit, 127 ^ bit, 127)
    elif op == "bor":
        v = np.where(hit, bit, 0)
    elif bool_:
        return (((rank + i) % 7 == 0) | hit).astype(np.int64)
    else:
        return ((rank * 3 + i) % 7 * 19 + rank * 5) % 128
    return v & 1 if bool_ else v


def _repeat(base: np.ndarray, count: int) -> np.ndarray:
    """base repeated to count elements."""
    return np.tile(base, -(-count // base.size))[:count].copy()


# The index period of each reducing op's pattern in check_data.
_PERIOD = {"sum": 5, "avg": 5, "prod": 3, "min": 7, "max": 7, "band": 21, "bor": 21, "bxor": 21}


def check_expected(dtype: str, op: str, n: int, count: int) -> np.ndarray:
    """The exact result of reducing every rank's check_data (elementwise, so
    one period of it, repeated)."""
    period = _PERIOD.get(op)
    if period is not None and count > period:
        return _repeat(check_expected(dtype, op, n, period), count)
    if op in vocab.BITWISE:
        x = np.stack([check_data(dtype, op, r, count).astype(np.int64) for r in range(n)])
        red = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op].reduce(x, 0)
        return red.astype(vocab.NUMPY[dtype])
    x = np.stack([check_data(dtype, op, r, count).astype(np.float64) for r in range(n)])
    red = {"sum": x.sum(0), "avg": x.sum(0), "prod": x.prod(0), "min": x.min(0), "max": x.max(0)}[op]
    out = red.astype(vocab.NUMPY[dtype])
    if op == "avg":
        compute = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else vocab.NUMPY[dtype]
        out = (out.astype(compute) / compute.type(n)).astype(vocab.NUMPY[dtype])
    return out


def prefix_expected(collective: str, dtype: str, op: str, rank: int, count: int) -> np.ndarray | None:
    """What `rank` gets from scan (check_data of ranks 0..rank reduced, avg
    over rank + 1) or exscan (ranks 0..rank-1); None for exscan's rank 0,
    whose result is the op's identity in ringcomm and undefined in MPI."""
    ranks = rank + 1 if collective == "scan" else rank
    return check_expected(dtype, op, ranks, count) if ranks else None


def split(count: int, n: int, r: int) -> tuple[int, int]:
    """(offset, length) of chunk r under the split rule (vocab)."""
    return vocab.chunk_offset(count, n, r), vocab.chunk_count(count, n, r)

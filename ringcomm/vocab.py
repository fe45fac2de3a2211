"""ringcomm's vocabulary: the one place that names what the engine knows.

Dtypes, reduction ops, collectives and algorithms with their native codes
(the enums of ``csrc/core/vocabulary.h``: dtypes and ops mirrored here and
checked at import by :mod:`ringcomm.algorithms`, collectives and algorithms
read from the extension), how numpy,
DLPack and torch spell each dtype, and the split rule that every layer
(communicator, traffic formulas, sharded training, demos, benchmark checks)
uses to cut a buffer into one chunk per rank.

The split rule (``numpy.array_split``'s): of `count` elements over `n` ranks,
chunk r holds ``count // n`` elements, plus one if ``r < count % n``, in rank
order. So chunk r starts at ``r * (count // n) + min(r, count % n)``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = [
    "DTYPES", "FLOATING", "OPS", "BITWISE", "op_fits", "COLLECTIVES", "ALGORITHMS", "NUMPY", "DLPACK", "SUPPORTED",
    "numpy_name", "torch_name", "torch_dtype", "itemsize", "op_code", "algorithm_code",
    "chunk_count", "chunk_offset", "chunk_range", "chunk_counts",
]

# name -> native code; the order of DType / Op in csrc/core/vocabulary.h
DTYPES = {
    "float16": 0, "bfloat16": 1, "float32": 2, "float64": 3,
    "int8": 4, "uint8": 5, "int32": 6, "int64": 7,
    "int16": 8, "uint16": 9, "uint32": 10, "uint64": 11, "bool": 12,
}
FLOATING = ("float16", "bfloat16", "float32", "float64")
# bool's ops are logical: sum and max are "or", prod and min are "and" (a sum
# of bools is a bool, as in gloo and numpy's add.reduce on bool); avg is refused.
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4, "band": 5, "bor": 6, "bxor": 7}
# Bitwise ops: integer and bool dtypes only (on bool: and, or, xor).
BITWISE = ("band", "bor", "bxor")
# Collectives and algorithms: the native vocabulary's own lists
# (RC_COLLECTIVES, RC_ALGORITHMS in csrc/core/vocabulary.h), read from the
# extension rather than restated, so a new collective or algorithm is a line
# there only. send and recv (P2P) are point-to-point: not collectives (no call
# sequence number); their codes name them in the ledger and the flight recorder.
# "auto" (-1) is resolved per call by the engine, from the limits the cost
# model gives it (ringcomm/tuning/selection.py).
def _native_codes() -> tuple[dict, dict]:
    from ._native import core
    codes = core.vocabulary_codes()
    return dict(codes["collectives"]), dict(codes["algorithms"])


COLLECTIVES, ALGORITHMS = _native_codes()
P2P = ("send", "recv")

class _NumpyDtypes(Mapping):
    """Our name -> numpy dtype, every name of DTYPES. numpy has no bfloat16:
    ml_dtypes' is imported on first use of it, not with ringcomm, because
    that import cost 0.9-1.6 s (ml_dtypes 0.7.0 with numpy 2.4: it registers
    its casts and loops one by one; 0.12-0.15 s with 0.5 and 0.6), which
    every rank of every job paid at ``import ringcomm``. A bfloat16 array
    exists only once ml_dtypes is imported, so numpy_name never imports it."""

    def __init__(self, eager: dict):
        self._d = eager

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bfloat16" and name not in self._d:
            import ml_dtypes
            self._d[name] = np.dtype(ml_dtypes.bfloat16)
        return self._d[name]

    def __contains__(self, name) -> bool:
        return name in DTYPES

    def __iter__(self):
        return iter(DTYPES)

    def __len__(self) -> int:
        return len(DTYPES)


NUMPY = _NumpyDtypes({
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "int16": np.dtype(np.int16), "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "bool": np.dtype(np.bool_),
})
_BY_NUMPY = {NUMPY[k]: k for k in DTYPES if k != "bfloat16"}

# DLPack (code, bits) -> name. Codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
DLPACK = {
    (2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64",
    (0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64",
    (0, 16): "int16", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (6, 8): "bool",
}

SUPPORTED = ", ".join(DTYPES)


def numpy_name(dtype: np.dtype) -> str | None:
    """Our name for a numpy dtype, or None if unsupported (byte order must be native)."""
    dtype = np.dtype(dtype)
    if not dtype.isnative:
        return None
    if dtype.name == "bfloat16" and dtype == NUMPY["bfloat16"]:
        return "bfloat16"  # (ml_dtypes is imported already: its array is here)
    return _BY_NUMPY.get(dtype)


# torch.dtype -> our name (None: unsupported), filled on first use, so that
# importing ringcomm never imports torch. torch names its dtypes as we do.
_TORCH_NAMES: dict = {}


def torch_name(dt) -> str | None:
    """Our name for a torch dtype, or None if unsupported."""
    name = _TORCH_NAMES.get(dt, "?")
    if name == "?":
        name = str(dt).replace("torch.", "")
        name = name if name in DTYPES else None
        _TORCH_NAMES[dt] = name
    return name


def name_of(dtype) -> str | None:
    """Our name for a dtype however spelled (one of our names, a numpy dtype
    or its spelling, a torch dtype), or None if unsupported."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    if type(dtype).__module__ == "torch":  # torch.float32, torch.bfloat16, ...
        return torch_name(dtype)
    try:
        return numpy_name(dtype)
    except TypeError:  # not a dtype numpy knows
        return None


def torch_dtype(name: str):
    """The torch dtype of one of our names."""
    import torch
    return getattr(torch, name)


def itemsize(name: str) -> int:
    return NUMPY[name].itemsize


def op_code(op: str, dtype: str) -> int:
    """The native code of `op` for elements of `dtype`; InvalidArgument if
    unknown or not defined there (avg on an integer type, band/bor/bxor on
    a floating one)."""
    from .errors import InvalidArgument
    if not isinstance(op, str) or op not in OPS:
        raise InvalidArgument(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    if not op_fits(dtype, op):
        if op == "avg":
            raise InvalidArgument(f"op 'avg' needs a floating dtype, got {dtype} "
                                  "(use 'sum' and divide, or convert to a floating type)")
        raise InvalidArgument(f"op {op!r} needs an integer or bool dtype, got {dtype}")
    return OPS[op]


def op_fits(dtype: str, op: str) -> bool:
    """Whether `op` is defined on `dtype` (avg: floating types; band, bor,
    bxor: integers and bool), as op_code and the native check_op decide."""
    return (op != "avg" or dtype in FLOATING) and (op not in BITWISE or dtype not in FLOATING)


def algorithm_code(name: str) -> int:
    from .errors import InvalidArgument
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise InvalidArgument(f"unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}") from None


# ---- the split rule ----------------------------------------------------------
def chunk_count(count: int, n: int, r: int) -> int:
    """Elements in chunk r of `count` split over `n` ranks."""
    return count // n + (1 if r < count % n else 0)


def chunk_offset(count: int, n: int, r: int) -> int:
    """Index of chunk r's first element."""
    return r * (count // n) + min(r, count % n)


def chunk_range(count: int, n: int, r: int) -> tuple[int, int]:
    """Chunk r as a half-open range [lo, hi) of element indices."""
    lo = chunk_offset(count, n, r)
    return lo, lo + chunk_count(count, n, r)


def chunk_counts(count: int, n: int) -> list[int]:
    """Every chunk's element count, in rank order."""
    return [chunk_count(count, n, r) for r in range(n)]

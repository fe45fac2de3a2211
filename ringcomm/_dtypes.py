"""The dtypes and ops ringcomm supports, and their native codes (csrc/core/vocabulary.h)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# name -> native code; order is the DType enum in csrc/core/vocabulary.h
DTYPES = {
    "float16": 0, "bfloat16": 1, "float32": 2, "float64": 3,
    "int8": 4, "uint8": 5, "int32": 6, "int64": 7,
}
FLOATING = ("float16", "bfloat16", "float32", "float64")
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
COLLECTIVES = {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2, "broadcast": 3, "barrier": 4}

NUMPY = {
    "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
}
_BY_NUMPY = {v: k for k, v in NUMPY.items()}

# DLPack (code, bits) -> name. Codes: 0 int, 1 uint, 2 float, 4 bfloat.
DLPACK = {
    (2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64",
    (0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64",
}

SUPPORTED = ", ".join(DTYPES)


def numpy_name(dtype: np.dtype) -> str | None:
    """Our name for a numpy dtype, or None if unsupported (byte order must be native)."""
    dtype = np.dtype(dtype)
    return _BY_NUMPY.get(dtype) if dtype.isnative else None


def itemsize(name: str) -> int:
    return NUMPY[name].itemsize

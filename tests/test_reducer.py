"""Host reducers (csrc/core/reducer_cpu.cpp) against numpy, element by element."""

import numpy as np
import pytest

from ringcomm.vocab import DTYPES, FLOATING, NUMPY, OPS, op_fits
from ringcomm._native import core
from ringcomm.errors import InvalidArgument


def reduce(dtype, op, dst, a, b):
    assert dst.size == a.size == b.size
    core.reduce(DTYPES[dtype], OPS[op], dst.ctypes.data, a.ctypes.data, b.ctypes.data, dst.size)

CASES = [(d, o) for d in DTYPES for o in OPS if op_fits(d, o)]


def random_inputs(dtype, n, rng):
    dt = NUMPY[dtype]
    if dtype in FLOATING:
        a = rng.standard_normal(n) * 100
        b = rng.standard_normal(n) * 100
    elif dtype == "bool":  # any byte: reinterpreted memory may hold 2 or 255 (True too)
        return tuple(rng.choice(np.array([0, 1, 2, 255], np.uint8), n).view(np.bool_) for _ in range(2))
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
        b = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
    return a.astype(dt), b.astype(dt)


def numpy_op(dtype, op, a, b):
    with np.errstate(over="ignore"):
        if dtype == "bool":  # "or" for sum, max, bor; "and" for prod, min, band; every result byte 0 or 1
            x, y = a.view(np.uint8) != 0, b.view(np.uint8) != 0
            return (x ^ y) if op == "bxor" else (x | y) if op in ("sum", "max", "bor") else (x & y)
        if dtype in ("float16", "bfloat16"):  # widened to float32, rounded once
            a32, b32 = a.astype(np.float32), b.astype(np.float32)
            return {"sum": a32 + b32, "avg": a32 + b32, "prod": a32 * b32,
                    "min": np.minimum(a32, b32), "max": np.maximum(a32, b32)}[op].astype(NUMPY[dtype])
        return {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op](a, b)


@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 33, 1000, 4099])
def test_reduce_matches_numpy(dtype, op, n):
    rng = np.random.default_rng(n * 31 + len(dtype))
    a, b = random_inputs(dtype, n, rng)
    dst = np.empty_like(a)
    reduce(dtype, op, dst, a, b)
    want = numpy_op(dtype, op, a, b)
    width = NUMPY[dtype].itemsize
    bad = np.flatnonzero(np.any(dst.view(np.uint8).reshape(n, width) != want.view(np.uint8).reshape(n, width), axis=1))
    assert bad.size == 0, f"{dtype} {op}: index {bad[0]}: {a[bad[0]]!r} {op} {b[bad[0]]!r} = {dst[bad[0]]!r}, expected {want[bad[0]]!r}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_in_place_aliases(dtype):
    rng = np.random.default_rng(5)
    a, b = random_inputs(dtype, 301, rng)
    want = numpy_op(dtype, "max", a, b)
    x = a.copy()
    reduce(dtype, "max", x, x, b)  # dst is a
    np.testing.assert_array_equal(x.view(np.uint8), want.view(np.uint8))
    y = b.copy()
    reduce(dtype, "max", y, a, y)  # dst is b
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))


def test_half_rounding_is_nearest_even():
    # Every float16 value plus a value that lands exactly between two halves.
    allh = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    allh = allh[np.isfinite(allh)]
    for dtype in ("float16", "bfloat16"):
        dt = NUMPY[dtype]
        a = allh.astype(np.float32).astype(dt)
        b = (a.astype(np.float32) * np.float32(2.0 ** -9)).astype(dt)
        dst = np.empty_like(a)
        reduce(dtype, "sum", dst, a, b)
        with np.errstate(over="ignore"):
            want = (a.astype(np.float32) + b.astype(np.float32)).astype(dt)
        ok = (dst.view(np.uint16) == want.view(np.uint16)) | (np.isnan(dst.astype(np.float32)) & np.isnan(want.astype(np.float32)))
        assert ok.all(), f"{dtype}: first bad index {np.flatnonzero(~ok)[0]}"


def test_integer_sum_and_prod_wrap_like_numpy():
    a = np.array([127, -128, 100, -1], dtype=np.int8)
    b = np.array([1, -1, 100, -128], dtype=np.int8)
    dst = np.empty_like(a)
    reduce("int8", "sum", dst, a, b)
    np.testing.assert_array_equal(dst, (a.astype(np.int64) + b).astype(np.int8))
    reduce("int8", "prod", dst, a, b)
    np.testing.assert_array_equal(dst, (a.astype(np.int64) * b).astype(np.int8))
    big = np.array([2**62, -2**63], dtype=np.int64)
    dst = np.empty_like(big)
    reduce("int64", "sum", dst, big, big)
    np.testing.assert_array_equal(dst, np.array([-2**63, 0], dtype=np.int64))


@pytest.mark.parametrize("dtype", FLOATING)
def test_avg_finalize_divides_once(dtype):
    dt = NUMPY[dtype]
    x = np.array([3, 7, -5, 1000, 1], dtype=dt)
    compute = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else dt
    want = (x.astype(compute) / compute.type(7)).astype(dt)
    core.finalize(DTYPES[dtype], OPS["avg"], x.ctypes.data, x.size, 7)
    np.testing.assert_array_equal(x.astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_avg_rejected_for_integers(dtype):
    x = np.zeros(4, NUMPY[dtype])
    with pytest.raises(InvalidArgument, match="avg"):
        reduce(dtype, "avg", x, x, x)


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_ops_rejected_for_floating_types(dtype, op):
    x = np.zeros(4, NUMPY[dtype])
    with pytest.raises(InvalidArgument, match=f"'{op}' needs an integer or bool dtype, got {dtype}"):
        reduce(dtype, op, x, x, x)


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_and_max_return_nan_if_either_operand_is_nan(dtype, op):
    """numpy's minimum/maximum (and torch's): NaN in a, in b or in both gives
    NaN, whichever side it is on; otherwise the picked operand's bits (-0.0
    and +0.0 included: equal values keep a)."""
    dt = NUMPY[dtype]
    vals = np.array([1.5, -2.0, np.nan, np.inf, -np.inf, 0.0, -0.0], np.float64)
    a, b = (np.repeat(vals, vals.size).astype(dt), np.tile(vals, vals.size).astype(dt))
    dst = np.empty_like(a)
    reduce(dtype, op, dst, a, b)
    got, x, y = dst.astype(np.float64), a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(x) | np.isnan(y)
    bad = np.flatnonzero(np.isnan(got) != nan)
    assert not bad.size, f"{dtype} {op}: index {bad[0]}: {x[bad[0]]} {op} {y[bad[0]]} = {got[bad[0]]}"
    pick_b = (y < x) if op == "min" else (x < y)
    want = np.where(pick_b, b, a)
    width = dt.itemsize
    same = np.all(dst.view(np.uint8).reshape(-1, width) == want.view(np.uint8).reshape(-1, width), axis=1)
    bad = np.flatnonzero(~same & ~nan)
    assert not bad.size, f"{dtype} {op}: index {bad[0]}: {x[bad[0]]} {op} {y[bad[0]]} = {got[bad[0]]}"

"""GPU side: the extension builds wherever the toolchain is, imports without a
GPU, and (on a machine with a GPU) the kernels match the host reducer bit for bit."""

import glob
import os
import shutil
import sys

import numpy as np
import pytest

import ringcomm.cuda as rcuda
from ringcomm._dtypes import DTYPES, FLOATING, NUMPY, OPS
from ringcomm._native import core
from ringcomm.errors import InvalidArgument


def toolchain_present() -> bool:
    nvcc = shutil.which("nvcc") or os.access("/usr/local/cuda/bin/nvcc", os.X_OK)
    nccl = any(glob.glob(os.path.join(p, "nvidia", "nccl", "include", "nccl.h")) for p in sys.path)
    return bool(nvcc and (nccl or os.environ.get("NCCL_HOME")))


def test_extension_is_built_where_the_toolchain_is():
    if os.environ.get("RINGCOMM_CUDA", "auto").lower() in ("0", "off", "no", "false"):
        pytest.skip("RINGCOMM_CUDA=0")
    if not toolchain_present():
        pytest.skip("no nvcc or NCCL headers on this machine: ringcomm._cuda is optional")
    assert rcuda.built(), rcuda.status()
    assert rcuda._cuda.nccl_version() > 0 and rcuda._cuda.runtime_version() > 0


def test_no_gpu_degrades_to_clear_errors():
    assert isinstance(rcuda.status(), str) and rcuda.status()
    x = np.zeros(4, np.float32)
    with pytest.raises(InvalidArgument, match="CUDA array|not built"):
        rcuda.reduce(x, x, x)
    if not rcuda.available():
        assert rcuda.device_count() == 0


gpu = pytest.mark.skipif(not rcuda.available(), reason=f"no GPU: ringcomm._cuda is {rcuda.status()}")
CASES = [(d, o) for d in DTYPES for o in OPS if o != "avg" or d in FLOATING]


def host_reduce(dtype, op, a, b):
    dst = np.empty_like(a)
    core.reduce(DTYPES[dtype], OPS[op], dst.ctypes.data, a.ctypes.data, b.ctypes.data, a.size)
    return dst


def random_pair(dtype, n, rng):
    dt = NUMPY[dtype]
    if dtype in FLOATING:
        return (rng.standard_normal(n) * 100).astype(dt), (rng.standard_normal(n) * 100).astype(dt)
    info = np.iinfo(dt)
    return (rng.integers(info.min, info.max, n, endpoint=True).astype(dt),
            rng.integers(info.min, info.max, n, endpoint=True).astype(dt))


@gpu
@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("n,offset", [(0, 0), (1, 0), (7, 0), (33, 1), (4099, 0), (4099, 3), ((1 << 20) + 5, 0)])
def test_kernels_match_the_host_reducer_bitwise(dtype, op, n, offset):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(n + offset)
    a, b = random_pair(dtype, n + offset, rng)
    want = host_reduce(dtype, op, a[offset:], b[offset:])
    width = NUMPY[dtype].itemsize
    da = cupy.asarray(a.view(np.uint8)).view(cupy.uint8)[offset * width:]  # offset: the scalar (misaligned) path
    db = cupy.asarray(b.view(np.uint8)).view(cupy.uint8)[offset * width:]
    dd = cupy.empty_like(da)

    class View:  # a typed __cuda_array_interface__ over raw bytes (cupy has no bfloat16)
        def __init__(self, raw):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": NUMPY[dtype].str, "data": (raw.data.ptr, False),
                                             "version": 3, "strides": None}
            self.dtype = NUMPY[dtype]
    rcuda.reduce(View(dd), View(da), View(db), op)
    cupy.cuda.get_current_stream().synchronize()
    got = cupy.asnumpy(dd).view(NUMPY[dtype])
    bad = np.flatnonzero(np.any(got.view(np.uint8).reshape(n, width) != want.view(np.uint8).reshape(n, width), 1))
    assert bad.size == 0, f"{dtype} {op} n={n}: index {bad[0]}: device {got[bad[0]]!r}, host {want[bad[0]]!r}"


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_avg_finalize_matches_host(dtype):
    cupy = pytest.importorskip("cupy")
    x = (np.arange(1000) - 300).astype(NUMPY[dtype])
    want = x.copy()
    core.finalize(DTYPES[dtype], OPS["avg"], want.ctypes.data, want.size, 7)
    raw = cupy.asarray(x.view(np.uint8))

    class View:
        __cuda_array_interface__ = {"shape": (x.size,), "typestr": NUMPY[dtype].str, "data": (raw.data.ptr, False),
                                    "version": 3, "strides": None}
        dtype = NUMPY[dtype]
    rcuda.finalize(View(), "avg", 7)
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(raw), want.view(np.uint8))

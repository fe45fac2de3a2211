"""The GPU build's CPU-checkable parts: NCCL resolved at run time (and the
declarations that make that possible equal NCCL's own header), how kernels
split misaligned ring segments, misaligned device pointers refused before
any device call, stream arguments, the CUDA runtime layouts setup.py links
against, and the NCCL suite script importable from an in-place build. What
needs a GPU is in tests/test_cuda.py and bench/gpu_check.sh."""

import ast
import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ringcomm.cuda as rcuda
from ringcomm.errors import InvalidArgument

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
built = pytest.mark.skipif(not rcuda.built(), reason="ringcomm._cuda was not built here (`ringcomm info` says why)")


def cuda_include():
    for d in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if d and os.path.exists(os.path.join(d, "include", "cuda_runtime.h")):
            return os.path.join(d, "include")
    return None


def nccl_header():
    roots = [os.environ["NCCL_HOME"]] if os.environ.get("NCCL_HOME") else []
    roots += [os.path.join(p, "nvidia", "nccl") for p in sys.path]
    for r in roots:
        if os.path.exists(os.path.join(r, "include", "nccl.h")):
            return os.path.join(r, "include")
    return None


def test_nccl_declarations_match_the_real_header(tmp_path):
    inc, nccl = cuda_include(), nccl_header()
    if not (inc and nccl and shutil.which("g++")):
        pytest.skip("needs the CUDA headers, nccl.h (pip install nvidia-nccl-cu13) and g++")
    names = {
        "ncclResult_t": ["ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                         "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"],
        "ncclDataType_t": ["ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                           "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"],
        "ncclRedOp_t": ["ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"],
    }
    checks = [f"static_assert(int(::{v}) == int(ringcomm::{v}), \"{v}\");" for vs in names.values() for v in vs]
    checks += [f"static_assert(sizeof(::{t}) == sizeof(ringcomm::{t}), \"{t}\");" for t in names]
    checks += ["static_assert(sizeof(::ncclUniqueId) == sizeof(ringcomm::ncclUniqueId), \"id\");",
               "static_assert(sizeof(::ncclComm_t) == sizeof(ringcomm::ncclComm_t), \"comm\");"]
    src = tmp_path / "abi.cpp"
    src.write_text("#include <type_traits>\n#include <nccl.h>\n#include \"cuda/nccl_api.h\"\n" + "\n".join(checks)
                   + "\nint main() { return 0; }\n")
    res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{inc}", f"-I{nccl}",
                          f"-I{os.path.join(ROOT, 'csrc')}", str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


@built
def test_nccl_is_loaded_at_run_time_not_linked():
    so = glob.glob(os.path.join(os.path.dirname(rcuda.__file__), "_cuda*.so"))
    if not so or not shutil.which("ldd"):
        pytest.skip("no ldd or no built module file")
    deps = subprocess.run(["ldd", so[0]], capture_output=True, text=True).stdout
    assert "libnccl" not in deps, deps
    missing = rcuda._cuda.nccl_missing()
    assert (rcuda._cuda.nccl_version() > 0) == (missing == ""), missing
    if missing:
        assert "pip install nvidia-nccl" in missing


@built
@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_vector_split_peels_a_common_misalignment(elem):
    split = rcuda._cuda.vector_split
    base = 1 << 20
    for n in (0, 1, 7, 16, 1000, 4099):
        for off in range(0, 16, elem):  # all three pointers share the misalignment
            head, words, tail = split(base + off, base + 4096 + off, base + 8192 + off, n, elem)
            assert head + words * (16 // elem) + tail == n
            assert head <= (16 - off) // elem % (16 // elem) or head == n
            if head < n:
                assert (base + off + head * elem) % 16 == 0  # the vector part starts aligned
            assert tail < 16 // elem or words == 0
            if n * elem >= 32:
                assert words > 0, (n, off, elem)
    # The ring's real case: count 1000, 3 ranks, float32 -> chunk 1 starts at byte 1336.
    assert split(1336, 1336 + (1 << 16), 1336 + (2 << 16), 333, 4) == (2, 82, 3)
    # Pointers that disagree modulo 16 cannot vectorize together: all scalar.
    if elem < 16:
        assert split(base, base + elem, base, 100, elem) == (100, 0, 0)


def test_misaligned_device_pointers_are_refused(monkeypatch):
    from ringcomm import _arrays, _cuda_native
    buf = np.zeros(64, np.uint8)
    addr = buf.ctypes.data + 2  # not a multiple of 4

    class FakeDeviceArray:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (addr, False), "version": 3,
                                    "strides": None}
    # pretend it lives on GPU 0 (the adapter asks ringcomm._cuda_native, below ringcomm.cuda)
    monkeypatch.setattr(_cuda_native, "pointer_device", lambda ptr: 0)
    with pytest.raises(InvalidArgument, match="not aligned to its element size"):
        _arrays.view(FakeDeviceArray(), "x")
    FakeDeviceArray.__cuda_array_interface__ = dict(FakeDeviceArray.__cuda_array_interface__,
                                                    data=(buf.ctypes.data, False))
    assert _arrays.view(FakeDeviceArray(), "x").device == 0  # aligned: accepted


def test_stream_arguments_of_every_library():
    class TorchStream:
        cuda_stream = 1234

    class CupyStream:
        ptr = 5678
    assert rcuda._stream_ptr(TorchStream(), 9) == 1234
    assert rcuda._stream_ptr(CupyStream(), 9) == 5678
    assert rcuda._stream_ptr(42, 9) == 42
    assert rcuda._stream_ptr(None, 9) == 9  # the array's own library's current stream


def cudart_link():
    """setup.py's cudart_link, taken out of setup.py (which builds when run)."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cudart_link")
    ns = {"os": os, "glob": glob}
    exec(compile(ast.Module([fn], []), "setup.py", "exec"), ns)
    return ns["cudart_link"]


@pytest.mark.parametrize("layout,expect", [
    ({"lib64/libcudart_static.a": "", "lib64/libcudart.so.13": ""}, "static"),
    ({"lib/libcudart_static.a": ""}, "static"),
    ({"lib/libcudart.so.13": "", "lib/libcudart.so": ""}, "shared"),  # pip-wheel layout: no static library
    ({"targets/x86_64-linux/lib/libcudart.so.12": ""}, "shared"),
    ({"include/cuda_runtime.h": ""}, None),
])
def test_setup_links_the_cuda_runtime_of_every_layout(tmp_path, layout, expect):
    for rel in layout:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    got = cudart_link()(str(tmp_path))
    if expect is None:
        assert got is None
        return
    dirs, args = got
    assert os.path.isdir(dirs[0])
    if expect == "static":
        assert "-l:libcudart_static.a" in args
    else:
        assert any(a.startswith("-l:libcudart.so") for a in args) and any(a.startswith("-Wl,-rpath,") for a in args)


def test_nccl_suite_script_imports_an_inplace_build(tmp_path):
    # Run from another folder, as mpirun does: ringcomm must come from the
    # checkout (in-place build) or the installed package, and suite.py from tests/.
    script = os.path.join(ROOT, "tests", "scripts", "nccl_suite.py")
    res = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=dict(os.environ, RINGCOMM_IMPORT_ONLY="1"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "imports OK" in res.stdout

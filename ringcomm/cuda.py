"""GPU side of ringcomm: what is built, what the machine has, and the device
reduction kernels (ringcomm._cuda).

The GPU path: ``ringcomm.init(device="cuda")`` (NCCL point-to-point between
processes, one GPU each) and ``ringcomm.run_local(n, fn, device="cuda")``
(in-process ranks on one or more GPUs) run the same ring algorithms with
their payload on the GPU and the reduction kernels of csrc/cuda. This module
also exposes those kernels directly (``reduce``, ``finalize``; every dtype and
op of the host side, 16-byte vectorized, bit-identical to the host reducer).
Importing it never needs a GPU, a driver or libnccl: everything degrades to
``available() == False`` with a reason.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

from . import _dtypes
from .errors import InvalidArgument

__all__ = ["built", "device_count", "available", "status", "reduce", "finalize", "pointer_device", "require"]


# Each in-process rank uses two streams; CUDA maps streams onto a few hardware
# queues (8 by default), so 8 ranks on one GPU would share queues and
# serialize work that should overlap. 32 queues cover 16 ranks. Read when CUDA
# initializes in this process: set before anything (cupy, torch) touches the
# GPU, or set it yourself in the environment.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _preload_nccl() -> None:
    """Load libnccl.so.2 from the nvidia-nccl-cuXX wheel (or $NCCL_HOME) so the
    extension's dependency resolves wherever it was installed."""
    roots = [os.environ["NCCL_HOME"]] if os.environ.get("NCCL_HOME") else []
    roots += [os.path.join(p, "nvidia", "nccl") for p in sys.path]
    for root in roots:
        for lib in glob.glob(os.path.join(root, "lib", "libnccl.so*")):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


_preload_nccl()
try:
    from . import _cuda  # noqa: E402
    _why_not = ""
    import threading as _threading
    _cuda.set_main_thread(_threading.main_thread().ident)  # Ctrl-C is only seen there
except ImportError as exc:  # not built (no nvcc/NCCL at build time) or libnccl missing
    _cuda = None
    _why_not = str(exc)


def built() -> bool:
    """True when ringcomm._cuda was compiled and loads."""
    return _cuda is not None


def pointer_device(ptr: int) -> int:
    """GPU that owns the device memory at `ptr`, or -1 (host memory, or no CUDA)."""
    return _cuda.pointer_device(int(ptr)) if _cuda is not None and device_count() else -1


def require() -> None:
    """Raise InvalidArgument saying why, unless the device path can run here."""
    if _cuda is None:
        raise InvalidArgument(f"ringcomm._cuda is {status()}: the GPU path needs it "
                              "(build with nvcc and the nvidia-nccl wheel installed; see README, 'GPU')")
    if not device_count():
        raise InvalidArgument(f"no usable GPU: {status()}")


def device_count() -> int:
    return _cuda.device_count() if _cuda is not None else 0


def available() -> bool:
    """True when the kernels can run: extension built and at least one GPU."""
    return device_count() > 0


def status() -> str:
    """One line for `ringcomm info` and skip messages."""
    if _cuda is None:
        return f"not built ({_why_not})" if _why_not else "not built"
    n = _cuda.device_count()
    rt = _cuda.runtime_version()
    nccl = _cuda.nccl_version()
    nccl_text = f"NCCL {nccl}" if nccl else f"NCCL not found: {_cuda.nccl_missing()}"
    where = f"{n} device(s)" if n else f"no usable device: {_cuda.device_error() or 'none found'}"
    return f"built (CUDA runtime {rt // 1000}.{rt % 1000 // 10}, {nccl_text}); {where}"


def _device_array(x, what: str):
    """(ptr, count, dtype name, readonly, current stream of its library) of a
    C-contiguous CUDA array (the communicator's own array adapter,
    ringcomm._arrays)."""
    from ._arrays import view
    b = view(x, what)
    if b.device is None and b.count:
        raise InvalidArgument(f"{what}: expected a CUDA array (cupy, torch CUDA, or anything with "
                              f"__cuda_array_interface__), got {type(x).__name__} in host memory")
    return b.ptr, b.count, b.dtype, b.readonly, (b.stream() if b.count else 0)


def _stream_ptr(stream, default: int) -> int:
    """A stream handle from a cupy Stream (.ptr), a torch.cuda.Stream
    (.cuda_stream), an integer, or None: `default` (the array's own library's
    current stream on its device)."""
    if stream is None:
        return default
    for attr in ("ptr", "cuda_stream"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


def reduce(dst, a, b, op: str = "sum", stream=None) -> None:
    """Enqueue ``dst = a (op) b`` elementwise on `stream` (a cupy or torch
    stream, or a handle; default: the current stream of dst's library on its
    GPU), on the GPU that owns dst."""
    if _cuda is None:
        raise InvalidArgument(f"ringcomm._cuda is {status()}")
    d, x, y = (_device_array(v, w) for v, w in ((dst, "dst"), (a, "a"), (b, "b")))
    if d[3]:
        raise InvalidArgument("dst is read-only")
    if not (d[1] == x[1] == y[1]) or not (d[2] == x[2] == y[2]):
        raise InvalidArgument(f"dst, a and b must have the same count and dtype, got "
                              f"{[(v[1], v[2]) for v in (d, x, y)]}")
    if op not in _dtypes.OPS:
        raise InvalidArgument(f"unknown op {op!r}")
    _cuda.reduce(_dtypes.DTYPES[d[2]], _dtypes.OPS[op], d[0], x[0], y[0], d[1], _stream_ptr(stream, d[4]))


def finalize(buf, op: str, nranks: int, stream=None) -> None:
    """Enqueue the op's final step on `buf` (avg: divide by nranks)."""
    if _cuda is None:
        raise InvalidArgument(f"ringcomm._cuda is {status()}")
    p, n, name, _, own = _device_array(buf, "buf")
    _cuda.finalize(_dtypes.DTYPES[name], _dtypes.OPS[op], p, n, int(nranks), _stream_ptr(stream, own))

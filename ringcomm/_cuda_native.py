"""Loads ringcomm._cuda (the GPU extension) and says what it found: built,
device count, status, the GPU owning a pointer. Importing it never needs a
GPU, a driver or libnccl: everything degrades to ``available() == False``
with a reason.

Below both the array adapters (ringcomm._arrays asks it which GPU owns a
pointer) and ringcomm.cuda (the public GPU module, which re-exports these
and adds the kernels on arrays), so neither imports the other back. As
ringcomm._native is for ringcomm._core.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

from .errors import InvalidArgument

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

"""GPU side of ringcomm: what is built, what the machine has, and the device
reduction kernels (ringcomm._cuda).

The GPU path: ``ringcomm.init(device="cuda")`` (NCCL point-to-point between
processes, one GPU each) and ``ringcomm.run_local(n, fn, device="cuda")``
(in-process ranks on one or more GPUs) run the same ring algorithms with
their payload on the GPU and the reduction kernels of csrc/cuda. This module
also exposes those kernels directly (``reduce``, ``finalize``; every dtype and
op of the host side, 16-byte vectorized, bit-identical to the host reducer).
Importing it never needs a GPU, a driver or libnccl: everything degrades to
``available() == False`` with a reason (the extension is loaded, and built /
device_count / status / pointer_device / require are defined, in
ringcomm._cuda_native, below the array adapters this module uses).
"""

from __future__ import annotations

from . import vocab
from ._arrays import view
from ._cuda_native import _cuda, available, built, device_count, pointer_device, require, status
from .errors import InvalidArgument

__all__ = ["built", "device_count", "available", "status", "reduce", "finalize", "pointer_device", "require"]


def _device_array(x, what: str):
    """(ptr, count, dtype name, readonly, current stream of its library) of a
    C-contiguous CUDA array (the communicator's own array adapter,
    ringcomm._arrays)."""
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
    if op not in vocab.OPS:
        raise InvalidArgument(f"unknown op {op!r}")
    _cuda.reduce(vocab.DTYPES[d[2]], vocab.OPS[op], d[0], x[0], y[0], d[1], _stream_ptr(stream, d[4]))


def finalize(buf, op: str, nranks: int, stream=None) -> None:
    """Enqueue the op's final step on `buf` (avg: divide by nranks)."""
    if _cuda is None:
        raise InvalidArgument(f"ringcomm._cuda is {status()}")
    p, n, name, _, own = _device_array(buf, "buf")
    _cuda.finalize(vocab.DTYPES[name], vocab.OPS[op], p, n, int(nranks), _stream_ptr(stream, own))

"""Array adapters: what the communicator needs to know about an array.

Accepted, all without copying:
  * numpy arrays (any supported dtype, C-contiguous);
  * anything with ``__dlpack__`` on the CPU (PyTorch CPU tensors included, bfloat16 too);
  * any other object with the buffer protocol (memoryview, bytearray, array.array);
  * GPU arrays (for communicators whose payload lives on a GPU): PyTorch CUDA
    tensors, cupy arrays, anything with ``__cuda_array_interface__`` or a
    CUDA DLPack capsule.

A GPU array also says on which GPU it lives and which stream its producer
uses (``Buf.stream()``: the caller's current stream of its library, read at
the time of the call), so a collective can be ordered after the work queued
there (see comm.py).

New arrays (results of reduce_scatter / all_gather without ``out``) are made
in the input's family and on its device: a torch tensor for a torch input, a
cupy array for a cupy input, else numpy.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import vocab
from ._native import core
from .errors import InvalidArgument

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST = 1, 2, 3


@dataclass
class Buf:
    obj: Any          # what the user passed (returned back to them as results)
    ptr: int
    count: int
    dtype: str
    shape: tuple
    readonly: bool
    family: str       # "numpy" | "torch" | "cupy" | "other"
    keep: Any = None  # DLPack capsule etc. that must outlive the operation
    device: int | None = None  # GPU ordinal; None: host memory
    stream_fn: Any = None      # GPU arrays: () -> the caller's current stream handle

    def stream(self) -> int:
        return self.stream_fn() if self.stream_fn is not None else 0

    @property
    def where(self) -> str:
        return "host memory" if self.device is None else f"cuda:{self.device}"

    @property
    def nbytes(self) -> int:
        return self.count * vocab.itemsize(self.dtype)

    def overlaps(self, other: "Buf") -> bool:
        if not self.nbytes or not other.nbytes:
            return False
        return self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes

    def same_memory(self, other: "Buf") -> bool:
        return self.ptr == other.ptr and self.nbytes == other.nbytes


# ---- memory overlap among many arrays (lists of blocks: gather, scatter,
# all_to_all), in O(n log n) where comparing every pair would be quadratic.
# A span is (start, stop) in bytes; empty spans share nothing.
def meeting_pairs(spans) -> list[tuple[int, int]]:
    """Pairs (i, j) of spans that share memory: every span that shares
    memory with another is in at least one pair (not every such pair is
    listed). Sorted by start, each span is compared with the one reaching
    furthest so far: if that one ends past this one's start, they meet;
    if not, no earlier span reaches it."""
    pairs, end, last = [], -1, -1
    for start, stop, j in sorted((a, b, j) for j, (a, b) in enumerate(spans) if b > a):
        if start < end:
            pairs.append((last, j))
        if stop > end:
            end, last = stop, j
    return pairs


def spans_meeting(spans, apart) -> list[int]:
    """Indices of `spans` that share memory with any of `apart`, which share
    none among themselves: sorted by start, their ends are sorted too, so
    of those starting before a span ends, the last one reaches furthest."""
    ap = sorted((a, b) for a, b in apart if b > a)
    starts = [a for a, _ in ap]
    hits = []
    for j, (s, e) in enumerate(spans):
        k = bisect.bisect_left(starts, e) - 1
        if e > s and k >= 0 and ap[k][1] > s:
            hits.append(j)
    return hits


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _c_contiguous(shape, strides, itemsize) -> bool:
    """strides in elements (DLPack) or None (= contiguous)."""
    if strides is None:
        return True
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _aligned(b: Buf, what: str) -> Buf:
    """Device arrays only: a misaligned device access is a sticky CUDA error
    that kills the context of every in-process rank on that GPU, so a pointer
    not aligned to the element size is refused here."""
    if b.device is not None and b.count and b.ptr % vocab.itemsize(b.dtype):
        raise InvalidArgument(f"{what}: device pointer {b.ptr:#x} is not aligned to its element size "
                              f"({vocab.itemsize(b.dtype)} bytes for {b.dtype}); pass an aligned copy")
    return b


def view(x, what: str = "input") -> Buf:
    """Describe `x` for the native layer, or raise InvalidArgument saying what is wrong."""
    if isinstance(x, np.ndarray):
        return _from_numpy(x, x, what)
    if _is_torch(x):
        if getattr(x, "is_cuda", False):
            return _from_torch_cuda(x, what)
        if getattr(x, "device", None) is not None and x.device.type == "cpu":
            return _from_torch_cpu(x, what)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_cai(x, what)
    if hasattr(x, "__dlpack__"):
        return _from_dlpack(x, what)
    try:
        mv = memoryview(x)
    except TypeError:
        raise InvalidArgument(
            f"{what}: expected a numpy array, a DLPack tensor (e.g. torch.Tensor) or a buffer, "
            f"got {type(x).__name__}") from None
    return _from_numpy(np.asarray(mv), x, what)


def _from_numpy(a: np.ndarray, obj, what: str) -> Buf:
    name = vocab.numpy_name(a.dtype)
    if name is None:
        raise InvalidArgument(f"{what}: unsupported dtype {a.dtype}; supported: {vocab.SUPPORTED}")
    if not a.flags.c_contiguous:
        raise InvalidArgument(
            f"{what}: array is not C-contiguous (shape {a.shape}, strides {a.strides}); "
            "pass np.ascontiguousarray(x) and copy the result back")
    ptr = core.address(a)  # fast path; None for e.g. a read-only view numpy won't export
    if ptr is None:
        ptr = a.__array_interface__["data"][0]
    return Buf(obj, ptr, a.size, name, a.shape, not a.flags.writeable, "numpy", a)


def _from_dlpack(x, what: str) -> Buf:
    family = "torch" if _is_torch(x) else "other"
    src = x.detach() if family == "torch" and getattr(x, "requires_grad", False) else x
    if family == "torch" and src.is_conj():
        raise InvalidArgument(f"{what}: conjugate-view tensors are not supported")
    on_cuda = False
    try:
        on_cuda = int(src.__dlpack_device__()[0]) == _KDL_CUDA
    except Exception:  # noqa: BLE001 - optional in older producers
        pass
    # A CUDA producer orders its pending work before the stream we name; we
    # name the legacy default stream (1), and the collective waits for it.
    kw = {"stream": 1} if on_cuda else {}
    try:
        # DLPack 1.0 first: its capsule carries the read-only flag.
        capsule = src.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:  # a producer that predates DLPack 1.0
        try:
            capsule = src.__dlpack__(**kw)
        except Exception as exc:
            raise InvalidArgument(f"{what}: could not export it through DLPack: {exc}") from exc
    except Exception as exc:
        raise InvalidArgument(f"{what}: could not export it through DLPack: {exc}") from exc
    info = core.dlpack_info(capsule)
    device = stream_fn = None
    if info["device_type"] == _KDL_CUDA:
        device, stream_fn = int(info["device_id"]), (lambda: 1)
    elif info["device_type"] not in (_KDL_CPU, _KDL_CUDA_HOST):
        raise InvalidArgument(
            f"{what}: the array lives on DLPack device type {info['device_type']} "
            f"(device {info['device_id']}); ringcomm takes CPU and CUDA memory")
    name = vocab.DLPACK.get((info["code"], info["bits"]))
    if name is None or info["lanes"] != 1:
        raise InvalidArgument(
            f"{what}: unsupported dtype (DLPack code {info['code']}, {info['bits']} bits, "
            f"{info['lanes']} lanes); supported: {vocab.SUPPORTED}")
    shape = tuple(info["shape"])
    if not _c_contiguous(shape, info["strides"], info["bits"] // 8):
        raise InvalidArgument(
            f"{what}: tensor is not contiguous (shape {shape}, strides {info['strides']}); "
            "pass x.contiguous()")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return _aligned(Buf(x, info["ptr"], count, name, shape, bool(info["readonly"]), family, capsule, device=device,
                        stream_fn=stream_fn), what)


_torch_known = False


def _know_torch() -> None:
    """Tell the native fast lane (Engine.run_same_shape) how to read torch CPU
    tensors, once torch is in use: importing ringcomm never imports torch."""
    global _torch_known
    import torch
    core.register_torch(torch.Tensor, {vocab.torch_dtype(n): code for n, code in vocab.DTYPES.items()})
    _torch_known = True


def _torch_dtype_name(x, what: str) -> str:
    """Our name for a torch tensor's dtype, once it is known to be one we
    take, in memory we can read as one block."""
    name = vocab.torch_name(x.dtype)
    if name is None:
        raise InvalidArgument(f"{what}: unsupported dtype {x.dtype}; supported: {vocab.SUPPORTED}")
    if not x.is_contiguous():
        raise InvalidArgument(f"{what}: tensor is not contiguous (shape {tuple(x.shape)}, strides {x.stride()}); "
                              "pass x.contiguous()")
    return name


def _from_torch_cpu(x, what: str) -> Buf:
    # Straight from the tensor (pointer, dtype, size): several times cheaper
    # than a DLPack round trip, which matters for small collectives (the
    # torch.distributed backend calls this on every op). A tensor that
    # requires grad is read and written through its storage, as
    # torch.distributed does.
    if not _torch_known:
        _know_torch()
    name = _torch_dtype_name(x, what)
    # (Conjugate and negative-bit views exist for complex dtypes only, refused above.)
    return Buf(x, x.data_ptr(), x.numel(), name, tuple(x.shape), False, "torch", None)


def _from_torch_cuda(x, what: str) -> Buf:
    # Read directly (zero copy) rather than through __dlpack__, whose stream
    # handshake would synchronize streams behind our back: ordering is done
    # explicitly, after torch's current stream (comm.py).
    import torch
    name = _torch_dtype_name(x, what)
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    src = x.detach()
    return _aligned(Buf(x, src.data_ptr(), src.numel(), name, tuple(x.shape), False, "torch", src, device=dev,
                        stream_fn=lambda: torch.cuda.current_stream(dev).cuda_stream), what)


def _from_cai(x, what: str) -> Buf:
    cai = x.__cuda_array_interface__
    family = "cupy" if type(x).__module__.split(".")[0] == "cupy" else "other"
    name = None
    try:
        name = vocab.numpy_name(np.dtype(cai["typestr"]))
    except TypeError:
        pass
    if name is None and getattr(x, "dtype", None) is not None:
        try:
            name = vocab.numpy_name(x.dtype)
        except TypeError:
            name = None
    if name is None:
        raise InvalidArgument(f"{what}: unsupported dtype {cai['typestr']}; supported: {vocab.SUPPORTED}")
    shape = tuple(cai["shape"])
    item = vocab.itemsize(name)
    strides = cai.get("strides")
    if strides is not None and not _c_contiguous(shape, [st // item for st in strides], item):
        raise InvalidArgument(f"{what}: array is not C-contiguous (shape {shape}, strides {strides}); "
                              "pass cupy.ascontiguousarray(x)")
    ptr, readonly = cai["data"]
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if family == "cupy":
        import cupy
        dev = int(x.device.id)

        def stream_fn():  # cupy's current stream *of the array's device*
            with cupy.cuda.Device(dev):
                return cupy.cuda.get_current_stream().ptr
    else:
        from . import _cuda_native
        dev = _cuda_native.pointer_device(ptr) if count else None  # an empty array lives nowhere in particular
        if count and dev < 0:
            raise InvalidArgument(f"{what}: __cuda_array_interface__ points at memory that is not on a GPU")
        handle = cai.get("stream")  # v3: the producer's stream (None: no ordering needed)
        stream_fn = lambda: 0 if handle is None else int(handle)  # noqa: E731
    return _aligned(Buf(x, ptr, count, name, shape, bool(readonly), family, x, device=dev, stream_fn=stream_fn), what)


def empty_like(template: Buf, count: int):
    """A new 1-D array of `count` elements of template's dtype, in template's family and on its device."""
    if template.family == "torch":
        import torch
        return torch.empty(count, dtype=vocab.torch_dtype(template.dtype), device=template.obj.device)
    if template.device is not None:
        import cupy
        with cupy.cuda.Device(template.device):
            return cupy.empty(count, dtype=vocab.NUMPY[template.dtype])
    return np.empty(count, dtype=vocab.NUMPY[template.dtype])


def like(template: Buf, values: np.ndarray):
    """`values` (a numpy array) copied into template's family and device."""
    if template.family == "torch":
        import torch
        return torch.from_numpy(values).to(template.obj.device)
    if template.device is not None:
        import cupy
        with cupy.cuda.Device(template.device):
            return cupy.asarray(values)
    return values


def to_numpy(x) -> np.ndarray:
    """Host copy of an array made by like()/empty_like() (waits for its producer)."""
    if _is_torch(x):
        return x.cpu().numpy()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):
        return x.get()
    return np.asarray(x)

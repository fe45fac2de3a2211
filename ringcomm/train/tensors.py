"""Array families for training: a parameter (or gradient) is a numpy array or
a torch tensor; buckets are allocated in the parameter's family so grad views
are of the same kind as the parameters (torch can then use them as param.grad).

The dtype names, the torch dtype map and the numpy dtypes are the vocabulary's
(``ringcomm.vocab``); this module only does, for either family, the few
element-wise things the bucketer and the consistency checks need. It differs
from ``ringcomm._arrays`` (what the communicator needs to know about one
array: pointer, count, contiguity) in that a parameter here need not be
contiguous, and only its shape, dtype and device are read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .. import vocab
from ..errors import InvalidArgument, RingcommError

__all__ = ["Spec", "family", "describe", "zeros", "flat_view", "copy_into", "add_into", "zero", "scale_half",
           "averaging", "item", "as_numpy", "bytes_of"]


@dataclass(frozen=True)
class Spec:
    family: str      # "numpy" | "torch"
    shape: tuple
    dtype: str       # ringcomm dtype name
    device: str      # "cpu" (the host communicator takes host memory only)
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * vocab.itemsize(self.dtype)

    def describe(self) -> str:
        return f"{self.shape} {self.dtype}" + ("" if self.device == "cpu" else f" on {self.device}")


def family(x) -> str:
    if isinstance(x, np.ndarray):
        return "numpy"
    torch = sys.modules.get("torch")  # (a torch tensor exists only once torch is imported)
    if torch is not None and isinstance(x, torch.Tensor):  # subclasses too (a user's nn.Parameter)
        return "torch"
    return type(x).__module__.split(".")[0]


def describe(p, what: str) -> Spec:
    fam = family(p)
    if fam == "numpy":
        name = vocab.numpy_name(p.dtype)
        if name is None:
            raise InvalidArgument(f"{what}: unsupported dtype {p.dtype}; supported: {vocab.SUPPORTED}")
        return Spec("numpy", tuple(p.shape), name, "cpu", int(p.size))
    if fam == "torch":
        name = vocab.torch_name(p.dtype)
        if name is None:
            raise InvalidArgument(f"{what}: unsupported dtype {p.dtype}; supported: {vocab.SUPPORTED}")
        if p.device.type != "cpu":
            raise InvalidArgument(
                f"{what} lives on {p.device}; ringcomm's communicator takes host memory only "
                "(CUDA buckets are not supported yet)")
        return Spec("torch", tuple(p.shape), name, "cpu", int(p.numel()))
    if fam == "cupy":
        raise InvalidArgument(f"{what} is a cupy (device) array; ringcomm's communicator takes host "
                              "memory only (device buckets are not supported yet)")
    raise InvalidArgument(f"{what}: expected a numpy array or a torch tensor, got {type(p).__name__}")


def zeros(spec_key: tuple, count: int):
    """A zeroed 1-D buffer of `count` elements; spec_key is (family, dtype, device)."""
    fam, dtype, device = spec_key
    if fam == "torch":
        import torch
        return torch.zeros(count, dtype=vocab.torch_dtype(dtype), device=device)
    return np.zeros(count, dtype=vocab.NUMPY[dtype])


def arena_zeros(comm, wanted: list) -> list | None:
    """Zeroed 1-D buffers, one per (spec_key, count) of `wanted`, in `comm`'s
    shared arena (``comm.empty``: their collectives run zero copy), or None
    on every rank. Collective: a rank that cannot get them all (the arena
    is full, or fragmented differently) says so in one small all_reduce, so
    every rank decides alike (a zero-copy call needs every rank's arrays in
    the arena)."""
    if not getattr(comm, "shared_memory", False) or any(k[2] not in (None, "cpu") for k, _ in wanted):
        return None  # (alike on every rank)
    bufs: list | None = []
    try:
        for (fam, dtype, _), count in wanted:
            b = comm.empty(count, dtype, family=fam)
            b[...] = 0
            bufs.append(b)
    except RingcommError:  # the arena is full, or cannot be made (every rank hears alike)
        bufs = None
    ok = np.array([0 if bufs is None else 1], dtype=np.int32)
    comm.all_reduce(ok, op="min")
    return bufs if ok[0] else None


def flat_view(flat, off: int, numel: int, shape: tuple):
    """flat[off:off + numel] as an array of `shape` (a view, no copy)."""
    part = flat[off:off + numel]
    return part.view(shape) if family(flat) == "torch" else part.reshape(shape)


def _like(dst, src):
    """src (numpy or torch, any shape with dst's element count) as dst's
    family and shape, sharing memory where it can (torch bfloat16 included:
    as_numpy / a byte view, as torch.as_tensor takes no ml_dtypes array)."""
    if family(dst) == "torch":
        if family(src) == "torch":
            return src.reshape(dst.shape)
        import torch
        a = np.ascontiguousarray(np.asarray(src)).reshape(-1)
        name = vocab.numpy_name(a.dtype)
        t = torch.from_numpy(a.view(np.uint8)).view(vocab.torch_dtype(name)) if name else torch.as_tensor(a)
        return t.reshape(dst.shape)
    return np.asarray(as_numpy(src)).reshape(dst.shape)


def copy_into(dst, src) -> None:
    """dst[...] = src, across families and shapes of the same size."""
    if family(dst) == "torch":
        import torch
        with torch.no_grad():
            dst.copy_(_like(dst, src))
    else:
        dst[...] = _like(dst, src)


def add_into(dst, src) -> None:
    """dst += src, across families and shapes of the same size."""
    if family(dst) == "torch":
        import torch
        with torch.no_grad():
            dst.add_(_like(dst, src))
    else:
        dst += _like(dst, src)


def zero(x) -> None:
    if family(x) == "torch":
        x.zero_()
    else:
        x[...] = 0


def scale_half(flat, factor: float) -> None:
    """flat *= factor for a float16/bfloat16 buffer, computed in float32 and
    rounded once (multiplying by a half-precision 1/N would add a bias of up to
    0.4% for bfloat16)."""
    if family(flat) == "torch":
        flat.mul_(factor)  # torch computes half ops in float32 with the double scalar
    else:
        flat[...] = flat.astype(np.float32) * np.float32(factor)


def averaging(flat, dtype: str, n: int) -> str:
    """Prepare `flat` (gradients of one dtype) to be averaged over n ranks and
    return the op for its collective: float16/bfloat16 are pre-divided here
    (scale_half) and then summed, so the sum of n gradients cannot overflow
    (two fp16 gradients of 40000 sum to inf; torch's DDP pre-divides too);
    float32/float64 use "avg", one division after the sum."""
    if n > 1 and dtype in ("float16", "bfloat16"):
        scale_half(flat, 1.0 / n)
        return "sum"
    return "avg"


def item(x) -> float:
    return float(x.item()) if family(x) == "torch" else float(x)


def as_numpy(x) -> np.ndarray:
    """A host numpy array with x's bytes (torch bfloat16 comes back as ml_dtypes.bfloat16).
    Not ``_arrays.to_numpy``, which copies a result to the host: this one
    shares a CPU tensor's memory, bfloat16 included (numpy has no bfloat16 of
    its own, so torch's ``.numpy()`` refuses it)."""
    if family(x) == "numpy":
        return x
    t = x.detach().contiguous().reshape(-1)
    name = vocab.torch_name(t.dtype)
    import torch
    return t.view(torch.uint8).numpy().view(vocab.NUMPY[name])


def bytes_of(x) -> np.ndarray:
    a = np.ascontiguousarray(as_numpy(x)).reshape(-1)
    return a.view(np.uint8)

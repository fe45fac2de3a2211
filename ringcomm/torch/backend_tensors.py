"""The tensor helpers of the "ringcomm" torch backend (backend.py and its
parts): what the engine takes, contiguous places, and where tensors meet."""

from __future__ import annotations

import math

import torch

from .. import vocab
from .._arrays import meeting_pairs

__all__ = ["check_dtype", "bytes_if_foreign", "flat", "adjacent", "elements", "places", "spans", "same", "overlaps"]


def check_dtype(t: torch.Tensor, op: str, any_dtype: bool = False) -> None:
    """Refuse what the engine cannot take. any_dtype: the op only moves the
    tensor's bytes (send, recv), so any dtype goes (gloo's rule too)."""
    if t.layout != torch.strided:  # (torch's own check of a sparse tensor's memory names no cause)
        raise NotImplementedError(f"ringcomm backend: {op} on a {t.layout} tensor; only dense (strided) tensors "
                                  "are supported here (of sparse tensors: all_reduce SUM)")
    if vocab.torch_name(t.dtype) is None and not any_dtype:
        raise TypeError(f"ringcomm backend: {op} on a {t.dtype} tensor; supported dtypes: {vocab.SUPPORTED}")
    if t.device.type != "cpu":
        raise NotImplementedError(f"ringcomm backend: {op} on a {t.device} tensor; this backend is registered "
                                  "for CPU tensors (GPU collectives: ringcomm.init(device='cuda'))")


def bytes_if_foreign(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of a dtype the engine does not know (float8,
    complex32, ...) as its bytes (the same storage), for the ops that only
    move bytes: then both sides must name the same dtype, as over gloo, and
    the receive's size check counts bytes."""
    if vocab.torch_name(t.dtype) is not None:
        return t
    return t.reshape(-1).view(torch.uint8)


def flat(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """t itself when contiguous (ringcomm reads its storage directly, also
    when it requires grad), else a contiguous copy: then the second value is
    True and the result must be copied back."""
    if t.is_contiguous():
        return t, False
    return t.detach().contiguous(), True


def adjacent(ts):
    """One flat tensor over `ts` when they are contiguous, of one dtype, and
    lie back to back in one storage in list order (torch.chunk/split of a
    contiguous tensor, or views of one buffer): then the engine reads or
    writes them in place. None otherwise."""
    if not ts or not all(t.is_contiguous() for t in ts):
        return None
    t0 = ts[0]
    storage, esize, dtype = t0.untyped_storage().data_ptr(), t0.element_size(), t0.dtype
    ptr, total = t0.data_ptr(), 0
    for t in ts:
        if t.dtype != dtype or t.untyped_storage().data_ptr() != storage or t.data_ptr() != ptr + total * esize:
            return None
        total += t.numel()
    return torch.empty(0, dtype=dtype).set_(t0.untyped_storage(), t0.storage_offset(), (total,))


def elements(t: torch.Tensor, split_sizes, n: int, what: str):
    """all_to_all_single's split sizes (rows of dim 0) as element counts;
    None for equal blocks (an empty list, as torch means it)."""
    if not split_sizes:
        if t.dim() and t.size(0) % n:
            raise ValueError(f"ringcomm backend: all_to_all_single: {what} has {t.size(0)} rows, not divisible "
                             f"by {n} ranks; pass {what}_split_sizes")
        return None
    if len(split_sizes) != n:
        raise ValueError(f"ringcomm backend: all_to_all_single: {len(split_sizes)} {what} split sizes for {n} ranks")
    rows = t.size(0) if t.dim() else 1
    if sum(split_sizes) != rows:
        raise ValueError(f"ringcomm backend: all_to_all_single: {what} split sizes sum to {sum(split_sizes)}, "
                         f"but the {what} has {rows} rows")
    row = math.prod(t.shape[1:])
    return [int(s) * row for s in split_sizes]


def places(outs: list) -> tuple[list, object]:
    """Where the engine writes each output tensor's block: the tensor itself
    when it is contiguous and shares no memory with another output, else a
    buffer of its own, copied back after the call in list order (the same
    tensor given twice, as gloo allows: the last block wins). Returns the
    buffers and the copy back (None when nothing is to copy)."""
    shared = {j for pair in meeting_pairs(spans(outs)) for j in pair}  # outputs sharing memory with another
    bufs, back = [], []
    for j, o in enumerate(outs):
        b, copied = flat(o)
        if not copied and j in shared:
            b, copied = torch.empty(o.shape, dtype=o.dtype), True
        bufs.append(b)
        if copied:
            back.append((o, b))
    if not back:
        return bufs, None
    return bufs, lambda: [o.detach().copy_(b.view_as(o)) for o, b in back]


def spans(ts) -> list[tuple[int, int]]:
    """Each tensor's bytes as (start, stop)."""
    return [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in ts]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same memory: one start, one length."""
    return a.data_ptr() == b.data_ptr() and a.numel() * a.element_size() == b.numel() * b.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()

"""Bucket assignment: which parameters share a flat buffer (one collective
each), shared by the gradient bucketer (``train.bucketer.GradBucketer``) and
ZeRO on torch modules (``torch.torch_zero.TorchZero``, its gradient buckets)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["MB", "assign_buckets"]

MB = 1 << 20


def assign_buckets(items: Sequence[tuple], order: Sequence[int], cap: int, first_cap: int
                   ) -> list[tuple[tuple, list[int]]]:
    """Bucket assignment for parameters becoming ready in `order`; items[i] is
    parameter i's (key, nbytes), key its (family, dtype, device). Fill one open
    bucket per key, close it once it reaches `cap` bytes (the first per key:
    `first_cap`). Returns [(key, [parameter indices in fill order])] in the
    order the buckets are expected to complete (position of their last
    parameter in `order`), which is the order they are launched in. Shared by
    GradBucketer and ringcomm.torch.torch_zero (ZeRO-1/2 gradient buckets)."""
    open_: dict[tuple, list] = {}
    firsts: set = set()
    closed = []
    for i in order:
        key, nbytes = items[i]
        cur = open_.setdefault(key, [[], 0])
        cur[0].append(i)
        cur[1] += nbytes
        if cur[1] >= (cap if key in firsts else first_cap):
            closed.append((key, cur[0]))
            firsts.add(key)
            del open_[key]
    closed += [(k, v[0]) for k, v in open_.items()]
    pos = {i: k for k, i in enumerate(order)}
    closed.sort(key=lambda kv: pos[kv[1][-1]])
    return closed

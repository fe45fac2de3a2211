"""TorchZero's flat buffers: which parameters share one (a gradient bucket at
stages 0-2, a unit at stage 3), in launch order, and each buffer's state
(``Flat``). ringcomm/torch/torch_zero.py runs them."""

from __future__ import annotations

import numpy as np
import torch

from .. import vocab
from ..errors import InvalidArgument
from ..train.buckets import MB, assign_buckets

__all__ = ["Flat", "check_parameters", "unit_groups", "bucket_groups"]


class Flat:
    """One flat buffer: a gradient bucket (stages 0-2) or a unit (stage 3)."""

    def __init__(self, index, pidx, params, names, module=None):
        self.index = index
        self.pidx = list(pidx)            # indices into TorchZero's trainable parameter list, in layout order
        self.names = list(names)
        self.shapes = [tuple(p.shape) for p in params]
        self.sizes = [p.numel() for p in params]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]).tolist())
        self.count = sum(self.sizes)
        self.dtype = params[0].dtype
        self.itemsize = params[0].element_size()
        self.module = module              # stage 3: the module whose hooks gather it
        self.lo = self.hi = 0
        self.flat = None                  # full parameters (stage 3: storage freed when not gathered)
        self.shard = None                 # stage 3: this rank's chunk of the parameters
        self.grads = None                 # full gradients (stages 0-1 always, 2-3 while in flight)
        self.grad_shard = None            # stages 1-3: the reduced chunk
        self.master = self.m = self.v = None
        self.pending: set = set(self.pidx)  # parameters whose gradient has not arrived in this backward
        self.work = None                  # the gradient reduction in flight
        self.gather_work = None           # stage 3: an all_gather in flight
        self.full = False                 # stage 3: storage allocated (gathered, or being gathered)
        self.bwd = False                  # stage 3: backward gather done in this iteration

    def view(self, buf, j):
        off, k = self.offsets[j], self.sizes[j]
        return buf[off:off + k].view(self.shapes[j])


def check_parameters(named: list) -> None:
    """Trainable parameters TorchZero can shard: some, on the CPU, floating."""
    if not named:
        raise InvalidArgument("TorchZero: the module has no trainable parameters")
    for n, p in named:
        if p.device.type != "cpu":
            raise InvalidArgument(f"parameter {n!r} is on {p.device}; TorchZero takes CPU tensors only")
        if vocab.torch_name(p.dtype) not in vocab.FLOATING:
            raise InvalidArgument(f"parameter {n!r} is {p.dtype}; TorchZero needs floating parameters "
                                  "(float32, or bfloat16/float16 with fp32 master weights)")


def _unit_members(units: list, index: dict, names: list) -> list:
    """[(unit, [indices of its trainable parameters])], checked disjoint."""
    owner: dict[int, int] = {}
    groups = []
    for k, mod in enumerate(units):
        if not isinstance(mod, torch.nn.Module):
            raise InvalidArgument(f"units[{k}] is a {type(mod).__name__}, expected a torch.nn.Module")
        idx = []
        for p in mod.parameters():
            i = index.get(id(p))
            if i is None:
                continue
            if i in owner:
                raise InvalidArgument(f"units must be disjoint: parameter {names[i]!r} is in "
                                      f"units[{owner[i]}] and units[{k}]")
            owner[i] = k
            idx.append(i)
        groups.append((mod, idx))
    return groups


def unit_groups(module, units: list, params: list, names: list) -> tuple[list, list]:
    """(groups in launch order, groups in forward order), each a list of
    (module, [parameter indices]): one per unit with trainable parameters,
    and the root module's for the parameters in no unit (gathered for the
    root's whole forward and backward)."""
    index = {id(p): i for i, p in enumerate(params)}
    groups = _unit_members(list(units), index, names)
    owned = {i for _, idx in groups for i in idx}
    root = [i for i in range(len(params)) if i not in owned]
    root_group = [(module, root)] if root else []
    forward = root_group + [g for g in groups if g[1]]
    # backward produces the last unit's gradients first; the root's (if any) come last
    return [g for g in reversed(groups) if g[1]] + root_group, forward


def bucket_groups(params: list, bucket_cap_mb: float, first_bucket_mb: float) -> list:
    """Size-capped gradient buckets, as GradBucketer fills them: [(None, [parameter indices])]."""
    items = [((str(p.dtype),), p.numel() * p.element_size()) for p in params]
    return [(None, idx) for _, idx in assign_buckets(items, list(reversed(range(len(params)))),
                                                     int(bucket_cap_mb * MB), int(first_bucket_mb * MB))]

"""TorchZero's stage 3: each unit gathered before its forward and its
backward (the next one prefetched while it computes) and freed after; a part
of ``TorchZero`` (torch_zero.py), kept in a file of its own."""

from __future__ import annotations

import functools

import torch

from ..errors import InvalidArgument
from .zero_flats import Flat

__all__ = ["Stage3"]


class Stage3:
    """TorchZero's gather / free methods (they use its comm, prefetch,
    ledger, units in forward and backward order, and _backward_started)."""

    def _prefetch(self, u: Flat) -> None:
        if u.full:
            return
        u.flat.untyped_storage().resize_(u.count * u.itemsize)
        u.full = True
        self._ledger.count("params", u.count * u.itemsize)
        u.gather_work = self.comm.all_gather(u.shard, out=u.flat, async_op=True)

    def _gather(self, u: Flat) -> None:
        self._prefetch(u)
        if u.gather_work is not None:
            u.gather_work.wait()
            u.gather_work = None

    def _release(self, u: Flat) -> None:
        if not u.full:
            return
        if u.gather_work is not None:  # never free memory a collective still writes
            u.gather_work.wait()
            u.gather_work = None
        u.flat.untyped_storage().resize_(0)
        u.full = False
        self._ledger.count("params", -u.count * u.itemsize)

    def _pre_forward(self, fi: int, module, args) -> None:
        self._gather(self._fwd[fi])
        if self.prefetch and fi + 1 < len(self._fwd):
            self._prefetch(self._fwd[fi + 1])

    def _post_forward(self, fi: int, module, args, output) -> None:
        u = self._fwd[fi]
        self._release(u)
        if torch.is_grad_enabled():
            leaves = torch.utils._pytree.tree_flatten(output)[0]
            for x in leaves:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    x.register_hook(functools.partial(self._pre_backward, u))

    def _check_gathered(self, module, prefix, keep_vars) -> None:
        """Stage 3: state_dict() outside gathered() would hold tensors of 0
        bytes (the sharded parameters' storage): refused."""
        if not all(u.full for u in self._units):
            raise InvalidArgument("TorchZero stage 3: call module.state_dict() inside zero.gathered() (outside "
                                  "it the parameters' storage is freed: the state would be empty)")

    def _pre_backward(self, u: Flat, grad) -> None:
        if self._backwards and not u.pending:
            raise InvalidArgument(
                f"rank {self.comm.rank}: a second backward before step(): TorchZero reduces each parameter's "
                "gradient once per step (one backward per step)")
        self._backward_started()
        if u.bwd or not u.pending:
            return
        u.bwd = True
        self._gather(u)
        if self.prefetch:
            k = self._bwd.index(u)
            if k + 1 < len(self._bwd):
                nxt = self._bwd[k + 1]
                if not nxt.bwd and nxt.pending:
                    self._prefetch(nxt)

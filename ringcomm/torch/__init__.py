"""PyTorch integration: ``ringcomm.torch.DistributedDataParallel``, and the
torch.distributed backend ``"ringcomm"`` (registered on import; see
ringcomm/torch/backend.py) so PyTorch's own DDP and FSDP2 run over ringcomm:

    import torch.distributed as dist, ringcomm.torch
    dist.init_process_group("ringcomm")     # under `ringcomm run -n N` or mpirun

    import ringcomm, ringcomm.torch
    comm = ringcomm.init()                                     # or run_local(...)
    model = ringcomm.torch.DistributedDataParallel(net, comm, bucket_cap_mb=25)
    loss = model(x).loss_fn(...); loss.backward()              # gradients averaged when backward returns
    opt.step()

torch is an optional dependency: ``import ringcomm`` never imports it; this
module does (``pip install ringcomm[torch]``). CPU tensors only for now.
"""

from __future__ import annotations

import contextlib
import functools

import torch as _torch

from ..train.bucketer import GradBucketer
from ..train.consistency import broadcast_parameters

from .backend import ProcessGroupRingcomm, communicator, register
from .env import launcher_env

__all__ = ["DistributedDataParallel", "ProcessGroupRingcomm", "communicator", "register", "launcher_env"]

register()
launcher_env()  # RANK, WORLD_SIZE, MASTER_ADDR, ... from MPI where missing (torch's env:// needs them)


class DistributedDataParallel(_torch.nn.Module):
    """Data-parallel wrapper of a ``torch.nn.Module`` over a ringcomm communicator.

    * At construction, rank 0's parameters and buffers are broadcast to every
      rank (collective; every rank must wrap the same architecture).
    * Each trainable parameter gets a post-accumulate-grad hook
      (``Tensor.register_post_accumulate_grad_hook``) that hands its gradient to a
      GradBucketer; buckets are all-reduced while backward continues, and a
      callback queued on the autograd engine finalizes at the end of backward,
      so when ``loss.backward()`` returns every ``param.grad`` holds the average
      over ranks.
    * ``param.grad`` is made a view into the bucket buffer (like torch's
      ``gradient_as_bucket_view=True``): no copy when autograd accumulates into an
      existing grad. After ``zero_grad(set_to_none=True)`` autograd creates a fresh
      grad; the hook copies it into the bucket once and points ``param.grad``
      back at the view.
    * ``no_sync()``: backward passes inside accumulate locally; the next backward
      outside reduces the accumulated sum.
    * ``find_unused_parameters=True``: parameters with no gradient on some rank
      are zero-filled and reduced; one unused on every rank keeps ``grad=None``
      if it had none (its bucket slot, and so a view grad, becomes zero). Default: backward raises
      UnusedParametersError on every rank, naming them. Never a hang.
    * ``broadcast_buffers=True``: rank 0's buffers (e.g. BatchNorm running stats)
      are broadcast before every synchronised forward.
    """

    def __init__(self, module: _torch.nn.Module, comm=None, *, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, find_unused_parameters: bool = False,
                 broadcast_buffers: bool = True, rebuild_buckets: bool = True, init_sync: bool = True):
        super().__init__()
        if comm is None:
            import ringcomm
            comm = ringcomm.init()
        self.module = module
        self.comm = comm
        self.broadcast_buffers = broadcast_buffers
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        for n, p in named:
            if p.device.type != "cpu":
                raise ValueError(f"parameter {n!r} is on {p.device}; ringcomm.torch supports CPU tensors only (for now)")
        self._buffers_list = [b for b in module.buffers()]
        if init_sync:
            with _torch.no_grad():
                broadcast_parameters(list(module.parameters()) + self._buffers_list, comm, root=0)
        self.bucketer = GradBucketer(self._params, comm, bucket_cap_mb=bucket_cap_mb,
                                     first_bucket_mb=first_bucket_mb, names=self._names,
                                     find_unused=find_unused_parameters, rebuild_buckets=rebuild_buckets)
        self._views = self.bucketer.grad_views()
        self._queued = False
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, i))
                       for i, p in enumerate(self._params)]
        with _torch.no_grad():
            for p, v in zip(self._params, self._views):  # existing grads move into the buckets
                if p.grad is not None:
                    v.copy_(p.grad)
                    p.grad = v

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and self._buffers_list and self.bucketer.syncing:
            with _torch.no_grad():
                broadcast_parameters(self._buffers_list, self.comm, root=0)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes in this context accumulate gradients locally, without communication."""
        with self.bucketer.no_sync():
            yield

    # ---- hooks ----------------------------------------------------------
    def _on_grad(self, i: int, p: _torch.Tensor) -> None:
        view = self._views[i]
        g = p.grad
        if g is not None and not (g.data_ptr() == view.data_ptr() and g.shape == view.shape):
            # autograd made a new grad (first backward after zero_grad(set_to_none=True)):
            # it already holds the whole accumulation, so copy it in, then use the view.
            with _torch.no_grad():
                view.copy_(g)
            p.grad = view
        if not self._queued:
            # Finalize once autograd has run every hook of this backward.
            self._queued = True
            _torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
        self.bucketer.mark_ready(i)

    def _on_backward_end(self) -> None:
        self._queued = False
        self.bucketer.finalize()  # (a rebuild moves the views, and so the grads that are them: train.handed)
        unused = self.bucketer.last_unused
        n = self.comm.size
        for i, (p, v) in enumerate(zip(self._params, self._views)):
            # Locally unused but used elsewhere: give it the reduced gradient.
            if p.grad is None and not (i in unused and len(unused[i]) == n):
                p.grad = v

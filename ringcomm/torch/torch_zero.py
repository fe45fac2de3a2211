"""ZeRO-1/2/3 on PyTorch modules (CPU tensors): ``ringcomm.zero.TorchZero``.

The torch counterpart of ``ringcomm.zero.ZeroOptimizer`` (numpy units), on the
same machinery: the split rule (rank r owns chunk r of every flat buffer, no
padding), one Adam formula on fp32 master weights (``train.sharding.adam_update``), the
same memory ledger and the same checkpoint files (``zero.consolidate`` reads
them). Every stage gives DDP's parameters bit for bit (a ring all_reduce *is*
a reduce_scatter followed by an all_gather of the same buffer)::

    import ringcomm, ringcomm.zero
    comm = ringcomm.init()                       # or inside ringcomm.run_local(n, fn)
    model = torch.nn.Sequential(...)             # float32, or bfloat16/float16 (fp32 master weights)
    zero = ringcomm.zero.TorchZero(model, comm, stage=3, units=[model[0], model[2], model[4]], lr=1e-3)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)   # stage 3: units gathered / freed around forward
        loss.backward()                          # gradients reduce-scattered (averaged) as backward makes them
        zero.step()                              # each rank updates its shard; parameters re-gathered (1, 2)
    params = zero.full_parameters()              # {name: full tensor} (stage 3 gathers them)

How it works:

* Parameters are laid out in flat buffers, one dtype each: at stages 0-2
  *buckets* (``bucket_cap_mb``, filled in reverse parameter order as the
  gradient bucketer does: ``train.buckets.assign_buckets``), or one buffer per unit
  when ``units`` is given; at stage 3 one buffer per *unit* (``units``: the
  modules to gather and free as a whole, default: the root's direct children
  that have parameters; parameters in no unit form a unit of the root module,
  gathered for the root's whole forward and backward). Each parameter's
  ``.data`` becomes a view into its buffer, so the module computes on it.
* Each trainable parameter has a ``register_post_accumulate_grad_hook``: its
  gradient is copied into the bucket's flat gradient buffer (allocated at
  stages 2-3 when the bucket's first gradient arrives) and ``param.grad`` is
  dropped; once a bucket's gradients are all there it is reduce-scattered
  (stage 0: all-reduced), averaged (half precision pre-divided by N, as DDP
  does: train.tensors.averaging), asynchronously, while backward goes
  on. Buckets are launched strictly in layout order, so every rank issues the
  same collectives. Stages 2-3 free a bucket's full gradient as soon as its
  reduce-scatter has completed. A parameter that gets no gradient in a
  backward is reduced as zero (never a hang).
* ``step()`` waits for the reductions, runs Adam (or SGD) on this rank's shard
  in fp32 and writes the new shard back in the parameters' dtype; stages 1-2
  all-gather every bucket in place, stage 3 keeps only the shard.
* Stage 3: a unit's storage is freed between uses
  (``untyped_storage().resize_(0)``: the parameters keep their shapes and
  identities, their storage holds 0 bytes). A forward pre-hook all-gathers the
  unit (waiting for the prefetch if one was started) and prefetches the next
  unit (``async_op=True``) while this one computes; the forward hook frees it
  and hooks the unit's outputs, whose gradient (``Tensor.register_hook``)
  marks the start of the unit's backward: gathered again there (the next unit
  in backward order prefetched), freed once its parameters' gradients are all
  accumulated, then reduce-scattered. Traffic per step: AG forward + AG
  backward + RS, 3Psi(N-1)/N elements; stages 0-2: 2Psi(N-1)/N.

Limits: CPU tensors; one backward per step (a second gradient for a
parameter, or a second backward at stage 3, before ``step()`` raises; no
gradient accumulation yet); units must be disjoint; at stage 3 touch
parameters outside forward/backward only inside ``gathered()`` (their storage
holds 0 bytes outside it: reading one there is undefined, and may crash); frozen parameters (``requires_grad=False``) are not sharded
(kept whole, broadcast from rank 0 at construction, never updated).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch

from .. import vocab
from ..train.consistency import broadcast_parameters
from ..errors import InvalidArgument
from .zero_flats import Flat, bucket_groups, check_parameters, unit_groups
from .zero_stage3 import Stage3
from ..train.sharding import MemoryLedger, adam_update, load_shards, matched_sums, save_shards
from ..train.tensors import arena_zeros, averaging

__all__ = ["TorchZero"]


class TorchZero(Stage3):
    """ZeRO stage 0 (DDP), 1, 2 or 3 over a ringcomm communicator for a
    ``torch.nn.Module`` with CPU parameters (float32, or bfloat16/float16 with
    fp32 master weights); it is the module's optimizer too (Adam or SGD).

    Collective: every rank constructs it with the same architecture and
    settings; rank 0's parameter values (and buffers) are broadcast.

    Args:
        module: the model; its trainable parameters are re-pointed into the
            optimizer's flat buffers (same tensor objects, same shapes).
        comm: a ringcomm Communicator (``ringcomm.init()``, or a rank of
            ``ringcomm.run_local``).
        stage: 0 (DDP: all_reduce), 1 (optimizer state sharded), 2 (+
            gradients), 3 (+ parameters).
        units: modules, in forward order, each gathered and freed as a whole
            at stage 3 (default: the root's direct children with parameters);
            at stages 0-2 optional, then one gradient bucket per unit instead
            of size-capped buckets. Must be disjoint.
        lr, betas, eps, weight_decay, optimizer: as ``ZeroOptimizer`` ("adam"
            or "sgd"; Adam as zero.py computes it, elementwise in float32).
        bucket_cap_mb, first_bucket_mb: bucket sizes at stages 0-2 without
            ``units`` (as ``GradBucketer``).
        prefetch: stage 3: start the next unit's all_gather while the current
            unit computes (forward and backward).

    Attributes: ``layout`` (the flat buffers' parameter names, in launch
    order), ``t`` (steps taken), ``memory()``, ``reset_peak()``.
    """

    def __init__(self, module: torch.nn.Module, comm, *, stage: int, units=None, lr: float = 1e-3,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, optimizer: str = "adam",
                 bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0, prefetch: bool = True):
        if stage not in (0, 1, 2, 3):
            raise InvalidArgument(f"stage must be 0 (DDP), 1, 2 or 3, got {stage}")
        if optimizer not in ("adam", "sgd"):
            raise InvalidArgument(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
        self.module, self.comm, self.stage, self.optimizer = module, comm, stage, optimizer
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.prefetch = bool(prefetch)
        self.t = 0
        self._ledger = MemoryLedger()
        self._hooks = []
        self._in_backward = False
        self._backwards = 0  # backward passes ended since the last step()
        self._next_launch = 0

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        check_parameters(named)
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        # Frozen parameters and buffers stay whole: rank 0's values, once.
        rest = [p for p in module.parameters() if not p.requires_grad] + list(module.buffers())
        if rest:
            with torch.no_grad():
                broadcast_parameters(rest, comm, root=0)

        # the flat buffers, in launch order
        self._unit_of: dict[int, tuple[Flat, int]] = {}
        self._units: list[Flat] = [self._make_flat(k, mod, idx) for k, (mod, idx) in
                                   enumerate(self._groups(units, bucket_cap_mb, first_bucket_mb))]
        self.layout = [list(u.names) for u in self._units]
        self._grads_in_arena = self._keep_full_grads() if stage < 2 else False

        # The parameters' version counters now: one that moves was written
        # by the caller (load_state_dict, an in-place op), not by TorchZero,
        # whose own writes go through the flat buffers (_take_writes).
        self._versions = [p._version for p in self._params]
        self._install_hooks()

    def _groups(self, units, bucket_cap_mb: float, first_bucket_mb: float) -> list:
        """Which parameters share a flat buffer, in launch order (and, with
        units, the units in forward order: _forward_order)."""
        if self.stage == 3 and units is None:
            units = [c for c in self.module.children() if any(p.requires_grad for p in c.parameters())]
        if units is None:
            return bucket_groups(self._params, bucket_cap_mb, first_bucket_mb)
        groups, self._forward_order = unit_groups(self.module, units, self._params, self._names)
        return groups

    def _make_flat(self, k: int, mod, idx: list) -> Flat:
        """Flat buffer k over the parameters `idx` (rank 0's values), which
        become views into it."""
        ps = [self._params[i] for i in idx]
        dts = {p.dtype for p in ps}
        if len(dts) != 1:
            raise InvalidArgument(f"unit {k} mixes dtypes {sorted(map(str, dts))}: a unit's parameters must "
                                  "share one dtype")
        u = Flat(k, idx, ps, [self._names[i] for i in idx], mod if self.stage == 3 else None)
        u.lo, u.hi = vocab.chunk_range(u.count, self.comm.size, self.comm.rank)
        with torch.no_grad():
            u.flat = torch.cat([p.detach().reshape(-1) for p in ps])
            self.comm.broadcast(u.flat, root=0)  # every rank starts from rank 0's values
            for j, (i, p) in enumerate(zip(idx, ps)):
                p.data = u.view(u.flat, j)
                self._unit_of[i] = (u, j)
        self._make_state(u)
        return u

    def _make_state(self, u: Flat) -> None:
        """`u`'s optimizer state, parameter shard and gradient shard as the
        stage keeps them, counted in the memory ledger."""
        stage = self.stage
        own = u.flat if stage == 0 else u.flat[u.lo:u.hi]
        u.master = own.to(torch.float32, copy=True).numpy()  # (.numpy() on own would make its storage non-resizable)
        self._ledger.count("optimizer", u.master.nbytes)
        if self.optimizer == "adam":
            u.m, u.v = np.zeros_like(u.master), np.zeros_like(u.master)
            self._ledger.count("optimizer", u.m.nbytes + u.v.nbytes)
        if stage < 3:
            self._ledger.count("params", u.flat.numel() * u.itemsize)
        else:
            u.shard = u.flat[u.lo:u.hi].clone()
            self._ledger.count("params", u.shard.numel() * u.itemsize)
            u.flat.untyped_storage().resize_(0)  # the parameters keep their shapes, hold 0 bytes
        if stage < 2:
            self._ledger.count("grads", u.count * u.itemsize)
        else:
            u.grad_shard = torch.zeros(u.hi - u.lo, dtype=u.dtype)
            self._ledger.count("grads", (u.hi - u.lo) * u.itemsize)

    def _keep_full_grads(self) -> bool:
        """Stages 0-1 keep their full gradients: ranks of one host put them in
        the shared arena (collective: all ranks or none), where their
        reduction runs zero copy with the staged shm path's sums
        (matched_sums). Whether they are there."""
        shared = arena_zeros(self.comm, [(("torch", vocab.torch_name(u.dtype), None), u.count) for u in self._units])
        for k, u in enumerate(self._units):
            u.grads = shared[k] if shared is not None else torch.zeros(u.count, dtype=u.dtype)
            if self.stage == 1:  # reduce-scattered in place: this rank's chunk of the full buffer
                u.grad_shard = u.grads[u.lo:u.hi]
        return shared is not None

    def _install_hooks(self) -> None:
        for i, p in enumerate(self._params):
            self._hooks.append(p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, i)))
        if self.stage != 3:
            return
        module = self.module
        by_module = {id(u.module): u for u in self._units}
        self._fwd = [by_module[id(mod)] for mod, _ in self._forward_order]
        root_unit = [u for u in self._fwd if u.module is module]
        self._bwd = root_unit + [u for u in reversed(self._fwd) if u.module is not module]
        for fi, u in enumerate(self._fwd):
            self._hooks.append(u.module.register_forward_pre_hook(functools.partial(self._pre_forward, fi)))
            self._hooks.append(u.module.register_forward_hook(functools.partial(self._post_forward, fi)))
        self._hooks.append(module.register_state_dict_pre_hook(self._check_gathered))

    # ---- memory ledger --------------------------------------------------------
    def memory(self) -> dict:
        """Bytes this rank holds now: {"params", "grads", "optimizer"} (the
        buffers alive, counted as they are allocated and freed; autograd's own
        temporaries and activations are not counted), and "peak"."""
        return self._ledger.memory()

    def reset_peak(self) -> None:
        self._ledger.reset_peak()

    # ---- gradients ----------------------------------------------------------------
    def _backward_started(self) -> None:
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def _on_grad(self, i: int, p: torch.Tensor) -> None:
        self._backward_started()
        u, j = self._unit_of[i]
        if i not in u.pending:
            raise InvalidArgument(
                f"rank {self.comm.rank}: parameter {self._names[i]!r} received a second gradient before step(): "
                "TorchZero reduces each parameter's gradient once per step (one backward per step)")
        if u.grads is None:
            u.grads = torch.zeros(u.count, dtype=u.dtype)
            self._ledger.count("grads", u.count * u.itemsize)
        with torch.no_grad():
            u.view(u.grads, j).copy_(p.grad)
        p.grad = None
        u.pending.discard(i)
        if not u.pending:
            if self.stage == 3:
                self._release(u)  # its backward is done
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch the buckets whose gradients are complete, strictly in layout
        order (the same collectives in the same order on every rank)."""
        while self._next_launch < len(self._units) and not self._units[self._next_launch].pending:
            u = self._units[self._next_launch]
            op = averaging(u.grads, vocab.torch_name(u.dtype), self.comm.size)  # (as DDP: no fp16 overflow)
            if self.stage == 0:
                u.work = self.comm.all_reduce(u.grads, op=op, async_op=True,
                                              algorithm=matched_sums(self.comm, self._grads_in_arena))
            else:
                u.work = self.comm.reduce_scatter(u.grads, op=op, out=u.grad_shard, async_op=True,
                                                  algorithm=matched_sums(self.comm, self._grads_in_arena))
            self._next_launch += 1
        if self.stage >= 2:  # free the full gradients whose reduce-scatter has finished
            for u in self._units[:self._next_launch]:
                if u.work is not None and u.work.is_completed():
                    self._settle(u)

    def _settle(self, u: Flat) -> None:
        if u.work is not None:
            u.work.wait()
            u.work = None
            if self.stage >= 2:
                self._ledger.count("grads", -u.count * u.itemsize)
                u.grads = None

    def _on_backward_end(self) -> None:
        self._in_backward = False
        self._backwards += 1
        for u in self._units:  # parameters without a gradient in this backward: reduced as zero
            if u.pending:
                if u.grads is None:
                    u.grads = torch.zeros(u.count, dtype=u.dtype)
                    self._ledger.count("grads", u.count * u.itemsize)
                u.pending.clear()
            if self.stage == 3:
                self._release(u)
        self._launch_ready()

    # ---- the step ---------------------------------------------------------------------
    def step(self) -> None:
        """Wait for the gradient reductions, update this rank's shard (fp32
        master weights), and make the new parameters visible: stage 0 in
        place, 1-2 by all-gathering every bucket, 3 in the shard (the next
        forward gathers it). Collective."""
        if self._next_launch < len(self._units):
            missing = [n for u in self._units[self._next_launch:] for n in u.names][:5]
            raise InvalidArgument(f"rank {self.comm.rank}: step() before backward reduced every gradient "
                                  f"(not yet: {', '.join(missing)})")
        self.t += 1
        self._backwards = 0
        gathers = []
        for u in self._units:
            self._settle(u)
            self._take_writes(u)
            g = (u.grads if self.stage == 0 else u.grad_shard).float().numpy()
            adam_update(u.master, u.m, u.v, g, self.t, self.lr, self.betas, self.eps, self.weight_decay,
                         self.optimizer)
            gathers += self._publish(u)
            if self.stage < 2:
                u.grads.zero_()
            u.pending = set(u.pidx)
            u.bwd = False
        self._next_launch = 0
        for w in gathers:
            w.wait()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` for TorchZero's gradients (which
        never sit in ``param.grad``; FSDP has the same method): call it between
        backward and ``step()``. Waits for the reductions, takes the norm of
        all (averaged) gradients, each rank over its shard and one all_reduce
        combining them (stage 0: every rank holds them all), and scales
        every gradient by ``max_norm / (norm + 1e-6)`` where that is below 1.
        Returns the total norm (a float32 tensor, the same on every rank).
        Collective at stages 1-3."""
        if self._next_launch < len(self._units):
            missing = [n for u in self._units[self._next_launch:] for n in u.names][:5]
            raise InvalidArgument(f"rank {self.comm.rank}: clip_grad_norm_() before backward reduced every "
                                  f"gradient (not yet: {', '.join(missing)})")
        p = float(norm_type)
        if not p > 0:
            raise InvalidArgument(f"clip_grad_norm_: norm_type must be positive (or inf), got {norm_type!r}")
        grads = []
        for u in self._units:
            self._settle(u)
            grads.append(u.grads if self.stage == 0 else u.grad_shard)
        # Partial norms in float64: no rank's sum of powers overflows or loses the small terms.
        if p == float("inf"):
            part = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
        else:
            part = sum(float(g.double().abs().pow(p).sum()) for g in grads)
        if self.stage > 0:
            both = np.array([part], np.float64)
            self.comm.all_reduce(both, op="max" if p == float("inf") else "sum")
            part = float(both[0])
        total = part if p == float("inf") else part ** (1.0 / p)
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1.0:
            with torch.no_grad():
                for g in grads:
                    g.mul_(coef)
        return torch.tensor(total, dtype=torch.float32)

    def _take_writes(self, u: Flat) -> None:
        """Parameters of u written by the caller since TorchZero last wrote
        them (model.load_state_dict, an in-place op; at stage 3 inside
        gathered()): this rank's part becomes the master weights (and the
        stage-3 shard), as a torch optimizer would keep such a write. The
        Adam moments stay. Every rank should write alike (as with torch's DDP)."""
        if all(self._params[i]._version == self._versions[i] for i in u.pidx) or (self.stage == 3 and not u.full):
            return  # (stage 3 outside a gather: nothing to read; writes count inside gathered())
        own = u.flat if self.stage == 0 else u.flat[u.lo:u.hi]
        u.master[...] = own.to(torch.float32, copy=True).numpy()  # (a copy: .numpy() pins own's storage)
        if self.stage == 3:
            u.shard.copy_(own)
        for i in u.pidx:
            self._versions[i] = self._params[i]._version

    def _publish(self, u: Flat) -> list:
        """Write the master weights back in the parameters' dtype (torch's
        round-to-nearest-even cast); stages 1-2 start the all_gather."""
        src = torch.from_numpy(u.master)
        with torch.no_grad():
            if self.stage == 0:
                u.flat.copy_(src)
            elif self.stage < 3:
                own = u.flat[u.lo:u.hi]
                own.copy_(src)
                return [self.comm.all_gather(own, out=u.flat, async_op=True)]  # the exact in-place form
            else:
                u.shard.copy_(src)
        return []

    # ---- access ---------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self):
        """Every parameter whole for the block (stage 3 gathers the units and
        frees them after; other stages: as they are). Collective at stage 3.
        Parameters written in the block (``model.load_state_dict``) keep the
        write: it becomes this rank's master weights (stages 0-2 at the next
        step(), stage 3 at the block's end). module.state_dict() at stage 3
        belongs in this block (outside it is refused: the storage is freed)."""
        mine = []
        if self.stage == 3:
            for u in self._units:
                if not u.full:
                    mine.append(u)
                    self._prefetch(u)
            for u in mine:
                self._gather(u)
        try:
            yield self.module
        finally:
            for u in mine:
                self._take_writes(u)  # (stage 3: a write in the block is kept, not dropped with the storage)
                self._release(u)

    def full_parameters(self) -> dict:
        """{name: a copy of the full parameter} for every trainable parameter,
        in ``module.named_parameters()`` order. Collective at stage 3."""
        with self.gathered():
            return {n: p.detach().clone() for n, p in zip(self._names, self._params)}

    def remove_hooks(self) -> None:
        """Detach from the module (its parameters stay views into the buffers)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ---- checkpoints ------------------------------------------------------------------
    def _module_state(self) -> dict:
        """The module's state outside the optimizer, by state_dict name: its
        persistent buffers (BatchNorm's running statistics) and frozen
        parameters, this rank's values."""
        state = {}
        for prefix, mod in self.module.named_modules():
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent_buffers_set:
                    state[f"{prefix}.{name}" if prefix else name] = b
        for name, p in self.module.named_parameters():
            if not p.requires_grad:
                state[name] = p
        return state

    def save(self, prefix: str) -> str:
        """Write this rank's shard (fp32 master weights, Adam moments, step) and
        the module's buffers and frozen parameters (this rank's values) to
        ``{prefix}.rank{r}.npz``, the format of ``ZeroOptimizer.save``
        (``ringcomm.zero.consolidate`` assembles the full state, one entry per
        flat buffer of ``layout``). Returns the path."""
        def host(t):  # (numpy has no bfloat16: its values are exact in float32)
            t = t.detach()
            return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        return save_shards(prefix, self.stage, self.comm, self.t, [u.count for u in self._units],
                            [self.lr, self.betas[0], self.betas[1], self.eps, self.weight_decay],
                            [(u.master, u.m, u.v) for u in self._units], shapes=[u.shapes for u in self._units],
                            extra={name: host(t) for name, t in self._module_state().items()})

    def load(self, prefix: str) -> None:
        """Restore this rank's shard written by ``save(prefix)`` (same stage,
        N and layout); parameters are rebuilt from the master weights, so
        training continues bit for bit, and buffers and frozen parameters
        take their saved values. Collective (stages 1-2 re-gather)."""
        def setter(t):
            def put(a):
                with torch.no_grad():
                    t.copy_(torch.from_numpy(np.array(a)).to(t.dtype))  # (np.array keeps 0-d shapes)
            return put
        self.t = load_shards(prefix, self.stage, self.comm, [u.count for u in self._units],
                              [(u.master, u.m, u.v) for u in self._units], what="this TorchZero",
                              shapes=[u.shapes for u in self._units],
                              extra={name: (tuple(t.shape), setter(t)) for name, t in self._module_state().items()})
        gathers = []
        for u in self._units:
            gathers += self._publish(u)
        for w in gathers:
            w.wait()

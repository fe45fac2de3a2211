"""Sharded data parallelism (ZeRO stages 1, 2 and 3) for custom training loops,
built from ringcomm's two halves: reduce_scatter for gradients, all_gather for
parameters. Stage 0 is plain data parallelism (DDP: all_reduce), on the same
machinery, so the stages can be compared on one model.

The model's parameters are given in *units* (a layer, or a group of layers:
the user's choice), each a list of numpy arrays of one dtype: float32, or a
16-bit type (float16, bfloat16) for mixed precision, where the optimizer keeps
fp32 master weights. Within a unit the parameters are laid out in one flat
buffer; rank r owns chunk r of every unit's buffer under ringcomm's split rule
(no padding). Per rank, with Psi parameters, N ranks and Adam (K = 12 bytes of
fp32 master, momentum and variance per parameter; 16-bit parameters and
gradients):

=======  ===============================================  =====================
stage    what a rank holds                                traffic per step
=======  ===============================================  =====================
0 (DDP)  params 2Psi, grads 2Psi, optimizer 12Psi          all_reduce of grads
1        params 2Psi, grads 2Psi, optimizer 12Psi/N        RS grads + AG params
2        params 2Psi, grads 2Psi/N (+ one unit in flight)  RS grads + AG params
3        params 2Psi/N (+ gathered units), grads 2Psi/N,   AG fwd + AG bwd + RS
         optimizer 12Psi/N
=======  ===============================================  =====================

Every stage gives the same parameters as stage 0, bit for bit: a unit's
gradients are reduced by the same ring (a ring all_reduce *is* a
reduce_scatter followed by an all_gather, so each element is summed in the
same order), and the optimizer is elementwise. ``memory()`` counts the bytes of
parameters, gradients and optimizer state this rank actually holds (the
arrays alive), with their peak; traffic is the communicator's ledger.

A training step (see tests/test_zero.py)::

    zero = ringcomm.zero.ZeroOptimizer(units, comm, stage=3, lr=1e-3)
    for u in range(len(units)):                    # forward
        with zero.gathered(u) as params: ...       # stage 3: all-gathered here, freed after
    for u in reversed(range(len(units))):          # backward
        with zero.gathered(u) as params:
            grads = zero.grads(u)                  # fill these
            ...
        zero.reduce(u)                             # reduce-scatter (all_reduce at stage 0) starts now
    zero.step()                                    # each rank updates its shard; params re-gathered (1, 2)

The same for a ``torch.nn.Module`` (hooks gather, free and reduce-scatter as
forward and backward run): ``TorchZero`` (ringcomm/torch/torch_zero.py; torch is
imported only then).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from .. import vocab
from .sharding import MemoryLedger, adam_update, load_shards, matched_sums, save_shards
from .handed import handout, retire
from .tensors import arena_zeros, averaging
from ..errors import InvalidArgument

__all__ = ["ZeroOptimizer", "consolidate", "expected_memory", "expected_traffic"]



@dataclass(eq=False)  # units are compared by identity
class _Unit:
    shapes: list
    sizes: list
    count: int
    lo: int                       # this rank's chunk [lo, hi) of the unit's flat buffer
    hi: int
    params: np.ndarray | None     # full flat params (stages 0-2; stage 3 only while gathered)
    param_shard: np.ndarray | None  # stage 3: this rank's chunk of the params
    grads: np.ndarray | None      # full flat grads (stage 0-1 always; 2-3 while in flight)
    grad_shard: np.ndarray | None  # stages 1-3: the reduced chunk
    master: np.ndarray | None = None  # fp32 master weights of what this rank updates
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    work: object = None           # the gradient reduction in flight
    gather_work: object = None    # stage 3: a prefetch in flight
    reduced: bool = False         # reduce() was called in this step
    handed_grads: list = field(default_factory=list)   # stages 2-3: grads(i)'s arrays of this step
    handed_params: list = field(default_factory=list)  # stage 3: gathered(i)'s arrays


def _array_module(comm):
    """numpy for host communicators (the emulated device included: its
    payload is host memory), cupy for a communicator on a GPU."""
    dev = comm.device
    if dev is not None and dev.startswith("cuda"):
        import cupy
        return cupy
    return np


def _one_floating_dtype(units: list) -> np.dtype:
    """The one floating dtype of every array in `units` (lists of arrays)."""
    if not units or not all(units):
        raise InvalidArgument("units must be a non-empty list of non-empty lists of arrays")
    dtypes = {np.dtype(p.dtype) for u in units for p in u}
    if len(dtypes) != 1:
        raise InvalidArgument(f"all parameters must have one dtype, got {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    if vocab.numpy_name(dtype) not in vocab.FLOATING:
        raise InvalidArgument(f"parameters must be floating (float32, float16, bfloat16), got {dtype}")
    return dtype


class ZeroOptimizer:
    """Adam (or SGD) over ringcomm, with ZeRO stage 0 (DDP), 1, 2 or 3.

    units: list of lists of numpy arrays, one dtype throughout (float32,
    float16 or bfloat16), the same shapes on every rank; rank 0's values are
    broadcast at construction. The arrays are copied into the optimizer's own
    flat buffers (the arrays passed in are not used afterwards): read and use
    parameters through ``params(u)`` (stages 0-2: views that the optimizer
    updates in place), ``gathered(u)`` (every stage) or ``full_parameters()``.
    """

    def __init__(self, units, comm, *, stage: int, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, optimizer: str = "adam", max_grads_in_flight: int = 2):
        if stage not in (0, 1, 2, 3):
            raise InvalidArgument(f"stage must be 0 (DDP), 1, 2 or 3, got {stage}")
        if optimizer not in ("adam", "sgd"):
            raise InvalidArgument(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
        units = [list(u) for u in units]
        self.dtype = _one_floating_dtype(units)
        self.comm, self.stage, self.optimizer = comm, stage, optimizer
        # Where the flat buffers and the optimizer state live: where the
        # communicator's payload does (numpy on the host, cupy on a GPU).
        self.xp = _array_module(comm)
        # Stages 2-3: at most this many units' full gradients exist at once
        # (being filled, or being reduce-scattered); the next grads() waits
        # for the oldest reduction first. Bounds the peak, like DeepSpeed's
        # reduce bucket size.
        self.max_grads_in_flight = max(1, int(max_grads_in_flight))
        self._inflight: list[_Unit] = []
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.t = 0
        self._ledger = MemoryLedger()
        self._units: list[_Unit] = [self._make_unit(arrays) for arrays in units]
        self._grads_in_arena = self._grads_to_arena() if stage < 2 and self.xp is np else False
        for u in self._units:
            if stage == 1:  # reduce-scattered in place: the shard is this rank's chunk of the full buffer
                u.grad_shard = u.grads[u.lo:u.hi]

    def _make_unit(self, arrays: list) -> "_Unit":
        """One unit's flat buffer (rank 0's values) and its state as the stage
        keeps it, counted in the memory ledger."""
        xp, stage, comm = self.xp, self.stage, self.comm
        sizes = [int(p.size) for p in arrays]
        count = sum(sizes)
        lo, hi = vocab.chunk_range(count, comm.size, comm.rank)
        flat = xp.empty(count, self.dtype)
        off = 0
        for p, k in zip(arrays, sizes):
            flat[off:off + k] = xp.asarray(p, self.dtype).reshape(-1)
            off += k
        comm.broadcast(flat, root=0)  # every rank starts from rank 0's values
        u = _Unit([p.shape for p in arrays], sizes, count, lo, hi, None, None, None, None)
        if stage < 3:
            u.params = flat
            self._ledger.count("params", flat.nbytes)
        else:
            u.param_shard = flat[lo:hi].copy()
            self._ledger.count("params", u.param_shard.nbytes)
        if stage < 2:
            u.grads = xp.zeros(count, self.dtype)
            self._ledger.count("grads", u.grads.nbytes)
        else:
            u.grad_shard = xp.zeros(hi - lo, self.dtype)
            self._ledger.count("grads", u.grad_shard.nbytes)
        own = flat if stage == 0 else flat[lo:hi]
        u.master = own.astype(np.float32)
        self._ledger.count("optimizer", u.master.nbytes)
        if self.optimizer == "adam":
            u.m, u.v = xp.zeros_like(u.master), xp.zeros_like(u.master)
            self._ledger.count("optimizer", u.m.nbytes + u.v.nbytes)
        return u

    def _grads_to_arena(self) -> bool:
        """Stages 0-1 keep their full gradients: ranks of one host put them in
        the shared arena (collective: all ranks or none), where their
        all_reduce / reduce_scatter run zero copy, with the same sums as
        the staged shm path of stages 2-3 (matched_sums). Whether they are there."""
        name = vocab.numpy_name(self.dtype)
        shared = arena_zeros(self.comm, [(("numpy", name, None), u.count) for u in self._units])
        if shared is None:
            return False
        for u, g in zip(self._units, shared):
            u.grads = g
        return True

    # ---- memory ledger ------------------------------------------------------
    def memory(self) -> dict:
        """Bytes this rank holds now: {"params", "grads", "optimizer"} (the
        arrays alive, counted as they are allocated and freed), and "peak"."""
        return self._ledger.memory()

    def reset_peak(self) -> None:
        self._ledger.reset_peak()

    # ---- parameters -----------------------------------------------------------
    @staticmethod
    def _unflatten(u: _Unit, flat: np.ndarray, handed: list | None = None) -> list:
        """The unit's arrays as views of one of its flat buffers; with `handed`,
        views of a buffer that will be given up, recorded there to be retired
        then (train.handed: their later use raises instead of reading or
        writing memory that is no longer the unit's)."""
        out, off = [], 0
        for shape, k in zip(u.shapes, u.sizes):
            out.append(handout(flat[off:off + k].reshape(shape)) if handed is not None
                       else flat[off:off + k].reshape(shape))
            off += k
        if handed is not None:
            handed += out
        return out

    def _views(self, u: _Unit) -> list:
        return self._unflatten(u, u.params, u.handed_params if self.stage == 3 else None)

    def params(self, i: int) -> list:
        """Unit i's parameter arrays (stages 0-2 always; stage 3 inside gathered(i))."""
        u = self._units[i]
        if u.params is None:
            raise InvalidArgument(f"unit {i}'s parameters are sharded (stage 3): use gathered({i})")
        return self._views(u)

    def prefetch(self, i: int) -> None:
        """Stage 3: start gathering unit i's parameters now (overlaps the
        current unit's compute); gathered(i) then only waits."""
        u = self._units[i]
        if self.stage < 3 or u.params is not None or u.gather_work is not None:
            return
        u.params = self.xp.empty(u.count, self.dtype)
        self._ledger.count("params", u.params.nbytes)
        u.gather_work = self.comm.all_gather(u.param_shard, out=u.params, async_op=True)

    @contextlib.contextmanager
    def gathered(self, i: int):
        """Unit i's full parameters for the block (stage 3: all-gathered at
        entry unless prefetched, freed at exit; other stages: as they are)."""
        u = self._units[i]
        if self.stage < 3:
            yield self._views(u)
            return
        if u.params is not None and u.gather_work is None:  # inside gathered(i) already: the outer block frees
            yield self._views(u)
            return
        self.prefetch(i)
        u.gather_work.wait()
        u.gather_work = None
        try:
            yield self._views(u)
        finally:
            self._ledger.count("params", -u.params.nbytes)
            u.params = None
            for a in u.handed_params:
                retire(a, f"ZeroOptimizer.gathered({self._units.index(u)}): at stage 3 a unit's gathered "
                          "parameters are freed when its with-block ends; use them inside the block, or "
                          "full_parameters() for copies")
            u.handed_params = []

    def full_parameters(self) -> list[list[np.ndarray]]:
        """Every unit's full parameters (copies; stage 3 gathers them)."""
        out = []
        for i in range(len(self._units)):
            with self.gathered(i) as ps:
                out.append([p.copy() for p in ps])
        return out

    # ---- gradients ----------------------------------------------------------
    def grads(self, i: int) -> list:
        """Unit i's gradient arrays, to be filled by backward (stages 2-3:
        allocated now, freed once reduce(i) has reduce-scattered them)."""
        u = self._units[i]
        self._free_reduced()
        if u.grads is None:
            if self.stage >= 2:
                while len(self._inflight) >= self.max_grads_in_flight:
                    reduced = next((x for x in self._inflight if x.work is not None), None)
                    if reduced is None:  # waiting would wait forever
                        raise InvalidArgument(
                            f"grads({i}): {len(self._inflight)} units' gradients are out and none has been "
                            f"reduced (max_grads_in_flight={self.max_grads_in_flight}): call reduce() on one "
                            "first, or raise max_grads_in_flight")
                    self._settle(reduced)
                self._inflight.append(u)
            u.grads = self.xp.zeros(u.count, self.dtype)
            self._ledger.count("grads", u.grads.nbytes)
        return self._unflatten(u, u.grads, u.handed_grads if self.stage >= 2 else None)

    def reduce(self, i: int) -> None:
        """Unit i's gradients are complete on this rank: start averaging them
        over the ranks (stage 0: all_reduce; 1-3: reduce_scatter into this
        rank's shard), asynchronously."""
        u = self._units[i]
        if u.reduced:  # a second reduction would run on the buffer the first is still writing
            raise InvalidArgument(f"reduce({i}) was already called in this step: call it once per unit per step")
        if u.grads is None:
            raise InvalidArgument(f"unit {i} has no gradients: call grads({i}) and fill them first")
        u.reduced = True
        for a in u.handed_grads:  # the buffer is the reduction's now, and freed once it has run
            retire(a, f"ZeroOptimizer.grads({i}): these gradients were handed to reduce({i}), and at stage "
                      f"{self.stage} the full gradients are freed once reduced; call zero.grads({i}) again in "
                      "the next step for new ones")
        u.handed_grads = []
        op = averaging(u.grads, vocab.numpy_name(self.dtype), self.comm.size)  # (as DDP: no fp16 overflow)
        if self.stage == 0:
            # Sums bit for bit those of the sharded stages' reduce-scatter
            # (matched_sums), which is what makes them equal to DDP.
            u.work = self.comm.all_reduce(u.grads, op=op, async_op=True,
                                          algorithm=matched_sums(self.comm, self._grads_in_arena))
        else:
            u.work = self.comm.reduce_scatter(u.grads, op=op, out=u.grad_shard, async_op=True,
                                              algorithm=matched_sums(self.comm, self._grads_in_arena))
        self._free_reduced()

    def _free_reduced(self) -> None:
        """Stages 2-3: drop the full gradients of units whose reduce-scatter
        has finished, as soon as it has (what makes their peak small)."""
        if self.stage >= 2:
            for u in self._units:
                if u.work is not None and u.work.is_completed():
                    self._settle(u)

    def _settle(self, u: _Unit) -> None:
        if u.work is not None:
            u.work.wait()
            u.work = None
            if self.stage >= 2:  # the full gradient buffer is not kept
                self._ledger.count("grads", -u.grads.nbytes)
                u.grads = None
                self._inflight.remove(u)

    # ---- the step -------------------------------------------------------------
    def step(self) -> None:
        """Wait for the gradient reductions, update this rank's part with the
        optimizer (fp32 master weights), and make the new parameters visible:
        stage 0 in place, 1-2 by all-gathering every unit, 3 in the shard (the
        next gathered() brings them)."""
        self.t += 1
        for u in self._units:
            self._settle(u)
            u.reduced = False
        gathers = []
        for u in self._units:
            g = (u.grads if self.stage == 0 else u.grad_shard).astype(np.float32)
            self._update(u, g)
            gathers += self._publish(u)
            if self.stage < 2:
                u.grads[...] = 0  # (stage 1's shard is a view of them)
            else:  # a unit that gets no gradient next step must not apply this one again
                u.grad_shard[...] = 0
        for w in gathers:
            w.wait()

    # ---- checkpoints -----------------------------------------------------------
    def save(self, prefix: str) -> str:
        """Write this rank's shard of the optimizer state (fp32 master weights,
        Adam moments, step count) to ``{prefix}.rank{r}.npz``; collective in
        spirit (every rank saves its own file). Returns the path."""
        return save_shards(prefix, self.stage, self.comm, self.t, [u.count for u in self._units],
                            [self.lr, self.betas[0], self.betas[1], self.eps, self.weight_decay],
                            [(u.master, u.m, u.v) for u in self._units], shapes=[u.shapes for u in self._units])

    def load(self, prefix: str) -> None:
        """Restore this rank's shard saved by ``save(prefix)`` with the same
        stage, number of ranks and units; parameters are rebuilt from the
        master weights (as every step leaves them), so training continues
        bit for bit where it stopped. Collective (stages 1-2 re-gather)."""
        self.t = load_shards(prefix, self.stage, self.comm, [u.count for u in self._units],
                              [(u.master, u.m, u.v) for u in self._units], shapes=[u.shapes for u in self._units])
        for w in [w for u in self._units for w in self._publish(u)]:
            w.wait()

    def _publish(self, u: _Unit) -> list:
        """Make unit u's parameters the master weights cast to the training
        dtype: stage 0 in place, 1-2 by all-gathering the shards (returns the
        pending Work), 3 in this rank's shard (the next gathered() brings them)."""
        if self.stage == 0:
            u.params[...] = u.master.astype(self.dtype)
        elif self.stage < 3:
            shard = u.params[u.lo:u.hi]
            shard[...] = u.master.astype(self.dtype)
            return [self.comm.all_gather(shard, out=u.params, async_op=True)]  # the exact in-place form
        else:
            u.param_shard[...] = u.master.astype(self.dtype)
        return []

    def _update(self, u: _Unit, g: np.ndarray) -> None:
        adam_update(u.master, u.m, u.v, g, self.t, self.lr, self.betas, self.eps, self.weight_decay,
                     self.optimizer)


def consolidate(prefix: str, path: str | None = None) -> dict:
    """Assemble the full optimizer state from every rank's ``save(prefix)``
    files: {"stage", "t", "units": [{"master", "m", "v"} as full fp32 arrays]}
    (the model's parameters are ``master`` cast to the training dtype). With
    `path`, also written there as one .npz."""
    import glob
    files = sorted(glob.glob(f"{prefix}.rank*.npz"), key=lambda p: int(p.rsplit(".rank", 1)[1][:-4]))
    if not files:
        raise InvalidArgument(f"no checkpoint files {prefix}.rank*.npz")
    loaded = [dict(np.load(p)) for p in files]
    stage, n, _, t, units = (int(x) for x in loaded[0]["meta"])
    if len(loaded) != n and stage != 0:
        raise InvalidArgument(f"{prefix}: {len(loaded)} rank files, the checkpoint was made by {n} ranks")
    out = {"stage": stage, "t": t, "units": []}
    for i in range(units):
        unit = {}
        for key in ("master", "m", "v"):
            if f"{key}{i}" not in loaded[0]:
                continue
            unit[key] = loaded[0][f"{key}{i}"] if stage == 0 else np.concatenate([d[f"{key}{i}"] for d in loaded])
        out["units"].append(unit)
    if path:
        np.savez(path, t=np.array(t), stage=np.array(stage),
                 **{f"{k}{i}": v for i, u in enumerate(out["units"]) for k, v in u.items()})
    return out


def expected_memory(stage: int, psi: int, n: int, param_bytes: int = 2, optimizer_bytes: int = 12) -> dict:
    """The articles' formulas: bytes per rank for Psi parameters on N ranks
    (steady state, without units gathered or gradients in flight)."""
    p, k = param_bytes * psi, optimizer_bytes * psi
    if stage == 0:
        return {"params": p, "grads": p, "optimizer": k}
    if stage == 1:
        return {"params": p, "grads": p, "optimizer": k / n}
    if stage == 2:
        return {"params": p, "grads": p / n, "optimizer": k / n}
    return {"params": p / n, "grads": p / n, "optimizer": k / n}


def expected_traffic(stage: int, psi: int, n: int, param_bytes: int = 2) -> float:
    """Payload bytes a rank sends per step: 2Psi(N-1)/N elements' worth for
    stages 0-2 (all_reduce = RS + AG), 3Psi(N-1)/N for stage 3 (AG forward,
    AG backward, RS), times the element size."""
    factor = 3 if stage == 3 else 2
    return factor * psi * param_bytes * (n - 1) / n

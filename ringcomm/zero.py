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
forward and backward run): ``TorchZero`` (ringcomm/zero_torch.py; torch is
imported only then).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from . import _dtypes
from ._sharding import _adam_update, _load_shards, _save_shards, _split  # noqa: F401 (shared with zero_torch)
from .errors import InvalidArgument

__all__ = ["ZeroOptimizer", "consolidate", "expected_memory", "expected_traffic"]


def __getattr__(name):
    # TorchZero (ZeRO on torch modules) lives in zero_torch.py: torch is imported only when it is asked for.
    if name == "TorchZero":
        from .zero_torch import TorchZero
        return TorchZero
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _array_module(comm):
    """numpy for host communicators (the emulated device included: its
    payload is host memory), cupy for a communicator on a GPU."""
    dev = comm.device
    if dev is not None and dev.startswith("cuda"):
        import cupy
        return cupy
    return np


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
        if not units or not all(units):
            raise InvalidArgument("units must be a non-empty list of non-empty lists of arrays")
        dtypes = {np.dtype(p.dtype) for u in units for p in u}
        if len(dtypes) != 1:
            raise InvalidArgument(f"all parameters must have one dtype, got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        name = _dtypes.numpy_name(self.dtype)
        if name not in _dtypes.FLOATING:
            raise InvalidArgument(f"parameters must be floating (float32, float16, bfloat16), got {self.dtype}")
        self.comm, self.stage, self.optimizer = comm, stage, optimizer
        # Where the flat buffers and the optimizer state live: where the
        # communicator's payload does (numpy on the host, cupy on a GPU).
        self.xp = _array_module(comm)
        xp = self.xp
        # Stages 2-3: at most this many units' full gradients exist at once
        # (being filled, or being reduce-scattered); the next grads() waits
        # for the oldest reduction first. Bounds the peak, like DeepSpeed's
        # reduce bucket size.
        self.max_grads_in_flight = max(1, int(max_grads_in_flight))
        self._inflight: list[_Unit] = []
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.t = 0
        n, r = comm.size, comm.rank
        self._units: list[_Unit] = []
        self._alive = {"params": 0, "grads": 0, "optimizer": 0}
        self._peak = 0
        for arrays in units:
            sizes = [int(p.size) for p in arrays]
            count = sum(sizes)
            lo, hi = _split(count, n, r)
            flat = xp.empty(count, self.dtype)
            off = 0
            for p, k in zip(arrays, sizes):
                flat[off:off + k] = xp.asarray(p, self.dtype).reshape(-1)
                off += k
            comm.broadcast(flat, root=0)  # every rank starts from rank 0's values
            u = _Unit([p.shape for p in arrays], sizes, count, lo, hi, None, None, None, None)
            if stage < 3:
                u.params = flat
                self._count("params", flat.nbytes)
            else:
                u.param_shard = flat[lo:hi].copy()
                self._count("params", u.param_shard.nbytes)
            if stage < 2:
                u.grads = xp.zeros(count, self.dtype)
                self._count("grads", u.grads.nbytes)
            if stage == 1:  # reduce-scattered in place: the shard is this rank's chunk of the full buffer
                u.grad_shard = u.grads[lo:hi]
            elif stage >= 2:
                u.grad_shard = xp.zeros(hi - lo, self.dtype)
                self._count("grads", u.grad_shard.nbytes)
            own = flat if stage == 0 else flat[lo:hi]
            u.master = own.astype(np.float32)
            self._count("optimizer", u.master.nbytes)
            if optimizer == "adam":
                u.m, u.v = xp.zeros_like(u.master), xp.zeros_like(u.master)
                self._count("optimizer", u.m.nbytes + u.v.nbytes)
            self._units.append(u)

    # ---- memory ledger ------------------------------------------------------
    def _count(self, kind: str, nbytes: int) -> None:
        self._alive[kind] += nbytes
        self._peak = max(self._peak, sum(self._alive.values()))

    def memory(self) -> dict:
        """Bytes this rank holds now: {"params", "grads", "optimizer"} (the
        arrays alive, counted as they are allocated and freed), and "peak"."""
        return dict(self._alive, peak=self._peak)

    def reset_peak(self) -> None:
        self._peak = sum(self._alive.values())

    # ---- parameters -----------------------------------------------------------
    @staticmethod
    def _unflatten(u: _Unit, flat: np.ndarray) -> list:
        """The unit's arrays as views of one of its flat buffers."""
        out, off = [], 0
        for shape, k in zip(u.shapes, u.sizes):
            out.append(flat[off:off + k].reshape(shape))
            off += k
        return out

    def _views(self, u: _Unit) -> list:
        return self._unflatten(u, u.params)

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
        self._count("params", u.params.nbytes)
        u.gather_work = self.comm.all_gather(u.param_shard, out=u.params, async_op=True)

    @contextlib.contextmanager
    def gathered(self, i: int):
        """Unit i's full parameters for the block (stage 3: all-gathered at
        entry unless prefetched, freed at exit; other stages: as they are)."""
        u = self._units[i]
        if self.stage < 3:
            yield self._views(u)
            return
        self.prefetch(i)
        u.gather_work.wait()
        u.gather_work = None
        try:
            yield self._views(u)
        finally:
            self._count("params", -u.params.nbytes)
            u.params = None

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
                    self._settle(self._inflight[0])
                self._inflight.append(u)
            u.grads = self.xp.zeros(u.count, self.dtype)
            self._count("grads", u.grads.nbytes)
        return self._unflatten(u, u.grads)

    def reduce(self, i: int) -> None:
        """Unit i's gradients are complete on this rank: start averaging them
        over the ranks (stage 0: all_reduce; 1-3: reduce_scatter into this
        rank's shard), asynchronously."""
        u = self._units[i]
        if u.grads is None:
            raise InvalidArgument(f"unit {i} has no gradients: call grads({i}) and fill them first")
        if self.stage == 0:
            # The ring: its sums are bit for bit those of the ring reduce-scatter
            # of the sharded stages, which is what makes them equal to DDP.
            u.work = self.comm.all_reduce(u.grads, op="avg", async_op=True, algorithm="ring")
        else:
            u.work = self.comm.reduce_scatter(u.grads, op="avg", out=u.grad_shard, async_op=True)
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
                self._count("grads", -u.grads.nbytes)
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
        gathers = []
        for u in self._units:
            g = (u.grads if self.stage == 0 else u.grad_shard).astype(np.float32)
            self._update(u, g)
            if self.stage == 0:
                u.params[...] = u.master.astype(self.dtype)
            elif self.stage < 3:
                shard = u.params[u.lo:u.hi]
                shard[...] = u.master.astype(self.dtype)
                gathers.append(self.comm.all_gather(shard, out=u.params, async_op=True))  # the exact in-place form
            else:
                u.param_shard[...] = u.master.astype(self.dtype)
            if self.stage < 2:
                u.grads[...] = 0
        for w in gathers:
            w.wait()

    # ---- checkpoints -----------------------------------------------------------
    def save(self, prefix: str) -> str:
        """Write this rank's shard of the optimizer state (fp32 master weights,
        Adam moments, step count) to ``{prefix}.rank{r}.npz``; collective in
        spirit (every rank saves its own file). Returns the path."""
        return _save_shards(prefix, self.stage, self.comm, self.t, [u.count for u in self._units],
                            [self.lr, self.betas[0], self.betas[1], self.eps, self.weight_decay],
                            [(u.master, u.m, u.v) for u in self._units])

    def load(self, prefix: str) -> None:
        """Restore this rank's shard saved by ``save(prefix)`` with the same
        stage, number of ranks and units; parameters are rebuilt from the
        master weights (as every step leaves them), so training continues
        bit for bit where it stopped. Collective (stages 1-2 re-gather)."""
        self.t = _load_shards(prefix, self.stage, self.comm, [u.count for u in self._units],
                              [(u.master, u.m, u.v) for u in self._units])
        gathers = []
        for u in self._units:
            if self.stage == 0:
                u.params[...] = u.master.astype(self.dtype)
            elif self.stage < 3:
                shard = u.params[u.lo:u.hi]
                shard[...] = u.master.astype(self.dtype)
                gathers.append(self.comm.all_gather(shard, out=u.params, async_op=True))
            else:
                u.param_shard[...] = u.master.astype(self.dtype)
        for w in gathers:
            w.wait()

    def _update(self, u: _Unit, g: np.ndarray) -> None:
        _adam_update(u.master, u.m, u.v, g, self.t, self.lr, self.betas, self.eps, self.weight_decay,
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


# ---------------------------------------------------------------------------
# `ringcomm demo zero`: the articles' table, measured.

def _mlp_widths(psi: int, layers: int = 8) -> list[int]:
    """Widths of a `layers`-layer MLP with about `psi` parameters (square hidden layers)."""
    w = max(4, int((psi / layers) ** 0.5))
    return [w] * (layers + 1)


def _mlp_units(widths: list[int], dtype, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype), np.zeros(b, dtype)]
            for a, b in zip(widths[:-1], widths[1:])]


def _train_step(zero: "ZeroOptimizer", widths: list[int], rank: int, step: int, dtype, prefetch: bool = True):
    rng = np.random.default_rng(7919 * step + rank)
    x = rng.standard_normal((8, widths[0])).astype(np.float32)
    y = rng.standard_normal((8, widths[-1])).astype(np.float32)
    units = len(widths) - 1
    acts, zs = [x], []
    for u in range(units):
        if prefetch and u + 1 < units:
            zero.prefetch(u + 1)
        with zero.gathered(u) as (w, b):
            z = acts[-1] @ w.astype(np.float32) + b.astype(np.float32)
        zs.append(z)
        acts.append(np.tanh(z) if u < units - 1 else z)
    g = 2 * (acts[-1] - y) / y.size
    for u in reversed(range(units)):
        if prefetch and u > 0:
            zero.prefetch(u - 1)
        with zero.gathered(u) as (w, b):
            gz = g if u == units - 1 else g * (1 - np.tanh(zs[u]) ** 2)
            gw, gb = zero.grads(u)
            gw[...] = (acts[u].T @ gz).astype(dtype)
            gb[...] = gz.sum(0).astype(dtype)
            g = gz @ w.astype(np.float32).T
        zero.reduce(u)
    zero.step()


def measure(n: int, psi: int, steps: int = 2, dtype=np.float16, comm=None) -> dict:
    """Train the same MLP (about psi parameters) under DDP and ZeRO-1/2/3 on
    n in-process ranks, or on the ranks of `comm` (e.g. ringcomm.init() under
    mpirun; collective, every rank gets the result); per stage, the maximum
    over ranks of the bytes held (steady state, and peak during a step) and
    of the payload sent in one step (ledger), and the largest difference from
    DDP's parameters."""
    widths = _mlp_widths(psi)
    actual_psi = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    import ringcomm

    def body(comm, stage):
        zero = ZeroOptimizer(_mlp_units(widths, dtype), comm, stage=stage, lr=1e-3)
        for s in range(steps - 1):
            _train_step(zero, widths, comm.rank, s, dtype)
        zero.reset_peak()
        comm.reset_traffic()
        _train_step(zero, widths, comm.rank, steps - 1, dtype)
        sent = sum(comm.traffic().bytes_sent(c) for c in ("all_reduce", "reduce_scatter", "all_gather"))
        mem = zero.memory()
        params = zero.full_parameters()
        return mem, sent, params

    def diff(ref, got) -> float:
        return max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                   for unit_a, unit_b in zip(ref, got) for a, b in zip(unit_a, unit_b))

    results = {}
    ref = None
    for stage in (0, 1, 2, 3):
        if comm is None:
            res = ringcomm.run_local(n, body, stage)
            if stage == 0:
                ref = res[0][2]
            d = diff(ref, res[0][2])
            mem = {k: max(m[k] for m, _, _ in res) for k in ("params", "grads", "optimizer", "peak")}
            sent = max(s for _, s, _ in res)
        else:  # this rank's figures, then the maximum over ranks (and over every rank's difference from DDP)
            m, sent, params = body(comm, stage)
            if stage == 0:
                ref = params
            row = np.array([m["params"], m["grads"], m["optimizer"], m["peak"], sent], np.int64)
            comm.all_reduce(row, op="max")
            worst = np.array([diff(ref, params)])
            comm.all_reduce(worst, op="max")
            mem = dict(zip(("params", "grads", "optimizer", "peak"), (int(x) for x in row[:4])))
            sent, d = int(row[4]), float(worst[0])
        results[("ddp", "zero1", "zero2", "zero3")[stage]] = {
            "memory_bytes": {k: mem[k] for k in ("params", "grads", "optimizer")},
            "peak_memory_bytes": mem["peak"],
            "sent_bytes_per_step": sent,
            "max_abs_param_diff_vs_ddp": d,
        }
    return {"n": n if comm is None else comm.size, "ranks": "in-process" if comm is None else "mpi",
            "psi": actual_psi, "param_bytes": int(np.dtype(dtype).itemsize), "stages": results}


def _mpi_world_size() -> int:
    """The number of ranks when this process was started by mpirun (Open MPI,
    or a PMI launcher such as MPICH's hydra), else 0."""
    import os
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def demo(n: int, psi: int, json_path: str | None = None, png_path: str | None = None, out=None,
         mpi: bool | None = None) -> dict:
    """`ringcomm demo zero`: on n in-process ranks, or, when started under
    mpirun (``ringcomm run -n 4 ringcomm demo zero``; `mpi` None: detected from
    the launcher's environment), on the MPI ranks (n is then the world size);
    rank 0 prints and writes the files."""
    import json
    import sys
    out = out or sys.stdout
    if mpi is None:
        mpi = _mpi_world_size() > 1
    if mpi:
        import ringcomm
        comm = ringcomm.init()
        try:
            r = measure(comm.size, psi, comm=comm)
        finally:
            rank = comm.rank
            comm.close()
        if rank != 0:
            return r
    else:
        r = measure(n, psi)
    n = r["n"]
    psi, pb = r["psi"], r["param_bytes"]
    where = "MPI ranks" if mpi else "in-process ranks"
    print(f"ZeRO on {n} {where}: an {len(_mlp_widths(psi)) - 1}-layer MLP with Psi = {psi:,} parameters, "
          f"{pb}-byte parameters and gradients, Adam with fp32 master weights (K = 12 B per parameter).", file=out)
    print("Per rank (maximum over ranks), measured from the arrays each rank holds / the ledger, vs the formula:",
          file=out)
    head = f"{'':6} {'params':>22} {'grads':>22} {'optimizer':>22} {'total (formula)':>24} {'peak':>11} " \
           f"{'sent/step (formula)':>27} {'vs DDP':>7}"
    print(head, file=out)
    mib = 1 / 2**20
    formulas = {"ddp": "16Psi", "zero1": "4Psi+12Psi/N", "zero2": "2Psi+14Psi/N", "zero3": "16Psi/N"}
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        s = r["stages"][name]
        f = expected_memory(stage, psi, n, pb)
        m = s["memory_bytes"]
        cells = [f"{m[k] * mib:8.2f} ({f[k] * mib:8.2f}) MiB" for k in ("params", "grads", "optimizer")]
        total, ftotal = sum(m.values()), sum(f.values())
        sent, fsent = s["sent_bytes_per_step"], expected_traffic(stage, psi, n, pb)
        print(f"{name:6} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} "
              f"{total * mib:8.2f} ({formulas[name]} = {ftotal * mib:.2f}) {s['peak_memory_bytes'] * mib:8.2f} MiB "
              f"{sent * mib:8.2f} ({fsent * mib:8.2f}) MiB {s['max_abs_param_diff_vs_ddp']:7.1g}", file=out)
    print(f"(sent/step formula: {2 if True else 0}Psi(N-1)/N for DDP and ZeRO-1/2, 3Psi(N-1)/N for ZeRO-3, "
          f"times {pb} B; 'vs DDP': largest parameter difference after the steps: 0 = bitwise equal)", file=out)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(r, fh, indent=1)
        print(f"wrote {json_path}", file=out)
    if png_path:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = ["ddp", "zero1", "zero2", "zero3"]
        fig, ax = plt.subplots(figsize=(7, 4))
        bottom = np.zeros(4)
        for k, color in (("params", "#4c72b0"), ("grads", "#dd8452"), ("optimizer", "#55a868")):
            vals = np.array([r["stages"][s]["memory_bytes"][k] * mib for s in names])
            ax.bar(names, vals, bottom=bottom, label=k, color=color)
            bottom += vals
        ax.scatter(names, [sum(expected_memory(i, psi, n, pb).values()) * mib for i in range(4)], color="black",
                   marker="_", s=600, label="formula", zorder=3)
        ax.set_ylabel("MiB per rank")
        ax.set_title(f"ZeRO memory per rank, measured: Psi = {psi:,}, N = {n}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png_path, dpi=110)
        print(f"wrote {png_path}", file=out)
    return r

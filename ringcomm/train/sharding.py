"""What the two ZeRO front ends (``train.zero_optimizer.ZeroOptimizer`` on numpy units,
``torch.torch_zero.TorchZero`` on torch modules) share: the optimizer formula
applied to a shard, the per-rank checkpoint files (``train.zero_optimizer.consolidate``
reads them) and the memory ledger behind their ``memory()``. Chunks follow
vocab's split rule."""

from __future__ import annotations

import json

import numpy as np

from ..errors import InvalidArgument


def matched_sums(comm, in_arena: bool = False) -> str:
    """The algorithm whose all_reduce and reduce_scatter compute the same sums,
    bit for bit, which is what makes every ZeRO stage equal to DDP: "shm"
    where ``algorithm="auto"`` runs in shared memory (every rank sums in rank
    order, its all_reduce and shm_flat alike), "zero_copy" there for arrays
    in the shared arena (`in_arena`: every rank's; the same rank-order sums,
    read where the arrays are), else the ring (its reduce-scatter is the
    first half of its all_reduce)."""
    if getattr(comm, "shared_memory", False):
        return "zero_copy" if in_arena else "shm"
    return "ring"



def adam_update(p: np.ndarray, m, v, g: np.ndarray, t: int, lr: float, betas, eps: float,
                weight_decay: float, optimizer: str = "adam") -> None:
    """One optimizer step on fp32 master weights `p` in place (Adam with
    moments m, v, or SGD), elementwise and in float32 throughout: the one
    formula every ZeRO stage (numpy units and torch modules) applies, so their
    shards stay bitwise equal to DDP's full update."""
    if weight_decay:
        g = g + np.float32(weight_decay) * p
    if optimizer == "sgd":
        p -= np.float32(lr) * g
        return
    b1, b2 = np.float32(betas[0]), np.float32(betas[1])
    m *= b1
    m += (np.float32(1) - b1) * g
    v *= b2
    v += (np.float32(1) - b2) * (g * g)
    c1 = np.float32(1 - betas[0] ** t)
    c2 = np.float32(1 - betas[1] ** t)
    p -= np.float32(lr) * (m / c1) / (np.sqrt(v / c2) + np.float32(eps))


class MemoryLedger:
    """Bytes of parameters, gradients and optimizer state a rank holds, by
    kind, counted as buffers are allocated and freed, with their peak."""

    def __init__(self):
        self.alive = {"params": 0, "grads": 0, "optimizer": 0}
        self.peak = 0

    def count(self, kind: str, nbytes: int) -> None:
        self.alive[kind] += nbytes
        self.peak = max(self.peak, sum(self.alive.values()))

    def memory(self) -> dict:
        return dict(self.alive, peak=self.peak)

    def reset_peak(self) -> None:
        self.peak = sum(self.alive.values())


def _host(a) -> np.ndarray:
    """A numpy copy of a numpy or cupy array (for the checkpoint file)."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _like(template, a: np.ndarray):
    """`a` (host) in `template`'s array family (cupy for a device array)."""
    if isinstance(template, np.ndarray):
        return a
    import cupy
    return cupy.asarray(a)


def save_shards(prefix: str, stage: int, comm, t: int, counts, hyper, states, shapes=None, extra=None) -> str:
    """Write this rank's optimizer shard: `states` is one (master, m, v) per
    unit (m, v None for SGD); `shapes`, the shapes of each unit's parameters
    (load_shards checks them); `extra`, named numpy arrays of state outside
    the optimizer (a module's buffers and frozen parameters). The format
    consolidate() reads."""
    arrays = {"meta": np.array([stage, comm.size, comm.rank, t, len(counts)], np.int64),
              "counts": np.array(counts, np.int64),
              "hyper": np.array(hyper, np.float64)}
    if shapes is not None:
        arrays["shapes"] = np.array(json.dumps(_shape_lists(shapes)))
    for i, (master, m, v) in enumerate(states):  # device arrays (cupy) come to the host for the file
        arrays[f"master{i}"] = _host(master)
        if m is not None:
            arrays[f"m{i}"], arrays[f"v{i}"] = _host(m), _host(v)
    for name, a in (extra or {}).items():
        arrays[f"extra:{name}"] = a
    path = f"{prefix}.rank{comm.rank}.npz"
    np.savez(path, **arrays)
    return path


def _shape_lists(shapes) -> list:
    return [[[int(d) for d in shape] for shape in unit] for unit in shapes]


def load_shards(prefix: str, stage: int, comm, counts, states, what: str = "this optimizer", shapes=None,
                extra=None) -> int:
    """Read this rank's shard written by save_shards into `states` (the same
    (master, m, v) arrays, filled in place), after checking the layout (and,
    where both sides have them, the parameters' shapes); returns the step
    count. `extra`: name -> (shape, setter) of the state saved as save_shards'
    `extra`; each setter gets its numpy array (a checkpoint without them, of
    an older version, sets none). Nothing is written unless every check passes."""
    counts = [int(c) for c in counts]
    with np.load(f"{prefix}.rank{comm.rank}.npz") as f:
        t = _check_layout(f, prefix, stage, comm, counts, what)
        if shapes is not None and "shapes" in f.files:
            _check_shapes(f, prefix, shapes, what)
        has_moments, wants_moments = "m0" in f.files, states and states[0][1] is not None
        if states and has_moments != wants_moments:  # checked before anything is written
            kinds = {True: "Adam (with moments m, v)", False: "SGD (no moments)"}
            raise InvalidArgument(f"checkpoint {prefix} holds the state of {kinds[has_moments]}; "
                                  f"{what} is {kinds[wants_moments]}")
        saved_extra = {k[len("extra:"):] for k in f.files if k.startswith("extra:")}
        extra = extra if extra is not None and saved_extra else None  # (an older checkpoint: none)
        if extra is not None:
            _check_extra(f, prefix, extra, saved_extra, what)
        for i, (master, m, v) in enumerate(states):
            master[...] = _like(master, f[f"master{i}"])
            if m is not None:
                m[...], v[...] = _like(m, f[f"m{i}"]), _like(v, f[f"v{i}"])
        for name, (_, setter) in (extra or {}).items():
            setter(f[f"extra:{name}"])
    return t


def _check_layout(f, prefix: str, stage: int, comm, counts: list, what: str) -> int:
    """The checkpoint's stage, ranks and units are this optimizer's; its step count."""
    st, n, rank, t, units = (int(x) for x in f["meta"])
    if (st, n, rank) != (stage, comm.size, comm.rank) or units != len(counts):
        raise InvalidArgument(f"checkpoint {prefix} is stage {st}, rank {rank} of {n}, {units} units; "
                              f"{what} is stage {stage}, rank {comm.rank} of "
                              f"{comm.size}, {len(counts)} units (consolidate() to change N)")
    if [int(c) for c in f["counts"]] != counts:
        raise InvalidArgument(f"checkpoint {prefix} has units of {[int(c) for c in f['counts']]} parameters, "
                              f"this model {counts}")
    return t


def _check_shapes(f, prefix: str, shapes, what: str) -> None:
    saved, mine = json.loads(str(f["shapes"])), _shape_lists(shapes)
    if saved != mine:
        k = next(i for i, (a, b) in enumerate(zip(saved + [None] * len(mine), mine + [None] * len(saved)))
                 if a != b)
        raise InvalidArgument(f"checkpoint {prefix} holds other parameters: unit {k} has shapes "
                              f"{saved[k] if k < len(saved) else None} there, {mine[k] if k < len(mine) else None} "
                              f"in {what}")


def _check_extra(f, prefix: str, extra: dict, saved_extra: set, what: str) -> None:
    if saved_extra != set(extra):
        missing, unknown = sorted(set(extra) - saved_extra), sorted(saved_extra - set(extra))
        raise InvalidArgument(f"checkpoint {prefix} holds other buffers or frozen parameters than {what}: "
                              f"missing there {missing}, unknown here {unknown}")
    for name, (shape, _) in extra.items():
        if tuple(f[f"extra:{name}"].shape) != tuple(shape):
            raise InvalidArgument(f"checkpoint {prefix}: {name} has shape {tuple(f[f'extra:{name}'].shape)} "
                                  f"there, {tuple(shape)} in {what}")

"""Cross-rank agreement for training: start every rank from the same
parameters (``broadcast_parameters``) and check that they still agree
(``check_consistency``). The small helpers below (a 64-bit hash, an
all_gather of one int64 row per rank, a parameter's label in messages) are
also what ``GradBucketer`` uses to check that every rank registered the same
parameters and settings.
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .. import vocab
from ..errors import DivergenceError, MismatchError, RegistrationMismatchError
from .tensors import Spec, bytes_of, describe

__all__ = ["broadcast_parameters", "check_consistency", "ConsistencyReport", "hash64", "gather_rows",
           "param_label", "spec_summary", "spec_differences", "check_registration", "unused_message"]


def hash64(*parts: bytes) -> int:
    """A signed 64-bit blake2b digest of `parts` (fits one int64 slot of a gathered row)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p)
    return int.from_bytes(h.digest(), "little", signed=True)


def param_label(i: int, names: Sequence[str] | None) -> str:
    """Parameter i as error messages name it: its index, and its name if given."""
    return f"{i} ({names[i]!r})" if names is not None else str(i)


def gather_rows(comm, row: np.ndarray) -> np.ndarray:
    """all_gather one equal-length int64 row per rank -> array of shape (size, len(row))."""
    row = np.ascontiguousarray(row, dtype=np.int64)
    out = np.empty(row.size * comm.size, dtype=np.int64)
    if row.size:
        comm.all_gather(row, out=out)
    return out.reshape(comm.size, row.size)


_FAMILIES = ("numpy", "torch")
_MAX_DIMS = 64  # numpy's limit (torch's is lower)


def spec_summary(specs: Sequence[Spec]) -> tuple[list[int], list[int]]:
    """([number of parameters, their elements, a hash of them all], one hash
    per parameter) of family, shape, dtype and device: equal rows on two ranks
    mean they registered the same parameters in the same order."""
    per = [hash64(repr((s.family, s.shape, s.dtype, s.device)).encode()) for s in specs]
    return [len(specs), sum(s.numel for s in specs), hash64(np.array(per, dtype=np.int64).tobytes())], per


def spec_differences(comm, specs: Sequence[Spec], per: list[int], counts: np.ndarray,
                     names: Sequence[str] | None = None) -> list[str]:
    """What differs between the ranks' parameters, as message lines, given
    every rank's spec_summary row (`counts`: their first two columns, one row
    per rank). Collective (two small all_gathers; every rank takes the same
    path, as all see the same rows)."""
    n = comm.size
    lines = ["parameters differ: " + "; ".join(
        f"rank {r}: {counts[r, 0]} parameters, {counts[r, 1]} elements" for r in range(n))]
    m = int(counts[:, 0].min())
    hashes = gather_rows(comm, np.array(per[:m], dtype=np.int64))
    diff = np.flatnonzero((hashes != hashes[0]).any(axis=0))
    if not diff.size:
        lines.append(f"the first {m} parameters agree; " + ", ".join(
            f"rank {r} has {counts[r, 0] - m} more" for r in range(n) if counts[r, 0] > m))
        return lines
    j = int(diff[0])
    s = specs[j]
    # (a device is named by its spec only: host parameters are all "cpu")
    row = [vocab.DTYPES[s.dtype], _FAMILIES.index(s.family), len(s.shape)] + list(s.shape)
    d = gather_rows(comm, np.array(row + [-1] * (3 + _MAX_DIMS - len(row))))
    dtypes = {v: k for k, v in vocab.DTYPES.items()}
    lines.append(f"first difference at parameter {param_label(j, names)}: " + ", ".join(
        f"rank {r} has {tuple(int(x) for x in d[r, 3:3 + int(d[r, 2])])} {dtypes[int(d[r, 0])]} "
        f"({_FAMILIES[int(d[r, 1])]})" for r in range(n)))
    return lines


def check_registration(comm, specs: Sequence[Spec], names, settings: list[int]) -> None:
    """GradBucketer's registration check: one all_gather of a fixed-size
    summary (the parameters' and the bucket `settings`); on a mismatch, two
    more small collectives find the first differing parameter (all ranks see
    the same gathered data, so all take the same path and raise the same
    error)."""
    summary, per = spec_summary(specs)
    rows = gather_rows(comm, np.array(summary + settings))
    if (rows == rows[0]).all():
        return
    n = comm.size
    lines = []
    if not (rows[:, 3:] == rows[0, 3:]).all():
        lines.append("bucket settings differ: " + "; ".join(
            f"rank {r}: bucket_cap={rows[r, 3]} B, first_bucket={rows[r, 4]} B, average={bool(rows[r, 5])}, "
            f"find_unused={bool(rows[r, 6])}, rebuild_buckets={bool(rows[r, 7])}" for r in range(n)))
    if not (rows[:, :3] == rows[0, :3]).all():
        lines += spec_differences(comm, specs, per, rows[:, :2], names)
    raise RegistrationMismatchError(
        "GradBucketer: ranks registered different parameters or settings (every rank must pass the "
        "same parameters, array families, shapes, dtypes and order, and the same bucket settings). " + " ".join(lines),
        rank=comm.rank)


def unused_message(unused: dict[int, list[int]], n: int, names) -> str:
    """GradBucketer.finalize's error for parameters some rank never got ready."""
    items = []
    for i, ranks in sorted(unused.items()):
        where = "all ranks" if len(ranks) == n else "rank" + ("s " if len(ranks) > 1 else " ") + \
            ", ".join(map(str, ranks))
        items.append(f"parameter {param_label(i, names)} on {where}")
    shown = "; ".join(items[:20]) + (f"; ... ({len(items)} in all)" if len(items) > 20 else "")
    return ("GradBucketer.finalize: some parameters never became ready (no gradient) in this iteration: "
            f"{shown}. Every parameter must receive a gradient on every rank in a synchronised "
            "iteration; pass find_unused=True (find_unused_parameters=True for the torch wrapper) to "
            "zero-fill and reduce them instead. The gradients of this iteration are invalid.")


def broadcast_parameters(params: Iterable, comm, root: int = 0) -> None:
    """Overwrite every rank's parameters (numpy arrays or torch tensors) with
    rank `root`'s, in place: for the start of training. Collective. Parameters
    are packed into one buffer per dtype, so it costs one broadcast per dtype.
    Ranks whose parameters differ in number, order, family, shape or dtype
    raise MismatchError, all of them, naming the first difference (checked
    with one small all_gather before any parameter moves)."""
    params = list(params)
    specs = [describe(p, f"parameter {i}") for i, p in enumerate(params)]
    row, per = spec_summary(specs)
    rows = gather_rows(comm, np.array(row))
    if not (rows == rows[0]).all():
        raise MismatchError("broadcast_parameters: ranks hold different parameters (every rank must pass the same "
                            "parameters, shapes, dtypes and order). "
                            + " ".join(spec_differences(comm, specs, per, rows[:, :2])), rank=comm.rank)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(specs):
        groups.setdefault((s.family, s.dtype, s.device), []).append(i)
    for key in sorted(groups, key=repr):  # same order on every rank
        idx = groups[key]
        if key[0] == "torch":
            import torch
            with torch.no_grad():
                flat = torch.cat([params[i].detach().reshape(-1) for i in idx]) if idx else None
                comm.broadcast(flat, root=root)
                off = 0
                for i in idx:
                    p = params[i]
                    p.copy_(flat[off:off + p.numel()].view(p.shape))
                    off += p.numel()
        else:
            flat = np.concatenate([np.asarray(params[i]).reshape(-1) for i in idx])
            comm.broadcast(flat, root=root)
            off = 0
            for i in idx:
                p = params[i]
                p[...] = flat[off:off + p.size].reshape(p.shape)
                off += p.size


@dataclass
class ConsistencyReport:
    """Result of check_consistency (identical on every rank)."""
    ok: bool
    hashes: list                               # per rank: hash of all parameter values
    diverged_ranks: list = field(default_factory=list)
    params_by_rank: dict = field(default_factory=dict)   # diverged rank -> differing parameter indices
    message: str = ""


def check_consistency(params: Iterable, comm, *, names: Sequence[str] | None = None,
                      raise_on_divergence: bool = True) -> ConsistencyReport:
    """Cheap cross-rank check that every rank holds bitwise-identical parameter
    values. Collective: one all_gather of two int64 per rank (a hash of every
    parameter's bytes, shape and dtype); only when they differ, a second
    all_gather of one hash per parameter names the differing parameters.

    The reference is the majority value (ties: the value of the lowest rank);
    ranks with another value are reported as diverged. Raises DivergenceError
    on every rank when some diverged (unless raise_on_divergence=False).
    """
    params = list(params)
    per = []
    for i, p in enumerate(params):
        s = describe(p, f"parameter {i}")
        per.append(hash64(repr((s.shape, s.dtype)).encode(), bytes_of(p).data))
    per_arr = np.array(per, dtype=np.int64)
    rows = gather_rows(comm, np.array([len(params), hash64(per_arr.tobytes())]))
    keys = [tuple(r) for r in rows.tolist()]
    if len(set(keys)) == 1:
        return ConsistencyReport(True, [k[1] for k in keys])
    counts = collections.Counter(keys)
    best = max(counts.values())
    ref = next(k for k in keys if counts[k] == best)  # lowest rank among the most common values
    diverged = [r for r, k in enumerate(keys) if k != ref]
    by_rank: dict[int, list[int]] = {}
    if len(set(k[0] for k in keys)) == 1:
        hashes = gather_rows(comm, per_arr)
        ref_rank = keys.index(ref)
        for r in diverged:
            by_rank[r] = [int(i) for i in np.flatnonzero(hashes[r] != hashes[ref_rank])]
    parts = []
    for r in diverged:
        if r in by_rank:
            ps = ", ".join(param_label(i, names) for i in by_rank[r][:10])
            more = f" ... ({len(by_rank[r])} in all)" if len(by_rank[r]) > 10 else ""
            parts.append(f"rank {r} (parameters {ps}{more})")
        else:
            parts.append(f"rank {r} ({keys[r][0]} parameters, expected {ref[0]})")
    msg = (f"parameters diverged across ranks: {'; '.join(parts)} differ from the majority "
           f"(rank {keys.index(ref)}'s values, shared by {best} of {comm.size} ranks)")
    report = ConsistencyReport(False, [k[1] for k in keys], diverged, by_rank, msg)
    if raise_on_divergence:
        raise DivergenceError(msg, report, rank=comm.rank)
    return report

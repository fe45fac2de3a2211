"""The policy of ``algorithm="auto"`` as data: every threshold and crossover
it decides by, in one table.

Each row (``Quantity``) names one quantity, its built-in default, the
environment variable that overrides it and the key under which ``ringcomm
tune`` records a measured value. Where a value comes from, first match wins:

1. the environment variable (``RINGCOMM_TRANSPORT=shm`` also lifts the
   window's size limits: ``max`` and ``from``);
2. what ``ringcomm tune`` measured on this many ranks (``tuned()``);
3. the default here.

The functions below read the table; the engine's setters
(``Engine.set_shm_auto``, ``ShmWindow.single_copy_min``, ...) receive what they
return. The measurements behind the defaults are in bench/README.md, "Where
auto's defaults come from".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import InvalidArgument

__all__ = ["Quantity", "POLICY", "COLLECTIVES", "UNLIMITED", "tuned", "auto_limits", "slot_bytes", "arena_bytes",
           "flat_max", "single_copy_min", "single_copy_min_4k", "shm_max", "shm_from"]

# A size limit that never binds (written to the tune file as it is).
UNLIMITED = 1 << 62

# (the order Engine.set_shm_auto takes its per-collective lists in)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather", "scatter", "all_to_all")


@dataclass(frozen=True)
class Quantity:
    """One quantity auto decides by: its default (bytes, or per collective a
    dict of bytes; a collective absent means `missing`), the variable that
    overrides it (None: none) and tune's key for it (None: tune leaves it)."""
    name: str
    default: object
    env: str | None = None
    tuned_key: str | None = None
    missing: int = UNLIMITED
    what: str = ""


_ROWS = (
    Quantity("slot", 256 << 10, "RINGCOMM_SHM_SLOT",
             what="bytes of one rank's staging slot (two per rank: the rounds alternate); small enough that every "
                  "rank's two slots stay in the last-level cache"),
    Quantity("arena", 128 << 20, "RINGCOMM_SHM_ARENA",
             what="bytes of each rank's part of the shared arena (comm.empty), reserved in /dev/shm at the first "
                  "comm.empty()"),
    Quantity("flat_max", 32 << 10, "RINGCOMM_SHM_FLAT_MAX", "flat_max",
             what="all_reduce up to this many bytes runs the one-sync algorithm (shm_flat): every rank reduces the "
                  "whole vector, N reads of it for one sync instead of two; never above a slot"),
    Quantity("single_copy_min", 64 << 10, "RINGCOMM_SHM_SINGLE_COPY", "single_copy_min",
             what="blocks (a call's bytes over its ranks) of at least this many bytes move by single copy "
                  "(process_vm_readv / writev straight from or into the peers' arrays) instead of the slots"),
    Quantity("single_copy_min_4k", None, "RINGCOMM_SHM_SINGLE_COPY_4K", "single_copy_min_4k",
             what="the same for all_to_all's and all_gather's blocks in 4 KiB pages (the kernel pins each page it "
                  "copies); default None: single_copy_min's value; never below it"),
    Quantity("max", {"all_reduce": 128 << 10, "reduce_scatter": 32 << 10, "all_gather": 32 << 10,
                     "broadcast": UNLIMITED, "reduce": 4 << 10, "gather": 16 << 10, "scatter": 16 << 10,
                     "all_to_all": 16 << 10}, "RINGCOMM_SHM_MAX", "max",
             what="per collective, the largest buffer auto runs in the window while the ranks fit the cores; "
                  "above it MPI's single-copy point-to-point wins (the variable: one limit for all)"),
    Quantity("max_oversubscribed", {"gather": 16 << 10, "scatter": 256 << 10, "all_to_all": 64 << 10},
             tuned_key="max",
             what="the same with more ranks than cores: the window wins everywhere but where one rank sends "
                  "everything (scatter's root) or every rank sends n-1 blocks"),
    Quantity("from", {"reduce": 1 << 20, "gather": 1 << 20}, tuned_key="from",
             what="per collective, the size from which auto runs the window again, above max (absent: never)"),
    Quantity("from_oversubscribed", {"gather": 4 << 20}, tuned_key="from",
             what="the same with more ranks than cores"),
    Quantity("from_single_copy", {"all_gather": 256 << 10, "gather": 256 << 10, "scatter": 256 << 10,
                                  "all_to_all": 256 << 10}, tuned_key="from",
             what="with single copy on, the window wins again from these sizes (the smaller of this and from)"),
    Quantity("from_single_copy_oversubscribed", {"gather": 256 << 10, "scatter": 256 << 10, "all_to_all": 256 << 10},
             tuned_key="from", what="the same with more ranks than cores"),
    Quantity("margin", 0.1,
             what="the ring stays auto's all_reduce unless another algorithm is predicted faster by more than this "
                  "fraction: the cost model leaves out the ring's pipelining"),
    Quantity("reduce_tree_max", 256 << 10,
             what="reduce's binomial tree runs at most this many bytes, whatever the cost model says: the tree's "
                  "root reduces every byte alone, which a model whose gamma fit to 0 cannot see"),
)

POLICY: dict[str, Quantity] = {q.name: q for q in _ROWS}

# The collectives whose large blocks single copy moves: what tune measured
# for them holds only with single copy as it was then (on or off).
_SINGLE_COPY_COLLECTIVES = ("all_gather", "gather", "scatter", "all_to_all", "reduce")


def default(name: str):
    """The built-in default of the quantity `name`."""
    return POLICY[name].default


def _int_env(name: str, default: int) -> int:
    v = os.environ.get(name)
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer number of bytes, got {v!r}") from None


def _at_least_a_page(name: str) -> int:
    q = POLICY[name]
    b = _int_env(q.env, q.default)
    if b < 4096:
        raise InvalidArgument(f"{q.env} must be at least 4096 bytes, got {b}")
    return b


def slot_bytes() -> int:
    return _at_least_a_page("slot")


def arena_bytes() -> int:
    return _at_least_a_page("arena") // 4096 * 4096


def _transport_is_shm() -> bool:
    from . import transports
    return transports.mode() == "shm"


def tune_path() -> str:
    """Where ``ringcomm tune`` writes what it measured (its cost models and the window's limits)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ringcomm", "tune.json")


def tuned(nranks: int | None, single_copy: bool = True) -> dict | None:
    """What ``ringcomm tune`` measured for `nranks` ranks of one host:
    {"max": {collective: the largest size (bytes) up to which the window
    beat point-to-point}, "from": {collective: the size from which it beat it
    again}, "flat_max": up to which the one-sync all_reduce beat the direct
    one, and "single_copy_min" and "single_copy_min_4k" where tune chose
    single copy's limits}, or None (not measured). Collectives tune did not
    measure (an older tune: the rooted ones) are absent; so are those single
    copy moves when it was on then and is not now (`single_copy`), or the
    reverse."""
    if not nranks:
        return None
    try:
        with open(tune_path()) as f:
            entry = json.load(f)["shm"]["limits"][str(int(nranks))]
        same = bool(entry.get("single_copy", True)) == bool(single_copy)
        keep = [c for c in COLLECTIVES if same or c not in _SINGLE_COPY_COLLECTIVES]
        got = {"max": {c: int(entry[c]) for c in keep if c in entry},
               "from": {c: int(v) for c, v in entry.get("from", {}).items() if c in keep},
               "flat_max": int(entry["flat_max"])}
        for k in ("single_copy_min", "single_copy_min_4k"):
            if k in entry:
                got[k] = int(entry[k])
        return got
    except (OSError, KeyError, ValueError, TypeError, AttributeError):
        return None


def _single_copy_limit(name: str, default: int, nranks: int | None) -> int:
    """The quantity's variable (bytes, or "off": UNLIMITED), else tune's
    value on `nranks` ranks, else `default`."""
    q = POLICY[name]
    v = os.environ.get(q.env, "").strip().lower()
    if v in ("off", "no", "false", "never"):
        return UNLIMITED
    default = (tuned(nranks) or {}).get(q.tuned_key, default)
    b = _int_env(q.env, default) if v else default
    if b < 0:
        raise InvalidArgument(f"{q.env} must be a number of bytes or 'off', got {v!r}")
    return b


def single_copy_min(nranks: int | None = None) -> int:
    """``RINGCOMM_SHM_SINGLE_COPY``: the smallest block (bytes) moved by single
    copy, or "off" (never); else what ``ringcomm tune`` chose on `nranks`
    ranks (which was faster, single copy or the slots, moves with the
    machine and the arrays' pages: bench/README.md); else the default.
    Returns UNLIMITED for off."""
    return _single_copy_limit("single_copy_min", default("single_copy_min"), nranks)


def single_copy_min_4k(nranks: int | None = None) -> int:
    """``RINGCOMM_SHM_SINGLE_COPY_4K``: the smallest block (bytes) of
    all_to_all or all_gather moved by single copy when it lies in 4 KiB
    pages (the side single copy pins), or "off" (never: the slots); else
    what ``ringcomm tune`` chose on `nranks` ranks; else
    single_copy_min(nranks) itself. Never below single_copy_min(nranks).
    Returns UNLIMITED for off."""
    any_pages = single_copy_min(nranks)
    return max(_single_copy_limit("single_copy_min_4k", any_pages, nranks), any_pages)


def oversubscribed(nranks: int | None) -> bool:
    """More ranks than this host's cores (the limits measured for that case apply)."""
    return bool(nranks) and nranks > (os.cpu_count() or 1)


def shm_max(nranks: int, single_copy: bool = True) -> list:
    """Per collective (in the order of COLLECTIVES) the largest buffer auto
    runs in the window: ``RINGCOMM_SHM_MAX``, else none with
    ``RINGCOMM_TRANSPORT=shm``, else what ``ringcomm tune`` measured on this
    many ranks (with single copy on or off as `single_copy` says: tuned),
    else the defaults (when the ranks outnumber the cores: none, but
    max_oversubscribed's)."""
    n = len(COLLECTIVES)
    if os.environ.get(POLICY["max"].env):
        return [_int_env(POLICY["max"].env, UNLIMITED)] * n
    if _transport_is_shm():
        return [UNLIMITED] * n
    t = (tuned(nranks, single_copy) or {}).get("max", {})
    table = default("max_oversubscribed") if oversubscribed(nranks) else default("max")
    return [t.get(c, table.get(c, UNLIMITED)) for c in COLLECTIVES]


def shm_from(nranks: int | None = None, single_copy: bool = False) -> list:
    """Per collective (in the order of COLLECTIVES) the size from which auto
    runs in the window again, above shm_max's limit (UNLIMITED: never):
    from (from_oversubscribed when `nranks` outnumber the cores; with
    `single_copy`, also from_single_copy or its oversubscribed row,
    whichever is smaller), unless ``RINGCOMM_SHM_MAX`` (one limit, nothing
    above it) or ``RINGCOMM_TRANSPORT=shm`` (no limit) says otherwise; where
    ``ringcomm tune`` measured a collective on this many ranks, what it
    measured."""
    if os.environ.get(POLICY["max"].env) or _transport_is_shm():
        return [UNLIMITED] * len(COLLECTIVES)
    over = "_oversubscribed" if oversubscribed(nranks) else ""
    table = default("from" + over)
    extra = default("from_single_copy" + over) if single_copy else {}
    t = (tuned(nranks, single_copy) or {}).get("from", {})
    return [t.get(c, min(table.get(c, UNLIMITED), extra.get(c, UNLIMITED))) for c in COLLECTIVES]


def flat_max(nranks: int | None = None) -> int:
    """all_reduce up to this many bytes runs shm_flat: ``RINGCOMM_SHM_FLAT_MAX``,
    else what ``ringcomm tune`` measured on `nranks` ranks, else the default;
    never above a slot."""
    q = POLICY["flat_max"]
    t = None if q.env in os.environ else tuned(nranks)
    fallback = t[q.tuned_key] if t is not None else q.default
    return max(0, min(_int_env(q.env, fallback), slot_bytes()))


def auto_limits(nranks: int, readable: bool = True) -> dict:
    """Everything algorithm="auto" decides the window by on `nranks` ranks
    of one host, as the window's attach gives it to the engine and the
    window: {"flat_max", "max" and "from" (lists in the order of
    COLLECTIVES), "single_copy_min", "single_copy_min_4k"}. `readable`: every
    rank can read its peers' memory (else single copy is off, and the limits
    are those measured without it)."""
    single = single_copy_min(nranks) if readable else UNLIMITED
    on = single < UNLIMITED
    return {"flat_max": flat_max(nranks), "max": shm_max(nranks, on), "from": shm_from(nranks, on),
            "single_copy_min": single, "single_copy_min_4k": single_copy_min_4k(nranks) if on else UNLIMITED}

"""Shared memory between the ranks of one host: finding them and mapping
their window (csrc/core/shm_window.h, the algorithms in csrc/algorithms/shm.cpp).

Which ranks share a host: the same ``hostname`` and kernel boot id
(``/proc/sys/kernel/random/boot_id``), or the same ``RINGCOMM_HOST_ID`` (so
tests can split one machine into several "hosts"); then confirmed by
mapping: containers on one node may not share ``/dev/shm``.

``RINGCOMM_TRANSPORT`` chooses what ``algorithm="auto"`` uses between ranks
of one host: ``auto`` (default: shared memory when every rank of the
communicator is on one host, else MPI point-to-point), ``mpi`` (never shared
memory: no segment is made), ``shm`` (shared memory, or an error when the
ranks are not on one host) or ``ucx`` (every message over UCX, no shared
memory: ringcomm/ucx.py). In-process worlds (``run_local``) always have a
window (plain memory), so ``algorithm="shm"`` runs there; ``auto`` uses it
only with ``RINGCOMM_TRANSPORT=shm``: the in-process world teaches the ring.

Segments: the lowest rank creates a file in ``/dev/shm`` without a name
(``O_TMPFILE``, mode 0600), reserves it with ``posix_fallocate`` (a full
``/dev/shm`` is a clear error, or under ``auto`` a warning and MPI
point-to-point) and keeps it open while the others open it through its
descriptor (``/proc/<pid>/fd/<fd>``, checked by device and inode). A file
without a name lives only while a process has it open or mapped: a crash,
even a SIGKILL of every rank in the middle of ``init()``, leaves nothing in
``/dev/shm``. Only where a peer cannot reach the creator's ``/proc`` (another
pid namespace) does the file get a name for the rest of the hand-shake
(``ringcomm-...flock``), guarded by the creator's flock: a named file whose
lock is free has lost its creator, and every later hand-shake on the host
removes such files of its user (``csrc/transports/shm_segment.h``).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import math
import os
import secrets
import signal
import socket
import threading
import warnings

from ._native import core
from .errors import InvalidArgument, RingcommError, from_rank0
from .tuning.selection import UNLIMITED

__all__ = ["host_key", "mode", "slot_bytes", "flat_max", "arena_bytes", "attach_mpi", "attach_local", "empty"]

MODES = ("auto", "mpi", "shm", "ucx")  # ucx: the engine's messages over UCX, no window (ringcomm/ucx.py)

# Bytes of one rank's staging slot (two per rank: the rounds alternate).
# Small enough that every rank's two slots stay in the last-level cache.
DEFAULT_SLOT = 256 * 1024
# all_reduce up to this many bytes runs the one-sync algorithm (shm_flat):
# every rank reduces the whole vector, which costs N reads of it but one
# sync instead of two. Measured here (2 cores, median of 5 x 200 calls):
# N = 2: flat 8.0 vs direct 8.8 us at 32 KiB, 10.5 vs 9.9 at 64 KiB; N = 4
# (oversubscribed): flat ahead up to 64 KiB, even at 128 KiB.
DEFAULT_FLAT_MAX = 32 * 1024


def host_key() -> str:
    """What identifies this host: ``RINGCOMM_HOST_ID``, else hostname + boot id."""
    override = os.environ.get("RINGCOMM_HOST_ID")
    if override:
        return "id:" + override
    return f"{socket.gethostname()}:{_boot_id()}"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "?"


def sched_group() -> str | None:
    """This process's kernel scheduling group where the kernel groups tasks
    by session (autogroup: ``kernel.sched_autogroup_enabled=1`` and no cpu
    cgroup of its own), else None."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            if f.read().strip() != "1":
                return None
        # A cpu cgroup other than the root takes precedence over autogroup:
        # cgroup v1's cpu controller where mounted, else v2's unified tree.
        with open("/proc/self/cgroup") as f:
            lines = [line.split(":", 2) for line in f.read().splitlines()]
        cpu = [path for _, ctl, path in lines if "cpu" in ctl.split(",")] or \
            [path for _, ctl, path in lines if ctl == ""]
        if any(path != "/" for path in cpu):
            return None
        with open("/proc/self/autogroup") as f:
            return f.read().split()[0]
    except (OSError, ValueError, IndexError):
        return None


def split_scheduling(groups: list) -> bool:
    """Whether the ranks of one host (their sched_group()s) outnumber its
    cores while sitting in different scheduling groups. A waiting rank then
    cannot hand its core to the peer it waits for: sched_yield only yields
    within the yielder's group (torchrun starts every worker in a session,
    hence a group, of its own; mpirun keeps its ranks in one). Measured here
    (N = 4 on 2 cores, 4 MiB all_reduce after gloo calls, bench/README.md):
    3.1-3.6 ms under torchrun against 2.2-2.3 under mpirun, and 2.3 under
    both with kernel.sched_autogroup_enabled=0."""
    return len(groups) > _cores() and None not in groups and len(set(groups)) > 1


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _say_if_split_scheduling(groups: list, first: bool) -> None:
    if first and split_scheduling(groups):
        warnings.warn(
            f"ringcomm: the {len(groups)} ranks on this host outnumber the {_cores()} cores they may run on, and each runs "
            "in a kernel scheduling group of its own (autogroup: one per session; torchrun starts every worker "
            "in its own session), so a rank that waits cannot hand its core to the peer it waits for: expect "
            "collectives up to about 1.5x slower than with the same ranks in one group (as under mpirun). "
            "Fewer ranks than cores, or `sysctl kernel.sched_autogroup_enabled=0`, avoids it.",
            RuntimeWarning, stacklevel=5)


def mode(value: str | None = None) -> str:
    m = (value or os.environ.get("RINGCOMM_TRANSPORT") or "auto").strip().lower()
    if m not in MODES:
        raise InvalidArgument(f"RINGCOMM_TRANSPORT must be one of {', '.join(MODES)}, got {m!r}")
    return m


def _int_env(name: str, default: int) -> int:
    v = os.environ.get(name)
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer number of bytes, got {v!r}") from None


def slot_bytes() -> int:
    b = _int_env("RINGCOMM_SHM_SLOT", DEFAULT_SLOT)
    if b < 4096:
        raise InvalidArgument(f"RINGCOMM_SHM_SLOT must be at least 4096 bytes, got {b}")
    return b


# Bytes of each rank's part of the shared arena (comm.empty), made at the
# first comm.empty() call: reserved in /dev/shm then, per rank.
DEFAULT_ARENA = 128 << 20


def arena_bytes() -> int:
    b = _int_env("RINGCOMM_SHM_ARENA", DEFAULT_ARENA)
    if b < 4096:
        raise InvalidArgument(f"RINGCOMM_SHM_ARENA must be at least 4096 bytes, got {b}")
    return b // 4096 * 4096


# Blocks of at least this many bytes (a call's bytes over its ranks) move
# by single copy in the window: all_gather, scatter and all_to_all read them
# straight from the peers' arrays, gather's leaves write them into the
# root's, reduce's ranks read their parts of the peers' inputs and write
# the sums into the root's output (csrc/algorithms/shm.cpp,
# process_vm_readv / writev), instead of through the slots.
DEFAULT_SINGLE_COPY_MIN = 64 << 10


def single_copy_min(nranks: int | None = None) -> int:
    """``RINGCOMM_SHM_SINGLE_COPY``: the smallest block (bytes) moved by single
    copy, or "off" (never); else what ``ringcomm tune`` chose on `nranks`
    ranks (which was faster, single copy or the slots, moves with the
    machine and the arrays' pages: bench/README.md); else
    DEFAULT_SINGLE_COPY_MIN. Returns UNLIMITED for off."""
    return _single_copy_limit("RINGCOMM_SHM_SINGLE_COPY", "single_copy_min", DEFAULT_SINGLE_COPY_MIN, nranks)


def _single_copy_limit(var: str, key: str, default: int, nranks: int | None) -> int:
    """The variable `var` (bytes, or "off": UNLIMITED), else tune's `key` on
    `nranks` ranks, else `default`."""
    v = os.environ.get(var, "").strip().lower()
    if v in ("off", "no", "false", "never"):
        return UNLIMITED
    default = (tuned(nranks) or {}).get(key, default)
    b = _int_env(var, default) if v else default
    if b < 0:
        raise InvalidArgument(f"{var} must be a number of bytes or 'off', got {v!r}")
    return b


# all_to_all's blocks that lie in 4 KiB pages move by single copy only from
# this many bytes (and from single_copy_min's): the kernel pins each page it
# copies out of the sender's array, which can make the slots' two copies the
# faster way (an AMD EPYC VM, bench/a2a_pages.py, bench/README.md "The
# sender's pages": N = 2, 1 MiB, single copy / slots / MPI 99.8 / 76.7 /
# 93.6 us). That held only while the two cores hand freshly written cache
# lines to each other quickly, which on that machine changes from one launch
# to the next: a 256 KiB write-then-read between two processes took 22-35 us
# in some launches and 86-99 us in most (bench/handoff.py, bench/README.md
# "The slots' handoff"), and the slots' every round is such a handoff, where
# single copy reads the sender's array once. Side by side in one launch, five
# launches (N = 2, us, slots / single copy / MPI_Alltoall): 1 MiB 114-263 / 106-125 /
# 106-121, 256 KiB 52-84 / 37-50 / 35-49; N = 4 on 2 cores, 1 MiB 539-621 /
# 318-366 / 332-356; all_gather N = 2, 1 MiB 234-252 / 101-111 / 109-115,
# N = 4 at 4-16 MiB within 0.87-1.19 of each other. So by default the same
# limit as any block; ringcomm tune may still set a higher one. numpy asks
# for huge pages for arrays from 4 MiB, torch's CPU allocator never. The
# sender asks the kernel where its block lies (ShmWindow::small_pages).
# all_gather uses the same limit for the array its single copy would pin
# (each rank's input), which the ranks agree on in one sync. tune chooses
# it from all_to_all's timings alone.
DEFAULT_SINGLE_COPY_MIN_4K = DEFAULT_SINGLE_COPY_MIN


def single_copy_min_4k(nranks: int | None = None) -> int:
    """``RINGCOMM_SHM_SINGLE_COPY_4K``: the smallest block (bytes) of
    all_to_all or all_gather moved by single copy when it lies in 4 KiB
    pages (the side single copy pins), or "off"
    (never: the slots); else what ``ringcomm tune`` chose on `nranks` ranks;
    else single_copy_min(nranks) itself (DEFAULT_SINGLE_COPY_MIN_4K where
    that is the built-in one). Never below single_copy_min(nranks).
    Returns UNLIMITED for off."""
    any_pages = single_copy_min(nranks)
    b = _single_copy_limit("RINGCOMM_SHM_SINGLE_COPY_4K", "single_copy_min_4k", any_pages, nranks)
    return max(b, any_pages)


# The largest buffer auto runs in the window, per collective, while the
# ranks fit the cores: above it Open MPI's single-copy point-to-point (the
# kernel copies straight from the peer's buffer) outran the staged copies
# here, N = 2 (bench/README.md, "Shared memory on one host"): all_reduce
# shm 18.9 vs ring 21.5 us at 128 KiB, 68.6 vs 52.6 at 512 KiB;
# reduce_scatter 2.0 vs 3.2 at 4 KiB, 7.1 vs 5.6 at 64 KiB; all_gather 1.9
# vs 3.1 at 4 KiB, 7.3 vs 5.5 at 64 KiB. With more ranks than cores the
# window won at every size measured (N = 4 on 2 cores), so no limit then.
# The rooted and personalized ones (bench/shm_rooted.py, N = 2, shm vs the
# message algorithms): reduce 4.3 vs 5.7 us at 4 KiB, 6.0 vs 4.8 at 16 KiB;
# gather 3.2 vs 4.9 at 16 KiB, 7.0 vs 6.9 at 64 KiB; scatter 3.0 vs 3.4 at
# 16 KiB, 7.5 vs 4.5 at 64 KiB; all_to_all 3.3 vs 4.9 at 16 KiB, 11.0 vs 7.2
# at 64 KiB (at N = 4 on 2 cores the window won or tied up to 1 MiB).
# RINGCOMM_SHM_MAX sets one limit for all; RINGCOMM_TRANSPORT=shm none.
SHM_MAX = {"all_reduce": 128 << 10, "reduce_scatter": 32 << 10, "all_gather": 32 << 10, "broadcast": UNLIMITED,
           "reduce": 4 << 10, "gather": 16 << 10, "scatter": 16 << 10, "all_to_all": 16 << 10}

# ... and from these sizes up the window again (the rest: never), while the
# ranks fit the cores: above about 1 MiB the message path's costs per
# message and per page (Open MPI pins the pages it copies) grow faster than
# the window's copies, and the leaves copy in at once. bench/shm_rooted.py,
# N = 2, 7 interleaved reps, a barrier before every call, us (window /
# message algorithm / MPI): reduce 1 MiB 161 / 155 (ring) / 162, 4 MiB
# 658 / 800 / 669, 16 MiB 2796 / 4192 / 2941; gather 256 KiB 19.0 / 13.1 /
# 11.4 (why not sooner), 1 MiB 66.0 / 83.0 / 79.1, 4 MiB 354 / 410 / 359,
# 16 MiB 2291 / 2420 / 2172. Scatter and all_to_all lost at every size.
# Measured at N = 2 only (this machine's 2 cores); applied to any number of
# ranks that fit the cores, as SHM_MAX is. reduce from 1 MiB since another
# 2-core machine (an AMD EPYC VM, bench/README.md, "Where the window wins
# moves with the machine") measured the window ahead there from 256 KiB:
# 1 MiB 92-136 / 137-175 (ring) / 130-165 (MPI), 512 KiB 54-68 / 89-93 /
# 82-88; at 1 MiB the first machine's window was level with the ring (161
# / 155 above). `ringcomm tune` measures these crossovers where it runs.
SHM_FROM = {"reduce": 1 << 20, "gather": 1 << 20}

# With more ranks than cores the window wins at every size, except where
# one rank sends everything (scatter's root) or every rank sends n-1 blocks
# (all_to_all): there the single copy of Open MPI's point-to-point takes
# over above these sizes. bench/shm_rooted.py, N = 4 on 2 cores, median of
# 5 interleaved reps, us (window / message algorithm / MPI): scatter
# 256 KiB 29.7 / 38.0 / 25.6, 1 MiB 96.2 / 55.3 / 46.9, 4 MiB 413 / 261 /
# 371, 16 MiB 1535 / 795 / 1341; all_to_all 1 MiB 294 / 290 / 235, 4 MiB
# 1644 / 1406 / 1226, 16 MiB 6886 / 5634 / 5240. Since all_to_all's equal
# blocks go whole (one message each), /tmp/proto/a2a_shm.py, median of 9
# interleaved reps of 10, each after a barrier: 64 KiB 25 / 38 / 31, 256 KiB
# 65 / 62 / 47, 512 KiB 169 / 136 / 108, 1 MiB 326 / 298 / 272, 2 MiB
# 606 / 535 / 544.
# Remeasured (bench/shm_rooted.py 16K 1M 9, N = 4 on 2 cores, three runs,
# window / linear or pairwise, us): gather loses from 64 KiB (64 KiB
# 14.9-16.3 / 12.6-14.4, 256 KiB 22.7-24.9 / 18.5-19.0, 1 MiB 85-90 /
# 81-84) and wins again from 4 MiB (347 / 366, 16 MiB 1290 / 1399);
# all_to_all loses at 256 KiB (50.8-52.9 / 45.1-47.1) and wins at 64 KiB
# (18.4-18.7 / 26.4-29.4); scatter ties at 256 KiB (18.1-19.8 /
# 17.6-20.9).
SHM_MAX_OVERSUBSCRIBED = {"gather": 16 << 10, "scatter": 256 << 10, "all_to_all": 64 << 10}
SHM_FROM_OVERSUBSCRIBED = {"gather": 4 << 20}

# With single copy (blocks from 64 KiB read straight from the peers' arrays,
# DEFAULT_SINGLE_COPY_MIN) the window wins again from these sizes.
# bench/shm_rooted.py (and bench/README.md, "Single copy in the window"), median of 5-7 interleaved
# reps, us (window with single copy / message algorithm / MPI): N = 2:
# all_gather 256 KiB 10.1 / 11.4 (ring) / 10.5, 1 MiB 48.3 / 50.8 / 48.4,
# 4 MiB 311 / 323 / 322; scatter 256 KiB 6.7-7.3 / 7.6-8.2 / 9.2-9.9, 1 MiB
# 21.0 / 22.5 / 31-32; all_to_all 256 KiB 10.2-10.4 / 11.4-11.8 / 10.3-10.6,
# 1 MiB 47-53 / 50-57 / 46-54, 4 MiB 348-363 / 354-370 / 342-367. N = 4 on
# 2 cores: all_to_all 256 KiB 37.8 / 48.5 / 34.9, 1 MiB 215 / 258 / 194,
# 4 MiB 751 / 788 / 759 (scatter there loses at 1 MiB, 57.7 / 36.6, and
# all_gather already runs in the window at every size). gather, its leaves
# writing into the root's output: N = 2 256 KiB 7.2 / 11.1 / 10.3, 1 MiB
# 21.3 / 54.0 / 49.2, 4 MiB 168 / 376 / 360; N = 4 256 KiB 21.2 / 20.4 /
# 16.9, 1 MiB 66.4 / 89.7 / 84.5, 4 MiB 231 / 421 / 428.
# Since a rank that needs only the root's data waits for the root alone
# (ShmWindow::await_any), N = 4 on 2 cores, three runs: gather 256 KiB
# 22.7-27.5 / 31.6-39.0 / 20.3-25.9, 1 MiB 54.5-69.4 / 135-141 / 130-145;
# scatter 256 KiB 22.8-31.7 / 28.4-41.6 / 20.6-30.1, 1 MiB 52.5-54.0 /
# 63.0-71.6 / 50.6-53.3.
SHM_FROM_SINGLE_COPY = {"all_gather": 256 << 10, "gather": 256 << 10, "scatter": 256 << 10, "all_to_all": 256 << 10}
SHM_FROM_SINGLE_COPY_OVERSUBSCRIBED = {"gather": 256 << 10, "scatter": 256 << 10, "all_to_all": 256 << 10}


# (the order Engine.set_shm_auto takes them in)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather", "scatter", "all_to_all")


# The collectives whose large blocks single copy moves: what tune measured
# for them holds only with single copy as it was then (on or off).
_SINGLE_COPY_COLLECTIVES = ("all_gather", "gather", "scatter", "all_to_all", "reduce")


def tuned(nranks: int | None, single_copy: bool = True) -> dict | None:
    """What ``ringcomm tune`` measured for `nranks` ranks of one host:
    {"max": {collective: the largest size (bytes) up to which the window
    beat point-to-point}, "from": {collective: the size from which it beat it
    again}, "flat_max": up to which the one-sync all_reduce beat the direct
    one, and "single_copy_min" and "single_copy_min_4k" where tune chose
    single copy's limits}, or
    None (not measured). Collectives tune did not measure (an
    older tune: the rooted ones) are absent; so are those single copy moves
    when it was on then and is not now (`single_copy`), or the reverse."""
    from .tuning import selection
    if not nranks:
        return None
    try:
        with open(selection.tune_path()) as f:
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


def auto_limits(nranks: int, readable: bool = True) -> dict:
    """Everything algorithm="auto" decides the window by on `nranks` ranks
    of one host, as attach() gives it to the engine and the window:
    {"flat_max", "max" and "from" (lists in the order of COLLECTIVES),
    "single_copy_min", "single_copy_min_4k"}. `readable`: every rank can
    read its peers' memory (else single copy is off, and the limits are
    those measured without it)."""
    single = single_copy_min(nranks) if readable else UNLIMITED
    on = single < UNLIMITED
    return {"flat_max": flat_max(nranks), "max": shm_max(nranks, on), "from": shm_from(nranks, on),
            "single_copy_min": single, "single_copy_min_4k": single_copy_min_4k(nranks) if on else UNLIMITED}


def _oversubscribed(nranks: int | None) -> bool:
    """More ranks than this host's cores (the limits measured for that case apply)."""
    return bool(nranks) and nranks > (os.cpu_count() or 1)


def shm_max(nranks: int, single_copy: bool = True) -> list:
    """Per collective (in the order of COLLECTIVES) the largest buffer auto
    runs in the window: ``RINGCOMM_SHM_MAX``, else none with
    ``RINGCOMM_TRANSPORT=shm``, else what ``ringcomm tune`` measured on this
    many ranks (with single copy on or off as `single_copy` says: tuned),
    else the built-in limits above (when the ranks outnumber the cores:
    none, but SHM_MAX_OVERSUBSCRIBED's)."""
    n = len(COLLECTIVES)
    v = os.environ.get("RINGCOMM_SHM_MAX")
    if v:
        return [_int_env("RINGCOMM_SHM_MAX", UNLIMITED)] * n
    if mode() == "shm":
        return [UNLIMITED] * n
    t = (tuned(nranks, single_copy) or {}).get("max", {})
    if _oversubscribed(nranks):  # what tune did not measure: no limit, but for two
        return [t.get(c, SHM_MAX_OVERSUBSCRIBED.get(c, UNLIMITED)) for c in COLLECTIVES]
    return [t.get(c, SHM_MAX[c]) for c in COLLECTIVES]


def shm_from(nranks: int | None = None, single_copy: bool = False) -> list:
    """Per collective (in the order of COLLECTIVES) the size from which auto
    runs in the window again, above shm_max's limit (UNLIMITED: never):
    SHM_FROM (SHM_FROM_OVERSUBSCRIBED when `nranks` outnumber the cores;
    with `single_copy`, also SHM_FROM_SINGLE_COPY or its oversubscribed
    table, whichever is smaller), unless ``RINGCOMM_SHM_MAX`` (one limit,
    nothing above it) or ``RINGCOMM_TRANSPORT=shm`` (no limit) says
    otherwise; where ``ringcomm tune`` measured a collective on this many
    ranks, what it measured."""
    if os.environ.get("RINGCOMM_SHM_MAX") or mode() == "shm":
        return [UNLIMITED] * len(COLLECTIVES)
    over = _oversubscribed(nranks)
    table = SHM_FROM_OVERSUBSCRIBED if over else SHM_FROM
    extra = (SHM_FROM_SINGLE_COPY_OVERSUBSCRIBED if over else SHM_FROM_SINGLE_COPY) if single_copy else {}
    t = (tuned(nranks, single_copy) or {}).get("from", {})
    return [t.get(c, min(table.get(c, UNLIMITED), extra.get(c, UNLIMITED))) for c in COLLECTIVES]


def flat_max(nranks: int | None = None) -> int:
    """all_reduce up to this many bytes runs shm_flat: ``RINGCOMM_SHM_FLAT_MAX``,
    else what ``ringcomm tune`` measured on `nranks` ranks, else the default;
    never above a slot."""
    t = None if "RINGCOMM_SHM_FLAT_MAX" in os.environ else tuned(nranks)
    default = t["flat_max"] if t is not None else DEFAULT_FLAT_MAX
    return max(0, min(_int_env("RINGCOMM_SHM_FLAT_MAX", default), slot_bytes()))


def _segment_name() -> str:
    """A name for a segment a peer could not open through /proc: the user,
    the job and a random nonce; ".flock" marks the names a creator's lock
    guards (the ones shm_sweep may remove)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    job = (os.environ.get("OMPI_MCA_orte_ess_jobid") or os.environ.get("PMIX_NAMESPACE")
           or os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or str(os.getpid()))
    safe = "".join(c if c.isalnum() else "_" for c in f"{user}-{job}")[:120]
    return f"/ringcomm-{safe}-{secrets.token_hex(6)}"


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM (torchrun's agent stopping the workers once one failed) ends
    a process at once, running no ``finally``: where the hand-shake had to
    name its segment (a peer in another pid namespace), the name would stay
    until a later hand-shake on the host swept it. Here it raises instead,
    so the name is removed, then the process ends by the signal as it would
    have. Only on the main thread, and only where SIGTERM has its default
    action (a handler of the caller's stays)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    class Terminated(BaseException):
        pass

    def handler(signum, frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ends the process here
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _share_segment(comm, nbytes: int, suffix: str, map_it) -> tuple:
    if type(comm).__module__.startswith("mpi4py"):
        # MPI's waits block in C, where a Python handler never runs: there
        # SIGTERM keeps its default action (mpirun's way of ending a job).
        return _share_segment_now(comm, nbytes, suffix, map_it)
    with _sigterm_unwinds():  # the store's waits poll in Python
        return _share_segment_now(comm, nbytes, suffix, map_it)


def _open_and_map(path: str, where: tuple, nbytes: int, rank: int, map_it):
    """A peer's side: open the creator's file at `path`, map it, close it."""
    f = core.ShmFile.open(path, where[2], where[3], nbytes, rank)
    try:
        return map_it(f, False)
    finally:
        f.close()


def _share_segment_now(comm, nbytes: int, suffix: str, map_it) -> tuple:
    """The hand-shake of every shared segment (``nbytes`` bytes): rank 0
    creates its file, unnamed (``map_it(file, True)``), and tells the others
    its pid, descriptor, device and inode; they open it through
    ``/proc/<pid>/fd/<fd>`` and map it (``map_it(file, False)``); rank 0
    closes it once every rank has. Peers that cannot (another pid
    namespace) get a name instead, which rank 0 removes at the end.
    Collective over `comm`; returns (this rank's result or None, the first
    error of any rank or None)."""
    rank = comm.Get_rank()
    f, where, err, got, name = None, None, None, None, None
    try:
        if rank == 0:
            # Named segments of this user whose creator died (a job killed
            # during its hand-shake) go first: nothing else removes them.
            core.shm_sweep()
            try:
                f = core.ShmFile.create(nbytes, rank)
                got = map_it(f, True)
                where = (os.getpid(), f.fd, f.dev, f.ino)
            except RingcommError as e:
                err = str(e)
        where, err = comm.bcast((where, err), root=0)
        cannot = None  # why this peer could not open the file through /proc
        if err is None and rank != 0:
            try:
                got = _open_and_map(f"/proc/{where[0]}/fd/{where[1]}", where, nbytes, rank, map_it)
            except RingcommError as e:
                cannot = str(e)
        # every rank has mapped it, or knows who has not
        cannots = [f"rank {q}: {c}" for q, c in enumerate(comm.allgather(cannot)) if c]
        if err is not None or not cannots:
            return (None, err) if err is not None else (got, None)
        # The named way. From here a kill leaves the name until a later
        # hand-shake on this host sweeps it: rank 0 locked the file before
        # it named it, and its lock dies with it.
        if rank == 0:
            try:
                name = _segment_name() + suffix + ".flock"
                f.link(name)
            except RingcommError as e:
                name, err = None, f"{cannots[0]} (through /proc), and naming the segment failed: {e}"
        shared = comm.bcast(name, root=0)
        if cannot is not None and shared is not None:
            try:
                got = _open_and_map("/dev/shm" + shared, where, nbytes, rank, map_it)
            except RingcommError as e:
                err = f"rank {rank}: {e} (and through /proc: {cannot})"
        errors = [e for e in comm.allgather(err) if e]
        return (None, errors[0]) if errors else (got, None)
    finally:
        # Every rank has mapped it (the allgathers above), or the hand-shake
        # failed (a peer died or timed out, Ctrl-C): either way the name goes.
        if name is not None:
            core.shm_remove(name)
        if f is not None:
            f.close()  # (and with it the lock)


def _map_window(comm, slot: int):
    """One window over the ranks of `comm` (one host): (window or None, error or None)."""
    n, rank = comm.Get_size(), comm.Get_rank()
    return _share_segment(comm, core.shm_bytes(n, slot), "",
                          lambda f, create: core.shm_window(f, rank, n, slot, create))


def attach(engine, comm, transport: str | None, settings, make_between) -> str | None:
    """Give `engine` what its ranks share: one window when every rank is on
    one host ("shm"); on several hosts with the same number (>= 2) of ranks
    each, this host's window and an engine between the hosts, for the
    hierarchical all_reduce ("hierarchical"). `comm`: the ranks' bootstrap
    group, an MPI communicator or a store group (ringcomm/bootstrap.py);
    `make_between(group)`: an engine over a sub-group (the ranks with the same
    local index), over the same kind of transport as `engine`. Hierarchical
    reduce_scatter and all_gather run too where each local index's ranks grow
    from host to host (blocked or round-robin placement). Where no window
    watches the ranks of this host (transport "ucx", or no window could be
    made), the engine watches their pids: a peer process that exits is
    named within a slice, not at the deadline. Collective over `comm`.
    Returns which, or None."""
    m = mode(transport)
    n = comm.Get_size()
    if m == "mpi" or n == 1:
        return None
    got = comm.allgather((host_key(), sched_group(), _process()))
    how = None if m == "ucx" else _attach_shared(engine, comm, m, got, make_between)
    if how is None:
        # No window watches this host's ranks: the engine does, by pid.
        # (host_key alone may be RINGCOMM_HOST_ID: the boot id too)
        me = comm.Get_rank()
        here = (got[me][0], *got[me][2][:2])
        engine.watch_processes([proc[2] if (key, *proc[:2]) == here and q != me else 0
                                for q, (key, _, proc) in enumerate(got)])
    return how


def _process() -> tuple[str, str, int]:
    """This machine's boot id, this process's pid namespace and its pid:
    its peers on this host watch it (Link::watch_processes) where no window
    does."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return _boot_id(), ns, os.getpid()


def _attach_shared(engine, comm, m, got, make_between) -> str | None:
    n = comm.Get_size()
    keys = [k for k, _, _ in got]
    order = list(dict.fromkeys(keys))
    slot = slot_bytes()
    here = [q for q in range(n) if keys[q] == keys[comm.Get_rank()]]  # this host's ranks
    if len(order) == 1:
        window, err = _map_window(comm, slot)
        if err:
            if m == "shm":
                raise RingcommError("RINGCOMM_TRANSPORT=shm, but the shared-memory window failed: " + err)
            warnings.warn("ringcomm: no shared memory between the ranks of this host, using point-to-point "
                          "messages: " + err, RuntimeWarning, stacklevel=4)
            return None
        _say_if_split_scheduling([got[q][1] for q in here], here[0] == comm.Get_rank())
        # Rank 0's limits for everyone: every rank must choose alike. Single
        # copy where every rank can read every peer's memory (the kernel may
        # refuse: ptrace restrictions, seccomp).
        readable = all(comm.allgather(window.probe_single_copy()))
        lim = from_rank0(comm.bcast, comm.Get_rank() == 0, lambda: auto_limits(n, readable),
                         "choose the shared-memory window's limits")
        window.single_copy_min = lim["single_copy_min"]
        window.single_copy_min_4k = lim["single_copy_min_4k"]
        engine.attach_window(window, True, lim["flat_max"])
        engine.set_shm_auto(True, lim["flat_max"], lim["max"], lim["from"])
        return "shm"
    per_host = [keys.count(k) for k in order]
    if len(set(per_host)) != 1 or per_host[0] < 2:
        if m == "shm":
            raise InvalidArgument(f"RINGCOMM_TRANSPORT=shm, but the {n} ranks are on {len(order)} hosts with "
                                  f"{per_host} ranks: shared memory across hosts needs the same number (at least "
                                  "2) on every host (use auto or mpi)")
        return None
    how = _attach_hierarchy(engine, comm, keys, order, slot, m, make_between)
    if how:
        _say_if_split_scheduling([got[q][1] for q in here], here[0] == comm.Get_rank())
    return how


def attach_mpi(engine, comm, transport: str | None = None, settings=None) -> str | None:
    """:func:`attach` over the MPI communicator `comm` (the engine between
    hosts over MPI point-to-point)."""
    def between(cross):
        from mpi4py import MPI
        return core.mpi_engine(MPI._handleof(cross), settings.timeout, settings.segment_bytes, settings.window)
    return attach(engine, comm, transport, settings, between)


def _attach_hierarchy(engine, comm, keys, order, slot, m, make_between) -> str | None:
    from .tuning import selection
    rank = comm.Get_rank()
    host = order.index(keys[rank])
    local = comm.Split(host, rank)
    cross = comm.Split(local.Get_rank(), host)
    try:
        window, err = _map_window(local, slot)
        errors = [e for e in comm.allgather(err) if e]  # every host decides alike
        if errors:
            if m == "shm":
                raise RingcommError("RINGCOMM_TRANSPORT=shm, but a host's shared-memory window failed: "
                                    + errors[0])
            warnings.warn("ringcomm: no shared memory within a host, using point-to-point messages: " + errors[0],
                          RuntimeWarning, stacklevel=5)
            return None
        members, cross_members = local.allgather(rank), cross.allgather(rank)
        between = make_between(cross)
        costs = from_rank0(comm.bcast, rank == 0, lambda: selection.costs_for("mpi", cross.Get_size()),
                           "read the cost model")
        rd, hd = selection.auto_limits(costs, cross.Get_size())
        between.set_auto_limits(rd, hd, selection.reduce_limit(costs, cross.Get_size()))
        # every host's ranks in rank order, hosts in the order between hosts
        layout = [q for key in order for q in range(len(keys)) if keys[q] == key]
        engine.attach_hierarchy(window, members, between, cross_members, layout)
        return "hierarchical"
    finally:
        local.Free()
        cross.Free()


def make_arena(window, comm) -> None:
    """The window's shared arena, over the window's hand-shake (`comm`: an
    MPI communicator or a store group). Collective."""
    per_rank = arena_bytes()
    _, err = _share_segment(comm, per_rank * comm.Get_size(), "-arena",
                            lambda f, create: core.shm_arena_map(window, f, per_rank))
    if err:
        raise RingcommError("cannot make the shared arena for comm.empty(): " + err)


def empty(comm, shape, dtype="float32", family: str = "numpy"):
    """An uninitialized array in this rank's part of the shared arena
    (``Communicator.empty``)."""
    import numpy as np
    from . import vocab
    window = comm._engine.window
    if window is None:
        raise InvalidArgument("comm.empty() needs ranks that share memory (a shared-memory window): this "
                              "communicator has none (RINGCOMM_TRANSPORT=mpi, ranks on several hosts, or a device)")
    if not window.has_arena:
        maker = getattr(comm, "_arena_maker", None)
        if maker is None:
            raise InvalidArgument("this communicator cannot make a shared arena")
        maker()
    name = vocab.name_of(dtype)
    if name not in vocab.NUMPY:
        raise InvalidArgument(f"comm.empty: unsupported dtype {dtype!r}; expected one of {', '.join(vocab.NUMPY)}")
    npd = vocab.NUMPY[name]
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"comm.empty: negative dimension in shape {shape}")
    count = math.prod(shape)  # (Python ints: no wrap-around for huge shapes)
    if count * npd.itemsize > window.arena_bytes:
        raise InvalidArgument(f"comm.empty: {count * npd.itemsize} bytes do not fit the shared arena "
                              f"({window.arena_bytes} bytes per rank; RINGCOMM_SHM_ARENA sets it)")
    block = window.arena_alloc(count * npd.itemsize)
    if family == "numpy":
        return np.frombuffer(block, dtype=npd, count=count).reshape(shape)
    if family == "torch":
        import torch
        t = torch.frombuffer(block, dtype=vocab.torch_dtype(name), count=count) if count else \
            torch.empty(0, dtype=vocab.torch_dtype(name))
        return t.reshape(shape)
    raise InvalidArgument(f"comm.empty: family must be 'numpy' or 'torch', got {family!r}")


def attach_local(engines: list) -> None:
    """In-process ranks: one window over plain memory; ``auto`` uses it only
    with ``RINGCOMM_TRANSPORT=shm``."""
    windows = core.shm_local_windows(len(engines), slot_bytes())
    core.shm_local_arena(windows, arena_bytes())  # reserved lazily: untouched parts cost nothing
    use = mode() == "shm"
    single = single_copy_min()
    for e, w in zip(engines, windows):
        w.single_copy_min = single  # (one address space: a memcpy, whatever the pages)
        w.single_copy_min_4k = single
        e.attach_window(w, use, flat_max())

"""Shared memory between the ranks of one host: finding them (``host``), the
files behind it and their hand-shake (``segment``), the window and the
hierarchy an engine attaches (``window``), and the arena of ``comm.empty``
(``arena``). The window's code is native: csrc/core/shm_window.h, the
algorithms in csrc/algorithms/shm_*.cpp.

Whether ``algorithm="auto"`` uses the window is ``RINGCOMM_TRANSPORT``'s
(ringcomm/transports.py). In-process worlds (``run_local``) always have a
window (plain memory), so ``algorithm="shm"`` runs there; ``auto`` uses it
only with ``RINGCOMM_TRANSPORT=shm``: the in-process world teaches the ring.

The limits auto decides the window by are ringcomm/policy.py's; they
are named here too, as they were when this was one module.
"""

from __future__ import annotations

from .._native import core  # noqa: F401  (tests reach the native calls through here)
from ..transports import MODES, mode  # noqa: F401
from ..policy import (COLLECTIVES, POLICY, UNLIMITED, arena_bytes, auto_limits, flat_max,  # noqa: F401
                      shm_from, shm_max, single_copy_min, single_copy_min_4k, slot_bytes, tuned)
from . import host, segment  # noqa: F401
from .arena import empty, make_arena  # noqa: F401
from .host import host_key, sched_group, split_scheduling  # noqa: F401
from .window import attach, attach_local, attach_mpi  # noqa: F401

__all__ = ["host_key", "mode", "slot_bytes", "flat_max", "arena_bytes", "attach_mpi", "attach_local", "empty"]

# The defaults under the names they had here (one value: the policy table's).
DEFAULT_SLOT = POLICY["slot"].default
DEFAULT_ARENA = POLICY["arena"].default
DEFAULT_FLAT_MAX = POLICY["flat_max"].default
DEFAULT_SINGLE_COPY_MIN = POLICY["single_copy_min"].default
DEFAULT_SINGLE_COPY_MIN_4K = DEFAULT_SINGLE_COPY_MIN  # (single_copy_min_4k's default: single_copy_min's)
SHM_MAX = POLICY["max"].default
SHM_MAX_OVERSUBSCRIBED = POLICY["max_oversubscribed"].default
SHM_FROM = POLICY["from"].default
SHM_FROM_OVERSUBSCRIBED = POLICY["from_oversubscribed"].default
SHM_FROM_SINGLE_COPY = POLICY["from_single_copy"].default
SHM_FROM_SINGLE_COPY_OVERSUBSCRIBED = POLICY["from_single_copy_oversubscribed"].default

# The hand-shake's pieces tests reach by their old names.
_map_window = segment.map_window
_segment_name = segment.segment_name

"""Failures and memory: the caller's arrays of a failed collective outlive it
while a request may still use them.

A failed collective may leave point-to-point requests in flight that the
transport cannot withdraw (an MPI send is read whenever its receiver finally
asks, however late). The native quarantine (csrc/core/quarantine.h) keeps those
requests and the engine's own buffers; the caller's arrays of that collective
are kept here, referenced, until the native Hold says no request uses them
any more, so neither a late send reads freed memory nor a late receive writes
it.
"""

from __future__ import annotations

import sys
import threading

from ._native import core

__all__ = ["quarantined", "held_arrays", "hold_arrays", "keep", "drain_at_exit"]

_held: list = []  # [(native Holds, arrays)]
_held_lock = threading.Lock()


def _pending(holds) -> bool:
    return any(h.pending for h in holds)


def keep(hold, arrays) -> None:
    """Keep `arrays` referenced while `hold` (a native Hold, or a tuple of
    them: one call's requests on several ops) has requests pending."""
    holds = tuple(h for h in (hold if isinstance(hold, tuple) else (hold,)) if h is not None)
    if _pending(holds):
        with _held_lock:
            _held.append((holds, arrays))


def hold_arrays(exc: BaseException, arrays) -> None:
    """`exc` is a failed collective's error: if the engine attached a Hold
    (requests still in flight), keep `arrays` until they complete."""
    hold = getattr(exc, "_hold", None)
    if hold is not None:
        del exc._hold
        keep(hold, arrays)  # (a tuple: sendrecv's, one per op in flight)


def _reap() -> int:
    with _held_lock:
        _held[:] = [(h, a) for h, a in _held if _pending(h)]
        return len(_held)


def _natives() -> list:
    mods = [core]
    cuda = sys.modules.get("ringcomm.cuda")
    if cuda is not None and getattr(cuda, "_cuda", None) is not None:
        mods.append(cuda._cuda)
    return mods


def quarantined() -> int:
    """Point-to-point requests of failed collectives still in flight in this
    process (those that completed are released first). Their memory, the
    caller's arrays included, stays alive until they complete; 0 in a healthy
    process."""
    n = sum(m.quarantined() for m in _natives())
    _reap()
    return n


def held_arrays() -> int:
    """How many failed collectives' array sets are kept alive here now."""
    with _held_lock:
        return len(_held)


def drain_at_exit(seconds: float = 0.2) -> None:
    """At exit (before MPI is finalized): give quarantined requests `seconds`
    to complete; the arrays of those still in flight are kept until the
    process ends (MPI_Finalize may still progress them: a straggler's receive
    arriving at last), so module teardown cannot free them. So are arrays
    whose claim no request carries (a device copy that missed its deadline,
    still queued)."""
    sum(m.quarantine_drain(seconds) for m in _natives())
    _reap()
    with _held_lock:  # (what _reap left is still claimed)
        for _, arrays in _held:
            core.leak(arrays)
        _held.clear()

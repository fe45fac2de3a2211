"""Exceptions raised by ringcomm.

Every error from a collective carries ``rank`` (the rank that raised it),
``peer`` (the other rank involved, or None) and ``seq`` (the collective's
sequence number on its communicator, counting from 1), so a message from any
rank of a large job says where to look. ``origin`` and ``cause`` say where the
failure began: the rank that detected it and what it was ("timeout",
"mismatch", "aborted", "transport", "invalid"); a rank that only heard of it
through the ring raises CommunicatorAborted with the origin's rank and cause.
"""

from __future__ import annotations

__all__ = [
    "RingcommError", "InvalidArgument", "CollectiveTimeout", "MismatchError",
    "CommunicatorAborted", "TransportError", "WaitTimeout",
    "BucketerError", "UnusedParametersError", "RegistrationMismatchError", "DivergenceError", "StaleViewError",
]


class RingcommError(RuntimeError):
    """Base class of every ringcomm error."""

    def __init__(self, message: str, *, rank: int | None = None, peer: int | None = None,
                 seq: int | None = None, origin: int | None = None, cause: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.seq = seq
        self.origin = origin
        self.cause = cause

    def __str__(self) -> str:
        msg = super().__str__()
        return f"[rank {self.rank}] {msg}" if self.rank is not None else msg


class InvalidArgument(RingcommError, ValueError):
    """A call was rejected before any byte moved (dtype, shape, layout, op, root...)."""


class CollectiveTimeout(RingcommError, TimeoutError):
    """A blocking wait inside a collective passed its deadline. ``peer`` is the rank
    waited for. The communicator is aborted afterwards."""


class MismatchError(RingcommError):
    """Ranks issued different collectives (kind, count, dtype, op, root or order).
    Raised on every rank; the communicator is aborted afterwards."""


class CommunicatorAborted(RingcommError):
    """The communicator failed earlier (timeout, mismatch, transport error, or a
    failure reported by another rank) and refuses further collectives."""


class TransportError(RingcommError):
    """The transport (MPI, in-process) reported a failure."""


class WaitTimeout(RingcommError, TimeoutError):
    """``Work.wait(timeout)`` returned before the collective completed. The
    collective is still running; wait again or let its own deadline expire."""


# ---- training (ringcomm.train): the gradient bucketer and the consistency checks
class BucketerError(RingcommError):
    """Base class of the errors raised by the gradient bucketer."""


class StaleViewError(RingcommError, ValueError):
    """An array ringcomm handed out (a gradient view, a ZeRO gradient or
    gathered parameter) was used after ringcomm moved on from the memory it
    views: fetch the live one again (the message says from where)."""


class UnusedParametersError(BucketerError):
    """Some parameters never became ready in a synchronised iteration (raised on every rank).

    ``unused`` maps each such parameter index to the list of ranks where it was unused.
    """

    def __init__(self, message: str, unused: dict[int, list[int]], **kw):
        super().__init__(message, **kw)
        self.unused = unused


class RegistrationMismatchError(BucketerError):
    """Ranks registered different parameters (count, shapes, dtypes, order) or bucket settings."""


class DivergenceError(BucketerError):
    """check_consistency found ranks whose parameter values differ. ``report`` has the details."""

    def __init__(self, message: str, report: "ConsistencyReport", **kw):  # noqa: F821 - train.consistency's
        super().__init__(message, **kw)
        self.report = report


# Order matches ErrKind in csrc/core/vocabulary.h.
_KINDS = [InvalidArgument, CollectiveTimeout, MismatchError, CommunicatorAborted, TransportError]


_CAUSES = ["invalid", "timeout", "mismatch", "aborted", "transport"]


def _from_native(kind: int, message: str, rank: int, peer: int, seq: int, origin: int = -1,
                 cause: int = -1) -> RingcommError:
    """Called by the native layer to build the exception for a native error."""
    cls = _KINDS[kind] if 0 <= kind < len(_KINDS) else RingcommError
    return cls(message, rank=None if rank < 0 else rank, peer=None if peer < 0 else peer,
               seq=None if seq == 0 else seq, origin=None if origin < 0 else origin,
               cause=_CAUSES[cause] if 0 <= cause < len(_CAUSES) else None)


def from_rank0(bcast, is_rank0: bool, compute, what: str):
    """``compute()`` on rank 0, its result handed to every rank by
    ``bcast(obj, root=0)`` (mpi4py's, or a store group's). An error of
    compute (a bad environment variable, an unreadable tune file) is raised
    on every rank alike, not on rank 0 alone, whose peers would otherwise
    wait in the broadcast forever (found: a bad RINGCOMM_SHM_SINGLE_COPY
    hung ``ringcomm.init()`` under mpirun); a Ctrl-C on rank 0 too (its
    peers raise RingcommError naming the KeyboardInterrupt)."""
    if is_rank0:
        try:
            value = compute()
        except BaseException as exc:
            bcast(("error", type(exc).__name__, str(exc)), root=0)
            raise
        bcast(("ok", value), root=0)
        return value
    got = bcast(None, root=0)
    if got[0] == "ok":
        return got[1]
    cls = globals().get(got[1])
    if not (isinstance(cls, type) and issubclass(cls, RingcommError)):
        cls = RingcommError
    raise cls(f"rank 0 failed to {what}: {got[1]}: {got[2]}")


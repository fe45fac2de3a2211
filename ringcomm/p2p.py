"""Point-to-point: what ``Communicator.send/recv/isend/irecv/batch_isend_irecv``
hand back, and the ``P2POp`` description a batch is made of.

How messages are matched and checked is csrc/engine/p2p.h's opening comment
(and docs/algorithms.md, "Point-to-point").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import WaitTimeout

__all__ = ["P2POp", "P2PWork"]


@dataclass
class P2POp:
    """One operation of :meth:`Communicator.batch_isend_irecv` (torch's
    ``dist.P2POp``): ``op`` is ``"isend"`` or ``"irecv"`` (or the
    communicator's bound methods ``comm.isend`` / ``comm.irecv``), ``x`` the
    array, ``peer`` the other rank (None on an irecv: any source), ``tag`` >= 0."""
    op: Any
    x: Any
    peer: int | None
    tag: int = 0


class P2PWork:
    """Handle of an ``isend`` / ``irecv``.

    ``wait(timeout=None)`` blocks until the operation completes (progressing
    this communicator's pending receives meanwhile) and returns the array;
    it raises the failure (MismatchError, CollectiveTimeout naming the peer,
    CommunicatorAborted), or WaitTimeout if `timeout` s pass first (the
    operation keeps going). ``source`` is the sender's rank once a receive
    has completed (a send: its peer). The array is kept alive until then.
    A Work dropped without a wait still completes (only waits progress a
    point-to-point op, so the communicator progresses such ones now and
    then, when many Works are in flight) and then lets its array go.
    """

    __slots__ = ("_native", "_result", "_keep", "_on_failure")

    def __init__(self, native, result, keep, on_failure):
        self._native = native
        self._result = result
        self._keep = keep
        self._on_failure = on_failure

    @property
    def source(self) -> int:
        return self._native.source

    def is_completed(self) -> bool:
        """True once complete, successfully or not. Progresses it (never blocks)."""
        if self._native.is_completed():
            return True
        try:
            return self._native.test()
        except BaseException:
            return True

    def wait(self, timeout: float | None = None):
        try:
            done = self._native.wait(-1.0 if timeout is None else float(timeout))
        except BaseException as exc:
            self._on_failure(exc, self._keep)
            raise
        if not done:
            raise WaitTimeout(f"point-to-point operation still running after {timeout} s")
        self._keep = None
        return self._result

    def result(self):
        return self.wait()

    def _done_with_arrays(self, progress: bool = False) -> bool:
        """Nothing touches the arrays any more. `progress`: first progress an
        op nobody waits for (only waits progress a p2p op)."""
        if self._keep is None:  # waited for, successfully: nothing touches the arrays any more
            return True
        if not self._native.is_completed():
            try:
                if not (progress and self._native.poll()):
                    return False
            except Exception:  # (not the caller's business here: its wait raises it)
                return False
        hold = self._native.hold()
        return hold is None or not hold.pending

"""The Communicator's point-to-point operations (send, recv, sendrecv,
isend, irecv, batch_isend_irecv): a part of ``Communicator`` (comm.py),
kept in a file of its own."""

from __future__ import annotations

from . import vocab
from ._arrays import Buf
from .errors import InvalidArgument
from .p2p import P2POp, P2PWork

__all__ = ["PointToPoint"]


class PointToPoint:
    """Communicator's point-to-point methods (they use its engine, door,
    fast lane, _failed and _track)."""

    # ---- point-to-point -----------------------------------------------
    # Beside the collectives' queue, not through it (csrc/engine/p2p.h): each
    # op is posted on the caller's thread at once and progressed by whoever
    # waits. So a batch of isend/irecv never deadlocks, and p2p takes no call
    # sequence number (only two ranks call it). A p2p op is ordered after this
    # rank's synchronous collectives (they have ended), not after async ones
    # still queued: wait for their Works first when they share buffers.
    def send(self, x, dst: int, tag: int = 0) -> None:
        """Send `x` to rank `dst`; returns once `x` may be reused.

        Messages between two ranks with one tag arrive in the order sent (as
        MPI's); they never match a collective's. The receive must have
        exactly x's size and dtype (else MismatchError on the receiver, and
        the communicator is aborted, so this rank hears of it too). Sending
        to oneself is an InvalidArgument (torch forbids it too). On a
        device communicator the payload goes through host memory (copied
        out after the work queued on the caller's current stream, and in
        before ``recv``/``wait`` returns; csrc/engine/p2p.h says why).
        """
        if self._fast_lane:  # numpy arrays and torch CPU tensors: described and run natively
            try:
                if self._engine.p2p_now(True, x, dst, tag) != -2:
                    return
            except BaseException as exc:  # as in _p2p_run
                self._failed(exc, (x,))
                raise
        xb, peer, tag = self._door.p2p(x, dst, tag, True)
        self._p2p_run(True, xb, peer, tag)

    def recv(self, x, src: int | None = None, tag: int = 0) -> int:
        """Receive into `x` (written in place) from rank `src` (None: any
        rank); returns the sender's rank (as torch's ``dist.recv``).

        The message must have exactly x's size and dtype: another size is a
        MismatchError naming both (the message is discarded; no byte of it
        lands, never an overrun), and so is another dtype from that sender
        with this tag. No matching send within the communicator's
        ``timeout``: CollectiveTimeout naming the peer.
        """
        if self._fast_lane:
            try:
                source = self._engine.p2p_now(False, x, src, tag)
            except BaseException as exc:
                self._failed(exc, (x,))
                raise
            if source != -2:
                return source
        xb, peer, tag = self._door.p2p(x, src, tag, False)
        return self._p2p_run(False, xb, peer, tag)

    def sendrecv(self, x, dst: int, out, src: int | None = None, tag: int = 0, recv_tag: int | None = None) -> int:
        """Send `x` to rank `dst` and receive into `out` from rank `src`
        (None: any rank) together, as MPI_Sendrecv; returns the sender's
        rank once both have completed.

        Ranks may call it toward each other (a ring shift, a halo exchange)
        without deadlock, at the cost of one call instead of isend + irecv
        + two waits. The send's tag is `tag`, the receive's `recv_tag`
        (default: `tag`); each side follows :meth:`send` and :meth:`recv`
        (exact sizes, errors on both ranks). Both are checked before either
        is posted; `x` and `out` must not overlap (InvalidArgument).

        With itself (``dst == rank``, then `src` is the rank or None, as a
        ring shift at world size 1): a copy of `x` into `out`, which must
        match it in dtype, size and tag; nothing is booked in the ledger.
        None then means the rank itself, not any source as in MPI (where
        another rank's message could match). On a device it returns once
        the copy is done, after the work queued on both arrays' streams; if
        it misses the timeout, CollectiveTimeout, and both arrays are kept
        referenced for the process's life (the copy is still queued).
        """
        if recv_tag is None:
            recv_tag = tag
        if self._fast_lane:  # numpy arrays and torch CPU tensors: described and run natively
            try:
                source = self._engine.p2p_sendrecv_now(x, dst, out, src, tag, recv_tag)
            except BaseException as exc:
                self._failed(exc, (x, out))
                raise
            if source != -2:
                return source
        xb, dst, tag = self._door.p2p(x, dst, tag, True, to_self=True)
        ob, src, recv_tag = self._door.p2p(out, src, recv_tag, False, to_self=True)
        try:
            return self._engine.p2p_sendrecv(xb.ptr, xb.count, vocab.DTYPES[xb.dtype], dst, tag, ob.ptr, ob.count,
                                             vocab.DTYPES[ob.dtype], src, recv_tag, xb.stream(), ob.stream())
        except BaseException as exc:
            self._failed(exc, (xb, ob))
            raise

    def isend(self, x, dst: int, tag: int = 0) -> P2PWork:
        """Start a send (see :meth:`send`); returns a Work whose ``wait()``
        returns once `x` may be reused."""
        return self._p2p_post(True, x, dst, tag)

    def irecv(self, x, src: int | None = None, tag: int = 0) -> P2PWork:
        """Start a receive into `x` (see :meth:`recv`); ``wait()`` returns
        `x`, and the Work's ``source`` is then the sender's rank."""
        return self._p2p_post(False, x, src, tag)

    def batch_isend_irecv(self, ops) -> list[P2PWork]:
        """Start a list of :class:`ringcomm.P2POp` together (torch's
        ``batch_isend_irecv``): every op is checked before any is posted;
        returns their Works in order. Waits may come in any order without
        deadlock (each wait progresses this rank's pending receives)."""
        plan = []
        for i, op in enumerate(ops):
            if not isinstance(op, P2POp):
                raise InvalidArgument(f"batch_isend_irecv: ops[{i}] is {type(op).__name__}, expected ringcomm.P2POp")
            kind = getattr(op.op, "__name__", op.op)
            if kind not in ("isend", "irecv"):
                raise InvalidArgument(f"batch_isend_irecv: ops[{i}].op is {op.op!r}, expected 'isend' or 'irecv'")
            plan.append((kind == "isend", self._door.p2p(op.x, op.peer, op.tag, kind == "isend")))
        return [self._p2p_start(send, *checked) for send, checked in plan]

    def _p2p_post(self, send: bool, x, peer, tag) -> P2PWork:
        if self._fast_lane:  # numpy arrays and torch CPU tensors: described and posted natively
            native = self._engine.p2p_post_now(send, x, peer, tag)
            if native is not None:
                work = P2PWork(native, x, (x,), self._failed)
                self._track(work)
                return work
        return self._p2p_start(send, *self._door.p2p(x, peer, tag, send))

    def _p2p_start(self, send: bool, xb: Buf, peer: int, tag: int) -> P2PWork:
        native = self._engine.p2p(send, peer, xb.ptr, xb.count, vocab.DTYPES[xb.dtype], tag, xb.stream())
        work = P2PWork(native, xb.obj, (xb,), self._failed)
        self._track(work)
        return work

    def _p2p_run(self, send: bool, xb: Buf, peer: int, tag: int) -> int:
        try:
            return self._engine.p2p_run(send, peer, xb.ptr, xb.count, vocab.DTYPES[xb.dtype], tag, xb.stream())
        except BaseException as exc:
            self._failed(exc, (xb,))
            raise

"""What a Communicator records of its calls: the traffic ledger, step
traces and the flight record; a part of ``Communicator`` (comm.py), kept
in a file of its own."""

from __future__ import annotations

import contextlib

from .errors import InvalidArgument, RingcommError
from .traffic import Traffic

__all__ = ["Records"]


class Records:
    """Communicator's ledger, trace and flight-record methods (they use its
    engine, rank, _trace, _inflight and _final_record)."""

    def traffic(self, part: str = "all") -> Traffic:
        """Snapshot of the traffic ledger (bytes and messages per peer and collective).

        Ranks on several hosts with the hierarchical collectives book their two
        parts apart: part="intra" (read from and by the peers of this host,
        in shared memory), "inter" (sent to and received from the other
        hosts' ranks); "all" (default) is their sum."""
        if part not in ("all", "intra", "inter"):
            raise InvalidArgument(f"traffic part must be 'all', 'intra' or 'inter', got {part!r}")
        intra = self._engine.traffic()
        if not self._engine.hierarchical:
            return Traffic(intra if part != "inter" else intra * 0, self.rank)
        inter = self._engine.traffic_between_hosts()
        return Traffic({"all": intra + inter, "intra": intra, "inter": inter}[part], self.rank)

    def reset_traffic(self) -> None:
        self._engine.reset_traffic()

    @contextlib.contextmanager
    def trace(self, values: bool = False):
        """Record a step trace of the collectives issued inside the block.

        Yields a :class:`ringcomm.trace.Trace`, filled when the block exits
        (after waiting for the traced collectives). ``values=True`` also keeps
        the values each step produced (for small teaching examples). Off by
        default and free when off.
        """
        from .trace import Trace
        if self._trace is not None:
            raise InvalidArgument("a trace is already active on this communicator")
        t = Trace(self, values)
        native = self._engine.make_tracer(values)
        self._trace = (t, native)
        self._engine.set_tracer(native)
        try:
            yield t
        finally:
            self._engine.set_tracer(None)
            for w in list(self._inflight):
                try:
                    w.wait()
                except RingcommError:
                    pass
            t._add(native.take())
            self._trace = None

    def flight_record(self) -> list[dict]:
        """The last collectives of this communicator, oldest first
        (``RINGCOMM_FLIGHT_RECORDER``, default 256), one dict each: ``seq``,
        ``collective``, ``count``, ``dtype``, ``op``, ``root``, ``algorithm``,
        ``state`` (queued, running, done, failed), wall-clock ``t_issue``,
        ``t_start``, ``t_end`` (seconds since the epoch), where it is or
        stopped (``phase``, ``step``, ``segment``, ``waiting_for``: the peer,
        ``waiting_to``: "receive" or "send", ``waiting_what``,
        ``waiting_since``), payload ``bytes_sent`` / ``bytes_received`` so
        far, ``error`` and ``rank``. Point-to-point ops have records too
        (``collective`` "send" or "recv", numbered apart from the collectives)
        with ``peer`` (None: any source) and ``tag``, and ``root`` and
        ``algorithm`` None; ``peer`` and ``tag`` are None for collectives. Safe to call from any thread, also while
        a collective runs; after close(), the record at closing."""
        from .flight import records_with_rank
        if self._engine.closed:
            return list(self._final_record or [])
        return records_with_rank(self._engine.flight_record(), self.rank)

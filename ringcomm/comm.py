"""The communicator API: collectives on arrays, over MPI or in-process ranks."""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import sys
import threading
import weakref
from typing import Any, Callable

import numpy as np

from . import _dtypes, config
from ._arrays import Buf, empty_like, view
from ._native import core
from .errors import CommunicatorAborted, InvalidArgument, RingcommError, WaitTimeout
from .traffic import Traffic

__all__ = ["Communicator", "Work", "init", "run_local"]

log = logging.getLogger("ringcomm")


_ALGORITHMS = {"ring": 0, "naive": 1}


def _split(count: int, n: int, r: int) -> int:
    return count // n + (1 if r < count % n else 0)


class Work:
    """Handle of an asynchronous collective (``async_op=True``).

    Collectives of one communicator complete in the order they were issued.
    The arrays involved are kept alive until the collective completes.
    """

    def __init__(self, native, result, keep):
        self._native = native
        self._result = result
        self._keep = keep

    @property
    def seq(self) -> int:
        """Sequence number of the collective on its communicator (from 1)."""
        return self._native.seq

    def is_completed(self) -> bool:
        """True once the collective finished, successfully or not (never blocks)."""
        return self._native.is_completed()

    def wait(self, timeout: float | None = None):
        """Block until the collective completes and return its result array.

        Raises the collective's error if it failed, or WaitTimeout if `timeout`
        seconds pass first (the collective keeps running).
        """
        if not self._native.wait(-1.0 if timeout is None else float(timeout)):
            raise WaitTimeout(f"collective #{self.seq} still running after {timeout} s", seq=self.seq)
        err = self._native.error()
        self._keep = None
        if err is not None:
            raise err
        return self._result

    def result(self):
        """Alias of wait() without a timeout."""
        return self.wait()


class Communicator:
    """A group of ranks that run ring collectives together.

    Get one from :func:`init` (MPI processes) or :func:`run_local` (threads).
    Every rank must call the same collectives in the same order with the same
    count, dtype, op and root; a disagreement raises MismatchError on every rank.
    """

    def __init__(self, engine, settings: config.Settings, label: str):
        self._engine = engine
        self._settings = settings
        self._label = label
        self._inflight: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._trace = None  # (Trace, native Tracer) while comm.trace() is active

    # ---- identity -----------------------------------------------------
    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def size(self) -> int:
        return self._engine.size

    @property
    def transport(self) -> str:
        """'mpi' or 'inproc'."""
        return self._engine.transport

    @property
    def segment_bytes(self) -> int:
        return self._engine.segment_bytes

    @segment_bytes.setter
    def segment_bytes(self, value: int | str) -> None:
        """Largest message of later collectives (must be equal on all ranks)."""
        self._engine.set_segment_bytes(config.parse_size(value))

    @property
    def timeout(self) -> float:
        return self._engine.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._engine.set_timeout(float(seconds))

    @property
    def aborted(self) -> bool:
        return self._engine.aborted

    def __repr__(self) -> str:
        return f"<ringcomm.Communicator {self._label} rank {self.rank}/{self.size}>"

    # ---- collectives --------------------------------------------------
    def all_reduce(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "ring"):
        """Reduce `x` elementwise over all ranks; every rank gets the result.

        In place when `out` is None (returns `x`), else into `out` (same dtype
        and shape; `x` is not modified). op: sum, prod, min, max, avg (avg:
        floating dtypes only; the sum divided by the number of ranks).
        algorithm: "ring" (reduce-scatter + all-gather), or "naive": the
        master-centric scheme (everything to rank 0 and back), for comparison.
        """
        xb = view(x, "all_reduce input")
        opc = self._op(op, xb)
        if out is None:
            ob = self._writable(xb, "all_reduce input (in place; pass out= for a read-only input)")
        else:
            ob = self._out(out, xb, xb.count, "all_reduce")
            if ob.shape != xb.shape:
                raise InvalidArgument(f"all_reduce out has shape {ob.shape}, expected the input's shape {xb.shape}")
        if algorithm not in _ALGORITHMS:
            raise InvalidArgument(f"unknown algorithm {algorithm!r}; expected one of {', '.join(_ALGORITHMS)}")
        return self._submit("all_reduce", xb, ob, xb.count, opc, 0, ob.obj, async_op, _ALGORITHMS[algorithm])

    def reduce_scatter(self, x, op: str = "sum", *, out=None, async_op: bool = False):
        """Reduce `x` over all ranks and leave chunk `rank` of the result here.

        Chunks follow the split rule (numpy.array_split): chunk r has
        len(x)//n elements, plus one if r < len(x) % n. Returns a new 1-D array
        (same family as `x`) unless `out` is given. `x` is not modified.
        """
        xb = view(x, "reduce_scatter input")
        opc = self._op(op, xb)
        mine = _split(xb.count, self.size, self.rank)
        if out is None:
            out = empty_like(xb, mine)
        ob = self._out(out, xb, mine, "reduce_scatter",
                       why=f"rank {self.rank}'s chunk of {xb.count} elements over {self.size} ranks",
                       in_place_at=self._chunk_offset(xb.count) * _dtypes.itemsize(xb.dtype))
        return self._submit("reduce_scatter", xb, ob, xb.count, opc, 0, ob.obj, async_op)

    def all_gather(self, x, *, out=None, async_op: bool = False):
        """Concatenate every rank's `x` in rank order; every rank gets the result.

        Rank r's input must be chunk r of the total under the split rule. With
        `out` (the total's size) the total is known; without it the ranks first
        exchange their counts (one extra small collective; all ranks must then
        call without `out`).
        """
        xb = view(x, "all_gather input")
        if out is None:
            total = self._gathered_total(xb.count)
            out = empty_like(xb, total)
        ob = view(out, "all_gather out")
        total = ob.count
        mine = _split(total, self.size, self.rank)
        if xb.count != mine:
            raise InvalidArgument(
                f"all_gather input has {xb.count} elements but rank {self.rank}'s chunk of out "
                f"({total} elements over {self.size} ranks, split rule) has {mine}")
        self._out(out, xb, total, "all_gather", why="the gathered total", outbuf=ob,
                  in_place_at=-self._chunk_offset(total) * _dtypes.itemsize(xb.dtype))
        return self._submit("all_gather", xb, ob, total, 0, 0, ob.obj, async_op)

    def broadcast(self, x, root: int = 0, *, async_op: bool = False):
        """Copy `x` from rank `root` to every rank, in place. Returns `x`."""
        xb = view(x, "broadcast buffer")
        root = int(root)
        if not 0 <= root < self.size:
            raise InvalidArgument(f"broadcast root {root} is out of range (expected 0 <= root < {self.size})")
        if self.rank != root:
            self._writable(xb, "broadcast buffer")
        return self._submit("broadcast", xb, xb, xb.count, 0, root, xb.obj, async_op)

    def barrier(self, *, async_op: bool = False):
        """Return once every rank has entered the barrier."""
        return self._submit("barrier", None, None, 0, 0, 0, None, async_op)

    # ---- ledger, lifecycle ------------------------------------------------
    def traffic(self) -> Traffic:
        """Snapshot of the traffic ledger (bytes and messages per peer and collective)."""
        return Traffic(self._engine.traffic(), self.rank)

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
        native = core.Tracer(values)
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

    def abort(self) -> None:
        """Fail this communicator on purpose and tell the ring: ranks waiting on
        it raise CommunicatorAborted instead of waiting for their deadline."""
        if not self._engine.closed and not self._engine.aborted:
            self._engine.abort().wait()

    def close(self) -> None:
        """Finish queued collectives and release the communicator."""
        if not self._engine.closed:
            self._engine.close()
        self._inflight.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ----------------------------------------------------
    def _op(self, op: str, xb: Buf) -> int:
        if op not in _dtypes.OPS:
            raise InvalidArgument(f"unknown op {op!r}; expected one of {', '.join(_dtypes.OPS)}")
        if op == "avg" and xb.dtype not in _dtypes.FLOATING:
            raise InvalidArgument(f"op 'avg' needs a floating dtype, got {xb.dtype} "
                                  "(use 'sum' and divide, or convert to a floating type)")
        return _dtypes.OPS[op]

    @staticmethod
    def _writable(b: Buf, what: str) -> Buf:
        if b.readonly:
            raise InvalidArgument(f"{what} is read-only")
        return b

    def _chunk_offset(self, total: int) -> int:
        base, extra = divmod(total, self.size)
        return self.rank * base + min(self.rank, extra)

    def _out(self, out, xb: Buf, count: int, coll: str, why: str = "the input's count",
             outbuf: Buf | None = None, in_place_at: int | None = None) -> Buf:
        """Check `out`. Overlap with the input is an error except for the exact
        in-place forms: all_reduce with out = x; reduce_scatter with out =
        this rank's chunk of x; all_gather with x = this rank's chunk of out
        (`in_place_at`: out.ptr - x.ptr in bytes for those)."""
        ob = outbuf if outbuf is not None else view(out, f"{coll} out")
        if ob.readonly:
            raise InvalidArgument(f"{coll} out is read-only")
        if ob.dtype != xb.dtype:
            raise InvalidArgument(f"{coll} out has dtype {ob.dtype}, expected the input's dtype {xb.dtype}")
        if ob.count != count:
            raise InvalidArgument(f"{coll} out has {ob.count} elements (shape {ob.shape}), expected {count} ({why})")
        exact = ob.same_memory(xb) if coll == "all_reduce" else ob.ptr - xb.ptr == in_place_at
        if ob.overlaps(xb) and not exact:
            raise InvalidArgument(f"{coll} out overlaps the input; pass separate buffers"
                                  + (" or call in place (out=None)" if coll == "all_reduce" else
                                     " (or use the exact in-place form: this rank's chunk)"))
        return ob

    def _gathered_total(self, mine: int) -> int:
        counts = np.empty(self.size, dtype=np.int64)
        self.all_gather(np.array([mine], dtype=np.int64), out=counts)
        total = int(counts.sum())
        want = [_split(total, self.size, r) for r in range(self.size)]
        if counts.tolist() != want:
            raise InvalidArgument(
                f"all_gather inputs have {counts.tolist()} elements on ranks 0..{self.size - 1}, but the "
                f"split rule for their total {total} needs {want}")
        return total

    def _submit(self, coll: str, xb: Buf | None, ob: Buf | None, count: int, opc: int, root: int,
                result: Any, async_op: bool, algo: int = 0):
        dtype = _dtypes.DTYPES[(xb or ob).dtype] if (xb or ob) else 0
        if self._settings.debug:
            print(f"ringcomm[{self._label} rank {self.rank}] {coll} count={count} "
                  f"dtype={(xb.dtype if xb else '-')} op={opc} root={root}", file=sys.stderr)
        args = (_dtypes.COLLECTIVES[coll], xb.ptr if xb else 0, ob.ptr if ob else 0, count, dtype, opc, root, algo)
        if not async_op:
            self._engine.run(*args)  # the caller's frame keeps the arrays alive
            return result
        work = Work(self._engine.submit(*args), result, (xb, ob))
        with self._lock:  # keep the arrays of queued collectives alive until they complete
            while self._inflight and self._inflight[0].is_completed():
                self._inflight.popleft()
            self._inflight.append(work)
        return work


# ---------------------------------------------------------------------------
_mpi_comms: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


def _close_mpi_comms() -> None:
    # Runs before mpi4py finalizes MPI (atexit is last-in, first-out and we
    # register after importing mpi4py.MPI).
    for c in list(_mpi_comms):
        try:
            c.close()
        except RingcommError:
            pass


def init(mpi_comm=None, *, timeout: float | None = None, segment_bytes: int | str | None = None,
         window: int | None = None) -> Communicator:
    """A communicator over MPI (COMM_WORLD unless `mpi_comm` is given).

    Collective over the MPI communicator: every rank must call it. ringcomm
    duplicates the communicator, so its messages never mix with yours.
    Requires MPI_THREAD_MULTIPLE (mpi4py's default).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    s = config.settings(timeout, segment_bytes, window)
    engine = core.mpi_engine(MPI._handleof(comm), s.timeout, s.segment_bytes, s.window)
    c = Communicator(engine, s, "mpi")
    if not _mpi_comms:
        atexit.register(_close_mpi_comms)
    _mpi_comms.add(c)
    return c


def run_local(n: int, fn: Callable, *args, timeout: float | None = None,
              segment_bytes: int | str | None = None, window: int | None = None, **kwargs) -> list:
    """Run ``fn(comm, *args, **kwargs)`` on `n` in-process ranks (one thread
    each) and return their results in rank order.

    If any rank raises, its communicator is aborted (so the others fail fast
    instead of waiting for their deadline) and the lowest rank's exception is
    re-raised after every thread has finished.
    """
    if int(n) < 1:
        raise InvalidArgument(f"run_local needs at least one rank, got {n}")
    n = int(n)
    s = config.settings(timeout, segment_bytes, window)
    world = core.inproc_world(n)
    comms = [Communicator(core.inproc_engine(world, r, s.timeout, s.segment_bytes, s.window), s, "inproc")
             for r in range(n)]
    results: list = [None] * n
    errors: list = [None] * n

    def body(r: int) -> None:
        try:
            results[r] = fn(comms[r], *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors[r] = exc
            try:
                comms[r].abort()
            except RingcommError:
                pass

    threads = [threading.Thread(target=body, args=(r,), name=f"ringcomm-rank-{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.close()
    for exc in errors:
        if exc is not None and not isinstance(exc, CommunicatorAborted):
            raise exc
    for exc in errors:
        if exc is not None:
            raise exc
    return results

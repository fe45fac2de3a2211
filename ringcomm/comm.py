"""The communicator API: collectives on arrays, over MPI or in-process ranks."""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from . import _dtypes, config
from ._arrays import Buf, empty_like, like, to_numpy, view
from ._native import core
from .errors import CommunicatorAborted, InvalidArgument, RingcommError, WaitTimeout
from .traffic import Traffic

__all__ = ["Communicator", "Work", "init", "run_local", "quarantined"]

log = logging.getLogger("ringcomm")


# ---------------------------------------------------------------------------
# Failures and memory. A failed collective may leave point-to-point requests
# in flight that the transport cannot withdraw (an MPI send is read whenever
# its receiver finally asks, however late). The native quarantine keeps them
# and the engine's own buffers; the caller's arrays of that collective are
# kept here, referenced, until the native Hold says no request uses them any
# more, so neither a late send reads freed memory nor a late receive writes it.
_held: list = []  # [(native Hold, arrays)]
_held_lock = threading.Lock()


def _hold_arrays(exc: BaseException, arrays) -> None:
    hold = getattr(exc, "_hold", None)
    if hold is not None:
        del exc._hold
        if hold.pending:
            with _held_lock:
                _held.append((hold, arrays))


def _reap_held() -> int:
    with _held_lock:
        _held[:] = [(h, a) for h, a in _held if h.pending]
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
    _reap_held()
    return n


def _at_exit() -> None:
    # Runs before mpi4py finalizes MPI (its hook runs after every atexit
    # handler and after module teardown).
    _close_mpi_comms()
    left = sum(m.quarantine_drain(0.2) for m in _natives())
    _reap_held()
    if left:
        # Still in flight: MPI_Finalize may progress them (a straggler's
        # receive arriving at last). Their arrays must outlive module teardown:
        # keep them until the process ends.
        with _held_lock:
            for _, arrays in _held:
                core.leak(arrays)
            _held.clear()


atexit.register(_at_exit)


# csrc/link.h Algo; "auto" is resolved per call by the engine (selection.py).
_ALGORITHMS = {"auto": -1, "ring": 0, "naive": 1, "recursive_doubling": 2, "halving_doubling": 3}


def _algo(name: str) -> int:
    try:
        return _ALGORITHMS[name]
    except (KeyError, TypeError):
        raise InvalidArgument(f"unknown algorithm {name!r}; expected one of {', '.join(_ALGORITHMS)}") from None


def _split(count: int, n: int, r: int) -> int:
    return count // n + (1 if r < count % n else 0)


class Work:
    """Handle of an asynchronous collective (``async_op=True``).

    Collectives of one communicator complete in the order they were issued.
    The arrays involved are kept alive until the collective completes.

    On a GPU communicator (as torch.distributed with NCCL): ``wait()`` makes the
    caller's *current stream* wait for the result and returns without blocking
    the host on the GPU; ``synchronize()`` blocks the host until the result is
    there. Work queued on that stream after ``wait()`` sees the result.
    """

    def __init__(self, native, result, keep, stream_fn=None, engine=None, host_is_stream=False, comm=None):
        self._native = native
        self._result = result
        self._keep = keep
        self._stream_fn = stream_fn  # GPU arrays: () -> the caller's current stream
        self._engine = engine        # Ctrl-C aborts it; device collectives: hear of a peer's failure while waiting
        self._host_is_stream = host_is_stream  # emulated device: "make the caller wait" means block
        self._comm = comm

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
        seconds pass first (the collective keeps running). Ctrl-C (on the
        main thread) aborts the communicator, telling the other ranks, and
        raises KeyboardInterrupt.
        """
        try:
            done = self._native.wait(-1.0 if timeout is None else float(timeout), self._engine)
        except BaseException as exc:  # KeyboardInterrupt: the collective was aborted
            if self._comm is not None:
                self._comm._failed(exc, self._keep)
            raise
        if not done:
            raise WaitTimeout(f"collective #{self.seq} still running after {timeout} s", seq=self.seq)
        err = self._native.error()
        if err is not None:
            hold = self._native.hold()
            if hold is not None and hold.pending:
                err._hold = hold
            if self._comm is not None:
                self._comm._failed(err, self._keep)
            if not self._native.on_device:  # else queued device work may still use the arrays
                self._keep = None
            raise err
        if not self._native.on_device:
            self._keep = None
        elif self._host_is_stream:
            self._device_done(None if timeout is None else float(timeout))
        else:
            # Ordered on the caller's current stream; the arrays must live until
            # the device is done with them, so they stay referenced here.
            self._native.wait_stream(self._stream_fn() if self._stream_fn else 0)
        return self._result

    def synchronize(self, timeout: float | None = None):
        """wait(), then block the host until the result is ready (a no-op
        beyond wait() for host collectives). Returns the result array."""
        start = time.monotonic()
        result = self.wait(timeout)
        if self._native.on_device:
            self._device_done(None if timeout is None else max(0.0, float(timeout) - (time.monotonic() - start)))
        return result

    def _device_done(self, timeout: float | None) -> None:
        """Block until the device has finished this collective. A collective
        ends on the host once enqueued, so a peer that fails afterwards is
        only heard of here: its ABORT notice fails this communicator (which
        ends the device work stuck on that peer) and is raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        step = 0.001
        while not self._native.synchronize(step):
            err = self._engine.check_peers() if self._engine is not None else None
            if err is not None:
                raise err
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"collective #{self.seq} still running on the device after {timeout} s "
                                  "(a peer that never joined? see Communicator.abort)", seq=self.seq)
            step = min(0.05, step * 2)
        self._keep = None

    def result(self):
        """Alias of wait() without a timeout."""
        return self.wait()

    def _done_with_arrays(self) -> bool:
        """Nothing (host or device) will touch this collective's arrays any more."""
        if not self._native.is_completed():
            return False
        hold = self._native.hold()
        if hold is not None and hold.pending:  # failed, with requests still in flight (quarantine)
            return False
        return not self._native.on_device or self._native.synchronize(0.0)


class Communicator:
    """A group of ranks that run ring collectives together.

    Get one from :func:`init` (MPI processes) or :func:`run_local` (threads).
    Every rank must call the same collectives in the same order with the same
    count, dtype, op and root; a disagreement raises MismatchError on every rank.
    """

    def __init__(self, engine, settings: config.Settings, label: str):
        self._engine = engine
        self._device = engine.device  # fixed for the communicator's life
        self._settings = settings
        self._label = label
        self._inflight: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._trace = None  # (Trace, native Tracer) while comm.trace() is active
        self._index = 0  # which communicator of its kind in this process (names its dumps)
        self._dumped = False
        self._final_record: list | None = None  # the flight record at close()
        if settings.flight_records != 256:
            engine.set_flight_records(settings.flight_records)
        self.costs = None  # the cost model behind algorithm="auto" (set_costs)
        # all_reduce of numpy arrays takes the native fast path (no debug printing wanted)
        self._fast_numpy = self._device is None and not settings.debug

    def set_costs(self, costs) -> None:
        """Use `costs` for ``algorithm="auto"``: a ``selection.Costs``, or a
        ``selection.Measured`` on this many ranks.

        Every rank must pass the same constants (init() and run_local() see to
        it), so that all choose alike; a rank that chose differently would
        still be caught (the algorithm is part of each call's fingerprint).
        """
        from . import selection
        self.costs = costs
        rd, hd = selection.auto_limits(costs, self.size)
        self._engine.set_auto_limits(rd, hd)

    @property
    def last_algorithm(self) -> str:
        """The algorithm of the collective issued last on this rank (what
        ``algorithm="auto"`` chose)."""
        return self._engine.last_algorithm()

    # ---- identity -----------------------------------------------------
    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def size(self) -> int:
        return self._engine.size

    @property
    def transport(self) -> str:
        """'mpi', 'inproc', 'inproc(cuda:0)', 'nccl(cuda:0)', 'inproc(emulated:0)'."""
        return self._engine.transport

    @property
    def device(self) -> str | None:
        """Where this communicator's payload lives: None (host memory),
        'cuda:K' (GPU K), or 'emulated:r' (host memory through the emulated
        device queue: the GPU path's ordering, tested on a CPU)."""
        return self._device

    @property
    def _gpu(self) -> int | None:
        d = self._device
        return int(d.split(":")[1]) if d and d.startswith("cuda:") else None

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
    def all_reduce(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Reduce `x` elementwise over all ranks; every rank gets the result.

        In place when `out` is None (returns `x`), else into `out` (same dtype
        and shape; `x` is not modified). op: sum, prod, min, max, avg (avg:
        floating dtypes only; the sum divided by the number of ranks).
        algorithm: "auto" (default: the fastest by this communicator's cost
        model; ``last_algorithm`` says which ran), "ring" (reduce-scatter +
        all-gather; bandwidth-optimal, the choice for large buffers),
        "recursive_doubling" (log2 n steps of whole buffers: small ones),
        "halving_doubling" (Rabenseifner: medium ones), or "naive": the
        master-centric scheme (everything to rank 0 and back), for comparison.
        The sums of different algorithms may differ in the last bit (another
        order of additions); every rank gets the same bits from any of them.
        Device communicators run the ring.
        """
        if self._fast_numpy and not async_op:
            # numpy arrays on a host communicator: checked and run natively
            # (False: something to explain or another kind of array; go on).
            y = x if out is None else out
            opc = _dtypes.OPS.get(op, -1) if isinstance(op, str) else -1
            algo = _ALGORITHMS.get(algorithm, -2) if isinstance(algorithm, str) else -2
            try:
                if self._engine.run_numpy(x, y, opc, algo):
                    return y
            except BaseException as exc:  # the collective failed: as in _submit
                self._failed(exc, (x, out))
                raise
        xb = self._view(x, "all_reduce input")
        opc = self._op(op, xb)
        if out is None:
            ob = self._writable(xb, "all_reduce input (in place; pass out= for a read-only input)")
        else:
            ob = self._out(out, xb, xb.count, "all_reduce")
            if ob.shape != xb.shape:
                raise InvalidArgument(f"all_reduce out has shape {ob.shape}, expected the input's shape {xb.shape}")
        return self._submit("all_reduce", xb, ob, xb.count, opc, 0, ob.obj, async_op, _algo(algorithm))

    def reduce_scatter(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "ring"):
        """Reduce `x` over all ranks and leave chunk `rank` of the result here.

        Chunks follow the split rule (numpy.array_split): chunk r has
        len(x)//n elements, plus one if r < len(x) % n. Returns a new 1-D array
        (same family as `x`) unless `out` is given. `x` is not modified.
        algorithm: "ring" (default), "halving_doubling" (power-of-two sizes
        only), or "auto" (the ring: its sums are the ones all_reduce's ring
        computes, which sharded training relies on).
        """
        xb = self._view(x, "reduce_scatter input")
        opc = self._op(op, xb)
        mine = _split(xb.count, self.size, self.rank)
        if out is None:
            out = empty_like(xb, mine)
        ob = self._out(out, xb, mine, "reduce_scatter",
                       why=f"rank {self.rank}'s chunk of {xb.count} elements over {self.size} ranks",
                       in_place_at=self._chunk_offset(xb.count) * _dtypes.itemsize(xb.dtype))
        return self._submit("reduce_scatter", xb, ob, xb.count, opc, 0, ob.obj, async_op, _algo(algorithm))

    def all_gather(self, x, *, out=None, async_op: bool = False, algorithm: str = "ring"):
        """Concatenate every rank's `x` in rank order; every rank gets the result.

        Rank r's input must be chunk r of the total under the split rule. With
        `out` (the total's size) the total is known; without it the ranks first
        exchange their counts (one extra small collective; all ranks must then
        call without `out`). algorithm: "ring" (default), "halving_doubling"
        (power-of-two sizes only), or "auto" (the ring).
        """
        xb = self._view(x, "all_gather input")
        if out is None:
            total = self._gathered_total(xb)
            out = empty_like(xb, total)
        ob = self._view(out, "all_gather out")
        total = ob.count
        mine = _split(total, self.size, self.rank)
        if xb.count != mine:
            raise InvalidArgument(
                f"all_gather input has {xb.count} elements but rank {self.rank}'s chunk of out "
                f"({total} elements over {self.size} ranks, split rule) has {mine}")
        self._out(out, xb, total, "all_gather", why="the gathered total", outbuf=ob,
                  in_place_at=-self._chunk_offset(total) * _dtypes.itemsize(xb.dtype))
        return self._submit("all_gather", xb, ob, total, 0, 0, ob.obj, async_op, _algo(algorithm))

    def broadcast(self, x, root: int = 0, *, async_op: bool = False):
        """Copy `x` from rank `root` to every rank, in place. Returns `x`."""
        xb = self._view(x, "broadcast buffer")
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

    def abort(self) -> None:
        """Fail this communicator on purpose and tell the ring: ranks waiting on
        it raise CommunicatorAborted instead of waiting for their deadline."""
        if not self._engine.closed and not self._engine.aborted:
            w = self._engine.abort()
            # Called back from inside a collective running on this thread (a
            # signal handler run by the Ctrl-C check): the abort takes effect
            # at once; waiting for it would wait for ourselves.
            if not self._engine.running_here:
                w.wait()

    def flight_record(self) -> list[dict]:
        """The last collectives of this communicator, oldest first
        (``RINGCOMM_FLIGHT_RECORDER``, default 256), one dict each: ``seq``,
        ``collective``, ``count``, ``dtype``, ``op``, ``root``, ``algorithm``,
        ``state`` (queued, running, done, failed), wall-clock ``t_issue``,
        ``t_start``, ``t_end`` (seconds since the epoch), where it is or
        stopped (``phase``, ``step``, ``segment``, ``waiting_for``: the peer,
        ``waiting_to``: "receive" or "send", ``waiting_what``,
        ``waiting_since``), payload ``bytes_sent`` / ``bytes_received`` so
        far, ``error`` and ``rank``. Safe to call from any thread, also while
        a collective runs; after close(), the record at closing."""
        from .flight import records_with_rank
        if self._engine.closed:
            return list(self._final_record or [])
        return records_with_rank(self._engine.flight_record(), self.rank)

    def close(self) -> None:
        """Finish queued collectives and release the communicator. Requests a
        failed collective left in flight stay in the quarantine (with their
        memory) until they complete: closing never frees memory MPI may
        still use."""
        if not self._engine.closed:
            try:
                self._final_record = self.flight_record()
            except RingcommError:
                pass
            self._engine.close()
        with self._lock:
            for w in self._inflight:  # failed ones whose requests are still in flight keep their arrays
                hold = w._native.hold()
                if hold is not None and hold.pending:
                    with _held_lock:
                        _held.append((hold, w._keep))
            self._inflight.clear()
        quarantined()  # release what has completed meanwhile

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ----------------------------------------------------
    def _failed(self, exc: BaseException, arrays) -> None:
        """A collective of this communicator raised `exc` (a RingcommError, or
        KeyboardInterrupt): keep the arrays a request still in flight may use,
        and dump the flight record once."""
        _hold_arrays(exc, arrays)
        from ._failfast import explain
        explain(self, exc)  # a peer died of an exception: name it
        if self._settings.dump_dir and not self._dumped:
            self._dumped = True
            try:
                from .flight import dump
                dump(self._settings.dump_dir, rank=self.rank, size=self.size, label=self._label.split("(")[0],
                     index=self._index, records=self.flight_record(), error=exc)
            except OSError as e:
                log.warning("ringcomm: could not write the flight record to %s: %s", self._settings.dump_dir, e)

    def _run_host_all_reduce(self, ptr: int, count: int, dtype_code: int, op_code: int, keep) -> None:
        """A synchronous in-place host all_reduce of memory the caller has
        already checked (contiguous host memory of `count` elements of a
        supported dtype, by its code in _dtypes.DTYPES; an op code of
        _dtypes.OPS valid for it), kept alive by `keep`: the
        torch.distributed backend's fast path, without the array adapter.
        Failures are handled as in every other call."""
        try:
            self._engine.run(0, ptr, ptr, count, dtype_code, op_code, 0, _ALGORITHMS["auto"])
        except BaseException as exc:
            self._failed(exc, keep)
            raise

    def _op(self, op: str, xb: Buf) -> int:
        if not isinstance(op, str) or op not in _dtypes.OPS:
            raise InvalidArgument(f"unknown op {op!r}; expected one of {', '.join(_dtypes.OPS)}")
        if op == "avg" and xb.dtype not in _dtypes.FLOATING:
            raise InvalidArgument(f"op 'avg' needs a floating dtype, got {xb.dtype} "
                                  "(use 'sum' and divide, or convert to a floating type)")
        return _dtypes.OPS[op]

    def _view(self, x, what: str) -> Buf:
        """view(x), plus: the array lives where this communicator's payload does."""
        b = view(x, what)
        gpu = self._gpu
        if gpu is None and b.device is not None:
            raise InvalidArgument(
                f"{what} is on cuda:{b.device}, but this communicator moves host memory; for GPU arrays use "
                "ringcomm.init(device='cuda') or run_local(..., device='cuda')")
        if gpu is not None and b.device is None and b.count:
            raise InvalidArgument(
                f"{what} is in host memory, but this communicator's payload lives on cuda:{gpu} "
                "(move it there: cupy.asarray(x) or tensor.cuda())")
        if gpu is not None and b.device is not None and b.device != gpu:
            raise InvalidArgument(f"{what} is on cuda:{b.device}, but this communicator is on cuda:{gpu}")
        return b

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
        ob = outbuf if outbuf is not None else self._view(out, f"{coll} out")
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

    def _gathered_total(self, xb: Buf) -> int:
        # The counts travel like the payload (on a GPU communicator: GPU arrays of x's family).
        template = Buf(xb.obj, 0, 0, "int64", (), False, xb.family, device=xb.device)
        counts_dev = empty_like(template, self.size)
        self.all_gather(like(template, np.array([xb.count], dtype=np.int64)), out=counts_dev)
        counts = to_numpy(counts_dev)
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
        lead = xb or ob
        stream_fn = lead.stream_fn if lead is not None else None
        args = (_dtypes.COLLECTIVES[coll], xb.ptr if xb else 0, ob.ptr if ob else 0, count, dtype, opc, root, algo)
        if not async_op and self._device is None:
            try:
                self._engine.run(*args)  # the caller's frame keeps the arrays alive while it runs
            except BaseException as exc:  # RingcommError, or KeyboardInterrupt (the collective was aborted)
                self._failed(exc, (xb, ob))
                raise
            return result
        # GPU arrays: ordered after the work queued so far on the caller's current stream.
        stream = stream_fn() if stream_fn is not None else 0
        work = Work(self._engine.submit(*args, stream), result, (xb, ob), stream_fn, self._engine,
                    bool(self._device and self._device.startswith("emulated")), self)
        self._track(work)
        if not async_op:  # on a device: returns once enqueued; the Work keeps the arrays until the device is done
            return work.wait()
        return work

    def _track(self, work: Work) -> None:
        with self._lock:  # keep the arrays of queued collectives alive until they complete
            while self._inflight and self._inflight[0]._done_with_arrays():
                self._inflight.popleft()
            self._inflight.append(work)


# ---------------------------------------------------------------------------
_mpi_comms: "weakref.WeakSet[Communicator]" = weakref.WeakSet()
_mpi_index = itertools.count(1)    # communicators made by init() in this process (same order on every rank)
_local_index = itertools.count(1)  # worlds made by run_local()


def _close_mpi_comms() -> None:
    # Runs before mpi4py finalizes MPI (atexit is last-in, first-out and we
    # register after importing mpi4py.MPI).
    for c in list(_mpi_comms):
        try:
            c.close()
        except RingcommError:
            pass


def _local_rank(comm, with_size: bool = False):
    """This process's index among the ranks of `comm` on the same node
    (and how many they are, with `with_size`)."""
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return (node.Get_rank(), node.Get_size()) if with_size else node.Get_rank()
    finally:
        node.Free()


def init(mpi_comm=None, *, device: str | int | None = None, timeout: float | None = None,
         segment_bytes: int | str | None = None, window: int | None = None) -> Communicator:
    """A communicator over MPI (COMM_WORLD unless `mpi_comm` is given).

    Collective over the MPI communicator: every rank must call it. ringcomm
    duplicates the communicator, so its messages never mix with yours.
    Requires MPI_THREAD_MULTIPLE (mpi4py's default).

    device: None (default) moves host memory with MPI point-to-point.
    "cuda" (GPU = this process's rank on its node; one GPU per rank) or a GPU
    ordinal: payload on that GPU (made the calling thread's current device), moved with NCCL point-to-point
    (ncclSend/ncclRecv) and reduced by ringcomm's kernels; control messages
    still go through MPI. Arrays must then be GPU arrays on that GPU.
    """
    from . import _failfast, _singleton
    MPI = _singleton.mpi()  # starts MPI (as a singleton: without /dev/shm files)

    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    s = config.settings(timeout, segment_bytes, window)
    if device is None:
        engine = core.mpi_engine(MPI._handleof(comm), s.timeout, s.segment_bytes, s.window)
        label = "mpi"
    else:
        from . import cuda
        cuda.require()
        if device == "cuda":
            local, on_node = _local_rank(comm, with_size=True)
            if on_node > cuda.device_count():
                raise InvalidArgument(
                    f"{on_node} ranks on this node but {cuda.device_count()} GPU(s): NCCL needs one GPU per rank "
                    "(for several ranks on one GPU use run_local(n, fn, device='cuda'))")
            gpu = local
        elif isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda:")):
            gpu = int(str(device).split(":")[-1])
        else:
            raise InvalidArgument(f"device must be None, 'cuda', 'cuda:K' or a GPU ordinal, got {device!r}")
        if not 0 <= gpu < cuda.device_count():
            raise InvalidArgument(f"GPU {gpu} does not exist here ({cuda.device_count()} GPU(s))")
        engine = cuda._cuda.nccl_engine(MPI._handleof(comm), gpu, s.timeout, s.segment_bytes, s.window)
        cuda._cuda.set_device(gpu)  # this process's arrays belong there (cupy and torch follow it)
        label = "nccl"
    c = Communicator(engine, s, label)
    from . import selection
    # Rank 0's constants for everyone: all ranks must make the same choices.
    c.set_costs(comm.bcast(selection.costs_for(label, comm.Get_size()) if comm.Get_rank() == 0 else None, root=0))
    c._index = next(_mpi_index)
    _mpi_comms.add(c)
    _failfast.register(c, comm)  # a rank dying of an exception aborts c: its peers fail at once
    _singleton.notice_once(comm.Get_size())
    return c


def _local_engines(n: int, s: config.Settings, device, jitter_us: float) -> list:
    if device is None or device == "emulated":
        world = core.inproc_world(n)
        return [core.inproc_engine(world, r, s.timeout, s.segment_bytes, s.window, device == "emulated",
                                   float(jitter_us)) for r in range(n)]
    if device == "emulated-nccl":
        control, payload = core.inproc_world(n), core.inproc_world(n)
        return [core.inproc_engine(control, r, s.timeout, s.segment_bytes, s.window, True, float(jitter_us),
                                   payload) for r in range(n)]
    if not (device == "cuda" or isinstance(device, (list, tuple)) and len(device) == n):
        raise InvalidArgument(f"device must be None, 'emulated', 'cuda' or a list of {n} GPU ordinals, "
                              f"got {device!r}")
    from . import cuda
    cuda.require()
    count = cuda.device_count()
    gpus = [r % count for r in range(n)] if device == "cuda" else [int(g) for g in device]
    bad = [g for g in gpus if not 0 <= g < count]
    if bad:
        raise InvalidArgument(f"GPU(s) {bad} do not exist here ({count} GPU(s))")
    return cuda._cuda.inproc_engines(gpus, s.timeout, s.segment_bytes, s.window)


def run_local(n: int, fn: Callable, *args, timeout: float | None = None,
              segment_bytes: int | str | None = None, window: int | None = None,
              device: str | list | None = None, jitter_us: float = 0.0, **kwargs) -> list:
    """Run ``fn(comm, *args, **kwargs)`` on `n` in-process ranks (one thread
    each) and return their results in rank order.

    device: None (host memory); "cuda": payload on GPUs, rank r on GPU
    r % (number of GPUs), so the whole ring runs on a single GPU too; a list
    of n GPU ordinals (each rank's thread runs `fn` with its GPU current); "emulated": host memory, but every copy and reduction
    goes through a per-rank queue run by its own thread, as on a GPU stream
    (stream_emu.h), with a random delay of up to `jitter_us` before each
    operation: the GPU path's ordering, checked on a CPU; "emulated-nccl":
    the NCCL transport's grouping and ordering code over the emulated device,
    with groups that block their queue until all their messages matched, as
    NCCL's do.

    If any rank raises, its communicator is aborted (so the others fail fast
    instead of waiting for their deadline) and the lowest rank's exception is
    re-raised after every thread has finished, with ``flight_records``
    attached: {rank: that rank's Communicator.flight_record()}. Ctrl-C (a
    KeyboardInterrupt in the calling thread, e.g. a notebook's interrupt)
    aborts every rank and is re-raised within a fraction of a second (rank
    threads still busy in their own code are left behind as daemons; their
    next collective raises CommunicatorAborted).
    """
    if int(n) < 1:
        raise InvalidArgument(f"run_local needs at least one rank, got {n}")
    n = int(n)
    s = config.settings(timeout, segment_bytes, window)
    label = "inproc" if device is None else f"inproc({device if isinstance(device, str) else 'cuda'})"
    engines = _local_engines(n, s, device, jitter_us)
    comms = [Communicator(e, s, label) for e in engines]
    index = next(_local_index)
    from . import selection
    costs = selection.costs_for("inproc" if device is None else label, n)
    for c in comms:
        c.set_costs(costs)
        c._index = index
        c._engine.set_peers(engines)  # a timeout message then says what the awaited rank is doing
    results: list = [None] * n
    errors: list = [None] * n

    def body(r: int) -> None:
        try:
            gpu = comms[r]._gpu
            if gpu is not None:  # the rank's thread allocates on the rank's GPU (cupy and torch follow it)
                from . import cuda
                cuda._cuda.set_device(gpu)
            results[r] = fn(comms[r], *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors[r] = exc
            try:
                comms[r].abort()
            except RingcommError:
                pass

    threads = [threading.Thread(target=body, args=(r,), name=f"ringcomm-rank-{r}", daemon=True)
               for r in range(n)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():  # join() with a timeout: the main thread stays responsive to Ctrl-C
                t.join(0.1)
    except BaseException:  # KeyboardInterrupt: stop every rank, then re-raise
        for c in comms:
            with contextlib.suppress(RingcommError):
                if not c._engine.closed and not c._engine.aborted:
                    c._engine.abort()  # no wait: each rank's collective fails at once
        # Ranks waiting in a collective end at once; a rank busy in its own
        # code is not waited for (Ctrl-C must return promptly): its thread is
        # a daemon, and its next collective raises CommunicatorAborted.
        deadline = time.monotonic() + 0.15
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for c, t in zip(comms, threads):
            if not t.is_alive():
                c.close()
        raise
    records = {r: c.flight_record() for r, c in enumerate(comms)}
    for c in comms:
        c.close()
    first = next((e for e in errors if e is not None and not isinstance(e, CommunicatorAborted)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        with contextlib.suppress(AttributeError, TypeError):
            first.flight_records = records
        raise first
    return results

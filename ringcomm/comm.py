"""The communicator: collectives on arrays, over MPI or in-process ranks.

A Communicator owns one native engine. Each collective method hands its
arguments to the communicator's Door (door.py), which checks them and
describes the call; the engine runs it (synchronously on this thread, or
queued, returning a Work). Making communicators is world.py's job.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading

import numpy as np

from . import algorithms, config, quarantine, vocab
from ._arrays import Buf, empty_like, like, to_numpy
from .door import Described, Door
from .errors import InvalidArgument, RingcommError
from .comm_p2p import PointToPoint
from .comm_records import Records
from .work import Work

_ALL_REDUCE = vocab.COLLECTIVES["all_reduce"]  # (the fast lane's code, looked up once)

__all__ = ["Communicator"]

log = logging.getLogger("ringcomm")

_COLL_NAMES = {v: k for k, v in vocab.COLLECTIVES.items()}
_DTYPE_NAMES = {v: k for k, v in vocab.DTYPES.items()}


# What the rooted fast lane passes on (anything else: the door, whose message names what runs).
_FAST_ALGORITHMS = {c: ("auto", *algorithms.names(c)) for c in ("broadcast", "reduce", "gather", "scatter", "all_to_all")}


class Communicator(PointToPoint, Records):
    """A group of ranks that run ring collectives together.

    Get one from :func:`init` (MPI processes) or :func:`run_local` (threads).
    Every rank must call the same collectives in the same order with the same
    count, dtype, op and root; a disagreement raises MismatchError on every rank.
    """

    def __init__(self, engine, settings: config.Settings, label: str, index: int = 0, *,
                 arena_maker=None, keep=None):
        """(Made by ringcomm.init and run_local.) `arena_maker`: makes the
        shared arena of comm.empty() (None: this communicator cannot); `keep`:
        what the communicator keeps alive while open (a store bootstrap's
        group, hence its store, e.g. a TCPStore's port)."""
        self._engine = engine
        self._arena_maker = arena_maker
        self._bootstrap = keep
        self._device = engine.device  # fixed for the communicator's life
        self._settings = settings
        self._label = label
        self._ledger_members = None  # job ranks, where a launcher asked for the ledger (ringcomm/cluster/ledger.py)
        self._inflight: collections.deque = collections.deque()
        self._sweep_at = 64  # _track: past this many Works in flight, look for done ones behind the head
        self._lock = threading.Lock()
        self._trace = None  # (Trace, native Tracer) while comm.trace() is active
        self._index = index  # which communicator of its kind in this process (names its dumps)
        self._dumped = False
        self._final_record: list | None = None  # the flight record at close()
        if settings.flight_records != 256:
            engine.set_flight_records(settings.flight_records)
        self.costs = None  # the cost model behind algorithm="auto" (set_costs)
        self._door = Door(engine.rank, engine.size, self.gpu, engine.p2p_limits)
        # all_reduce of numpy arrays and torch CPU tensors takes the door's
        # native fast lane (no debug printing wanted)
        self._fast_lane = self._device is None and not settings.debug

    def set_costs(self, costs) -> None:
        """Use `costs` for ``algorithm="auto"``: a ``selection.Costs``, or a
        ``selection.Measured`` on this many ranks.

        Every rank must pass the same constants (init() and run_local() see to
        it), so that all choose alike; a rank that chose differently would
        still be caught (the algorithm is part of each call's fingerprint).
        """
        from .tuning import selection
        self.costs = costs
        rd, hd = selection.auto_limits(costs, self.size)
        self._engine.set_auto_limits(rd, hd, selection.reduce_limit(costs, self.size))

    def empty(self, shape, dtype="float32", *, family: str = "numpy"):
        """An uninitialized array (numpy, or torch with ``family="torch"``)
        in this rank's part of the shared arena: collectives on such arrays
        run zero copy (``algorithm="zero_copy"``, chosen by auto), peers
        reading them where they are, with no staging copy.

        Like PyTorch's SymmetricMemory, but the arrays need not sit at the
        same place on every rank: each rank announces where its are, per
        call. A zero-copy call needs every rank's arrays (all_reduce: input
        and output) in the arena; a rank whose are not runs another
        algorithm, which the others see as a MismatchError naming both. The
        arena (``RINGCOMM_SHM_ARENA`` bytes per rank, 128 MiB) is made at the
        first call, collectively: every rank must make that call. An array
        returns its block when the last view of it is gone. Needs ranks that
        share memory (``shared_memory``; in process: always). The
        GradBucketer (and so ``ringcomm.torch.DistributedDataParallel``)
        puts its buckets there by itself.
        """
        from .shm import arena
        return arena.empty(self._engine.window, self._arena_maker, shape, dtype, family)

    @property
    def last_algorithm_between_hosts(self) -> str | None:
        """Hierarchical communicators (ranks on several hosts): the algorithm
        the last hierarchical collective (all_reduce, reduce_scatter or
        all_gather) ran between hosts; else None."""
        return self._engine.last_algorithm_between_hosts

    @property
    def shared_memory(self) -> bool:
        """Whether ``algorithm="auto"`` runs all_reduce, reduce_scatter,
        all_gather, broadcast and barrier in the ranks' shared-memory window
        (ranks of one host; ringcomm.shm)."""
        return bool(self._engine.has_window and self._engine.shm_auto)

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
    def gpu(self) -> int | None:
        """The GPU ordinal of a GPU communicator, else None."""
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

    @property
    def closed(self) -> bool:
        return self._engine.closed

    def __repr__(self) -> str:
        return f"<ringcomm.Communicator {self._label} rank {self.rank}/{self.size}>"

    # ---- collectives --------------------------------------------------
    def all_reduce(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Reduce `x` elementwise over all ranks; every rank gets the result.

        In place when `out` is None (returns `x`), else into `out` (same dtype
        and shape; `x` is not modified). op: sum, prod, min, max, avg (avg:
        floating dtypes only; the sum divided by the number of ranks), band,
        bor, bxor (bitwise: integer and bool dtypes only). min and max give
        NaN wherever any rank has one.
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
        # _same_shape's lane written out: the most frequent call spares a Python frame.
        if self._fast_lane and not async_op:
            y = x if out is None else out
            try:
                if self._engine.run_same_shape(_ALL_REDUCE, x, y, op, algorithm):
                    return y
            except BaseException as exc:  # the collective failed: as in _submit
                self._failed(exc, (x, out))
                raise
        return self._submit(self._door.same_shape("all_reduce", x, op, out, algorithm), async_op)

    def scan(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Inclusive prefix reduction (MPI_Scan): rank r gets x of ranks 0..r
        combined elementwise, lower ranks first. In place when `out` is None
        (returns `x`), else into `out` (same dtype and shape). op as in
        all_reduce; avg is the sum over ranks 0..r divided by r + 1.
        algorithm: "auto" (recursive doubling for small buffers, the pipeline
        for large), "recursive_doubling" (ceil(log2 n) steps of the whole
        buffer) or "linear" (a pipeline 0 -> 1 -> ... -> n-1 in segments of
        segment_bytes). The two may differ in a floating sum's last bit.
        """
        return self._same_shape("scan", x, op, out, algorithm, async_op)

    def exscan(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Exclusive prefix reduction (MPI_Exscan): rank r gets x of ranks
        0..r-1 combined, lower ranks first; rank 0 gets the op's identity (MPI
        leaves it undefined): 0 for sum, bor, bxor; 1 for prod; the dtype's
        largest value (+inf for floating types) for min, its smallest (-inf)
        for max; all ones for band (bool: false for sum and max, true for
        prod, min and band). So the exscan of each rank's count with sum is
        its offset: ``off = comm.exscan(np.array([n_mine]))[0]``. avg is
        refused (rank 0 would average over no ranks). `out`, algorithm: as
        in scan.
        """
        return self._same_shape("exscan", x, op, out, algorithm, async_op)

    def reduce_scatter(self, x, op: str = "sum", *, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Reduce `x` over all ranks and leave chunk `rank` of the result here.

        Chunks follow the split rule (numpy.array_split): chunk r has
        len(x)//n elements, plus one if r < len(x) % n. Returns a new 1-D array
        (same family as `x`) unless `out` is given. `x` is not modified.
        algorithm: "auto" (default: "shm" when the ranks share a host's
        memory, see ``shared_memory``, else the ring), "ring",
        "halving_doubling" (power-of-two sizes only) or "shm". The ring's
        sums are those of all_reduce's ring, shm's those of all_reduce's
        shm and shm_flat (which sharded training relies on).
        """
        if self._fast_lane and not async_op and out is not None:  # as all_reduce's (1-D numpy, out given)
            try:
                if self._engine.run_halves(True, x, out, op, algorithm):
                    return out
            except BaseException as exc:
                self._failed(exc, (x, out))
                raise
        return self._submit(self._door.reduce_scatter(x, op, out, algorithm, empty_like), async_op)

    def all_gather(self, x, *, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Concatenate every rank's `x` in rank order; every rank gets the result.

        Rank r's input must be chunk r of the total under the split rule. With
        `out` (the total's size) the total is known; without it the ranks first
        exchange their counts (one extra small collective; all ranks must then
        call without `out`). algorithm: "auto" (default: "shm" when the ranks
        share a host's memory, else the ring), "ring", "halving_doubling"
        (power-of-two sizes only) or "shm".
        """
        if self._fast_lane and not async_op and out is not None:  # as all_reduce's (1-D numpy, out given)
            try:
                if self._engine.run_halves(False, x, out, 0, algorithm):
                    return out
            except BaseException as exc:
                self._failed(exc, (x, out))
                raise
        xb = self._door.view(x, "all_gather input")
        if out is None:
            out = empty_like(xb, self._gathered_total(xb))
        return self._submit(self._door.all_gather(xb, out, algorithm), async_op)

    def broadcast(self, x, root: int = 0, *, async_op: bool = False, algorithm: str = "auto"):
        """Copy `x` from rank `root` to every rank, in place. Returns `x`.
        algorithm: "auto" (default: "shm" when the ranks share a host's
        memory, else "ring": pipelined along the ring), "ring" or "shm"."""
        if self._rooted_fast("broadcast", x, x, root, "sum", algorithm, async_op):
            return x
        return self._submit(self._door.broadcast(x, root, algorithm), async_op)

    def barrier(self, *, async_op: bool = False, algorithm: str = "auto"):
        """Return once every rank has entered the barrier. algorithm: "auto"
        (default: "shm" when the ranks share a host's memory, else "ring":
        a token around the ring), "ring" or "shm"."""
        if self._fast_lane and not async_op and isinstance(algorithm, str) and algorithm in vocab.ALGORITHMS:
            try:  # nothing to describe: straight to the engine (the door's path costs ~5 us here)
                self._engine.run_barrier(vocab.ALGORITHMS[algorithm])
            except BaseException as exc:  # as in _submit
                self._failed(exc, ())
                raise
            return None
        return self._submit(self._door.barrier(algorithm), async_op)

    def reduce(self, x, root: int = 0, op: str = "sum", *, out=None, async_op: bool = False,
               algorithm: str = "auto"):
        """Reduce `x` elementwise over all ranks; only rank `root` gets the result.

        On the root the result is written in place (returns `x`) or into `out`
        (same dtype and shape; `x` is then not modified). On every other rank
        `x` is only read, `out` is ignored, and the call returns None. op: as
        :meth:`all_reduce`. algorithm: "auto" (the
        binomial tree up to a size limit from this communicator's cost model,
        ``selection.reduce_limit``, at most 256 KiB; the ring reduce-scatter + gather above; a
        device communicator runs the ring), "binomial" or "ring".
        """
        if algorithm in _FAST_ALGORITHMS["reduce"] and \
                self._rooted_fast("reduce", x, out, root, op, algorithm, async_op):
            return (x if out is None else out) if self.rank == root else None
        return self._submit(self._door.reduce(x, root, op, out, algorithm), async_op)

    def gather(self, x, root: int = 0, *, counts=None, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Concatenate every rank's `x` in rank order on rank `root`.

        Without `counts` every rank passes the same number of elements (equal
        blocks; a rank that differs gets a MismatchError, as do all others).
        With ``counts`` (one int per rank, the same list on every rank: gatherv)
        rank r passes counts[r] elements; for the split rule of a total T pass
        ``ringcomm.vocab.chunk_counts(T, size)``. The root returns a new 1-D
        array of the total (same family as `x`) or `out`; other ranks return
        None (`out` is ignored there). On the root `out` may also be a list
        of one array per rank (torch's ``gather_list``): each rank's block goes
        straight into its own array, with no staging buffer; the list is
        returned. algorithm: "auto" (default: "shm" when
        the ranks share a host's memory, see ``shared_memory``, else
        "linear"), "linear" (every rank sends its block straight to the
        root, csrc/algorithms/gather_scatter.cpp) or "shm" (through the
        window's slots, csrc/algorithms/shm_*.cpp).
        """
        if counts is None and (out is not None or self.rank != root) and \
                self._rooted_fast("gather", x, out, root, "sum", algorithm, async_op):
            return out if self.rank == root else None
        return self._submit(self._door.gather(x, root, counts, out, empty_like, algorithm), async_op)

    def scatter(self, x, root: int = 0, *, counts=None, out=None, async_op: bool = False, algorithm: str = "auto"):
        """Hand block r of the root's `x` to rank r; returns this rank's block.

        On the root `x` is the full buffer, or a list of one array per rank
        (torch's ``scatter_list``; block r is read straight from ``x[r]``, with
        no staging buffer). Without `counts` the blocks are
        equal (its length must be divisible by the number of ranks) and the
        other ranks pass `out` (their block's buffer: its size tells them the
        block's). With ``counts`` (one int per rank, the same list on every
        rank: scatterv) rank r gets counts[r] elements; for the split rule of a
        total T pass ``ringcomm.vocab.chunk_counts(T, size)``. Off the root
        `x` is not read: pass None with `out`, or any array of the right
        dtype and family as the template of a new output. algorithm: "auto"
        (default: "shm" when the ranks share a host's memory, else
        "linear"), "linear" or "shm", as gather's.
        """
        if counts is None and out is not None and \
                self._rooted_fast("scatter", x, out, root, "sum", algorithm, async_op):
            return out
        return self._submit(self._door.scatter(x, root, counts, out, empty_like, algorithm), async_op)

    def all_to_all(self, x, splits=None, out_splits=None, *, out=None, async_op: bool = False,
                   algorithm: str = "auto"):
        """Every rank sends block p of `x` to rank p; returns the blocks received,
        in rank order (torch's ``all_to_all_single``).

        Without splits the blocks are equal: ``len(x)`` must be divisible by the
        number of ranks, and the output has as many elements. ``splits`` (what
        this rank sends to each rank, summing to ``len(x)``) and ``out_splits``
        (what it receives from each) work as torch's ``input_split_sizes`` and
        ``output_split_sizes``; either may be left out to mean equal blocks
        (of `x`, of `out`). A call with splits (even equal ones) runs per-peer
        blocks, one without them equal blocks: ranks must agree on which (a
        rank cannot know that its peers' splits are equal too); one that does
        not gets a MismatchError naming both calls. ``splits[r]`` must equal
        ``out_splits[r]`` on rank r (its block to itself). A rank receiving a
        block of another size than its out_splits says gets a MismatchError
        naming both sizes (every block travels as one message, checked in
        size before a byte lands); the rank that sent it hears of it by its
        next call at the latest (CommunicatorAborted), as with send().
        Returns a new 1-D array unless `out` is given. `x` and `out` may
        also be lists of one array per peer (torch's ``all_to_all`` list
        form): block p is read from ``x[p]`` and written into ``out[p]`` in
        place; a list is a call with per-peer splits, its arrays' sizes.
        algorithm: "auto" (default: "shm" when the ranks share a host's
        memory, at the sizes where it wins there, ringcomm.shm; per-peer
        splits at every size, as no rank knows the others' sizes; else
        "pairwise"), "pairwise" (pairwise exchange, n-1 steps,
        csrc/algorithms/all_to_all.cpp) or "shm" (the window: each block
        through its slots, or from the window's single-copy limit straight
        from the peer's array, csrc/algorithms/shm_*.cpp).
        """
        if out is not None and self._fast_lane and not async_op:
            if splits is None and out_splits is None:
                if self._rooted_fast("all_to_all", x, out, 0, "sum", algorithm, async_op):
                    return out
            elif splits is not None and out_splits is not None and algorithm in ("auto", "pairwise", "shm"):
                try:  # per-peer splits: the native description (csrc/python/converters.h)
                    if self._engine.run_all_to_all_v(x, out, splits, out_splits, vocab.ALGORITHMS[algorithm],
                                                     self._door.p2p_max_bytes):
                        return out
                except BaseException as exc:  # as in _submit
                    self._failed(exc, (x, out))
                    raise
        return self._submit(self._door.all_to_all(x, splits, out_splits, out, empty_like, algorithm), async_op)

    # ---- lifecycle ---------------------------------------------------------
    def abort(self, wait: bool = True, *, interrupted: bool = False) -> None:
        """Fail this communicator on purpose and tell the ring: ranks waiting on
        it raise CommunicatorAborted instead of waiting for their deadline.
        `wait=False`: return at once (the collectives queued before it fail
        without this thread waiting for them). `interrupted`: the peers hear
        that this rank was interrupted (KeyboardInterrupt), as when Ctrl-C
        lands in one of its waits."""
        if not self._engine.closed and not self._engine.aborted:
            w = self._engine.abort(interrupted)
            # Called back from inside a collective running on this thread (a
            # signal handler run by the Ctrl-C check): the abort takes effect
            # at once; waiting for it would wait for ourselves.
            if wait and not self._engine.running_here:
                w.wait()

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
            if self._ledger_members:
                from .cluster import ledger
                ledger.write(self)
            self._engine.close()
        # A store bootstrap's store (e.g. a TCPStore's port) is let go.
        self._bootstrap = None
        self._arena_maker = None
        with self._lock:
            for w in self._inflight:  # failed ones whose requests are still in flight keep their arrays
                quarantine.keep(w._native.hold(), w._keep)
            self._inflight.clear()
        quarantine.quarantined()  # release what has completed meanwhile

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ----------------------------------------------------
    def _failed(self, exc: BaseException, arrays) -> None:
        """A collective of this communicator raised `exc` (a RingcommError, or
        KeyboardInterrupt): keep the arrays a request still in flight may use,
        and dump the flight record once (not for a bad argument, raised
        before any byte moved: it must not use up the dump a later failure
        would write)."""
        quarantine.hold_arrays(exc, arrays)
        if isinstance(exc, InvalidArgument):
            return
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

    def _gathered_total(self, xb: Buf) -> int:
        # The counts travel like the payload (on a GPU communicator: GPU arrays of x's family).
        template = Buf(xb.obj, 0, 0, "int64", (), False, xb.family, device=xb.device)
        counts_dev = empty_like(template, self.size)
        self.all_gather(like(template, np.array([xb.count], dtype=np.int64)), out=counts_dev)
        counts = to_numpy(counts_dev)
        total = int(counts.sum())
        want = vocab.chunk_counts(total, self.size)
        if counts.tolist() != want:
            raise InvalidArgument(
                f"all_gather inputs have {counts.tolist()} elements on ranks 0..{self.size - 1}, but the "
                f"split rule for their total {total} needs {want}")
        return total

    def _rooted_fast(self, coll: str, x, out, root, op, algorithm, async_op: bool) -> bool:
        """The native fast lane of broadcast, reduce, gather, scatter and
        all_to_all (csrc/python/converters.h, host_rooted_call): True when it
        ran the call; False when the door must describe it (anything unusual,
        and every error: the door's messages are the only ones)."""
        if not self._fast_lane or async_op or isinstance(root, bool) or not isinstance(root, int) or \
                not 0 <= root < self.size or algorithm not in _FAST_ALGORITHMS[coll]:
            return False  # (the door explains)
        try:
            return self._engine.run_rooted(vocab.COLLECTIVES[coll], x, out, root, op, algorithm)
        except BaseException as exc:  # the collective failed: as in _submit
            self._failed(exc, (x, out))
            raise

    def _same_shape(self, coll: str, x, op: str, out, algorithm: str, async_op: bool):
        """all_reduce, scan, exscan: numpy arrays and torch CPU tensors on a
        host communicator are described and run natively (False: something
        to explain or another kind of array; the door's Python adapter takes
        it, as it takes every asynchronous call)."""
        if self._fast_lane and not async_op:
            y = x if out is None else out
            try:  # (op and algorithm by name: looked up natively, unknown ones declined)
                if self._engine.run_same_shape(vocab.COLLECTIVES[coll], x, y, op, algorithm):
                    return y
            except BaseException as exc:  # the collective failed: as in _submit
                self._failed(exc, (x, out))
                raise
        return self._submit(self._door.same_shape(coll, x, op, out, algorithm), async_op)

    def _submit(self, d: Described, async_op: bool):
        """Run or queue a call the door described; the result (or a Work)."""
        call = d.call
        if self._settings.debug:
            print(f"ringcomm[{self._label} rank {self.rank}] {_COLL_NAMES[call.coll]} count={call.count} "
                  f"dtype={_DTYPE_NAMES[call.dtype] if call.coll != vocab.COLLECTIVES['barrier'] else '-'} "
                  f"op={call.op} root={call.root}", file=sys.stderr)
        if not async_op and self._device is None:
            try:
                self._engine.run(call)  # the caller's frame keeps the arrays alive while it runs
            except BaseException as exc:  # RingcommError, or KeyboardInterrupt (the collective was aborted)
                self._failed(exc, d.keep)
                raise
            return d.result
        # GPU arrays: ordered after the work queued so far on the caller's current stream.
        stream = d.stream_fn() if d.stream_fn is not None else 0
        work = Work(self._engine.submit(call, stream), d.result, d.keep, d.stream_fn, self._engine,
                    bool(self._device and self._device.startswith("emulated")), self._failed)
        self._track(work)
        if not async_op:  # on a device: returns once enqueued; the Work keeps the arrays until the device is done
            return work.wait()
        return work

    def _track(self, work: Work) -> None:
        with self._lock:  # keep the arrays of queued collectives alive until they complete
            inflight = self._inflight
            while inflight and inflight[0]._done_with_arrays():
                inflight.popleft()
            inflight.append(work)
            if len(inflight) * 4 < self._sweep_at:  # after a burst: sweep early again
                self._sweep_at = max(64, 2 * len(inflight))
            if len(inflight) > self._sweep_at:
                # A Work nobody waits for (a dropped isend: only waits progress
                # a p2p op) would stay at the head, and every later one behind
                # it, arrays and all: now and then progress such ones and drop
                # whatever is done, wherever it stands.
                kept = [w for w in inflight if not w._done_with_arrays(progress=True)]
                inflight.clear()
                inflight.extend(kept)
                self._sweep_at = max(64, 2 * len(kept))

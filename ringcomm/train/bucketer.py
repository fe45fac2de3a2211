"""Bucketed gradient synchronisation for custom trainers (a DDP-style reducer).

    bucketer = ringcomm.GradBucketer(params, comm, bucket_cap_mb=25)
    for step in ...:
        grads = bucketer.grad_views()              # per-parameter arrays, views into the buckets
        bucketer.zero_grad()
        for i in reversed(range(len(params))):     # backward produces gradients last-to-first
            grads[i] += ...                        # write the gradient into its view
            bucketer.mark_ready(i)                 # launches a bucket's all_reduce when it is full
        bucketer.finalize()                        # waits; grads now hold the average over ranks

How it works, and why:

* Gradients are grouped into *buckets*: one flat buffer per bucket, one
  all_reduce per bucket. Few large messages amortise the per-collective latency;
  many small ones let communication start while backward is still running. The
  cap (``bucket_cap_mb``) trades the two; the first bucket is small
  (``first_bucket_mb``) so the first all_reduce starts as early as possible.
* Buckets are filled in *reverse* parameter order (the order backward produces
  gradients), split by dtype and device (one all_reduce has one dtype), and are
  launched strictly in bucket order, so every rank issues the same sequence of
  collectives (ringcomm requires that; a disagreement is a MismatchError).
* After the first synchronised iteration the buckets are rebuilt once in the
  order ``mark_ready`` was actually called; rank 0's order is broadcast so all
  ranks build the same buckets. The views move with them (``grad_views``):
  torch tensors already handed out are pointed at the new place, numpy arrays
  (which cannot move) are retired, so a held one raises StaleViewError rather
  than alias another parameter's gradient, some of it in flight.
* Every bucket carries one extra *status* element after the gradients. It is 0
  when a bucket is launched because all its gradients were ready, and 1 when
  finalize() had to launch it with never-ready (unused) gradients zero-filled.
  Because finalize() launches the incomplete buckets too, every rank issues the
  same all_reduces in every case, and after they complete every rank reads the
  same reduced status: if any is nonzero, all ranks exchange a small ready
  bitmap and raise the same error naming the parameters and ranks (or, with
  ``find_unused=True``, accept the zero-filled contribution). Unused parameters
  therefore never hang and cost nothing in the common case.
* Averaging: float32/float64 buckets use ``op="avg"`` (sum, then one division);
  float16/bfloat16 buckets are scaled by 1/N in float32 *before* a ``sum``
  (rounded once), so the sum of N large half-precision gradients cannot
  overflow. Integer buckets can only be summed (``average=False``).
"""

from __future__ import annotations

import collections
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .. import vocab
from ..errors import BucketerError, InvalidArgument, UnusedParametersError
from .buckets import MB, assign_buckets
from .consistency import check_registration, gather_rows, param_label, unused_message
from .bucket_timeline import Timeline
from .handed import HandedOut, handout, move, retire, seal
from .tensors import add_into, arena_zeros, averaging, copy_into, describe, family, flat_view, item, zero, zeros

__all__ = ["GradBucketer", "BucketInfo"]


# ---------------------------------------------------------------------------
@dataclass
class _Bucket:
    index: int
    key: tuple                  # (family, dtype, device)
    params: list                # parameter indices, in layout order
    offsets: list               # element offset of each parameter in flat
    count: int                  # gradient elements (flat has one more: the status slot)
    flat: Any = None
    pending: int = 0            # parameters not yet ready in this iteration
    work: Any = None
    launch_t: float = 0.0
    complete_t: float | None = None
    status: int = 0             # status slot value at launch (1: launched with unused gradients)


@dataclass(frozen=True)
class BucketInfo:
    """Read-only description of one bucket (``GradBucketer.buckets``)."""
    index: int
    params: tuple
    dtype: str
    device: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * vocab.itemsize(self.dtype)


class GradBucketer(Timeline):
    """Bucketed, overlapped gradient all_reduce for a fixed list of parameters.

    Collective: every rank constructs it with the same parameters (shapes,
    dtypes, order) and settings; a disagreement raises
    RegistrationMismatchError on every rank (checked with one small all_gather).

    Args:
        params: numpy arrays or torch CPU tensors (only shape, dtype and device
            are used; gradients live in the bucketer's buffers).
        comm: a ringcomm Communicator.
        bucket_cap_mb: a bucket is closed once it holds at least this many MiB
            (a parameter larger than the cap gets a bucket of its own; 0, with
            first_bucket_mb=0, gives one bucket per parameter).
        first_bucket_mb: the cap of the first bucket of each dtype/device, small
            so the first all_reduce starts early in backward.
        names: optional parameter names, used in error messages.
        average: average (True) or sum (False) over ranks. Integer parameters
            need ``average=False``.
        find_unused: False: a parameter that never became ready in a
            synchronised iteration makes finalize() raise UnusedParametersError
            on every rank. True: its gradient is zero-filled and reduced.
        rebuild_buckets: rebuild the buckets once after the first synchronised
            iteration, in the order mark_ready() was called on rank 0.
        timeline: record launch/complete/bytes of every bucket all_reduce
            (see ``timeline()`` and ``export_chrome_trace()``).
    """

    def __init__(self, params: Iterable, comm, *, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 names: Sequence[str] | None = None, average: bool = True, find_unused: bool = False,
                 rebuild_buckets: bool = True, timeline: bool = True, timeline_max_events: int = 100_000):
        params = list(params)
        self._comm = comm
        self._n = comm.size
        self._names = list(names) if names is not None else None
        if self._names is not None and len(self._names) != len(params):
            raise InvalidArgument(f"names has {len(self._names)} entries for {len(params)} parameters")
        self._specs = [describe(p, f"parameter {param_label(i, self._names)}") for i, p in enumerate(params)]
        if bucket_cap_mb < 0 or first_bucket_mb < 0:
            raise InvalidArgument("bucket_cap_mb and first_bucket_mb must be >= 0")
        self._cap = int(bucket_cap_mb * MB)
        self._first_cap = int(first_bucket_mb * MB)
        self._average = bool(average)
        self._find_unused = bool(find_unused)  # read-only: checked across ranks at construction
        if self._average:
            bad = [i for i, s in enumerate(self._specs) if s.dtype not in vocab.FLOATING]
            if bad:
                raise InvalidArgument(
                    f"average=True needs floating parameters; parameter {param_label(bad[0], self._names)} is "
                    f"{self._specs[bad[0]].dtype} (pass average=False to sum)")
        # The status slot is summed in the bucket's dtype: N ranks' 1s wrap
        # to 0 in an integer of b bits once N reaches 2^b, and an unused
        # gradient would pass unnoticed (8 bits: 256 ranks; a bool's sum is
        # "or": it counts to 1).
        def most(d):
            return 1 if d == "bool" else 2 ** (8 * vocab.itemsize(d)) - 1
        narrow = [i for i, s in enumerate(self._specs) if s.dtype not in vocab.FLOATING and self._n > most(s.dtype)]
        if narrow:
            d = self._specs[narrow[0]].dtype
            raise InvalidArgument(
                f"parameter {param_label(narrow[0], self._names)} is {d}: a bucket of {d} cannot count "
                f"{self._n} ranks in its status slot (it would wrap past {most(d)}); "
                "use a wider integer dtype")
        self._rebuild_pending = bool(rebuild_buckets)
        self._record_timeline = bool(timeline)
        self._events: collections.deque = collections.deque(maxlen=timeline_max_events)

        self._check_registration()  # collective: before any bucket collective

        P = len(self._specs)
        self._ready = np.zeros(P, dtype=bool)       # marked in this synchronised iteration
        self._used = np.zeros(P, dtype=bool)        # has a local contribution since the last sync
        self._owned: dict[int, Any] = {}            # copy-in arrays to copy the result back into
        self._observed: list[int] = []              # mark_ready order of the first synced iteration
        self._sync = True
        self._next_launch = 0
        self._next_complete = 0
        self._iteration = 0                         # synchronised iterations finalized so far
        self.layout_version = 0
        self.last_unused: dict[int, list[int]] = {}
        self._in_arena: bool | None = None          # where the blocks are (decided at the first layout)
        self._retired: list = []                    # old numpy views still readable (train.handed)
        self._build(list(reversed(range(P))))

    # ---- public API ---------------------------------------------------
    @property
    def find_unused(self) -> bool:
        """Fixed at construction (and checked equal on every rank then): ranks
        that decided differently would issue different collectives."""
        return self._find_unused

    @property
    def comm(self):
        return self._comm

    @property
    def num_params(self) -> int:
        return len(self._specs)

    @property
    def buckets(self) -> list[BucketInfo]:
        """The current bucket layout, in launch order."""
        return [BucketInfo(b.index, tuple(b.params), b.key[1], b.key[2], b.count) for b in self._buckets]

    @property
    def iteration(self) -> int:
        """Number of synchronised iterations finalized so far."""
        return self._iteration

    def grad_views(self) -> list:
        """Per-parameter gradient arrays (parameter order), views into the bucket
        buffers: write gradients into them (zero copy).

        The buckets are rebuilt once, at the end of the first finalize() (unless
        rebuild_buckets=False), and the views move with them. torch tensors you
        hold are moved too (``Tensor.set_``), so they stay live. numpy arrays
        cannot move: the old ones keep that iteration's averaged values, and
        any later use raises StaleViewError. So with numpy, fetch the views
        after finalize() (cheap: a cached list), or at the top of every
        iteration as the README does."""
        return list(self._views)

    def zero_grad(self) -> None:
        """Zero every gradient (the whole bucket buffers)."""
        self._seal_retired()
        for b in self._buckets:
            zero(b.flat)

    @property
    def syncing(self) -> bool:
        """False inside no_sync(): this iteration's gradients stay local."""
        return self._sync

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context mark_ready() only records local contributions and
        finalize() communicates nothing: gradients accumulate locally (write
        them with ``+=`` into the views, or pass them to mark_ready(), which then
        adds). The next synchronised iteration reduces the accumulated sums."""
        prev, self._sync = self._sync, False
        try:
            yield self
        finally:
            self._sync = prev

    def mark_ready(self, i: int, grad=None) -> None:
        """Declare parameter `i`'s gradient final for this iteration.

        With `grad`, it is first copied into the bucket (added, if parameter i
        already has a contribution since the last synchronisation, i.e. under
        no_sync), and finalize() copies the reduced result back into `grad`.
        When this completes a bucket, and all buckets before it were launched,
        its all_reduce (and that of any complete buckets after it) starts.
        """
        self._seal_retired()
        i = int(i)
        if not 0 <= i < len(self._specs):
            raise InvalidArgument(f"mark_ready: parameter index {i} out of range (0..{len(self._specs) - 1})")
        if self._sync and self._ready[i]:  # (before its grad is added: its bucket may be in flight)
            raise BucketerError(f"parameter {param_label(i, self._names)} was marked ready twice in one iteration",
                                rank=self._comm.rank)
        if grad is not None:
            (add_into if self._used[i] else copy_into)(self._views[i], grad)
            self._owned[i] = grad
        if not self._sync:
            self._used[i] = True
            return
        self._ready[i] = True
        self._used[i] = True
        if isinstance(self._views[i], HandedOut):
            # Final for this iteration: its bucket may reduce it any moment now,
            # and a later write would race that (finalize() makes it writable again).
            self._views[i].flags.writeable = False
        if self._rebuild_pending:
            self._observed.append(i)
        b = self._buckets[self._param_bucket[i]]
        b.pending -= 1
        if b.pending == 0:
            while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].pending == 0:
                self._launch(self._buckets[self._next_launch], status=0)
                self._next_launch += 1
        self._poll()

    def finalize(self) -> list:
        """End the iteration: launch what is left, wait for every bucket, and
        leave the reduced (averaged) gradients in the views. Returns grad_views().

        Under no_sync() it only ends the local iteration (no communication).
        Raises UnusedParametersError on every rank if some parameter never
        became ready on some rank (unless find_unused=True).
        """
        self._seal_retired()
        if not self._sync:
            return self.grad_views()
        t0 = time.perf_counter()
        self._launch_the_rest()
        try:
            self._wait_all()
        finally:
            self._record_iteration(t0)
        error = self._find_missing()
        owned = self._end_iteration()
        if error is not None:
            self._observed = []  # record again in the next (successful) iteration
            raise UnusedParametersError(error, dict(self.last_unused), rank=self._comm.rank)
        for i, g in owned.items():
            if family(g) == "torch" or getattr(g, "flags", None) is None or g.flags.writeable:
                copy_into(g, self._views[i])
        self._iteration += 1
        if self._rebuild_pending:
            self._rebuild()
        return self.grad_views()

    def _launch_the_rest(self) -> None:
        """Launch the buckets not launched yet, in order. Never-ready
        parameters with no contribution since the last sync are unused here:
        zero-fill them and flag the bucket, so the decision in
        _find_missing is collective."""
        for b in self._buckets[self._next_launch:]:
            missing = False
            for i in b.params:
                if not self._ready[i] and not self._used[i]:
                    zero(self._views[i])
                    missing = True
            self._launch(b, status=1 if missing else 0)
        self._next_launch = len(self._buckets)

    def _wait_all(self) -> None:
        try:
            for b in self._buckets:
                b.work.wait()
                if b.complete_t is None:
                    b.complete_t = time.perf_counter()
        except BaseException:
            # A failed bucket (a peer's timeout, an abort, Ctrl-C) fails the
            # communicator, so the others end at once too; they are waited
            # for so that no reduction still writes into the buckets, and the
            # iteration ends, so the next one is not refused as a repetition.
            for b in self._buckets:
                try:
                    b.work.wait()
                except BaseException:
                    pass
            self._observed = []
            self._end_iteration()
            raise

    def _find_missing(self) -> str | None:
        """Which parameters some rank never got ready (last_unused), and the
        error to raise about them (None: none, or find_unused)."""
        # Every rank sees the same reduced status slots, so takes the same branch.
        anyone_missing = any(item(b.flat[b.count]) != 0 for b in self._buckets)
        self.last_unused = {}
        if not anyone_missing:
            return None
        local = (self._ready | self._used).astype(np.int64)
        used = gather_rows(self._comm, local)           # (ranks, params)
        self.last_unused = {int(i): [int(r) for r in np.flatnonzero(used[:, i] == 0)]
                            for i in np.flatnonzero((used == 0).any(axis=0))}
        return None if self._find_unused else unused_message(self.last_unused, self._comm.size, self._names)

    def _end_iteration(self) -> dict:
        """Clear what one synchronised iteration marked; returns the
        caller-owned gradients given to mark_ready (index -> array)."""
        owned, self._owned = self._owned, {}
        for i in np.flatnonzero(self._ready):
            if isinstance(self._views[i], HandedOut):
                self._views[i].flags.writeable = True
        self._ready[:] = False
        self._used[:] = False
        for b in self._buckets:
            b.pending = len(b.params)
            b.work = None
        self._next_launch = self._next_complete = 0
        return owned

    def sync(self, grads: Sequence | None = None) -> list:
        """Convenience for trainers without overlap: mark every parameter ready
        (copying `grads` in if given) in reverse order, then finalize()."""
        for i in reversed(range(len(self._specs))):
            self.mark_ready(i, None if grads is None else grads[i])
        return self.finalize()

    # ---- timeline -----------------------------------------------------
    # ---- internals ----------------------------------------------------
    def _settings_row(self) -> list[int]:
        return [self._cap, self._first_cap, int(self._average), int(self._find_unused), int(self._rebuild_pending)]

    def _check_registration(self) -> None:
        check_registration(self._comm, self._specs, self._names, self._settings_row())

    def _assign(self, order: Sequence[int]) -> list[tuple[tuple, list[int]]]:
        return assign_buckets([((s.family, s.dtype, s.device), s.nbytes) for s in self._specs], order,
                              self._cap, self._first_cap)

    def _blocks_for(self) -> dict | None:
        """Zeroed flat blocks, one per (family, dtype, device), each big enough
        for its buckets in any layout (a status slot and padding per possible
        bucket). Ranks of one host get them in the shared arena, so the
        buckets' all_reduce runs zero copy.

        A rebuild lays torch buckets out again in the block they have (the
        views handed out move with them), and gives numpy buckets new blocks
        (the old views keep this iteration's result: train.handed). A new
        block comes from where the first did, or not at all (None: the layout
        stays), so a rebuild never trades zero copy for a better order.
        Collective: every rank decides alike."""
        keys: dict = {}  # key -> elements of the block (in first-parameter order: alike on every rank)
        for s in self._specs:
            k = (s.family, s.dtype, s.device)
            align = max(1, 64 // vocab.itemsize(s.dtype))
            keys[k] = keys.get(k, 0) + s.numel + align
        kept = {k: v for k, v in getattr(self, "_blocks", {}).items() if k[0] == "torch"}
        wanted = [(k, n) for k, n in keys.items() if k not in kept]
        shared = arena_zeros(self._comm, wanted) if wanted else []
        if self._in_arena is None:  # the first layout
            self._in_arena = shared is not None
        elif self._in_arena and shared is None:
            return None
        new = {k: shared[j] if shared is not None else zeros(k, n) for j, (k, n) in enumerate(wanted)}
        return {k: kept.get(k, new.get(k)) for k in keys}

    def _build(self, order: Sequence[int]) -> bool:
        """Lay the buckets out in `order` (in which blocks: _blocks_for).
        The views handed out before stay valid or fail loudly (train.handed):
        torch's are moved to the new place with their values, numpy's keep
        this iteration's values and are retired, since their memory is no
        longer the gradients. Returns False where the layout stayed."""
        layout = self._assign(order)
        blocks = self._blocks_for()
        if blocks is None:
            return False
        old = getattr(self, "_views", None)
        # (values by copy: a torch block is laid out again where it is)
        saved = None if old is None else [v.clone() if family(v) == "torch" else v for v in old]
        used = dict.fromkeys(blocks, 0)
        buckets, views = [], [None] * len(self._specs)
        param_bucket = np.empty(len(self._specs), dtype=np.int64)
        for bi, (key, idx) in enumerate(layout):
            offs, off = [], 0
            for i in idx:
                offs.append(off)
                off += self._specs[i].numel
            align = max(1, 64 // vocab.itemsize(key[1]))
            start = -(-used[key] // align) * align
            used[key] = start + off + 1
            b = _Bucket(bi, key, list(idx), offs, off, flat=blocks[key][start:start + off + 1], pending=len(idx))
            for i, o in zip(idx, offs):
                param_bucket[i] = bi
                views[i] = handout(flat_view(b.flat, o, self._specs[i].numel, self._specs[i].shape))
                if old is not None:
                    copy_into(views[i], saved[i])
                    views[i] = move(old[i], views[i])
            buckets.append(b)
        if old is not None:
            for i, v in enumerate(old):
                if v is not views[i]:
                    retire(v, f"GradBucketer.grad_views(): this is parameter {param_label(i, self._names)}'s "
                          f"gradient view from before the buckets were rebuilt (after iteration "
                          f"{self._iteration}): it is no longer the gradient. Fetch the live views with "
                          "bucketer.grad_views() after finalize() (they change once, at that rebuild).",
                       readable=True)  # (until the next iteration: it holds this one's average)
                self._retired.append(v)
        self._blocks, self._buckets, self._views, self._param_bucket = blocks, buckets, views, param_bucket
        return True

    def _seal_retired(self) -> None:
        """A new iteration begins: the views retired at the rebuild no longer
        hold anything the caller is owed."""
        if self._retired:
            for v in self._retired:
                seal(v)
            self._retired = []

    def _rebuild(self) -> None:
        """Once, after the first successful synchronised iteration: adopt rank 0's
        observed ready order (parameters never marked go last, in the default
        order) so the buckets fill in the order backward really produces them."""
        self._rebuild_pending = False
        seen = set(self._observed)
        order = self._observed + [i for i in reversed(range(len(self._specs))) if i not in seen]
        arr = np.array(order, dtype=np.int64)
        self._comm.broadcast(arr, root=0)
        self._observed = []
        order = [int(i) for i in arr]
        if [(k, v) for k, v in self._assign(order)] == [(b.key, b.params) for b in self._buckets]:
            return
        if self._build(order):
            self.layout_version += 1

    def _launch(self, b: _Bucket, status: int) -> None:
        op = averaging(b.flat[:b.count], b.key[1], self._n) if self._average else "sum"
        b.flat[b.count] = status
        b.launch_t = time.perf_counter()
        b.complete_t = None
        b.status = status
        b.work = self._comm.all_reduce(b.flat, op=op, async_op=True)

    def _poll(self) -> None:
        """Timestamp completions observed so far (buckets complete in launch order)."""
        now = None
        while self._next_complete < self._next_launch:
            b = self._buckets[self._next_complete]
            if not b.work.is_completed():
                break
            now = now or time.perf_counter()
            b.complete_t = now
            self._next_complete += 1

"""The Works the "ringcomm" process group hands torch: ``PendingWork`` (a
collective, or several, still running, with torch's wait/future semantics),
``DoneWork`` (a synchronous call already complete: as cheap as a Work can be)
and the ``Completer`` thread that settles futures in issue order."""

from __future__ import annotations

import collections
import datetime
import threading
import time

import torch
import torch.distributed as dist

from ..errors import WaitTimeout

__all__ = ["PendingWork", "DoneWork", "Completer"]


class PendingWork(dist.Work):
    """A collective's handle with torch's semantics.

    `pending`: Works still running, ringcomm's or other PendingWorks (the
    coalesced forms; their wait() raises their error); empty: complete;
    `finish`: run once after they all succeed (copy results back);
    `result`: what ``result()`` and the future return (a list of tensors);
    `source`: what ``source_rank()`` says (point-to-point: the peer, or a
    function giving the sender once a receive from any source has completed).
    """

    def __init__(self, completer: "Completer", pending: list, result: list, finish=None, source=-1):
        super().__init__()
        self._source = source
        self._completer = completer
        self._pending = pending
        self._result = result
        self._finish = finish
        self._error: BaseException | None = None
        self._done = not pending
        self._lock = threading.Lock() if pending else None  # only a running one is completed concurrently
        self._future = None
        if self._done and finish is not None:
            finish()

    def _complete(self) -> None:
        """Wait for the ringcomm work, then finish (idempotent; any thread)."""
        if self._done:
            return
        with self._lock:
            self._complete_locked()

    def _complete_locked(self) -> None:
        if self._done:
            return
        try:
            for w in self._pending:
                w.wait()
            if self._finish is not None:
                self._finish()
            if callable(self._source):
                self._source = self._source()
        except BaseException as exc:  # noqa: BLE001 - kept for wait()/the future
            self._error = exc
        self._pending, self._finish = [], None  # let go of the ringcomm Works (and their communicator)
        self._done = True

    # torch.distributed.Work API
    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Block until complete (results copied back) and raise its error if
        it failed. `timeout` (torch's; 0: none, the group's own deadline
        bounds it): raise WaitTimeout, a RuntimeError, once it has passed
        with the work still running (the work goes on, as with gloo)."""
        seconds = timeout.total_seconds() if timeout else 0.0
        if seconds > 0 and not self._done:
            deadline, pause = time.monotonic() + seconds, 1e-4
            while not self.is_completed():
                if time.monotonic() >= deadline:
                    raise WaitTimeout(f"ringcomm backend: work still running after {seconds:g} s (wait timeout)")
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """True once complete with the results in the caller's tensors (the
        copy back runs here when the collectives have just ended). Never
        blocks: False while another thread is completing it."""
        if self._done:
            return True
        if all(w.is_completed() for w in self._pending) and self._lock.acquire(blocking=False):
            try:
                self._complete_locked()
            finally:
                self._lock.release()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        if callable(self._source):
            self.wait()  # the sender is known once the receive has completed (then _source is an int)
        return self._source

    # torch's dist.recv(src=None) asks work._source_rank(): the C++ binding of
    # Work::sourceRank, which a Python Work cannot override (torch's
    # trampoline forwards only wait and get_future), so shadow it here.
    _source_rank = source_rank

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            fut = torch.futures.Future()
            self._future = fut
            if self._done:
                self._settle(fut)
            else:
                self._completer.add(self)
        return self._future

    def _settle(self, fut) -> None:
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)


class DoneWork(dist.Work):
    """The Work of a synchronous call that has already completed (the
    common dist.all_reduce(t) path: as cheap to make as a Work can be)."""

    def __init__(self, result: list):
        super().__init__()
        self._result = result

    def reuse(self, result: list) -> "DoneWork":
        """This Work again, for another completed call (only when nobody else
        holds it: ProcessGroupRingcomm._done_work)."""
        self._result = result
        return self

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        return self._result

    def synchronize(self) -> None:
        pass

    def source_rank(self) -> int:
        return -1

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


class Completer:
    """One thread per group that completes futures of async collectives in
    issue order (the order they complete in), so DDP's callbacks run as soon
    as each bucket is reduced, without blocking the caller."""

    def __init__(self, name: str):
        self._q: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._thread = None
        self._name = name

    def add(self, work: PendingWork) -> None:
        with self._cv:
            self._q.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._q:
                    self._cv.wait()
                work = self._q.popleft()
            work._complete()
            work._settle(work._future)

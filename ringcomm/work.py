"""Work: the handle of an asynchronous collective (``async_op=True``)."""

from __future__ import annotations

import time

from .errors import WaitTimeout

__all__ = ["Work"]


class Work:
    """Handle of an asynchronous collective (``async_op=True``).

    Collectives of one communicator complete in the order they were issued.
    The arrays involved are kept alive until the collective completes.

    On a GPU communicator (as torch.distributed with NCCL): ``wait()`` makes the
    caller's *current stream* wait for the result and returns without blocking
    the host on the GPU; ``synchronize()`` blocks the host until the result is
    there. Work queued on that stream after ``wait()`` sees the result.
    """

    def __init__(self, native, result, keep, stream_fn=None, engine=None, host_is_stream=False, on_failure=None):
        self._native = native
        self._result = result
        self._keep = keep
        self._stream_fn = stream_fn  # GPU arrays: () -> the caller's current stream
        self._engine = engine        # Ctrl-C aborts it; device collectives: hear of a peer's failure while waiting
        self._host_is_stream = host_is_stream  # emulated device: "make the caller wait" means block
        self._on_failure = on_failure  # (exception, arrays): the communicator keeps arrays a request may use

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
            if self._on_failure is not None:
                self._on_failure(exc, self._keep)
            raise
        if not done:
            raise WaitTimeout(f"collective #{self.seq} still running after {timeout} s", seq=self.seq)
        err = self._native.error()
        if err is not None:
            hold = self._native.hold()
            if hold is not None and hold.pending:
                err._hold = hold
            if self._on_failure is not None:
                self._on_failure(err, self._keep)
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

    def _done_with_arrays(self, progress: bool = False) -> bool:
        """Nothing (host or device) will touch this collective's arrays any more
        (`progress`: unused; the engine's worker progresses a collective)."""
        if not self._native.is_completed():
            return False
        hold = self._native.hold()
        if hold is not None and hold.pending:  # failed, with requests still in flight (quarantine)
            return False
        return not self._native.on_device or self._native.synchronize(0.0)


"""The files behind shared memory, and the hand-shake that maps one on every
rank of a host (the window, csrc/core/shm_window.h, and the arena).

The lowest rank creates a file in ``/dev/shm`` without a name
(``O_TMPFILE``, mode 0600), reserves it with ``posix_fallocate`` (a full
``/dev/shm`` is a clear error, or under ``auto`` a warning and MPI
point-to-point) and keeps it open while the others open it through its
descriptor (``/proc/<pid>/fd/<fd>``, checked by device and inode). A file
without a name lives only while a process has it open or mapped: a crash,
even a SIGKILL of every rank in the middle of ``init()``, leaves nothing in
``/dev/shm``. Only where a peer cannot reach the creator's ``/proc`` (another
pid namespace) does the file get a name for the rest of the hand-shake
(``ringcomm-...flock``), guarded by the creator's flock: a named file whose
lock is free has lost its creator, and every later hand-shake on the host
removes such files of its user (``csrc/transports/shm_segment.h``)."""

from __future__ import annotations

import contextlib
import getpass
import os
import secrets
import signal
import threading

from .._native import core
from ..errors import RingcommError

__all__ = ["share_segment", "map_window", "segment_name"]


def segment_name() -> str:
    """A name for a segment a peer could not open through /proc: the user,
    the job and a random nonce; ".flock" marks the names a creator's lock
    guards (the ones shm_sweep may remove)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    job = (os.environ.get("OMPI_MCA_orte_ess_jobid") or os.environ.get("PMIX_NAMESPACE")
           or os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or str(os.getpid()))
    safe = "".join(c if c.isalnum() else "_" for c in f"{user}-{job}")[:120]
    return f"/ringcomm-{safe}-{secrets.token_hex(6)}"


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM (torchrun's agent stopping the workers once one failed) ends
    a process at once, running no ``finally``: where the hand-shake had to
    name its segment (a peer in another pid namespace), the name would stay
    until a later hand-shake on the host swept it. Here it raises instead,
    so the name is removed, then the process ends by the signal as it would
    have. Only on the main thread, and only where SIGTERM has its default
    action (a handler of the caller's stays)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    class Terminated(BaseException):
        pass

    def handler(signum, frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ends the process here
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def share_segment(comm, nbytes: int, suffix: str, map_it) -> tuple:
    """The hand-shake of every shared segment (``nbytes`` bytes): rank 0
    creates its file, unnamed (``map_it(file, True)``), and tells the others
    its pid, descriptor, device and inode; they open it through
    ``/proc/<pid>/fd/<fd>`` and map it (``map_it(file, False)``); rank 0
    closes it once every rank has. Peers that cannot (another pid
    namespace) get a name instead, which rank 0 removes at the end.
    Collective over `comm`; returns (this rank's result or None, the first
    error of any rank or None)."""
    if type(comm).__module__.startswith("mpi4py"):
        # MPI's waits block in C, where a Python handler never runs: there
        # SIGTERM keeps its default action (mpirun's way of ending a job).
        return _share_segment_now(comm, nbytes, suffix, map_it)
    with _sigterm_unwinds():  # the store's waits poll in Python
        return _share_segment_now(comm, nbytes, suffix, map_it)


def _open_and_map(path: str, where: tuple, nbytes: int, rank: int, map_it):
    """A peer's side: open the creator's file at `path`, map it, close it."""
    f = core.ShmFile.open(path, where[2], where[3], nbytes, rank)
    try:
        return map_it(f, False)
    finally:
        f.close()


def _attempt(fn) -> tuple:
    """(fn(), None), or (None, the text of the RingcommError it raised)."""
    try:
        return fn(), None
    except RingcommError as e:
        return None, str(e)


class _Held:
    """What rank 0 holds during a hand-shake: the file, and the name it gave
    it (if it had to); release() lets both go."""

    def __init__(self):
        self.file = None
        self.name = None

    def create(self, nbytes: int, rank: int, map_it) -> tuple:
        """Rank 0's side: ((its mapping, where the peers find the file), None)
        or ((None, None), the error)."""
        # Named segments of this user whose creator died (a job killed
        # during its hand-shake) go first: nothing else removes them.
        core.shm_sweep()

        def make():
            self.file = core.ShmFile.create(nbytes, rank)
            got = map_it(self.file, True)
            return got, (os.getpid(), self.file.fd, self.file.dev, self.file.ino)
        made, err = _attempt(make)
        return made or (None, None), err

    def link(self, name: str, cannot: str) -> str | None:
        """Give the file `name` (from here a kill leaves the name until a
        later hand-shake on this host sweeps it: the file was locked before
        it was named, and the lock dies with rank 0); the error, or None."""
        self.name = name
        try:
            self.file.link(name)
        except RingcommError as e:
            self.name = None
            return f"{cannot} (through /proc), and naming the segment failed: {e}"
        return None

    def release(self) -> None:
        if self.name is not None:
            core.shm_remove(self.name)
        if self.file is not None:
            self.file.close()  # (and with it the lock)


def _share_segment_now(comm, nbytes: int, suffix: str, map_it) -> tuple:
    rank = comm.Get_rank()
    held = _Held()
    try:
        (got, where), err = held.create(nbytes, rank, map_it) if rank == 0 else ((None, None), None)
        where, err = comm.bcast((where, err), root=0)
        cannot = None  # why this peer could not open the file through /proc
        if err is None and rank != 0:
            got, cannot = _attempt(lambda: _open_and_map(f"/proc/{where[0]}/fd/{where[1]}", where, nbytes, rank,
                                                         map_it))
        # every rank has mapped it, or knows who has not
        cannots = [f"rank {q}: {c}" for q, c in enumerate(comm.allgather(cannot)) if c]
        if err is not None or not cannots:
            return (None, err) if err is not None else (got, None)
        return _share_by_name(comm, held, (got, where, cannot, cannots), nbytes, suffix, map_it)
    finally:
        # Every rank has mapped it (the allgathers), or the hand-shake failed
        # (a peer died or timed out, Ctrl-C): either way the name goes.
        held.release()


def _share_by_name(comm, held: _Held, state: tuple, nbytes: int, suffix: str, map_it) -> tuple:
    """The named way, for peers that could not open the file through /proc."""
    got, where, cannot, cannots = state
    rank = comm.Get_rank()
    err = held.link(segment_name() + suffix + ".flock", cannots[0]) if rank == 0 else None
    shared = comm.bcast(held.name, root=0)
    if cannot is not None and shared is not None:
        opened, e = _attempt(lambda: _open_and_map("/dev/shm" + shared, where, nbytes, rank, map_it))
        if e is None:
            got = opened
        else:
            err = f"rank {rank}: {e} (and through /proc: {cannot})"
    errors = [e for e in comm.allgather(err) if e]
    return (None, errors[0]) if errors else (got, None)


def map_window(comm, slot: int):
    """One window over the ranks of `comm` (one host): (window or None, error or None)."""
    n, rank = comm.Get_size(), comm.Get_rank()
    return share_segment(comm, core.shm_bytes(n, slot), "",
                         lambda f, create: core.shm_window(f, rank, n, slot, create))

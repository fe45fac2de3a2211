"""Fail fast: a rank that dies of an uncaught exception (or ``sys.exit`` with
an error) ends the MPI job in about a second instead of leaving its peers in
their collectives until ``RINGCOMM_TIMEOUT``.

Without this, the dying rank's interpreter runs its exit handlers and stops in
``MPI_Finalize``, which waits for every rank; the others wait in a collective
for the rank that will never call it. Here (mpi4py's ``python -m mpi4py``
convention, adapted to ringcomm's ring):

1. The failing rank sends a one-line reason ("rank 1: uncaught
   InvalidArgument: ...") to every peer of each live communicator, over a
   duplicate of the MPI communicator made by ``init()`` (so it never meets
   the user's messages or ringcomm's own), then aborts those communicators:
   the ring's ABORT notice reaches every waiting peer within one trip.
2. A peer that raises ``CommunicatorAborted`` picks up the reason, so its
   error names the failed rank *and* its exception (``explain``).
3. At exit, the failing rank and every peer that heard the reason meet in a
   nonblocking barrier on that duplicate; when all came, ``MPI_Finalize`` is
   quick and the job ends normally (non-zero status). A rank that does not
   come within ``GRACE`` seconds (busy outside ringcomm, stuck in an MPI call
   of its own) is not coming: ``MPI_Abort`` ends the job.

Triggers: ``sys.excepthook`` (installed by ``init()``, chained to the hook
found there), ``sys.exit(n)`` with n not 0 (``sys.exit`` is wrapped to note
the status; the abort happens in an ``atexit`` handler, so a ``SystemExit``
caught by the program changes nothing), and, exactly, the runner
``python -m ringcomm._failfast script.py|-m module|-c code ...``, which
``ringcomm run`` puts in front of every Python program: it also covers
``raise SystemExit(1)``, an excepthook the program replaced, and programs
that never create a ringcomm communicator but use MPI through mpi4py
(``MPI_Abort`` at once, as ``python -m mpi4py`` does).

A ``KeyboardInterrupt`` is a trigger too: Ctrl-C that lands in a ringcomm
wait aborts the communicator and tells the ring there, but one that lands
anywhere else (between two calls: most of the time in a loop of short ones)
raises in Python alone, and the peers would wait in their next call for a
rank that will never come. Its peers hear that the rank was interrupted.

Not triggers: errors ringcomm already reported around the ring (a
timeout, a mismatch: every peer has its named error), and exceptions that end
a thread other than the main one (``threading.excepthook`` is left alone: a
thread's death does not end the process, and the main thread may still finish
its collectives). ``RINGCOMM_FAILFAST=0`` turns it all off.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import time
import traceback
import weakref

GRACE = 2.0          # seconds the exit barrier waits for the other ranks before MPI_Abort
# How long a peer looks for the reason after an ABORT notice. The reason was
# sent before the notice, over the same connection, so it is normally there
# already; this bounds what an abort on purpose (comm.abort()) costs its peers.
PROBE_S = 0.002
_TAG = 0x5243        # tag of the reason message on the duplicate communicator
_MAX_REASON = 2000   # characters of the reason sent

# communicator -> its duplicate MPI communicator for reasons (size > 1), and
# the reasons heard on it by failed rank; weak, so a closed communicator goes
_comms: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_reasons: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_installed = False
_exit_status = 0      # noted by the sys.exit wrapper / the runner
_failed = False       # this rank started a fail-fast abort
_heard = []           # duplicates on which a reason arrived (their ranks meet at exit)
_told = []            # duplicates this rank sent its reason on (the communicator may be gone by exit)
_pending = []         # reason sends in flight (their buffers must live)


def enabled() -> bool:
    return os.environ.get("RINGCOMM_FAILFAST", "1") != "0"


# ------------------------------------------------------------- registration
def register(comm, mpi_comm) -> None:
    """Called by ``init()`` on every rank (collective): gives `comm` its
    duplicate for reasons and installs the hooks."""
    if mpi_comm.Get_size() < 2:
        return
    _comms[comm] = mpi_comm.Dup()
    install()


def install() -> None:
    global _installed
    if _installed or not enabled():
        return
    _installed = True
    previous = sys.excepthook

    def excepthook(etype, value, tb):
        try:
            previous(etype, value, tb)
        finally:
            # Without a live communicator only MPI_Abort is left to do,
            # and it waits for the exit handler (_at_exit: the interpreter
            # noted the exception in sys.last_value): a hook that chained
            # to this one may still hold the traceback (torch's prefixes
            # each line with the rank, printing after this returns).
            fail(_describe(value), _status_for(value), plain_mpi=False,
                 interrupted=issubclass(etype, KeyboardInterrupt))

    sys.excepthook = excepthook
    real_exit = sys.exit

    def exit(status=None):  # noqa: A001 - sys.exit's own name
        global _exit_status
        _exit_status = _status_of(status)
        real_exit(status)

    exit.__doc__ = real_exit.__doc__
    sys.exit = exit
    atexit.register(_at_exit)  # after comm.py's handler: runs before it (last in, first out)


# ---------------------------------------------------------------- the abort
def fail(reason: str, status: int = 1, plain_mpi: bool = True, interrupted: bool = False) -> None:
    """This rank is going down with `reason`: tell the peers of every live
    communicator why, and abort those communicators (the ring is told).
    `plain_mpi`: with no communicator at all, end an MPI job at once.
    `interrupted`: a KeyboardInterrupt (the peers hear "was interrupted")."""
    global _failed, _exit_status
    if _failed or not enabled():
        return
    live = [c for c in list(_comms) if not c.closed and not c.aborted]
    if not live:
        if not _comms and plain_mpi:
            _abort_plain_mpi(status)
        return  # already aborted: the ring was told by ringcomm itself
    _failed = True
    _exit_status = status or 1
    for c in live:
        dup = _comms[c]
        _told.append(dup)
        text = f"rank {c.rank}: {reason}"[:_MAX_REASON].encode("utf-8", "replace")
        for peer in range(c.size):
            if peer != c.rank:
                _pending.append((dup.Isend([text, _byte()], dest=peer, tag=_TAG), text))
    for c in live:
        try:
            c.abort(interrupted=interrupted)
        except Exception:  # noqa: BLE001 - best effort while dying
            pass


def explain(comm, exc) -> None:
    """`exc` (raised by `comm`) heard of an abort through the ring: add the
    failed rank's reason to its message, if that rank sent one."""
    from .errors import CommunicatorAborted
    dup = _comms.get(comm)
    if dup is None or not enabled() or not isinstance(exc, CommunicatorAborted) or exc.cause != "aborted":
        return
    if exc.origin is None or exc.origin == comm.rank or "interrupted" in str(exc):
        return
    key = (exc.origin,)
    cache = _reasons.setdefault(comm, {})
    if key not in cache:
        cache[key] = _receive(dup, exc.origin)
        if cache[key] is not None and dup not in _heard:
            _heard.append(dup)
    reason = cache[key]
    if reason and exc.args and reason not in exc.args[0]:
        exc.args = (f"{exc.args[0]}; it died of {reason}",) + exc.args[1:]


def _receive(dup, origin):
    from mpi4py import MPI
    status = MPI.Status()
    source = MPI.ANY_SOURCE if origin is None else origin
    deadline = time.monotonic() + PROBE_S
    while True:
        if dup.Iprobe(source=source, tag=_TAG, status=status):
            buf = bytearray(status.Get_count(MPI.BYTE))
            dup.Recv([buf, MPI.BYTE], source=status.Get_source(), tag=_TAG)
            return buf.decode("utf-8", "replace").split(": ", 1)[-1]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


def _at_exit() -> None:
    if not enabled():
        return
    if not _failed:
        last = getattr(sys, "last_value", None)  # an uncaught exception whose hook was replaced
        if _exit_status:
            fail(f"SystemExit({_exit_status})", _exit_status)
        elif last is not None:
            fail(_describe(last), _status_for(last), interrupted=isinstance(last, KeyboardInterrupt))
    for c, dup in list(_comms.items()):  # a reason that came after this rank's error was raised
        if not c.closed and c.aborted and dup not in _heard and _receive(dup, None) is not None:
            _heard.append(dup)
    dups = _told + _heard
    if not dups:
        return
    from mpi4py import MPI
    if MPI.Is_finalized():
        return
    reqs = [d.Ibarrier() for d in {id(d): d for d in dups}.values()]
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        if MPI.Request.Testall(reqs):
            MPI.Request.Waitall([r for r, _ in _pending])
            return  # every rank is on its way out: MPI_Finalize will be quick
        time.sleep(0.002)
    _flush()
    MPI.COMM_WORLD.Abort(_exit_status or 1)


def _abort_plain_mpi(status: int) -> None:
    """A program without ringcomm communicators that runs MPI on several
    ranks (the runner only): end the job as ``python -m mpi4py`` does."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() < 2:
        return
    _flush()
    mpi.COMM_WORLD.Abort(status or 1)


# ------------------------------------------------------------------ helpers
def _byte():
    from mpi4py import MPI
    return MPI.BYTE


def _flush() -> None:
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # noqa: BLE001
            pass


_INTERRUPTED = "interrupted (KeyboardInterrupt)"


def _describe(exc) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return _INTERRUPTED
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " | ")
    return f"uncaught {text}"


def _status_for(exc) -> int:
    return 130 if isinstance(exc, KeyboardInterrupt) else 1  # (128 + SIGINT, as a shell reports it)


def _status_of(status) -> int:
    if status is None:
        return 0
    if isinstance(status, int):
        return status
    return 1  # sys.exit("message") prints it and exits with 1


# ------------------------------------------------------------------- runner
def _warn_shadow(folder: str) -> None:
    """A folder named ringcomm/ next to the script (a checkout) can be what the
    script's `import ringcomm` finds instead of the installed package (with an
    editable install, whose finder comes after sys.path): say so."""
    here = os.path.join(folder, "ringcomm")
    real = os.path.dirname(os.path.realpath(__file__))
    if not os.path.isdir(here) or os.path.realpath(here) == real:
        return
    for finder in sys.meta_path:  # what `import ringcomm` would find in a fresh interpreter
        find = getattr(finder, "find_spec", None)
        spec = find("ringcomm", None) if find else None
        if spec is None:
            continue
        origin = spec.origin if spec.has_location else None
        if origin is None or os.path.dirname(os.path.realpath(origin)) != real:
            print(f"ringcomm: {here} shadows the installed ringcomm ({real}) for this script: `import ringcomm` "
                  "finds that folder (AttributeError: module 'ringcomm' has no attribute ...); run the script "
                  "from another folder", file=sys.stderr, flush=True)
        return


_PY_FLAGS_WITH_ARG = ("-W", "-X")


def wrap_argv(argv: list[str]) -> list[str]:
    """``ringcomm run``: the program's argv with the runner in front of a
    Python program (``python [flags] script.py|-m mod|-c code ...``); any
    other program is returned unchanged."""
    if not argv or not enabled():
        return list(argv)
    argv = list(argv)
    exe = os.path.basename(argv[0])
    if argv[0].endswith(".py"):
        argv.insert(0, "python")
    elif not (exe.startswith("python") or argv[0] == sys.executable):
        return argv
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-"):
        if argv[i] in _PY_FLAGS_WITH_ARG:
            i += 1
        i += 1
    if i >= len(argv) or argv[i] == "-":
        return argv  # interactive or stdin: nothing to wrap
    return argv[:i] + ["-m", "ringcomm._failfast"] + argv[i:]


def main(argv: list[str] | None = None) -> None:
    """``python -m ringcomm._failfast (script.py | -m module | -c code) [args]``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m ringcomm._failfast (script.py | -m module | -c code) [args...]")
    install()
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            _warn_shadow(sys.path[0])
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        status = _status_of(exc.code)
        if status:
            fail(f"SystemExit({exc.code!r})", status)
        raise
    except KeyboardInterrupt as exc:
        fail(_describe(exc), _status_for(exc), interrupted=True)
        raise
    except BaseException as exc:  # noqa: BLE001 - the point of the runner
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next  # the program's own frames only, as `python script.py` shows them
        exc.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc, tb)  # ours (chained to the one found) unless the program replaced it
        if not _failed:
            fail(_describe(exc), 1)
        sys.exit(1)


if __name__ == "__main__":
    # `python -m` runs this file as __main__, a second copy of the module:
    # run the copy init() registers communicators with.
    from ringcomm._failfast import main as _main
    _main()

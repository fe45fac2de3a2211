"""Making communicators: ``init`` over MPI (processes started by a launcher)
and ``run_local`` over in-process ranks (threads), and closing them at exit,
before MPI is finalized."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import threading
import time
import weakref
from typing import Callable

from . import config, quarantine, transports
from .comm import Communicator
from .transports import local_rank  # noqa: F401  (world.local_rank, as before)
from .errors import CommunicatorAborted, InvalidArgument, RingcommError, from_rank0

__all__ = ["init", "run_local", "local_rank"]

_mpi_comms: "weakref.WeakSet[Communicator]" = weakref.WeakSet()
_mpi_index = itertools.count(1)    # communicators made by init() in this process (same order on every rank)
_local_index = itertools.count(1)  # worlds made by run_local()
_store_index = itertools.count(1)  # communicators made by init() over a store
# store -> communicators made over it (_next_use)
_store_uses: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_store_uses_held: dict = {}  # id -> (store, uses): stores that take no weak reference


def _close_mpi_comms() -> None:
    # Runs before mpi4py finalizes MPI (atexit is last-in, first-out and we
    # register after importing mpi4py.MPI).
    for c in list(_mpi_comms):
        try:
            c.close()
        except RingcommError:
            pass


def init(mpi_comm=None, *, device: str | int | None = None, timeout: float | None = None,
         segment_bytes: int | str | None = None, window: int | None = None,
         transport: str | None = None, store=None, rank: int | None = None, size: int | None = None,
         bootstrap: str | None = None, jitter_us: float = 0.0) -> Communicator:
    """A communicator over the job's ranks: over MPI (COMM_WORLD unless
    `mpi_comm` is given) when an MPI launcher started the job, else over a
    store (ringcomm/bootstrap.py).

    store, rank, size: bootstrap through `store` (torch's TCPStore,
    FileStore or PrefixStore, or anything offering set/get/add/check), for
    processes no MPI launcher started; MPI is then never initialized.
    Messages go through UCX, collectives within a host through shared
    memory. Without `store`, under torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT set and no MPI launcher), the store is torchrun's, as
    torch's ``env://``. bootstrap: "auto" (default; also
    ``RINGCOMM_BOOTSTRAP``), "mpi" or "store".

    Collective over the MPI communicator: every rank must call it. ringcomm
    duplicates the communicator, so its messages never mix with yours.
    Requires MPI_THREAD_MULTIPLE (mpi4py's default).

    device: None (default) moves host memory with MPI point-to-point.
    "cuda" (GPU = this process's rank on its node; one GPU per rank) or a GPU
    ordinal: payload on that GPU (made the calling thread's current device), moved with NCCL point-to-point
    (ncclSend/ncclRecv) and reduced by ringcomm's kernels; control messages
    still go through MPI. Arrays must then be GPU arrays on that GPU.
    "emulated-nccl" (store launches only): that path's structure on a CPU,
    host arrays: control messages over UCX, the payload in NCCL-like groups
    on the emulated device (run_local's "emulated-nccl") over a second UCX
    worker, each queued operation delayed by up to `jitter_us`.

    transport (host memory): what ``algorithm="auto"`` uses between ranks
    of one host: "auto" (default; also ``RINGCOMM_TRANSPORT``): shared
    memory when every rank is on one host, else MPI point-to-point; "mpi":
    MPI point-to-point only; "shm": shared memory or an error (ringcomm.shm);
    "ucx": every message over UCX (ringcomm.ucx; needs libucx-cu13).
    """
    from . import bootstrap as boot
    if jitter_us and device != "emulated-nccl":  # (never dropped without a word)
        raise InvalidArgument("init(jitter_us=...) delays the emulated device's operations: it needs "
                              "device='emulated-nccl'")
    if boot.choose(store is not None, bootstrap) == "store":
        if mpi_comm is not None:
            raise InvalidArgument("init(): give either an MPI communicator or a store, not both")
        return _init_store(store, rank, size, timeout, segment_bytes, window, transport, device, jitter_us)
    if device == "emulated-nccl":
        raise InvalidArgument("device='emulated-nccl' needs a store launch (init(store=..., rank=..., size=...) or "
                              "torchrun); under MPI use run_local(n, fn, device='emulated-nccl')")
    if store is not None:
        raise InvalidArgument(
            "init(store=...) with RINGCOMM_BOOTSTRAP=mpi: choose one" if boot.mode(bootstrap) == "mpi" else
            "init(store=...) in a job an MPI launcher started: ringcomm bootstraps over MPI there (pass "
            "bootstrap='store' or set RINGCOMM_BOOTSTRAP=store to use the store)")
    if rank is not None or size is not None:  # (never dropped without a word)
        raise InvalidArgument("init(rank=..., size=...) needs store=... too (over MPI the rank and size are MPI's)")
    from . import _failfast, _singleton
    MPI = _singleton.mpi()  # starts MPI (as a singleton: without /dev/shm files)

    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    s = config.settings(timeout, segment_bytes, window, gpu=config.on_gpu(device))
    launch = transports.Launch(comm, "mpi", s, device)
    c = _assemble(transports.choose("mpi", device, transport), launch, transport, next(_mpi_index))
    _failfast.register(c, comm)  # a rank dying of an exception aborts c: its peers fail at once
    _singleton.notice_once(comm.Get_size())
    return c


def _assemble(row: transports.Transport, launch: transports.Launch, transport: str | None, index: int,
              keep=None) -> Communicator:
    """The communicator over `row`'s engine: what its ranks share (where the
    row may have a window; the engine between hosts is the row's too), the
    arena comm.empty() makes, rank 0's cost model for everyone (all ranks
    must make the same choices). `keep`: what the communicator keeps alive
    (a store bootstrap's group, hence its store)."""
    engine = row.engine(launch)
    group = launch.group
    shared = None
    if row.window:
        from . import shm
        shared = shm.attach(engine, group, transport, launch.settings,
                            lambda cross: row.engine(transports.Launch(cross, launch.bootstrap, launch.settings)))
    arena_maker = None
    if row.arena and shared == "shm":  # comm.empty() makes the shared arena over the bootstrap group
        arena_maker = lambda: shm.make_arena(engine.window, group)  # noqa: E731
    c = Communicator(engine, launch.settings, row.label, index=index, arena_maker=arena_maker, keep=keep)
    from .tuning import selection
    c.set_costs(from_rank0(group.bcast, group.Get_rank() == 0,
                           lambda: selection.costs_for(row.costs, group.Get_size()), "read the cost model"))
    from .cluster import ledger
    ledger.note_members(c, group)  # (an emulated cluster's launcher asked for the ledger)
    _mpi_comms.add(c)
    return c


def _next_use(store) -> int:
    """How many communicators this store object has made, this one included.
    Counted per object, held weakly: a store that goes is forgotten (a
    TCPStore's port is free again), and a new one starts at 1 on every rank
    alike. A store that takes no weak reference is held (its id must not
    be reused while counted)."""
    try:
        use = _store_uses.get(store, 0) + 1
        _store_uses[store] = use
    except TypeError:
        use = _store_uses_held.get(id(store), (store, 0))[1] + 1
        _store_uses_held[id(store)] = (store, use)
    return use


def _init_store(store, rank, size, timeout, segment_bytes, window, transport, device=None,
                jitter_us: float = 0.0) -> Communicator:
    """init() over a store: UCX between every pair of ranks, and the ranks'
    shared memory (one host, or the hierarchy across hosts); with a device,
    the payload over NCCL (its unique id through the store, as torch does)
    and the control messages over UCX."""
    from . import bootstrap as boot
    s = config.settings(timeout, segment_bytes, window, gpu=config.on_gpu(device))
    if store is None:
        if rank is not None or size is not None:
            raise InvalidArgument("init(rank=..., size=...) needs store=... too")
        if not boot.torchrun_env():
            raise InvalidArgument("RINGCOMM_BOOTSTRAP=store needs init(store=..., rank=..., size=...) or "
                                  "torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
        store, rank, size = boot.env_store(s.timeout)
    elif rank is None or size is None:
        raise InvalidArgument("init(store=...) needs rank= and size= too")
    if transports.mode(transport) == "mpi":
        raise InvalidArgument("RINGCOMM_TRANSPORT=mpi needs an MPI launch (mpirun); a store bootstrap moves "
                              "messages with UCX (transport auto, shm or ucx)")
    # Keys under a prefix per communicator made on this store object (every
    # rank makes them in the same order): two communicators never share keys.
    use = _next_use(store)
    group = boot.StoreGroup(store, rank, size, s.timeout, prefix=f"ringcomm/comm{use}")
    launch = transports.Launch(group, "store", s, device, jitter_us)
    return _assemble(transports.choose("store", device, transport), launch, transport, next(_store_index),
                     keep=group)


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
    comms = _local_comms(n, config.settings(timeout, segment_bytes, window, gpu=config.on_gpu(device)), device,
                         jitter_us)
    results: list = [None] * n
    errors: list = [None] * n

    def body(r: int) -> None:
        try:
            gpu = comms[r].gpu
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
        _stop_ranks(comms, threads)
        raise
    records = {r: c.flight_record() for r, c in enumerate(comms)}
    for c in comms:
        c.close()
    _raise_first(errors, records)
    return results


def _local_comms(n: int, s: config.Settings, device, jitter_us: float) -> list:
    """The n in-process ranks' communicators, each knowing its peers, with
    the cost model of auto."""
    row = transports.choose_local(device, n)
    engines = row.engine(transports.Launch(n, "local", s, device, jitter_us))
    if row.window:
        from . import shm
        shm.attach_local(engines)
    for e in engines:
        e.set_peers(engines)  # a timeout message then says what the awaited rank is doing
    index = next(_local_index)
    comms = [Communicator(e, s, row.label, index=index) for e in engines]
    from .tuning import selection
    costs = selection.costs_for(row.costs, n)
    for c in comms:
        c.set_costs(costs)
    return comms


def _stop_ranks(comms: list, threads: list) -> None:
    """Ctrl-C: every rank's collective fails at once. Ranks waiting in a
    collective end at once; a rank busy in its own code is not waited for
    (Ctrl-C must return promptly): its thread is a daemon, and its next
    collective raises CommunicatorAborted."""
    for c in comms:
        with contextlib.suppress(RingcommError):
            c.abort(wait=False)
    deadline = time.monotonic() + 0.15
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for c, t in zip(comms, threads):
        if not t.is_alive():
            c.close()


def _raise_first(errors: list, records: dict) -> None:
    """The lowest rank's exception (one other than CommunicatorAborted
    first), with every rank's flight records attached."""
    first = next((e for e in errors if e is not None and not isinstance(e, CommunicatorAborted)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        with contextlib.suppress(AttributeError, TypeError):
            first.flight_records = records
        raise first


def _at_exit() -> None:
    # Runs before mpi4py finalizes MPI (its hook runs after every atexit
    # handler and after module teardown).
    _close_mpi_comms()
    quarantine.drain_at_exit()


atexit.register(_at_exit)

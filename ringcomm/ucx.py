"""UCX between processes: the engine's messages over UCP tag matching
(csrc/transports/ucx_transport.h), for ``init(transport="ucx")`` or
``RINGCOMM_TRANSPORT=ucx``.

UCX is loaded at run time: the ``libucx-cu13`` wheel (``pip install
libucx-cu13``, or the ``ringcomm[ucx]`` extra) is preloaded here so that the
native layer's dlopen of ``libucp.so.0`` finds it; without the wheel, the
system's libucp is used if the loader finds one.

Any launcher works: the ranks only need an allgather to swap their UCP
worker addresses (under mpirun, mpi4py's ``comm.allgather``).
"""

from __future__ import annotations

import os

from ._native import core
from .errors import RingcommError

__all__ = ["load", "version", "available", "why_not", "make_engine"]


def load() -> None:
    """``RINGCOMM_SOCKET_IFNAME`` becomes UCX's ``UCX_NET_DEVICES`` (unless
    that is set: UCX's own variables win). Preload the libucx wheel's libraries, when that wheel is installed
    (its absence is not an error: the system's libucp may serve), unless a
    UCX is in the process already: Open MPI's wheel links its own into
    libmpi (loaded with ringcomm._core), and two copies in one process (two sets of memory
    hooks, libuct resolving to the other copy's libucs) crash."""
    ifname = os.environ.get("RINGCOMM_SOCKET_IFNAME")
    if ifname and "UCX_NET_DEVICES" not in os.environ:
        os.environ["UCX_NET_DEVICES"] = ifname  # read by UCX when the next worker's context is made
    if core.ucx_in_process():
        return
    try:
        import libucx
    except ImportError:
        return
    libucx.load_library()


def version() -> str:
    """UCX's version ("1.22.0"); raises TransportError when UCX cannot be loaded."""
    load()
    return core.ucx_version()


def why_not() -> str | None:
    """Why UCX cannot be used here (None: it can)."""
    try:
        version()
    except RingcommError as e:
        return str(e)
    return None


def available() -> bool:
    return why_not() is None


def make_engine(allgather, rank: int, size: int, settings, engine_maker=None, worker_maker=None):
    """An engine over UCX for this rank of `size`. Collective: every rank
    calls it; `allgather(obj) -> list` (in rank order) swaps the worker
    addresses. A rank that cannot make its worker says so to the others, so
    no rank waits for an address that never comes. `engine_maker(worker,
    addresses)` / `worker_maker()`: another module's (ringcomm._cuda: the
    payload over NCCL, the control messages over UCX)."""
    worker, addresses = exchange(allgather, rank, size, worker_maker)
    if engine_maker is not None:
        return engine_maker(worker, addresses)
    return core.ucx_engine(worker, addresses, rank, settings.timeout, settings.segment_bytes, settings.window)


def exchange(allgather, rank: int, size: int, worker_maker=None) -> tuple:
    """(this rank's new worker, every rank's worker address in rank order).
    Collective, as make_engine.

    A peer on another host (another host key: ringcomm/shm/host.py) gets
    only the address of this worker's network devices, so the two never
    share memory, even where UCX would find them on one kernel (an
    emulated cluster's namespaces, ``RINGCOMM_HOST_ID`` labels): what crosses
    hosts goes over the network, as between real machines, where that
    address is all the peer could use anyway."""
    from .shm.host import host_key
    load()
    worker, err = None, None
    try:
        worker = (worker_maker or core.ucx_worker)()
    except RingcommError as e:
        err = f"rank {rank}: {e}"
    got = allgather(err if worker is None else (host_key(), worker.address, worker.net_address))
    if len(got) != size:
        raise RingcommError(f"UCX address exchange returned {len(got)} entries for {size} ranks")
    failed = [a for a in got if not isinstance(a, tuple)]
    if failed:
        raise RingcommError(f"cannot use UCX: {failed[0]}")
    here = got[rank][0]
    return worker, [full if key == here else net for key, full, net in got]

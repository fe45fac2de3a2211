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

from ._native import core
from .errors import RingcommError

__all__ = ["load", "version", "make_engine"]


def load() -> None:
    """Preload the libucx wheel's libraries, when that wheel is installed
    (its absence is not an error: the system's libucp may serve), unless a
    UCX is in the process already: Open MPI's wheel links its own into
    libmpi (loaded with ringcomm._core), and two copies in one process (two sets of memory
    hooks, libuct resolving to the other copy's libucs) crash."""
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


def make_engine(allgather, rank: int, size: int, settings):
    """An engine over UCX for this rank of `size`. Collective: every rank
    calls it; `allgather(obj) -> list` (in rank order) swaps the worker
    addresses. A rank that cannot make its worker says so to the others, so
    no rank waits for an address that never comes."""
    load()
    worker, err = None, None
    try:
        worker = core.ucx_worker()
    except RingcommError as e:
        err = f"rank {rank}: {e}"
    got = allgather(err if worker is None else worker.address)
    if len(got) != size:
        raise RingcommError(f"UCX address exchange returned {len(got)} entries for {size} ranks")
    failed = [a for a in got if not isinstance(a, bytes)]
    if failed:
        raise RingcommError(f"cannot use UCX: {failed[0]}")
    return core.ucx_engine(worker, list(got), rank, settings.timeout, settings.segment_bytes, settings.window)

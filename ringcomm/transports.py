"""The transports a communicator's engine can run over, as one table: what
makes the engine under each bootstrap, and what the transport can do.

``world.init`` picks the row (``choose``) from how the job was launched
(MPI or a store), the device and ``RINGCOMM_TRANSPORT``, makes the engine
with the row's factory and assembles the Communicator once. Adding a
transport: its engine (csrc/transports/), a row here, and where ``choose``
picks it.

``RINGCOMM_TRANSPORT`` (``mode``) chooses what ``algorithm="auto"`` uses
between ranks of one host: ``auto`` (default: shared memory when every rank
of the communicator is on one host, else point-to-point), ``mpi`` (never
shared memory: no segment is made), ``shm`` (shared memory, or an error when
the ranks are not on one host) or ``ucx`` (every message over UCX, no shared
memory: ringcomm/ucx.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from ._native import core
from .errors import InvalidArgument

__all__ = ["MODES", "mode", "Transport", "TRANSPORTS", "Launch", "choose", "choose_local", "local_rank", "gpu_for"]

MODES = ("auto", "mpi", "shm", "ucx")  # ucx: the engine's messages over UCX, no window (ringcomm/ucx.py)


def mode(value: str | None = None) -> str:
    """``RINGCOMM_TRANSPORT`` (or `value`, which wins), checked."""
    m = (value or os.environ.get("RINGCOMM_TRANSPORT") or "auto").strip().lower()
    if m not in MODES:
        raise InvalidArgument(f"RINGCOMM_TRANSPORT must be one of {', '.join(MODES)}, got {m!r}")
    return m


@dataclass
class Launch:
    """What a factory makes an engine from: the ranks' bootstrap group (an
    MPI communicator, or a store group: ringcomm/bootstrap.py; for "local",
    the number of rank threads), how they were launched ("mpi", "store" or
    "local": run_local), the settings, the device and its jitter."""
    group: object
    bootstrap: str
    settings: object
    device: object = None
    jitter_us: float = 0.0


@dataclass(frozen=True)
class Transport:
    """One row: `label` names the communicator's transport (comm.transport),
    `costs` the cost model auto starts from (selection.costs_for), `memory`
    where payload lives ("host" or "device"); `window`: the ranks of one host
    may share a window (and, across hosts, the hierarchy; ringcomm/shm),
    `arena`: comm.empty()'s shared arena then; `between_hosts`: it carries
    messages between machines. `make`: per bootstrap ("mpi", "store", or
    "local": every rank's engine at once), the factory, f(Launch)."""
    label: str
    costs: str
    memory: str
    window: bool
    arena: bool
    between_hosts: bool
    make: dict = field(default_factory=dict)

    def engine(self, launch: Launch):
        return self.make[launch.bootstrap](launch)


def _mpi_handle(group):
    from mpi4py import MPI
    return MPI._handleof(group)


def _mpi_engine(launch: Launch):
    s = launch.settings
    return core.mpi_engine(_mpi_handle(launch.group), s.timeout, s.segment_bytes, s.window)


def _ucx_engine(launch: Launch):
    from . import ucx
    g = launch.group
    return ucx.make_engine(g.allgather, g.Get_rank(), g.Get_size(), launch.settings)


def _nccl_engine_mpi(launch: Launch):
    from . import cuda
    cuda.require()
    comm, s, device = launch.group, launch.settings, launch.device
    local, on_node = local_rank(comm, with_size=True) if device == "cuda" else (0, 1)
    gpu = gpu_for(device, local, on_node)
    engine = cuda._cuda.nccl_engine(_mpi_handle(comm), gpu, s.timeout, s.segment_bytes, s.window)
    cuda._cuda.set_device(gpu)  # this process's arrays belong there (cupy and torch follow it)
    return engine


def _nccl_engine_store(launch: Launch):
    """NCCL's unique id through the store, as torch does; control messages over UCX."""
    from . import cuda, ucx
    from .errors import from_rank0
    from .shm.host import host_key
    group, s = launch.group, launch.settings
    keys = group.allgather(host_key())
    mine = [r for r, k in enumerate(keys) if k == keys[group.rank]]
    gpu = gpu_for(launch.device, mine.index(group.rank), len(mine))
    uid = from_rank0(group.bcast, group.rank == 0, lambda: bytes(cuda._cuda.nccl_unique_id()),
                     "make NCCL's unique id")
    engine = ucx.make_engine(group.allgather, group.rank, group.size, s,
                             lambda w, addresses: cuda._cuda.nccl_engine_ucx(
                                 w, addresses, group.rank, gpu, uid, s.timeout, s.segment_bytes, s.window),
                             worker_maker=cuda._cuda.ucx_worker)
    cuda._cuda.set_device(gpu)
    return engine


def _emulated_nccl_engine(launch: Launch):
    """The GPU store launch's structure on a CPU: control messages over UCX,
    the payload in NCCL-like groups on the emulated device's transfer queue
    over a second UCX worker (whose addresses go through the store where
    NCCL's unique id would)."""
    from . import ucx
    group, s, jitter_us = launch.group, launch.settings, float(launch.jitter_us)
    payload, payload_addresses = ucx.exchange(group.allgather, group.rank, group.size)
    return ucx.make_engine(group.allgather, group.rank, group.size, s,
                           lambda w, addresses: core.ucx_emulated_nccl_engine(
                               w, addresses, payload, payload_addresses, group.rank, s.timeout, s.segment_bytes,
                               s.window, jitter_us))


def _inproc_engines(launch: Launch):
    """n rank threads of this process (launch.group: n), over host memory
    or the emulated device ("emulated": each copy and reduction queued,
    delayed by up to jitter_us)."""
    n, s = launch.group, launch.settings
    world = core.inproc_world(n)
    return [core.inproc_engine(world, r, s.timeout, s.segment_bytes, s.window, launch.device == "emulated",
                               float(launch.jitter_us)) for r in range(n)]


def _inproc_emulated_nccl_engines(launch: Launch):
    """The NCCL transport's grouping over the emulated device: a control world and a payload world."""
    n, s = launch.group, launch.settings
    control, payload = core.inproc_world(n), core.inproc_world(n)
    return [core.inproc_engine(control, r, s.timeout, s.segment_bytes, s.window, True, float(launch.jitter_us),
                               payload) for r in range(n)]


def _inproc_cuda_engines(launch: Launch):
    """Rank r on GPU r % (number of GPUs), or on the GPU the list names."""
    from . import cuda
    cuda.require()
    n, s, device = launch.group, launch.settings, launch.device
    count = cuda.device_count()
    gpus = [r % count for r in range(n)] if device == "cuda" else [int(g) for g in device]
    bad = [g for g in gpus if not 0 <= g < count]
    if bad:
        raise InvalidArgument(f"GPU(s) {bad} do not exist here ({count} GPU(s))")
    return cuda._cuda.inproc_engines(gpus, s.timeout, s.segment_bytes, s.window)


TRANSPORTS: dict[str, Transport] = {
    "mpi": Transport("mpi", "mpi", "host", window=True, arena=True, between_hosts=True,
                     make={"mpi": _mpi_engine}),
    "ucx": Transport("ucx", "ucx", "host", window=True, arena=True, between_hosts=True,
                     make={"mpi": _ucx_engine, "store": _ucx_engine}),
    "nccl": Transport("nccl", "nccl", "device", window=False, arena=False, between_hosts=True,
                      make={"mpi": _nccl_engine_mpi, "store": _nccl_engine_store}),
    "emulated-nccl": Transport("ucx(emulated-nccl)", "ucx", "host", window=False, arena=False, between_hosts=True,
                               make={"store": _emulated_nccl_engine}),
    # run_local's ranks (threads): the "local" bootstrap makes every rank's engine at once. The window is
    # plain memory there, its arena made with it (auto uses it only with RINGCOMM_TRANSPORT=shm).
    "inproc": Transport("inproc", "inproc", "host", window=True, arena=True, between_hosts=False,
                        make={"local": _inproc_engines}),
    "inproc(emulated)": Transport("inproc(emulated)", "inproc(emulated)", "host", window=False, arena=False,
                                  between_hosts=False, make={"local": _inproc_engines}),
    "inproc(emulated-nccl)": Transport("inproc(emulated-nccl)", "inproc(emulated-nccl)", "host", window=False,
                                       arena=False, between_hosts=False, make={"local": _inproc_emulated_nccl_engines}),
    "inproc(cuda)": Transport("inproc(cuda)", "inproc(cuda)", "device", window=False, arena=False,
                              between_hosts=False, make={"local": _inproc_cuda_engines}),
}


def choose(bootstrap: str, device, transport: str | None) -> Transport:
    """The row init() runs: by the device, else by RINGCOMM_TRANSPORT under
    MPI (UCX moves every message with ``ucx``; MPI then only swaps the
    addresses), UCX under a store."""
    if device == "emulated-nccl":
        return TRANSPORTS["emulated-nccl"]
    if device is not None:
        return TRANSPORTS["nccl"]
    if bootstrap == "store" or mode(transport) == "ucx":
        return TRANSPORTS["ucx"]
    return TRANSPORTS["mpi"]


def choose_local(device, n: int) -> Transport:
    """The row run_local(n, ...) runs for `device`."""
    if device is None:
        return TRANSPORTS["inproc"]
    if isinstance(device, str) and device in ("emulated", "emulated-nccl"):
        return TRANSPORTS[f"inproc({device})"]
    if device == "cuda" or isinstance(device, (list, tuple)) and len(device) == n:
        return TRANSPORTS["inproc(cuda)"]
    raise InvalidArgument(f"device must be None, 'emulated', 'cuda' or a list of {n} GPU ordinals, got {device!r}")


def local_rank(comm, with_size: bool = False):
    """This process's index among the ranks of `comm` on the same node
    (and how many they are, with `with_size`)."""
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return (node.Get_rank(), node.Get_size()) if with_size else node.Get_rank()
    finally:
        node.Free()


def gpu_for(device, local: int, on_node: int) -> int:
    """The GPU ordinal `device` means for the rank `local` of `on_node` on its host (NCCL: one GPU per rank)."""
    from . import cuda
    cuda.require()
    if device == "cuda":
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
    return gpu

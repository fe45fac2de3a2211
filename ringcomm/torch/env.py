"""Launch: torch's launcher variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, ...) filled from MPI, so ``init_process_group`` works in a job
that mpirun (or ``ringcomm run``) started."""

from __future__ import annotations

import os
import socket

from ..errors import from_rank0

__all__ = ["launcher_env"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launcher_env() -> None:
    """Fill torch's launcher variables from MPI, in an MPI job.

    RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE come from Open MPI's
    environment (no MPI call), overriding values inherited from the launching
    shell (which would be the same on every rank). MASTER_ADDR/MASTER_PORT
    (torch's TCPStore, also used by other backends such as a gloo subgroup),
    where missing: rank 0's address and a free port there, broadcast over
    MPI (a collective: every rank imports ringcomm.torch). ``ringcomm run``
    starts every job without inherited MASTER_ADDR/MASTER_PORT, so each job
    gets its own. Outside MPI nothing is changed (launch a single process
    with ``ringcomm run -n 1``).
    """
    env = os.environ
    if "OMPI_COMM_WORLD_SIZE" not in env:
        return
    from .. import bootstrap
    if "TORCHELASTIC_RUN_ID" in env and bootstrap.launcher_disagrees(env):
        # torchrun started this process (under an agent that mpirun started:
        # `mpirun -np NODES torchrun ...`): its RANK and WORLD_SIZE stand.
        return
    for var, src in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                     ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")):
        if src in env:
            env[var] = env[src]
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return
    if int(env["OMPI_COMM_WORLD_SIZE"]) > 1:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        hosts = world.allgather(socket.gethostname())

        def rendezvous():
            addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(socket.gethostname())
            return addr, _free_port()
        addr, port = from_rank0(world.bcast, world.rank == 0, rendezvous, "choose MASTER_ADDR and MASTER_PORT")
    else:
        addr, port = "127.0.0.1", _free_port()
    env.setdefault("MASTER_ADDR", addr)
    env.setdefault("MASTER_PORT", str(port))

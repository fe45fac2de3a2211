"""How the ranks of a job find each other: MPI, or a key-value store.

Two modes (``RINGCOMM_BOOTSTRAP=auto|mpi|store``, or ``init(store=...)``):

* **mpi**: a launcher that speaks MPI started the job (``mpirun``,
  ``ringcomm run``, ``srun --mpi=pmix``): its variables are set and
  ``MPI_COMM_WORLD`` holds the ranks. Messages go through MPI point-to-point
  (or UCX with ``RINGCOMM_TRANSPORT=ucx``), shared memory within a host.
* **store**: anything else that hands every process its rank, the size and a
  store: torchrun and TorchElastic (``init_process_group`` passes the
  backend its c10d store, already scoped per group and per restart), or
  ``ringcomm.init(store=..., rank=..., size=...)`` with any store offering
  ``set``/``get``/``add``/``check``/``delete_key`` (torch's ``TCPStore``,
  ``FileStore``, ``PrefixStore``). MPI is never initialized in this mode and
  ``mpi4py`` never imported: messages go through UCX, shared memory within a
  host, and the store carries only the bootstrap (worker addresses, where
  the shared segments are, the cost model), never a collective's data.

``auto`` (the default) is mpi when MPI's launcher variables are present (and,
where torchrun's are too, give the same rank and size: workers of ``srun`` +
torchrun inherit the agent's PMI variables), else store when a store is
given or torchrun's variables are set (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), else a one-rank MPI job (a plain
``python script.py``).

:class:`StoreGroup` gives the store the few collectives a bootstrap needs
(allgather, broadcast, barrier, split), with the names mpi4py uses so that the
shared-memory hand-shake (ringcomm/shm/segment.py) runs over either. Every call takes
the next sequence number of its group, so calls never read each other's keys;
the last rank to read a call's keys deletes them, so a long job (many
``new_group`` calls) leaves nothing in the store.
"""

from __future__ import annotations

import datetime
import os
import pickle
import time

from .errors import CollectiveTimeout, InvalidArgument, RingcommError

__all__ = ["MODES", "mode", "choose", "StoreGroup", "torchrun_env", "env_store"]

MODES = ("auto", "mpi", "store")

# Set by torchrun / TorchElastic (and by torch's env:// convention) for each worker.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def mode(value: str | None = None) -> str:
    m = (value or os.environ.get("RINGCOMM_BOOTSTRAP") or "auto").strip().lower()
    if m not in MODES:
        raise InvalidArgument(f"RINGCOMM_BOOTSTRAP must be one of {', '.join(MODES)}, got {m!r}")
    return m


def torchrun_env(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return all(v in env for v in TORCHRUN_VARS)


def choose(store_given: bool, value: str | None = None, environ=None) -> str:
    """"mpi" or "store" for this process (see the module's text)."""
    from ._singleton import launched
    m = mode(value)
    if m != "auto":
        return m
    if launched(environ) and not launcher_disagrees(environ):
        return "mpi"
    if store_given or torchrun_env(environ):
        return "store"
    return "mpi"


def launcher_disagrees(environ=None) -> bool:
    """An MPI launcher's variables that do not describe torchrun's world:
    inherited by workers that torchrun started (``srun`` + torchrun, which
    sets PMI_* or PMIX_* for the agent it started). Those workers are no
    MPI job: the store it is."""
    env = os.environ if environ is None else environ
    if not torchrun_env(env):
        return False
    rank = next((env[v] for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK") if v in env), None)
    size = next((env[v] for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if v in env), None)
    return (rank is not None and rank.strip() != env["RANK"].strip()) or \
        (size is not None and size.strip() != env["WORLD_SIZE"].strip())


_env_inits = 0


def env_store(timeout: float):
    """(store, rank, size) from torchrun's variables, as torch's ``env://``:
    a client of the agent's store under TorchElastic (TORCHELASTIC_USE_AGENT_STORE),
    else rank 0 hosts it on MASTER_PORT. Scoped per restart attempt and per
    call (every rank calls init() in the same order)."""
    global _env_inits
    _env_inits += 1
    import torch.distributed as dist
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                          is_master=(rank == 0 and not agent), timeout=datetime.timedelta(seconds=timeout),
                          wait_for_workers=False)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"ringcomm/attempt{attempt}/init{_env_inits}", store), rank, size


class StoreGroup:
    """Ranks 0..size-1 meeting in a store under `prefix`: the bootstrap's
    collectives, mpi4py-style names. Every rank of the group must make the
    same calls in the same order (as with MPI)."""

    def __init__(self, store, rank: int, size: int, timeout: float, prefix: str = "ringcomm"):
        if not 0 <= int(rank) < int(size):
            raise InvalidArgument(f"rank must be in [0, size), got rank {rank} of size {size}")
        for m in ("set", "get", "add", "check"):
            if not callable(getattr(store, m, None)):
                raise InvalidArgument(f"the store must offer set/get/add/check (torch's TCPStore, FileStore, "
                                      f"PrefixStore); {type(store).__name__} has no {m}()")
        self.store, self.rank, self.size = store, int(rank), int(size)
        self.timeout, self.prefix = float(timeout), prefix
        self._seq = 0

    # mpi4py's names, for the code shared with the MPI bootstrap
    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Free(self) -> None:  # noqa: N802 - nothing to free: keys are deleted as they are read
        pass

    def _next(self) -> str:
        self._seq += 1
        return f"{self.prefix}/{self._seq}"

    def _wait(self, keys: list, ranks: list, what: str) -> None:
        # check() polls without blocking: a long store.wait() would hold off
        # Ctrl-C, and short ones make torch log a warning at every expiry.
        deadline = time.monotonic() + self.timeout
        pause = 0.0005
        while True:
            try:
                if self.store.check(keys):
                    return
            except RuntimeError as e:
                raise RingcommError(f"ringcomm bootstrap ({what}, rank {self.rank}): the store failed: {e}") from e
            if time.monotonic() >= deadline:
                missing = [r for k, r in zip(keys, ranks) if not self.store.check([k])]
                raise CollectiveTimeout(
                    f"ringcomm bootstrap ({what}, rank {self.rank} of {self.size}): rank(s) {missing} did not "
                    f"arrive within {self.timeout:g} s (the group's timeout): did they start, and do all ranks "
                    "make the same calls?")
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def _done(self, base: str, keys: list) -> None:
        # The last rank to have read a call's keys deletes them.
        if self.store.add(base + "/read", 1) == self.size:
            delete = getattr(self.store, "delete_key", None)
            if delete is not None:
                for k in keys + [base + "/read"]:
                    delete(k)

    def allgather(self, obj) -> list:
        base = self._next()
        keys = [f"{base}/{r}" for r in range(self.size)]
        self.store.set(keys[self.rank], pickle.dumps(obj))
        self._wait(keys, list(range(self.size)), "allgather")
        out = [obj if r == self.rank else pickle.loads(self.store.get(k)) for r, k in enumerate(keys)]
        self._done(base, keys)
        return out

    def bcast(self, obj, root: int = 0):
        base = self._next()
        key = f"{base}/{root}"
        if self.rank == root:
            self.store.set(key, pickle.dumps(obj))
        else:
            self._wait([key], [root], f"broadcast from rank {root}")
            obj = pickle.loads(self.store.get(key))
        self._done(base, [key])
        return obj

    def barrier(self) -> None:
        self.allgather(None)

    def Split(self, color: int, key: int = 0) -> "StoreGroup":  # noqa: N802
        """The ranks with the same `color`, ordered by (key, rank): a new group."""
        split = self._seq + 1
        everyone = self.allgather((color, key, self.rank))
        members = sorted((k, r) for c, k, r in everyone if c == color)
        rank = [r for _, r in members].index(self.rank)
        return StoreGroup(self.store, rank, len(members), self.timeout, f"{self.prefix}/split{split}-{color}")

    def Create_group(self, ranks: list) -> "StoreGroup":  # noqa: N802
        """A group of `ranks` (this rank among them), in that order; collective over those ranks only."""
        ranks = [int(r) for r in ranks]
        return StoreGroup(self.store, ranks.index(self.rank), len(ranks), self.timeout,
                          f"{self.prefix}/group-" + "-".join(map(str, ranks)))

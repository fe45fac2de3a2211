"""Giving an engine what its ranks share: the window of one host, or the
hierarchy across hosts (this host's window and an engine between the hosts),
with the limits auto decides the window by (ringcomm/policy.py)."""

from __future__ import annotations

import warnings

from .._native import core
from ..errors import InvalidArgument, RingcommError, from_rank0
from ..transports import mode
from .. import policy
from .host import host_key, host_name, host_names, process_identity, say_if_split_scheduling, sched_group
from .segment import map_window

__all__ = ["attach", "attach_mpi", "attach_local"]


def attach(engine, comm, transport: str | None, settings, make_between) -> str | None:
    """Give `engine` what its ranks share: one window when every rank is on
    one host ("shm"); on several hosts with the same number (>= 2) of ranks
    each, this host's window and an engine between the hosts, for the
    hierarchical all_reduce ("hierarchical"). `comm`: the ranks' bootstrap
    group, an MPI communicator or a store group (ringcomm/bootstrap.py);
    `make_between(group)`: an engine over a sub-group (the ranks with the same
    local index), over the same kind of transport as `engine`. Hierarchical
    reduce_scatter and all_gather run too where each local index's ranks grow
    from host to host (blocked or round-robin placement). Where no window
    watches the ranks of this host (transport "ucx", or no window could be
    made), the engine watches their pids: a peer process that exits is
    named within a slice, not at the deadline. On several hosts, a
    failure's text names the hosts of the ranks it is about
    (Engine::name_hosts). Collective over `comm`. Returns which, or None."""
    m = mode(transport)
    n = comm.Get_size()
    if m == "mpi" or n == 1:
        return None
    got = comm.allgather((host_key(), sched_group(), process_identity(), host_name()))
    keys = [g[0] for g in got]
    if len(set(keys)) > 1:
        engine.set_hosts(host_names(keys, [g[3] for g in got]))
    got = [g[:3] for g in got]
    how = None if m == "ucx" else _attach_shared(engine, comm, m, got, make_between)
    if how is None:
        # No window watches this host's ranks: the engine does, by pid.
        # (host_key alone may be RINGCOMM_HOST_ID: the boot id too)
        me = comm.Get_rank()
        here = (got[me][0], *got[me][2][:2])
        engine.watch_processes([proc[2] if (key, *proc[:2]) == here and q != me else 0
                                for q, (key, _, proc) in enumerate(got)])
    return how


def attach_mpi(engine, comm, transport: str | None = None, settings=None) -> str | None:
    """:func:`attach` over the MPI communicator `comm` (the engine between
    hosts over MPI point-to-point)."""
    def between(cross):
        from mpi4py import MPI
        return core.mpi_engine(MPI._handleof(cross), settings.timeout, settings.segment_bytes, settings.window)
    return attach(engine, comm, transport, settings, between)


def _attach_shared(engine, comm, m, got, make_between) -> str | None:
    n = comm.Get_size()
    keys = [k for k, _, _ in got]
    order = list(dict.fromkeys(keys))
    slot = policy.slot_bytes()
    here = [q for q in range(n) if keys[q] == keys[comm.Get_rank()]]  # this host's ranks
    if len(order) == 1:
        how = _attach_window(engine, comm, m, slot)
    else:
        how = _attach_hosts(engine, comm, keys, order, slot, m, make_between)
    if how:
        say_if_split_scheduling([got[q][1] for q in here], here[0] == comm.Get_rank())
    return how


def _attach_window(engine, comm, m, slot) -> str | None:
    """Every rank on one host: one window."""
    n = comm.Get_size()
    window, err = map_window(comm, slot)
    if err:
        if m == "shm":
            raise RingcommError("RINGCOMM_TRANSPORT=shm, but the shared-memory window failed: " + err)
        warnings.warn("ringcomm: no shared memory between the ranks of this host, using point-to-point "
                      "messages: " + err, RuntimeWarning, stacklevel=5)
        return None
    # Rank 0's limits for everyone: every rank must choose alike. Single
    # copy where every rank can read every peer's memory (the kernel may
    # refuse: ptrace restrictions, seccomp).
    readable = all(comm.allgather(window.probe_single_copy()))
    lim = from_rank0(comm.bcast, comm.Get_rank() == 0, lambda: policy.auto_limits(n, readable),
                     "choose the shared-memory window's limits")
    window.single_copy_min = lim["single_copy_min"]
    window.single_copy_min_4k = lim["single_copy_min_4k"]
    engine.attach_window(window, True, lim["flat_max"])
    engine.set_shm_auto(True, lim["flat_max"], lim["max"], lim["from"])
    return "shm"


def _attach_hosts(engine, comm, keys, order, slot, m, make_between) -> str | None:
    """Ranks on several hosts: the hierarchy where every host has as many (>= 2)."""
    n = comm.Get_size()
    per_host = [keys.count(k) for k in order]
    if len(set(per_host)) != 1 or per_host[0] < 2:
        if m == "shm":
            raise InvalidArgument(f"RINGCOMM_TRANSPORT=shm, but the {n} ranks are on {len(order)} hosts with "
                                  f"{per_host} ranks: shared memory across hosts needs the same number (at least "
                                  "2) on every host (use auto or mpi)")
        return None
    return _attach_hierarchy(engine, comm, keys, order, slot, m, make_between)


def _attach_hierarchy(engine, comm, keys, order, slot, m, make_between) -> str | None:
    from ..tuning import selection
    rank = comm.Get_rank()
    host = order.index(keys[rank])
    local = comm.Split(host, rank)
    cross = comm.Split(local.Get_rank(), host)
    try:
        window, err = map_window(local, slot)
        errors = [e for e in comm.allgather(err) if e]  # every host decides alike
        if errors:
            if m == "shm":
                raise RingcommError("RINGCOMM_TRANSPORT=shm, but a host's shared-memory window failed: "
                                    + errors[0])
            warnings.warn("ringcomm: no shared memory within a host, using point-to-point messages: " + errors[0],
                          RuntimeWarning, stacklevel=6)
            return None
        members, cross_members = local.allgather(rank), cross.allgather(rank)
        between = make_between(cross)
        costs = from_rank0(comm.bcast, rank == 0, lambda: selection.costs_for("mpi", cross.Get_size()),
                           "read the cost model")
        rd, hd = selection.auto_limits(costs, cross.Get_size())
        between.set_auto_limits(rd, hd, selection.reduce_limit(costs, cross.Get_size()))
        # every host's ranks in rank order, hosts in the order between hosts
        layout = [q for key in order for q in range(len(keys)) if keys[q] == key]
        engine.attach_hierarchy(window, members, between, cross_members, layout)
        return "hierarchical"
    finally:
        local.Free()
        cross.Free()


def attach_local(engines: list) -> None:
    """In-process ranks: one window over plain memory; ``auto`` uses it only
    with ``RINGCOMM_TRANSPORT=shm``."""
    windows = core.shm_local_windows(len(engines), policy.slot_bytes())
    core.shm_local_arena(windows, policy.arena_bytes())  # reserved lazily: untouched parts cost nothing
    use = mode() == "shm"
    single = policy.single_copy_min()
    for e, w in zip(engines, windows):
        w.single_copy_min = single  # (one address space: a memcpy, whatever the pages)
        w.single_copy_min_4k = single
        e.attach_window(w, use, policy.flat_max())

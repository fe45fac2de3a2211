"""What the ledger says crossed hosts, written by each rank for the launcher
of an emulated cluster, which puts it beside the kernel's link counters.

The launcher (``ringcomm run --hosts``) sets ``RINGCOMM_LEDGER_OUT`` to a
directory; every communicator a rank makes then learns its members' job
ranks (one allgather at creation, only then) and, when it closes, adds
what it sent to and received from each of them to ``rank<R>.json``: the
whole ledger, peers on this host included; the launcher keeps the bytes
between ranks on different hosts (what a hierarchical communicator moved
in its host's window is between ranks of one host).
"""

from __future__ import annotations

import contextlib
import json
import os

__all__ = ["ENV", "enabled", "note_members", "write", "collect"]

ENV = "RINGCOMM_LEDGER_OUT"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def _job_rank() -> int:
    """This process's rank in the job, as its launcher told it (torchrun's, or MPI's)."""
    for v in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if v in os.environ:
            return int(os.environ[v])
    return -1


def note_members(comm, group) -> None:
    """At creation (collective over the bootstrap `group`): the job rank of each member."""
    if enabled():
        comm._ledger_members = list(group.allgather(_job_rank()))


def write(comm) -> None:
    """At close: add this communicator's bytes per peer (by job rank) to this rank's file."""
    members = getattr(comm, "_ledger_members", None)
    if not members or _job_rank() < 0:
        return
    t = comm.traffic()
    sent = t.per_peer("bytes_sent", kind="all")
    received = t.per_peer("bytes_received", kind="all")
    path = os.path.join(os.environ[ENV], f"rank{_job_rank()}.json")
    got = {"sent": {}, "received": {}}
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            got = json.load(f)
    for key, per_peer in (("sent", sent), ("received", received)):
        for peer, b in per_peer.items():
            job_peer = str(members[peer])
            got[key][job_peer] = got[key].get(job_peer, 0) + int(b)
    with contextlib.suppress(OSError):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(got, f)
        os.replace(tmp, path)


def collect(directory: str, host_of: list[int]) -> tuple[list[dict], list[int]]:
    """Per host {"sent", "received"}: the ledger's bytes between its ranks and
    other hosts' ranks; and the ranks that wrote nothing (killed, or no communicator closed)."""
    hosts = max(host_of) + 1 if host_of else 0
    out = [{"sent": 0, "received": 0} for _ in range(hosts)]
    missing = []
    for r, h in enumerate(host_of):
        try:
            with open(os.path.join(directory, f"rank{r}.json")) as f:
                d = json.load(f)
        except (OSError, ValueError):
            missing.append(r)
            continue
        for key in ("sent", "received"):
            out[h][key] += sum(b for p, b in d[key].items() if 0 <= int(p) < len(host_of) and host_of[int(p)] != h)
    return out, missing

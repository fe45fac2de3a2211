"""Which ranks share a host, and how the kernel schedules them there.

Ranks share a host when they have the same ``hostname`` and kernel boot id
(``/proc/sys/kernel/random/boot_id``), or the same ``RINGCOMM_HOST_ID`` (so
tests can split one machine into several "hosts"); mapping a segment then
confirms it (containers on one node may not share ``/dev/shm``)."""

from __future__ import annotations

import os
import socket
import warnings

__all__ = ["host_key", "host_name", "host_names", "sched_group", "split_scheduling", "process_identity",
           "say_if_split_scheduling"]


def host_key() -> str:
    """What identifies this host: ``RINGCOMM_HOST_ID``, else hostname + boot id."""
    override = os.environ.get("RINGCOMM_HOST_ID")
    if override:
        return "id:" + override
    return f"{socket.gethostname()}:{_boot_id()}"


def host_name() -> str:
    """This host's name for a person: its hostname."""
    return socket.gethostname()


def host_names(keys: list[str], names: list[str]) -> list[str]:
    """What each rank's host is called in messages, from every rank's
    host_key() and host_name(): the hostname where the hostnames tell the
    hosts apart (one per host key, none shared), else the host key
    (``RINGCOMM_HOST_ID`` splitting one machine: its id)."""
    by_key = {}
    for k, name in zip(keys, names):
        by_key.setdefault(k, set()).add(name)
    apart = all(len(v) == 1 for v in by_key.values()) and len({min(v) for v in by_key.values()}) == len(by_key)
    return list(names) if apart else [k[3:] if k.startswith("id:") else k for k in keys]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "?"


def sched_group() -> str | None:
    """This process's kernel scheduling group where the kernel groups tasks
    by session (autogroup: ``kernel.sched_autogroup_enabled=1`` and no cpu
    cgroup of its own), else None."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            if f.read().strip() != "1":
                return None
        # A cpu cgroup other than the root takes precedence over autogroup:
        # cgroup v1's cpu controller where mounted, else v2's unified tree.
        with open("/proc/self/cgroup") as f:
            lines = [line.split(":", 2) for line in f.read().splitlines()]
        cpu = [path for _, ctl, path in lines if "cpu" in ctl.split(",")] or \
            [path for _, ctl, path in lines if ctl == ""]
        if any(path != "/" for path in cpu):
            return None
        with open("/proc/self/autogroup") as f:
            return f.read().split()[0]
    except (OSError, ValueError, IndexError):
        return None


def split_scheduling(groups: list) -> bool:
    """Whether the ranks of one host (their sched_group()s) outnumber its
    cores while sitting in different scheduling groups. A waiting rank then
    cannot hand its core to the peer it waits for: sched_yield only yields
    within the yielder's group (torchrun starts every worker in a session,
    hence a group, of its own; mpirun keeps its ranks in one). What that
    costs: bench/README.md, "torchrun against mpirun"."""
    return len(groups) > _cores() and None not in groups and len(set(groups)) > 1


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cores() -> int:
    """The cores this process may run on."""
    return _cores()


def say_if_split_scheduling(groups: list, first: bool) -> None:
    if first and split_scheduling(groups):
        warnings.warn(
            f"ringcomm: the {len(groups)} ranks on this host outnumber the {_cores()} cores they may run on, and each runs "
            "in a kernel scheduling group of its own (autogroup: one per session; torchrun starts every worker "
            "in its own session), so a rank that waits cannot hand its core to the peer it waits for: expect "
            "collectives up to about 1.5x slower than with the same ranks in one group (as under mpirun). "
            "Fewer ranks than cores, or `sysctl kernel.sched_autogroup_enabled=0`, avoids it.",
            RuntimeWarning, stacklevel=5)


def process_identity() -> tuple[str, str, int]:
    """This machine's boot id, this process's pid namespace and its pid:
    its peers on this host watch it (Link::watch_processes) where no window
    does."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return _boot_id(), ns, os.getpid()

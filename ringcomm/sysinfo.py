"""What `ringcomm info` reports: versions, the MPI library, what was built
and which transports can run (also written into `ringcomm bench --json`)."""

from __future__ import annotations

import os
import platform


def info() -> dict:
    from . import __version__
    from ._native import core

    d = {
        "ringcomm": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mpi": core.mpi_library_version(),
        "transports": ["mpi", "inproc"],
    }
    try:
        import mpi4py
        d["mpi4py"] = mpi4py.__version__
    except ImportError:
        d["mpi4py"] = None
    import numpy
    d["numpy"] = numpy.__version__
    try:
        from importlib.metadata import version
        d["nccl"] = next((version(p) for p in ("nvidia-nccl-cu13", "nvidia-nccl-cu12") if _installed(p)), None)
    except Exception:  # noqa: BLE001
        d["nccl"] = None
    from . import cuda
    d["cuda"] = cuda.status()
    d["transports"] = (["mpi", "shm", "inproc", "inproc(emulated)", "emulated-nccl"]
                       + (["nccl", "inproc(cuda)"] if cuda.available() else []))
    d["shm"] = _shm_line()
    d["ucx"] = _ucx_line()
    if not d["ucx"].startswith("not usable"):
        d["transports"].insert(2, "ucx")
    d["bootstrap"] = _bootstrap_line()
    d["scheduling"] = _scheduling_line()
    return d


def _scheduling_line() -> str:
    """Whether ranks in different sessions can hand each other a core
    (ringcomm/shm/host.py, split_scheduling)."""
    from . import shm
    cores = shm.host.cores()
    if shm.sched_group() is None:
        return f"{cores} cores; tasks not grouped by session (autogroup off, or a cpu cgroup)"
    return (f"{cores} cores; the kernel groups tasks by session (autogroup): ranks in sessions of their own "
            f"(torchrun's workers) that outnumber the cores run up to about 1.5x slower than in one session "
            f"(mpirun); sysctl kernel.sched_autogroup_enabled=0 avoids it")


def _ucx_line() -> str:
    from . import ucx
    why = ucx.why_not()
    return f"UCX {ucx.version()} (store launches; RINGCOMM_TRANSPORT=ucx under mpirun)" if why is None else \
        f"not usable: {why}"


def _bootstrap_line() -> str:
    """How init() would find the other ranks in this environment."""
    from . import bootstrap
    try:
        mode = bootstrap.choose(False)
    except Exception as e:  # noqa: BLE001 - shown, not raised
        return f"RINGCOMM_BOOTSTRAP invalid: {e}"
    if mode == "mpi":
        from ._singleton import launched
        return "mpi (" + ("an MPI launcher started this process" if launched() else
                          "no launcher: a one-rank job; torchrun or init(store=...) use a store") + ")"
    return "store (torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"


def _shm_line() -> str:
    """What algorithm="auto" does between ranks of one host, and the room for it."""
    from . import shm
    try:
        st = os.statvfs("/dev/shm")
        room = f"/dev/shm {st.f_bavail * st.f_frsize >> 20} MiB free"
    except OSError:
        room = "no /dev/shm"
    try:
        mode = shm.mode()
    except Exception as e:  # noqa: BLE001 - shown, not raised
        return f"RINGCOMM_TRANSPORT invalid: {e}"
    if mode == "mpi":
        return f"RINGCOMM_TRANSPORT=mpi: MPI point-to-point only ({room})"
    return (f"RINGCOMM_TRANSPORT={mode}: ranks of one host ({shm.host_key()}) share a window, slots of "
            f"{shm.slot_bytes()} B per rank x 2 ({room}); what auto runs there: below (--json: shm_auto)")


def window_limits(n: int) -> dict:
    """What algorithm="auto" runs in the shared-memory window on `n` ranks
    of one host, in the form of tune's shm_limits (the largest size per
    collective, "from" where it runs there again, "flat_max",
    "single_copy_min", and "single_copy_min_4k": all_to_all's limit for
    blocks in 4 KiB pages), plus "tuned": whether ``ringcomm tune`` measured
    them for `n` ranks (else the built-in limits). Assumes every rank can
    read its peers' memory (init() probes it: single copy off otherwise)."""
    from . import shm
    auto = shm.auto_limits(n)
    lim = dict(zip(shm.COLLECTIVES, auto["max"]))
    lim["from"] = dict(zip(shm.COLLECTIVES, auto["from"]))
    lim.update(flat_max=auto["flat_max"], single_copy=auto["single_copy_min"] < shm.UNLIMITED,
               single_copy_min=auto["single_copy_min"], single_copy_min_4k=auto["single_copy_min_4k"],
               tuned=shm.tuned(n) is not None)
    return lim


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version
    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False

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
    d["transports"] = (["mpi", "inproc", "inproc(emulated)", "emulated-nccl"]
                       + (["nccl", "inproc(cuda)"] if cuda.available() else []))
    return d


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version
    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False

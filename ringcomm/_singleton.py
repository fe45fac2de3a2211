"""Starting MPI in a process that no launcher started (an Open MPI "singleton").

``python script.py`` calling ``ringcomm.init()`` runs as one MPI rank. Two
things go wrong there without help:

* Open MPI 5.0.11 never unlinks a singleton's 16 MiB ``/dev/shm/sm_segment.*``
  file (open-mpi/ompi PR #13261): every one-rank run leaves one behind, and a
  small ``/dev/shm`` (Docker's 64 MiB) fills up. A single rank needs no
  shared-memory transport, so MPI is started with ``OMPI_MCA_btl=self`` unless
  the user chose a btl. The variable is set only while MPI initializes and
  removed again, so programs this process starts (``mpirun`` among them)
  never inherit it.
* the program runs as one rank without a word: ``init()`` says so once on
  stderr, unless one rank was asked for (``ringcomm run -n 1``, which is a
  launcher, or ``RINGCOMM_SINGLETON_OK=1``).

``mpi()`` is ringcomm's door to ``mpi4py.MPI``: MPI initializes when
``mpi4py.MPI`` is first imported, and this is the earliest point ringcomm
controls (importing ringcomm never initializes MPI). If the program imported
``mpi4py.MPI`` itself first, MPI is already running and nothing can be changed.
"""

from __future__ import annotations

import os
import sys

# Set by the launchers for the processes they start (Open MPI's mpirun/prterun,
# PMIx launchers such as srun --mpi=pmix, MPICH's hydra and PMI-1/2 launchers).
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMIX_NAMESPACE",
                 "PMI_RANK", "PMI_SIZE")
NOTICE = "ringcomm: 1 rank: start N ranks with `ringcomm run -n N` (RINGCOMM_SINGLETON_OK=1 silences this)"

_noticed = False


def launched(environ=None) -> bool:
    """True when a launcher started this process (its variables are set)."""
    env = os.environ if environ is None else environ
    return any(v in env for v in LAUNCHER_VARS)


def mpi():
    """``mpi4py.MPI``, importing (and so initializing) it with the singleton
    settings when no launcher started this process."""
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    singleton = not launched()
    before = _c_environ() if singleton else None  # first: if it fails, nothing is set yet
    set_btl = singleton and "OMPI_MCA_btl" not in os.environ
    if set_btl:
        os.environ["OMPI_MCA_btl"] = "self"
    try:
        from mpi4py import MPI
    finally:
        if set_btl:
            os.environ.pop("OMPI_MCA_btl", None)
        if before is not None:
            _restore_c_environ(before)
    return MPI


def _c_environ() -> dict:
    """The process's C environment (what a child started with env=None gets;
    os.environ is Python's copy from startup and misses a library's setenv)."""
    import ctypes
    env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    out, i = {}, 0
    while env[i]:
        key, _, value = env[i].partition(b"=")
        out[key] = value
        i += 1
    return out


def _restore_c_environ(before: dict) -> None:
    """Undo the variables a singleton's MPI_Init set in the C environment.
    Open MPI 4 (Debian's 4.1.6) exports its runtime's (OMPI_MCA_orte_*, PMIX_*,
    ...): a child such as `ringcomm run`'s mpirun inherits them, takes itself
    for part of this job and exits 1 without a word. They were read during
    MPI_Init; Open MPI 5 sets only two harmless PSM flags. One it removed
    comes back too."""
    now = _c_environ()
    for key, value in now.items():
        if key not in before:
            os.unsetenv(key)
        elif before[key] != value:
            os.putenv(key, before[key])
    for key, value in before.items():
        if key not in now:
            os.putenv(key, value)


def notice_once(size: int) -> None:
    """The one-line stderr notice for a one-rank run nobody asked for."""
    global _noticed
    if _noticed or size != 1 or launched() or os.environ.get("RINGCOMM_SINGLETON_OK", "") not in ("", "0"):
        return
    _noticed = True
    print(NOTICE, file=sys.stderr, flush=True)

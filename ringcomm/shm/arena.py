"""The shared arena: arrays ringcomm allocates in shared memory
(``Communicator.empty``), which collectives then read where they are."""

from __future__ import annotations

import math

from .._native import core
from ..errors import InvalidArgument, RingcommError
from .. import policy
from .segment import share_segment

__all__ = ["make_arena", "empty"]


def make_arena(window, comm) -> None:
    """The window's shared arena, over the window's hand-shake (`comm`: an
    MPI communicator or a store group). Collective."""
    per_rank = policy.arena_bytes()
    _, err = share_segment(comm, per_rank * comm.Get_size(), "-arena",
                           lambda f, create: core.shm_arena_map(window, f, per_rank))
    if err:
        raise RingcommError("cannot make the shared arena for comm.empty(): " + err)


def empty(window, arena_maker, shape, dtype="float32", family: str = "numpy"):
    """An uninitialized array in this rank's part of the shared arena of
    `window` (``Communicator.empty``); `arena_maker()` makes the arena where
    the window has none yet (None: this communicator cannot)."""
    import numpy as np
    from .. import vocab
    if window is None:
        raise InvalidArgument("comm.empty() needs ranks that share memory (a shared-memory window): this "
                              "communicator has none (RINGCOMM_TRANSPORT=mpi, ranks on several hosts, or a device)")
    if not window.has_arena:
        if arena_maker is None:
            raise InvalidArgument("this communicator cannot make a shared arena")
        arena_maker()
    name = vocab.name_of(dtype)
    if name not in vocab.NUMPY:
        raise InvalidArgument(f"comm.empty: unsupported dtype {dtype!r}; expected one of {', '.join(vocab.NUMPY)}")
    npd = vocab.NUMPY[name]
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"comm.empty: negative dimension in shape {shape}")
    count = math.prod(shape)  # (Python ints: no wrap-around for huge shapes)
    if count * npd.itemsize > window.arena_bytes:
        raise InvalidArgument(f"comm.empty: {count * npd.itemsize} bytes do not fit the shared arena "
                              f"({window.arena_bytes} bytes per rank; RINGCOMM_SHM_ARENA sets it)")
    block = window.arena_alloc(count * npd.itemsize)
    if family == "numpy":
        return np.frombuffer(block, dtype=npd, count=count).reshape(shape)
    if family == "torch":
        import torch
        t = torch.frombuffer(block, dtype=vocab.torch_dtype(name), count=count) if count else \
            torch.empty(0, dtype=vocab.torch_dtype(name))
        return t.reshape(shape)
    raise InvalidArgument(f"comm.empty: family must be 'numpy' or 'torch', got {family!r}")

"""Arrays ringcomm hands out into memory it manages, and what happens to them
when that memory moves on.

A gradient view (``GradBucketer.grad_views``) or a ZeRO gradient or gathered
parameter is a view into a buffer ringcomm owns. When the buffer is laid out
again (the bucketer's rebuild) or given up (ZeRO's stages 2 and 3), code that
kept the old array must never compute with it silently:

* torch tensors are *moved*: ``Tensor.set_`` points the very tensor the user
  holds at the new place, so a held view stays live (torch's DDP does the same
  for ``param.grad`` when it rebuilds its buckets);
* numpy arrays cannot be pointed elsewhere, so they are *retired*: made
  read-only (no write lands anywhere, whatever path it takes) and turned into
  a class whose numpy operations raise ``StaleViewError`` saying where the live
  array is (reading may stay allowed for a while, where the old array still
  holds a result the caller is owed). That is why ringcomm hands numpy views out as ``HandedOut``, an
  ndarray subclass with no behaviour of its own until it is retired.

A view derived by the user (``g.reshape(-1)``) is an array of its own; only
the arrays ringcomm handed out are moved or retired.
"""

from __future__ import annotations

import numpy as np

from ..errors import StaleViewError

__all__ = ["HandedOut", "handout", "retire", "seal", "move"]


class HandedOut(np.ndarray):
    """A numpy view ringcomm handed out (behaves as an ndarray)."""

    def __repr__(self):
        return repr(self.view(np.ndarray))


class _Retired(HandedOut):
    """A handed-out numpy view whose memory ringcomm has moved on from. Until
    sealed it may still be read (it holds the last result it was given);
    writing raises. Once sealed, every numpy operation on it raises."""

    def _refuse(self, *args, **kwargs):
        raise StaleViewError(self.__dict__.get("_ringcomm_stale", "this array is stale"))

    def _reads_ok(self) -> bool:
        return self.__dict__.get("_ringcomm_reads", False)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        outs = kwargs.get("out") or ()
        if not self._reads_ok() or any(isinstance(o, _Retired) for o in outs):
            self._refuse()
        plain = [x.view(np.ndarray) if isinstance(x, HandedOut) else x for x in inputs]
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if not self._reads_ok():
            self._refuse()
        return super().__array_function__(func, types, args, kwargs)  # a write: "read-only"

    def __getitem__(self, key):
        if not self._reads_ok():
            self._refuse()
        return self.view(np.ndarray)[key]

    __setitem__ = _refuse  # (in-place operators are ufuncs with out=: refused above)

    def __repr__(self):
        if self._reads_ok():
            return repr(self.view(np.ndarray))
        return f"<stale ringcomm view: {self.__dict__.get('_ringcomm_stale', '')}>"


def handout(x):
    """x as the array to hand out: numpy as HandedOut (same memory), torch as is."""
    return x.view(HandedOut) if type(x) is np.ndarray else x


def retire(x, message: str, *, readable: bool = False) -> None:
    """Make a handed-out numpy array read-only, and every numpy operation on
    it raise StaleViewError(message); with readable=True, reading it stays
    allowed until seal(x) (it holds a result the caller may still read).
    Other families: nothing (torch's are moved instead; see move)."""
    if isinstance(x, HandedOut):
        x.flags.writeable = False
        x.__class__ = _Retired
        x._ringcomm_stale = message
        x._ringcomm_reads = readable


def seal(x) -> None:
    """End the reading period retire(readable=True) gave."""
    if isinstance(x, _Retired):
        x._ringcomm_reads = False


def move(held, new):
    """Point the torch tensor `held` at `new`'s memory (same shape), so code
    holding `held` sees the live array. Returns the array to keep as the live
    view: `held` itself for torch, `new` for other families."""
    if type(held).__module__.startswith("torch"):
        import torch
        with torch.no_grad():
            held.set_(new.untyped_storage(), new.storage_offset(), new.shape, new.stride())
        return held
    return new

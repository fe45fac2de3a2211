"""The one door into the engine: every collective call, on every array family,
is turned here into one checked ``Call`` (collective, dtype, op, algorithm,
addresses, count, root), the struct the native engine takes.

    comm.all_reduce(x)  ->  Door.all_reduce(x, ...)  ->  Described(call, ...)  ->  engine.run(call)

Everything a rank can check alone is checked here, before any byte moves:
the array family and its memory (``_arrays.view``), dtype, op, the output's
dtype, size, writability and overlap with the input, the root. What needs the
other ranks (that they agree on count, dtype, op and root) the engine checks
with each call's fingerprint.

The common call, a synchronous all_reduce of numpy arrays or torch CPU
tensors, has a fast lane in the native layer that fills the same Call
(``Engine.run_all_reduce``, csrc/python/converters.h); it declines anything
unusual, which then comes here, so the errors are always this module's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import vocab
from ._arrays import Buf, view
from ._native import core
from .errors import InvalidArgument

__all__ = ["Door", "Described"]


@dataclass
class Described:
    """A checked call: the native ``Call``, what the caller gets back, and
    the arrays that must stay alive while it runs."""
    call: Any            # core.Call
    result: Any
    keep: tuple          # the Bufs (their arrays and DLPack capsules)
    stream_fn: Any = None  # GPU arrays: () -> the caller's current stream


class Door:
    """The adapter of one communicator (its rank, size and where its payload lives)."""

    def __init__(self, rank: int, size: int, gpu: int | None):
        self.rank, self.size, self.gpu = rank, size, gpu

    # ---- the collectives ------------------------------------------------------
    def all_reduce(self, x, op: str, out, algorithm: str) -> Described:
        xb = self.view(x, "all_reduce input")
        opc = vocab.op_code(op, xb.dtype)
        if out is None:
            ob = _writable(xb, "all_reduce input (in place; pass out= for a read-only input)")
        else:
            ob = self._out(out, xb, xb.count, "all_reduce")
            if ob.shape != xb.shape:
                raise InvalidArgument(f"all_reduce out has shape {ob.shape}, expected the input's shape {xb.shape}")
        return self._call("all_reduce", xb, ob, xb.count, opc, 0, vocab.algorithm_code(algorithm), ob.obj)

    def reduce_scatter(self, x, op: str, out, algorithm: str, new_array) -> Described:
        """`new_array(template_buf, count)` makes the output when `out` is None."""
        xb = self.view(x, "reduce_scatter input")
        opc = vocab.op_code(op, xb.dtype)
        mine = vocab.chunk_count(xb.count, self.size, self.rank)
        if out is None:
            out = new_array(xb, mine)
        ob = self._out(out, xb, mine, "reduce_scatter",
                       why=f"rank {self.rank}'s chunk of {xb.count} elements over {self.size} ranks",
                       in_place_at=vocab.chunk_offset(xb.count, self.size, self.rank) * vocab.itemsize(xb.dtype))
        return self._call("reduce_scatter", xb, ob, xb.count, opc, 0, vocab.algorithm_code(algorithm), ob.obj)

    def all_gather(self, xb: Buf, out, algorithm: str) -> Described:
        """`xb`: the input, already viewed (its count may have been exchanged to make `out`)."""
        ob = self.view(out, "all_gather out")
        total = ob.count
        mine = vocab.chunk_count(total, self.size, self.rank)
        if xb.count != mine:
            raise InvalidArgument(
                f"all_gather input has {xb.count} elements but rank {self.rank}'s chunk of out "
                f"({total} elements over {self.size} ranks, split rule) has {mine}")
        self._out(out, xb, total, "all_gather", why="the gathered total", outbuf=ob,
                  in_place_at=-vocab.chunk_offset(total, self.size, self.rank) * vocab.itemsize(xb.dtype))
        return self._call("all_gather", xb, ob, total, 0, 0, vocab.algorithm_code(algorithm), ob.obj)

    def broadcast(self, x, root) -> Described:
        xb = self.view(x, "broadcast buffer")
        root = int(root)
        if not 0 <= root < self.size:
            raise InvalidArgument(f"broadcast root {root} is out of range (expected 0 <= root < {self.size})")
        if self.rank != root:
            _writable(xb, "broadcast buffer")
        return self._call("broadcast", xb, xb, xb.count, 0, root, 0, xb.obj)

    def barrier(self) -> Described:
        return self._call("barrier", None, None, 0, 0, 0, 0, None)

    # ---- arrays ---------------------------------------------------------------
    def view(self, x, what: str) -> Buf:
        """view(x), plus: the array lives where this communicator's payload does."""
        b = view(x, what)
        gpu = self.gpu
        if gpu is None and b.device is not None:
            raise InvalidArgument(
                f"{what} is on cuda:{b.device}, but this communicator moves host memory; for GPU arrays use "
                "ringcomm.init(device='cuda') or run_local(..., device='cuda')")
        if gpu is not None and b.device is None and b.count:
            raise InvalidArgument(
                f"{what} is in host memory, but this communicator's payload lives on cuda:{gpu} "
                "(move it there: cupy.asarray(x) or tensor.cuda())")
        if gpu is not None and b.device is not None and b.device != gpu:
            raise InvalidArgument(f"{what} is on cuda:{b.device}, but this communicator is on cuda:{gpu}")
        return b

    def _out(self, out, xb: Buf, count: int, coll: str, why: str = "the input's count",
             outbuf: Buf | None = None, in_place_at: int | None = None) -> Buf:
        """Check `out`. Overlap with the input is an error except for the exact
        in-place forms: all_reduce with out = x; reduce_scatter with out =
        this rank's chunk of x; all_gather with x = this rank's chunk of out
        (`in_place_at`: out.ptr - x.ptr in bytes for those)."""
        ob = outbuf if outbuf is not None else self.view(out, f"{coll} out")
        if ob.readonly:
            raise InvalidArgument(f"{coll} out is read-only")
        if ob.dtype != xb.dtype:
            raise InvalidArgument(f"{coll} out has dtype {ob.dtype}, expected the input's dtype {xb.dtype}")
        if ob.count != count:
            raise InvalidArgument(f"{coll} out has {ob.count} elements (shape {ob.shape}), expected {count} ({why})")
        exact = ob.same_memory(xb) if coll == "all_reduce" else ob.ptr - xb.ptr == in_place_at
        if ob.overlaps(xb) and not exact:
            raise InvalidArgument(f"{coll} out overlaps the input; pass separate buffers"
                                  + (" or call in place (out=None)" if coll == "all_reduce" else
                                     " (or use the exact in-place form: this rank's chunk)"))
        return ob

    @staticmethod
    def _call(coll: str, xb: Buf | None, ob: Buf | None, count: int, opc: int, root: int, algo: int,
              result) -> Described:
        lead = xb or ob
        call = core.Call(vocab.COLLECTIVES[coll], vocab.DTYPES[lead.dtype] if lead else 0, opc, algo,
                         xb.ptr if xb else 0, ob.ptr if ob else 0, count, root)
        return Described(call, result, (xb, ob), lead.stream_fn if lead is not None else None)


def _writable(b: Buf, what: str) -> Buf:
    if b.readonly:
        raise InvalidArgument(f"{what} is read-only")
    return b

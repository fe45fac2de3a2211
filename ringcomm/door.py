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
(``Engine.run_same_shape``, csrc/python/converters.h); it declines anything
unusual, which then comes here, so the errors are always this module's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import algorithms, vocab
from ._arrays import Buf, meeting_pairs, spans_meeting, view
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

    def __init__(self, rank: int, size: int, gpu: int | None, p2p_limits: tuple[int, int] = (2**31 - 1, 2**64 - 1)):
        self.rank, self.size, self.gpu = rank, size, gpu
        # (largest tag, largest message in bytes) of this transport's point-to-point
        self.p2p_max_tag, self.p2p_max_bytes = p2p_limits

    # ---- the collectives ------------------------------------------------------
    def all_reduce(self, x, op: str, out, algorithm: str) -> Described:
        return self.same_shape("all_reduce", x, op, out, algorithm)

    def same_shape(self, coll: str, x, op: str, out, algorithm: str) -> Described:
        """A collective whose output has its input's count and shape on every
        rank and which combines with an op (all_reduce, and any other such by
        name: a new one needs no method here): in place when `out` is None."""
        xb = self.view(x, f"{coll} input")
        opc = vocab.op_code(op, xb.dtype)
        if out is None:
            ob = _writable(xb, f"{coll} input (in place; pass out= for a read-only input)")
        else:
            ob = self._out(out, xb, xb.count, coll, in_place_at=0)  # (out = x: in place)
            if ob.shape != xb.shape:
                raise InvalidArgument(f"{coll} out has shape {ob.shape}, expected the input's shape {xb.shape}")
        if coll != "all_reduce":  # (all_reduce's names are checked by the engine, with its own words)
            _algorithm(coll, algorithm, algorithms.names(coll))
        return self._call(coll, xb, ob, xb.count, opc, 0, vocab.algorithm_code(algorithm), ob.obj)

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

    def broadcast(self, x, root, algorithm: str = "auto") -> Described:
        xb = self.view(x, "broadcast buffer")
        root = int(root)
        if not 0 <= root < self.size:
            raise InvalidArgument(f"broadcast root {root} is out of range (expected 0 <= root < {self.size})")
        if self.rank != root:
            _writable(xb, "broadcast buffer")
        return self._call("broadcast", xb, xb, xb.count, 0, root, vocab.algorithm_code(algorithm), xb.obj)

    def barrier(self, algorithm: str = "auto") -> Described:
        return self._call("barrier", None, None, 0, 0, 0, vocab.algorithm_code(algorithm), None)

    def reduce(self, x, root, op: str, out, algorithm: str) -> Described:
        """The root gets the reduction (in x, or in out); elsewhere x is only read and out is ignored."""
        root = self._root(root, "reduce")
        xb = self.view(x, "reduce input")
        opc = vocab.op_code(op, xb.dtype)
        vocab.algorithm_code(algorithm)  # (an unknown name: that error first)
        algo = _algorithm("reduce", algorithm, algorithms.names("reduce"))
        if self.rank != root:
            return self._call("reduce", xb, None, xb.count, opc, root, algo, None)
        if out is None:
            ob = _writable(xb, "reduce input on the root (in place; pass out= for a read-only input)")
        else:
            ob = self._out(out, xb, xb.count, "reduce", in_place_at=0)
            if ob.shape != xb.shape:
                raise InvalidArgument(f"reduce out has shape {ob.shape}, expected the input's shape {xb.shape}")
        return self._call("reduce", xb, ob, xb.count, opc, root, algo, ob.obj)

    def gather(self, x, root, counts, out, new_array, algorithm: str = "auto") -> Described:
        root = self._root(root, "gather")
        xb = self.view(x, "gather input")
        counts = self._counts(counts, "gather counts")
        if counts is None:
            total = xb.count * self.size
        else:
            if xb.count != counts[self.rank]:
                raise InvalidArgument(f"gather input has {xb.count} elements but counts[{self.rank}] is "
                                      f"{counts[self.rank]} (rank {self.rank}'s block)")
            total = sum(counts)
        algo = _algorithm("gather", algorithm, algorithms.names("gather"))
        if self.rank != root:
            return self._call("gather", xb, None, total, 0, root, algo, None, counts)
        if isinstance(out, (list, tuple)):  # one array per rank's block: each straight to its place
            sizes = counts if counts is not None else [xb.count] * self.size
            bufs = self._places(out, xb.dtype, "gather out", writable=True)
            self._sizes(bufs, sizes, "gather out")
            for j, b in enumerate(bufs):
                if b.overlaps(xb) and not (j == self.rank and b.same_memory(xb)):
                    raise InvalidArgument(f"gather out[{j}] overlaps the input; pass separate buffers (or the input "
                                          f"itself as out[{self.rank}]: in place)")
            return self._call("gather", xb, None, total, 0, root, algo, out, counts, out_places=bufs)
        if out is None:
            out = new_array(xb, total)
        offset = (sum(counts[:self.rank]) if counts is not None else xb.count * self.rank) * vocab.itemsize(xb.dtype)
        ob = self._out(out, xb, total, "gather", why="the gathered total", in_place_at=-offset)
        return self._call("gather", xb, ob, total, 0, root, algo, ob.obj, counts)

    def scatter(self, x, root, counts, out, new_array, algorithm: str = "auto") -> Described:
        root = self._root(root, "scatter")
        algo = _algorithm("scatter", algorithm, algorithms.names("scatter"))
        counts = self._counts(counts, "scatter counts")
        if isinstance(x, (list, tuple)):
            if self.rank == root:
                return self._scatter_places(x, root, counts, out, new_array, algo)
            x = x[0] if len(x) else None  # (off the root only a template of out)
        xb = None
        if self.rank == root or (x is not None and out is None):
            xb = self.view(x, "scatter input" if self.rank == root else "scatter input (the template of out)")
        mine, total = self._scatter_sizes(xb, root, counts, out)
        if out is None:
            if xb is None:
                raise InvalidArgument("scatter on a rank other than the root needs out= or an input x as the "
                                      "template of its block (dtype and array family)")
            out = new_array(xb, mine)
        ob = self.view(out, "scatter out")
        if xb is not None:
            in_place = (sum(counts[:self.rank]) if counts is not None else mine * self.rank) * vocab.itemsize(xb.dtype)
            self._out(out, xb, mine, "scatter", why=f"rank {self.rank}'s block", outbuf=ob, in_place_at=in_place)
        else:
            _writable(ob, "scatter out")
            if ob.count != mine:
                raise InvalidArgument(f"scatter out has {ob.count} elements, expected {mine} (rank {self.rank}'s block)")
        lead = xb if self.rank == root else None
        if lead is None:  # only the dtype travels from out: the input is not read here
            return self._call("scatter", None, ob, total, 0, root, algo, ob.obj, counts)
        return self._call("scatter", xb, ob, total, 0, root, algo, ob.obj, counts)

    def _scatter_sizes(self, xb: Buf | None, root: int, counts, out) -> tuple[int, int]:
        """scatter's (this rank's block, the total): from counts=, from the
        root's input (equal blocks), or off the root from out."""
        if self.rank == root:
            total = xb.count
            if counts is None:
                if total % self.size:
                    raise InvalidArgument(
                        f"scatter input has {total} elements, not divisible by {self.size} ranks; pass counts= "
                        f"(for the split rule: ringcomm.vocab.chunk_counts({total}, {self.size}))")
                return total // self.size, total
            if total != sum(counts):
                raise InvalidArgument(f"scatter counts sum to {sum(counts)} but the root's input has {total} elements")
        if counts is not None:
            return counts[self.rank], sum(counts)
        if out is None:
            raise InvalidArgument("scatter on a rank other than the root needs out= (its block) or counts=")
        mine = self.view(out, "scatter out").count
        return mine, mine * self.size

    def _scatter_places(self, x, root, counts, out, new_array, algo) -> Described:
        """scatter from the root's list of arrays, one per rank's block."""
        if not len(x):
            raise InvalidArgument(f"scatter input is an empty list, expected one array per rank ({self.size})")
        bufs = self._places(x, self.view(x[0], "scatter input[0]").dtype, "scatter input", writable=False)
        sizes = [b.count for b in bufs]
        if counts is None and len(set(sizes)) > 1:
            raise InvalidArgument(f"scatter input arrays have different sizes {sizes}: pass counts= (the same list "
                                  "on every rank)")
        if counts is not None:
            self._sizes(bufs, counts, "scatter input")
        mine = sizes[self.rank]
        if out is None:
            out = new_array(bufs[self.rank], mine)
        ob = self._out(out, bufs[self.rank], mine, "scatter", why=f"rank {self.rank}'s block",
                       in_place_at=0)
        for j, b in enumerate(bufs):
            if j != self.rank and ob.overlaps(b):
                raise InvalidArgument(f"scatter out overlaps input[{j}]; pass separate buffers (or input[{self.rank}] "
                                      "itself as out: in place)")
        return self._call("scatter", None, ob, sum(sizes), 0, root, algo, ob.obj, counts, in_places=bufs)

    def all_to_all(self, x, splits, out_splits, out, new_array, algorithm: str = "auto") -> Described:
        algo = _algorithm("all_to_all", algorithm, algorithms.names("all_to_all"))
        if isinstance(x, (list, tuple)) or isinstance(out, (list, tuple)):
            return self._all_to_all_places(x, splits, out_splits, out, new_array, algo)
        xb = self.view(x, "all_to_all input")
        ob = None if out is None else self.view(out, "all_to_all out")
        n = self.size
        splits = self._counts(splits, "all_to_all splits")
        out_splits = self._counts(out_splits, "all_to_all out_splits")
        if splits is not None and sum(splits) != xb.count:
            raise InvalidArgument(f"all_to_all splits sum to {sum(splits)}, but the input has {xb.count} elements")
        if splits is None and out_splits is None:
            # Equal blocks. Only a call without splits is one: a rank cannot
            # know that splits equal here are equal on every rank, and the
            # two forms differ on the wire (a MismatchError names both).
            if xb.count % n:
                raise InvalidArgument(f"all_to_all input has {xb.count} elements, not divisible by {n} ranks; "
                                      "pass splits= and out_splits=")
            if ob is not None and ob.count != xb.count:
                raise InvalidArgument(f"all_to_all without splits: out has {ob.count} "
                                      f"elements, the input {xb.count} (equal blocks); pass splits= and out_splits= "
                                      "for blocks of other sizes")
            total_out, splits_arg, out_arg = xb.count, None, None
        else:
            if splits is None:
                if xb.count % n:
                    raise InvalidArgument(f"all_to_all input has {xb.count} elements, not divisible by {n} ranks; "
                                          "pass splits=")
                splits = [xb.count // n] * n
            if out_splits is None:
                if out is None:
                    raise InvalidArgument("all_to_all with splits needs out_splits= (what each rank sends here) "
                                          "or out= (split equally)")
                if ob.count % n:
                    raise InvalidArgument(f"all_to_all out has {ob.count} elements, not divisible by {n} ranks; "
                                          "pass out_splits=")
                out_splits = [ob.count // n] * n
            total_out, splits_arg, out_arg = sum(out_splits), splits, out_splits
            self._per_peer(splits, out_splits, xb.dtype)
        if out is None:
            out = new_array(xb, total_out)
        ob = self._out(out, xb, total_out, "all_to_all", why="the sum of out_splits" if out_arg else "the input's count",
                       outbuf=ob, in_place_at=None)
        return self._call("all_to_all", xb, ob, xb.count, 0, 0, algo, ob.obj, splits_arg, out_arg)

    def _per_peer(self, splits, out_splits, dtype: str) -> None:
        """all_to_all's per-peer blocks: what a rank sends itself it expects from
        itself, and each block fits one message (csrc/algorithms/all_to_all.cpp)."""
        me, n = self.rank, self.size
        if splits[me] != out_splits[me]:  # the block a rank sends itself is copied into out
            raise InvalidArgument(f"all_to_all: rank {me} sends itself {splits[me]} elements (splits[{me}]) but "
                                  f"expects {out_splits[me]} from itself (out_splits[{me}]); they must be equal")
        es = vocab.itemsize(dtype)
        for what, blocks in (("sends", splits), ("receives", out_splits)):
            peer = max((p for p in range(n) if p != me), key=lambda p: blocks[p], default=None)
            if peer is not None and blocks[peer] * es > self.p2p_max_bytes:
                raise InvalidArgument(
                    f"all_to_all: rank {me} {what} a block of {blocks[peer] * es} bytes "
                    f"{'to' if what == 'sends' else 'from'} rank {peer}, larger than this transport's "
                    f"largest message ({self.p2p_max_bytes} bytes): split the call in parts")

    def _all_to_all_places(self, x, splits, out_splits, out, new_array, algo) -> Described:
        """all_to_all with lists of arrays (torch's list form): x[p] goes to
        rank p, out[p] comes from rank p, each straight from / into its array.
        A list is a call with per-peer splits (its arrays' sizes)."""
        splits = self._counts(splits, "all_to_all splits")
        out_splits = self._counts(out_splits, "all_to_all out_splits")
        xb, ins, splits = self._a2a_inputs(x, splits)
        dtype = xb.dtype if xb is not None else ins[0].dtype
        if isinstance(out, (list, tuple)):
            ob = None
            outs = self._places(out, dtype, "all_to_all out", writable=True)
            if out_splits is not None:
                self._sizes(outs, out_splits, "all_to_all out")
            out_splits = [b.count for b in outs]
        else:
            outs = []
            ob, out, out_splits = self._a2a_one_out(out, out_splits, xb or ins[0], new_array)
        self._per_peer(splits, out_splits, dtype)
        # (the outputs are apart: checked above, or one array)
        if spans_meeting([(b.ptr, b.ptr + b.nbytes) for b in ([xb] if xb else ins)],
                         [(b.ptr, b.ptr + b.nbytes) for b in ([ob] if ob else outs)]):
            raise InvalidArgument("all_to_all out overlaps the input; pass separate buffers")
        return self._call("all_to_all", xb, ob, sum(splits), 0, 0, algo, out, splits, out_splits,
                          in_places=ins, out_places=outs)

    # ---- point-to-point ------------------------------------------------------
    def p2p(self, x, peer, tag, send: bool, to_self: bool = False) -> tuple[Buf, int, int]:
        """Check one send (`x` is read) or receive (`x` is written; peer None:
        any source). Returns (x's view, peer (-1: any), tag); the engine posts it (csrc/engine/p2p.h).
        `to_self`: sendrecv, where the peer may be this rank (the engine checks the pair)."""
        what = "send" if send else "recv"
        xb = self.view(x, f"{what} buffer")  # (on a device communicator: that device's memory)
        if not send:
            _writable(xb, "recv buffer")
        if peer is None and not send:
            peer = -1
        elif isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
            raise InvalidArgument(f"{what} peer must be an int{'' if send else ' or None (any source)'}, "
                                  f"got {type(peer).__name__}")
        else:
            peer = int(peer)
            if not 0 <= peer < self.size:
                raise InvalidArgument(f"{what} peer {peer} is out of range (expected 0 <= peer < {self.size})")
            if peer == self.rank and not to_self:
                raise InvalidArgument(f"{what} to/from itself (rank {self.rank}): point-to-point needs another rank")
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or tag < 0:
            raise InvalidArgument(f"{what} tag must be an int >= 0, got {tag!r}")
        if tag > self.p2p_max_tag:  # (checked here, so a batch is refused before any op is posted)
            raise InvalidArgument(f"{what} tag {int(tag)} is out of range (0 <= tag <= {self.p2p_max_tag} "
                                  "on this transport)")
        if xb.nbytes > self.p2p_max_bytes:
            raise InvalidArgument(f"{what} of {xb.nbytes} bytes is larger than this transport's largest message "
                                  f"({self.p2p_max_bytes} bytes): send it in parts")
        return xb, peer, int(tag)

    def _a2a_inputs(self, x, splits):
        """The list form's input: a list of arrays (their sizes are the splits)
        or one array (split by splits=, else equally). -> (buf, bufs, splits)"""
        n = self.size
        if isinstance(x, (list, tuple)):
            if not len(x):
                raise InvalidArgument(f"all_to_all input is an empty list, expected one array per rank ({n})")
            ins = self._places(x, self.view(x[0], "all_to_all input[0]").dtype, "all_to_all input", writable=False)
            if splits is not None:
                self._sizes(ins, splits, "all_to_all input")
            return None, ins, [b.count for b in ins]
        xb = self.view(x, "all_to_all input")
        if splits is None:
            if xb.count % n:
                raise InvalidArgument(f"all_to_all input has {xb.count} elements, not divisible by {n} ranks; "
                                      "pass splits=")
            splits = [xb.count // n] * n
        elif sum(splits) != xb.count:
            raise InvalidArgument(f"all_to_all splits sum to {sum(splits)}, but the input has {xb.count} elements")
        return xb, [], splits

    def _a2a_one_out(self, out, out_splits, template: Buf, new_array):
        """The list form's output as one array (made when None). -> (buf, out, out_splits)"""
        n = self.size
        if out_splits is None:
            if out is None:
                raise InvalidArgument("all_to_all with splits needs out_splits= (what each rank sends here) "
                                      "or out= (split equally)")
            oc = self.view(out, "all_to_all out").count
            if oc % n:
                raise InvalidArgument(f"all_to_all out has {oc} elements, not divisible by {n} ranks; "
                                      "pass out_splits=")
            out_splits = [oc // n] * n
        if out is None:
            out = new_array(template, sum(out_splits))
        ob = self.view(out, "all_to_all out")
        _writable(ob, "all_to_all out")
        if ob.dtype != template.dtype:
            raise InvalidArgument(f"all_to_all out has dtype {ob.dtype}, expected the input's dtype {template.dtype}")
        if ob.count != sum(out_splits):
            raise InvalidArgument(f"all_to_all out has {ob.count} elements, expected {sum(out_splits)} "
                                  "(the sum of out_splits)")
        return ob, out, out_splits

    def _root(self, root, coll: str) -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise InvalidArgument(f"{coll} root must be an int, got {type(root).__name__}")
        root = int(root)
        if not 0 <= root < self.size:
            raise InvalidArgument(f"{coll} root {root} is out of range (expected 0 <= root < {self.size})")
        return root

    def _counts(self, counts, what: str) -> list[int] | None:
        """None, or one non-negative int per rank."""
        if counts is None:
            return None
        if isinstance(counts, (str, bytes)):
            raise InvalidArgument(f"{what} must be a sequence of ints, got {counts!r}")
        try:
            c = [int(v) for v in counts]
        except (TypeError, ValueError):
            raise InvalidArgument(f"{what} must be a sequence of ints, got {counts!r}") from None
        if any(isinstance(v, bool) for v in counts) or any(float(v) != int(v) for v in counts):
            raise InvalidArgument(f"{what} must be ints, got {counts!r}")
        if len(c) != self.size:
            raise InvalidArgument(f"{what} has {len(c)} entries, expected one per rank ({self.size})")
        if any(v < 0 for v in c):
            raise InvalidArgument(f"{what} has a negative entry: {c}")
        if sum(c) > core.MAX_ELEMENTS:  # (their bytes must fit the engine's 64-bit sizes, any dtype)
            raise InvalidArgument(f"{what} sum to {sum(c)} elements, more than any array can hold")
        return c

    # ---- arrays ---------------------------------------------------------------
    def _places(self, items, dtype: str, what: str, writable: bool) -> list[Buf]:
        """The root's list of arrays, one per rank's block (gather's outputs,
        scatter's inputs): each of `dtype`; written ones writable and apart."""
        if len(items) != self.size:
            raise InvalidArgument(f"{what} is a list of {len(items)} arrays, expected one per rank ({self.size})")
        bufs = [self.view(a, f"{what}[{j}]") for j, a in enumerate(items)]
        for j, b in enumerate(bufs):
            if b.dtype != dtype:
                raise InvalidArgument(f"{what}[{j}] has dtype {b.dtype}, expected {dtype}")
            if writable and b.readonly:
                raise InvalidArgument(f"{what}[{j}] is read-only")
        if writable:  # (blocks read may share memory: the same array sent to several ranks)
            for i, j in meeting_pairs([(b.ptr, b.ptr + b.nbytes) for b in bufs])[:1]:
                raise InvalidArgument(f"{what}[{min(i, j)}] and {what}[{max(i, j)}] overlap; each block needs "
                                      "memory of its own")
        return bufs

    @staticmethod
    def _sizes(bufs: list[Buf], sizes: list[int], what: str) -> None:
        for j, (b, k) in enumerate(zip(bufs, sizes)):
            if b.count != k:
                raise InvalidArgument(f"{what}[{j}] has {b.count} elements, expected {k} (rank {j}'s block)")

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
        exact = ob.same_memory(xb) if coll == "all_reduce" else (
            in_place_at is not None and ob.ptr - xb.ptr == in_place_at and (coll != "reduce" or ob.same_memory(xb)))
        if ob.overlaps(xb) and not exact:
            raise InvalidArgument(f"{coll} out overlaps the input; pass separate buffers"
                                  + (" or call in place (out=None)" if coll in ("all_reduce", "reduce") else
                                     " (or use the exact in-place form: this rank's chunk)" if in_place_at is not None
                                     else ""))
        return ob

    @staticmethod
    def _call(coll: str, xb: Buf | None, ob: Buf | None, count: int, opc: int, root: int, algo: int,
              result, counts=None, out_counts=None, in_places=(), out_places=()) -> Described:
        lead = xb or ob or next(iter(in_places or out_places), None)
        if counts is None and not in_places and not out_places:
            call = core.Call(vocab.COLLECTIVES[coll], vocab.DTYPES[lead.dtype] if lead else 0, opc, algo,
                             xb.ptr if xb else 0, ob.ptr if ob else 0, count, root)
        else:
            call = core.Call(vocab.COLLECTIVES[coll], vocab.DTYPES[lead.dtype], opc, algo, xb.ptr if xb else 0,
                             ob.ptr if ob else 0, count, root, counts or [], out_counts or [],
                             [b.ptr for b in in_places], [b.ptr for b in out_places])
        return Described(call, result, (xb, ob, *in_places, *out_places), lead.stream_fn if lead is not None else None)


def _algorithm(coll: str, name, allowed) -> int:
    """The code of `name` for a collective that runs "auto" or one of `allowed`
    (the table's algorithms for it: the rooted and personalized collectives
    are refused here, with the list, before anything is described)."""
    if name != "auto" and name not in allowed:
        raise InvalidArgument(f"{coll} runs algorithm 'auto', " + ", ".join(f"'{a}'" for a in allowed[:-1])
                              + f" or '{allowed[-1]}', not {name!r}")
    return vocab.algorithm_code(name)


def _writable(b: Buf, what: str) -> Buf:
    if b.readonly:
        raise InvalidArgument(f"{what} is read-only")
    return b

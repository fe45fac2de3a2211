"""The "ringcomm" torch backend's rooted and personalized collectives
(gather, scatter, all_to_all in its forms) and point-to-point: a part of
``ProcessGroupRingcomm`` (backend.py), kept in a file of its own."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from .._arrays import spans_meeting
from .backend_tensors import adjacent as _adjacent, check_dtype as _check_dtype, elements as _elements
from .backend_tensors import bytes_if_foreign as _bytes_if_foreign, flat as _flat, overlaps as _overlaps
from .backend_tensors import places as _places, same as _same, spans as _spans
from .work import PendingWork

__all__ = ["RootedOps"]


class RootedOps:
    """ProcessGroupRingcomm's gather, scatter, all_to_all and point-to-point
    methods (they use its comm, _sync, _go and _completer)."""

    def gather(self, output_tensors, input_tensors, opts=None):
        """torch passes [gather_list] on the root and [] elsewhere; every
        rank's input has the same size (as gloo requires)."""
        opts = opts if opts is not None else dist.GatherOptions()
        if isinstance(input_tensors, torch.Tensor):
            input_tensors = [input_tensors]
        if len(input_tensors) != 1:
            raise NotImplementedError("ringcomm backend: gather of several tensors per rank is not implemented")
        inp = input_tensors[0]
        root = opts.rootRank
        if not opts.asyncOp and inp.layout == torch.strided:  # the fast lane (_sync), torch's rules first
            done = self._gather_now(output_tensors, inp, root)
            if done is not None:
                return done
        _check_dtype(inp, "gather")
        ibuf, _ = _flat(inp)
        if self.rank() != root:
            if output_tensors and any(len(o) for o in output_tensors):
                raise ValueError("ringcomm backend: gather: output tensors given on a rank other than the root "
                                 f"({root})")
            return self._go(opts.asyncOp, [functools.partial(self.comm.gather, ibuf, root=root)], [])
        return self._gather_at_root(output_tensors, inp, ibuf, root, opts.asyncOp)

    def _gather_now(self, output_tensors, inp, root: int):
        """gather on the fast lane (_sync) where torch's rules hold, else None."""
        n = self.size()
        if self.rank() != root:
            if not any(len(o) for o in output_tensors):
                return self._sync(lambda: self.comm.gather(inp, root=root), [])
            return None
        if len(output_tensors) == 1 and len(output_tensors[0]) == n and \
                all(o.dtype == inp.dtype and o.numel() == inp.numel() for o in output_tensors[0]):
            outs = list(output_tensors[0])  # (each block straight into its tensor: the engine takes a list)
            return self._sync(lambda: self.comm.gather(inp, root=root, out=outs), outs)
        return None

    def _gather_at_root(self, output_tensors, inp, ibuf, root: int, async_op: bool):
        n = self.size()
        if len(output_tensors) != 1 or len(output_tensors[0]) != n:
            raise ValueError(f"ringcomm backend: gather needs a list of {n} output tensors on the root")
        outs = list(output_tensors[0])
        for o in outs:
            if o.dtype != inp.dtype or o.numel() != inp.numel():
                raise ValueError(f"ringcomm backend: gather: every output tensor must be a {inp.dtype} of "
                                 f"{inp.numel()} elements, like the input (got {o.dtype}, {o.numel()})")
        k = inp.numel()
        flat = _adjacent(outs)
        if flat is not None:  # the outputs are consecutive blocks of one buffer (e.g. chunks): straight there
            if _overlaps(ibuf, flat) and ibuf.data_ptr() != flat.data_ptr() + root * k * ibuf.element_size():
                ibuf = ibuf.clone()  # overlapping, but not the exact in-place form (the root's own block)
            return self._go(async_op, [functools.partial(self.comm.gather, ibuf, root=root, out=flat)], outs)
        # Each rank's block straight into its own tensor (the engine takes a
        # list of places: no staging buffer, no copy out); see places().
        bufs, finish = _places(outs)
        if any(_overlaps(ibuf, b) and not (j == root and _same(ibuf, b)) for j, b in enumerate(bufs)):
            ibuf = ibuf.clone()  # overlapping, but not the exact in-place form (the root's own block)
        return self._go(async_op, [functools.partial(self.comm.gather, ibuf, root=root, out=bufs)],
                        outs, finish)  # (result(): the tensors, as gloo's)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """torch passes [scatter_list] on the root and [] elsewhere; every
        rank's output has the same size (as gloo requires)."""
        opts = opts if opts is not None else dist.ScatterOptions()
        if isinstance(output_tensors, torch.Tensor):
            output_tensors = [output_tensors]
        if len(output_tensors) != 1:
            raise NotImplementedError("ringcomm backend: scatter of several tensors per rank is not implemented")
        out = output_tensors[0]
        root = opts.rootRank
        if not opts.asyncOp and out.layout == torch.strided:  # the fast lane (_sync), torch's rules first
            done = self._scatter_now(out, input_tensors, root)
            if done is not None:
                return done
        _check_dtype(out, "scatter")
        obuf, ocopied = _flat(out)
        finish = (lambda: out.detach().copy_(obuf.view_as(out))) if ocopied else None
        if self.rank() != root:
            if input_tensors and any(len(i) for i in input_tensors):
                raise ValueError(f"ringcomm backend: scatter: input tensors given on a rank other than the root "
                                 f"({root})")
            return self._go(opts.asyncOp, [functools.partial(self.comm.scatter, None, root=root, out=obuf)],
                            [out], finish)
        bufs = self._scatter_sources(input_tensors, out, obuf, root)
        return self._go(opts.asyncOp, [functools.partial(self.comm.scatter, bufs, root=root, out=obuf)],
                        [out], finish)

    def _scatter_now(self, out, input_tensors, root: int):
        """scatter on the fast lane (_sync) where torch's rules hold, else None."""
        n = self.size()
        if self.rank() != root:
            if not (input_tensors and any(len(i) for i in input_tensors)):
                return self._sync(lambda: self.comm.scatter(None, root=root, out=out), [out])
            return None
        if len(input_tensors) == 1 and len(input_tensors[0]) == n and \
                all(i.dtype == out.dtype and i.numel() == out.numel() for i in input_tensors[0]):
            ins = list(input_tensors[0])  # (each block read from its tensor: the engine takes a list)
            return self._sync(lambda: self.comm.scatter(ins, root=root, out=out), [out])
        return None

    def _scatter_sources(self, input_tensors, out, obuf, root: int):
        """What the root's scatter reads: one flat tensor over consecutive
        blocks, else a list of places."""
        n = self.size()
        if len(input_tensors) != 1 or len(input_tensors[0]) != n:
            raise ValueError(f"ringcomm backend: scatter needs a list of {n} input tensors on the root")
        ins = input_tensors[0]
        for i in ins:
            if i.dtype != out.dtype or i.numel() != out.numel():
                raise ValueError(f"ringcomm backend: scatter: every input tensor must be a {out.dtype} of "
                                 f"{out.numel()} elements, like the output (got {i.dtype}, {i.numel()})")
        flat = _adjacent(ins)
        if flat is not None:  # consecutive blocks of one buffer: read in place
            if _overlaps(flat, obuf):
                flat = flat.clone()  # the root's own block given as its output too: keep the engine's in/out apart
            return flat
        # Each block read straight from its own tensor (the engine takes a
        # list of places: no staging buffer), a non-contiguous one through
        # a contiguous copy; one that overlaps this rank's output other
        # than as its exact own block, through a copy too.
        bufs = [_flat(i)[0] for i in ins]
        return [b.clone() if _overlaps(b, obuf) and not (j == root and _same(b, obuf)) else b
                for j, b in enumerate(bufs)]

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        """torch's all_to_all_single: split sizes count rows of dim 0 (empty:
        equal blocks); ringcomm's all_to_all takes element counts."""
        opts = opts if opts is not None else dist.AllToAllOptions()
        n = self.size()
        _check_dtype(input, "all_to_all_single")
        if output.dtype != input.dtype:
            raise TypeError(f"ringcomm backend: all_to_all_single: output dtype {output.dtype} != input dtype "
                            f"{input.dtype}")
        # Always per-peer blocks, equal ones spelled out: torch lets one rank
        # leave its split sizes empty while the others give them (gloo and
        # NCCL take that), and ringcomm's equal-blocks call differs on the wire.
        splits = _elements(input, input_split_sizes, n, "input") or [input.numel() // n] * n
        out_splits = _elements(output, output_split_sizes, n, "output") or [output.numel() // n] * n
        if not opts.asyncOp and output.layout == torch.strided:  # (a mixture-of-experts dispatch)
            done = self._sync(lambda: self.comm.all_to_all(input, splits, out_splits, out=output), [output])
            if done is not None:
                return done
        ibuf, _ = _flat(input)
        obuf, ocopied = _flat(output)
        if _overlaps(ibuf, obuf):
            ibuf = ibuf.clone()  # all_to_all reads every block of the input after writing some of the output
        finish = (lambda: output.detach().copy_(obuf.view_as(output))) if ocopied else None
        return self._go(opts.asyncOp, [functools.partial(self.comm.all_to_all, ibuf, splits, out_splits, out=obuf)],
                        [output], finish)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """The list form: input_tensors[p] goes to rank p, output_tensors[p]
        comes from rank p; sizes may differ per peer (one all_to_all with
        per-peer counts, straight from and into the tensors: the engine takes
        lists of places; non-contiguous ones through contiguous copies)."""
        opts = opts if opts is not None else dist.AllToAllOptions()
        n = self.size()
        if len(input_tensors) != n or len(output_tensors) != n:
            raise ValueError(f"ringcomm backend: all_to_all needs {n} input and {n} output tensors, got "
                             f"{len(input_tensors)} and {len(output_tensors)}")
        dtype = input_tensors[0].dtype
        for t in list(input_tensors) + list(output_tensors):
            _check_dtype(t, "all_to_all")
            if t.dtype != dtype:
                raise TypeError(f"ringcomm backend: all_to_all with tensors of dtypes {dtype} and {t.dtype}")
        outs = list(output_tensors)
        obufs, finish = _places(outs)
        ibufs = [_flat(t)[0] for t in input_tensors]
        for j in spans_meeting(_spans(ibufs), _spans(obufs)):  # (torch allows it; the outputs are apart)
            ibufs[j] = ibufs[j].clone()
        return self._go(opts.asyncOp, [functools.partial(self.comm.all_to_all, ibufs, out=obufs)], outs, finish)

    # ---- point-to-point ------------------------------------------------------
    # torch calls these for dist.send/recv/isend/irecv and, one by one, for
    # dist.batch_isend_irecv (this group is not a plain ProcessGroup, so torch
    # takes its "backend does not coalesce" path). Each is posted at once on
    # ringcomm's point-to-point channel (beside the collectives, never matched
    # with them) and progressed by whoever waits, so a batch in any order
    # does not deadlock; the Work is pending until wait().
    def _p2p_tensor(self, tensors, what: str) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise NotImplementedError(f"ringcomm backend: {what} of several tensors per call is not implemented")
        _check_dtype(tensors[0], what, any_dtype=True)
        return tensors[0]

    def send(self, tensors, dst: int, tag: int = 0):
        t = self._p2p_tensor(tensors, "send")
        buf, _ = _flat(t)  # a contiguous copy stays alive in the ringcomm Work until sent
        return PendingWork(self._completer, [self.comm.isend(_bytes_if_foreign(buf), int(dst), tag=int(tag))], [t],
                           source=int(dst))

    def _recv(self, tensors, src, tag: int, what: str):
        t = self._p2p_tensor(tensors, what)
        buf, copied = _flat(t)
        w = self.comm.irecv(_bytes_if_foreign(buf), src, tag=int(tag))
        finish = (lambda: t.detach().copy_(buf.view_as(t))) if copied else None
        return PendingWork(self._completer, [w], [t], finish, source=lambda: w.source)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._recv(tensors, int(src), tag, "recv")

    def recv_anysource(self, tensors, tag: int = 0):
        """A receive from whichever rank sends first; ``source_rank()`` of the
        Work (torch's dist.recv return value) is the sender."""
        return self._recv(tensors, None, tag, "recv_anysource")

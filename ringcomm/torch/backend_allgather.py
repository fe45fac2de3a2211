"""The "ringcomm" torch backend's all_gather in its forms (list, single
tensor, in place, coalesced): a part of ``ProcessGroupRingcomm``
(backend.py), kept in a file of its own."""

from __future__ import annotations

import functools

import torch

from .backend_tensors import adjacent as _adjacent, check_dtype as _check_dtype, flat as _flat
from .backend_tensors import overlaps as _overlaps
from .work import PendingWork

__all__ = ["AllGatherOps"]


def _allgather_opts():
    from torch._C._distributed_c10d import AllgatherOptions
    return AllgatherOptions()



class AllGatherOps:
    """ProcessGroupRingcomm's all_gather methods (they use its comm, _sync and _go)."""

    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool, what: str):
        """all_gather of inp (every rank's same size) into out (size * inp);
        returns (start, finish) for _go."""
        _check_dtype(inp, what)
        if out.dtype != inp.dtype:
            raise TypeError(f"ringcomm backend: {what}: output dtype {out.dtype} != input dtype {inp.dtype}")
        if out.numel() != inp.numel() * self.size():
            raise ValueError(f"ringcomm backend: {what}: output has {out.numel()} elements, expected "
                             f"{self.size()} x {inp.numel()}")
        obuf, ocopied = _flat(out)
        ibuf, _ = _flat(inp)
        k, r = inp.numel(), self.rank()
        if ibuf.data_ptr() != obuf.data_ptr() + r * k * ibuf.element_size() and _overlaps(ibuf, obuf):
            ibuf = ibuf.clone()  # overlapping, but not the exact in-place form

        return (functools.partial(self.comm.all_gather, ibuf, out=obuf),
                (lambda: out.detach().copy_(obuf.view_as(out))) if ocopied else None)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        opts = opts if opts is not None else _allgather_opts()
        # (torch's size rule first: the communicator would also take the
        # split rule's uneven chunks, where one rank may match and another not)
        if not opts.asyncOp and output.numel() == input.numel() * self.size() and \
                input.layout == output.layout == torch.strided:
            done = self._sync(lambda: self.comm.all_gather(input, out=output), [output])
            if done is not None:
                return done
        start, finish = self._gather_into(output, input, opts.asyncOp, "all_gather_into_tensor")
        return self._go(opts.asyncOp, [start], [output], finish)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        return self._allgather_base(output, input, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _allgather_opts()
        if isinstance(input_tensors, torch.Tensor):
            input_tensors, output_tensors = [input_tensors], [output_tensors]
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            return self._allgather_several(output_tensors, input_tensors, opts)
        inp, outs = input_tensors[0], output_tensors[0]
        if len(outs) != self.size():
            raise ValueError(f"ringcomm backend: allgather needs {self.size()} output tensors, got {len(outs)}")
        # Rank i's block lands in outs[i] as it is (gloo's rule): our own must
        # be the input's shape; another of a different size would be the
        # uneven form (NCCL's), not done here.
        for i in [self.rank()] + list(range(len(outs))):
            o = outs[i]
            if o.numel() != inp.numel() and i != self.rank():
                raise NotImplementedError("ringcomm backend: allgather with tensors of different sizes per rank "
                                          "is not implemented")
            if o.shape != inp.shape:
                raise ValueError(f"ringcomm backend: allgather: invalid tensor size at index {i} (expected "
                                 f"{tuple(inp.shape)}, got {tuple(o.shape)})")
        whole = _adjacent(list(outs))
        if whole is not None and whole.dtype == inp.dtype:  # views of one buffer (all_gather_object's): straight in
            start, _ = self._gather_into(whole, inp, opts.asyncOp, "allgather")
            return self._go(opts.asyncOp, [start], list(outs))  # (result(): the tensors, as gloo's)
        flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
        start, _ = self._gather_into(flat, inp, opts.asyncOp, "allgather")
        k = inp.numel()

        def finish():
            for i, o in enumerate(outs):
                o.detach().copy_(flat[i * k:(i + 1) * k].view_as(o))

        return self._go(opts.asyncOp, [start], list(outs), finish)

    def _allgather_several(self, output_tensors, input_tensors, opts):
        """allgather with k input tensors per rank (the list-of-lists form
        from torch's one-process-several-devices days, as gloo still takes
        it): k output lists of k * size tensors, all of the inputs' dtype
        and shape; every list receives the whole result, rank r's input i
        at index r * k + i."""
        n, k = self.size(), len(input_tensors)
        if not k:
            raise ValueError("ringcomm backend: allgather needs a non-empty input tensor list")
        if len(output_tensors) != k:
            raise ValueError(f"ringcomm backend: allgather of {k} input tensor(s) takes {k} output list(s) (one per "
                             f"input), got {len(output_tensors)}")
        ref = input_tensors[0]
        for j, outs in enumerate(output_tensors):
            if len(outs) != k * n:
                raise ValueError(f"ringcomm backend: allgather: output list {j} has {len(outs)} tensors, expected "
                                 f"{k * n} ({k} input(s) x {n} ranks)")
        for what, ts in [("input", input_tensors)] + [(f"output list {j}", o) for j, o in enumerate(output_tensors)]:
            for i, t in enumerate(ts):
                if t.dtype != ref.dtype or t.shape != ref.shape:
                    raise ValueError(f"ringcomm backend: allgather: {what}, tensor {i}: {t.dtype} of shape "
                                     f"{tuple(t.shape)}, expected {ref.dtype} of shape {tuple(ref.shape)} (every "
                                     "tensor like the first input)")
        first = list(output_tensors[0])
        per_rank = [first[r * k:(r + 1) * k] for r in range(n)]

        def copy_to_the_other_lists():
            for outs in output_tensors[1:]:
                for o, src in zip(outs, first):
                    o.detach().copy_(src)

        return self._allgather_lists(per_rank, list(input_tensors), opts.asyncOp, "allgather",
                                     [list(o) for o in output_tensors], copy_to_the_other_lists)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch's all_gather_coalesced: output_lists[r][i] receives rank r's
        input_list[i] (one list per rank, each shaped like input_list, as
        gloo's). The inputs may differ in shape, not in dtype; one all_gather
        of them laid back to back carries the lot."""
        opts = opts if opts is not None else _allgather_opts()
        n = self.size()
        if not input_list:
            raise ValueError("ringcomm backend: all_gather_coalesced needs a non-empty input tensor list")
        if len(output_lists) != n:
            raise ValueError(f"ringcomm backend: all_gather_coalesced needs one output list per rank ({n}), got "
                             f"{len(output_lists)}")
        dtype = input_list[0].dtype
        for i, t in enumerate(input_list):
            if t.dtype != dtype:
                raise TypeError(f"ringcomm backend: all_gather_coalesced: input {i} is {t.dtype}, input 0 is "
                                f"{dtype} (one dtype per call, as gloo's)")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(f"ringcomm backend: all_gather_coalesced: output list {r} has {len(outs)} tensors, "
                                 f"expected {len(input_list)} (one per input)")
            for i, (o, t) in enumerate(zip(outs, input_list)):
                if o.dtype != dtype or o.shape != t.shape:
                    raise ValueError(f"ringcomm backend: all_gather_coalesced: output list {r}, tensor {i}: "
                                     f"{o.dtype} of shape {tuple(o.shape)}, expected {dtype} of shape "
                                     f"{tuple(t.shape)} (like input {i})")
        return self._allgather_lists([list(o) for o in output_lists], list(input_list), opts.asyncOp,
                                     "all_gather_coalesced", [list(o) for o in output_lists])

    def _allgather_lists(self, per_rank, inputs, async_op: bool, what: str, result, then=None):
        """One all_gather of this rank's `inputs` (flattened back to back)
        whose result lands in per_rank[r], rank r's tensors in input order
        (the callers checked shapes and dtypes). Straight into them when they
        lie back to back in one buffer, else through a flat buffer copied out
        after; then `then`, if given."""
        for t in inputs:
            _check_dtype(t, what)
        flat_in = torch.cat([t.detach().reshape(-1) for t in inputs])  # (a copy: never overlaps the outputs)
        outs = [o for lst in per_rank for o in lst]
        whole = _adjacent(outs)
        if whole is not None and whole.dtype != flat_in.dtype:
            whole = None
        flat_out = whole if whole is not None else torch.empty(flat_in.numel() * self.size(), dtype=flat_in.dtype)
        start, _ = self._gather_into(flat_out, flat_in, async_op, what)
        if whole is not None and then is None:
            return self._go(async_op, [start], result)

        def finish():
            if whole is None:
                off = 0
                for o in outs:
                    o.detach().copy_(flat_out[off:off + o.numel()].view_as(o))
                    off += o.numel()
            if then is not None:
                then()

        return self._go(async_op, [start], result, finish)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _allgather_opts()
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return PendingWork(self._completer, works, list(outputs))

"""The torch.distributed backend "ringcomm": PyTorch's own DDP, FSDP2 and
``dist.*`` collectives running over ringcomm's ring (and its ledger, flight
recorder and failure model).

Registered by ``import ringcomm.torch``; then, under ``ringcomm run -n N`` or
plain ``mpirun``::

    import torch.distributed as dist, ringcomm.torch
    dist.init_process_group("ringcomm")          # rank and size from MPI

The backend is a ``torch.distributed.ProcessGroup`` written in Python (the way
torch accepts third-party Python backends: ``register_backend(...,
extended_api=True)``); each group owns a ringcomm Communicator over an MPI
communicator of its ranks (``new_group`` builds one with MPI_Comm_create_group).

What it does with torch's calls:

* allreduce (SUM, PRODUCT, MIN, MAX, AVG, and BAND, BOR, BXOR on integer and
  bool tensors; PREMUL_SUM by scaling first),
  broadcast, allgather (list form, ``_allgather_base`` / ``all_gather_single``
  including the in-place form), reduce_scatter (list and single forms),
  reduce (the same ops; only the root's tensor is written, a non-root's is
  only read, as NCCL does), gather and scatter (torch's lists at the root,
  blocks of equal size as gloo requires), ``alltoall_base`` /
  ``all_to_all_single`` (``input_split_sizes`` / ``output_split_sizes`` in
  rows of dim 0, empty meaning equal blocks), ``alltoall`` (the list form,
  also with different sizes per peer, which gloo refuses), barrier, and the
  coalesced forms torch calls (allreduce, allgather, all_gather_into_tensor,
  reduce_scatter_tensor). Together these carry torch's object collectives,
  DTensor, tensor parallelism and torch.distributed.checkpoint.
* Point-to-point: send, recv, recv_anysource (``dist.recv`` with no ``src``
  returns the sender: the Work's ``source_rank()``), so isend/irecv and
  ``batch_isend_irecv`` (which torch issues op by op for a Python group) and
  pipeline parallelism; tags pass through. Each op is posted at once on
  ringcomm's point-to-point channel and the Work stays pending until waited.
* Not implemented, NotImplementedError naming the op: several tensors per
  rank in broadcast/reduce/gather/scatter/send/recv. monitored_barrier is
  torch's gloo-only op (torch reserves it for gloo) and stays refused here.
* ``opts.asyncOp`` False (``dist.all_reduce(t)``): the collective runs on the
  calling thread (no handoff) and a completed Work is returned. True
  (``async_op=True``, DDP's buckets): queued on the communicator's engine, so
  it overlaps the caller; ``get_future()`` completes from a helper thread
  that waits for the group's collectives in issue order.
* Non-contiguous tensors go through a contiguous copy (copied back after);
  tensors that require grad are read and written through their storage
  (``.detach()``), as torch's own backends do; dtypes ringcomm lacks raise
  TypeError naming the dtype.
* Errors (timeouts, mismatches, a peer that never joined) reach whoever waits:
  ``Work.wait()`` raises the ringcomm exception, ``get_future()`` is completed
  with it.
"""

from __future__ import annotations

import functools
import math
import sys

import torch
import torch.distributed as dist

from .. import vocab
from .._arrays import meeting_pairs, spans_meeting
from ..errors import InvalidArgument
from .work import Completer, DoneWork, PendingWork

__all__ = ["ProcessGroupRingcomm", "register", "communicator"]

BACKEND = "ringcomm"
_RedOp = dist.ReduceOp.RedOpType
# Keyed by the enum's value: hashing torch's (pybind11) enum costs 0.4 us, its .value 0.08.
_OPS = {k.value: v for k, v in ((_RedOp.SUM, "sum"), (_RedOp.PRODUCT, "prod"), (_RedOp.MIN, "min"),
                                 (_RedOp.MAX, "max"), (_RedOp.AVG, "avg"), (_RedOp.BAND, "band"),
                                 (_RedOp.BOR, "bor"), (_RedOp.BXOR, "bxor"))}


# ---------------------------------------------------------------------------
def _check_dtype(t: torch.Tensor, op: str, any_dtype: bool = False) -> None:
    """Refuse what the engine cannot take. any_dtype: the op only moves the
    tensor's bytes (send, recv), so any dtype goes (gloo's rule too)."""
    if t.layout != torch.strided:  # (torch's own check of a sparse tensor's memory names no cause)
        raise NotImplementedError(f"ringcomm backend: {op} on a {t.layout} tensor; only dense (strided) tensors "
                                  "are supported here (of sparse tensors: all_reduce SUM)")
    if vocab.torch_name(t.dtype) is None and not any_dtype:
        raise TypeError(f"ringcomm backend: {op} on a {t.dtype} tensor; supported dtypes: {vocab.SUPPORTED}")
    if t.device.type != "cpu":
        raise NotImplementedError(f"ringcomm backend: {op} on a {t.device} tensor; this backend is registered "
                                  "for CPU tensors (GPU collectives: ringcomm.init(device='cuda'))")


def _real(t: torch.Tensor, red, what: str) -> torch.Tensor:
    """A complex tensor as its real view (torch.view_as_real: the same
    storage), for the reductions torch hands over complex (it converts for
    all_reduce itself, not for reduce or reduce_scatter). Only sums are
    elementwise on the real and imaginary parts."""
    if not t.is_complex():
        return t
    kind = red.op if hasattr(red, "op") else red
    if kind not in (_RedOp.SUM, _RedOp.AVG, _RedOp.PREMUL_SUM):
        raise TypeError(f"ringcomm backend: {what} of a {t.dtype} tensor with op {kind}: complex numbers "
                        "reduce by SUM, AVG or PREMUL_SUM only")
    return torch.view_as_real(t)


def _bytes_if_foreign(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of a dtype the engine does not know (float8,
    complex32, ...) as its bytes (the same storage), for the ops that only
    move bytes: then both sides must name the same dtype, as over gloo, and
    the receive's size check counts bytes."""
    if vocab.torch_name(t.dtype) is not None:
        return t
    return t.reshape(-1).view(torch.uint8)


def _flat(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """t itself when contiguous (ringcomm reads its storage directly, also
    when it requires grad), else a contiguous copy: then the second value is
    True and the result must be copied back."""
    if t.is_contiguous():
        return t, False
    return t.detach().contiguous(), True


class ProcessGroupRingcomm(dist.ProcessGroup):
    """A torch.distributed process group whose collectives are ringcomm's."""

    def __init__(self, comm, rank: int, size: int):
        super().__init__(rank, size)
        self.comm = comm
        self._group_name = ""
        self._group_desc = ""
        self._completer = Completer(f"ringcomm-pg-{rank}")
        self._done = DoneWork([])  # handed out again once nobody holds it (see _done_work)

    # ---- identity (torch asks for these) --------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def name(self) -> str:
        return BACKEND

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        super()._set_group_name(name)

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    # ---- helpers ----------------------------------------------------------
    def _op(self, red, tensor: torch.Tensor, what: str) -> tuple[str, float | None]:
        kind = red.op if hasattr(red, "op") else red
        if kind == _RedOp.PREMUL_SUM:
            if not tensor.is_floating_point():
                raise TypeError(f"ringcomm backend: {what} with op PREMUL_SUM needs a floating dtype, "
                                f"got {tensor.dtype}")
            return "sum", float(red.factor)
        op = _OPS.get(kind.value)
        if op is None:
            raise NotImplementedError(f"ringcomm backend: {what} with op {kind} is not implemented "
                                      "(supported: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM, BAND, BOR, BXOR)")
        if op == "avg" and not tensor.is_floating_point():
            raise TypeError(f"ringcomm backend: {what} with op AVG needs a floating dtype, got {tensor.dtype}")
        if op in vocab.BITWISE and tensor.is_floating_point():
            raise TypeError(f"ringcomm backend: {what} with op {kind} needs an integer or bool dtype, "
                            f"got {tensor.dtype}")
        return op, None

    def _done_work(self, result: list) -> DoneWork:
        """The Work of a synchronous call: making one costs about 1 us (a
        pybind11 object), a third of the backend's part of an 8-byte
        dist.all_reduce, so the last one is reused when torch has let go of
        it (dist.all_reduce waits on it and drops it), as the engine reuses
        its Work: only this object and the call's argument refer to it then."""
        w = self._done
        if sys.getrefcount(w) > 3:  # held elsewhere (this frame, the attribute and getrefcount's argument: 3)
            w = self._done = DoneWork(result)
        return w.reuse(result)

    def _sync(self, call, result: list) -> DoneWork | None:
        """The synchronous fast lane (dist.all_reduce(t) and the like): `call`
        runs the communicator's collective straight on the caller's tensors,
        on this thread; the native checks take a contiguous CPU tensor as they
        take a numpy array, and no flat copy, overlap test or pending Work is
        built. What the communicator refuses (InvalidArgument, raised before
        any byte moves: a non-contiguous or overlapping tensor, a dtype or op
        it lacks) returns None: the caller then takes its general path, which
        copies or raises torch's kind of error."""
        try:
            call()
        except InvalidArgument:
            return None
        return self._done_work(result)

    def _go(self, async_op: bool, starts: list, result: list, finish=None) -> PendingWork:
        """Start the ringcomm collectives `starts` (communicator methods with
        their arguments bound, taking async_op), then hand torch one Work for
        them all: still pending (async), or complete."""
        works = [start(async_op=async_op) for start in starts]
        return PendingWork(self._completer, works if async_op else [], result, finish)

    # ---- collectives ------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if not opts.asyncOp and len(tensors) == 1 and tensors[0].layout == torch.strided:
            op = _OPS.get(opts.reduceOp.op.value)  # (PREMUL_SUM has none: the general path scales first)
            if op is not None:
                done = self._sync(lambda: self.comm.all_reduce(tensors[0], op=op), tensors)
                if done is not None:
                    return done
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        if t.layout == torch.sparse_coo:
            return self._sparse_allreduce(t, opts)
        _check_dtype(t, "allreduce")
        op, factor = self._op(opts.reduceOp, t, "allreduce")
        buf, copied = _flat(t)
        if factor is not None:  # PREMUL_SUM: the result replaces t anyway
            buf.detach().mul_(factor)

        return self._go(opts.asyncOp, [functools.partial(self.comm.all_reduce, buf, op=op)], [t], (lambda: t.detach().copy_(buf.view_as(t))) if copied else None)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not tensors:
            return PendingWork(self._completer, [], [])
        for t in tensors:
            _check_dtype(t, "allreduce_coalesced")
            op, factor = self._op(opts.reduceOp, t, "allreduce_coalesced")  # (AVG, PREMUL_SUM: every dtype)
        # One collective per dtype over a flat buffer: one ring pass instead of many.
        groups: dict = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        flats = []
        for dtype, ts in sorted(groups.items(), key=lambda kv: str(kv[0])):
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            if factor is not None:
                flat.mul_(factor)
            flats.append((flat, ts))

        def finish():
            for flat, ts in flats:
                off = 0
                for t in ts:
                    t.detach().copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()

        return self._go(opts.asyncOp, [functools.partial(self.comm.all_reduce, f, op=op) for f, _ in flats],
                        list(tensors), finish)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise NotImplementedError("ringcomm backend: broadcast of several tensors per rank is not implemented")
        t = tensors[0]
        if not opts.asyncOp and t.layout == torch.strided:
            done = self._sync(lambda: self.comm.broadcast(t, root=opts.rootRank), tensors)
            if done is not None:
                return done
        _check_dtype(t, "broadcast")
        buf, copied = _flat(t)
        # The root's tensor is only read: no copy back (an expanded tensor, whose
        # elements share memory, could not take one).
        back = copied and self.rank() != opts.rootRank
        return self._go(opts.asyncOp, [functools.partial(self.comm.broadcast, buf, root=opts.rootRank)], [t],
                        (lambda: t.detach().copy_(buf.view_as(t))) if back else None)

    def _sparse_allreduce(self, t: torch.Tensor, opts) -> DoneWork:
        """The sum of sparse COO tensors (DDP over nn.Embedding(sparse=True)),
        as gloo computes it: every rank's coalesced indices and values are
        all-gathered (padded to the largest count: all_gather takes equal
        blocks) and the union is coalesced, so equal indices add up. The
        result replaces `t` and is the Work's result (DDP takes it from
        there). Runs to completion before it returns, also when asked async."""
        if opts.reduceOp.op != dist.ReduceOp.SUM:
            raise NotImplementedError(f"ringcomm backend: allreduce of a sparse tensor with {opts.reduceOp.op}; "
                                      "only SUM is implemented (as gloo's)")
        mine = t.coalesce()
        idx, val = mine.indices().contiguous(), mine.values().contiguous()
        _check_dtype(val, "allreduce (sparse values)")
        counts = self.comm.all_gather(torch.tensor([idx.shape[1]], dtype=torch.int64)).tolist()
        most, dims = max(counts), idx.shape[0]
        row = math.prod(val.shape[1:])  # value elements per index (a hybrid tensor's dense part)
        pad_idx = torch.zeros(dims, most, dtype=torch.int64)
        pad_idx[:, :idx.shape[1]] = idx
        pad_val = torch.zeros(most * row, dtype=val.dtype)
        pad_val[:val.numel()] = val.reshape(-1)
        all_idx = self.comm.all_gather(pad_idx.reshape(-1)).reshape(self.size(), dims, most)
        all_val = self.comm.all_gather(pad_val).reshape(self.size(), most, *val.shape[1:])
        total = torch.sparse_coo_tensor(torch.cat([all_idx[r, :, :c] for r, c in enumerate(counts)], dim=1),
                                        torch.cat([all_val[r, :c] for r, c in enumerate(counts)]),
                                        t.shape).coalesce()
        with torch.no_grad():
            t.copy_(total)
        return DoneWork([t])

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

    def _scatter_from(self, out: torch.Tensor, inp: torch.Tensor, opts, what: str):
        out, inp = _real(out, opts.reduceOp, what), _real(inp, opts.reduceOp, what)
        _check_dtype(inp, what)
        op, factor = self._op(opts.reduceOp, inp, what)
        if out.dtype != inp.dtype:
            raise TypeError(f"ringcomm backend: {what}: output dtype {out.dtype} != input dtype {inp.dtype}")
        if inp.numel() != out.numel() * self.size():
            raise ValueError(f"ringcomm backend: {what}: input has {inp.numel()} elements, expected "
                             f"{self.size()} x {out.numel()}")
        ibuf, icopied = _flat(inp)
        if factor is not None:  # PREMUL_SUM: scale a copy, never the caller's input
            ibuf = (ibuf if icopied else ibuf.detach().clone()).mul_(factor)
        obuf, ocopied = _flat(out)
        k, r = obuf.numel(), self.rank()
        if not icopied and factor is None and _overlaps(ibuf, obuf) and \
                obuf.data_ptr() != ibuf.data_ptr() + r * k * ibuf.element_size():
            ibuf = ibuf.clone()  # overlapping, but not the exact in-place form (this rank's chunk)

        return (functools.partial(self.comm.reduce_scatter, ibuf, op=op, out=obuf),
                (lambda: out.detach().copy_(obuf.view_as(out))) if ocopied else None)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts if opts is not None else _reduce_scatter_opts()
        if not opts.asyncOp and input.numel() == output.numel() * self.size() and \
                input.layout == output.layout == torch.strided:  # (the size rule first: as _allgather_base's)
            op = _OPS.get(opts.reduceOp.op.value)  # (PREMUL_SUM has none; complex is refused: _real below)
            if op is not None:
                done = self._sync(lambda: self.comm.reduce_scatter(input, op=op, out=output), [output])
                if done is not None:
                    return done
        start, finish = self._scatter_from(output, input, opts, "reduce_scatter_tensor")
        return self._go(opts.asyncOp, [start], [output], finish)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _reduce_scatter_opts()
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        if len(output_tensors) != 1:
            works = [self.reduce_scatter([o], [i], opts) for o, i in zip(output_tensors, input_tensors)]
            return PendingWork(self._completer, works, list(output_tensors))
        out, ins = output_tensors[0], input_tensors[0]
        if len(ins) != self.size() or any(i.numel() != out.numel() for i in ins):
            raise ValueError(f"ringcomm backend: reduce_scatter needs {self.size()} input tensors of "
                             f"{out.numel()} elements each")
        flat = torch.cat([i.detach().reshape(-1) for i in ins])
        start, finish = self._scatter_from(out, flat, opts, "reduce_scatter")
        return self._go(opts.asyncOp, [start], [out], finish)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _reduce_scatter_opts()
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return PendingWork(self._completer, works, list(outputs))

    # ---- rooted collectives and all-to-all (issue 23) ----------------------
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise NotImplementedError("ringcomm backend: reduce of several tensors per rank is not implemented")
        if not opts.asyncOp and tensors[0].layout == torch.strided:
            op = _OPS.get(opts.reduceOp.op.value)  # (PREMUL_SUM has none: the general path scales first)
            if op is not None:
                done = self._sync(lambda: self.comm.reduce(tensors[0], root=opts.rootRank, op=op), tensors)
                if done is not None:
                    return done
        t = _real(tensors[0], opts.reduceOp, "reduce")
        _check_dtype(t, "reduce")
        op, factor = self._op(opts.reduceOp, t, "reduce")
        root = opts.rootRank
        buf, copied = _flat(t)
        if factor is not None:
            # PREMUL_SUM: the root's tensor is replaced by the result anyway;
            # elsewhere torch leaves the input alone, so scale a copy.
            if self.rank() == root:
                buf.detach().mul_(factor)
            else:
                buf = (buf if copied else buf.detach().clone()).mul_(factor)
        # Only the root's tensor receives the result; a non-root's is only read.
        finish = (lambda: t.detach().copy_(buf.view_as(t))) if copied and self.rank() == root else None
        return self._go(opts.asyncOp, [functools.partial(self.comm.reduce, buf, root=root, op=op)], [t], finish)

    def gather(self, output_tensors, input_tensors, opts=None):
        """torch passes [gather_list] on the root and [] elsewhere; every
        rank's input has the same size (as gloo requires)."""
        opts = opts if opts is not None else dist.GatherOptions()
        if isinstance(input_tensors, torch.Tensor):
            input_tensors = [input_tensors]
        if len(input_tensors) != 1:
            raise NotImplementedError("ringcomm backend: gather of several tensors per rank is not implemented")
        inp = input_tensors[0]
        root, n = opts.rootRank, self.size()
        if not opts.asyncOp and inp.layout == torch.strided:  # the fast lane (_sync), torch's rules first
            done = None
            if self.rank() != root:
                if not any(len(o) for o in output_tensors):
                    done = self._sync(lambda: self.comm.gather(inp, root=root), [])
            elif len(output_tensors) == 1 and len(output_tensors[0]) == n and \
                    all(o.dtype == inp.dtype and o.numel() == inp.numel() for o in output_tensors[0]):
                outs = list(output_tensors[0])  # (each block straight into its tensor: the engine takes a list)
                done = self._sync(lambda: self.comm.gather(inp, root=root, out=outs), outs)
            if done is not None:
                return done
        _check_dtype(inp, "gather")
        ibuf, _ = _flat(inp)
        if self.rank() != root:
            if output_tensors and any(len(o) for o in output_tensors):
                raise ValueError("ringcomm backend: gather: output tensors given on a rank other than the root "
                                 f"({root})")
            return self._go(opts.asyncOp, [functools.partial(self.comm.gather, ibuf, root=root)], [])
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
            return self._go(opts.asyncOp, [functools.partial(self.comm.gather, ibuf, root=root, out=flat)], outs)
        # Each rank's block straight into its own tensor (the engine takes a
        # list of places: no staging buffer, no copy out); see _places.
        bufs, finish = _places(outs)
        if any(_overlaps(ibuf, b) and not (j == root and _same(ibuf, b)) for j, b in enumerate(bufs)):
            ibuf = ibuf.clone()  # overlapping, but not the exact in-place form (the root's own block)
        return self._go(opts.asyncOp, [functools.partial(self.comm.gather, ibuf, root=root, out=bufs)],
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
        root, n = opts.rootRank, self.size()
        if not opts.asyncOp and out.layout == torch.strided:  # the fast lane (_sync), torch's rules first
            done = None
            if self.rank() != root:
                if not (input_tensors and any(len(i) for i in input_tensors)):
                    done = self._sync(lambda: self.comm.scatter(None, root=root, out=out), [out])
            elif len(input_tensors) == 1 and len(input_tensors[0]) == n and \
                    all(i.dtype == out.dtype and i.numel() == out.numel() for i in input_tensors[0]):
                ins = list(input_tensors[0])  # (each block read from its tensor: the engine takes a list)
                done = self._sync(lambda: self.comm.scatter(ins, root=root, out=out), [out])
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
            return self._go(opts.asyncOp, [functools.partial(self.comm.scatter, flat, root=root, out=obuf)],
                            [out], finish)
        # Each block read straight from its own tensor (the engine takes a
        # list of places: no staging buffer), a non-contiguous one through
        # a contiguous copy; one that overlaps this rank's output other
        # than as its exact own block, through a copy too.
        bufs = [_flat(i)[0] for i in ins]
        bufs = [b.clone() if _overlaps(b, obuf) and not (j == root and _same(b, obuf)) else b
                for j, b in enumerate(bufs)]
        return self._go(opts.asyncOp, [functools.partial(self.comm.scatter, bufs, root=root, out=obuf)],
                        [out], finish)

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

    def barrier(self, opts=None):
        async_op = getattr(opts, "asyncOp", True) if opts is not None else True

        return self._go(async_op, [self.comm.barrier], [])

    # ---- what ringcomm does not do: a clear error, not a confusing one -----
    def _unsupported(self, op: str):
        raise NotImplementedError(
            f"ringcomm backend: {op} is not implemented (supported: allreduce, broadcast, allgather, "
            "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, reduce, gather, scatter, "
            "all_to_all_single, all_to_all, barrier and their coalesced forms, send, recv, recv_anysource, "
            "batch_isend_irecv; monitored_barrier is torch's gloo-only op: torch reserves it for gloo); "
            "use a gloo group for it, e.g. dist.new_group(backend='gloo')")

    def shutdown(self) -> None:
        self.comm.close()

    def abort(self) -> None:
        self.comm.abort()


def _refuse(op: str):
    def method(self, *args, **kwargs):
        self._unsupported(op)
    method.__name__ = op
    return method


# torch's method name -> the op's name in torch.distributed, for the error.
# monitored_barrier is gloo's alone (torch reserves it for gloo).
for _name, _op in (("monitored_barrier", "monitored_barrier"),):
    setattr(ProcessGroupRingcomm, _name, _refuse(_op))


def _adjacent(ts):
    """One flat tensor over `ts` when they are contiguous, of one dtype, and
    lie back to back in one storage in list order (torch.chunk/split of a
    contiguous tensor, or views of one buffer): then the engine reads or
    writes them in place. None otherwise."""
    if not ts or not all(t.is_contiguous() for t in ts):
        return None
    t0 = ts[0]
    storage, esize, dtype = t0.untyped_storage().data_ptr(), t0.element_size(), t0.dtype
    ptr, total = t0.data_ptr(), 0
    for t in ts:
        if t.dtype != dtype or t.untyped_storage().data_ptr() != storage or t.data_ptr() != ptr + total * esize:
            return None
        total += t.numel()
    return torch.empty(0, dtype=dtype).set_(t0.untyped_storage(), t0.storage_offset(), (total,))


def _elements(t: torch.Tensor, split_sizes, n: int, what: str):
    """all_to_all_single's split sizes (rows of dim 0) as element counts;
    None for equal blocks (an empty list, as torch means it)."""
    if not split_sizes:
        if t.dim() and t.size(0) % n:
            raise ValueError(f"ringcomm backend: all_to_all_single: {what} has {t.size(0)} rows, not divisible "
                             f"by {n} ranks; pass {what}_split_sizes")
        return None
    if len(split_sizes) != n:
        raise ValueError(f"ringcomm backend: all_to_all_single: {len(split_sizes)} {what} split sizes for {n} ranks")
    rows = t.size(0) if t.dim() else 1
    if sum(split_sizes) != rows:
        raise ValueError(f"ringcomm backend: all_to_all_single: {what} split sizes sum to {sum(split_sizes)}, "
                         f"but the {what} has {rows} rows")
    row = math.prod(t.shape[1:])
    return [int(s) * row for s in split_sizes]


def _places(outs: list) -> tuple[list, object]:
    """Where the engine writes each output tensor's block: the tensor itself
    when it is contiguous and shares no memory with another output, else a
    buffer of its own, copied back after the call in list order (the same
    tensor given twice, as gloo allows: the last block wins). Returns the
    buffers and the copy back (None when nothing is to copy)."""
    shared = {j for pair in meeting_pairs(_spans(outs)) for j in pair}  # outputs sharing memory with another
    bufs, back = [], []
    for j, o in enumerate(outs):
        b, copied = _flat(o)
        if not copied and j in shared:
            b, copied = torch.empty(o.shape, dtype=o.dtype), True
        bufs.append(b)
        if copied:
            back.append((o, b))
    if not back:
        return bufs, None
    return bufs, lambda: [o.detach().copy_(b.view_as(o)) for o, b in back]


def _spans(ts) -> list[tuple[int, int]]:
    """Each tensor's bytes as (start, stop)."""
    return [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in ts]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same memory: one start, one length."""
    return a.data_ptr() == b.data_ptr() and a.numel() * a.element_size() == b.numel() * b.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _allgather_opts():
    from torch._C._distributed_c10d import AllgatherOptions
    return AllgatherOptions()


def _reduce_scatter_opts():
    from torch._C._distributed_c10d import ReduceScatterOptions
    return ReduceScatterOptions()


# ---------------------------------------------------------------------------
def _create(dist_opts, backend_opts=None) -> ProcessGroupRingcomm:
    """torch's factory: a ringcomm communicator over the group's ranks, over
    MPI when an MPI launcher started the job, else over the store torch hands
    every backend (torchrun; ringcomm/bootstrap.py)."""
    import ringcomm
    from .. import bootstrap
    from .._singleton import mpi
    timeout = dist_opts.timeout.total_seconds() if dist_opts.timeout is not None else None
    if timeout is not None and timeout <= 0:
        timeout = None
    if bootstrap.choose(True) == "store":
        # torch scoped the store to this group (and, under torchrun, to this
        # restart attempt): new_group and DeviceMesh never need MPI.
        comm = ringcomm.init(store=dist_opts.store, rank=dist_opts.group_rank, size=dist_opts.group_size,
                             timeout=timeout, bootstrap="store")
        return ProcessGroupRingcomm(comm, dist_opts.group_rank, dist_opts.group_size)
    MPI = mpi()  # a process no launcher started: MPI as a singleton without /dev/shm files
    world = MPI.COMM_WORLD
    rank, size = dist_opts.group_rank, dist_opts.group_size
    ranks = list(dist_opts.global_ranks_in_group)  # empty: all ranks (the default group)
    if not ranks:
        if world.size != size or world.rank != rank:
            raise RuntimeError(
                f"ringcomm backend: torch says rank {rank} of {size}, but MPI says rank {world.rank} of "
                f"{world.size}. Launch with `ringcomm run -n N python ...` or mpirun (torchrun starts processes "
                "that MPI cannot connect: there ringcomm bootstraps from torch's store, unless "
                "RINGCOMM_BOOTSTRAP=mpi; RINGCOMM_BOOTSTRAP=store makes it use the store; see README 'Use from "
                "PyTorch').")
        mpi_comm = world
    else:
        if world.rank not in ranks:
            raise RuntimeError(f"ringcomm backend: rank {world.rank} is not in the group {ranks}")
        mpi_comm = world.Create_group(world.group.Incl(ranks), tag=0x52434)
        if mpi_comm.rank != rank:
            raise RuntimeError(f"ringcomm backend: group rank mismatch ({mpi_comm.rank} != {rank})")
    comm = ringcomm.init(mpi_comm, timeout=timeout)
    if mpi_comm is not world:
        mpi_comm.Free()  # ringcomm duplicated it
    return ProcessGroupRingcomm(comm, rank, size)


_registered = False


def register() -> None:
    """Register the backend "ringcomm" with torch.distributed (idempotent)."""
    global _registered
    if _registered or BACKEND.upper() in dist.Backend._plugins:
        _registered = True
        return
    devices = ["cpu"]
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=devices)
    _registered = True


def communicator(group=None):
    """The ringcomm Communicator behind a "ringcomm" process group (default:
    the default group): its ledger, flight recorder and settings."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupRingcomm):
        raise InvalidArgument(f"not a ringcomm process group: {pg!r}")
    return pg.comm




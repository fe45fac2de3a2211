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
from ..errors import InvalidArgument
from .backend_allgather import AllGatherOps
from .backend_rooted import RootedOps
from .backend_tensors import check_dtype as _check_dtype, flat as _flat
from .backend_tensors import overlaps as _overlaps
from .work import Completer, DoneWork, PendingWork

__all__ = ["ProcessGroupRingcomm", "register", "communicator"]

BACKEND = "ringcomm"
_RedOp = dist.ReduceOp.RedOpType
# Keyed by the enum's value: hashing torch's (pybind11) enum costs 0.4 us, its .value 0.08.
_OPS = {k.value: v for k, v in ((_RedOp.SUM, "sum"), (_RedOp.PRODUCT, "prod"), (_RedOp.MIN, "min"),
                                 (_RedOp.MAX, "max"), (_RedOp.AVG, "avg"), (_RedOp.BAND, "band"),
                                 (_RedOp.BOR, "bor"), (_RedOp.BXOR, "bxor"))}


# ---------------------------------------------------------------------------
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


class ProcessGroupRingcomm(AllGatherOps, RootedOps, dist.ProcessGroup):
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

    # ---- rooted collectives and all-to-all ----------------------------------
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




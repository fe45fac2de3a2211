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

* allreduce (SUM, PRODUCT, MIN, MAX, AVG; PREMUL_SUM by scaling first),
  broadcast, allgather (list form, ``_allgather_base`` / ``all_gather_single``
  including the in-place form), reduce_scatter (list and single forms),
  barrier, and the coalesced forms; ops ringcomm does not have (send/recv,
  all_to_all, gather, scatter, reduce, bitwise reductions) raise
  NotImplementedError naming the op.
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

import collections
import datetime
import os
import socket
import threading

import torch
import torch.distributed as dist

from . import _dtypes
from .errors import InvalidArgument, RingcommError

__all__ = ["ProcessGroupRingcomm", "register", "launcher_env"]

BACKEND = "ringcomm"
_RedOp = dist.ReduceOp.RedOpType
_OPS = {_RedOp.SUM: "sum", _RedOp.PRODUCT: "prod", _RedOp.MIN: "min", _RedOp.MAX: "max", _RedOp.AVG: "avg"}
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                     torch.int32, torch.int64)
_DTYPE_CODES = {d: _dtypes.DTYPES[str(d).replace("torch.", "")] for d in _SUPPORTED_DTYPES}
_OP_CODES = {k: _dtypes.OPS[v] for k, v in _OPS.items()}
_AVG, _FLOAT_CODES = _dtypes.OPS["avg"], {_DTYPE_CODES[d] for d in _SUPPORTED_DTYPES if d.is_floating_point}


# ---------------------------------------------------------------------------
# Launch: rank and size from MPI, and the variables other torch backends need.
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launcher_env() -> None:
    """Fill torch's launcher variables from MPI, in an MPI job.

    RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE come from Open MPI's
    environment (no MPI call), overriding values inherited from the launching
    shell (which would be the same on every rank). MASTER_ADDR/MASTER_PORT
    (torch's TCPStore, also used by other backends such as a gloo subgroup),
    where missing: rank 0's address and a free port there, broadcast over
    MPI (a collective: every rank imports ringcomm.torch). ``ringcomm run``
    starts every job without inherited MASTER_ADDR/MASTER_PORT, so each job
    gets its own. Outside MPI nothing is changed (launch a single process
    with ``ringcomm run -n 1``).
    """
    env = os.environ
    if "OMPI_COMM_WORLD_SIZE" not in env:
        return
    for var, src in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                     ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")):
        if src in env:
            env[var] = env[src]
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return
    if int(env["OMPI_COMM_WORLD_SIZE"]) > 1:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        hosts = world.allgather(socket.gethostname())
        here = None
        if world.rank == 0:
            addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(socket.gethostname())
            here = (addr, _free_port())
        addr, port = world.bcast(here, root=0)
    else:
        addr, port = "127.0.0.1", _free_port()
    env.setdefault("MASTER_ADDR", addr)
    env.setdefault("MASTER_PORT", str(port))


# ---------------------------------------------------------------------------
class _Work(dist.Work):
    """A collective's handle with torch's semantics.

    `pending`: ringcomm Works still running (empty: already complete);
    `finish`: run once after they all succeed (copy results back);
    `result`: what ``result()`` and the future return (a list of tensors).
    """

    def __init__(self, pg: "ProcessGroupRingcomm", pending: list, result: list, finish=None):
        super().__init__()
        self._pg = pg
        self._pending = pending
        self._result = result
        self._finish = finish
        self._error: BaseException | None = None
        self._done = not pending
        self._lock = threading.Lock() if pending else None  # only a running one is completed concurrently
        self._future = None
        if self._done and finish is not None:
            finish()

    def _complete(self) -> None:
        """Wait for the ringcomm work, then finish (idempotent; any thread)."""
        if self._done:
            return
        with self._lock:
            if self._done:
                return
            try:
                for w in self._pending:
                    w.wait()
                if self._finish is not None:
                    self._finish()
            except BaseException as exc:  # noqa: BLE001 - kept for wait()/the future
                self._error = exc
            self._pending = []
            self._done = True

    # torch.distributed.Work API
    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._pending)

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        return -1

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            fut = torch.futures.Future()
            self._future = fut
            if self._done:
                self._settle(fut)
            else:
                self._pg._completer.add(self)
        return self._future

    def _settle(self, fut) -> None:
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)


class _Done(dist.Work):
    """The Work of a synchronous call that has already completed (the
    common dist.all_reduce(t) path: as cheap to make as a Work can be)."""

    def __init__(self, result: list):
        super().__init__()
        self._result = result

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        return self._result

    def synchronize(self) -> None:
        pass

    def source_rank(self) -> int:
        return -1

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


class _Completer:
    """One thread per group that completes futures of async collectives in
    issue order (the order they complete in), so DDP's callbacks run as soon
    as each bucket is reduced, without blocking the caller."""

    def __init__(self, name: str):
        self._q: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._thread = None
        self._name = name

    def add(self, work: _Work) -> None:
        with self._cv:
            self._q.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._q:
                    self._cv.wait()
                work = self._q.popleft()
            work._complete()
            work._settle(work._future)


# ---------------------------------------------------------------------------
def _check_dtype(t: torch.Tensor, op: str) -> None:
    if t.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"ringcomm backend: {op} on a {t.dtype} tensor; supported dtypes: "
                        f"{', '.join(str(d).replace('torch.', '') for d in _SUPPORTED_DTYPES)}")
    if t.device.type != "cpu":
        raise NotImplementedError(f"ringcomm backend: {op} on a {t.device} tensor; this backend is registered "
                                  "for CPU tensors (GPU collectives: ringcomm.init(device='cuda'))")


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
        self._completer = _Completer(f"ringcomm-pg-{rank}")

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
            return "sum", float(red.factor)
        if kind not in _OPS:
            raise NotImplementedError(f"ringcomm backend: {what} with op {kind} is not implemented "
                                      "(supported: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM)")
        op = _OPS[kind]
        if op == "avg" and not tensor.is_floating_point():
            raise TypeError(f"ringcomm backend: {what} with op AVG needs a floating dtype, got {tensor.dtype}")
        return op, None

    def _go(self, async_op: bool, launch, result: list, finish=None) -> _Work:
        """`launch(async_op)` starts the ringcomm collective(s) and returns
        their Works (async) or nothing (already done)."""
        works = launch(async_op)
        return _Work(self, list(works) if async_op else [], result, finish)

    # ---- collectives ------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if not opts.asyncOp and len(tensors) == 1:
            # The common synchronous call (dist.all_reduce(t)): checked here
            # once, then straight to the engine, on this thread.
            t = tensors[0]
            code = _DTYPE_CODES.get(t.dtype)
            op = _OP_CODES.get(opts.reduceOp.op)
            if code is not None and op is not None and t.is_cpu and t.is_contiguous() and \
                    (op != _AVG or code in _FLOAT_CODES):
                self.comm._run_host_all_reduce(t.data_ptr(), t.numel(), code, op, tensors)
                return _Done(tensors)
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        _check_dtype(t, "allreduce")
        op, factor = self._op(opts.reduceOp, t, "allreduce")
        buf, copied = _flat(t)
        if factor is not None:  # PREMUL_SUM: the result replaces t anyway
            buf.detach().mul_(factor)

        def launch(a):
            w = self.comm.all_reduce(buf, op=op, async_op=a)
            return [w] if a else []

        return self._go(opts.asyncOp, launch, [t], (lambda: t.detach().copy_(buf.view_as(t))) if copied else None)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not tensors:
            return _Work(self, [], [])
        for t in tensors:
            _check_dtype(t, "allreduce_coalesced")
        op, factor = self._op(opts.reduceOp, tensors[0], "allreduce_coalesced")
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

        def launch(a):
            return [w for w in (self.comm.all_reduce(f, op=op, async_op=a) for f, _ in flats) if a]

        def finish():
            for flat, ts in flats:
                off = 0
                for t in ts:
                    t.detach().copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()

        return self._go(opts.asyncOp, launch, list(tensors), finish)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise NotImplementedError("ringcomm backend: broadcast of several tensors per rank is not implemented")
        t = tensors[0]
        _check_dtype(t, "broadcast")
        buf, copied = _flat(t)

        def launch(a):
            w = self.comm.broadcast(buf, root=opts.rootRank, async_op=a)
            return [w] if a else []

        return self._go(opts.asyncOp, launch, [t], (lambda: t.detach().copy_(buf.view_as(t))) if copied else None)

    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool, what: str):
        """all_gather of inp (every rank's same size) into out (size * inp);
        returns (launch, finish) for _go."""
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

        def launch(a):
            w = self.comm.all_gather(ibuf, out=obuf, async_op=a)
            return [w] if a else []

        return launch, ((lambda: out.detach().copy_(obuf.view_as(out))) if ocopied else None)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        opts = opts if opts is not None else _allgather_opts()
        launch, finish = self._gather_into(output, input, opts.asyncOp, "all_gather_into_tensor")
        return self._go(opts.asyncOp, launch, [output], finish)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        return self._allgather_base(output, input, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _allgather_opts()
        if isinstance(input_tensors, torch.Tensor):
            input_tensors, output_tensors = [input_tensors], [output_tensors]
        if len(input_tensors) != 1:
            return self.allgather_coalesced(output_tensors, input_tensors, opts)
        inp, outs = input_tensors[0], output_tensors[0]
        if len(outs) != self.size():
            raise ValueError(f"ringcomm backend: allgather needs {self.size()} output tensors, got {len(outs)}")
        for o in outs:
            if o.numel() != inp.numel():
                raise NotImplementedError("ringcomm backend: allgather with tensors of different sizes per rank "
                                          "is not implemented")
        flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
        launch, _ = self._gather_into(flat, inp, opts.asyncOp, "allgather")
        k = inp.numel()

        def finish():
            for i, o in enumerate(outs):
                o.detach().copy_(flat[i * k:(i + 1) * k].view_as(o))

        return self._go(opts.asyncOp, launch, [list(outs)], finish)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = opts if opts is not None else _allgather_opts()
        works = [self.allgather([outs], [inp], opts) for outs, inp in zip(output_lists, input_list)]
        return _Combined(self, works, list(output_lists))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _allgather_opts()
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Combined(self, works, list(outputs))

    def _scatter_from(self, out: torch.Tensor, inp: torch.Tensor, opts, what: str):
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

        def launch(a):
            w = self.comm.reduce_scatter(ibuf, op=op, out=obuf, async_op=a)
            return [w] if a else []

        return launch, ((lambda: out.detach().copy_(obuf.view_as(out))) if ocopied else None)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts if opts is not None else _reduce_scatter_opts()
        launch, finish = self._scatter_from(output, input, opts, "reduce_scatter_tensor")
        return self._go(opts.asyncOp, launch, [output], finish)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _reduce_scatter_opts()
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        if len(output_tensors) != 1:
            works = [self.reduce_scatter([o], [i], opts) for o, i in zip(output_tensors, input_tensors)]
            return _Combined(self, works, list(output_tensors))
        out, ins = output_tensors[0], input_tensors[0]
        if len(ins) != self.size() or any(i.numel() != out.numel() for i in ins):
            raise ValueError(f"ringcomm backend: reduce_scatter needs {self.size()} input tensors of "
                             f"{out.numel()} elements each")
        flat = torch.cat([i.detach().reshape(-1) for i in ins])
        launch, finish = self._scatter_from(out, flat, opts, "reduce_scatter")
        return self._go(opts.asyncOp, launch, [out], finish)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _reduce_scatter_opts()
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Combined(self, works, list(outputs))

    def barrier(self, opts=None):
        async_op = getattr(opts, "asyncOp", True) if opts is not None else True

        def launch(a):
            w = self.comm.barrier(async_op=a)
            return [w] if a else []

        return self._go(async_op, launch, [])

    # ---- what ringcomm does not do: a clear error, not a confusing one -----
    def _unsupported(self, op: str):
        raise NotImplementedError(
            f"ringcomm backend: {op} is not implemented (supported: allreduce, broadcast, allgather, "
            "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, barrier and their coalesced "
            "forms); use a gloo group for it, e.g. dist.new_group(backend='gloo')")

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
for _name, _op in (("send", "send"), ("recv", "recv"), ("recv_anysource", "recv_anysource"),
                   ("alltoall", "all_to_all"), ("alltoall_base", "all_to_all_single"),
                   ("all_to_all_single", "all_to_all_single"), ("gather", "gather"), ("scatter", "scatter"),
                   ("reduce", "reduce"), ("monitored_barrier", "monitored_barrier")):
    setattr(ProcessGroupRingcomm, _name, _refuse(_op))


class _Combined(_Work):
    """Several collectives' Works as one (the coalesced forms)."""

    def __init__(self, pg, works: list, result: list):
        dist.Work.__init__(self)
        self._pg = pg
        self._works = works
        self._result = result
        self._finish = None
        self._error = None
        self._lock = threading.Lock()
        self._future = None
        self._done = all(w._done for w in works)
        self._pending = [] if self._done else works
        if self._done:
            self._error = next((w._error for w in works if w._error is not None), None)

    def _complete(self) -> None:
        with self._lock:
            if self._done:
                return
            for w in self._works:
                w._complete()
            self._error = next((w._error for w in self._works if w._error is not None), None)
            self._pending = []
            self._done = True

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._works)


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
    """torch's factory: a ringcomm communicator over the group's MPI ranks."""
    import ringcomm
    from ._singleton import mpi
    MPI = mpi()  # a process no launcher started: MPI as a singleton without /dev/shm files
    world = MPI.COMM_WORLD
    rank, size = dist_opts.group_rank, dist_opts.group_size
    ranks = list(dist_opts.global_ranks_in_group)  # empty: all ranks (the default group)
    timeout = dist_opts.timeout.total_seconds() if dist_opts.timeout is not None else None
    if timeout is not None and timeout <= 0:
        timeout = None
    if not ranks:
        if world.size != size or world.rank != rank:
            raise RuntimeError(
                f"ringcomm backend: torch says rank {rank} of {size}, but MPI says rank {world.rank} of "
                f"{world.size}. Launch with `ringcomm run -n N python ...` or mpirun (torchrun starts processes "
                "that MPI cannot connect; see README 'Use from PyTorch').")
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


__all__ += ["communicator", "RingcommError"]

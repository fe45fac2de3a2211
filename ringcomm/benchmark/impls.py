"""The implementations the benchmark compares, on the same buffers: ringcomm,
Open MPI through mpi4py (its default choice, and its ring algorithms forced
by MCA parameters), torch.distributed's Gloo, NCCL's own collectives
(--device cuda), and a test-only corrupt one; and the memcpy reference
(``MemcpyImpl``, run beside them by the harness).

An implementation is a class with ``supports`` and ``run`` (see ``Impl``),
constructed with the harness (``ctx.device``); ``IMPLS`` maps names to them,
``DEVICE_IMPLS`` says which run where.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .. import algorithms, vocab
from ..errors import from_rank0
from .checks import BLOCKED, REDUCING, RING_COLLECTIVES, ROOT, split

# Open MPI (coll/tuned) parameters that force its ring algorithm per collective.
RING_MCA = {"all_reduce": ("coll_tuned_allreduce_algorithm", "4"),
            "reduce_scatter": ("coll_tuned_reduce_scatter_algorithm", "3"),
            "all_gather": ("coll_tuned_allgather_algorithm", "4")}


@dataclass
class Case:
    collective: str
    count: int       # elements of the full buffer
    dtype: str
    op: str
    inplace: bool
    n: int
    rank: int
    send: np.ndarray = field(repr=False, default=None)
    recv: np.ndarray = field(repr=False, default=None)

    @property
    def chunk(self) -> tuple[int, int]:
        return split(self.count, self.n, self.rank)

    @property
    def block(self) -> int:
        """gather, scatter, all_to_all: the elements of one rank's block (count is a multiple of n)."""
        return self.count // self.n

    def input_view(self) -> np.ndarray:
        """What the rank contributes (inside recv for in-place, as nccl-tests does)."""
        off, ln = self.chunk
        if self.collective in ("all_reduce", "reduce", "scan", "exscan"):
            return self.recv if self.inplace else self.send
        if self.collective in ("gather", "scatter", "all_to_all", "sendrecv"):
            return self.send  # out-of-place only
        if self.collective == "reduce_scatter":
            return self.send
        return self.recv[off:off + ln] if self.inplace else self.send

    def output_view(self) -> np.ndarray:
        if self.collective == "reduce_scatter" and self.inplace:
            off, ln = self.chunk
            return self.send[off:off + ln]
        return self.recv


class Impl:
    name = "?"

    def supports(self, case: Case) -> bool:
        return True

    def run(self, case: Case) -> None:
        raise NotImplementedError

    def output_view(self, case: Case) -> np.ndarray:
        """Where this implementation leaves the result (nccl-tests' convention by default)."""
        return case.output_view()

    def exscan_rank0(self, case: Case) -> np.ndarray | None:
        """What exscan leaves on rank 0, to check (None: undefined, unchecked)."""
        return None

    def close(self) -> None:
        pass


# all_reduce's algorithms the benchmark can force (the table's rows that
# need nothing of the arrays or the placement: not zero_copy, which needs
# comm.empty's arrays, nor hierarchical, which needs ranks on several hosts).
BENCH_ALGORITHMS = tuple(a for a in algorithms.names("all_reduce", needs=())
                         if algorithms.row("all_reduce", a)["path"] != "hosts")


def _halves(algorithm: str, n: int) -> str:
    """What reduce_scatter and all_gather run when all_reduce's `algorithm`
    is forced: the same where the table has it for them on `n` ranks, else the ring."""
    r = algorithms.row("reduce_scatter", algorithm)
    if r is None or r["path"] == "hosts" or not set(r["needs"]) <= {"pow2"}:
        return "ring"
    return "ring" if "pow2" in r["needs"] and n & (n - 1) else algorithm


class RingcommImpl(Impl):
    """ringcomm; all_reduce with --algorithm (default "auto"); reduce-scatter
    and all-gather with the library's default algorithm under --algorithm
    auto (so what auto would run there, shared memory included, is what is
    measured), else the forced algorithm where it runs them (halving-doubling
    on a power of two ranks, shm), else the ring."""
    name = "ringcomm"
    forced = None  # the rc-* implementations: one algorithm, side by side with auto

    def __init__(self, ctx):
        import ringcomm
        self.comm = ringcomm.init(device=None if ctx.device == "host" else "cuda")
        args = getattr(ctx, "args", None)
        self.algorithm = self.forced or getattr(args, "algorithm", "auto") or "auto"
        n = self.comm.size
        self.halves = _halves(self.algorithm, n)
        # reduce_scatter / all_gather keywords: none under auto (the library's default)
        self.rs_ag = {} if self.algorithm == "auto" else {"algorithm": self.halves}
        self.last_algorithm = None  # what the last checked call ran (auto's choice)
        # scan / exscan: the forced algorithm where the table has it for them, else auto
        self.prefix = self.algorithm if algorithms.row("scan", self.algorithm) else "auto"

    def supports(self, c: Case) -> bool:
        if c.collective not in RING_COLLECTIVES:
            # auto only; in place: reduce only; sendrecv needs a peer other than itself
            return (self.forced is None and (not c.inplace or c.collective in ("reduce", "scan", "exscan"))
                    and (c.collective != "sendrecv" or c.n > 1))
        # a forced all_reduce algorithm shows only where it exists
        return c.collective == "all_reduce" or self.forced is None or self.halves == self.forced

    def run(self, c: Case) -> None:
        coll = c.collective
        if coll == "reduce":
            if c.inplace:
                self.comm.reduce(c.recv, ROOT, c.op)
            else:
                self.comm.reduce(c.send, ROOT, c.op, out=c.recv)
        elif coll == "gather":
            self.comm.gather(c.send, ROOT, out=c.recv)
        elif coll == "scatter":
            self.comm.scatter(c.send if c.rank == ROOT else None, ROOT, out=c.recv)
        elif coll == "all_to_all":
            self.comm.all_to_all(c.send, out=c.recv)
        elif coll == "sendrecv":  # the ring shift: to rank+1, from rank-1 (as MPI_Sendrecv)
            self.comm.sendrecv(c.send, (c.rank + 1) % c.n, c.recv, (c.rank - 1) % c.n)
        elif coll in ("scan", "exscan"):
            if c.inplace:
                getattr(self.comm, coll)(c.recv, c.op, algorithm=self.prefix)
            else:
                getattr(self.comm, coll)(c.send, c.op, out=c.recv, algorithm=self.prefix)
        elif coll == "all_reduce":
            if c.inplace:
                self.comm.all_reduce(c.recv, c.op, algorithm=self.algorithm)
            else:
                self.comm.all_reduce(c.send, c.op, out=c.recv, algorithm=self.algorithm)
        elif c.collective == "reduce_scatter":
            self.comm.reduce_scatter(c.send, c.op, out=c.output_view(), **self.rs_ag)
        else:
            self.comm.all_gather(c.input_view(), out=c.recv, **self.rs_ag)

    def exscan_rank0(self, c: Case) -> np.ndarray:
        """ringcomm's exscan gives rank 0 the op's identity: 0 for sum, 1 for
        prod, the largest value for min, the smallest for max, all ones for band."""
        dt = vocab.NUMPY[c.dtype]
        if c.dtype == "bool":
            return np.full(c.count, c.op in ("prod", "min", "band"), np.bool_)
        info = np.finfo(dt) if c.dtype in vocab.FLOATING else np.iinfo(dt)
        inf = c.dtype in vocab.FLOATING
        v = {"prod": 1, "min": np.inf if inf else info.max, "max": -np.inf if inf else info.min,
             "band": -1 if c.dtype.startswith("int") else (info.max if not inf else 0)}.get(c.op, 0)
        return np.full(c.count, v).astype(dt)

    def sent_bytes(self, c: Case) -> int:
        before = self.comm.traffic()
        self.run(c)
        # p2p takes no algorithm (last_algorithm is the previous collective's)
        self.last_algorithm = None if c.collective == "sendrecv" else self.comm.last_algorithm
        return (self.comm.traffic() - before).bytes_sent("send" if c.collective == "sendrecv" else c.collective)

    def close(self) -> None:
        self.comm.close()


class MpiImpl(Impl):
    """Open MPI's own collectives through mpi4py (its default algorithm choice;
    launched with coll_tuned ring parameters for 'mpi-ring')."""
    name = "mpi"
    _OPS = None

    def __init__(self, ctx):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self._OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "band": MPI.BAND,
                     "bor": MPI.BOR, "bxor": MPI.BXOR}

    @staticmethod
    def has_types(c: Case) -> bool:
        """MPI has no half types or average, and reduces bools by its logical
        ops only (MPI_SUM or MPI_BAND on MPI_C_BOOL is MPI_ERR_OP)."""
        return not (c.dtype in ("float16", "bfloat16") or c.op == "avg"
                    or c.dtype == "bool" and c.collective in REDUCING)

    def supports(self, c: Case) -> bool:
        # Reduce_scatter_block and Allgather need equal chunks.
        if not self.has_types(c):
            return False
        if c.collective in ("gather", "scatter", "all_to_all", "sendrecv"):
            return not c.inplace  # out-of-place only (as ringcomm's)
        return c.collective not in ("reduce_scatter", "all_gather") or c.count % c.n == 0

    def run(self, c: Case) -> None:
        MPI, op = self.MPI, self._OPS.get(c.op)
        coll = c.collective
        if coll == "reduce":
            if c.inplace:  # MPI_IN_PLACE on the root only; the others pass their input
                self.comm.Reduce(MPI.IN_PLACE if c.rank == ROOT else c.recv, c.recv, op=op, root=ROOT)
            else:
                self.comm.Reduce(c.send, c.recv, op=op, root=ROOT)
        elif coll == "gather":
            self.comm.Gather(c.send, c.recv, root=ROOT)
        elif coll == "scatter":
            self.comm.Scatter(c.send, c.recv, root=ROOT)
        elif coll == "all_to_all":
            self.comm.Alltoall(c.send, c.recv)
        elif coll == "sendrecv":
            self.comm.Sendrecv(c.send, (c.rank + 1) % c.n, 0, c.recv, (c.rank - 1) % c.n, 0)
        elif coll == "scan":
            self.comm.Scan(MPI.IN_PLACE if c.inplace else c.send, c.recv, op=op)
        elif coll == "exscan":
            self.comm.Exscan(MPI.IN_PLACE if c.inplace else c.send, c.recv, op=op)
        elif coll == "all_reduce":
            self.comm.Allreduce(MPI.IN_PLACE if c.inplace else c.send, c.recv, op=op)
        elif c.collective == "reduce_scatter":
            if c.inplace:
                self.comm.Reduce_scatter_block(MPI.IN_PLACE, c.send, op=op)
            else:
                self.comm.Reduce_scatter_block(c.send, c.recv, op=op)
        else:
            self.comm.Allgather(MPI.IN_PLACE if c.inplace else c.send, c.recv)

    def output_view(self, c: Case) -> np.ndarray:
        if c.collective == "reduce_scatter" and c.inplace:  # MPI_IN_PLACE: result at the buffer's start
            return c.send[:c.chunk[1]]
        return c.output_view()

    def close(self) -> None:
        self.comm.Free()


class MpiRingImpl(MpiImpl):
    """Launched with RING_MCA. Reduce-scatter goes through MPI_Reduce_scatter
    (per-rank counts): Open MPI has a ring for it, not for the _block variant."""
    name = "mpi-ring"

    def supports(self, c: Case) -> bool:
        # Allgather takes equal chunks only (reduce-scatter has per-rank counts here);
        # ring parameters exist for the ring's three collectives only
        return (c.collective in RING_COLLECTIVES and self.has_types(c)
                and (c.collective != "all_gather" or c.count % c.n == 0))

    def run(self, c: Case) -> None:
        if c.collective != "reduce_scatter":
            return super().run(c)
        counts = [split(c.count, c.n, r)[1] for r in range(c.n)]
        if c.inplace:
            self.comm.Reduce_scatter(self.MPI.IN_PLACE, c.send, counts, op=self._OPS[c.op])
        else:
            self.comm.Reduce_scatter(c.send, c.recv, counts, op=self._OPS[c.op])


class GlooImpl(Impl):
    """torch.distributed with the gloo backend, on tensors sharing the numpy buffers."""
    name = "gloo"

    def __init__(self, ctx):
        import torch
        import torch.distributed as dist
        from mpi4py import MPI
        self.torch, self.dist = torch, dist
        w = MPI.COMM_WORLD
        port = from_rank0(w.bcast, w.rank == 0, _free_port, "find a free port for gloo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w.rank, world_size=w.size)
        self._OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                     "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
                     "bxor": dist.ReduceOp.BXOR}
        self._rs_ok = None

    def supports(self, c: Case) -> bool:
        if c.op == "avg" or c.dtype == "bfloat16" and c.collective in REDUCING:
            return False
        if c.dtype in ("int16", "uint16", "uint32", "uint64"):
            return False  # gloo: "Invalid scalar type"
        if c.collective in ("reduce_scatter", "sendrecv", "scan", "exscan"):
            return False  # torch's gloo backend has no reduce_scatter, scan or exscan; sendrecv: MPI's only
        if c.collective in BLOCKED:
            return not c.inplace
        return c.collective in ("all_reduce", "reduce") or c.count % c.n == 0

    def _t(self, a):
        if a.dtype == vocab.NUMPY["bfloat16"]:
            return self.torch.from_numpy(a.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(a)

    def _blocks(self, c: Case, a) -> list:
        """a's equal blocks as tensors (gather_list / scatter_list), made once per case."""
        cache = c.__dict__.setdefault("_gloo_blocks", {})
        if id(a) not in cache:
            b = c.block
            cache[id(a)] = [self._t(a[q * b:(q + 1) * b]) for q in range(c.n)]
        return cache[id(a)]

    def run(self, c: Case) -> None:
        dist, coll = self.dist, c.collective
        if coll == "reduce":
            if not c.inplace:  # gloo reduces in place: copy in first, as a user would
                np.copyto(c.recv, c.send)
            dist.reduce(self._t(c.recv), dst=ROOT, op=self._OPS[c.op])
        elif coll == "gather":
            dist.gather(self._t(c.send), self._blocks(c, c.recv) if c.rank == ROOT else None, dst=ROOT)
        elif coll == "scatter":
            dist.scatter(self._t(c.recv), self._blocks(c, c.send) if c.rank == ROOT else None, src=ROOT)
        elif coll == "all_to_all":
            dist.all_to_all_single(self._t(c.recv), self._t(c.send))
        elif c.collective == "all_reduce":
            if c.inplace:
                self.dist.all_reduce(self._t(c.recv), op=self._OPS[c.op])
            else:  # gloo reduces in place: copy in first, as a user would
                np.copyto(c.recv, c.send)
                self.dist.all_reduce(self._t(c.recv), op=self._OPS[c.op])
        else:
            self.dist.all_gather_into_tensor(self._t(c.recv), self._t(c.input_view()))

    def close(self) -> None:
        self.dist.destroy_process_group()


class NcclImpl(Impl):
    """NCCL's own ncclAllReduce / ncclReduceScatter / ncclAllGather (--device
    cuda), on a NCCL communicator of its own, on the same cupy buffers."""
    name = "nccl"

    def __init__(self, ctx):
        from mpi4py import MPI

        from .. import cuda
        from ..world import local_rank
        cuda.require()
        w = MPI.COMM_WORLD
        self.gpu = local_rank(w)
        self.base = cuda._cuda.NcclBaseline(MPI._handleof(w), self.gpu)

    def supports(self, c: Case) -> bool:
        # NCCL's reduce-scatter and all-gather take equal chunks only; the baseline
        # wraps the ring's three collectives only; ncclRedOp_t has no bitwise ops
        if c.collective in REDUCING and c.op in vocab.BITWISE:
            return False
        return c.collective == "all_reduce" or c.collective in RING_COLLECTIVES and c.count % c.n == 0

    def run(self, c: Case) -> None:
        import cupy
        stream = cupy.cuda.get_current_stream().ptr
        dt, op = vocab.DTYPES[c.dtype], vocab.OPS[c.op]
        if c.collective == "all_reduce":
            src = c.recv if c.inplace else c.send
            self.base.all_reduce(src.data.ptr, c.recv.data.ptr, c.count, dt, op, stream)
        elif c.collective == "reduce_scatter":
            out = self.output_view(c)
            self.base.reduce_scatter(c.send.data.ptr, out.data.ptr, c.count // c.n, dt, op, stream)
        else:
            self.base.all_gather(c.input_view().data.ptr, c.recv.data.ptr, c.count // c.n, dt, stream)

    def close(self) -> None:
        self.base.close()


class MemcpyImpl(Impl):
    """The physical reference, not a collective: every rank copies a buffer of
    the collective's full size (send to recv), after the same barrier as the
    implementations, so all N ranks copy at the same moment; on the host
    numpy's copy, with --device cuda a device-to-device copy on the rank's
    GPU. Always run by the harness (not in IMPLS)."""
    name = "memcpy"

    def __init__(self, ctx):
        self.xp = ctx.xp

    def run(self, c: Case) -> None:
        self.xp.copyto(c.recv, c.send)


class CorruptImpl(RingcommImpl):
    """Test-only: ringcomm with one wrong element on rank 0 (checks that #wrong
    is counted and fails the run). Enabled by RINGCOMM_BENCH_TEST_IMPLS=1."""
    name = "corrupt"

    def run(self, c: Case) -> None:
        super().run(c)
        out = c.output_view()
        if self.comm.rank == 0 and out.size:
            out[0] = out[0] + np.ones(1, out.dtype)[0]


def _forced(short: str, algorithm: str) -> type:
    return type(f"Ringcomm_{short}", (RingcommImpl,), {"name": f"rc-{short}", "forced": algorithm,
                                                        "__doc__": f"ringcomm with algorithm={algorithm!r}"})


# ringcomm with one algorithm forced (--compare-algorithms runs them beside auto)
FORCED = {"rc-ring": _forced("ring", "ring"), "rc-rd": _forced("rd", "recursive_doubling"),
          "rc-hd": _forced("hd", "halving_doubling")}
IMPLS = {"ringcomm": RingcommImpl, "mpi": MpiImpl, "mpi-ring": MpiRingImpl, "gloo": GlooImpl, "nccl": NcclImpl,
         **FORCED}
DEVICE_IMPLS = {"host": ("ringcomm", "mpi", "mpi-ring", "gloo", "corrupt", *FORCED), "cuda": ("ringcomm", "nccl")}
if os.environ.get("RINGCOMM_BENCH_TEST_IMPLS") == "1":
    IMPLS["corrupt"] = CorruptImpl


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_available() -> bool:
    try:
        import torch.distributed  # noqa: F401
        return True
    except ImportError:
        return False

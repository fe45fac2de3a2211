"""torch.distributed backend "ringcomm" under real Open MPI, against gloo in the
same job (tests/scripts/torch_backend_check.py): every op (all reduce ops and
dtypes, sizes 0, 1, N-1, N+1, primes, multi-segment; sync and async; in-place
and non-contiguous forms; all_gather_coalesced (one output list per rank) and
allgather with several inputs, as gloo lays them out; reduce, gather, scatter
on every root, all_to_all_single with uneven splits and the list form; send/recv between every pair, isend/irecv,
recv from any source, batch_isend_irecv), a subgroup, torch's DDP and FSDP2
(float32, bf16 and fp16 mixed precision) giving the same parameters as over gloo, the ledger against
what DDP moved, and errors reaching the caller within the group's timeout."""

import json
import os
import subprocess
import sys

import pytest

from tiers import slow_except

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torch_backend_check.py")


@pytest.mark.parametrize("n", slow_except([2], [2, 3]))
def test_torch_backend_against_gloo(n):
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, SCRIPT]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    assert res.returncode == 0 and sorted(out) == list(range(n)), res.stdout[-3000:] + res.stderr[-3000:]
    fails = [f for d in out.values() for f in d["fails"]]
    assert not fails, "\n".join(fails)
    c = out[0]["counts"]
    for op in ("allreduce", "broadcast", "all_gather", "all_gather_single", "reduce_scatter",
               "reduce_scatter_single", "coalesced", "all_gather_coalesced", "allgather_several", "reduce", "gather",
               "scatter", "all_to_all_single", "all_to_all",
               "send_recv", "isend_irecv", "recv_anysource", "batch_isend_irecv", "barrier", "unsupported", "bitwise",
               "ddp", "ledger", "fsdp2", "errors"):
        assert c.get(op, 0) > 0, f"no {op} cases ran"
    assert out[0]["env"] == {"RANK": "0", "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1"}
    print(f"\nn={n}: cases per op on rank 0 {c} (total {sum(c.values())}); DDP max |ringcomm - gloo| "
          f"{out[0]['ddp_diff']}; FSDP2 {out[0]['fsdp_diffs']}; ledger: {out[0]['ledger']}")


def test_backend_registered_on_import():
    import torch.distributed as dist

    import ringcomm.torch  # noqa: F401
    assert "RINGCOMM" in dist.Backend._plugins
    assert dist.Backend._plugins["RINGCOMM"].extended_api


def test_each_job_gets_its_own_launcher_variables():
    # A shell that already has torch launcher variables (e.g. from an earlier
    # single-process run, or a port in use): `ringcomm run` must not pass them
    # on, and the ranks must take rank and size from MPI.
    import socket
    code = ("import ringcomm.torch, torch.distributed as dist; dist.init_process_group('ringcomm'); "
            "print('RANKS', dist.get_rank(), dist.get_world_size(), flush=True); dist.destroy_process_group()")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy.getsockname()[1]),
                   RANK="0", WORLD_SIZE="1")
        res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "2", "--", sys.executable, "-c",
                              code], capture_output=True, text=True, timeout=120, env=env)
    got = sorted(line for line in res.stdout.splitlines() if line.startswith("RANKS"))
    assert got == ["RANKS 0 2", "RANKS 1 2"], res.stdout + res.stderr


def test_a_synchronous_calls_work_is_reused_only_when_nobody_holds_it():
    # The backend hands out its last DoneWork again (making one costs about
    # 1 us); a Work the caller still holds must keep its own result.
    code = """
import torch, torch.distributed as dist, ringcomm.torch
dist.init_process_group("ringcomm")
pg = dist.distributed_c10d._get_default_group()
opts = dist.AllreduceOptions(); opts.asyncOp = False
a, b = torch.ones(2), torch.ones(3)
w1 = pg.allreduce([a], opts)
w2 = pg.allreduce([b], opts)
held = w1 is not w2 and w1.result()[0] is a and w2.result()[0] is b
del w1, w2
w3 = pg.allreduce([a], opts); first = id(w3); del w3
w4 = pg.allreduce([b], opts)
print("RESULT", held, id(w4) == first, w4.result()[0] is b, flush=True)
dist.destroy_process_group()
"""
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "1", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=300)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")), "")
    assert line.split()[1:] == ["True", "True", "True"], res.stdout + res.stderr


def test_synchronous_calls_take_the_fast_lane():
    # Each synchronous op goes straight to the communicator (backend._sync: a
    # DoneWork, no flat copies), on the root and off it; one the communicator
    # refuses (non-contiguous outputs) takes the general path. Results checked
    # against the rank-dependent inputs either way.
    code = """
import json, torch, torch.distributed as dist, ringcomm.torch
from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions
dist.init_process_group("ringcomm")
pg = dist.distributed_c10d._get_default_group()
R, N = dist.get_rank(), dist.get_world_size()

def o(cls, **kw):
    x = cls()
    x.asyncOp = False
    for k, v in kw.items():
        setattr(x, k, v)
    return x

kinds, ok = {}, {}
x = torch.arange(4.0) + 10 * R
w = pg.allreduce([x], o(dist.AllreduceOptions)); kinds["allreduce"] = type(w).__name__
ok["allreduce"] = torch.equal(x, sum(torch.arange(4.0) + 10 * r for r in range(N)))
x = torch.arange(4.0) + 10 * R
w = pg.broadcast([x], o(dist.BroadcastOptions, rootRank=1)); kinds["broadcast"] = type(w).__name__
ok["broadcast"] = torch.equal(x, torch.arange(4.0) + 10)
x = torch.arange(4.0) + 10 * R
w = pg.reduce([x], o(dist.ReduceOptions, rootRank=0)); kinds["reduce"] = type(w).__name__
ok["reduce"] = R != 0 or torch.equal(x, sum(torch.arange(4.0) + 10 * r for r in range(N)))
x, y = torch.arange(2.0 * N) + 100 * R, torch.empty(2 * N)
w = pg.alltoall_base(y, x, [], [], o(dist.AllToAllOptions)); kinds["alltoall_base"] = type(w).__name__
ok["alltoall_base"] = torch.equal(y, torch.tensor([float(100 * q + 2 * R + j) for q in range(N) for j in range(2)]))
x, y = torch.arange(3.0) + 10 * R, torch.empty(N, 3)
w = pg._allgather_base(y, x, o(AllgatherOptions)); kinds["_allgather_base"] = type(w).__name__
ok["_allgather_base"] = torch.equal(y, torch.stack([torch.arange(3.0) + 10 * r for r in range(N)]))
x, y = (torch.arange(3.0 * N) + 1) * (R + 1), torch.empty(3)
w = pg._reduce_scatter_base(y, x, o(ReduceScatterOptions)); kinds["_reduce_scatter_base"] = type(w).__name__
ok["_reduce_scatter_base"] = torch.equal(y, (torch.arange(3.0 * R, 3.0 * R + 3) + 1) * (N * (N + 1) // 2))
x = torch.arange(3.0) + 10 * R
outs = [torch.empty(3) for _ in range(N)] if R == 0 else []
w = pg.gather([outs] if R == 0 else [], [x], o(dist.GatherOptions, rootRank=0)); kinds["gather"] = type(w).__name__
ok["gather"] = R != 0 or all(torch.equal(outs[r], torch.arange(3.0) + 10 * r) for r in range(N))
y = torch.empty(3)
ins = [torch.arange(3.0) + 10 * r for r in range(N)] if R == 1 else []
w = pg.scatter([y], [ins] if R == 1 else [], o(dist.ScatterOptions, rootRank=1)); kinds["scatter"] = type(w).__name__
ok["scatter"] = torch.equal(y, torch.arange(3.0) + 10 * R)
# refused by the communicator (non-contiguous outputs): the general path, same results
x = torch.arange(3.0) + 10 * R
outs = [torch.empty(3, 2)[:, 0] for _ in range(N)] if R == 0 else []
w = pg.gather([outs] if R == 0 else [], [x], o(dist.GatherOptions, rootRank=0)); w.wait()
kinds["gather (non-contiguous)"] = type(w).__name__
ok["gather (non-contiguous)"] = R != 0 or all(torch.equal(outs[r], torch.arange(3.0) + 10 * r) for r in range(N))
print("RESULT", json.dumps({"rank": R, "kinds": kinds, "ok": ok}), flush=True)
dist.destroy_process_group()
"""
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "3", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=300)
    lines = [json.loads(ln.split(" ", 1)[1]) for ln in res.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 3, res.stdout + res.stderr
    for got in lines:
        rank = got["rank"]
        assert all(got["ok"].values()), (rank, got)
        slow = {op for op, kind in got["kinds"].items() if kind != "DoneWork"}
        assert slow == ({"gather (non-contiguous)"} if rank == 0 else set()), (rank, got["kinds"])  # (the root's)

"""One torchrun worker (tests/test_torchrun.py): the store bootstrap end to end.

``dist.init_process_group("ringcomm")`` under torchrun, then, checked against
numpy with rank-dependent data: all_reduce, reduce_scatter, all_gather,
broadcast, all_to_all with uneven splits, a ring of send/recv, a new_group of
the even ranks, a 2-D DeviceMesh (each dimension's all_reduce) when the world
has 4 ranks, and ``ringcomm.init()`` with no argument (torchrun's store, as
``env://``) beside torch's group. Also: MPI never initialized (mpi4py.MPI not
imported), which transport each communicator runs on, the exact ledger of one
all_reduce, and how long ``init_process_group`` took.

RINGCOMM_TEST_DIE_AT_ATTEMPT=K: on restart attempt K, rank 1 dies (os._exit)
after the first all_reduce, in the middle of the job: its peers must raise
within the group's timeout (the agent then restarts everyone), and the next
attempt must start clean.

Prints one line "RESULT {json}" per rank.
"""

import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import ringcomm
import ringcomm.torch as rt
from ringcomm import traffic

R, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
fails: list = []
counts: dict = {}


def case(op, ok, what=""):
    counts[op] = counts.get(op, 0) + 1
    if not ok:
        fails.append(f"rank {R}: {op}: {what}")


def data(count, rank, dtype=np.float32, salt=0):
    return (((np.arange(count) * 7 + 3 * rank + salt) % 11) - 5 + rank).astype(dtype)


t0 = time.perf_counter()
dist.init_process_group("ringcomm", timeout=datetime.timedelta(seconds=float(os.environ.get("JOB_TIMEOUT", "60"))))
init_s = time.perf_counter() - t0
comm = rt.communicator()
case("no_mpi", "mpi4py.MPI" not in sys.modules, "MPI was initialized in store mode")
case("label", comm.transport.startswith("ucx"), f"transport {comm.transport}")

die = os.environ.get("RINGCOMM_TEST_DIE_AT_ATTEMPT")
for count in (0, 1, N - 1, N + 1, 13, 4099, 100003, 1 << 20):
    for dtype, op, ref in ((np.float32, dist.ReduceOp.SUM, np.sum), (np.int64, dist.ReduceOp.MAX, np.max)):
        t = torch.from_numpy(data(count, R, dtype))
        dist.all_reduce(t, op=op)
        want = ref(np.stack([data(count, r, dtype) for r in range(N)]), axis=0)
        bad = np.flatnonzero(t.numpy() != want)
        case("all_reduce", bad.size == 0, f"{count} {dtype.__name__}: index {bad[:1]}")
    if die is not None and int(die) == ATTEMPT and count == 1:
        if R == 1:
            os._exit(3)  # a worker dies in the middle of the job
        t_fail = time.perf_counter()
        try:
            for _ in range(1000):
                dist.all_reduce(torch.ones(1 << 16))
            case("peer_died_raises", False, "no error after rank 1 died")
        except Exception as e:  # noqa: BLE001 - the error itself is what we check
            print(f"RAISED after {time.perf_counter() - t_fail:.1f} s: {type(e).__name__}: {str(e)[:300]}",
                  flush=True)
            os._exit(4)
    c = max(count // N, 0)
    full = torch.from_numpy(data(c * N, R))
    out = torch.empty(c)
    dist.reduce_scatter_tensor(out, full)
    want = np.sum([data(c * N, r) for r in range(N)], axis=0)[R * c:(R + 1) * c]
    case("reduce_scatter", np.array_equal(out.numpy(), want), f"{count}")
    mine = torch.from_numpy(data(c, R))
    gathered = torch.empty(c * N)
    dist.all_gather_into_tensor(gathered, mine)
    case("all_gather", np.array_equal(gathered.numpy(), np.concatenate([data(c, r) for r in range(N)])), f"{count}")
    b = torch.from_numpy(data(count, R))
    dist.broadcast(b, src=N - 1)
    case("broadcast", np.array_equal(b.numpy(), data(count, N - 1)), f"{count}")

# all_to_all with uneven splits: rank r sends (r + q + 1) rows to rank q
send_splits = [R + q + 1 for q in range(N)]
recv_splits = [q + R + 1 for q in range(N)]
inp = torch.from_numpy(np.concatenate([data(s, R, salt=q) for q, s in enumerate(send_splits)]))
out = torch.empty(sum(recv_splits))
dist.all_to_all_single(out, inp, recv_splits, send_splits)
case("all_to_all", np.array_equal(out.numpy(), np.concatenate([data(s, q, salt=R) for q, s in enumerate(recv_splits)])))

# point-to-point around the ring
if N > 1:
    x = torch.from_numpy(data(1000, R))
    y = torch.empty(1000)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (R + 1) % N), dist.P2POp(dist.irecv, y, (R - 1) % N)])
    for q in reqs:
        q.wait()
    case("send_recv", np.array_equal(y.numpy(), data(1000, (R - 1) % N)))

# a group of the even ranks (torch hands the backend a new store prefix)
evens = list(range(0, N, 2))
g = dist.new_group(evens)
if R in evens:
    t = torch.from_numpy(data(77, R))
    dist.all_reduce(t, group=g)
    case("new_group", np.array_equal(t.numpy(), np.sum([data(77, r) for r in evens], axis=0)))

# a 2-D mesh (data x tensor parallel), each dimension's groups made from the store
if N == 4:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        grp = mesh.get_group(dim)
        members = dist.get_process_group_ranks(grp)
        t = torch.from_numpy(data(31, R))
        dist.all_reduce(t, group=grp)
        case("mesh_" + dim, np.array_equal(t.numpy(), np.sum([data(31, r) for r in members], axis=0)), f"{members}")

# the exact ledger of one all_reduce, per peer
before = comm.traffic()
t = torch.from_numpy(data(1 << 16, R))
dist.all_reduce(t)
moved = comm.traffic() - before
if comm.last_algorithm != "hierarchical":
    want = traffic.expected("all_reduce", 1 << 16, "float32", N, R, algorithm=comm.last_algorithm)
    for q in range(N):
        case("ledger", moved.bytes_sent(peer=q) == want.sent.get(q, 0),
             f"{comm.last_algorithm}: to rank {q} {moved.bytes_sent(peer=q)} B, expected {want.sent.get(q, 0)}")

# ringcomm's own API under torchrun: init() finds torchrun's store (env://)
mine = ringcomm.init()
x = data(1001, R)
mine.all_reduce(x)
case("init_env", np.array_equal(x, np.sum([data(1001, r) for r in range(N)], axis=0)))
case("init_env_transport", mine.transport.startswith("ucx"), mine.transport)
mine.close()

dist.barrier()
print("RESULT " + json.dumps({"rank": R, "attempt": ATTEMPT, "counts": counts, "fails": fails,
                              "init_s": init_s, "shared_memory": comm.shared_memory,
                              "hierarchical": comm._engine.hierarchical, "transport": comm.transport,
                              "algorithm": comm.last_algorithm}), flush=True)
dist.destroy_process_group()

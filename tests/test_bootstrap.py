"""The store bootstrap (ringcomm/bootstrap.py): which mode a process takes,
and the store group's allgather, broadcast, barrier and split over a real
torch TCPStore (ranks as threads, one client each), keys deleted once read,
a missing rank named at the timeout. The launches themselves (torchrun, two
agents as two nodes) are in tests/test_torchrun.py."""

import datetime
import threading

import pytest

from ringcomm import bootstrap
from ringcomm.errors import CollectiveTimeout, InvalidArgument

dist = pytest.importorskip("torch.distributed")


def test_mode_choice():
    mpi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert bootstrap.choose(False, environ=mpi) == "mpi"
    assert bootstrap.choose(True, environ=mpi) == "mpi"  # mpirun's world wins under auto
    assert bootstrap.choose(False, environ=torchrun) == "store"
    assert bootstrap.choose(False, environ={**torchrun, "PMIX_RANK": "0"}) == "mpi"  # srun --mpi=pmix
    # srun + torchrun: the workers inherit the agent's PMI variables, which
    # do not describe torchrun's world (rank 1 of 2 against 0 of 1): the store.
    inherited = {**torchrun, "RANK": "1", "PMI_RANK": "0", "PMI_SIZE": "1"}
    assert bootstrap.choose(True, environ=inherited) == "store"
    assert bootstrap.choose(False, environ={**torchrun, "PMI_RANK": "0", "PMI_SIZE": "1"}) == "store"
    assert bootstrap.choose(False, environ={**torchrun, "PMI_RANK": "0", "PMI_SIZE": "2"}) == "mpi"
    assert bootstrap.choose(True, "mpi", environ=inherited) == "mpi"  # asked for
    assert bootstrap.choose(True, environ={}) == "store"
    assert bootstrap.choose(False, environ={}) == "mpi"  # plain `python script.py`: a one-rank MPI job
    assert bootstrap.choose(False, "store", environ=mpi) == "store"
    with pytest.raises(InvalidArgument, match="RINGCOMM_BOOTSTRAP"):
        bootstrap.mode("tcp")


def run_group(n, fn, timeout=10.0, prefix="t"):
    master = dist.TCPStore("127.0.0.1", 0, n + 1, True, timeout=datetime.timedelta(seconds=30),
                           wait_for_workers=False)
    out, errors = [None] * n, [None] * n

    def body(r):
        try:
            client = dist.TCPStore("127.0.0.1", master.port, n + 1, False, timeout=datetime.timedelta(seconds=30))
            out[r] = fn(bootstrap.StoreGroup(client, r, n, timeout, prefix))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return master, out, errors


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_collectives_and_keys_deleted(n):
    def fn(g):
        got = []
        for i in range(3):
            got.append(g.allgather((g.rank, i, "x" * g.rank)))
        got.append(g.bcast({"from": 0, "v": [1, 2]} if g.rank == 0 else None, root=0))
        got.append(g.bcast(g.rank * 10, root=n - 1))
        g.barrier()
        half = g.Split(g.rank % 2, key=-g.rank)  # reversed order within each color
        got.append((half.Get_rank(), half.Get_size(), half.allgather(g.rank)))
        return got

    master, out, errors = run_group(n, fn)
    assert errors == [None] * n, errors
    for r, got in enumerate(out):
        for i in range(3):
            assert got[i] == [(q, i, "x" * q) for q in range(n)], f"rank {r}: allgather {i}: {got[i]}"
        assert got[3] == {"from": 0, "v": [1, 2]}, f"rank {r}"
        assert got[4] == (n - 1) * 10, f"rank {r}"
        mine = sorted((q for q in range(n) if q % 2 == r % 2), reverse=True)
        assert got[5] == (mine.index(r), len(mine), mine), f"rank {r}: split {got[5]}"
    # every call's keys were deleted by its last reader: nothing is left in the store
    assert master.num_keys() <= 1, f"{master.num_keys()} keys left"  # (the TCPStore's own init key)


def test_missing_rank_is_named_at_the_timeout():
    def fn(g):
        if g.rank == 2:
            return None  # never arrives
        return g.allgather(g.rank)

    _, out, errors = run_group(3, fn, timeout=1.0)
    for r in (0, 1):
        assert isinstance(errors[r], CollectiveTimeout), errors
        assert "rank(s) [2] did not arrive within 1 s" in str(errors[r]), str(errors[r])


def test_bad_arguments():
    with pytest.raises(InvalidArgument, match="rank must be in"):
        bootstrap.StoreGroup(object(), 2, 2, 1.0)
    with pytest.raises(InvalidArgument, match="set/get/add/check"):
        bootstrap.StoreGroup(object(), 0, 2, 1.0)


def test_store_launch_on_a_gpu_needs_one(tmp_path):
    # The device path over a store (NCCL's unique id through the store,
    # control messages over UCX): on a machine without a usable GPU it must
    # say so before anything is made. (On hardware: bench/gpu_checks.py nccl_store.)
    import ringcomm
    from ringcomm import cuda
    if cuda.available():
        pytest.skip("a GPU is usable here: this checks the error without one")
    with pytest.raises(InvalidArgument, match="GPU"):
        ringcomm.init(store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, size=1, device="cuda")


def test_torchrun_workers_under_an_mpi_started_agent_keep_their_rank(monkeypatch):
    # `mpirun -np NODES torchrun ...`: the workers inherit the agent's Open
    # MPI variables; importing ringcomm.torch made each of them rank 0 of 1
    # (and so every backend, gloo too, trained alone).
    from ringcomm.torch import env
    for k, v in {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                 "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job"}.items():
        monkeypatch.setenv(k, v)
    env.launcher_env()
    import os
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("1", "2", "1")
    # a plain MPI job (no torchrun) still takes MPI's values over inherited ones
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    env.launcher_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1")


def test_init_names_arguments_it_cannot_use(monkeypatch):
    # rank/size without a store were dropped without a word (a 1-rank MPI
    # communicator); a store under an MPI launch blamed RINGCOMM_BOOTSTRAP.
    import ringcomm
    monkeypatch.delenv("RINGCOMM_BOOTSTRAP", raising=False)
    with pytest.raises(InvalidArgument, match=r"init\(rank=..., size=...\) needs store"):
        ringcomm.init(rank=1, size=2, bootstrap="mpi")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(InvalidArgument, match="in a job an MPI launcher started"):
        ringcomm.init(store=object(), rank=0, size=2)
    with pytest.raises(InvalidArgument, match="needs device='emulated-nccl'"):
        ringcomm.init(store=object(), rank=0, size=2, jitter_us=10)
    with pytest.raises(InvalidArgument, match="needs a store launch"):
        ringcomm.init(device="emulated-nccl")


def test_a_closed_communicator_lets_its_store_go(tmp_path):
    # Every store passed to init() was kept for the life of the process: a
    # TCPStore's port stayed taken, and a second env:// init failed (EADDRINUSE).
    import gc
    import weakref

    import numpy as np

    import ringcomm
    refs, errors = [], []

    def rank(r):
        try:
            store = dist.FileStore(str(tmp_path / "store"), 2)
            refs.append(weakref.ref(store))
            c = ringcomm.init(store=store, rank=r, size=2, timeout=20)
            c.all_reduce(np.ones(2, np.float32))
            c.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    gc.collect()
    assert not errors, errors
    assert [ref() for ref in refs] == [None, None], "a closed communicator still holds its store"

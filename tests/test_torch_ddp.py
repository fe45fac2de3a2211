"""ringcomm.torch.DistributedDataParallel against torch's own single-process
training on the global batch (in-process ranks, and one MPI run)."""

import threading

import pytest

torch = pytest.importorskip("torch")

import ringcomm  # noqa: E402
import ringcomm.torch as rtorch  # noqa: E402
from ringcomm.errors import UnusedParametersError  # noqa: E402
from tiers import slow_except  # noqa: E402

GLOBAL_BATCH = 24


_RNG_LOCK = threading.Lock()


def make_model(seed=0):
    # torch's default generator is process-global: in-process ranks (threads)
    # must not seed and draw from it concurrently.
    with _RNG_LOCK:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                   torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 6, generator=g, dtype=torch.float64).float()
    y = torch.arange(GLOBAL_BATCH) % 4
    return x, y


def shard(t, rank, n):
    k = GLOBAL_BATCH // n
    return t[rank * k:(rank + 1) * k]


def single_process(steps, lr=0.1, momentum=0.9, accum=1):
    m = make_model()
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    for step in range(steps):
        opt.zero_grad()
        for a in range(accum):
            x, y = data(step * accum + a)
            (torch.nn.functional.cross_entropy(m(x), y) / accum).backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def ddp_train(comm, steps, cap_mb, lr=0.1, momentum=0.9, accum=1, set_to_none=True):
    torch.set_num_threads(1)
    n, rank = comm.size, comm.rank
    m = make_model(seed=rank)  # different initial weights: the construction broadcast must fix them
    ddp = rtorch.DistributedDataParallel(m, comm, bucket_cap_mb=cap_mb, first_bucket_mb=min(cap_mb, 1e-3))
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=momentum)
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        for a in range(accum):
            x, y = data(step * accum + a)
            loss = torch.nn.functional.cross_entropy(ddp(shard(x, rank, n)), shard(y, rank, n)) / accum
            if a < accum - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()], ddp.bucketer


def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("n", slow_except([1, 2, 3], [1, 2, 3, 4]))
@pytest.mark.parametrize("cap_mb", [0.0, 1e-3, 25.0])
def test_ddp_equals_single_process_on_global_batch(n, cap_mb):
    ref = single_process(6)
    for rank, (params, _) in enumerate(ringcomm.run_local(n, ddp_train, 6, cap_mb)):
        d = max_diff(params, ref)
        assert d < 2e-6, f"rank {rank}: max |ddp - single| = {d}"


def test_no_sync_gradient_accumulation_and_view_grads():
    ref = single_process(4, accum=3)
    res = ringcomm.run_local(3, ddp_train, 4, 1e-3, accum=3, set_to_none=False)
    for rank, (params, bucketer) in enumerate(res):
        assert max_diff(params, ref) < 2e-6, f"rank {rank}: {max_diff(params, ref)}"
        assert bucketer.iteration == 4  # one synchronised iteration per optimizer step


def test_grads_are_bucket_views():
    def body(comm):
        ddp = rtorch.DistributedDataParallel(make_model(), comm, bucket_cap_mb=1e-3, first_bucket_mb=0)
        x, y = data(0)
        for _ in range(2):
            ddp.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
        views = ddp.bucketer.grad_views()
        return all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(ddp.module.parameters(), views))
    assert ringcomm.run_local(2, body) == [True, True]


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        with _RNG_LOCK:  # see make_model
            torch.manual_seed(0)
            self.body = torch.nn.Linear(4, 4)
            self.head_a = torch.nn.Linear(4, 2)
            self.head_b = torch.nn.Linear(4, 2)

    def forward(self, x, use_b):
        h = self.body(x)
        return self.head_b(h) if use_b else self.head_a(h)


def test_unused_parameters_error_and_find_unused():
    def body(comm, find_unused):
        ddp = rtorch.DistributedDataParallel(TwoHeads(), comm, find_unused_parameters=find_unused)
        x = torch.linspace(-1, 1, 8).reshape(2, 4) * (comm.rank + 1)
        try:
            ddp(x, use_b=comm.rank == 1).sum().backward()   # rank 1 skips head_a, the others head_b
        except UnusedParametersError as exc:
            return str(exc), None
        return None, {n: (p.grad.clone() if p.grad is not None else None) for n, p in ddp.module.named_parameters()}

    for rank, (msg, _) in enumerate(ringcomm.run_local(3, body, False)):
        assert msg is not None, f"rank {rank}: no error"
        assert "parameter 2 ('head_a.weight') on rank 1" in msg and "parameter 4 ('head_b.weight') on ranks 0, 2" in msg, msg

    res = ringcomm.run_local(3, body, True)
    # Reference: the average over ranks of each rank's gradient, zero where unused.
    grads = []
    for r in range(3):
        m = TwoHeads()
        m(torch.linspace(-1, 1, 8).reshape(2, 4) * (r + 1), use_b=r == 1).sum().backward()
        grads.append({n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in m.named_parameters()})
    for rank, (msg, got) in enumerate(res):
        assert msg is None, msg
        for name in got:
            want = sum(g[name] for g in grads) / 3
            assert torch.allclose(got[name], want, atol=1e-6), f"rank {rank} {name}: {got[name]} vs {want}"


def test_buffers_broadcast_from_rank0():
    def body(comm):
        torch.manual_seed(comm.rank)
        m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        m[1].running_mean.fill_(comm.rank + 1.0)
        rtorch.DistributedDataParallel(m, comm)
        return m[0].weight.detach().clone(), m[1].running_mean.clone()
    res = ringcomm.run_local(3, body)
    for rank, (w, rm) in enumerate(res):
        assert torch.equal(w, res[0][0]) and torch.equal(rm, torch.ones(3)), f"rank {rank}"


@pytest.mark.parallel(2)
def test_ddp_over_mpi():
    from mpi4py import MPI
    errs = []
    try:
        comm = ringcomm.init()
        params, _ = ddp_train(comm, 4, 1e-3)
        d = max_diff(params, single_process(4))
        if d >= 2e-6:
            errs.append(f"rank {comm.rank}: max |ddp - single| = {d}")
        comm.close()
    except Exception as exc:  # noqa: BLE001 - reported after the allgather
        errs.append(f"rank {MPI.COMM_WORLD.rank}: {type(exc).__name__}: {exc}")
    everyone = [e for es in MPI.COMM_WORLD.allgather(errs) for e in es]
    assert not everyone, "\n".join(everyone)

"""Arrays ringcomm hands out, held across iterations as a training loop holds
them (tests/test_held_views.py, in process and under `ringcomm run`).

Each case runs ITERS iterations with the ready order shuffled per iteration
(alike on every rank) and checks, on every rank and every iteration, the
exact numpy-computed average; or that the first use of a stale array raises
StaleViewError naming where the live one is. Returns one dict per rank.

    python held_views.py CASE FAMILY [ITERS]      (under ringcomm run / mpirun)
"""

import json
import sys

import numpy as np

import ringcomm

# Sizes that make several buckets at bucket_cap_mb=0.005 / first_bucket_mb=0.0005
# (float32: 1.6 MB, 12 KB, 28 B, 1 MB, 884 B, 4 B).
SHAPES = [(400_000,), (1000, 3), (7,), (250_000,), (13, 17), (1,)]


def value(rank, i, it, shape):
    """Rank-, index- and iteration-dependent, with a mean over any N that
    float32 holds exactly ((N + 1) / 2 x an integer below 2^10)."""
    n = int(np.prod(shape))
    return ((rank + 1) * ((np.arange(n) % 7) + 3 * i + it + 1)).reshape(shape).astype(np.float32)


def mean(n, i, it, shape, accum=1):
    return sum(value(q, i, it, shape) for q in range(n)) * accum / n


def as_array(fam, a):
    if fam == "torch":
        import torch
        return torch.from_numpy(a)
    return a


def check(got, want, where):
    got = np.asarray(got)
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got.reshape(-1) != want.reshape(-1))[0])
        raise AssertionError(f"{where}: index {bad} is {got.reshape(-1)[bad]}, expected {want.reshape(-1)[bad]}")


def bucketer_case(comm, case, fam, iters):
    """held: the views fetched once, before the loop; refetch: at the top of
    every iteration (the README's form); no_sync: two accumulation steps per
    synchronised one, views held; find_unused: one parameter unused on rank 0
    (views held with torch, fetched per iteration with numpy)."""
    import ringcomm.train.tensors as tensors
    params = [tensors.zeros((fam, "float32", "cpu" if fam == "torch" else None), int(np.prod(s))).reshape(s)
              for s in SHAPES]
    b = ringcomm.GradBucketer(params, comm, bucket_cap_mb=0.005, first_bucket_mb=0.0005,
                              find_unused=(case == "find_unused"))
    assert len(b.buckets) >= 3, b.buckets
    rng = np.random.default_rng(7)  # alike on every rank
    grads = b.grad_views()
    for it in range(iters):
        order = [int(i) for i in rng.permutation(len(SHAPES))]
        try:
            if case == "refetch" or (case == "find_unused" and fam == "numpy"):
                grads = b.grad_views()
            b.zero_grad()
            accum = 1
            if case == "no_sync":
                accum = 3
                with b.no_sync():
                    for _ in range(2):
                        for i in order:
                            grads[i] += as_array(fam, value(comm.rank, i, it, SHAPES[i]))
                            b.mark_ready(i)
                        b.finalize()
            for i in order:
                if case == "find_unused" and i == 2 and comm.rank == 0:
                    continue
                grads[i] += as_array(fam, value(comm.rank, i, it, SHAPES[i]))
                b.mark_ready(i)
            b.finalize()
        except ringcomm.StaleViewError as exc:
            return {"rank": comm.rank, "stale_at": it, "message": str(exc), "layout": b.layout_version}
        for i, g in enumerate(grads):
            want = mean(comm.size, i, it, SHAPES[i], accum)
            if case == "find_unused" and i == 2:  # rank 0 contributed zeros
                want = (want * comm.size - value(0, i, it, SHAPES[i])) / comm.size
            check(g, want, f"rank {comm.rank}, iteration {it}, parameter {i}")
    return {"rank": comm.rank, "ok": iters, "layout": b.layout_version}


def ddp_case(comm, iters):
    """torch DDP wrapper: references to param.grad taken at the first
    iteration, used in every later one. The layers are registered in the
    reverse of the order forward uses them, so backward's ready order is not
    the default and the buckets are rebuilt after the first iteration."""
    import copy
    import torch
    import ringcomm.torch as rt

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.out, self.mid, self.inp = torch.nn.Linear(200, 3), torch.nn.Linear(300, 200), torch.nn.Linear(64, 300)

        def forward(self, x):
            return self.out(self.mid(self.inp(x)))

    torch.manual_seed(0)
    net = Net()
    model = rt.DistributedDataParallel(net, comm, bucket_cap_mb=0.05, first_bucket_mb=0.01)
    held = None
    for it in range(iters):
        want = [torch.zeros_like(p) for p in net.parameters()]  # every rank's gradient, computed here
        for q in range(comm.size):
            ref = copy.deepcopy(net)
            ref(torch.from_numpy(value(q, 0, it, (5, 64)) / 100)).pow(2).sum().backward()
            for w, p in zip(want, ref.parameters()):
                w += p.grad / comm.size
        model(torch.from_numpy(value(comm.rank, 0, it, (5, 64)) / 100)).pow(2).sum().backward()
        if held is None:
            held = [p.grad for p in net.parameters()]
        for i, (h, p, w) in enumerate(zip(held, net.parameters(), want)):
            assert h is p.grad, f"rank {comm.rank}, iteration {it}: param.grad {i} is a new tensor"
            torch.testing.assert_close(h, w, msg=f"rank {comm.rank}, iteration {it}, parameter {i}")
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.01 * p.grad
                p.grad.zero_()
    return {"rank": comm.rank, "ok": iters, "layout": model.bucketer.layout_version}


def zero_case(comm, case, iters):
    """ZeRO stage 2 gradients and stage 3 gathered parameters held past the
    point where ringcomm gives their memory up: the first use raises."""
    from ringcomm.zero import ZeroOptimizer
    units = [[np.full((5, 3), 0.5, np.float32), np.zeros(3, np.float32)]]
    zero = ZeroOptimizer(units, comm, stage=2 if case == "zero_grads" else 3, lr=0.1)
    held = None
    for it in range(iters):
        try:
            if case == "zero_grads":
                g = zero.grads(0) if held is None else held
                held = g
                g[0][...] = comm.rank + it
                zero.reduce(0)
            else:
                if held is None:
                    with zero.gathered(0) as ps:
                        held = ps
                float(held[0].sum())  # a forward pass with the parameters held from an earlier block
                g = zero.grads(0)
                g[0][...] = comm.rank + it
                zero.reduce(0)
            zero.step()
        except ringcomm.StaleViewError as exc:
            return {"rank": comm.rank, "stale_at": it, "message": str(exc)}
    return {"rank": comm.rank, "ok": iters}


def run(comm, case, fam, iters):
    if case == "ddp":
        return ddp_case(comm, iters)
    if case.startswith("zero"):
        return zero_case(comm, case, iters)
    return bucketer_case(comm, case, fam, iters)


if __name__ == "__main__":
    case, fam = sys.argv[1], sys.argv[2]
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    comm = ringcomm.init()
    print("RESULT " + json.dumps(run(comm, case, fam, iters)), flush=True)
    comm.close()

"""ringcomm.zero.TorchZero: ZeRO-1/2/3 on a torch MLP (CPU) gives the same
parameters as DDP, bit for bit, at N = 1..4 in process (float32, bfloat16 and
float16 with fp32 master weights) and under mpirun; stage 3 really frees the
units it is not using; the traffic of a step is the formula's, to the byte;
checkpoints resume bit-identically.

The DDP reference is written here, independently of ringcomm.zero: plain
torch parameters, each bucket's gradients concatenated and all_reduce'd with
op="avg" (the same buffers TorchZero reduce-scatters), then Adam as
ringcomm.zero computes it, elementwise in float32 on fp32 master weights."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ringcomm  # noqa: E402
from ringcomm import traffic, vocab  # noqa: E402
from ringcomm.train.tensors import averaging  # noqa: E402
from ringcomm.zero import TorchZero, consolidate, expected_memory, expected_traffic  # noqa: E402
from test_zero import exact_memory  # noqa: E402  (tests/ is on the path, as for suite)
from tiers import slow_except  # noqa: E402

WIDTHS = [13, 17, 11, 7, 5]  # 4 Linear layers (238, 198, 84 and 40 parameters: the split rule at work)
LR = 1e-2
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def make_model(dtype, seed):
    rng = np.random.default_rng(seed)
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1]).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) * 0.3).astype(np.float32)))
    return model


def linears(model):
    return [m for m in model if isinstance(m, torch.nn.Linear)]


def batch(rank, step, dtype):
    rng = np.random.default_rng(1000 * step + rank)
    x = torch.from_numpy(rng.standard_normal((8, WIDTHS[0])).astype(np.float32)).to(dtype)
    return x, torch.from_numpy(rng.standard_normal((8, WIDTHS[-1])).astype(np.float32))


def loss_of(model, x, y):
    return ((model(x).float() - y) ** 2).mean()


def unit_layout(model):
    """The layout TorchZero documents for units=linears: one buffer per unit, last unit first."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in m.parameters()] for m in reversed(linears(model))]


def reference(comm, dtype, layout, steps=3, first_step=0):
    """DDP written out: gradients all_reduce'd (avg) per buffer of `layout`, Adam in float32."""
    model = make_model(dtype, seed=0)
    params = dict(model.named_parameters())
    buckets = [[params[n] for n in names] for names in layout]
    masters = [torch.cat([p.detach().reshape(-1) for p in b]).float().numpy().copy() for b in buckets]
    ms = [np.zeros_like(w) for w in masters]
    vs = [np.zeros_like(w) for w in masters]
    b1, b2, eps, lr = np.float32(0.9), np.float32(0.999), np.float32(1e-8), np.float32(LR)
    for step in range(first_step, first_step + steps):
        loss_of(model, *batch(comm.rank, step, dtype)).backward()
        t = step + 1
        for b, w, m, v in zip(buckets, masters, ms, vs):
            g = torch.cat([p.grad.reshape(-1) for p in b])
            # DDP on the ring (the sums ZeRO matches); half precision pre-divided, as DDP does
            comm.all_reduce(g, op=averaging(g, vocab.torch_name(g.dtype), comm.size), algorithm="ring")
            g = g.float().numpy()
            m *= b1
            m += (np.float32(1) - b1) * g
            v *= b2
            v += (np.float32(1) - b2) * (g * g)
            c1, c2 = np.float32(1 - 0.9 ** t), np.float32(1 - 0.999 ** t)
            w -= lr * (m / c1) / (np.sqrt(v / c2) + eps)
            new = torch.from_numpy(w).to(dtype)
            off = 0
            with torch.no_grad():
                for p in b:
                    p.copy_(new[off:off + p.numel()].view(p.shape))
                    off += p.numel()
                    p.grad = None
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train(comm, stage, dtype, steps=3, units=True, **kw):
    model = make_model(dtype, seed=comm.rank)  # rank 0's values win
    zero = TorchZero(model, comm, stage=stage, units=linears(model) if units else None, lr=LR, **kw)
    for step in range(steps):
        loss_of(model, *batch(comm.rank, step, dtype)).backward()
        zero.step()
    return zero.full_parameters(), zero.layout


def differences(got, ref, what):
    """'what, parameter P: first differing index I (a vs b)' for every parameter not bitwise equal."""
    out = []
    for name, b in ref.items():
        a = got[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{what}, parameter {name}: {a.dtype}{tuple(a.shape)} vs DDP {b.dtype}{tuple(b.shape)}")
            continue
        ne = (a.reshape(-1).view(BITS[a.dtype]) != b.reshape(-1).view(BITS[b.dtype])).nonzero()
        if len(ne):
            i = int(ne[0])
            out.append(f"{what}, parameter {name}: {len(ne)} elements differ, first at flat index {i} "
                       f"({a.reshape(-1)[i].item()!r} vs DDP {b.reshape(-1)[i].item()!r})")
    return out


@pytest.mark.parametrize("n", slow_except([1, 2, 3], [1, 2, 3, 4]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_stage_equals_ddp_bitwise(n, dtype):
    layout = unit_layout(make_model(dtype, 0))
    ref = ringcomm.run_local(n, reference, dtype, layout)
    bad = []
    for stage in (0, 1, 2, 3):
        got = ringcomm.run_local(n, train, stage, dtype)
        for r in range(n):
            assert got[r][1] == layout, f"stage {stage} rank {r}: layout {got[r][1]}"
            bad += differences(got[r][0], ref[r], f"stage {stage}, N = {n}, rank {r}")
    assert not bad, "\n".join(bad)
    # and training did something
    assert not torch.equal(ref[0]["0.weight"], make_model(dtype, 0)[0].weight.detach())


@pytest.mark.parametrize("n", [2, 3])
def test_every_stage_equals_ddp_bitwise_in_shared_memory(n, monkeypatch):
    # In the window: stages 0-1 keep their gradients in the shared arena and
    # reduce them zero copy; stages 2-3 staged (shm); all sum in rank order,
    # so every stage gives stage 0's (DDP's) bits. (reference() sums on the
    # ring: other bits from N = 3 on.)
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "shm")
    dtype = torch.float32
    ref = None
    bad = []
    for stage in (0, 1, 2, 3):
        def body(comm):
            params, lay = train(comm, stage, dtype)
            return params, lay, comm.flight_record()
        got = ringcomm.run_local(n, body)
        ref = ref or [g[0] for g in got]
        for r in range(n):
            bad += differences(got[r][0], ref[r], f"stage {stage}, N = {n}, rank {r}")
            algos = {rec["algorithm"] for rec in got[r][2]  # (count 1: the arena's agreement, not a gradient)
                     if rec["collective"] in ("all_reduce", "reduce_scatter") and rec["count"] > 1}
            want = {"zero_copy"} if stage < 2 else {"shm"}
            assert algos == want, f"stage {stage} rank {r}: gradients reduced by {algos}"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("stage", [1, 2])
def test_size_capped_buckets_equal_ddp_bitwise(stage):
    """Stages 1-2 without units: buckets filled in reverse parameter order up to bucket_cap_mb."""
    n, dtype = 3, torch.bfloat16
    kw = dict(units=False, bucket_cap_mb=400 / 2**20, first_bucket_mb=100 / 2**20)
    got = ringcomm.run_local(n, train, stage, dtype, **kw)
    layout = got[0][1]
    assert len(layout) > 2 and [x for b in layout for x in b] == \
        [name for name, _ in reversed(list(make_model(dtype, 0).named_parameters()))]
    ref = ringcomm.run_local(n, reference, dtype, layout)
    bad = [d for r in range(n) for d in differences(got[r][0], ref[r], f"stage {stage}, rank {r}")]
    assert not bad, "\n".join(bad)


def test_stage3_frees_what_it_does_not_use():
    n, dtype = 2, torch.bfloat16

    def body(comm):
        model = make_model(dtype, 0)
        units = linears(model)
        held = lambda: [int(any(p.untyped_storage().nbytes() > 0 for p in u.parameters())) for u in units]  # noqa
        seen = {"forward": [], "backward": []}
        for k, u in enumerate(units):  # registered before TorchZero's: they see a unit before it is freed
            for p in u.parameters():
                p.register_post_accumulate_grad_hook(lambda p, k=k: seen["backward"].append((k, held())))
        zero = TorchZero(model, comm, stage=3, units=units, lr=LR)
        for u in units:  # registered after TorchZero's: they run once the unit is gathered
            u.register_forward_pre_hook(lambda m, a: seen["forward"].append(held()))
        steady = zero.memory()
        zero.reset_peak()
        assert held() == [0, 0, 0, 0]
        loss = loss_of(model, *batch(comm.rank, 0, dtype))
        between = held(), zero.memory()["params"]
        loss.backward()
        after_backward = held(), zero.memory()
        zero.step()
        return steady, between, after_backward, held(), zero.memory(), seen

    for r, (steady, between, after_bwd, after_step, mem, seen) in enumerate(ringcomm.run_local(n, body)):
        counts = [a * b + b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
        mine = sum(c // n + (1 if r < c % n else 0) for c in counts)
        assert steady["params"] == 2 * mine, (r, steady)
        # between forward and backward: nothing gathered, parameters hold 0 bytes of storage
        assert between == ([0, 0, 0, 0], 2 * mine), (r, between)
        assert after_bwd[0] == [0, 0, 0, 0] and after_step == [0, 0, 0, 0], (r, after_bwd, after_step)
        # in forward: this unit and the prefetched next one; in backward likewise (the next is the previous)
        assert seen["forward"] == [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 1]], (r, seen)
        # a unit's gradients arrive while it is gathered (with at most the prefetched previous unit)
        assert [k for k, _ in seen["backward"]] == [3, 3, 2, 2, 1, 1, 0, 0], (r, seen["backward"])
        for k, h in seen["backward"]:
            assert h[k] == 1 and sum(h) <= 2, (r, k, seen["backward"])
        # the peak: the shards plus at most two gathered units (bytes), plus gradients in flight
        assert mem["peak"] <= sum(steady[k] for k in ("params", "grads", "optimizer")) + 2 * 2 * max(counts) \
            + 2 * sum(counts)
        assert mem["params"] == steady["params"] and mem["grads"] == steady["grads"]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_traffic_and_memory_per_step_match_the_formulas(n, stage):
    dtype = torch.bfloat16
    counts = [a * b + b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])][::-1]  # layout order
    psi = sum(counts)

    def body(comm):
        model = make_model(dtype, 0)
        zero = TorchZero(model, comm, stage=stage, units=linears(model), lr=LR)
        loss_of(model, *batch(comm.rank, 0, dtype)).backward()
        zero.step()  # a first step, then the one measured
        steady = zero.memory()
        comm.reset_traffic()
        loss_of(model, *batch(comm.rank, 1, dtype)).backward()
        zero.step()
        tr = comm.traffic()
        return steady, {c: tr.bytes_sent(c) for c in ("all_reduce", "reduce_scatter", "all_gather")}

    res = ringcomm.run_local(n, body)
    for r, (steady, sent) in enumerate(res):
        per_coll = {0: {"all_reduce": 1}, 1: {"reduce_scatter": 1, "all_gather": 1},
                    2: {"reduce_scatter": 1, "all_gather": 1}, 3: {"reduce_scatter": 1, "all_gather": 2}}[stage]
        for coll in ("all_reduce", "reduce_scatter", "all_gather"):
            exact = per_coll.get(coll, 0) * sum(traffic.expected(coll, c, "bfloat16", n, r).bytes_sent
                                                for c in counts)
            assert sent[coll] == exact, f"rank {r} stage {stage} {coll}: sent {sent[coll]} B, expected {exact} B"
        want = exact_memory(stage, counts, n, r)
        for k, v in want.items():
            assert steady[k] == v, f"rank {r} stage {stage} {k}: {steady[k]} B held, formula {v}"
    # the articles' formulas (Psi divisible by N assumed): the mean over ranks matches
    mean_sent = np.mean([sum(s.values()) for _, s in res])
    assert abs(mean_sent - expected_traffic(stage, psi, n)) <= 2 * 3 * len(counts), (mean_sent, stage)
    formula = expected_memory(stage, psi, n)
    for k in formula:
        assert abs(np.mean([m[k] for m, _ in res]) - formula[k]) < 1e-6 * formula[k] + 1


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_checkpoint_resume_is_bit_identical(stage, tmp_path):
    n, dtype = 3, torch.bfloat16
    prefix = str(tmp_path / f"ckpt{stage}")

    def resumed(comm):  # 2 steps, save; a fresh model (other values) loads and does 2 more
        model = make_model(dtype, comm.rank)
        zero = TorchZero(model, comm, stage=stage, units=linears(model), lr=LR)
        for step in range(2):
            loss_of(model, *batch(comm.rank, step, dtype)).backward()
            zero.step()
        zero.save(prefix)
        at_save = zero.full_parameters()
        model = make_model(dtype, 99)
        fresh = TorchZero(model, comm, stage=stage, units=linears(model), lr=LR)
        fresh.load(prefix)
        for step in range(2, 4):
            loss_of(model, *batch(comm.rank, step, dtype)).backward()
            fresh.step()
        return fresh.full_parameters(), at_save, fresh.layout

    straight = ringcomm.run_local(n, train, stage, dtype, steps=4)
    res = ringcomm.run_local(n, resumed)
    bad = [d for r in range(n) for d in differences(res[r][0], straight[r][0], f"stage {stage}, rank {r} resumed")]
    assert not bad, "\n".join(bad)
    # zero.consolidate reads the same files: the full master weights, one entry per buffer of the layout
    full = consolidate(prefix)
    assert full["stage"] == stage and full["t"] == 2
    at_save, layout = res[0][1], res[0][2]
    for names, unit in zip(layout, full["units"]):
        flat = torch.cat([at_save[name].reshape(-1) for name in names])
        assert torch.equal(torch.from_numpy(unit["master"]).to(dtype), flat)


@pytest.mark.parametrize("stage", [1, 3])
def test_checkpoint_carries_buffers_and_frozen_parameters(stage, tmp_path):
    """BatchNorm's running statistics (this rank's) and a frozen layer come back
    on load into a fresh model, and training resumes as if never stopped."""
    prefix = str(tmp_path / "bn")

    def model_of(seed):  # (its values from a generator of its own: the ranks are threads)
        m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3),
                                torch.nn.Linear(3, 3))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
        m[3].requires_grad_(False)  # frozen (a pretrained head)
        return m

    def data(rank, step):
        g = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)

    def run(comm, stop):
        model = model_of(0)
        zero = TorchZero(model, comm, stage=stage, units=[model[0], model[1], model[2]] if stage == 3 else None)
        for step in range(4):
            if step == stop:  # save, then continue in a fresh model (other values everywhere) that loads
                zero.save(prefix)
                model = model_of(7)
                zero = TorchZero(model, comm, stage=stage, units=[model[0], model[1], model[2]] if stage == 3 else None)
                zero.load(prefix)
            x, y = data(comm.rank, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            zero.step()
        with zero.gathered():
            return {k: v.clone() for k, v in model.state_dict().items()}

    straight = ringcomm.run_local(2, run, None)
    resumed = ringcomm.run_local(2, run, 2)
    for r in range(2):
        for k, v in straight[r].items():
            assert torch.equal(resumed[r][k], v), f"rank {r} stage {stage}: {k} differs after resuming"
    assert not torch.equal(straight[0]["1.running_mean"], straight[1]["1.running_mean"])  # per-rank statistics


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("max_norm,norm_type", [(0.05, 2.0), (1e6, 2.0), (0.02, float("inf")), (0.1, 1.0)])
def test_clip_grad_norm_matches_torch_on_the_averaged_gradients(stage, max_norm, norm_type):
    """The sharded clip equals torch.nn.utils.clip_grad_norm_ on the DDP
    gradients (every rank's averaged), then SGD: the same norm and weights."""
    n = 3

    def sharded(comm):
        model = make_model(torch.float32, 0)
        zero = TorchZero(model, comm, stage=stage, units=linears(model), lr=LR, optimizer="sgd")
        loss_of(model, *batch(comm.rank, 0, torch.float32)).backward()
        norm = zero.clip_grad_norm_(max_norm, norm_type)
        zero.step()
        return float(norm), zero.full_parameters()

    ref = make_model(torch.float32, 0)
    grads = []
    for r in range(n):
        ref.zero_grad()
        loss_of(ref, *batch(r, 0, torch.float32)).backward()
        grads.append([p.grad.clone() for p in ref.parameters()])
    for p, *gs in zip(ref.parameters(), *grads):
        p.grad = sum(gs) / n
    want = float(torch.nn.utils.clip_grad_norm_(list(ref.parameters()), max_norm, norm_type))
    with torch.no_grad():
        for p in ref.parameters():
            p -= LR * p.grad
    res = ringcomm.run_local(n, sharded)
    for r, (norm, params) in enumerate(res):
        assert norm == pytest.approx(want, rel=1e-5), f"rank {r} stage {stage}: norm {norm}, torch {want}"
        for name, p in ref.named_parameters():
            torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-7,
                                       msg=lambda m: f"rank {r} stage {stage} {name}: {m}")


def test_clip_grad_norm_before_backward_is_refused():
    def body(comm):
        model = make_model(torch.float32, 0)
        zero = TorchZero(model, comm, stage=2, units=linears(model))
        with pytest.raises(ringcomm.InvalidArgument, match="before backward reduced every gradient"):
            zero.clip_grad_norm_(1.0)
        return True
    assert ringcomm.run_local(2, body) == [True, True]


def test_bad_arguments():
    def build(comm, **kw):
        model = make_model(torch.float32, 0)
        return TorchZero(model, comm, **kw)
    with pytest.raises(ringcomm.InvalidArgument, match="stage"):
        ringcomm.run_local(1, build, stage=4)
    with pytest.raises(ringcomm.InvalidArgument, match="disjoint"):
        ringcomm.run_local(1, lambda c: TorchZero(m := make_model(torch.float32, 0), c, stage=3, units=[m, m[0]]))

    def mixed(comm):
        model = make_model(torch.float32, 0)
        model[2].to(torch.bfloat16)
        TorchZero(model, comm, stage=3, units=[model])
    with pytest.raises(ringcomm.InvalidArgument, match="mixes dtypes"):
        ringcomm.run_local(1, mixed)

    def twice(comm):
        model = make_model(torch.float32, 0)
        TorchZero(model, comm, stage=2)
        loss_of(model, *batch(0, 0, torch.float32)).backward()
        loss_of(model, *batch(0, 1, torch.float32)).backward()
    with pytest.raises(ringcomm.InvalidArgument, match="rank 0: parameter .* second gradient"):
        ringcomm.run_local(1, twice)

    def early(comm):
        TorchZero(make_model(torch.float32, 0), comm, stage=1).step()
    with pytest.raises(ringcomm.InvalidArgument, match="step\\(\\) before backward"):
        ringcomm.run_local(1, early)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_float16_gradients_average_without_overflow_at_every_stage(stage):
    # Two fp16 gradients of 40000 sum to inf in fp16; their average is 40000.
    # Half precision is pre-divided by N, as DDP (ringcomm's and torch's) does.
    def fn(comm):
        w = torch.nn.Linear(4, 1, bias=False).half()
        torch.nn.init.zeros_(w.weight)
        z = TorchZero(w, comm, stage=stage, lr=1.0, optimizer="sgd")
        (w(torch.ones(1, 4, dtype=torch.float16)) * 40000.0).sum().backward()
        z.step()
        with z.gathered():
            return (-w.weight.float()).flatten().tolist()
    for r, got in enumerate(ringcomm.run_local(2, fn)):
        assert got == [40000.0] * 4, f"stage {stage}, rank {r}: {got}"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_parameter_write_after_construction_is_kept(stage):
    # load_state_dict after TorchZero is built (pretrained weights): stages
    # 0-2 overwrote it at the next step from the old master weights, stage 3
    # dropped it at the end of gathered(). With lr = 0 a step changes nothing.
    def fn(comm):
        model = make_model(torch.float32, 0)
        z = TorchZero(model, comm, stage=stage, units=linears(model), lr=0.0, optimizer="sgd")
        with z.gathered():
            model.load_state_dict({k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()})
        loss_of(model, *batch(comm.rank, 0, torch.float32)).backward()
        z.step()
        return sorted({float(v) for p in z.full_parameters().values() for v in p.flatten()})
    for r, got in enumerate(ringcomm.run_local(2, fn)):
        assert got == [0.5], f"stage {stage}, rank {r}: {got[:5]}"


def test_checkpoint_of_other_shapes_with_the_same_counts_is_refused(tmp_path):
    prefix = str(tmp_path / "c")

    def save(comm):
        m = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 2, bias=False))
        TorchZero(m, comm, stage=1, units=list(m)).save(prefix)

    def load(comm):
        m = torch.nn.Sequential(torch.nn.Linear(6, 4, bias=False), torch.nn.Linear(2, 6, bias=False))  # 24, 12 too
        z = TorchZero(m, comm, stage=1, units=list(m))
        with pytest.raises(ringcomm.InvalidArgument, match=r"holds other parameters: unit 0 has shapes"):
            z.load(prefix)
        return True
    ringcomm.run_local(2, save)
    assert ringcomm.run_local(2, load) == [True, True]


def test_stage3_refuses_state_dict_outside_gathered_and_a_second_backward():
    def fn(comm):
        model = make_model(torch.float32, 0)
        z = TorchZero(model, comm, stage=3, units=linears(model))
        with pytest.raises(ringcomm.InvalidArgument, match="inside zero.gathered"):
            model.state_dict()
        with z.gathered():  # (its tensors are views of the gathered storage: clone what outlives the block)
            sd = {k: v.clone() for k, v in model.state_dict().items()}
        assert all(v.untyped_storage().nbytes() for v in sd.values())
        loss_of(model, *batch(comm.rank, 0, torch.float32)).backward()
        with pytest.raises(ringcomm.InvalidArgument, match="second backward before step"):
            loss_of(model, *batch(comm.rank, 1, torch.float32)).backward()
        return True
    assert ringcomm.run_local(1, fn) == [True]


def test_import_ringcomm_zero_does_not_import_torch():
    code = "import sys, ringcomm, ringcomm.zero; from ringcomm.zero import *; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr


def test_every_stage_equals_ddp_bitwise_over_mpi():
    script = os.path.join(os.path.dirname(__file__), "scripts", "zero_torch_mpi.py")
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "2", "--", sys.executable, script],
                         capture_output=True, text=True, timeout=300)
    out = [json.loads(line[7:]) for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and len(out) == 2, res.stdout + res.stderr
    for d in out:
        assert d["differences"] == [], d
        assert d["cases"] == 8 and d["n"] == 2

"""Real PyTorch programs over the "ringcomm" backend, each run twice in one
MPI job: over the default group ("ringcomm") and over a gloo group of the same
ranks, compared with each other and, where one exists, with a single-process
reference (tests/test_torch_programs.py runs it under `ringcomm run -n 2`,
`-n 3` and `-n 4`).

Programs: the object collectives; DTensor distribute_tensor / redistribute
between Shard(0), Shard(1), Replicate and Partial; tensor parallelism
(parallelize_module, ColwiseParallel + RowwiseParallel on an MLP, outputs and
gradients; and a pre-norm transformer block, attention + MLP, with
SequenceParallel LayerNorms between ColwiseParallel and RowwiseParallel to
Shard(1): outputs, input and parameter gradients); a mixture-of-experts dispatch/combine with all_to_all_single and
uneven splits; torch.distributed.checkpoint save/load of an FSDP2 model and
its optimizer, then resumed training; pipeline parallelism
(torch.distributed.pipelining: an N-stage split of an MLP, one stage per rank,
GPipe and 1F1B schedules, whose activations and gradients move by
batch_isend_irecv), loss, outputs and gradients against one process.

Arguments: the names of the programs to run (default: all).

Prints one line "RESULT {json}" per rank: {program: {"ok", "max_diff", "tol",
"note", "used", "secs"}}, "used" being the ringcomm collectives that carried the
program (from the ledger). A program that raises is recorded as failed with
its error; the job goes on with the next (a barrier over gloo keeps the ranks
together).
"""

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings

import torch
import torch.distributed as dist

import ringcomm.torch as rt
from ringcomm import vocab

warnings.filterwarnings("ignore")
dist.init_process_group("ringcomm")
R, N = dist.get_rank(), dist.get_world_size()
RING = dist.group.WORLD
GLOO = dist.new_group(backend="gloo")
results: dict = {}
used: set = set()  # ringcomm collectives that moved payload during the current program's ringcomm run


def on_ring(fn, *args):
    """fn(*args) over the ringcomm group, noting which of ringcomm's
    collectives carried it (from the traffic ledger): the evidence that the
    program ran on the new ops and not on a fallback."""
    comm = rt.communicator()
    before = comm.traffic()
    out = fn(*args)
    delta = comm.traffic() - before
    used.update(c for c in vocab.COLLECTIVES if delta.msgs_sent(c) or delta.msgs_received(c))
    return out


def maxdiff(a, b) -> float:
    """Largest |a - b| over tensors (or lists of them); inf if shapes differ."""
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return float("inf")
        return max([maxdiff(x, y) for x, y in zip(a, b)], default=0.0)
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return 0.0
    return float((a.double() - b.double()).abs().max())


ONLY = set(sys.argv[1:])  # program names to run (all when none are given)


def program(name: str, tol: float):
    """Decorator: run fn() -> (max_diff, note), record pass if max_diff <= tol
    (skipped when names were given on the command line and this is not one)."""
    def wrap(fn):
        if ONLY and name not in ONLY:
            return fn
        used.clear()
        t0 = time.perf_counter()
        try:
            diff, note = fn()
            results[name] = {"ok": diff <= tol, "max_diff": diff, "tol": tol, "note": note, "used": sorted(used)}
        except Exception as exc:  # noqa: BLE001 - reported, then the next program runs
            results[name] = {"ok": False, "max_diff": None, "tol": tol,
                             "note": f"{type(exc).__name__}: {exc}"[:400] + " | " +
                             traceback.format_exc().splitlines()[-3][:200], "used": sorted(used)}
        dist.barrier(group=GLOO)
        results[name]["secs"] = round(time.perf_counter() - t0, 2)  # both runs, ringcomm and gloo
        return fn
    return wrap


# ---- object collectives -----------------------------------------------------
@program("objects", tol=0.0)
def _objects():
    def run(group):
        mine = {"rank": R, "t": torch.arange(R + 3, dtype=torch.float64) * (R + 1), "s": "x" * (10 * R + 1)}
        ag = [None] * N
        dist.all_gather_object(ag, mine, group=group)
        go = [None] * N if R == 0 else None
        dist.gather_object(mine, go, dst=0, group=group)
        sc = [None]
        dist.scatter_object_list(sc, [("to", r, list(range(r * 7))) for r in range(N)] if R == N - 1 else None,
                                 src=N - 1, group=group)
        bc = [{"from": R}, [R] * 5, None] if R == 1 else [None, None, None]
        dist.broadcast_object_list(bc, src=1, group=group)
        return ag, go, sc, bc

    a, b = on_ring(run, RING), run(GLOO)
    same = repr(a) == repr(b)
    want_ag = [{"rank": r, "t": torch.arange(r + 3, dtype=torch.float64) * (r + 1), "s": "x" * (10 * r + 1)}
               for r in range(N)]
    right = (repr(a[0]) == repr(want_ag) and (R != 0 or repr(a[1]) == repr(want_ag))
             and a[2] == [("to", R, list(range(R * 7)))] and a[3] == [{"from": 1}, [1] * 5, None])
    return (0.0 if same and right else float("inf")), "all_gather_object, gather_object, scatter_object_list, " \
        "broadcast_object_list: equal to gloo and to the expected objects"


# ---- DTensor ---------------------------------------------------------------
@program("dtensor", tol=1e-6)
def _dtensor():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    def run(mesh):
        torch.manual_seed(1)
        full = torch.randn(7, 5)  # 7 rows, 5 columns: uneven shards at N = 2, 3
        got, fulls = [], []
        places = [Shard(0), Shard(1), Replicate()]
        for src in places:
            d = distribute_tensor(full, mesh, [src])
            got.append(d.to_local().clone())
            for dst in places:
                r = d.redistribute(mesh, [dst])
                got.append(r.to_local().clone())
                fulls.append(r.full_tensor())
        # Partial: every rank holds a summand; to Replicate (all_reduce) and Shard(0/1) (reduce_scatter).
        local = torch.arange(35, dtype=torch.float32).reshape(7, 5) * (R + 1)
        p = DTensor.from_local(local, mesh, [Partial()])
        for dst in (Replicate(), Shard(0), Shard(1)):
            got.append(p.redistribute(mesh, [dst]).to_local().clone())
        fulls.append(p.full_tensor())
        return full, got, fulls

    # On CPU, DTensor turns Shard(i) -> Shard(j) into all_gather + chunk rather
    # than all_to_all (torch's choice for CPU meshes, tensor/_collective_utils.py).
    full, a, fa = on_ring(run, init_device_mesh("cpu", (N,)))  # the default group: ringcomm
    _, b, fb = run(DeviceMesh.from_group(GLOO, "cpu"))
    want_partial = torch.arange(35, dtype=torch.float32).reshape(7, 5) * (N * (N + 1) // 2)
    vs_ref = max(max(maxdiff(f, full) for f in fa[:-1]), maxdiff(fa[-1], want_partial))
    vs_gloo = max(maxdiff(a, b), maxdiff(fa, fb))
    return max(vs_gloo, vs_ref), ("7x5 float32 (uneven shards), distribute_tensor to Shard(0)/Shard(1)/Replicate, "
                                  "redistribute between all of them and from Partial; local shards vs gloo "
                                  f"{vs_gloo:.1e}, full tensors vs the original {vs_ref:.1e}")


# ---- tensor parallelism ------------------------------------------------------
class MLP(torch.nn.Module):
    def __init__(self, d=16, h=24, o=8):
        super().__init__()
        self.w1 = torch.nn.Linear(d, h)
        self.act = torch.nn.GELU()
        self.w2 = torch.nn.Linear(h, o)

    def forward(self, x):
        return self.w2(self.act(self.w1(x)))


@program("tensor_parallel", tol=1e-5)
def _tp():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def make():
        torch.manual_seed(3)
        return MLP()

    torch.manual_seed(4)
    x = torch.randn(6, 16)  # the same batch on every rank (TP replicates the input)
    ref = make()
    ref_out = ref(x)
    ref_out.pow(2).sum().backward()
    ref_grads = [p.grad.clone() for p in ref.parameters()]

    def run(mesh):
        m = parallelize_module(make(), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        out = m(x)
        out.pow(2).sum().backward()
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in m.parameters()]
        return out.detach().clone(), grads

    a_out, a_grads = on_ring(run, init_device_mesh("cpu", (N,)))
    b_out, b_grads = run(DeviceMesh.from_group(GLOO, "cpu"))
    d_ref = max(maxdiff(a_out, ref_out.detach()), maxdiff(a_grads, ref_grads))
    d_gloo = max(maxdiff(a_out, b_out), maxdiff(a_grads, b_grads))
    return max(d_ref, d_gloo), (f"MLP 16-24-8 (w1 colwise, w2 rowwise), float32: outputs and all gradients; "
                                f"vs 1 process {d_ref:.2e}, vs gloo {d_gloo:.2e}")


# ---- tensor + sequence parallelism on a transformer block ---------------------
class Attention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = (torch.nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # view(..., -1, head_dim): under ColwiseParallel each rank holds heads / N of the heads.
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class Block(torch.nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = MLP(dim, hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@program("tp_sequence_parallel", tol=1e-5)
def _tp_sp():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    # 12 heads and hidden 48 divide among 2, 3 and 4 ranks; sequence 12 likewise.
    dim, heads, hidden, batch, seq = 24, 12, 48, 3, 12
    s_loc = seq // N

    def make():
        torch.manual_seed(9)
        blk = Block(dim, heads, hidden)
        with torch.no_grad():  # LayerNorm weights and biases not at their 1 / 0 init: their gradients matter
            for ln in (blk.ln1, blk.ln2):
                ln.weight.add_(torch.randn(dim) * 0.2)
                ln.bias.add_(torch.randn(dim) * 0.2)
        return blk

    torch.manual_seed(10)
    x = torch.randn(batch, seq, dim)
    ref = make()
    xr = x.clone().requires_grad_()
    ref_out = ref(xr)
    ref_out.pow(2).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    mine = slice(R * s_loc, (R + 1) * s_loc)  # this rank's part of the sequence

    plan = {
        "ln1": SequenceParallel(),  # LayerNorm on the sequence shard
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),  # all_gather
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=Shard(1)),  # reduce_scatter back to sequence shards
        "ln2": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.w1": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(output_layouts=Shard(1)),
    }

    def run(mesh):
        m = parallelize_module(make(), mesh, plan)
        xl = x[:, mine].clone().requires_grad_()  # the residual stream stays sharded along the sequence
        out = m(xl)
        out = out.to_local() if hasattr(out, "to_local") else out
        out.pow(2).sum().backward()  # the sum of the ranks' losses is the one-process loss
        grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                 for n, p in m.named_parameters()}
        return out.detach().clone(), xl.grad.clone(), grads

    a_out, a_xg, a_grads = on_ring(run, init_device_mesh("cpu", (N,)))
    b_out, b_xg, b_grads = run(DeviceMesh.from_group(GLOO, "cpu"))
    names = sorted(ref_grads)
    if sorted(a_grads) != names or sorted(b_grads) != names:
        return float("inf"), f"parameters {sorted(a_grads)} / {sorted(b_grads)} != {names}"
    # Relative differences: each tensor's max |diff| over its largest |reference value| (values reach ~50).
    refs = {"output": ref_out.detach()[:, mine], "input grad": xr.grad[:, mine], **ref_grads}
    ours = {"output": a_out, "input grad": a_xg, **a_grads}
    gloos = {"output": b_out, "input grad": b_xg, **b_grads}
    rel_ref = {k: maxdiff(ours[k], refs[k]) / float(refs[k].abs().max()) for k in refs}
    rel_gloo = {k: maxdiff(ours[k], gloos[k]) / float(refs[k].abs().max()) for k in refs}
    worst = max(rel_ref, key=rel_ref.get)
    d_ref, d_gloo = rel_ref[worst], max(rel_gloo.values())
    return max(d_ref, d_gloo), (f"pre-norm block dim {dim}, {heads} heads (causal SDPA), MLP {hidden}, LayerNorms "
                                f"SequenceParallel, q/k/v/w1 colwise, wo/w2 rowwise to Shard(1), batch {batch} x seq "
                                f"{seq} float32: output and input-gradient shards and all {len(names)} parameter "
                                f"gradients, max |diff| relative to each tensor's largest |value|: vs 1 process "
                                f"{d_ref:.2e} (worst: {worst}), vs gloo {d_gloo:.2e}")


# ---- mixture of experts: dispatch and combine with all_to_all_single ---------
@program("moe_all_to_all", tol=1e-6)
def _moe():
    d, tokens = 8, 11 + 3 * R  # a different number of tokens on each rank
    torch.manual_seed(5)
    experts = [torch.nn.Linear(d, d) for _ in range(N)]  # expert e lives on rank e; every rank can build all
    gen = torch.Generator().manual_seed(50 + R)
    x = torch.randn(tokens, d, generator=gen)
    route = torch.randint(0, N, (tokens,), generator=gen)  # uneven splits, some possibly empty
    order = torch.argsort(route, stable=True)
    send_counts = torch.bincount(route, minlength=N)

    def run(group):
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)  # equal splits: one count per peer
        ins, outs = send_counts.tolist(), recv_counts.tolist()
        recv = torch.empty(sum(outs), d)
        dist.all_to_all_single(recv, x[order], outs, ins, group=group)  # dispatch
        with torch.no_grad():
            y = experts[R](recv)
        back = torch.empty(tokens, d)
        w = dist.all_to_all_single(back, y, ins, outs, group=group, async_op=True)  # combine
        w.wait()
        out = torch.empty_like(back)
        out[order] = back
        return out, outs

    a, outs = on_ring(run, RING)
    b, _ = run(GLOO)
    with torch.no_grad():
        ref = torch.stack([experts[int(e)](x[i]) for i, e in enumerate(route)])
    return max(maxdiff(a, b), maxdiff(a, ref)), (f"{tokens} tokens here, received per peer {outs}; "
                                                 "vs gloo and a per-token local reference")


# ---- DCP: FSDP2 model and optimizer saved, loaded, training resumed -----------
@program("dcp_fsdp2", tol=0.0 if N == 2 else 1e-5)
def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def build(group, seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 6))
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(model, opt, steps, start):
        for s in range(start, start + steps):
            gen = torch.Generator().manual_seed(1000 * s + R)
            model(torch.randn(5, 12, generator=gen)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    def full(model):
        return [p.full_tensor().detach().clone() for p in model.parameters()]

    def run(group):
        path = [tempfile.mkdtemp(prefix="rc-dcp-") if R == 0 else None]
        dist.broadcast_object_list(path, src=0, group=GLOO)
        try:
            model, opt = build(group, 0)
            train(model, opt, 2, 0)
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path[0], process_group=group)
            train(model, opt, 2, 2)
            straight = full(model)
            model2, opt2 = build(group, 123)  # other initial values: the load must replace them
            train(model2, opt2, 1, 50)  # and an optimizer state to overwrite
            msd2, osd2 = get_state_dict(model2, opt2)
            state = {"model": msd2, "optim": osd2}
            dcp.load(state, checkpoint_id=path[0], process_group=group)
            set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
            train(model2, opt2, 2, 2)
            return straight, full(model2)
        finally:
            dist.barrier(group=GLOO)
            if R == 0:
                shutil.rmtree(path[0], ignore_errors=True)

    a_straight, a_resumed = on_ring(run, RING)
    b_straight, b_resumed = run(GLOO)
    resume = maxdiff(a_straight, a_resumed)  # resumed == uninterrupted: bitwise
    vs_gloo = max(maxdiff(a_straight, b_straight), maxdiff(a_resumed, b_resumed))
    if resume != 0.0:
        return float("inf"), f"resumed run differs from the uninterrupted one by {resume}"
    return vs_gloo, ("FSDP2 MLP 12-20-6 + Adam: 2 steps, dcp.save, 2 steps = fresh model + dcp.load + 2 steps "
                     f"(bitwise, diff {resume}); vs gloo {vs_gloo:.2e}")


# ---- pipeline parallelism: torch.distributed.pipelining, one stage per rank ----
@program("pipeline", tol=1e-5)
def _pipeline():
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    width, batch, micro = 10, 12, 4

    def make():
        torch.manual_seed(7)
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                                     for _ in range(N)])  # block r is stage r

    torch.manual_seed(8)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    loss_fn = torch.nn.MSELoss()
    ref = make()
    ref_out = ref(x)
    ref_loss = loss_fn(ref_out, y)
    ref_loss.backward()  # the schedule scales each microbatch's gradients by 1/micro: the same mean
    ref_grads = [p.grad.clone() for p in ref[R].parameters()]

    def run(group, schedule):
        stage_mod = make()[R]
        stage = PipelineStage(stage_mod, R, N, torch.device("cpu"), group=group)
        sched = schedule(stage, n_microbatches=micro, loss_fn=loss_fn)
        losses: list = []
        if R == 0:
            out = sched.step(x)
        elif R == N - 1:
            out = sched.step(target=y, losses=losses)
        else:
            out = sched.step()
        grads = [p.grad.clone() for p in stage_mod.parameters()]
        return out, losses, grads

    diffs, notes = [], []
    for schedule in (ScheduleGPipe, Schedule1F1B):
        out, losses, grads = on_ring(run, RING, schedule)
        d = maxdiff(grads, ref_grads)
        if R == N - 1:
            d = max(d, maxdiff(out.detach(), ref_out.detach()),
                    abs(float(torch.stack(losses).mean()) - float(ref_loss)))
        g_out, g_losses, g_grads = run(GLOO, schedule)
        d_gloo = maxdiff(grads, g_grads)
        if R == N - 1:
            d_gloo = max(d_gloo, maxdiff(out.detach(), g_out.detach()), maxdiff(torch.stack(losses),
                                                                                 torch.stack(g_losses)))
        diffs += [d, d_gloo]
        notes.append(f"{schedule.__name__}: vs 1 process {d:.2e}, vs gloo {d_gloo:.2e}")
    return max(diffs), (f"{N} stages of Linear({width},{width})+Tanh, batch {batch} in {micro} microbatches, "
                        "MSE loss; stage outputs, per-microbatch losses and this stage's gradients: "
                        + "; ".join(notes))


print("RESULT " + json.dumps({"rank": R, "n": N, "programs": results}), flush=True)
dist.destroy_process_group()
sys.exit(0)

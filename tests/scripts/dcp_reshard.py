"""torch.distributed.checkpoint across world sizes: an FSDP2 model and its
Adam state saved by one job and loaded by a job with another number of ranks
(tests/test_torch_programs.py: `ringcomm run -n 2 ... save DIR`, then
`ringcomm run -n 3 ... load DIR`). Each job runs the program twice, over the
default group ("ringcomm") and over a gloo group of the same ranks, each with
its own checkpoint folder (DIR/ringcomm, DIR/gloo).

save: seed-0 model (Linear(12, 21), ReLU, Linear(21, 5): 21 and 5 rows shard
  unevenly over 2 and 3 ranks), 2 Adam steps on rank-dependent batches,
  dcp.save; rank 0 also writes the full state dict (parameters and optimizer
  state, gathered with get_state_dict(full_state_dict=True)) to DIR/<backend>.pt.
load: a model built from another seed, one Adam step (so there is optimizer
  state to overwrite), dcp.load of the other world size's checkpoint; its full
  state must equal the saved one bitwise (every parameter, exp_avg, exp_avg_sq
  and step). Then 2 more steps on every rank, compared with one process that
  loads the saved full state and trains on the concatenation of the ranks'
  batches, and with the gloo run.

Prints one line "RESULT {json}" per rank: {"ok", "load_diff", "resume_diff",
"vs_gloo", "tol", "note", "used"}.
"""

import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

import ringcomm.torch as rt
from ringcomm import vocab

warnings.filterwarnings("ignore")
MODE, ROOT = sys.argv[1], sys.argv[2]
dist.init_process_group("ringcomm")
R, N = dist.get_rank(), dist.get_world_size()
RING = dist.group.WORLD
GLOO = dist.new_group(backend="gloo")
BATCH = 5
TOL = 1e-6  # resumed training against one process: float32 sums in another order


def build(group, seed):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 21), torch.nn.ReLU(), torch.nn.Linear(21, 5))
    if group is not None:
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(step, rank):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 12, generator=gen)


def train(model, opt, steps, start):
    for s in range(start, start + steps):
        model(batch(s, R)).pow(2).mean().backward()  # FSDP2 averages the gradients over the ranks
        opt.step()
        opt.zero_grad()


def full_state(model, opt):
    """{"model": {fqn: tensor}, "optim": {"state": {fqn: {...}}, ...}}, full tensors on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {"model": {k: v.detach().clone() for k, v in msd.items()},
            "optim": {fqn: {k: v.clone() for k, v in st.items()} for fqn, st in osd["state"].items()},
            "groups": osd["param_groups"]}


def diff(a, b, where=""):
    """(largest |a - b| over the two nested state dicts, where it is); inf on any key or shape mismatch."""
    if isinstance(a, dict):
        if sorted(a) != sorted(b):
            return float("inf"), f"{where}: keys {sorted(a)} != {sorted(b)}"
        worst = (0.0, "")
        for k in a:
            worst = max(worst, diff(a[k], b[k], f"{where}/{k}"), key=lambda t: t[0])
        return worst
    if a.shape != b.shape:
        return float("inf"), f"{where}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    d = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    return d, (where if d else "")


def run(group, name):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = os.path.join(ROOT, name)
    if MODE == "save":
        model, opt = build(group, 0)
        train(model, opt, 2, 0)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path, process_group=group)
        full = dict(full_state(model, opt), n=N)
        if R == 0:
            torch.save(full, path + ".pt")
        return {"saved_by": N}
    model, opt = build(group, 123)  # other initial values: the load must replace them
    train(model, opt, 1, 50)  # and an optimizer state to overwrite
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path, process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    saved = torch.load(path + ".pt", weights_only=True)
    loaded = full_state(model, opt)
    load_diff, load_where = diff({k: loaded[k] for k in ("model", "optim")}, {k: saved[k] for k in ("model", "optim")})
    train(model, opt, 2, 2)
    resumed = full_state(model, opt)["model"]
    # One process: the saved full state, then the same 2 steps on the N ranks' batches together
    # (mean over ranks of each rank's mean = mean over the concatenation: equal batch sizes).
    ref, ref_opt = build(None, 7)
    ref(batch(99, 0)).sum().backward()
    ref_opt.step()  # create Adam state for set_state_dict to replace
    ref_opt.zero_grad()
    set_state_dict(ref, ref_opt, model_state_dict=saved["model"],
                   optim_state_dict={"state": saved["optim"], "param_groups": saved["groups"]})
    for s in (2, 3):
        ref(torch.cat([batch(s, r) for r in range(N)])).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    resume_diff, resume_where = diff(resumed, {k: v.detach() for k, v in ref.state_dict().items()})
    return {"load_diff": load_diff, "load_where": load_where, "resume_diff": resume_diff,
            "resume_where": resume_where, "resumed": resumed, "saved": saved}


result = {"rank": R, "n": N, "mode": MODE, "tol": TOL}
try:
    comm = rt.communicator()
    before = comm.traffic()
    a = run(RING, "ringcomm")
    delta = comm.traffic() - before
    result["used"] = sorted(c for c in vocab.COLLECTIVES if delta.msgs_sent(c) or delta.msgs_received(c))
    dist.barrier(group=GLOO)
    b = run(GLOO, "gloo")
    if MODE == "save":
        result.update(ok=True, note=f"saved at n={N}")
    else:
        # The two backends' saved states (n=2 training) and resumed runs must agree too.
        saved_vs = diff({k: a["saved"][k] for k in ("model", "optim")}, {k: b["saved"][k] for k in ("model", "optim")})
        vs_gloo = max(diff(a["resumed"], b["resumed"]), saved_vs, key=lambda t: t[0])
        result.update(load_diff=max(a["load_diff"], b["load_diff"]), resume_diff=max(a["resume_diff"], b["resume_diff"]),
                      vs_gloo=vs_gloo[0])
        result["ok"] = (result["load_diff"] == 0.0 and result["resume_diff"] <= TOL and vs_gloo[0] <= TOL)
        result["note"] = (f"loaded at n={N} from n={a['saved']['n']}: full state vs the saved one (parameters, "
                          f"exp_avg, exp_avg_sq, step) ringcomm {a['load_diff']} {a['load_where']}, gloo "
                          f"{b['load_diff']} {b['load_where']}; resumed 2 steps vs 1 process ringcomm "
                          f"{a['resume_diff']:.2e} {a['resume_where']}, gloo {b['resume_diff']:.2e}; ringcomm vs gloo "
                          f"(saved states, resumed parameters) {vs_gloo[0]:.2e} {vs_gloo[1]}")
except Exception as exc:  # noqa: BLE001 - reported in the RESULT line
    result.update(ok=False, note=f"{type(exc).__name__}: {exc}"[:600] + " | " + " / ".join(
        traceback.format_exc().splitlines()[-4:])[:600])
print("RESULT " + json.dumps(result), flush=True)
dist.barrier(group=GLOO)
dist.destroy_process_group()
sys.exit(0)

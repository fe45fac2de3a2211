"""DDP benchmark: ringcomm.torch.DistributedDataParallel on a model with many parameter tensors.

    ringcomm run -n 2 python bench/ddp.py                   # all three parts, PNG + JSON + traces in bench/out/
    ringcomm run -n 4 python bench/ddp.py --parts sweep --caps 0,0.1,1,25

Parts (rank 0 prints; every time is the maximum over ranks):
  sweep    step time (forward + backward + SGD step) vs bucket_cap_mb over a wide
           range; a PNG plot when matplotlib is installed.
  overlap  at one cap: backward alone (no_sync: hooks run, nothing is sent),
           communication alone (all buckets reduced back to back after backward),
           and the overlapped step (backward with bucket all_reduces in flight,
           until finalize returns); fraction of the communication hidden =
           (T_backward + T_comm - T_overlapped) / T_comm.
  torch    against torch.nn.parallel.DistributedDataParallel + gloo: same model,
           data, seeds and N, 50 SGD steps each; max |parameter difference| and
           the step-time ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ringcomm  # noqa: E402
import ringcomm.torch as rtorch  # noqa: E402

WORLD = MPI.COMM_WORLD


def make_model(layers: int, width: int, seed: int = 0) -> torch.nn.Module:
    """`layers` blocks of Linear + LayerNorm + GELU: 4 parameter tensors per block."""
    torch.manual_seed(seed)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))


def batch(step: int, rank: int, args):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(args.batch, args.width, generator=g), torch.randint(0, 10, (args.batch,), generator=g)


def tmax(t: float) -> float:
    return WORLD.allreduce(t, op=MPI.MAX)


def say(*a):
    if WORLD.rank == 0:
        print(*a, flush=True)


def timed_steps(model, opt, args, steps: int, warmup: int = 2) -> float:
    """Mean step time (max over ranks) of `steps` full training steps after `warmup`."""
    rank = WORLD.rank
    for s in range(warmup + steps):
        if s == warmup:
            WORLD.Barrier()
            t0 = time.perf_counter()
        x, y = batch(s, rank, args)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return tmax((time.perf_counter() - t0) / steps)


def part_sweep(comm, args, results):
    say(f"\n## step time vs bucket_cap_mb (N={comm.size}, {args.layers * 4 + 2} parameter tensors, "
        f"{args.nparams / 1e6:.2f} M float32 = {args.nparams * 4 / 2**20:.1f} MiB, batch {args.batch}/rank)")
    say(f"{'cap MiB':>9} {'buckets':>8} {'step ms':>9} {'min ms':>9}")
    rows = []
    for cap in args.caps:
        model = make_model(args.layers, args.width)
        ddp = rtorch.DistributedDataParallel(model, comm, bucket_cap_mb=cap, first_bucket_mb=min(cap, 1.0))
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        times = [timed_steps(ddp, opt, args, args.steps, warmup=2 if r == 0 else 0) for r in range(args.repeats)]
        row = {"cap_mb": cap, "buckets": len(ddp.bucketer.buckets), "step_ms": 1e3 * statistics.median(times),
               "min_ms": 1e3 * min(times)}
        rows.append(row)
        say(f"{cap:>9g} {row['buckets']:>8} {row['step_ms']:>9.2f} {row['min_ms']:>9.2f}")
    best = min(rows, key=lambda r: r["step_ms"])
    say(f"optimum: bucket_cap_mb={best['cap_mb']:g} ({best['buckets']} buckets, {best['step_ms']:.2f} ms/step)")
    results["sweep"] = rows
    if WORLD.rank == 0 and args.out:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            say("(matplotlib not installed: no plot)")
            return best
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [max(r["cap_mb"], 1e-4) for r in rows]
        ax.plot(xs, [r["step_ms"] for r in rows], "o-")
        for x, r in zip(xs, rows):
            ax.annotate(str(r["buckets"]), (x, r["step_ms"]), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("bucket_cap_mb (0 plotted at 1e-4; labels: number of buckets)")
        ax.set_ylabel("step time, ms (median over repeats)")
        ax.set_title(f"ringcomm DDP, N={comm.size}, {args.layers * 4 + 2} tensors, "
                     f"{args.nparams * 4 / 2**20:.1f} MiB grads")
        ax.grid(True, which="both", alpha=0.3)
        path = os.path.join(args.out, f"ddp_sweep_n{comm.size}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        say(f"plot: {path}")
    return best


def part_overlap(comm, args, cap, results):
    rank = WORLD.rank
    model = make_model(args.layers, args.width)
    ddp = rtorch.DistributedDataParallel(model, comm, bucket_cap_mb=cap, first_bucket_mb=min(cap, 1.0))
    loss_fn = torch.nn.functional.cross_entropy
    bwd, comm_t, ovl = [], [], []
    for s in range(2 + args.steps):
        x, y = batch(s, rank, args)
        # backward alone (hooks and bookkeeping, nothing sent)
        ddp.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(x), y)
        WORLD.Barrier()
        t0 = time.perf_counter()
        with ddp.no_sync():
            loss.backward()
        t_b = tmax(time.perf_counter() - t0)
        # communication alone: reduce every bucket back to back
        WORLD.Barrier()
        t0 = time.perf_counter()
        ddp.bucketer.sync()
        t_c = tmax(time.perf_counter() - t0)
        # overlapped: backward with buckets launched as they fill, until finalize returns
        ddp.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(x), y)
        WORLD.Barrier()
        t0 = time.perf_counter()
        loss.backward()
        t_o = tmax(time.perf_counter() - t0)
        if s >= 2:
            bwd.append(t_b), comm_t.append(t_c), ovl.append(t_o)
    b, c, o = (1e3 * statistics.median(v) for v in (bwd, comm_t, ovl))
    hidden = (b + c - o) / c if c > 0 else 0.0
    say(f"\n## overlap at bucket_cap_mb={cap:g} ({len(ddp.bucketer.buckets)} buckets), medians of {args.steps} steps")
    say(f"backward alone      {b:8.2f} ms")
    say(f"communication alone {c:8.2f} ms")
    say(f"overlapped backward {o:8.2f} ms   (serial would be {b + c:.2f} ms)")
    say(f"communication hidden: {100 * hidden:.0f}%")
    results["overlap"] = {"cap_mb": cap, "buckets": len(ddp.bucketer.buckets), "backward_ms": b,
                          "comm_ms": c, "overlapped_ms": o, "hidden_fraction": hidden}
    if args.out:
        path = os.path.join(args.out, f"ddp_trace_rank{rank}.json")
        ddp.bucketer.export_chrome_trace(path)
        say(f"Chrome trace of the bucket all_reduces: {args.out}/ddp_trace_rank<r>.json (open in Perfetto)")


def init_gloo():
    import torch.distributed as dist
    port = None
    if WORLD.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = WORLD.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=WORLD.rank,
                            world_size=WORLD.size)
    return dist


def train_50(model, args, steps):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    rank = WORLD.rank
    times = []
    for s in range(steps):
        x, y = batch(s, rank, args)
        WORLD.Barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(tmax(time.perf_counter() - t0))
    return times


def part_torch(comm, args, results):
    dist = init_gloo()
    cap = args.torch_cap
    steps = args.parity_steps
    ours = rtorch.DistributedDataParallel(make_model(args.layers, args.width), comm, bucket_cap_mb=cap)
    t_ours = train_50(ours, args, steps)
    theirs = torch.nn.parallel.DistributedDataParallel(make_model(args.layers, args.width), bucket_cap_mb=cap)
    t_theirs = train_50(theirs, args, steps)
    diff = max((a - b).abs().max().item() for a, b in zip(ours.module.parameters(), theirs.module.parameters()))
    scale = max(a.abs().max().item() for a in theirs.module.parameters())
    diff = WORLD.allreduce(diff, op=MPI.MAX)
    # the first 5 steps are warm-up (allocation, bucket rebuild)
    mo, mt = statistics.median(t_ours[5:]), statistics.median(t_theirs[5:])
    say(f"\n## vs torch.nn.parallel.DistributedDataParallel + gloo (N={comm.size}, bucket_cap_mb={cap:g}, "
        f"{steps} SGD+momentum steps, same model/data/seeds)")
    say(f"max |parameter difference| after {steps} steps: {diff:.3e} (largest |parameter| {scale:.3f})")
    say(f"median step time: ringcomm {1e3 * mo:.2f} ms, torch DDP+gloo {1e3 * mt:.2f} ms, "
        f"ratio ringcomm/gloo = {mo / mt:.2f}")
    results["torch"] = {"cap_mb": cap, "steps": steps, "max_abs_diff": diff, "ringcomm_ms": 1e3 * mo,
                        "gloo_ms": 1e3 * mt, "ratio": mo / mt}
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=40, help="blocks of Linear+LayerNorm (4 tensors each)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--caps", default="0,0.01,0.05,0.25,1,2,4,8,25,100",
                    type=lambda s: [float(x) for x in s.split(",")])
    ap.add_argument("--overlap-cap", type=float, default=None, help="default: the sweep's optimum (else 4)")
    ap.add_argument("--torch-cap", type=float, default=25.0)
    ap.add_argument("--parity-steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--parts", default="sweep,overlap,torch")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                    help="directory for the PNG, Chrome traces and JSON ('' for none)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.nparams = sum(p.numel() for p in make_model(args.layers, args.width).parameters())
    if args.out and WORLD.rank == 0:
        os.makedirs(args.out, exist_ok=True)
    WORLD.Barrier()
    comm = ringcomm.init()
    parts = args.parts.split(",")
    say(f"# bench/ddp.py: N={comm.size}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"torch threads/rank 1")
    results = {"n": comm.size, "args": {k: v for k, v in vars(args).items()}}
    best = None
    if "sweep" in parts:
        best = part_sweep(comm, args, results)
    if "overlap" in parts:
        cap = args.overlap_cap if args.overlap_cap is not None else (best["cap_mb"] if best else 4.0)
        part_overlap(comm, args, cap, results)
    if "torch" in parts:
        part_torch(comm, args, results)
    if args.out and WORLD.rank == 0:
        path = os.path.join(args.out, f"ddp_n{comm.size}.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        say(f"\nresults: {path}")
    comm.close()


if __name__ == "__main__":
    main()

"""torch.distributed over "ringcomm" vs over gloo, side by side in one job.

    ringcomm run -n 2 python bench/torch_backend.py [--reps 7] [--json out.json]
    torchrun --standalone --nproc-per-node 2 bench/torch_backend.py   (store bootstrap, UCX + shared memory)

(bench/launchers.py runs it under both launchers, alternating, and compares.)

Measures, with the implementations interleaved in every repetition (this
machine is shared and noisy; medians and [p10, p90] over repetitions, the
time of a repetition being the slowest rank's):

* dist.all_reduce of float32 buffers (8 B, 4 MiB, 64 MiB) through the
  "ringcomm" group, through a gloo group over the same ranks, and, for the
  per-call overhead, ringcomm called directly with a numpy array;
* dist.reduce, dist.gather (into a list of tensors), dist.scatter (root 0),
  dist.all_to_all_single and dist.all_to_all (the list form) of float32
  buffers (``--rooted-sizes``, default 4 MiB: the full buffer, i.e.
  the reduced tensor, the root's gathered / scattered total, each rank's
  all_to_all input) over "ringcomm" and over gloo, and the ring shift of
  pipeline parallelism (dist.batch_isend_irecv: isend to rank+1, irecv
  from rank-1, both waited);
* torch DDP training steps (forward, backward, SGD step) of an 8-layer MLP
  (about 2.1 M parameters) over each backend.

Goals (issue 14): all_reduce >= 2x gloo at 4 MiB and 64 MiB; DDP step over
ringcomm no slower than over gloo; 8-byte call through the backend within 2x
of ringcomm with numpy. Issue 23: reduce, gather, scatter, all_to_all, sendrecv >= 2x
gloo at 4 MiB.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

import ringcomm.torch as rt

warnings.filterwarnings("ignore")


def slowest(seconds: float, group) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def timed(fn, iters: int, group, align) -> float:
    """Seconds per call of `fn`, the slowest rank's (reduced over `group`).
    The ranks start together out of `align`'s barrier: ringcomm's, whose
    ranks leave it within microseconds (gloo's let them go up to about 100 us
    apart, which the first timed call absorbed: it inflated the faster
    backend's time most)."""
    dist.barrier(group=align)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return slowest((time.perf_counter() - t0) / iters, group)


def stats(xs):
    a = np.array(xs)
    return float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sizes", default="8,4M,64M", help="all_reduce sizes in bytes (K/M suffixes)")
    ap.add_argument("--rooted-sizes", default="4M",
                    help="reduce/gather/scatter/all_to_all sizes in bytes (the full buffer; empty: skip)")
    ap.add_argument("--ddp-steps", type=int, default=5, help="DDP steps per repetition")
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    dist.init_process_group("ringcomm")
    init_s = time.perf_counter() - t0
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    init_s = slowest(init_s, gloo)
    ring = dist.group.WORLD
    comm = rt.communicator()
    from ringcomm.config import parse_size
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results: dict = {"n": n, "reps": args.reps, "all_reduce": {}, "new_ops": {}, "ddp": {}, "init_s": init_s,
                     "transport": comm.transport, "shared_memory": comm.shared_memory}

    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = torch.ones(count)
        xn = np.ones(count, dtype=np.float32)
        iters = 2000 if nbytes <= 1024 else max(2, int(2e8 // max(nbytes, 1) // 8))
        impls = {
            "ringcomm": lambda: dist.all_reduce(x, group=ring),
            "gloo": lambda: dist.all_reduce(x, group=gloo),
            "ringcomm-numpy": lambda: comm.all_reduce(xn),
        }
        for f in impls.values():  # warm up
            f()
        times: dict = {k: [] for k in impls}
        for rep in range(args.reps):
            order = list(impls) if rep % 2 == 0 else list(reversed(impls))
            for k in order:
                times[k].append(timed(impls[k], iters, gloo, ring))
        results["all_reduce"][nbytes] = {k: stats(v) for k, v in times.items()}

    # reduce, gather, scatter, all_to_all_single (issue 23): each over both
    # groups, interleaved per repetition like all_reduce above.
    def new_ops(nbytes, group):
        count = max(n, nbytes // 4 // n * n)  # divisible by n: equal blocks
        full, block = torch.ones(count), torch.ones(count // n)
        gl = [torch.empty(count // n) for _ in range(n)] if rank == 0 else None
        sl = list(torch.ones(count).chunk(n)) if rank == 0 else None
        a2a_out = torch.empty(count)
        a2a_ins, a2a_outs = [torch.ones(count // n) for _ in range(n)], [torch.empty(count // n) for _ in range(n)]
        shifted = torch.empty(count)

        def sendrecv():  # the ring shift, as pipeline parallelism moves activations
            ops = [dist.P2POp(dist.isend, full, (rank + 1) % n, group=group),
                   dist.P2POp(dist.irecv, shifted, (rank - 1) % n, group=group)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        ops = {
            "reduce": lambda: dist.reduce(full, dst=0, group=group),
            "gather": lambda: dist.gather(block, gl, dst=0, group=group),
            "scatter": lambda: dist.scatter(block, sl, src=0, group=group),
            "all_to_all": lambda: dist.all_to_all_single(a2a_out, full, group=group),
            "all_to_all_list": lambda: dist.all_to_all(a2a_outs, a2a_ins, group=group),
        }
        if n > 1:  # (no peer to shift to on one rank)
            ops["sendrecv"] = sendrecv
        return ops

    rooted = [parse_size(s) for s in args.rooted_sizes.split(",") if s]
    for nbytes in rooted:
        impls = {"ringcomm": new_ops(nbytes, ring), "gloo": new_ops(nbytes, gloo)}
        # (small: the per-call cost; large: about 23 calls of 4 MiB per repetition, as with 5 the first
        # calls' page faults and the start skew made scatter's p10-p90 at N = 2 267-409 us, with 23 230-274)
        iters = 500 if nbytes <= 1024 else max(2, int(8e8 // max(nbytes, 1) // 8))
        for op in impls["ringcomm"]:
            for k in impls:
                impls[k][op]()  # warm up
            times = {k: [] for k in impls}
            for rep in range(args.reps):
                for k in (list(impls) if rep % 2 == 0 else list(reversed(impls))):
                    times[k].append(timed(impls[k][op], iters, gloo, ring))
            results["new_ops"].setdefault(op, {})[nbytes] = {k: stats(v) for k, v in times.items()}

    # DDP over each backend: the same model and data (--ddp-steps 0: skipped).
    if args.ddp_steps > 0:
        ddp_step_times(args, results, ring, gloo)
    if rank == 0:
        report(args, results, n, comm, init_s)
    dist.destroy_process_group()


def ddp_step_times(args, results, ring, gloo) -> None:
    """torch DDP training steps over each group, interleaved: results['ddp']."""
    def make(group):
        torch.manual_seed(0)
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers)
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)

    models = {"ringcomm": make(ring), "gloo": make(gloo)}
    batch = torch.randn(64, 512)

    def step(k):
        ddp, opt = models[k]
        ddp(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    for k in models:
        step(k)
    ddp_times: dict = {k: [] for k in models}
    for rep in range(args.reps):
        for k in (list(models) if rep % 2 == 0 else list(reversed(models))):
            ddp_times[k].append(timed(lambda: step(k), args.ddp_steps, gloo, ring))
    results["ddp"] = {k: stats(v) for k, v in ddp_times.items()}
    results["ddp_params"] = sum(p.numel() for p in models["ringcomm"][0].parameters())


def report(args, results, n, comm, init_s) -> None:
    """The table, on rank 0 (and the JSON file when asked)."""
    print(f"# torch.distributed over ringcomm ({comm.transport}) vs gloo: n={n}, {args.reps} interleaved reps, "
          f"time = slowest rank, median [p10 p90]; init_process_group {init_s:.2f} s")
    print(f"{'bytes':>10} {'impl':>15} {'time_us':>10} {'p10':>9} {'p90':>9} {'busbw GB/s':>11}")
    for nbytes, d in results["all_reduce"].items():
        for k, (med, lo, hi) in d.items():
            bw = nbytes / med * 2 * (n - 1) / n / 1e9
            print(f"{nbytes:>10} {k:>15} {med * 1e6:>10.1f} {lo * 1e6:>9.1f} {hi * 1e6:>9.1f} {bw:>11.2f}")
        r_g = d["gloo"][0] / d["ringcomm"][0]
        r_n = d["ringcomm"][0] / d["ringcomm-numpy"][0]
        print(f"{'':>10} {'':>15} ringcomm is {r_g:.2f}x gloo's speed; backend call costs {r_n:.2f}x "
              "ringcomm with numpy")
    if results["new_ops"]:
        print("# reduce / gather / scatter (root 0) / all_to_all_single / sendrecv (batch_isend_irecv: isend to "
              "rank+1, irecv from rank-1): bytes = the full buffer; busbw factor 1 for reduce and sendrecv, "
              "(n-1)/n for the others (nccl-tests)")
    for op, per_size in results["new_ops"].items():
        for nbytes, d in per_size.items():
            f = 1.0 if op in ("reduce", "sendrecv") else (n - 1) / n
            for k, (med, lo, hi) in d.items():
                print(f"{nbytes:>10} {op + ' ' + k:>20} {med * 1e6:>10.1f} {lo * 1e6:>9.1f} {hi * 1e6:>9.1f} "
                      f"{nbytes / med * f / 1e9:>11.2f}")
            print(f"{'':>10} {op:>20} ringcomm is {d['gloo'][0] / d['ringcomm'][0]:.2f}x gloo's speed")
    if results["ddp"]:
        print(f"# DDP step ({results['ddp_params']} parameters, batch 64, {args.ddp_steps} steps per rep)")
        for k, (med, lo, hi) in results["ddp"].items():
            print(f"{'ddp':>10} {k:>15} {med * 1e3:>9.2f} ms [{lo * 1e3:.2f} {hi * 1e3:.2f}]")
        print(f"# DDP: gloo / ringcomm step time = {results['ddp']['gloo'][0] / results['ddp']['ringcomm'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)

if __name__ == "__main__":
    main()

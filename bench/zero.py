"""Step time of DDP vs ZeRO-1/2/3 (ringcomm.zero), with and without stage-3
prefetch, and PyTorch's FSDP2 (fully_shard over gloo) on the same model, in
one job, interleaved.

    ringcomm run -n 2 python bench/zero.py [--layers 16] [--width 512] [--reps 7]

The model: an MLP of --layers square layers (tanh), float32 parameters and
gradients, Adam; one unit per layer; batch 32. ringcomm.zero runs the model
in numpy (its own forward/backward), FSDP2 runs the same shapes in torch, so
the compute differs too: the compute-only step (no communication, one rank's
work) of each framework is reported beside them for that reason.
Time of a repetition = the slowest rank's; median [p10 p90] over repetitions.
Goals (issue 13): ZeRO-3 with prefetch within 1.3x of DDP's step time here,
and faster than FSDP2 over gloo.
"""

from __future__ import annotations

import os

# One BLAS thread per rank, for numpy as for torch (set_num_threads(1) below):
# ranks share the cores, and multi-threaded BLAS in every rank thrashes them.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import ringcomm
from ringcomm.teach.zero_demo import mlp_units, train_step
from ringcomm.zero import ZeroOptimizer

warnings.filterwarnings("ignore")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3, help="steps per repetition")
    ap.add_argument("--no-fsdp", action="store_true", help="skip the torch FSDP2 baseline")
    args = ap.parse_args()
    comm = ringcomm.init(timeout=300)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    widths = [args.width] * (args.layers + 1)
    psi = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    dtype = np.float32

    def slowest(t):
        return world.allreduce(t, op=MPI.MAX)

    impls = {}
    for stage, prefetch, name in ((0, False, "ddp"), (1, False, "zero1"), (2, False, "zero2"),
                                  (3, False, "zero3"), (3, True, "zero3+prefetch")):
        zero = ZeroOptimizer(mlp_units(widths, dtype), comm, stage=stage, lr=1e-4)

        def run(zero=zero, prefetch=prefetch):
            for s in range(args.steps):
                train_step(zero, widths, comm.rank, s, dtype, prefetch=prefetch)
        impls[name] = run

    if not args.no_fsdp:
        import torch
        import torch.distributed as dist
        from ringcomm import torch as _rt  # noqa: F401 - sets the launcher variables from MPI
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        torch.manual_seed(0)
        layers = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
        model = torch.nn.Sequential(*layers[:-1])
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(comm.rank)

        def fsdp():
            for _ in range(args.steps):
                x = torch.randn(32, widths[0], generator=gen)
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        impls["fsdp2-gloo"] = fsdp

    # Compute-only reference (one rank's work, no communication).
    def numpy_compute():
        def body(c):
            z = ZeroOptimizer(mlp_units(widths, dtype), c, stage=0, lr=1e-4)
            t0 = time.perf_counter()
            for s in range(args.steps):
                train_step(z, widths, 0, s, dtype)
            return time.perf_counter() - t0
        return ringcomm.run_local(1, body)[0]

    for f in impls.values():  # warm up
        f()
    times = {k: [] for k in impls}
    for rep in range(args.reps):
        order = list(impls) if rep % 2 == 0 else list(reversed(impls))
        for k in order:
            world.Barrier()
            t0 = time.perf_counter()
            impls[k]()
            times[k].append(slowest((time.perf_counter() - t0) / args.steps))
    compute_np = float(np.median([numpy_compute() / args.steps for _ in range(3)]))
    if comm.rank == 0:
        print(f"# step time, N = {comm.size}: MLP {args.layers} x {args.width} (Psi = {psi:,}, float32, Adam), "
              f"batch 32, {args.reps} interleaved reps x {args.steps} steps; median [p10 p90] ms")
        for k, v in times.items():
            a = np.array(v) * 1e3
            print(f"{k:>15} {np.median(a):9.2f} [{np.percentile(a, 10):8.2f} {np.percentile(a, 90):8.2f}]")
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(f"# zero3+prefetch / ddp = {med['zero3+prefetch'] / med['ddp']:.2f} (goal <= 1.3); "
              f"zero3 / zero3+prefetch = {med['zero3'] / med['zero3+prefetch']:.2f}")
        if "fsdp2-gloo" in med:
            print(f"# fsdp2-gloo / zero3+prefetch = {med['fsdp2-gloo'] / med['zero3+prefetch']:.2f} (goal > 1)")
        print(f"# one rank's compute alone (numpy, no communication): {compute_np * 1e3:.2f} ms per step")
    comm.close()


if __name__ == "__main__":
    main()

"""torchrun (store bootstrap: UCX + shared memory) against mpirun (MPI
bootstrap: MPI point-to-point + shared memory) for the same torch program,
and both against gloo.

    python bench/launchers.py [-n 2] [--rounds 3] [--sizes 4M,64M]

Runs bench/torch_backend.py (all_reduce only) under ``torchrun --standalone``
and under ``ringcomm run`` (mpirun), alternating the launchers round by round
(this machine is shared and noisy), and prints per size the median over
rounds of each job's median time, the ratio torchrun / mpirun, and ringcomm's
speed over gloo's in each; also how long ``init_process_group`` took (the
slowest rank). Goals (issue 25): torchrun within 10% of mpirun and at least
2x gloo at 4 and 64 MiB (N = 2, 4); init_process_group at N = 4 under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "torch_backend.py")


def launch(kind: str, n: int, sizes: str, reps: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        args = [JOB, "--sizes", sizes, "--rooted-sizes", "", "--ddp-steps", "0", "--reps", str(reps),
                "--json", f.name]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        env.setdefault("OMP_NUM_THREADS", "1")
        if kind == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *args]
        else:
            cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, *args]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if res.returncode != 0:
            raise SystemExit(f"{kind} job failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        with open(f.name) as g:
            return json.load(g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="repetitions inside each job")
    ap.add_argument("--sizes", default="4M,64M")
    args = ap.parse_args()
    runs: dict = {"torchrun": [], "mpirun": []}
    for r in range(args.rounds):
        for kind in (("torchrun", "mpirun") if r % 2 == 0 else ("mpirun", "torchrun")):
            runs[kind].append(launch(kind, args.n, args.sizes, args.reps))
    t0, m0 = runs["torchrun"][0], runs["mpirun"][0]
    print(f"# n={args.n}, {args.rounds} rounds (launchers alternating), median over rounds of each job's median; "
          f"torchrun: {t0['transport']}, shared memory {t0['shared_memory']}; mpirun: {m0['transport']}, "
          f"shared memory {m0['shared_memory']}")
    # torchrun gives every worker a session (hence, with autogroup, a kernel
    # scheduling group) of its own, mpirun keeps its ranks in one: with more
    # ranks than cores that alone moves the ratio (ringcomm/shm/,
    # split_scheduling; bench/README.md).
    from ringcomm import shm
    print(f"# {args.n} ranks on {os.cpu_count()} cores; torchrun's workers "
          + ("each in a scheduling group of their own (autogroup)" if shm.sched_group() else
             "not grouped by session (autogroup off or a cpu cgroup)"))
    print(f"{'bytes':>10} {'torchrun us':>12} {'mpirun us':>10} {'torchrun/mpirun':>16} {'x gloo (torchrun)':>18} "
          f"{'x gloo (mpirun)':>16}")
    for size in t0["all_reduce"]:
        def med(kind, impl):
            return float(np.median([j["all_reduce"][size][impl][0] for j in runs[kind]]))
        tr, mp = med("torchrun", "ringcomm"), med("mpirun", "ringcomm")
        print(f"{size:>10} {tr * 1e6:>12.0f} {mp * 1e6:>10.0f} {tr / mp:>16.2f} "
              f"{med('torchrun', 'gloo') / tr:>18.2f} {med('mpirun', 'gloo') / mp:>16.2f}")
    for kind in runs:
        inits = [j["init_s"] for j in runs[kind]]
        print(f"init_process_group under {kind}: median {np.median(inits):.2f} s (slowest rank; "
              f"min {min(inits):.2f}, max {max(inits):.2f})")


if __name__ == "__main__":
    main()

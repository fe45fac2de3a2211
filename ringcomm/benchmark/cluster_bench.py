"""``ringcomm bench --hosts H -n N --link SPEC``: all_reduce across the hosts
of an emulated cluster (ringcomm/cluster/), ringcomm beside gloo, against
what the links allow.

Each rank runs this module (launched by ``ringcomm.cluster.run``: torchrun's
variables, a store on host 0). Per size, ``--reps`` interleaved repetitions
of ringcomm then gloo, the same gloo barrier before every timed call; a
call's time is the slowest rank's; printed: median [p10 p90]. Per host, the
kernel's counters of its link (read in the host's namespace by its local
rank 0) give the bytes each call put on it.

The bound: an all_reduce across H hosts must carry 2(H-1)/H of the buffer
over each host's link each way, whatever the ranks per host (each host's
sum must leave it, everyone else's must reach it): t_link = 2(H-1)/H x B /
rate. "of link" is t_link / time: 1.0 is the link's full rate.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import numpy as np

from ..config import parse_size
from .checks import size_list
from .report import fmt_size

IMPLS = ("ringcomm", "gloo")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringcomm bench --hosts H", description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", default="1M", help="smallest buffer (default 1M)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest buffer (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier (default 4)")
    p.add_argument("-r", "--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("-w", "--warmup", type=int, default=1, help="warm-up calls per size and impl (default 1)")
    p.add_argument("--impl", default="ringcomm,gloo", help="ringcomm, gloo or both (default both)")
    p.add_argument("--link-bits", type=int, required=True, help=argparse.SUPPRESS)  # from the launcher
    return p


def _link_bytes() -> int:
    """What this host's eth0 has sent so far (the kernel's counter, in this host's namespace)."""
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


class _Gloo:
    def __init__(self, rank: int, size: int):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        port = int(os.environ["MASTER_PORT"]) + 1  # (ringcomm's store listens on MASTER_PORT)
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}", rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=300))

    def barrier(self) -> None:
        self.dist.barrier()

    def all_reduce(self, x: np.ndarray) -> None:
        self.dist.all_reduce(self.torch.from_numpy(x))

    def max(self, values: list[float]) -> list[float]:
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def sum(self, values: list[int]) -> list[int]:
        t = self.torch.tensor(values, dtype=self.torch.int64)
        self.dist.all_reduce(t)
        return [int(v) for v in t.tolist()]


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import ringcomm
    comm = ringcomm.init(timeout=600)
    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    job = _Job(comm, _Gloo(comm.rank, comm.size), per_host, int(os.environ["LOCAL_RANK"]), args)
    if comm.rank == 0:
        job.header()
    wrong = 0
    for nbytes in size_list(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor):
        times, per_call, bad = job.measure(nbytes)
        wrong += bad
        if comm.rank == 0:
            job.row(nbytes, times, per_call)
    wrong = job.gloo.sum([wrong])[0]
    if comm.rank == 0:
        print(f"# results checked against numpy every call: {'all exact' if not wrong else f'{wrong} WRONG'}")
    job.gloo.dist.destroy_process_group()
    comm.close()
    return 1 if wrong else 0


class _Job:
    """One rank's side of the benchmark: the impls, and what rank 0 prints."""

    def __init__(self, comm, gloo: _Gloo, per_host: int, local: int, args):
        self.comm, self.gloo, self.args, self.local = comm, gloo, args, local
        self.n, self.per_host, self.hosts = comm.size, per_host, comm.size // per_host
        self.impls = [i for i in args.impl.split(",") if i]
        bad = [i for i in self.impls if i not in IMPLS]
        if bad:
            raise SystemExit(f"ringcomm bench --hosts: unknown impl {bad}; expected {', '.join(IMPLS)}")
        self.rate = args.link_bits / 8
        self.run = {"ringcomm": comm.all_reduce, "gloo": gloo.all_reduce}

    def header(self) -> None:
        print(f"# ringcomm bench --hosts: all_reduce float32 sum, {self.hosts} hosts x {self.per_host} ranks, link "
              f"{self.args.link_bits / 1e9:g} Gbit/s ({self.rate / 1e6:.0f} MB/s each way); {self.args.reps} "
              "interleaved reps, a gloo barrier before every call, time = slowest rank, median [p10 p90]")
        print("# of link = t_link / time, t_link = 2(H-1)/H x bytes / rate (what every host's link must carry "
              "each way); link/B = bytes on a host's link per call (kernel counters) / buffer bytes")
        cols = "".join(f"{i + ' time':>26}{'of link':>9}{'link/B':>8}" for i in self.impls)
        print(f"{'bytes':>10}{cols}" + ("  gloo/ringcomm" if len(self.impls) == 2 else ""), flush=True)

    def measure(self, nbytes: int) -> tuple[dict, dict, int]:
        """Per impl: the slowest rank's time of each rep, the bytes per call on a host's link; and wrong results."""
        rank, n = self.comm.rank, self.n
        base = (np.arange(nbytes // 4) % 1013).astype(np.float32)
        want = base * n + 7 * n * (n - 1) // 2
        times = {i: [] for i in self.impls}
        link = {i: 0 for i in self.impls}
        wrong = 0
        for i in self.impls:
            for _ in range(self.args.warmup):
                self.run[i](base + 7 * rank)
        for _ in range(self.args.reps):
            for i in self.impls:
                x = base + 7 * rank
                self.gloo.barrier()
                before = _link_bytes() if self.local == 0 else 0
                t0 = time.perf_counter()
                self.run[i](x)
                dt = time.perf_counter() - t0
                link[i] += (_link_bytes() - before) if self.local == 0 else 0
                times[i].append(self.gloo.max([dt])[0])
                wrong += int(not np.array_equal(x, want))
        totals = self.gloo.sum([link[i] for i in self.impls])
        return times, {i: v / self.args.reps / self.hosts for i, v in zip(self.impls, totals)}, wrong

    def row(self, nbytes: int, times: dict, per_call: dict) -> None:
        t_link = 2 * (self.hosts - 1) / self.hosts * nbytes / self.rate
        row, med = f"{fmt_size(nbytes):>10}", {}
        for i in self.impls:
            t = np.array(times[i])
            med[i] = float(np.median(t))
            row += (f"{med[i]:>10.4f} s [{np.percentile(t, 10):.4f} {np.percentile(t, 90):.4f}]"
                    f"{t_link / med[i]:>9.2f}{per_call[i] / nbytes:>8.2f}")
        if len(self.impls) == 2:
            row += f"{med['gloo'] / med['ringcomm']:>15.2f}x"
        print(row, flush=True)


def cli_main(argv: list[str]) -> int:
    """`ringcomm bench --hosts H -n N [--link SPEC] [-b -e -f -r --impl]`: make the cluster, run the ranks."""
    from .. import cluster
    p = argparse.ArgumentParser(prog="ringcomm bench", add_help=False)
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("-n", "--np", type=int, default=None)
    p.add_argument("--link", default="1gbit")
    known, rest = p.parse_known_args(argv)
    n = known.np or known.hosts
    try:
        link = cluster.LinkSpec.parse(known.link)
    except ValueError as e:
        raise SystemExit(f"ringcomm bench: {e}") from None
    rest += ["--link-bits", str(link.rate_bit)]
    parser().parse_args(rest)  # said before any cluster is made
    why = cluster.why_not()
    if why:
        raise SystemExit(f"ringcomm bench --hosts: no emulated cluster here: {why}")
    try:
        # (quiet: the table says what each impl put on the links; the launcher's total would mix them)
        return cluster.run(known.hosts, n, link, [sys.executable, "-m", "ringcomm.benchmark.cluster_bench", *rest],
                           quiet=True)
    except cluster.ClusterError as e:
        raise SystemExit(f"ringcomm bench --hosts: {e}") from None


if __name__ == "__main__":
    sys.exit(main())

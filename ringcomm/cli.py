"""The ``ringcomm`` command: info, run (mpirun with sane defaults), bench, demo, tune, analyze."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .launch import mpirun_command
from .sysinfo import info

__all__ = ["main", "mpirun_command", "info"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringcomm", description="ring collectives over MPI and threads")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_info = sub.add_parser("info", help="versions and what was built")
    p_info.add_argument("--json", action="store_true", help="print as JSON")
    p_info.add_argument("--transport", default="mpi", choices=["mpi", "inproc"],
                        help="whose cost model the crossover table shows (default: mpi)")
    p_run = sub.add_parser("run", help="start a program on N MPI ranks (mpirun with sane defaults)")
    p_run.add_argument("-n", "--np", type=int, required=True, help="number of ranks")
    p_run.add_argument("--mca", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                       help="pass an MCA parameter to Open MPI (repeatable)")
    p_run.add_argument("--dry-run", action="store_true", help="print the mpirun command, do not run it")
    p_run.add_argument("--hosts", type=int, default=None, metavar="H",
                       help="run on an emulated cluster of H hosts on this machine (network namespaces on one "
                            "switch; needs root): N/H ranks per host, launched as torchrun does")
    p_run.add_argument("--link", default="1gbit", metavar="SPEC",
                       help="each host's link with --hosts: rate[,delay=MS][,loss=PCT%%][,mtu=BYTES] "
                            "(default 1gbit; e.g. 10gbit, 100mbit,delay=1ms, 1gbit,loss=0.1%%)")
    p_run.add_argument("--launcher", default="direct", choices=["direct", "torchrun", "mpirun"],
                       help="with --hosts, what starts the ranks: direct (default: one process per rank with "
                            "torchrun's variables), torchrun (an agent per host, c10d rendezvous) or mpirun")
    p_run.add_argument("program", nargs=argparse.REMAINDER, help="program and its arguments (after --)")
    sub.add_parser("bench", help="collective benchmark (ringcomm bench --help)", add_help=False)
    sub.add_parser("demo", help="teaching demos: ring, traffic, scaling, algorithms, zero (ringcomm demo --help)",
                   add_help=False)
    sub.add_parser("tune", help="measure the cost model behind algorithm='auto' on this machine", add_help=False)
    p_an = sub.add_parser("analyze", help="explain flight-record dumps (RINGCOMM_DUMP_ON_ERROR=DIR)")
    p_an.add_argument("dir", help="the directory the ranks dumped into")
    p_an.add_argument("--json", action="store_true", help="print the dumps' last records as JSON instead")
    return parser


def _bench(argv: list[str]) -> int:
    from .benchmark import cli_main
    return cli_main(argv)


def _tune(argv: list[str]) -> int:
    from .tuning.tune import main as tune_main
    return tune_main(argv)


def _demo(argv: list[str]) -> int:
    from .teach.demo import main as demo_main
    return demo_main(argv)


# Commands that parse their own arguments (their --help included).
_PASS_THROUGH = {"bench": _bench, "tune": _tune, "demo": _demo}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    if argv[:1] and argv[0] in _PASS_THROUGH:
        return _PASS_THROUGH[argv[0]](argv[1:])
    args = parser.parse_args(argv)
    command = {"info": _info, "analyze": _analyze, "run": _run}.get(args.cmd)
    return command(args) if command else 2


def _info(args) -> int:
    from .tuning import selection
    d = info()
    costs = selection.costs_for(args.transport)  # shared constants: any n
    table = selection.crossover_table(lambda n: selection.costs_for(args.transport, n))
    from .sysinfo import window_limits
    windows = {n: window_limits(n) for n in (2, 4)}
    if args.json:
        d["cost_model"] = {"transport": args.transport, **vars(costs), "crossovers": table}
        d["shm_auto"] = {str(n): lim for n, lim in windows.items()}
        print(json.dumps(d, indent=2))
        return 0
    for k, v in d.items():
        print(f"{k:<11} {', '.join(v) if isinstance(v, list) else v}")
    tuned = costs != selection.DEFAULTS[args.transport]
    print(f"\nall_reduce algorithm='auto' ({args.transport}; {costs}; "
          f"{'tuned: ' + selection.tune_path() if tuned else 'built-in defaults: run ringcomm tune'})")
    print("crossover: recursive doubling up to the first size (bytes), halving-doubling up to the "
          "second, the ring above (* from the times ringcomm tune measured on that many ranks)")
    print(f"{'n':>3} {'rd_max':>10} {'hd_max':>10}")
    for row in table:
        print(f"{row['n']:>3} {row['recursive_doubling_max']:>10} {row['halving_doubling_max']:>10}"
              + (" *" if row["measured_here"] else ""))
    for n, lim in windows.items():
        _print_window_limits(n, lim, selection.tune_path())
    return 0


def _print_window_limits(n: int, lim: dict, tune_path: str) -> None:
    from .tuning.tune import describe_shm_limits, describe_single_copy
    print(f"\nalgorithm='auto' on {n} ranks of one host runs in the shared-memory window ("
          + (f"tuned: {tune_path}" if lim["tuned"] else "built-in limits: ringcomm tune measures them") + "; "
          + describe_single_copy(lim["single_copy"], lim["single_copy_min"], lim["single_copy_min_4k"])
          + "):")
    for line in describe_shm_limits({k: v for k, v in lim.items() if k not in ("tuned", "single_copy_min_4k")}):
        print("  " + line)


def _analyze(args) -> int:
    from . import flight
    if not os.path.isdir(args.dir):
        print(f"ringcomm analyze: {args.dir} is not a directory", file=sys.stderr)
        return 2
    if args.json:
        groups = flight.load(args.dir)
        print(json.dumps({name: {r: d["records"][-3:] for r, d in ranks.items()}
                          for name, ranks in groups.items()}, indent=1))
    else:
        print(flight.analyze(args.dir))
    return 0


def _run(args) -> int:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.hosts is not None:
        return _run_hosts(args, program)
    extra = [x for k, v in args.mca for x in ("--mca", k, v)]
    from ._failfast import wrap_argv
    cmd = mpirun_command(args.np, wrap_argv(program), extra)  # a rank dying of an exception ends the job
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    # torch's launcher variables belong to one job: never inherit them
    # (ringcomm.torch derives them from MPI in the ranks).
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return subprocess.call(cmd, env=env)


def _run_hosts(args, program: list[str]) -> int:
    from . import cluster
    try:
        link = cluster.LinkSpec.parse(args.link)
    except ValueError as e:
        print(f"ringcomm run: {e}", file=sys.stderr)
        return 2
    if args.mca:
        print("ringcomm run --hosts: --mca is for mpirun; the ranks here are launched as torchrun's are",
              file=sys.stderr)
        return 2
    if args.dry_run:
        host_of = cluster.placement(args.hosts, args.np)
        print(f"{args.hosts} hosts, link {link}; ranks per host: "
              + ", ".join(f"host {h}: {[r for r, x in enumerate(host_of) if x == h]}" for h in range(args.hosts)))
        return 0
    why = cluster.why_not()
    if why:
        print(f"ringcomm run --hosts: no emulated cluster here: {why}", file=sys.stderr)
        return 2
    try:
        return cluster.run(args.hosts, args.np, link, program, launcher=args.launcher)
    except cluster.ClusterError as e:
        print(f"ringcomm run --hosts: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

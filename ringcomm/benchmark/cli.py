"""Entry points: the options (``parser``, ``parse``), ``run_mpi`` on every
rank under mpirun (``python -m ringcomm.benchmark``), and ``cli_main`` for
`ringcomm bench`, which launches the ranks (mpi-ring as a second launch
with Open MPI's ring algorithms forced)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

from .. import vocab
from ..config import parse_size
from ..errors import from_rank0
from ..launch import mpirun_command
from .checks import COLLECTIVES, OTHER_COLLECTIVES, OPS, REDUCING, RING_COLLECTIVES, op_runs, size_list
from .harness import Bench, device_copy_gbps, memcpy_gbps
from .impls import BENCH_ALGORITHMS, DEVICE_IMPLS, IMPLS, RING_MCA
from .report import (HEADER, fit_algorithms, fit_models, fmt_size, footer, machine_info, make_rows, memcpy_table,
                     plot, print_size_block)

# The first paragraph of the package's docstring (`ringcomm bench --help`).
DESCRIPTION = "Collective benchmark in the spirit of nccl-tests: ringcomm against Open MPI and Gloo."


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringcomm bench", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", default="4", help="smallest buffer (K/M/G suffixes; default 4)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest buffer (default 64M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier (default 4)")
    p.add_argument("--iters", type=int, default=0,
                   help="timed iterations per repetition (default 0: enough for ~--target-ms); nccl-tests' -n, "
                        "but -n counts ranks here, as in `ringcomm run` and `ringcomm demo`")
    p.add_argument("-w", "--warmup", type=int, default=2, help="warm-up iterations (default 2)")
    p.add_argument("-r", "--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--target-ms", type=float, default=20, help="time per repetition when --iters 0 (default 20)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1), help="check results (default 1)")
    p.add_argument("-o", "--op", default="sum",
                   help="comma-separated, from sum, prod, min, max, avg (floating dtypes only), band, bor, bxor "
                        "(integer and bool dtypes only), or all: each op with the dtypes it fits; with a reducing "
                        "collective, an op that fits none of the dtypes is refused (default sum)")
    p.add_argument("-d", "--datatype", default="float32", help=f"one of {', '.join(vocab.DTYPES)} or all")
    p.add_argument("--collective", default="all_reduce",
                   help="comma-separated, from all_reduce, reduce_scatter, all_gather, reduce, gather, scatter, "
                        "all_to_all, sendrecv (the ring shift: isend to rank+1, irecv from rank-1), scan, exscan "
                        "(against MPI_Scan / MPI_Exscan), or all (default all_reduce; the rooted ones have root 0)")
    p.add_argument("--impl", default=None,
                   help="comma-separated implementations (default: ringcomm,mpi,mpi-ring,gloo on the host, "
                        "ringcomm,nccl with --device cuda)")
    p.add_argument("--algorithm", default="auto",
                   choices=("auto", *BENCH_ALGORITHMS),
                   help="ringcomm's all_reduce algorithm (default auto: the cost model's choice, shown per size)")
    p.add_argument("--compare-algorithms", action="store_true",
                   help="also run ringcomm with each algorithm forced (rc-ring, rc-rd, rc-hd) beside auto, and "
                        "fit the cost model to them")
    p.add_argument("--device", default="host", choices=("host", "cuda"),
                   help="host: numpy buffers; cuda: cupy buffers on each rank's GPU, ringcomm over NCCL "
                        "point-to-point against NCCL's collectives (default host)")
    p.add_argument("--mode", default="hot", choices=("hot", "cold", "both"),
                   help="hot: the same buffers every iteration (as DDP's freshly written buckets); cold: each "
                        "iteration takes the next buffers of a pool of at least 2x the last-level cache per rank, "
                        "so none finds its data in cache; both: a table for each (default hot). The memcpy "
                        "reference runs in the same mode")
    p.add_argument("--cold-pool", default=None,
                   help="cold mode: bytes a buffer waits before it is used again (K/M/G; default 2x the "
                        "last-level cache read from /sys/devices/system/cpu/cpu0/cache)")
    p.add_argument("--json", help="write every row plus machine and version info here")
    p.add_argument("--plot", help="write a PNG of busbw against size here (needs matplotlib)")
    p.add_argument("--progress", action="store_true",
                   help="progress bar on stderr (default: when `ringcomm bench` runs in a terminal)")
    p.add_argument("--extra-json", help=argparse.SUPPRESS)  # rows of a separate mpi-ring launch
    p.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
    return p


def parse(argv) -> argparse.Namespace:
    args = parser().parse_args(argv)
    _sizes_and_modes(args)
    args.ops = list(OPS) if args.op == "all" else args.op.split(",")
    args.dtypes = list(vocab.DTYPES) if args.datatype == "all" else args.datatype.split(",")
    args.collectives = list(COLLECTIVES) if args.collective == "all" else args.collective.split(",")
    if args.device == "cuda" and args.collective == "all":
        args.collectives = list(RING_COLLECTIVES)  # the NCCL baseline wraps these three
    if args.impl is None:
        args.impl = "ringcomm,nccl" if args.device == "cuda" else "ringcomm,mpi,mpi-ring,gloo"
    args.impl = [s for s in args.impl.split(",") if s]
    if args.compare_algorithms:
        args.impl += [m for m in ("rc-ring", "rc-rd", "rc-hd") if m not in args.impl]
    if args.device == "cuda":
        _require_cupy(args)
    _check_names(args)
    return args


def _sizes_and_modes(args) -> None:
    args.sizes = size_list(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    args.modes = ["hot", "cold"] if args.mode == "both" else [args.mode]
    args.cold_pool_bytes = parse_size(args.cold_pool) if args.cold_pool else None
    if args.cold_pool_bytes is not None and args.cold_pool_bytes <= 0:
        raise SystemExit(f"ringcomm bench: --cold-pool must be positive, got {args.cold_pool!r}")
    if args.device == "cuda" and "cold" in args.modes:
        raise SystemExit("ringcomm bench: --mode cold (or both) is for --device host: the pool is sized by the "
                         "CPU's last-level cache")


def _require_cupy(args) -> None:
    from .. import cuda
    from ..errors import InvalidArgument
    try:
        import cupy  # noqa: F401
        cuda.require()
    except ImportError:
        raise SystemExit("ringcomm bench: --device cuda needs cupy (pip install 'ringcomm[cuda13]')") from None
    except InvalidArgument as exc:
        raise SystemExit(f"ringcomm bench: --device cuda: {exc}") from None
    if "bfloat16" in args.dtypes:
        raise SystemExit("ringcomm bench: --device cuda uses cupy buffers, and cupy has no bfloat16; "
                         "choose other dtypes")


def _check_names(args) -> None:
    """Every op, dtype, collective and implementation named exists, fits
    the device, and each op fits a dtype where it reduces."""
    wrong_place = [m for m in args.impl if m in IMPLS and m not in DEVICE_IMPLS[args.device]]
    if wrong_place:
        raise SystemExit(f"ringcomm bench: {wrong_place} cannot run with --device {args.device}; "
                         f"choose from {', '.join(DEVICE_IMPLS[args.device])}")
    for what, vals, ok in (("op", args.ops, OPS), ("dtype", args.dtypes, vocab.DTYPES),
                           ("collective", args.collectives, COLLECTIVES), ("impl", args.impl, IMPLS)):
        bad = [v for v in vals if v not in ok]
        if bad:
            raise SystemExit(f"ringcomm bench: unknown {what} {bad}; expected one of {', '.join(ok)}")
    _check_ops(args)
    if args.device == "cuda" and any(c in OTHER_COLLECTIVES for c in args.collectives):
        raise SystemExit(f"ringcomm bench: --device cuda benchmarks {', '.join(RING_COLLECTIVES)} only "
                         f"(not {', '.join(c for c in args.collectives if c in OTHER_COLLECTIVES)})")


def _check_ops(args) -> None:
    if any(c in REDUCING for c in args.collectives):
        # "all" runs each op with the dtypes it fits; an op named alone must fit one of them
        lone = [] if args.op == "all" else [op for op in args.ops
                                             if not any(vocab.op_fits(d, op) for d in args.dtypes)]
        if lone:
            raise SystemExit(f"ringcomm bench: op {', '.join(lone)} fits none of the dtypes {', '.join(args.dtypes)} "
                             f"(avg: floating dtypes; band, bor, bxor: integer and bool dtypes)")


def run_mpi(argv=None) -> int:
    """Entry point on every rank (under mpirun)."""
    args = parse(argv)
    from mpi4py import MPI
    w = MPI.COMM_WORLD
    n, rank = w.size, w.rank
    bench = Bench(args, w)
    w.Barrier()
    memcpy = from_rank0(w.bcast, rank == 0, memcpy_gbps if args.device == "host" else device_copy_gbps,
                        "measure the memcpy rate")
    tty = args.progress  # under mpirun stdout may be a pty even when piped: the launcher decides
    show = rank == 0 and not args.rows_only
    if show:
        _print_intro(args, n, bench)
    per_mode = len(args.collectives) * len(args.dtypes) * len(args.ops) * len(args.sizes)
    progress = _Progress(per_mode * len(args.modes), show, tty)
    all_rows: list[dict] = []
    for mode in args.modes:
        all_rows += _run_mode(args, bench, mode, (n, memcpy), progress)
    if rank == 0 and tty:
        print(file=sys.stderr)
    wrong = sum(r["wrong"] for r in all_rows) if args.check else 0
    ledger_bad = [r for r in all_rows if r["sent_per_rank"] is not None and r["sent_per_rank"] != r["expected_sent"]]
    for impl in bench.impls:
        impl.close()
    cold = bench.cold_info()
    try:
        if rank == 0:
            wrong = _report(args, n, all_rows, wrong, ledger_bad, memcpy, cold)
    except BaseException:
        # the other ranks wait in the status broadcast below: release them, then fail here
        w.bcast(2)
        raise
    return int(w.bcast(1 if (wrong or ledger_bad) else 0))


def _print_intro(args, n: int, bench: Bench) -> None:
    print(f"# ringcomm bench: n={n}, impls {','.join(i.name for i in bench.impls)}, mode {args.mode}, "
          f"{args.reps} interleaved reps, the same barrier before every iteration of every impl, "
          f"time = max over ranks, median [p10 p90]")
    what = "host memcpy" if args.device == "host" else "device-to-device copy"
    print(f"# memcpy row: the {what} of a buffer of the row's size by all {n} ranks at once, in the same "
          f"mode and interleaving; GB/s per rank; /memcpy = busbw / that rate")


class _Progress:
    """Rank 0's size blocks as they come, and a progress bar on stderr (tty)."""

    def __init__(self, total: int, show: bool, tty: bool):
        self.total, self.done, self.show, self.tty = total, 0, show, tty

    def skip(self, k: int) -> None:
        self.done += k

    def rows(self, rows: list) -> None:
        self.done += 1
        if not self.show:
            return
        if self.tty:
            print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
        print_size_block(rows)
        if self.tty:
            bar = int(30 * self.done / self.total)
            print(f"[{'#' * bar}{'.' * (30 - bar)}] {self.done}/{self.total}", end="", file=sys.stderr, flush=True)


def _run_mode(args, bench: Bench, mode: str, at: tuple, progress: _Progress) -> list:
    """Every collective, dtype, op and size in `mode` ("hot" or "cold"); `at`: (n, memcpy)."""
    if mode == "cold":
        bench.cold_pool()  # allocate and touch it before anything is timed
    if progress.show:
        print(f"#\n# mode {mode}: {_mode_line(mode, bench)}")
    rows: list[dict] = []
    for coll in args.collectives:
        if progress.show:
            print(f"#\n# {coll} ({mode}){'':>{max(1, 56 - len(coll) - len(mode))}}out-of-place"
                  f"{'':>44}in-place")
            print("#" + HEADER[1:])
        for dtype in args.dtypes:
            for op in args.ops:
                if coll in REDUCING and not op_runs(coll, dtype, op) or coll not in REDUCING and op != args.ops[0]:
                    progress.skip(len(args.sizes))
                    continue
                rows += _run_sizes(args, bench, (coll, dtype, op, mode), at, progress)
    return rows


def _run_sizes(args, bench: Bench, what: tuple, at: tuple, progress: _Progress) -> list:
    coll, dtype, op, mode = what
    n, memcpy = at
    # the new data-movement collectives check with data of their own (op "none")
    data_op = "none" if coll in OTHER_COLLECTIVES and coll not in REDUCING else op
    out: list[dict] = []
    for nbytes in args.sizes:
        count, results = bench.measure(coll, nbytes, dtype, data_op, mode)
        rows = make_rows(coll, nbytes, count, dtype, op if coll in REDUCING else "none", results, n, memcpy)
        out += rows
        progress.rows(rows)
    return out


def _report(args, n, all_rows, wrong, ledger_bad, memcpy, cold) -> int:
    """Rank 0: the mpi-ring launch's rows, the footers per mode, --json,
    --plot; returns the wrong elements, the mpi-ring launch's included."""
    if args.extra_json and os.path.exists(args.extra_json):
        extra = json.load(open(args.extra_json))["rows"]
        all_rows += extra
        wrong += sum(r["wrong"] for r in extra) if args.check else 0
        if not args.rows_only:
            _print_extra(args, extra)
    lines: list[str] = []
    by_mode = {mode: _mode_summary(args, n, mode, [r for r in all_rows if r.get("mode", "hot") == mode], lines)
               for mode in args.modes}
    if "cold" in by_mode:
        by_mode["cold"]["cold"] = cold
    if not args.rows_only:
        lines.append(f"# out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        if ledger_bad:
            lines.append(f"# ledger != expected on {len(ledger_bad)} rows: FAILED")
        print("\n".join(lines), flush=True)
    if args.json:
        first = by_mode[args.modes[0]]
        doc = {"version": 1, "machine": machine_info(), "args": {k: v for k, v in vars(args).items()},
               "n": n, "memcpy_gbps": memcpy, "rows": all_rows, "models": first["models"],
               "summary": first["summary"], "modes": by_mode, "cold": cold}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    if args.plot and not args.rows_only:
        plot(all_rows, n, args.plot, f"ringcomm bench, n={n}, {platform.node()}")
    return wrong


def _print_extra(args, extra: list) -> None:
    print("# mpi-ring (separate launch with Open MPI's ring algorithms forced, its own memcpy "
          "reference):")
    for mode in args.modes:
        for coll in args.collectives:
            at = [r for r in extra if r["collective"] == coll and r.get("mode", "hot") == mode]
            if at:
                print(f"# {coll} ({mode})")
            for key in sorted({(r["dtype"], r["op"], r["size"]) for r in at}):
                print_size_block([r for r in at if (r["dtype"], r["op"], r["size"]) == key])


def _mode_summary(args, n: int, mode: str, rows: list, lines: list) -> dict:
    """One mode's fitted models and summary (their text appended to `lines`)."""
    if args.rows_only:
        return {"models": {}, "summary": {}}
    if len(args.modes) > 1:
        lines.append(f"# ---- mode {mode} ----")
    models = fit_models(rows, n, lines)
    if args.device == "host":
        from ..tuning import selection  # what init() gave auto here (rank 0's constants)
        models["all_reduce_algorithms"] = fit_algorithms(rows, n, lines, selection.costs_for("mpi", n))
    summary = footer(rows, n, lines)
    summary["busbw_per_memcpy"] = memcpy_table(rows, n, lines)
    return {"models": models, "summary": summary}


def _mode_line(mode: str, bench: Bench) -> str:
    if mode == "hot":
        return "the same buffers every iteration (as DDP's freshly written buckets)"
    c = bench.cold_info()
    llc = (f"L{c['llc_level']} {fmt_size(c['llc_bytes'])}, shared by CPUs {c['llc_shared_cpus']}"
           if not c["llc_assumed"] else f"unknown, assumed {fmt_size(c['llc_bytes'])}")
    return (f"each iteration takes the next buffers of a pool of {c['pool_bytes'] / 2**20:.0f} MiB per rank; "
            f"a byte is used again only after {c['reuse_distance_bytes'] / 2**20:.0f} MiB of other buffers "
            f"(last-level cache: {llc})")


RANK_FLAGS = ("-n", "-N", "--np", "--nranks")


def cli_main(argv) -> int:
    """`ringcomm bench [-n N] ...`: launch N ranks (default 4) through the
    installed Open MPI and run the benchmark; mpi-ring runs as a second launch
    with Open MPI's ring algorithms forced by MCA parameters. `-n` counts
    ranks, as everywhere in the ringcomm command; the timed iterations
    (nccl-tests' -n) are --iters."""
    if any(a == "--hosts" or a.startswith("--hosts=") for a in argv):
        from .cluster_bench import cli_main as on_cluster
        return on_cluster(argv)
    if "-h" in argv or "--help" in argv:
        print("usage: ringcomm bench [-n NRANKS] [benchmark options]\n\n"
              "  --hosts H [--link SPEC]   on an emulated cluster of H hosts: ringcomm and gloo against the "
              "link (ringcomm bench --hosts 2 --help)\n"
              "  -n/-N/--np NRANKS   ranks to launch (default 4); timed iterations are --iters\n")
        parser().print_help()
        return 0
    nranks, rest = _split_ranks(argv)
    args = parse(rest)  # validate before launching anything
    if sys.stdout.isatty() and "--progress" not in rest:
        rest.append("--progress")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        main_args = list(rest)
        ring_colls = [c for c in args.collectives if c in RING_MCA]
        if "mpi-ring" in args.impl and not ring_colls:  # Open MPI's ring parameters cover the ring's three only
            main_args = _replace_flag(rest, "--impl", ",".join(m for m in args.impl if m != "mpi-ring"))
        elif "mpi-ring" in args.impl:
            ring_json = os.path.join(tmp, "ring.json")
            rc = _launch_mpi_ring(nranks, rest, ring_colls, ring_json, env)
            if rc != 0:
                return rc
            others = [m for m in args.impl if m != "mpi-ring"]
            main_args = _replace_flag(rest, "--impl", ",".join(others)) + ["--extra-json", ring_json]
        cmd = mpirun_command(nranks, [sys.executable, "-m", "ringcomm.benchmark", *main_args])
        return subprocess.call(cmd, env=env)


def _split_ranks(argv) -> tuple[int, list]:
    """(the ranks -n/-N/--np/--nranks asks for, default 4; the other arguments)."""
    nranks, rest, i = 4, [], 0
    while i < len(argv):
        flag, _, value = argv[i].partition("=")
        if flag not in RANK_FLAGS:
            rest.append(argv[i])
            i += 1
            continue
        if not value:
            if i + 1 >= len(argv):
                raise SystemExit(f"ringcomm bench: {flag} needs a number of ranks")
            value, i = argv[i + 1], i + 1
        nranks = _ranks(flag, value)
        i += 1
    return nranks, rest


def _ranks(flag: str, value: str) -> int:
    try:
        nranks = int(value)
    except ValueError:
        raise SystemExit(f"ringcomm bench: {flag} takes a number of ranks, got {value!r}") from None
    if nranks < 1:
        raise SystemExit(f"ringcomm bench: {flag} must be at least 1, got {nranks}")
    if nranks > 4 * (os.cpu_count() or 1):
        print(f"ringcomm bench: {flag} {nranks} launches {nranks} ranks on {os.cpu_count()} cores "
              "(-n counts ranks; the timed iterations are --iters)", file=sys.stderr)
    return nranks


def _launch_mpi_ring(nranks: int, rest: list, ring_colls: list, ring_json: str, env: dict) -> int:
    """The mpi-ring launch: Open MPI's ring algorithms forced by MCA
    parameters, its rows into `ring_json`."""
    ring_args = _replace_flag(rest, "--impl", "mpi-ring") + ["--json", ring_json, "--rows-only"]
    ring_args = _drop_flag(ring_args, "--plot")
    ring_args = [x for x in ring_args if x != "--compare-algorithms"]  # that launch runs mpi-ring only
    ring_args = _replace_flag(ring_args, "--collective", ",".join(ring_colls))
    mca = []
    for coll in ring_colls:
        mca += ["--mca", *RING_MCA[coll]]
    cmd = mpirun_command(nranks, [sys.executable, "-m", "ringcomm.benchmark", *ring_args],
                         ["--mca", "coll_tuned_use_dynamic_rules", "1", *mca])
    return subprocess.call(cmd, env=env)


def _replace_flag(argv, flag, value):
    out, i, found = [], 0, False
    while i < len(argv):
        if argv[i] == flag:
            out += [flag, value]
            i += 2
            found = True
            continue
        if argv[i].startswith(flag + "="):
            out += [flag, value]
            i += 1
            found = True
            continue
        out.append(argv[i])
        i += 1
    return out if found else out + [flag, value]


def _drop_flag(argv, flag):
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 2
            continue
        if argv[i].startswith(flag + "="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out

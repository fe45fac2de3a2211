"""Teaching demos: the real engine, step by step (``ringcomm demo ...``).

    ringcomm demo ring    [-n 4] [--count 8] [--png PATH | --gif PATH]
    ringcomm demo traffic [-n 8] [--count 1024] [--png PATH]
    ringcomm demo scaling [--max-n 64] [--bytes 1M] [--mpi-max 4] [--png PATH]
    ringcomm demo algorithms [-n 8] [--count 1024] [--png PATH]
    ringcomm demo zero    [-n 4] [--params PSI] [--json PATH] [--png PATH]
    ringcomm demo all_to_all [-n 4] [--count 2]      (rooted_demo.py)
    ringcomm demo reduce  [-n 4] [--count 8] [--root 0]

Everything printed comes from a real collective on in-process ranks: the step
table and the partial sums from the engine's own trace (``comm.trace``), the
byte counts from its ledger. Nothing is re-derived on the side, so the demo
cannot disagree with the code.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from ..tuning import costmodel

from .. import run_local, traffic, vocab
from ..config import parse_size


# ---------------------------------------------------------------------------
# demo ring

def ring_data(rank: int, count: int) -> np.ndarray:
    """Rank r holds 10*r + i: the tens digit tells whose contribution it is."""
    return (10 * rank + np.arange(count)).astype(np.int64)


def record_ring(n: int, count: int):
    """Run one ring all_reduce on n in-process ranks with tracing on.
    Returns (per-rank Trace, per-rank result, per-rank Traffic)."""
    def body(comm):
        x = ring_data(comm.rank, count)
        with comm.trace(values=True) as t:
            comm.all_reduce(x, algorithm="ring")
        return t, x, comm.traffic()
    out = run_local(n, body)
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


def traffic_table(n: int, count: int, traffics, collective="all_reduce", label="ring all_reduce",
                  algorithm="ring") -> str:
    nbytes = count * 8
    lines = [f"traffic of one {label} of {count} int64 ({nbytes} B) on {n} ranks, measured by the ledger:",
             f"  {'rank':>4} {'sent B':>9} {'received B':>11} {'expected sent':>14} {'expected received':>18}"]
    for r, t in enumerate(traffics):
        exp = traffic.expected(collective, count, "int64", n, r, algorithm=algorithm)
        lines.append(f"  {r:>4} {t.bytes_sent(collective):>9} {t.bytes_received(collective):>11} "
                     f"{exp.bytes_sent:>14} {exp.bytes_received:>18}")
    if collective == "all_reduce" and algorithm == "ring":
        frac = 2 * (n - 1) / n
        lines.append(f"  2(N-1)/N x nbytes = {frac:.3f} x {nbytes} = {frac * nbytes:.1f} B per rank"
                     + ("" if count % n == 0 else " (count not divisible by N: the exact split is above)"))
    return "\n".join(lines)


def print_ring(n: int, count: int, out=sys.stdout) -> tuple:
    traces, results, traffics = record_ring(n, count)
    bounds = [vocab.chunk_range(count, n, c) for c in range(n)]
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"ring all_reduce (sum) on {n} ranks, {count} elements; rank r holds 10*r + i")
    p("chunks (split rule): " + ", ".join(f"c{c}=[{a}:{b})" for c, (a, b) in enumerate(bounds)))
    for r in range(n):
        p(f"  rank {r}: {ring_data(r, count).tolist()}")
    if n == 1:
        p("one rank: nothing to exchange")
    for phase, title in (("reduce-scatter", "phase 1: reduce-scatter (each step: add what arrives, pass it on)"),
                         ("all-gather", "phase 2: all-gather (each step: keep what arrives, pass it on)")):
        steps = sorted({s.step for t in traces for s in t.steps if s.phase == phase})
        if steps:
            p(f"\n{title}")
        for step in steps:
            p(f" step {step}:")
            for t in traces:
                s = next(x for x in t.steps if x.phase == phase and x.step == step)
                held = "holds" if phase == "reduce-scatter" else "got"
                p(f"   rank {s.rank}: sends c{s.send_chunk} -> rank {s.send_peer} ({s.send_bytes} B), "
                  f"receives c{s.recv_chunk} <- rank {s.recv_peer}; {held} c{s.recv_chunk} = "
                  f"{s.values.tolist() if s.values is not None else []}")
    p(f"\nresult on every rank: {results[0].tolist()}")
    want = sum(ring_data(r, count) for r in range(n))
    p(f"numpy reference:      {want.tolist()}  ({'equal' if all(np.array_equal(x, want) for x in results) else 'DIFFERENT'})")
    p("\n" + traffic_table(n, count, traffics))
    return traces, results, traffics


def draw_ring(traces, n: int, count: int, path: str) -> None:
    """One panel per step: the ranks on a ring, who sends which chunk, and the
    chunk each rank just updated. PNG (all panels) or GIF (one frame per step)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = []
    for phase in ("reduce-scatter", "all-gather"):
        for step in sorted({s.step for t in traces for s in t.steps if s.phase == phase}):
            frames.append((phase, step, [next(x for x in t.steps if x.phase == phase and x.step == step)
                                         for t in traces]))
    if not frames:
        frames.append(("(one rank)", 0, []))
    colors = plt.get_cmap("tab10")
    ang = [np.pi / 2 - 2 * np.pi * r / n for r in range(n)]
    pos = [(np.cos(a), np.sin(a)) for a in ang]

    def panel(ax, phase, step, steps):
        ax.set_xlim(-1.7, 1.7)
        ax.set_ylim(-1.7, 1.7)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"{phase}, step {step}", fontsize=10)
        for s in steps:
            a, b = pos[s.rank], pos[s.send_peer]
            ax.annotate("", xy=(b[0] * 0.85, b[1] * 0.85), xytext=(a[0] * 0.85, a[1] * 0.85),
                        arrowprops=dict(arrowstyle="->", color=colors(s.send_chunk % 10), lw=2))
            mid = ((a[0] + b[0]) / 2 * 1.05, (a[1] + b[1]) / 2 * 1.05)
            ax.text(*mid, f"c{s.send_chunk}", color=colors(s.send_chunk % 10), fontsize=8, ha="center")
        for r, (x, y) in enumerate(pos):
            ax.add_patch(plt.Circle((x * 0.85, y * 0.85), 0.16, color="lightgray", zorder=2))
            ax.text(x * 0.85, y * 0.85, f"r{r}", ha="center", va="center", fontsize=9, zorder=3)
            s = next((q for q in steps if q.rank == r), None)
            if s is not None and s.values is not None:
                vals = s.values.tolist()
                txt = f"c{s.recv_chunk}={vals if len(vals) <= 3 else vals[:3] + ['...']}"
                ax.text(x * 1.35, y * 1.3, txt, ha="center", va="center", fontsize=7,
                        color=colors(s.recv_chunk % 10))

    if path.endswith(".gif"):
        from matplotlib.animation import FuncAnimation, PillowWriter
        fig, ax = plt.subplots(figsize=(4.5, 4.5))

        def update(i):
            ax.clear()
            panel(ax, *frames[i])
        anim = FuncAnimation(fig, update, frames=len(frames))
        anim.save(path, writer=PillowWriter(fps=1))
    else:
        cols = min(len(frames), n - 1 if n > 1 else 1)
        rows = (len(frames) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.4 * rows), squeeze=False)
        for ax in axes.flat:
            ax.axis("off")
        for ax, fr in zip(axes.flat, frames):
            panel(ax, *fr)
        fig.suptitle(f"ring all_reduce, {n} ranks, {count} elements (arrow: chunk sent; label: chunk updated)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close("all")


# ---------------------------------------------------------------------------
# demo traffic

def measure_traffic(n: int, count: int) -> dict:
    """Bytes each rank sent/received for one all_reduce done three ways, plus the
    ring's two halves alone, all on the same communicators and ledger."""
    def body(comm):
        x = ring_data(comm.rank, count)
        out = {}
        for label, call, coll in (
                ("naive", lambda: comm.all_reduce(x.copy(), algorithm="naive"), "all_reduce"),
                ("ring", lambda: comm.all_reduce(x.copy(), algorithm="ring"), "all_reduce"),
                ("reduce_scatter", lambda: comm.reduce_scatter(x), "reduce_scatter"),
                ("all_gather", lambda: comm.all_gather(x[slice(*vocab.chunk_range(count, comm.size, comm.rank))],
                                                       out=np.empty(count, np.int64)), "all_gather")):
            comm.reset_traffic()
            call()
            t = comm.traffic()
            out[label] = (t.bytes_sent(coll), t.bytes_received(coll))
        return out
    return run_local(n, body)


def print_traffic(n: int, count: int, out=sys.stdout) -> list:
    rows = measure_traffic(n, count)
    nbytes = count * 8
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"one all_reduce of {count} int64 ({nbytes} B) on {n} ranks: bytes per rank, measured by the ledger")
    p(f"{'':6}{'master-centric (naive)':>26}{'ring':>24}{'ring: reduce-scatter':>24}{'ring: all-gather':>22}")
    p(f"{'rank':>6}" + "".join(f"{'sent':>12}{'received':>12}" for _ in range(2))
      + f"{'sent':>12}{'received':>12}{'sent':>11}{'received':>11}")
    for r, d in enumerate(rows):
        p(f"{r:>6}" + "".join(f"{d[k][0]:>12}{d[k][1]:>12}" for k in ("naive", "ring", "reduce_scatter"))
          .rstrip() + f"{d['all_gather'][0]:>11}{d['all_gather'][1]:>11}")
    p(f"\nmaster-centric: rank 0 sends and receives (N-1) x nbytes = {n - 1} x {nbytes} = {(n - 1) * nbytes} B; "
      f"the others {nbytes} B each way")
    p(f"ring: every rank sends 2(N-1)/N x nbytes = {2 * (n - 1) / n:.3f} x {nbytes} = "
      f"{2 * (n - 1) * nbytes / n:.1f} B; each half (N-1)/N x nbytes = {(n - 1) * nbytes / n:.1f} B")
    busiest_naive = max(max(d["naive"]) for d in rows)
    busiest_ring = max(max(d["ring"]) for d in rows)
    if busiest_ring:
        p(f"busiest rank: master-centric {busiest_naive} B vs ring {busiest_ring} B "
          f"({busiest_naive / busiest_ring:.2f}x)")
    return rows


def draw_traffic(rows, n: int, count: int, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = np.arange(n)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * n + 3), 4.2))
    w = 0.2
    series = [("naive", 0, "master-centric sent"), ("naive", 1, "master-centric received"),
              ("ring", 0, "ring sent"), ("ring", 1, "ring received")]
    for i, (k, j, label) in enumerate(series):
        ax.bar(ranks + (i - 1.5) * w, [d[k][j] for d in rows], w, label=label)
    nbytes = count * 8
    ax.axhline(2 * (n - 1) / n * nbytes, color="k", ls="--", lw=1, label="2(N-1)/N x nbytes")
    ax.set_xlabel("rank")
    ax.set_ylabel("bytes in one all_reduce")
    ax.set_xticks(ranks)
    ax.set_title(f"all_reduce of {nbytes} B on {n} ranks: traffic per rank (ledger)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------
# demo scaling

def time_allreduce_inproc(n: int, nbytes: int, reps: int = 5) -> float:
    """Median time (s) of a ring all_reduce of nbytes on n in-process ranks
    (time of a repetition: the slowest rank)."""
    count = max(1, nbytes // 4)

    def body(comm):
        x = np.ones(count, np.float32)
        comm.all_reduce(x, algorithm="ring")  # warm-up
        times = []
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x, algorithm="ring")
            times.append(time.perf_counter() - t0)
        return times
    per_rank = np.array(run_local(n, body))
    return float(np.median(per_rank.max(axis=0)))


def time_allreduce_mpi(n: int, nbytes: int, reps: int = 5) -> float:
    from ..launch import mpirun_command
    cmd = mpirun_command(n, [sys.executable, "-m", "ringcomm.teach.demo", "_scaling_worker", str(nbytes), str(reps)])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in res.stdout.splitlines():
        if line.startswith("SCALING "):
            return float(json.loads(line[8:])["seconds"])
    raise RuntimeError(f"MPI scaling run failed: {res.stdout[-500:]} {res.stderr[-500:]}")


def _scaling_worker(nbytes: int, reps: int) -> None:
    import ringcomm
    from mpi4py import MPI
    comm = ringcomm.init()
    x = np.ones(max(1, nbytes // 4), np.float32)
    comm.all_reduce(x, algorithm="ring")  # the ring's scaling (its alpha-beta model)
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(x, algorithm="ring")
        times.append(MPI.COMM_WORLD.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if comm.rank == 0:
        print("SCALING " + json.dumps({"n": comm.size, "seconds": float(np.median(times))}), flush=True)
    comm.close()


def scaling(max_n: int, nbytes: int, mpi_max: int, reps: int, out=sys.stdout, png: str | None = None) -> dict:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    ns = [k for k in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if k <= max_n]
    # Two more sizes around the one shown separate the two terms in the fit:
    # at a fixed size both grow with N, differently but not independently enough.
    sizes = sorted({1 << 10, nbytes, 1 << 20})
    p(f"ring all_reduce: time against N (median of {reps}, slowest rank), sizes {', '.join(map(str, sizes))} B")
    p(f"{'N':>5} " + " ".join(f"{f'{s} B in-proc':>14}" for s in sizes) + f" {f'{nbytes} B MPI':>14}")
    meas, mpi = _measure_scaling(ns, sizes, (nbytes, mpi_max, reps), p)
    pts = list(meas)
    model = costmodel.fit("all_reduce", [k for k, _ in pts], [s for _, s in pts], [meas[q] for q in pts])
    p(f"\nalpha-beta fit (in-process ranks, all sizes): alpha = {model.alpha * 1e6:.2f} us per step, "
      f"beta = {model.beta * 1e9:.4f} ns per byte ({model.bandwidth / 1e9:.2f} GB/s)")
    p(f"model and measurement for {nbytes} B:")
    meas = {k: (meas[(k, nbytes)], mpi.get(k)) for k in ns}
    p("T(N) = 2(N-1) alpha  +  2(N-1)/N x bytes x beta")
    p(f"{'N':>6} {'latency term (us)':>18} {'bandwidth term (us)':>20} {'total (us)':>11} {'measured (us)':>14}"
      f" {'crossover size':>15}")
    rows = {k: _model_row(model, k, nbytes, meas.get(k, (None, None))[0], p)
            for k in sorted(set(list(meas) + [256, 512, 1024]))}
    big = max(rows)
    p(f"\nAt N = {big} the latency term is {rows[big]['latency_us'] / max(rows[big]['bandwidth_us'], 1e-9):.1f}x the "
      f"bandwidth term for {nbytes} B: below {rows[big]['crossover_bytes'] / 1024:.0f} KiB per all_reduce, "
      f"the 2(N-1) steps, not the bytes, set the time.")
    if png:
        _plot_scaling(rows, meas, nbytes, png)
    return {"model": model, "measured": meas, "rows": rows}


def _measure_scaling(ns: list, sizes: list, how: tuple, p) -> tuple[dict, dict]:
    """In-process times per (N, size), MPI times per N up to mpi_max; `how`:
    (the size MPI measures, mpi_max, reps). One printed line per N."""
    nbytes, mpi_max, reps = how
    meas, mpi = {}, {}
    for k in ns:
        for s in sizes:
            meas[(k, s)] = time_allreduce_inproc(k, s, reps)
        if k <= mpi_max:
            mpi[k] = time_allreduce_mpi(k, nbytes, reps)
        p(f"{k:>5} " + " ".join(f"{meas[(k, s)] * 1e6:14.1f}" for s in sizes)
          + (f" {mpi[k] * 1e6:14.1f}" if k in mpi else ""))
    return meas, mpi


def _model_row(model, k: int, nbytes: int, m, p) -> dict:
    """The model's terms at N = k for nbytes (and the measurement m, or None), printed."""
    lat = costmodel.steps("all_reduce", k) * model.alpha
    bw = costmodel.volume_factor("all_reduce", k) * nbytes * model.beta
    cross = costmodel.crossover_bytes(model, "all_reduce", k)
    p(f"{k:>6} {lat * 1e6:18.1f} {bw * 1e6:20.1f} {(lat + bw) * 1e6:11.1f} "
      f"{'' if m is None else f'{m * 1e6:14.1f}':>14} {cross / 1024:12.1f} KiB")
    return {"latency_us": lat * 1e6, "bandwidth_us": bw * 1e6, "measured_us": None if m is None else m * 1e6,
            "crossover_bytes": cross}


def _plot_scaling(rows: dict, meas: dict, nbytes: int, png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ks = sorted(rows)
    ax.plot(ks, [rows[k]["latency_us"] for k in ks], "--", label="model: latency 2(N-1)alpha")
    ax.plot(ks, [rows[k]["bandwidth_us"] for k in ks], ":", label="model: bandwidth term")
    ax.plot(ks, [rows[k]["latency_us"] + rows[k]["bandwidth_us"] for k in ks], "-", label="model: total")
    ax.plot(list(meas), [v[0] * 1e6 for v in meas.values()], "o", label="measured, in-process")
    mp = [(k, v[1]) for k, v in meas.items() if v[1] is not None]
    if mp:
        ax.plot([a for a, _ in mp], [b * 1e6 for _, b in mp], "s", label="measured, MPI")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N (ranks)")
    ax.set_ylabel("time (us)")
    ax.set_title(f"ring all_reduce of {nbytes} B against N")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_scaling_worker"]:
        _scaling_worker(int(argv[1]), int(argv[2]))
        return 0
    ap = _parser()
    args = ap.parse_args(argv)
    if getattr(args, "n", 1) < 1:
        ap.error("-n must be at least 1")
    _DEMOS[args.demo](ap, args)
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ringcomm demo", description="watch the real ring engine work")
    sub = ap.add_subparsers(dest="demo", required=True)
    a = sub.add_parser("ring", help="every step of a ring all_reduce, with partial sums and traffic")
    a.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    a.add_argument("--count", type=int, default=8, help="elements (default 8)")
    g = a.add_mutually_exclusive_group()
    g.add_argument("--png", help="draw every step into one PNG")
    g.add_argument("--gif", help="animate the steps into a GIF")
    a.add_argument("--chrome", help="also write the step trace as Chrome trace JSON (Perfetto)")
    b = sub.add_parser("traffic", help="master-centric vs ring: bytes per rank on the same ledger")
    b.add_argument("-n", type=int, default=8, help="ranks (default 8)")
    b.add_argument("--count", type=int, default=1024, help="elements (default 1024 int64 = 8 KiB)")
    b.add_argument("--png", help="bar chart of bytes per rank")
    c = sub.add_parser("scaling", help="ring all_reduce time against N, with the alpha-beta model")
    c.add_argument("--max-n", type=int, default=64, help="largest in-process world (default 64)")
    c.add_argument("--bytes", default="64K", help="buffer size (default 64K)")
    c.add_argument("--mpi-max", type=int, default=4, help="also measure MPI ranks up to this N (0: none)")
    c.add_argument("--reps", type=int, default=5)
    c.add_argument("--png", help="plot of time against N with the model")
    al = sub.add_parser("algorithms", help="ring, recursive doubling, halving-doubling, master-centric: steps, "
                        "bytes per peer, model vs measured")
    al.add_argument("-n", type=int, default=8, help="ranks (default 8)")
    al.add_argument("--count", type=int, default=1024, help="int64 elements (default 1024 = 8 KiB)")
    al.add_argument("--png", help="draw who sent how much to whom, per algorithm")
    z = sub.add_parser("zero", help="DDP vs ZeRO-1/2/3: memory per rank and traffic per step, measured")
    z.add_argument("-n", type=int, default=4, help="in-process ranks (default 4)")
    z.add_argument("--params", type=int, default=2_000_000, help="model size Psi (default 2,000,000)")
    z.add_argument("--json", help="write the measurements as JSON")
    z.add_argument("--png", help="bar chart of memory per rank against the formulas")
    aa = sub.add_parser("all_to_all", help="pairwise all-to-all: who sends which block to whom, step by step, "
                        "with the ledger per peer")
    aa.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    aa.add_argument("--count", type=int, default=2, help="int64 elements per block (default 2)")
    rd = sub.add_parser("reduce", help="reduce to a root: the binomial tree next to the ring (reduce-scatter + "
                        "gather), steps and the ledger per rank")
    rd.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    rd.add_argument("--count", type=int, default=8, help="int64 elements (default 8)")
    rd.add_argument("--root", type=int, default=0, help="the root rank (default 0)")
    return ap


def _ring(ap, args) -> None:
    if args.count < 0:
        ap.error("--count must be >= 0")
    traces, _, _ = print_ring(args.n, args.count)
    if args.png or args.gif:
        draw_ring(traces, args.n, args.count, args.png or args.gif)
        print(f"\nwrote {args.png or args.gif}")
    if args.chrome:
        from ..trace import to_chrome
        to_chrome(traces, args.chrome)
        print(f"wrote {args.chrome} (open in https://ui.perfetto.dev)")


def _traffic(ap, args) -> None:
    rows = print_traffic(args.n, args.count)
    if args.png:
        draw_traffic(rows, args.n, args.count, args.png)
        print(f"\nwrote {args.png}")


def _algorithms(ap, args) -> None:
    from .algorithms import draw, print_algorithms
    res = print_algorithms(args.n, args.count)
    if args.png:
        draw(res, args.n, args.count, args.png)
        print(f"\nwrote {args.png}")


def _rooted(ap, args) -> None:
    from . import rooted_demo
    if args.count < 0:
        ap.error("--count must be >= 0")
    if args.demo == "all_to_all":
        rooted_demo.print_all_to_all(args.n, args.count)
    else:
        if not 0 <= args.root < args.n:
            ap.error(f"--root must be a rank of 0..{args.n - 1}")
        rooted_demo.print_reduce(args.n, args.count, args.root)


def _zero(ap, args) -> None:
    from .zero_demo import demo
    demo(args.n, args.params, args.json, args.png)


def _scaling(ap, args) -> None:
    scaling(args.max_n, parse_size(args.bytes), args.mpi_max, args.reps, png=args.png)
    if args.png:
        print(f"\nwrote {args.png}")


# demo name -> what runs it (ap: the parser, for its errors)
_DEMOS = {"ring": _ring, "traffic": _traffic, "algorithms": _algorithms, "all_to_all": _rooted, "reduce": _rooted,
          "zero": _zero, "scaling": _scaling}


if __name__ == "__main__":
    sys.exit(main())

"""Reporting, on rank 0: one row per (implementation, in-place) and size, the
per-size text block, the footer (average busbw, ratios to the baselines),
the alpha-beta fits, the plot, and the --json document (machine info,
schema check).

A row is a dict: ``ROW_KEYS`` are the keys every row has (and --json
validates); ``make_rows`` builds them and ``print_size_block`` prints them.
"""

from __future__ import annotations

import platform
import sys

import numpy as np

from .. import vocab

from ..tuning import costmodel, selection
from .checks import COLLECTIVES, OTHER_COLLECTIVES, RING_COLLECTIVES, bus_factor

ROW_KEYS = ("collective", "impl", "size", "count", "dtype", "op", "inplace", "time_us", "p10_us", "p90_us",
            "algbw_gbps", "busbw_gbps", "pct_memcpy", "wrong", "sent_per_rank", "expected_sent", "algorithm",
            "mode", "memcpy_gbps", "memcpy_us", "busbw_per_memcpy")
SHORT = {"ring": "ring", "recursive_doubling": "rd", "halving_doubling": "hd", "naive": "naive", "shm": "shm",
         "shm_flat": "flat", "zero_copy": "zc"}


def validate_json(doc: dict) -> None:
    """Raise ValueError unless `doc` has the schema --json writes."""
    for key in ("version", "machine", "args", "memcpy_gbps", "rows", "models"):
        if key not in doc:
            raise ValueError(f"missing key {key!r}")
    for row in doc["rows"]:
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"row misses {missing}")


def fmt_size(b: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return str(b)


def make_rows(coll, nbytes, count, dtype, op, results, n, memcpy) -> list[dict]:
    """One row per (implementation, in-place) from Bench.measure's results.

    The "memcpy" result (the concurrent copy of the full buffer, interleaved
    with the implementations in both passes) is not a row: every row carries
    it as memcpy_us / memcpy_gbps (bytes one rank copied per second: full /
    median time) and busbw_per_memcpy (busbw / memcpy_gbps). pct_memcpy is busbw against
    `memcpy`, the single-core copy measured once at the start (older
    documents' only reference)."""
    rows = []
    full = count * vocab.itemsize(dtype)
    for (name, inplace), r in results.items():
        if name == "memcpy":
            continue
        t = r["median"]
        algbw = full / t / 1e9
        busbw = algbw * bus_factor(coll, n)
        ref = results.get(("memcpy", False))  # one per size, over both passes
        ref_gbps = full / ref["median"] / 1e9 if ref else None
        rows.append({"collective": coll, "impl": name, "size": full, "count": count, "dtype": dtype, "op": op,
                     "inplace": inplace, "time_us": t * 1e6, "p10_us": r["p10"] * 1e6, "p90_us": r["p90"] * 1e6,
                     "iters": r["iters"], "reps": r["reps"], "algbw_gbps": algbw, "busbw_gbps": busbw,
                     "pct_memcpy": 100 * busbw / memcpy if memcpy else None, "wrong": r["wrong"],
                     "sent_per_rank": r["sent"], "expected_sent": r["expected"],
                     "algorithm": r.get("algorithm"), "mode": r.get("mode", "hot"),
                     "memcpy_gbps": ref_gbps, "memcpy_us": ref["median"] * 1e6 if ref else None,
                     "memcpy_p10_us": ref["p10"] * 1e6 if ref else None,
                     "memcpy_p90_us": ref["p90"] * 1e6 if ref else None,
                     "busbw_per_memcpy": busbw / ref_gbps if ref_gbps else None})
    return rows


HEADER = (f"{'size':>9} {'count':>10} {'type':>8} {'redop':>5} {'impl':>9}  "
          f"{'time(us)':>10} {'p10':>9} {'p90':>9} {'algbw':>7} {'busbw':>7} {'/memcpy':>7} {'#wrong':>6}  "
          f"{'time(us)':>10} {'busbw':>7} {'/memcpy':>7} {'#wrong':>6}  {'sent/rank':>11} {'expected':>11} {'algo':>5}")


def _frac(r) -> str:
    v = r.get("busbw_per_memcpy")
    return f"{v:7.2f}" if v is not None else f"{'-':>7}"


def print_size_block(rows: list[dict], out=sys.stdout) -> None:
    """One size: the memcpy reference first (GB/s per rank in algbw and
    busbw), then one line per implementation."""
    by_impl: dict = {}
    for r in rows:
        by_impl.setdefault(r["impl"], {})[r["inplace"]] = r
    lines = []
    ref = None
    for name, modes in by_impl.items():
        o, i = modes.get(False), modes.get(True)
        base = o or i
        if ref is None and base.get("memcpy_us") is not None:
            ref = base
        line = (f"{fmt_size(base['size']):>9} {base['count']:>10} {base['dtype']:>8} {base['op']:>5} {name:>9}  ")
        if o:
            line += (f"{o['time_us']:10.1f} {o['p10_us']:9.1f} {o['p90_us']:9.1f} {o['algbw_gbps']:7.2f} "
                     f"{o['busbw_gbps']:7.2f} {_frac(o)} {o['wrong']:6d}  ")
        else:
            line += f"{'n/a':>10} {'':>9} {'':>9} {'':>7} {'':>7} {'':>7} {'':>6}  "
        if i:
            line += f"{i['time_us']:10.1f} {i['busbw_gbps']:7.2f} {_frac(i)} {i['wrong']:6d}  "
        else:
            line += f"{'n/a':>10} {'':>7} {'':>7} {'':>6}  "
        if base.get("sent_per_rank") is not None:
            line += f"{base['sent_per_rank']:>11} {base['expected_sent']:>11}"
            line += f" {SHORT.get(base.get('algorithm'), base.get('algorithm') or ''):>5}"
        lines.append(line.rstrip())
    if ref is not None:  # the reference of both passes: GB/s per rank in algbw and busbw
        lines.insert(0, f"{fmt_size(ref['size']):>9} {ref['count']:>10} {ref['dtype']:>8} {ref['op']:>5} "
                        f"{'memcpy':>9}  {ref['memcpy_us']:10.1f} {ref['memcpy_p10_us']:9.1f} "
                        f"{ref['memcpy_p90_us']:9.1f} {ref['memcpy_gbps']:7.2f} {ref['memcpy_gbps']:7.2f} "
                        f"{'ref':>7}")
    print("\n".join(lines), file=out, flush=True)


def memcpy_table(rows: list[dict], n: int, lines: list[str]) -> dict:
    """Per collective and size: the concurrent memcpy rate and each
    implementation's busbw / memcpy, out of place (in place in brackets)."""
    out: dict = {}
    for coll in COLLECTIVES:
        sel = [r for r in rows if r["collective"] == coll and r.get("busbw_per_memcpy") is not None]
        if not sel:
            continue
        impls = sorted({r["impl"] for r in sel}, key=lambda x: (x != "ringcomm", x))
        lines.append(f"# {coll}: busbw / memcpy ({n} ranks copying at once; out of place, in place in brackets)")
        lines.append(f"#   {'size':>9} {'memcpy GB/s':>12} " + " ".join(f"{m:>15}" for m in impls))
        keys = sorted({(r["size"], r["dtype"], r["op"]) for r in sel})
        own = set()  # implementations measured against another launch's memcpy (mpi-ring)
        for key in keys:
            at = {(r["impl"], r["inplace"]): r for r in sel if (r["size"], r["dtype"], r["op"]) == key}
            o_ref = next((r for (m, ip), r in at.items() if not ip), None) or next(iter(at.values()))
            cells = [_memcpy_cell(at, m, o_ref, out.setdefault(coll, {}).setdefault(m, {}), key, own) for m in impls]
            lines.append(f"#   {fmt_size(key[0]):>9} {o_ref['memcpy_gbps']:12.2f} " + " ".join(cells))
        if own:
            lines.append(f"#   * {', '.join(sorted(own))}: against the memcpy of its own launch (its table above)")
    return out


def _memcpy_cell(at: dict, m: str, o_ref: dict, into: dict, key: tuple, own: set) -> str:
    """Implementation m's cell of one size: busbw / memcpy out of place (in
    place), "*" where measured against another launch's memcpy (added to
    `own`); the numbers also go into `into`."""
    o, i = at.get((m, False)), at.get((m, True))
    cell = (f"{o['busbw_per_memcpy']:.2f}" if o else "-") + (f" ({i['busbw_per_memcpy']:.2f})" if i else "")
    if any(r is not None and r["memcpy_gbps"] != o_ref["memcpy_gbps"] for r in (o, i)):
        cell += "*"
        own.add(m)
    into[f"{key[0]}/{key[1]}/{key[2]}"] = {"out_of_place": o["busbw_per_memcpy"] if o else None,
                                           "in_place": i["busbw_per_memcpy"] if i else None}
    return f"{cell:>15}"


def footer(rows: list[dict], n: int, lines: list[str]) -> dict:
    """Average busbw per (collective, impl) and ringcomm's ratio to each baseline."""
    summary = {}
    for coll in COLLECTIVES:
        sel = [r for r in rows if r["collective"] == coll and not r["inplace"]]
        if not sel:
            continue
        impls = sorted({r["impl"] for r in sel}, key=lambda x: (x != "ringcomm", x))
        avg = {m: float(np.mean([r["busbw_gbps"] for r in sel if r["impl"] == m])) for m in impls}
        lines.append(f"# {coll}: average busbw (out-of-place, all sizes): "
                     + ", ".join(f"{m} {v:.2f} GB/s" for m, v in avg.items()))
        ratios = _busbw_ratios(sel, impls)
        if ratios:
            lines.append(f"# {coll}: ringcomm busbw / baseline (geometric mean over sizes): "
                         + ", ".join(f"vs {m} {v:.2f}x" for m, v in ratios.items()))
        big = _ratios_from(sel, impls, 1 << 20)
        if big and coll in OTHER_COLLECTIVES:  # the goal: at least as fast as Open MPI at 1 MiB and above
            lines.append(f"# {coll}: baseline time / ringcomm time at >= 1 MiB (worst size): "
                         + ", ".join(f"vs {m} {v:.2f}x" for m, v in big.items()))
        summary[coll] = {"avg_busbw": avg, "ratio": ratios, "worst_speedup_from_1MiB": big}
    return summary


def _busbw_ratios(sel: list[dict], impls) -> dict:
    """Per baseline: ringcomm's busbw over its, over the sizes both ran, per
    size then the geometric mean."""
    ratios = {}
    for m in impls:
        if m == "ringcomm":
            continue
        per = []
        for r in sel:
            if r["impl"] != "ringcomm":
                continue
            other = [o for o in sel if o["impl"] == m and o["size"] == r["size"] and o["dtype"] == r["dtype"]
                     and o["op"] == r["op"]]
            if other:
                per.append(r["busbw_gbps"] / other[0]["busbw_gbps"])
        if per:
            ratios[m] = float(np.exp(np.mean(np.log(per))))
    return ratios


def _ratios_from(sel: list[dict], impls, min_size: int) -> dict:
    """Per baseline: the smallest (baseline time / ringcomm time) over the sizes >= min_size both ran."""
    out = {}
    for m in impls:
        if m == "ringcomm":
            continue
        per = [o["time_us"] / r["time_us"] for r in sel if r["impl"] == "ringcomm" and r["size"] >= min_size
               for o in sel if o["impl"] == m and (o["size"], o["dtype"], o["op"]) == (r["size"], r["dtype"], r["op"])]
        if per:
            out[m] = float(min(per))
    return out


def fit_algorithms(rows: list[dict], n: int, lines: list[str], comm_costs=None) -> dict:
    """all_reduce: fit the alpha-beta-gamma model (selection.py) to every
    algorithm that ran, print it against the measurements, and compare what
    auto ran with the best forced algorithm (rc-*) at each size."""
    everything = [r for r in rows if r["collective"] == "all_reduce" and not r["inplace"] and r.get("algorithm")
                  and (r["impl"] == "ringcomm" or r["impl"].startswith("rc-"))]
    # The model prices messages (steps, bytes sent, bytes reduced): the
    # message-passing algorithms only, not the shared-memory ones auto may
    # run; those stay out of the fit, not out of the
    # auto-versus-forced table below.
    sel = [r for r in everything if r["algorithm"] in selection.ALGORITHMS]
    if n == 1 or len({(r["algorithm"], r["size"]) for r in sel}) < 3:
        return {}
    pts = [{"algorithm": r["algorithm"], "n": n, "bytes": r["size"], "seconds": r["time_us"] * 1e-6} for r in sel]
    costs = selection.fit(pts)
    rd, hd = selection.auto_limits(costs, n)
    out = {"alpha_us": costs.alpha * 1e6, "beta_ns_per_byte": costs.beta * 1e9,
           "gamma_ns_per_byte": costs.gamma * 1e9, "rd_max": rd, "hd_max": hd}
    lines.append(f"# all_reduce algorithms: model fitted here: {costs}; auto would run recursive doubling "
                 f"up to {rd} B, halving-doubling up to {hd} B, the ring above")
    others = sorted({r["algorithm"] for r in everything} - set(selection.ALGORITHMS))
    if others:
        lines.append(f"#   not in this fit (the model has no terms for them): {', '.join(others)}")
    _measured_limits(pts, sel, n, out, lines)
    if comm_costs is not None:
        rd_, hd_ = selection.auto_limits(comm_costs, n)
        lines.append(f"#   auto ran by: {comm_costs} (recursive doubling up to {rd_} B, halving-doubling up to "
                     f"{hd_} B, the ring above): the constants auto used in this run, built-in defaults until "
                     f"`ringcomm tune` has fitted them on this machine; the fit above is this run's, not used")
    forced = sorted({r["impl"] for r in sel if r["impl"].startswith("rc-")})
    if forced:
        _auto_against_forced(everything, forced, out, lines)
    return out


def _measured_limits(pts: list, sel: list, n: int, out: dict, lines: list) -> None:
    """What auto would choose by this run's own times (as if `ringcomm tune` had measured them)."""
    try:
        first = (sel[0]["dtype"], sel[0]["op"])  # one dtype and op: the times of one kind of call
        here = selection.Measured.from_rows(
            [p for p, r in zip(pts, sel) if r["impl"].startswith("rc-") and (r["dtype"], r["op"]) == first], n)
    except ValueError:
        return
    mrd, mhd = selection.auto_limits(here, n)
    out.update(measured_rd_max=mrd, measured_hd_max=mhd)
    lines.append(f"#   by this run's times (forced algorithms), auto would run recursive doubling up to {mrd} B, "
                 f"halving-doubling up to {mhd} B, the ring above")


def _auto_against_forced(everything: list, forced: list, out: dict, lines: list) -> None:
    """Per size: what auto ran, its time, each forced algorithm's, and auto over the best."""
    by_size: dict = {}
    for r in everything:
        by_size.setdefault((r["dtype"], r["op"], r["size"]), {})[r["impl"]] = r
    lines.append(f"#   {'size':>9} {'auto ran':>8} {'auto(us)':>9} " + " ".join(f"{m:>8}" for m in forced)
                 + f" {'best':>6} {'auto/best':>9}")
    worst = []
    for (_, _, size), impls in sorted(by_size.items(), key=lambda kv: kv[0][2]):
        auto = impls.get("ringcomm")
        times = {m: impls[m]["time_us"] for m in forced if m in impls}
        if not auto or not times:
            continue
        best = min(times, key=times.get)
        ratio = auto["time_us"] / times[best]
        worst.append(ratio)
        lines.append(f"#   {fmt_size(size):>9} {SHORT.get(auto['algorithm'], '?'):>8} {auto['time_us']:9.1f} "
                     + " ".join(f"{times[m]:8.1f}" if m in times else f"{'-':>8}" for m in forced)
                     + f" {best:>6} {ratio:9.2f}")
    if worst:
        out["auto_over_best_max"] = max(worst)
        lines.append(f"#   auto / best forced algorithm: at most {max(worst):.2f} (median {np.median(worst):.2f})")


def fit_models(rows: list[dict], n: int, lines: list[str]) -> dict:
    models = {}
    for coll in RING_COLLECTIVES:  # the ring's alpha-beta model covers these
        # the ring's alpha-beta model: fitted to the ring's runs (auto's choice or forced)
        sel = sorted((r for r in rows if r["collective"] == coll and not r["inplace"]
                      and (r["impl"] == "rc-ring" or r["impl"] == "ringcomm" and r.get("algorithm") in (None, "ring")
                           and not any(o["impl"] == "rc-ring" for o in rows))),
                     key=lambda r: r["size"])
        if len(sel) < 2 or n == 1:
            continue
        sizes = np.array([r["size"] for r in sel], float)
        times = np.array([r["time_us"] * 1e-6 for r in sel])
        m = costmodel.fit(coll, n, sizes, times)
        cross = costmodel.crossover_bytes(m, coll, n)
        models[coll] = {"alpha_us": m.alpha * 1e6, "beta_ns_per_byte": m.beta * 1e9,
                        "bandwidth_gbps": m.bandwidth / 1e9, "crossover_bytes": cross}
        lines.append(f"# model {coll}: alpha = {m.alpha * 1e6:.2f} us/step, beta = {m.beta * 1e9:.4f} ns/B "
                     f"({m.bandwidth / 1e9:.2f} GB/s); latency = bandwidth term at {cross / 1024:.1f} KiB")
        lines.append(f"#   {'size':>9} {'measured(us)':>13} {'model(us)':>10} {'ratio':>6}")
        for r, p in zip(sel, m.predict(coll, n, sizes)):
            lines.append(f"#   {fmt_size(r['size']):>9} {r['time_us']:13.1f} {p * 1e6:10.1f} {r['time_us'] / (p * 1e6):6.2f}")
        for r, p in zip(sel, m.predict(coll, n, sizes)):
            r["model_us"] = float(p * 1e6)
    return models


def plot(rows: list[dict], n: int, path: str, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    colls = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
    fig, axes = plt.subplots(1, len(colls), figsize=(6 * len(colls), 4.5), squeeze=False)
    for ax, coll in zip(axes[0], colls):
        _plot_collective(ax, coll, rows, n)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_collective(ax, coll: str, rows: list[dict], n: int) -> None:
    sel = [r for r in rows if r["collective"] == coll and not r["inplace"]]
    modes = sorted({r.get("mode", "hot") for r in sel}, key=lambda m: m != "hot")
    impls = sorted({r["impl"] for r in sel}, key=lambda x: (x != "ringcomm", x))
    color = {m: f"C{k}" for k, m in enumerate(impls)}
    for mode in modes:
        _plot_mode(ax, coll, [r for r in sel if r.get("mode", "hot") == mode], (mode, len(modes) > 1), color, n)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{coll}, n={n}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(modes) > 1 else 1)


def _plot_mode(ax, coll: str, at_mode: list[dict], how: tuple, color: dict, n: int) -> None:
    """One mode's lines: each implementation, the memcpy reference, ringcomm's model."""
    mode, several = how
    style = "-" if mode == "hot" else ":"
    tag = f" ({mode})" if several else ""
    for impl in color:
        pts = sorted((r["size"], r["busbw_gbps"]) for r in at_mode if r["impl"] == impl)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color[impl], marker="o",
                    label=impl + tag)
    ref: dict = {}
    for r in at_mode:  # the main launch's reference (its rows come first; mpi-ring's launch has its own)
        if r.get("memcpy_gbps"):
            ref.setdefault(r["size"], r["memcpy_gbps"])
    if ref:
        pts = sorted(ref.items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "k" + style, linewidth=2,
                label=f"memcpy, {n} ranks at once{tag}")
    _plot_model(ax, coll, at_mode, mode, tag, n)


def _plot_model(ax, coll: str, at_mode: list[dict], mode: str, tag: str, n: int) -> None:
    mod = sorted((r["size"], r["size"] / (r["model_us"] * 1e-6) / 1e9 * bus_factor(coll, n))
                 for r in at_mode if r["impl"] == "ringcomm" and "model_us" in r)
    if mod:
        ax.plot([p[0] for p in mod], [p[1] for p in mod], "--" if mode == "hot" else "-.", color="grey",
                label=f"ringcomm alpha-beta model{tag}")


def machine_info() -> dict:
    from ..sysinfo import info
    d = info()
    try:
        import torch
        d["torch"] = torch.__version__
    except ImportError:
        d["torch"] = None
    d["hostname"] = platform.node()
    return d

"""The same `ringcomm bench` over several launches, its ratios per launch.

On a shared machine, and with more ranks than cores, one launch's ratio can
sit in a fast or a slow mode for the whole launch (where the scheduler puts
the ranks), so one run's "worst size" says little. This runs the benchmark
`-k` times, one launch after another, and reports for every collective,
size and baseline the ratio baseline time / ringcomm time of each launch
(> 1: ringcomm faster): median, range, and in how many launches ringcomm was
at least as fast. Every launch's rows must be correct (#wrong 0) and, where
the benchmark computes it, ringcomm's ledger must equal the closed form.

    python bench/launches.py -k 8 -- -n 4 -b 1M -e 4M -f 4 --impl ringcomm,mpi \\
        --collective reduce,gather,scatter,all_to_all,sendrecv

Everything after `--` goes to `ringcomm bench` as it is (not --json).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def launch(bench_args, path):
    cmd = [sys.executable, "-m", "ringcomm.cli", "bench", *bench_args, "--json", path]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"launch failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}")
    with open(path) as f:
        return json.load(f)


def ratios(rows):
    """{(collective, size, inplace, baseline): baseline time / ringcomm time} of one launch."""
    mine = {(r["collective"], r["size"], r["inplace"]): r["time_us"] for r in rows
            if r["impl"] == "ringcomm" and r.get("time_us")}
    out = {}
    for r in rows:
        key = (r["collective"], r["size"], r["inplace"])
        if r["impl"] not in ("ringcomm", "memcpy") and key in mine and r.get("time_us"):
            out[key + (r["impl"],)] = r["time_us"] / mine[key]
    return out


def faults(rows):
    """Rows that were wrong, or whose ledger differs from the closed form."""
    bad = []
    for r in rows:
        if r.get("wrong"):
            bad.append(f"{r['collective']} {r['size']} {r['impl']}: {r['wrong']} wrong")
        if r["impl"] == "ringcomm" and r.get("expected_sent") is not None and r.get("sent_per_rank") != r["expected_sent"]:
            bad.append(f"{r['collective']} {r['size']}: sent/rank {r.get('sent_per_rank')} != {r['expected_sent']}")
    return bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", "--launches", type=int, default=6, help="launches (default 6)")
    p.add_argument("--json", help="write every launch's ratios here")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then ringcomm bench's arguments")
    args = p.parse_args(argv)
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    per_launch, bad = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.launches):
            rows = launch(bench_args, os.path.join(tmp, f"{k}.json"))["rows"]
            bad += [f"launch {k}: {b}" for b in faults(rows)]
            per_launch.append(ratios(rows))
            print(f"# launch {k + 1}/{args.launches} done", file=sys.stderr, flush=True)
    keys = sorted(set().union(*per_launch), key=lambda k: (k[0], k[3], k[2], k[1]))
    print(f"# ringcomm bench {' '.join(bench_args)}: {args.launches} launches; "
          "ratio = baseline time / ringcomm time (> 1: ringcomm faster), one value per launch")
    print(f"# {'collective':>12} {'size':>9} {'place':>6} {'baseline':>9} {'median':>7} {'min':>6} {'max':>6} "
          f"{'>=1':>5}  per launch")
    table = []
    for key in keys:
        vals = [d[key] for d in per_launch if key in d]
        coll, size, inplace, impl = key
        wins = sum(v >= 1 for v in vals)
        table.append({"collective": coll, "size": size, "inplace": inplace, "baseline": impl, "ratios": vals})
        print(f"  {coll:>12} {size:>9} {'in' if inplace else 'out':>6} {impl:>9} {statistics.median(vals):7.2f} "
              f"{min(vals):6.2f} {max(vals):6.2f} {wins:>2}/{len(vals):<2}  "
              + " ".join(f"{v:.2f}" for v in vals))
    print("# checks: " + ("every row correct, every ledger equal to its closed form" if not bad else
                          f"{len(bad)} FAILED: " + "; ".join(bad[:10])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench_args": bench_args, "launches": args.launches, "rows": table, "faults": bad}, f,
                      indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

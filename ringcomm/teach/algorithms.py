"""``ringcomm demo algorithms``: the all_reduce family side by side.

For the ring, recursive doubling, halving-doubling and the master-centric
scheme, one all_reduce of the same buffer on N in-process ranks, with the
engine's own trace and ledger: the steps each rank took, the bytes it sent in
total and to each peer (recursive doubling talks to rank XOR 2^k, the ring
only to rank + 1), the cost model's predicted time against the measured one,
and, with --png, a peer-by-peer picture of who sent how much to whom.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .. import run_local, traffic

from ..tuning import selection

ALGOS = ("ring", "recursive_doubling", "halving_doubling", "naive")


def _body(comm, algorithm: str, count: int, reps: int):
    x = (np.arange(count, dtype=np.int64) % 7) * (comm.rank + 1)
    with comm.trace() as t:
        comm.all_reduce(x.copy(), algorithm=algorithm)
    led = comm.traffic()
    y = x.copy()
    comm.all_reduce(y, algorithm=algorithm)
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(y, algorithm=algorithm)
        times.append(time.perf_counter() - t0)
    sent = {p: led.bytes_sent("all_reduce", peer=p) for p in range(comm.size)}
    return {"steps": sorted({(s.phase, s.step) for s in t.steps}), "sent": sent,
            "received": led.bytes_received("all_reduce"), "times": times}


def measure(n: int, count: int, reps: int = 20) -> dict:
    out = {}
    for a in ALGOS:
        per_rank = run_local(n, _body, a, count, reps)
        t = np.max(np.array([r["times"] for r in per_rank]), axis=0)  # the slowest rank, per repetition
        for r, res in enumerate(per_rank):
            exp = traffic.expected("all_reduce", count, "int64", n, r, algorithm=a)
            assert {p: b for p, b in res["sent"].items() if b} == exp.sent, (a, r, res["sent"], exp.sent)
        out[a] = {"ranks": per_rank, "measured_s": float(np.median(t))}
    return out


def print_algorithms(n: int, count: int, out=sys.stdout, reps: int = 20) -> dict:
    nbytes = count * 8
    costs = selection.costs_for("inproc", n)
    res = measure(n, count, reps)
    print(f"one all_reduce of {count} int64 ({nbytes} B) on {n} in-process ranks, four ways "
          f"(ledger == traffic.expected checked for every rank)\n", file=out)
    print(f"  {'algorithm':<20} {'steps':>5} {'max sent/rank':>14} {'x buffer':>9} {'peers of rank 0':>16} "
          f"{'model us':>9} {'measured us':>12}", file=out)
    for a, d in res.items():
        ranks = d["ranks"]
        steps = max(len(r["steps"]) for r in ranks)
        sent = max(sum(r["sent"].values()) for r in ranks)
        peers = sorted(p for p, b in ranks[0]["sent"].items() if b)
        pred = float(selection.predict(costs, a, n, nbytes)) * 1e6
        print(f"  {a:<20} {steps:>5} {sent:>14} {sent / nbytes if nbytes else 0:>9.3f} {str(peers):>16} "
              f"{pred:>9.1f} {d['measured_s'] * 1e6:>12.1f}", file=out)
    rd, hd = selection.auto_limits(costs, n)
    print("\n  steps: the engine's trace (distinct phase/step pairs of the busiest rank); sent: its ledger.",
          file=out)
    print(f"  model ({costs}): algorithm='auto' runs recursive doubling up to {rd} B, halving-doubling up to "
          f"{hd} B, the ring above (for this n)", file=out)
    for a in ("recursive_doubling", "halving_doubling"):
        print(f"\n  {a}: bytes rank r sent to each peer", file=out)
        print("        " + "".join(f"{p:>8}" for p in range(n)), file=out)
        for r, d in enumerate(res[a]["ranks"]):
            print(f"  r{r:<5}" + "".join(f"{d['sent'][p] or '.':>8}" for p in range(n)), file=out)
    return res


def draw(res: dict, n: int, count: int, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(res), figsize=(4 * len(res), 4))
    vmax = max(max(r["sent"].values()) for d in res.values() for r in d["ranks"]) or 1
    for ax, (a, d) in zip(axes, res.items()):
        m = np.array([[r["sent"][p] for p in range(n)] for r in d["ranks"]], float)
        im = ax.imshow(m, cmap="viridis", vmin=0, vmax=vmax)
        steps = max(len(r["steps"]) for r in d["ranks"])
        ax.set_title(f"{a}\n{steps} steps, max {int(m.sum(axis=1).max())} B sent/rank", fontsize=9)
        ax.set_xlabel("to peer")
        ax.set_ylabel("from rank")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
    fig.colorbar(im, ax=axes, shrink=0.7, label="bytes sent (ledger)")
    fig.suptitle(f"one all_reduce of {count * 8} B on {n} ranks: who sends what to whom")
    fig.savefig(path, dpi=100)
    plt.close(fig)

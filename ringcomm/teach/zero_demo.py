"""`ringcomm demo zero`: the articles' table (16Psi for DDP, 2Psi+14Psi/N for
ZeRO-2, 16Psi/N for ZeRO-3; 2Psi vs 3Psi of traffic), measured on a small MLP
trained under every stage by ``ringcomm.zero.ZeroOptimizer``."""

from __future__ import annotations

import numpy as np

from ..train.zero_optimizer import ZeroOptimizer, expected_memory, expected_traffic

__all__ = ["demo", "measure", "mlp_widths", "mlp_units", "train_step"]

def mlp_widths(psi: int, layers: int = 8) -> list[int]:
    """Widths of a `layers`-layer MLP with about `psi` parameters (square hidden layers)."""
    w = max(4, int((psi / layers) ** 0.5))
    return [w] * (layers + 1)


def mlp_units(widths: list[int], dtype, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype), np.zeros(b, dtype)]
            for a, b in zip(widths[:-1], widths[1:])]


def train_step(zero: "ZeroOptimizer", widths: list[int], rank: int, step: int, dtype, prefetch: bool = True):
    rng = np.random.default_rng(7919 * step + rank)
    x = rng.standard_normal((8, widths[0])).astype(np.float32)
    y = rng.standard_normal((8, widths[-1])).astype(np.float32)
    units = len(widths) - 1
    acts, zs = [x], []
    for u in range(units):
        if prefetch and u + 1 < units:
            zero.prefetch(u + 1)
        with zero.gathered(u) as (w, b):
            z = acts[-1] @ w.astype(np.float32) + b.astype(np.float32)
        zs.append(z)
        acts.append(np.tanh(z) if u < units - 1 else z)
    g = 2 * (acts[-1] - y) / y.size
    for u in reversed(range(units)):
        if prefetch and u > 0:
            zero.prefetch(u - 1)
        with zero.gathered(u) as (w, b):
            gz = g if u == units - 1 else g * (1 - np.tanh(zs[u]) ** 2)
            gw, gb = zero.grads(u)
            gw[...] = (acts[u].T @ gz).astype(dtype)
            gb[...] = gz.sum(0).astype(dtype)
            g = gz @ w.astype(np.float32).T
        zero.reduce(u)
    zero.step()


def measure(n: int, psi: int, steps: int = 2, dtype=np.float16, comm=None) -> dict:
    """Train the same MLP (about psi parameters) under DDP and ZeRO-1/2/3 on
    n in-process ranks, or on the ranks of `comm` (e.g. ringcomm.init() under
    mpirun; collective, every rank gets the result); per stage, the maximum
    over ranks of the bytes held (steady state, and peak during a step) and
    of the payload sent in one step (ledger), and the largest difference from
    DDP's parameters."""
    widths = mlp_widths(psi)
    actual_psi = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    import ringcomm

    def body(comm, stage):
        zero = ZeroOptimizer(mlp_units(widths, dtype), comm, stage=stage, lr=1e-3)
        for s in range(steps - 1):
            train_step(zero, widths, comm.rank, s, dtype)
        zero.reset_peak()
        comm.reset_traffic()
        train_step(zero, widths, comm.rank, steps - 1, dtype)
        sent = sum(comm.traffic().bytes_sent(c) for c in ("all_reduce", "reduce_scatter", "all_gather"))
        mem = zero.memory()
        params = zero.full_parameters()
        return mem, sent, params

    def diff(ref, got) -> float:
        return max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                   for unit_a, unit_b in zip(ref, got) for a, b in zip(unit_a, unit_b))

    results = {}
    ref = None
    for stage in (0, 1, 2, 3):
        if comm is None:
            res = ringcomm.run_local(n, body, stage)
            if stage == 0:
                ref = res[0][2]
            d = diff(ref, res[0][2])
            mem = {k: max(m[k] for m, _, _ in res) for k in ("params", "grads", "optimizer", "peak")}
            sent = max(s for _, s, _ in res)
        else:  # this rank's figures, then the maximum over ranks (and over every rank's difference from DDP)
            m, sent, params = body(comm, stage)
            if stage == 0:
                ref = params
            row = np.array([m["params"], m["grads"], m["optimizer"], m["peak"], sent], np.int64)
            comm.all_reduce(row, op="max")
            worst = np.array([diff(ref, params)])
            comm.all_reduce(worst, op="max")
            mem = dict(zip(("params", "grads", "optimizer", "peak"), (int(x) for x in row[:4])))
            sent, d = int(row[4]), float(worst[0])
        results[("ddp", "zero1", "zero2", "zero3")[stage]] = {
            "memory_bytes": {k: mem[k] for k in ("params", "grads", "optimizer")},
            "peak_memory_bytes": mem["peak"],
            "sent_bytes_per_step": sent,
            "max_abs_param_diff_vs_ddp": d,
        }
    return {"n": n if comm is None else comm.size, "ranks": "in-process" if comm is None else "mpi",
            "psi": actual_psi, "param_bytes": int(np.dtype(dtype).itemsize), "stages": results}


def _mpi_world_size() -> int:
    """The number of ranks when this process was started by mpirun (Open MPI,
    or a PMI launcher such as MPICH's hydra), else 0."""
    import os
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def demo(n: int, psi: int, json_path: str | None = None, png_path: str | None = None, out=None,
         mpi: bool | None = None) -> dict:
    """`ringcomm demo zero`: on n in-process ranks, or, when started under
    mpirun (``ringcomm run -n 4 ringcomm demo zero``; `mpi` None: detected from
    the launcher's environment), on the MPI ranks (n is then the world size);
    rank 0 prints and writes the files."""
    import json
    import sys
    out = out or sys.stdout
    if mpi is None:
        mpi = _mpi_world_size() > 1
    if mpi:
        import ringcomm
        comm = ringcomm.init()
        try:
            r = measure(comm.size, psi, comm=comm)
        finally:
            rank = comm.rank
            comm.close()
        if rank != 0:
            return r
    else:
        r = measure(n, psi)
    n = r["n"]
    psi, pb = r["psi"], r["param_bytes"]
    where = "MPI ranks" if mpi else "in-process ranks"
    print(f"ZeRO on {n} {where}: an {len(mlp_widths(psi)) - 1}-layer MLP with Psi = {psi:,} parameters, "
          f"{pb}-byte parameters and gradients, Adam with fp32 master weights (K = 12 B per parameter).", file=out)
    print("Per rank (maximum over ranks), measured from the arrays each rank holds / the ledger, vs the formula:",
          file=out)
    head = f"{'':6} {'params':>22} {'grads':>22} {'optimizer':>22} {'total (formula)':>24} {'peak':>11} " \
           f"{'sent/step (formula)':>27} {'vs DDP':>7}"
    print(head, file=out)
    mib = 1 / 2**20
    formulas = {"ddp": "16Psi", "zero1": "4Psi+12Psi/N", "zero2": "2Psi+14Psi/N", "zero3": "16Psi/N"}
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        s = r["stages"][name]
        f = expected_memory(stage, psi, n, pb)
        m = s["memory_bytes"]
        cells = [f"{m[k] * mib:8.2f} ({f[k] * mib:8.2f}) MiB" for k in ("params", "grads", "optimizer")]
        total, ftotal = sum(m.values()), sum(f.values())
        sent, fsent = s["sent_bytes_per_step"], expected_traffic(stage, psi, n, pb)
        print(f"{name:6} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} "
              f"{total * mib:8.2f} ({formulas[name]} = {ftotal * mib:.2f}) {s['peak_memory_bytes'] * mib:8.2f} MiB "
              f"{sent * mib:8.2f} ({fsent * mib:8.2f}) MiB {s['max_abs_param_diff_vs_ddp']:7.1g}", file=out)
    print(f"(sent/step formula: {2 if True else 0}Psi(N-1)/N for DDP and ZeRO-1/2, 3Psi(N-1)/N for ZeRO-3, "
          f"times {pb} B; 'vs DDP': largest parameter difference after the steps: 0 = bitwise equal)", file=out)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(r, fh, indent=1)
        print(f"wrote {json_path}", file=out)
    if png_path:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = ["ddp", "zero1", "zero2", "zero3"]
        fig, ax = plt.subplots(figsize=(7, 4))
        bottom = np.zeros(4)
        for k, color in (("params", "#4c72b0"), ("grads", "#dd8452"), ("optimizer", "#55a868")):
            vals = np.array([r["stages"][s]["memory_bytes"][k] * mib for s in names])
            ax.bar(names, vals, bottom=bottom, label=k, color=color)
            bottom += vals
        ax.scatter(names, [sum(expected_memory(i, psi, n, pb).values()) * mib for i in range(4)], color="black",
                   marker="_", s=600, label="formula", zorder=3)
        ax.set_ylabel("MiB per rank")
        ax.set_title(f"ZeRO memory per rank, measured: Psi = {psi:,}, N = {n}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png_path, dpi=110)
        print(f"wrote {png_path}", file=out)
    return r

"""Which all_reduce algorithm to run: an alpha-beta-gamma cost model, fitted
on the machine it runs on, and the choice it implies for ``algorithm="auto"``.

Every algorithm is a sequence of dependent steps. On the critical path of one
rank, a call on n ranks with a buffer of B bytes costs

    T = steps * alpha  +  sent * beta  +  reduced * gamma

alpha: latency of one step (a message's start-up and the wait for it);
beta: seconds per byte sent; gamma: seconds per byte reduced. With
p = 2^floor(log2 n), L = log2 p and f = 1 when n is not a power of two
(then the extra ranks fold into partners first and get the result back at
the end: two more steps of a whole buffer, pairwise.h):

====================  ===============  ===========================  ======================
algorithm             steps            sent (bytes)                 reduced (bytes)
====================  ===============  ===========================  ======================
ring                  2(n-1)           2(n-1)/n * B                 (n-1)/n * B
recursive_doubling    L + 2f           (L + 2f) * B                 (L + f) * B
halving_doubling      2L + 2f          (2(p-1)/p + 2f) * B          ((p-1)/p + f) * B
naive                 2(n-1)           2(n-1) * B                   (n-1) * B
====================  ===============  ===========================  ======================

Each T is a line in B, so the fastest algorithm changes at most twice as B
grows: recursive doubling (fewest steps) for small buffers, halving-doubling
for medium ones, the ring (least data per rank, and pipelined) for large;
halving-doubling must beat the ring by MARGIN to displace it.
``auto_limits`` turns the constants into the two byte limits the engine
compares each call against (csrc/engine/engine.h set_auto_limits). Every rank must
be given the same constants: ``init()`` broadcasts rank 0's.

The lines leave out what makes a step's cost depend on its message size:
MPI libraries switch protocol with it (Open MPI's shared memory sends up to
4 KiB eagerly and larger messages after a handshake), and a busy core
schedules ranks its own way. So where ``ringcomm tune`` measured every
algorithm on as many ranks as the communicator has, auto follows those
measurements instead (``Measured``: each algorithm's time interpolated
between the sizes measured; the fastest runs, with no margin; beyond the
largest size measured, the ring). Other world sizes use the lines.

Constants come from ``ringcomm tune`` (written to
``$XDG_CACHE_HOME/ringcomm/tune.json``, else ``~/.cache/ringcomm/tune.json``),
else from the defaults below (measured on the development machine: 2 cores,
Open MPI 5 shared memory).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import asdict, dataclass

import numpy as np

from ..policy import UNLIMITED, default, tune_path  # noqa: F401  (selection's names, as before)

__all__ = ["Costs", "Measured", "ALGORITHMS", "terms", "predict", "best", "auto_limits", "crossover_table", "fit",
           "costs_for", "tune_path", "save", "DEFAULTS", "MARGIN", "reduce_limit"]

ALGORITHMS = ("ring", "recursive_doubling", "halving_doubling", "naive")
AUTO_CANDIDATES = ("ring", "halving_doubling", "recursive_doubling")


@dataclass(frozen=True)
class Costs:
    alpha: float  # seconds per step
    beta: float   # seconds per byte sent
    gamma: float  # seconds per byte reduced

    def __str__(self) -> str:
        bw = "beta=0" if self.beta == 0 else f"beta=1/({1e-9 / self.beta:.2f} GB/s)"
        rw = "gamma=0" if self.gamma == 0 else f"gamma=1/({1e-9 / self.gamma:.2f} GB/s)"
        return f"alpha={self.alpha * 1e6:.2f} us, {bw} sent, {rw} reduced"


@dataclass(frozen=True)
class Measured:
    """Each algorithm's time, measured on `n` ranks at a few sizes
    (``ringcomm tune``): ``times`` is ((algorithm, ((bytes, seconds), ...)), ...),
    sizes ascending. Between two sizes the time is interpolated on log-log
    axes; below the smallest it is the smallest's; above the largest it
    grows linearly (the last two sizes' slope, if positive)."""
    n: int
    times: tuple

    @classmethod
    def from_rows(cls, rows, n: int) -> "Measured":
        """From tune's rows {"algorithm", "n", "bytes", "seconds"}; ValueError
        unless the ring, recursive doubling and halving-doubling were each
        measured at the same two or more sizes on `n` ranks."""
        table = {}
        for r in rows:
            if int(r["n"]) == n and r["algorithm"] in ALGORITHMS:
                t = float(r["seconds"])
                if not (math.isfinite(t) and t > 0 and int(r["bytes"]) > 0):
                    raise ValueError(f"bad measurement {r}")
                table.setdefault(r["algorithm"], {})[int(r["bytes"])] = t
        sizes = {a: sorted(table.get(a, {})) for a in AUTO_CANDIDATES}
        if len(sizes["ring"]) < 2 or any(v != sizes["ring"] for v in sizes.values()):
            raise ValueError(f"need ring, recursive_doubling and halving_doubling at the same sizes on {n} ranks")
        return cls(int(n), tuple((a, tuple(sorted(d.items()))) for a, d in sorted(table.items())))

    def sizes(self) -> list[int]:
        return [b for b, _ in self.curve("ring")]

    def curve(self, algorithm: str) -> tuple:
        for a, pts in self.times:
            if a == algorithm:
                return pts
        raise ValueError(f"{algorithm!r} was not measured (n={self.n})")

    def predict(self, algorithm: str, nbytes):
        pts = self.curve(algorithm)
        b = np.maximum(np.asarray(nbytes, dtype=float), 1.0)
        xs = np.log([x for x, _ in pts])
        ys = np.log([y for _, y in pts])
        t = np.exp(np.interp(np.log(b), xs, ys))
        (b0, t0), (b1, t1) = pts[-2], pts[-1]
        slope = max(0.0, (t1 - t0) / (b1 - b0))  # noise may make the last point faster: never below t1
        return np.where(b > b1, t1 + (b - b1) * slope, t)

    def __str__(self) -> str:
        s = self.sizes()
        return f"measured on {self.n} ranks at {len(s)} sizes from {s[0]} to {s[-1]} B"


# Built-in constants: `ringcomm tune` on the development machine (2 cores),
# 2026-11-30.
DEFAULTS = {
    # 2 ranks, Open MPI 5.0 shared memory: gamma fits to 0 there (the
    # reduction hides behind the copies), so the margin decides large sizes.
    "mpi": Costs(alpha=1.21e-6, beta=1 / 6.89e9, gamma=0.0),
    # 2 rank threads: every message wakes a thread (futex), hence alpha.
    "inproc": Costs(alpha=35.7e-6, beta=1 / 15.3e9, gamma=1 / 6.28e9),
}


def _fold(n: int) -> tuple[int, int, int]:
    p = 1 << (int(n).bit_length() - 1)
    return p, p.bit_length() - 1, 1 if n != p else 0


def terms(algorithm: str, n: int, nbytes) -> tuple:
    """(steps, bytes sent, bytes reduced) on one rank's critical path."""
    b = np.asarray(nbytes, dtype=float)
    if n == 1:
        return 0, 0 * b, 0 * b
    p, L, f = _fold(n)
    if algorithm == "ring":
        return 2 * (n - 1), 2 * (n - 1) / n * b, (n - 1) / n * b
    if algorithm == "recursive_doubling":
        return L + 2 * f, (L + 2 * f) * b, (L + f) * b
    if algorithm == "halving_doubling":
        return 2 * L + 2 * f, (2 * (p - 1) / p + 2 * f) * b, ((p - 1) / p + f) * b
    if algorithm == "naive":
        return 2 * (n - 1), 2 * (n - 1) * b, (n - 1) * b
    raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def predict(costs, algorithm: str, n: int, nbytes):
    """Predicted seconds of one all_reduce of `nbytes` on `n` ranks
    (`costs`: a ``Costs``, or a ``Measured`` on n ranks)."""
    if isinstance(costs, Measured):
        if n != costs.n:
            raise ValueError(f"measured on {costs.n} ranks, asked about {n}")
        return costs.predict(algorithm, nbytes)
    c = costs
    s, sent, red = terms(algorithm, n, nbytes)
    return s * c.alpha + sent * c.beta + red * c.gamma


# The ring's margin and the size limit that never binds: the policy table's.
MARGIN = default("margin")


def _line(costs: Costs, algorithm: str, n: int) -> tuple[float, float]:
    c0 = float(predict(costs, algorithm, n, 0))
    return c0, float(predict(costs, algorithm, n, 1)) - c0


def _below(a0: float, a1: float, b0: float, b1: float) -> float:
    """a0 + a1 B < b0 + b1 B exactly for B < this (0: never, inf: always)."""
    if a0 >= b0:
        return 0.0
    return math.inf if a1 <= b1 else (b0 - a0) / (a1 - b1)


def _last(x: float) -> int:
    return (1 << 62) if x == math.inf else max(0, math.ceil(x) - 1)


def auto_limits(costs, n: int) -> tuple[int, int]:
    """(rd_max, hd_max): recursive doubling up to rd_max bytes, halving-doubling
    up to hd_max, the ring above: the rule the engine applies.

    An algorithm displaces the ring where it is predicted faster by more
    than MARGIN, and recursive doubling displaces halving-doubling where it
    is faster at all. Each line is steeper than the next (more bytes, fewer
    steps), so each region is one interval, and the choice is never
    predicted slower than 1 / (1 - MARGIN) times the best. For ``Measured``
    times see ``_measured_limits``."""
    if n <= 1:
        return 0, 0
    if isinstance(costs, Measured):
        return _measured_limits(costs, n)
    rd0, rd1 = _line(costs, "recursive_doubling", n)
    hd0, hd1 = _line(costs, "halving_doubling", n)
    r0, r1 = _line(costs, "ring", n)
    k = 1 - MARGIN
    x = _below(hd0, hd1, k * r0, k * r1)  # HD clearly beats the ring below x
    z = _below(rd0, rd1, k * r0, k * r1)  # RD clearly beats the ring below z
    y = _below(rd0, rd1, hd0, hd1)        # RD beats HD below y
    # RD holds [0, z), cut short where HD takes over first (y < x); beyond x
    # RD cannot beat the ring clearly once HD has beaten it (lines).
    rd_end = min(z, y) if y < x else z
    rd = _last(rd_end) if rd_end > 0 else 0
    hd = max(rd, _last(x) if x > 0 else 0)
    return int(rd), int(hd)


def _measured_limits(m: Measured, n: int, per_octave: int = 16) -> tuple[int, int]:
    """The engine's two limits that keep auto closest to the fastest measured
    algorithm: on a fine grid of sizes up to the largest measured, minimise
    the worst ratio of the chosen algorithm's time to the fastest's (then
    their sum). Above the largest size measured the ring runs: a
    measurement, not an extrapolation, decides against it."""
    if n != m.n:
        raise ValueError(f"measured on {m.n} ranks, asked about {n}")
    top = m.sizes()[-1]
    grid = np.unique(np.round(np.exp2(np.arange(0, math.log2(top) * per_octave + 1) / per_octave)).astype(np.int64))
    grid = grid[grid <= top]
    t = np.array([m.predict(a, grid) for a in AUTO_CANDIDATES])  # ring, hd, rd
    r = t / t.min(axis=0)
    k = len(grid)
    # Choice i, j (0 <= i <= j <= k): rd on grid[:i], hd on grid[i:j], ring on grid[j:].
    rd_worst = np.concatenate([[1.0], np.maximum.accumulate(r[2])])
    rd_sum = np.concatenate([[0.0], np.cumsum(r[2])])
    ring_worst = np.concatenate([np.maximum.accumulate(r[0][::-1])[::-1], [1.0]])
    ring_sum = np.concatenate([np.cumsum(r[0][::-1])[::-1], [0.0]])
    hd_sum = np.concatenate([[0.0], np.cumsum(r[1])])
    best_key, bi, bj = (math.inf, math.inf), 0, 0
    for i in range(k + 1):
        hd_worst = np.concatenate([[1.0], np.maximum.accumulate(r[1][i:])])  # over grid[i:j], j = i..k
        js = np.arange(i, k + 1)
        worst = np.maximum(np.maximum(rd_worst[i], hd_worst), ring_worst[js])
        total = rd_sum[i] + (hd_sum[js] - hd_sum[i]) + ring_sum[js]
        jj = int(np.lexsort((total, worst))[0])
        key = (float(worst[jj]), float(total[jj]))
        if key < best_key:
            best_key, bi, bj = key, i, int(js[jj])
    rd = int(grid[bi - 1]) if bi > 0 else 0
    hd = int(grid[bj - 1]) if bj > 0 else 0
    return rd, max(rd, hd)


def reduce_limit(costs, n: int) -> int:
    """reduce's crossover: the binomial tree up to this many bytes, the ring
    reduce-scatter + gather above (csrc/algorithms/reduce.cpp).

    On one rank's critical path, with L = ceil(log2 n):

    ==========  ============  ========================  ==================
    algorithm   steps         sent (bytes)              reduced (bytes)
    ==========  ============  ========================  ==================
    binomial    L             L * B                     L * B
    ring        2(n-1)        2(n-1)/n * B              (n-1)/n * B
    ==========  ============  ========================  ==================

    (the tree's root waits for L whole buffers, one after the other; the
    ring's root runs the reduce-scatter, then receives n-1 chunks.) The
    tree runs where it is predicted faster, and never above REDUCE_TREE_MAX;
    a ``Measured`` model, which has no reduce measurements, uses the
    built-in constants of its transport's kind (the lines), scaled by
    nothing: a simple, documented crossover."""
    if n <= 1:
        return 0
    c = costs if isinstance(costs, Costs) else DEFAULTS["mpi"]
    L = (n - 1).bit_length()
    t0, t1 = L * c.alpha, L * (c.beta + c.gamma)
    r0, r1 = 2 * (n - 1) * c.alpha, 2 * (n - 1) / n * c.beta + (n - 1) / n * c.gamma
    return min(int(_last(_below(t0, t1, r0, r1))), REDUCE_TREE_MAX)


# Above this size reduce runs the ring whatever the lines say (the policy
# table's reduce_tree_max says why).
REDUCE_TREE_MAX = default("reduce_tree_max")


def best(costs, n: int, nbytes: int) -> str:
    """What algorithm="auto" runs for an all_reduce of `nbytes` on `n` host ranks."""
    if n <= 1:
        return "ring"
    rd, hd = auto_limits(costs, n)
    return "recursive_doubling" if nbytes <= rd else "halving_doubling" if nbytes <= hd else "ring"


def crossover_table(costs, ns=range(2, 65)) -> list[dict]:
    """Per n: the byte limits of recursive doubling and halving-doubling.
    `costs`: constants, or a function n -> constants (``costs_for``'s
    answer for each world size)."""
    rows = []
    for n in ns:
        c = costs(n) if callable(costs) else costs
        rd, hd = auto_limits(c, n)
        rows.append({"n": n, "recursive_doubling_max": rd, "halving_doubling_max": hd,
                     "measured_here": isinstance(c, Measured)})
    return rows


def fit(rows) -> Costs:
    """Least-squares alpha, beta, gamma (all >= 0) from measurements
    ``{"algorithm", "n", "bytes", "seconds"}`` of any algorithms. Residuals
    are relative (each row divided by its time), so microseconds and 100 ms
    weigh alike."""
    a = np.array([[float(x) for x in terms(r["algorithm"], r["n"], r["bytes"])] for r in rows])
    t = np.array([r["seconds"] for r in rows], dtype=float)
    if len(t) < 3:
        raise ValueError("fit needs at least three measurements")
    w = 1.0 / t
    aw, tw = a * w[:, None], t * w
    best_sol, best_res = np.zeros(3), math.inf
    for k in (3, 2, 1):  # non-negative least squares over the few subsets (exact for 3 unknowns)
        for cols in itertools.combinations(range(3), k):
            sol, *_ = np.linalg.lstsq(aw[:, cols], tw, rcond=None)
            if np.any(sol < 0):
                continue
            full = np.zeros(3)
            full[list(cols)] = sol
            res = float(np.sum((aw @ full - tw) ** 2))
            if res < best_res:
                best_sol, best_res = full, res
    return Costs(*map(float, best_sol))


def _transport_key(label: str) -> str:
    # UCX between processes has no measured constants of its own yet: MPI's
    # (both move messages between processes) are the nearer guess.
    return "mpi" if label.startswith(("mpi", "ucx")) else "inproc"


def _costs(d) -> Costs:
    """Costs from a dict of the tune file; ValueError unless finite and >= 0
    (a damaged or hand-edited file is not a model to choose by)."""
    vals = {k: float(d[k]) for k in ("alpha", "beta", "gamma")}
    if not all(math.isfinite(v) and v >= 0 for v in vals.values()):
        raise ValueError("constants must be finite and >= 0")
    return Costs(**vals)


def costs_for(label: str, n: int | None = None):
    """What auto chooses by on a communicator of this kind ("mpi",
    "inproc"...) and size: the times ``ringcomm tune`` measured on `n`
    ranks if it did, else its fitted constants, else the defaults."""
    key = _transport_key(label)
    try:
        with open(tune_path()) as f:
            entry = json.load(f)[key]
        shared = _costs(entry)
    except (OSError, KeyError, ValueError, TypeError, AttributeError):
        return DEFAULTS[key]
    if n is not None and n > 1:
        try:
            return Measured.from_rows(entry.get("rows") or [], int(n))
        except (KeyError, ValueError, TypeError):
            pass  # not measured on n ranks (or damaged): the constants
    return shared


def save(key: str, costs: Costs, extra: dict | None = None) -> str:
    """Write `costs` and `extra` (tune's rows: what ``Measured`` is read
    from) for transport `key`, keeping the other transports' entries."""
    return save_entry(key, dict(asdict(costs), **(extra or {})))


def save_entry(key: str, entry: dict) -> str:
    """Write `entry` under `key` in the tune file, keeping the other keys."""
    path = tune_path()
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    doc[key] = entry
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return path

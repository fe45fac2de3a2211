"""The alpha-beta (latency-bandwidth) cost model of ring collectives.

A ring collective over n ranks is a sequence of steps; each step costs a
fixed latency alpha (message start-up, synchronisation) plus beta per byte
moved. For a buffer of B bytes:

    all_reduce      T = 2(n-1) * alpha + 2(n-1)/n * B * beta
    reduce_scatter  T =  (n-1) * alpha +  (n-1)/n * B * beta
    all_gather      T =  (n-1) * alpha +  (n-1)/n * B * beta

The bandwidth term is the same for every n (about 2B for all_reduce), the
latency term grows linearly with n: for small buffers or many ranks latency
wins. ``fit`` estimates alpha and beta from measured times; ``crossover``
gives the buffer size where both terms are equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["steps", "volume_factor", "Model", "fit", "crossover_bytes"]


def steps(collective: str, n: int) -> int:
    """Number of sequential ring steps."""
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("reduce_scatter", "all_gather"):
        return n - 1
    raise ValueError(f"no ring cost model for {collective!r}")


def volume_factor(collective: str, n: int) -> float:
    """Bytes each rank sends, as a fraction of the full buffer (also the
    nccl-tests 'busbw' factor)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather"):
        return (n - 1) / n
    raise ValueError(f"no ring cost model for {collective!r}")


@dataclass(frozen=True)
class Model:
    alpha: float  # seconds per step
    beta: float   # seconds per byte sent by one rank

    def predict(self, collective: str, n: int, nbytes) -> np.ndarray:
        """Predicted time (seconds) of `collective` on n ranks for buffers of nbytes."""
        nbytes = np.asarray(nbytes, dtype=float)
        return steps(collective, n) * self.alpha + volume_factor(collective, n) * nbytes * self.beta

    @property
    def bandwidth(self) -> float:
        """1/beta in bytes per second: the link bandwidth the model sees."""
        return float("inf") if self.beta == 0 else 1.0 / self.beta


def fit(collective: str, n, nbytes, seconds) -> Model:
    """Least-squares fit of alpha and beta (both >= 0) to measured times.

    `n` is one world size or one per measurement (then sizes may be fixed and
    n vary, as in ``ringcomm demo scaling``). Residuals are relative (each row
    divided by its time), so microsecond latencies and 100 ms transfers weigh
    alike.
    """
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    ns = np.broadcast_to(np.asarray(n), t.shape)
    b = np.broadcast_to(b, t.shape)
    if t.size < 2:
        raise ValueError("fit needs at least two measurements")
    if np.all(ns == 1):
        return Model(0.0, 0.0)
    a = np.stack([np.array([steps(collective, int(k)) for k in ns], float),
                  np.array([volume_factor(collective, int(k)) for k in ns]) * b], axis=1)
    w = 1.0 / t
    sol, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    alpha, beta = float(sol[0]), float(sol[1])
    if alpha < 0:  # refit with alpha = 0
        beta = float(np.sum(w * w * a[:, 1] * t) / np.sum(w * w * a[:, 1] ** 2))
        alpha = 0.0
    if beta < 0:
        alpha = float(np.sum(w * w * a[:, 0] * t) / np.sum(w * w * a[:, 0] ** 2))
        beta = 0.0
    return Model(alpha, beta)


def crossover_bytes(model: Model, collective: str, n: int) -> float:
    """Buffer size at which the latency and bandwidth terms are equal."""
    if model.beta == 0:
        return float("inf")
    return steps(collective, n) * model.alpha / (volume_factor(collective, n) * model.beta)

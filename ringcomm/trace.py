"""Step traces of the ring, recorded by the engine itself (``comm.trace()``).

Each record is one ring step on one rank: the phase (reduce-scatter,
all-gather, ...), the step index, which chunk went to which peer, which chunk
came from which peer, the bytes, start and end times (steady clock, ns) and,
with ``values=True``, the values the step produced (the partial result just
reduced, or the chunk just received).

    with comm.trace(values=True) as t:
        comm.all_reduce(x)
    print(t.table())
    ringcomm.trace.to_chrome([t0, t1, ...], "ring.json")   # one track per rank; open in Perfetto

``merge_chrome_traces`` joins Chrome traces written per rank (by
``GradBucketer.export_chrome_trace``, for example) into one file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from . import vocab

__all__ = ["Trace", "Step", "PHASES", "to_chrome", "table", "merge", "merge_chrome_traces"]

PHASES = ("reduce-scatter", "all-gather", "broadcast", "gather", "scatter", "fold", "exchange", "unfold")  # csrc/core/trace.h order


@dataclass(frozen=True)
class Step:
    seq: int
    collective: str
    phase: str
    step: int
    rank: int
    send_peer: int | None
    send_chunk: int | None
    send_bytes: int
    recv_peer: int | None
    recv_chunk: int | None
    recv_bytes: int
    t_start_ns: int
    t_end_ns: int
    values: np.ndarray | None

    @property
    def duration_us(self) -> float:
        return (self.t_end_ns - self.t_start_ns) / 1e3


class Trace:
    """The steps one rank recorded while the trace was active."""

    def __init__(self, comm, values: bool):
        self.rank = comm.rank
        self.nranks = comm.size
        self._values = values
        self.steps: list[Step] = []

    def _add(self, raw: list[dict]) -> None:
        for d in raw:
            none = lambda v: None if v < 0 else v  # noqa: E731
            vals = None
            if d["values"]:
                dt = vocab.NUMPY[d["dtype"]]
                vals = np.frombuffer(d["values"], dtype=dt).copy()
            self.steps.append(Step(d["seq"], d["collective"], PHASES[d["phase"]], d["step"], d["rank"],
                                   none(d["send_peer"]), none(d["send_chunk"]), d["send_bytes"],
                                   none(d["recv_peer"]), none(d["recv_chunk"]), d["recv_bytes"],
                                   d["t_start_ns"], d["t_end_ns"], vals))

    def table(self) -> str:
        return table([self])

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)


def merge(traces) -> list[Step]:
    """All steps of several ranks' traces, ordered by (seq, phase order, step, rank)."""
    steps = [s for t in traces for s in t.steps]
    return sorted(steps, key=lambda s: (s.seq, s.t_start_ns if s.phase not in PHASES[:2] else 0,
                                        PHASES.index(s.phase), s.step, s.rank))


def table(traces) -> str:
    """A plain-text table of the steps of one or more ranks."""
    lines = [f"{'seq':>4} {'collective':<14} {'phase':<14} {'step':>4} {'rank':>4}  "
             f"{'sends':<18} {'receives':<20} {'bytes':>9} {'us':>8}"]
    for s in merge(traces):
        snd = f"chunk {s.send_chunk} -> r{s.send_peer}" if s.send_peer is not None and s.send_chunk is not None \
            else (f"buffer -> r{s.send_peer}" if s.send_peer is not None else "-")
        rcv = f"chunk {s.recv_chunk} <- r{s.recv_peer}" if s.recv_peer is not None and s.recv_chunk is not None \
            else (f"buffer <- r{s.recv_peer}" if s.recv_peer is not None else "-")
        lines.append(f"{s.seq:>4} {s.collective:<14} {s.phase:<14} {s.step:>4} {s.rank:>4}  {snd:<18} {rcv:<20} "
                     f"{s.send_bytes:>9} {s.duration_us:8.1f}")
    return "\n".join(lines)


def to_chrome(traces, path: str | None = None) -> dict:
    """Chrome trace JSON (opens in Perfetto / chrome://tracing): one track per rank,
    one slice per step. Written to `path` when given; returned either way."""
    steps = [s for t in traces for s in t.steps]
    t0 = min((s.t_start_ns for s in steps), default=0)
    events = []
    ranks = sorted({t.rank for t in traces})
    for r in ranks:
        events.append({"name": "process_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
    for s in steps:
        events.append({
            "name": f"{s.phase} step {s.step}", "cat": s.collective, "ph": "X", "pid": 0, "tid": s.rank,
            "ts": (s.t_start_ns - t0) / 1e3, "dur": max((s.t_end_ns - s.t_start_ns) / 1e3, 0.001),
            "args": {"seq": s.seq, "send": f"chunk {s.send_chunk} to rank {s.send_peer}",
                     "recv": f"chunk {s.recv_chunk} from rank {s.recv_peer}",
                     "send_bytes": s.send_bytes, "recv_bytes": s.recv_bytes}})
    doc = {"traceEvents": events, "displayTimeUnit": "ns"}
    if path:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc


def merge_chrome_traces(traces, path: str | None = None) -> dict:
    """Merge per-rank Chrome traces (dicts or file paths) into one; write it to `path` if given."""
    events = []
    for t in traces:
        if isinstance(t, str):
            with open(t) as f:
                t = json.load(f)
        events += t["traceEvents"]
    merged = {"traceEvents": events, "displayTimeUnit": "ms"}
    if path is not None:
        with open(path, "w") as f:
            json.dump(merged, f)
    return merged

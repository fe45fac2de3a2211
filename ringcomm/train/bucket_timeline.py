"""GradBucketer's timeline: when each bucket's all_reduce was launched and
seen complete, per iteration, and the same as a Chrome trace; a part of
``GradBucketer`` (bucketer.py), kept in a file of its own."""

from __future__ import annotations

import json
import time

from .. import vocab

__all__ = ["Timeline"]


class Timeline:
    """GradBucketer's timeline methods (they use its _events, _buckets,
    _iteration, _record_timeline and _comm)."""

    def timeline(self) -> list[dict]:
        """Recorded bucket all_reduces: dicts with iteration, bucket, launch and
        complete (time.perf_counter() seconds), bytes, dtype, params, status;
        plus one ``kind="finalize"`` entry per iteration (start, end of finalize).

        "launch" is when the all_reduce was submitted. "complete" is when the
        bucketer first *observed* it complete: at a later mark_ready() poll or
        when finalize() waited on it, so it is an upper bound of the true
        completion time, tight for the buckets finalize() waits on.
        """
        return list(self._events)

    def chrome_trace(self) -> dict:
        """The timeline as a Chrome trace (``{"traceEvents": [...]}``; opens in
        Perfetto / chrome://tracing). pid is the rank; timestamps are
        perf_counter microseconds (CLOCK_MONOTONIC, comparable across processes
        of one host)."""
        rank = self._comm.rank
        ev = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
              {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "trainer (finalize)"}},
              {"name": "thread_name", "ph": "M", "pid": rank, "tid": 1, "args": {"name": "bucket all_reduce"}}]
        for e in self._events:
            if e["kind"] == "finalize":
                ev.append({"name": f"finalize it{e['iteration']}", "ph": "X", "pid": rank, "tid": 0,
                           "ts": e["start"] * 1e6, "dur": (e["end"] - e["start"]) * 1e6,
                           "args": {"iteration": e["iteration"]}})
            else:
                ev.append({"name": f"bucket {e['bucket']}", "ph": "X", "pid": rank, "tid": 1,
                           "ts": e["launch"] * 1e6, "dur": (e["complete"] - e["launch"]) * 1e6,
                           "args": {k: e[k] for k in ("iteration", "bytes", "dtype", "params", "status")}})
        return {"traceEvents": ev, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str) -> None:
        """Write chrome_trace() as JSON to `path` (one file per rank; see merge_chrome_traces)."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)

    def _record_iteration(self, t0: float) -> None:
        if not self._record_timeline:
            return
        it = self._iteration
        for b in self._buckets:
            if b.work is None:
                continue
            self._events.append({
                "kind": "bucket", "iteration": it, "bucket": b.index, "launch": b.launch_t,
                "complete": b.complete_t if b.complete_t is not None else time.perf_counter(),
                "bytes": (b.count + 1) * vocab.itemsize(b.key[1]), "dtype": b.key[1],
                "params": len(b.params), "status": b.status})
        self._events.append({"kind": "finalize", "iteration": it, "start": t0, "end": time.perf_counter()})

"""Flight recorder dumps and their analysis (``ringcomm analyze DIR``).

Each communicator keeps its last K collectives (``RINGCOMM_FLIGHT_RECORDER``,
default 256): sequence number, call, state (queued, running, done, failed),
wall-clock issue/start/end times and, for a running or failed one, where it
is: phase, step, segment, the peer it waits for and bytes moved so far
(``Communicator.flight_record()``). With ``RINGCOMM_DUMP_ON_ERROR=DIR`` every
rank writes its record to ``DIR`` at its communicator's first error, one JSON
file per rank (a directory every rank can reach: the dumps of a ring are
gathered there, whichever ranks could still write). :func:`analyze` reads
them and says, in one paragraph, which rank is behind, on which call, and what
every other rank was waiting for.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

__all__ = ["dump", "load", "analyze"]

FORMAT = "ringcomm-flight-record/1"


def dump(directory: str, *, rank: int, size: int, label: str, index: int, records: list[dict],
         error: BaseException | None) -> str:
    """Write one rank's record to ``directory``; returns the file's path."""
    os.makedirs(directory, exist_ok=True)
    doc = {
        "format": FORMAT,
        "communicator": f"{label}#{index}",
        "rank": rank,
        "size": size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "written_at": time.time(),
        "error": None if error is None else {
            "type": type(error).__name__,
            "message": str(error),
            "peer": getattr(error, "peer", None),
            "seq": getattr(error, "seq", None),
            "origin": getattr(error, "origin", None),
            "cause": getattr(error, "cause", None),
        },
        "records": records,
    }
    path = os.path.join(directory, f"{label}-{index}-rank{rank}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def load(directory: str) -> dict[str, dict[int, dict]]:
    """The dumps in ``directory``: {communicator: {rank: dump}}."""
    out: dict[str, dict[int, dict]] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if doc.get("format") != FORMAT:
            continue
        out.setdefault(doc["communicator"], {})[int(doc["rank"])] = doc
    return out


P2P = ("send", "recv")  # point-to-point records: their own ids, `peer` and `tag`, no call order across ranks


def _call(r: dict) -> str:
    args = [f"count={r['count']}"] if r["collective"] != "barrier" else []
    if r.get("dtype"):
        args.append(r["dtype"])
    if r.get("op"):
        args.append(r["op"])
    if r.get("root") is not None:
        args.append(f"root={r['root']}")
    if r["collective"] in P2P:
        args.append(f"peer={'any' if r.get('peer') is None else r['peer']}")
        args.append(f"tag={r.get('tag')}")
    algo = f" [{r['algorithm']}]" if r.get("algorithm") not in (None, "ring") else ""
    return f"#{r['seq']} {r['collective']}({', '.join(args)}){algo}"


def _where(r: dict) -> str:
    if r.get("waiting_for") is None:
        return ""
    what = r.get("waiting_what") or "a message"
    pos = []
    if r.get("phase"):
        pos.append(r["phase"].replace("_", "-"))
    if r.get("step") is not None:
        pos.append(f"step {r['step']}")
    if r.get("segment") is not None:
        pos.append(f"segment {r['segment']}")
    where = f" ({', '.join(pos)})" if pos else ""
    verb = "to send" if r["waiting_to"] == "receive" else "to take"  # what the peer has not done
    return f"waiting for rank {r['waiting_for']} {verb} {what}{where}"


def _analyze_one(name: str, dumps: dict[int, dict]) -> str:
    # Sequence numbers order the collectives, which every rank calls alike;
    # point-to-point ops (numbered apart, on two ranks only) are listed aside.
    p2p_open = [(r, x) for r, d in sorted(dumps.items()) for x in d["records"]
                if x["collective"] in P2P and x["state"] == "running"]
    dumps = {r: dict(d, records=[x for x in d["records"] if x["collective"] not in P2P]) for r, d in dumps.items()}
    text = _analyze_collectives(name, dumps)
    if p2p_open:
        text += " Point-to-point still waiting: " + "; ".join(f"rank {r}: {_call(x)}" for r, x in p2p_open) + "."
    return text


def _analyze_collectives(name: str, dumps: dict[int, dict]) -> str:
    size = max(d["size"] for d in dumps.values())
    ranks = sorted(dumps)
    missing = [r for r in range(size) if r not in dumps]
    last = {r: (dumps[r]["records"][-1] if dumps[r]["records"] else None) for r in ranks}
    newest = max((rec["seq"] for rec in last.values() if rec), default=0)
    parts = [f"Communicator {name}, {size} rank(s); dumps from rank(s) {', '.join(map(str, ranks))}"
             + (f"; none from rank(s) {', '.join(map(str, missing))}" if missing else "") + "."]
    if newest == 0:
        return " ".join(parts + ["No collective was recorded."])
    a = _Newest(dumps, size, missing, last, newest)
    parts.append(a.behind_text())
    parts.append("Per rank, for " + a.call.split(" ")[0] + ": "
                 + "; ".join(a.rank_line(r) for r in ranks if a.at[r] is not None) + ".")
    chains = a.chains()
    if chains:
        parts.append("Waits: " + "; ".join(chains) + " (a -> b: a waits for b).")
    return " ".join(parts)


class _Newest:
    """The ranks' records of the newest collective any of them issued."""

    def __init__(self, dumps: dict, size: int, missing: list, last: dict, newest: int):
        self.dumps, self.size, self.missing, self.last, self.newest = dumps, size, missing, last, newest
        self.ranks = sorted(dumps)
        self.at = {r: self.rec_of(r, newest) for r in self.ranks}
        self.t0 = min(x["t_issue"] for x in self.at.values() if x)
        self.call = _call(next(x for x in self.at.values() if x))

    def rec_of(self, r: int, seq: int) -> dict | None:
        return next((x for x in self.dumps[r]["records"] if x["seq"] == seq), None)

    def rel(self, t: float | None) -> str:
        return "?" if t is None else f"{t - self.t0:+.2f} s"

    def behind(self) -> tuple[list[int], str]:
        """Who is behind: ranks that never issued the newest call, else the
        one that issued it last, if that was after another rank had already
        given up on it; and ranks without a dump that others were waiting
        for. (Those ranks, and how late the late one was.)"""
        at, newest = self.at, self.newest
        behind = [r for r in self.ranks if at[r] is None]
        failed_end = [x["t_end"] for x in at.values() if x and x["state"] == "failed" and x["t_end"]]
        late_note = ""
        if not behind and failed_end:
            latest = max((r for r in self.ranks if at[r]), key=lambda r: at[r]["t_issue"])
            if at[latest]["t_issue"] > min(failed_end):
                behind = [latest]
                late_note = (f"; it issued {'#' + str(newest)} only at {self.rel(at[latest]['t_issue'])}, "
                             f"{at[latest]['t_issue'] - min(failed_end):.2f} s after the first rank had given up on it")
        waited = {x["waiting_for"] for x in at.values() if x and x.get("waiting_for") is not None}
        behind += [r for r in self.missing if r in waited and r not in behind]
        return behind, late_note

    def behind_text(self) -> str:
        behind, late_note = self.behind()
        if not behind:
            return f"Every rank that wrote a dump reached {self.call}; nobody is behind."
        who = [self._who(r, late_note) for r in behind]
        return f"Behind: {'; '.join(who)}. The call in question is {self.call}, first issued at +0.00 s."

    def _who(self, r: int, late_note: str) -> str:
        if r in self.missing:
            return f"rank {r} (no dump: killed, hung, or still running)"
        at = self.at[r]
        prev = self.last[r] if at is None else self.rec_of(r, self.newest - 1)
        seen = (f"its previous collective {_call(prev)} {prev['state']} at "
                f"{self.rel(prev['t_end'] or prev['t_issue'])}" if prev else "it recorded nothing before")
        return f"rank {r} ({seen}{late_note if at else '; it never issued ' + self.call.split(' ')[0]})"

    def rank_line(self, r: int) -> str:
        x = self.at[r]
        state = x["state"]
        desc = f"rank {r}: issued at {self.rel(x['t_issue'])}, {state}"
        if x.get("t_end") and state in ("failed", "done"):
            desc += f" at {self.rel(x['t_end'])}"
        where = _where(x)
        if where:
            desc += f", {where}"
        moved = x.get("bytes_sent", 0) + x.get("bytes_received", 0)
        desc += f", {x.get('bytes_sent', 0)} B sent / {x.get('bytes_received', 0)} B received" if moved else ""
        return desc + _raised(self.dumps[r].get("error") or {}, r)

    def chains(self) -> list[str]:
        """The chains of waits, each ending at the rank holding the others up."""
        chains = []
        for r in self.ranks:
            seen, cur = [r], r
            while cur in self.dumps and self.at.get(cur) and self.at[cur].get("waiting_for") is not None \
                    and len(seen) <= self.size:
                cur = self.at[cur]["waiting_for"]
                if cur in seen:
                    break
                seen.append(cur)
            if len(seen) > 2:
                chains.append(" -> ".join(map(str, seen)))
        return chains


def _raised(err: dict, r: int) -> str:
    """What rank r's dump says it raised ("" if nothing)."""
    if not err:
        return ""
    cause, origin = err.get("cause"), err.get("origin")
    desc = f"; raised {err['type']}"
    if origin is not None and origin != r:
        desc += f" (rank {origin}'s {cause})" if cause else f" (from rank {origin})"
    return desc


def analyze(directory: str) -> str:
    """One paragraph per communicator with dumps in ``directory``."""
    groups = load(directory)
    if not groups:
        return f"no ringcomm flight-record dumps in {directory}"
    return "\n\n".join(_analyze_one(name, dumps) for name, dumps in sorted(groups.items()))


def records_with_rank(records: list[dict[str, Any]], rank: int) -> list[dict[str, Any]]:
    for r in records:
        r["rank"] = rank
    return records

"""Teaching demos of the rooted and personalized collectives on in-process
ranks (``ringcomm demo ...``):

    ringcomm demo all_to_all [-n 4] [--count 2]          who sends which block to whom
    ringcomm demo reduce     [-n 4] [--count 8] [--root 0]  binomial tree next to the ring

As in ``demo ring``, every number printed comes from the engine: the steps
from its trace (``comm.trace``), the bytes from its ledger, set beside the
closed forms of ``traffic.expected``.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import run_local, traffic

ITEM = 8  # int64


# ---------------------------------------------------------------------------
# demo all_to_all

def a2a_data(rank: int, n: int, block: int) -> np.ndarray:
    """Block p of rank r holds 10*r + p when n <= 10 (100*r + p above):
    the value names the sender and the receiver."""
    base = 10 if n <= 10 else 100
    return np.repeat(base * rank + np.arange(n), block).astype(np.int64)


def record_all_to_all(n: int, block: int):
    """One all_to_all of `block` int64 per peer on n in-process ranks, traced.
    Returns per rank (input, output, Trace, Traffic)."""
    def body(comm):
        x = a2a_data(comm.rank, n, block)
        comm.reset_traffic()
        with comm.trace(values=True) as t:
            y = comm.all_to_all(x)
        return x, y, t, comm.traffic()
    return run_local(n, body)


def print_all_to_all(n: int, block: int, out=None) -> dict:
    res = record_all_to_all(n, block)
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    base = 10 if n <= 10 else 100
    count = n * block
    p(f"all_to_all on {n} ranks, {block} int64 per block ({count} per rank); block p of rank r holds "
      f"{base}*r + p: 'from r, for p'")
    w = max(5, len(str(base * (n - 1) + n - 1)) + 2)
    p("\ninput: row = rank, column p = the block it sends to rank p")
    p(f"  {'rank':>4} " + "".join(f"{'->' + str(q):>{w}}" for q in range(n)))
    for r, (x, *_rest) in enumerate(res):
        p(f"  {r:>4} " + "".join(f"{int(x[q * block]):>{w}}" for q in range(n)))
    rule = "rank r XOR k, both ways (N a power of two)" if n & (n - 1) == 0 else "to rank r+k, from rank r-k"
    p(f"\npairwise exchange: {n - 1} steps; at step k rank r sends its block for its partner and receives the "
      f"partner's block for r, partner: {rule} (the engine's trace; its own block is a local copy)")
    _print_a2a_steps(res, p)
    ok = _print_a2a_output(res, n, block, w, p)
    p(f"\nbytes rank r sent to each peer (ledger), and traffic.expected('all_to_all', {count}, 'int64', {n}, r):")
    p(f"  {'rank':>4} " + "".join(f"{'->' + str(q):>8}" for q in range(n)) + f" {'sent B':>8} {'received B':>11}"
      f" {'expected sent':>14} {'expected received':>18}")
    ledger = [_a2a_ledger_row(led, r, n, count, p) for r, (_, _, _, led) in enumerate(res)]
    p(f"every rank sends (N-1)/N of its buffer: {n - 1}/{n} x {count * ITEM} = {(n - 1) * block * ITEM} B, "
      f"one block to each other rank (nothing to itself)")
    return {"results": res, "ledger": ledger, "equal": ok}


def _print_a2a_steps(res, p) -> None:
    steps = sorted({s.step for _, _, t, _ in res for s in t.steps})
    for k in steps:
        p(f" step {k + 1}:")
        for r, (_, _, t, _) in enumerate(res):
            for s in (s for s in t.steps if s.step == k):
                got = s.values.tolist()[:1] if s.values is not None and s.values.size else []
                p(f"   rank {r}: block ->{s.send_chunk} to rank {s.send_peer} ({s.send_bytes} B), "
                  f"from rank {s.recv_peer} ({s.recv_bytes} B): {got[0] if got else '-'}")


def _print_a2a_output(res, n: int, block: int, w: int, p) -> bool:
    """The output table; whether it is the input table transposed."""
    p("\noutput: row = rank, column q = the block received from rank q")
    p(f"  {'rank':>4} " + "".join(f"{'<-' + str(q):>{w}}" for q in range(n)))
    ok = True
    for r, (_, y, _, _) in enumerate(res):
        p(f"  {r:>4} " + "".join(f"{int(y[q * block]):>{w}}" for q in range(n)))
        want = np.concatenate([a2a_data(q, n, block)[r * block:(r + 1) * block] for q in range(n)])
        ok &= bool(np.array_equal(y, want))
    p(f"the output table is the input table transposed: {'equal' if ok else 'DIFFERENT'} (numpy reference)")
    return ok


def _a2a_ledger_row(led, r: int, n: int, count: int, p) -> dict:
    exp = traffic.expected("all_to_all", count, "int64", n, r)
    per = [led.bytes_sent("all_to_all", peer=q) for q in range(n)]
    row = {"per_peer": per, "sent": led.bytes_sent("all_to_all"), "received": led.bytes_received("all_to_all"),
           "expected_sent": exp.bytes_sent, "expected_received": exp.bytes_received,
           "expected_per_peer": [exp.sent.get(q, 0) for q in range(n)]}
    p(f"  {r:>4} " + "".join(f"{b:>8}" for b in per) + f" {row['sent']:>8} {row['received']:>11}"
      f" {row['expected_sent']:>14} {row['expected_received']:>18}")
    return row


# ---------------------------------------------------------------------------
# demo reduce

def reduce_data(rank: int, count: int) -> np.ndarray:
    """Rank r holds 10*r + i (as in ``demo ring``)."""
    return (10 * rank + np.arange(count)).astype(np.int64)


def record_reduce(n: int, count: int, root: int, algorithm: str):
    """One reduce (sum) on n in-process ranks, traced. Per rank: (result or None, Trace, Traffic)."""
    def body(comm):
        x = reduce_data(comm.rank, count)
        comm.reset_traffic()
        with comm.trace(values=True) as t:
            y = comm.reduce(x, root, "sum", out=np.zeros(count, np.int64), algorithm=algorithm)
        return y, t, comm.traffic()
    return run_local(n, body)


def _ledger_rows(res, n, count, root, algorithm) -> list[dict]:
    rows = []
    for r, (_, _, led) in enumerate(res):
        exp = traffic.expected("reduce", count, "int64", n, r, root=root, algorithm=algorithm)
        rows.append({"sent": led.bytes_sent("reduce"), "received": led.bytes_received("reduce"),
                     "expected_sent": exp.bytes_sent, "expected_received": exp.bytes_received,
                     "steps": len(res[r][1].steps)})
    return rows


def _print_tree_steps(tree, p) -> None:
    for k in sorted({s.step for _, t, _ in tree for s in t.steps}):
        p(f" step {k}:")
        for r, (_, t, _) in enumerate(tree):
            for s in (s for s in t.steps if s.step == k):
                if s.send_peer is not None:
                    p(f"   rank {r}: sends its partial sum to rank {s.send_peer} ({s.send_bytes} B) and is done")
                else:
                    vals = s.values.tolist() if s.values is not None else []
                    p(f"   rank {r}: receives from rank {s.recv_peer} ({s.recv_bytes} B); holds {vals}")


def _print_ring_phases(ring, p) -> None:
    for r, (_, t, _) in enumerate(ring):
        by_phase: dict = {}
        for s in t.steps:
            by_phase.setdefault(s.phase, []).append(s)
        p(f"   rank {r}: " + ("; ".join(f"{ph} {len(v)} step(s), sent {sum(s.send_bytes for s in v)} B, "
                                       f"received {sum(s.recv_bytes for s in v)} B" for ph, v in by_phase.items())
                                  or "nothing to exchange"))


def print_reduce(n: int, count: int, root: int = 0, out=None) -> dict:
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    tree = record_reduce(n, count, root, "binomial")
    ring = record_reduce(n, count, root, "ring")
    nbytes = count * ITEM
    want = sum(reduce_data(r, count) for r in range(n))
    p(f"reduce (sum) to rank {root} on {n} ranks, {count} int64 ({nbytes} B); rank r holds 10*r + i")
    p("\nbinomial tree (small buffers): relative rank v = r - root; at step k, v with bit k set sends its "
      "partial sum to v - 2^k and stops, the others add what v + 2^k sends")
    _print_tree_steps(tree, p)
    res_tree = tree[root][0]
    p(f"result on rank {root}: {res_tree.tolist()} "
      f"({'equal' if np.array_equal(res_tree, want) else 'DIFFERENT'} to numpy)")
    p(f"\nring (large buffers): the ring reduce-scatter ({n - 1} steps, chunk r ends on rank r), then every "
      f"rank sends its chunk to rank {root}")
    _print_ring_phases(ring, p)
    res_ring = ring[root][0]
    p(f"result on rank {root}: {res_ring.tolist()} "
      f"({'equal' if np.array_equal(res_ring, want) else 'DIFFERENT'} to numpy)")
    lt, lr = _ledger_rows(tree, n, count, root, "binomial"), _ledger_rows(ring, n, count, root, "ring")
    p("\nbytes per rank, measured by the ledger, beside traffic.expected('reduce', ...):")
    p(f"  {'':4} {'binomial tree':>46}   {'ring reduce-scatter + gather':>46}")
    p(f"  {'rank':>4}" + f" {'steps':>5} {'sent':>8} {'received':>9} {'exp sent':>9} {'exp recv':>9}" * 2)
    for r in range(n):
        p(f"  {r:>4}" + "".join(f" {d['steps']:>5} {d['sent']:>8} {d['received']:>9} {d['expected_sent']:>9} "
                                f"{d['expected_received']:>9}" for d in (lt[r], lr[r])))
    p(f"tree: ceil(log2 N) = {max(0, (n - 1).bit_length())} steps on rank {root}, every other rank sends the whole "
      f"{nbytes} B once; rank {root} receives {lt[root]['received']} B. ring: no rank sends more than about "
      f"{nbytes} B; rank {root} receives about 2(N-1)/N x {nbytes} = {2 * (n - 1) * nbytes / n:.0f} B")
    return {"tree": tree, "ring": ring, "ledger_tree": lt, "ledger_ring": lr,
            "equal": bool(np.array_equal(res_tree, want) and np.array_equal(res_ring, want))}

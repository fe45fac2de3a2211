"""Run under `ringcomm run` with Open MPI's pml monitoring on
(tests/test_monitoring.py): one kind of operation, in a few forms, then this
rank's ledger as one JSON line. One operation per job, so what Open MPI
counted is that operation's traffic alone.

    python monitored_ops.py OP COUNT ITERS

OP (rank-dependent data, results checked against numpy; errors listed):
  reduce      COUNT float32 elements to root n-1, "binomial" then "ring"
  gather      to root 1 % n: equal blocks of COUNT, then counts = the split rule of n*COUNT+n-1
  scatter     from root 1 % n: the same two forms
  all_to_all  equal blocks of COUNT, then uneven splits (some empty): rank q sends
              splits[q][p] = (q + 2p) % 3 * COUNT // 2 + q elements to rank p
  send_recv   isend/irecv around the ring (COUNT elements to r+1), then blocking
              send/recv of COUNT+r elements to r-1, tag 5 (rank 0 receives from any source)
Each form runs ITERS times. "forms" in the output lists them with the
arguments of traffic.expected that give each one's closed form. The
algorithms are the message ones (linear, pairwise): in the shared-memory
window Open MPI carries nothing to compare with.
"""

import json
import sys

import numpy as np

import ringcomm
from ringcomm import vocab

OP, COUNT, ITERS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
comm = ringcomm.init(timeout=60)
r, n = comm.rank, comm.size
errors: list = []
forms: list = []  # [collective, {expected kwargs}] per call


def data(rank, count, salt=0):
    """Rank-dependent values (small integers: float32 sums are exact)."""
    return ((np.arange(count) * 7 + 13 * rank + 5 * salt + 1) % 101).astype(np.float32)


def check(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        errors.append(f"rank {r}: {what}: shape {got.shape} != {want.shape}")
        return
    bad = np.flatnonzero(got != want)
    if bad.size:
        errors.append(f"rank {r}: {what}: {bad.size} wrong, first at index {bad[0]}: {got[bad[0]]} != {want[bad[0]]}")


for it in range(ITERS):
    if OP == "reduce":
        root = n - 1
        for alg in ("binomial", "ring"):
            x = data(r, COUNT, it)
            res = comm.reduce(x, root=root, algorithm=alg)
            if r == root:
                check(res, sum(data(q, COUNT, it) for q in range(n)), f"reduce {alg} iteration {it}")
            forms.append(["reduce", {"count": COUNT, "root": root, "algorithm": alg}])
    elif OP in ("gather", "scatter"):
        root = 1 % n
        for counts in (None, vocab.chunk_counts(n * COUNT + n - 1, n)):
            blocks = counts or [COUNT] * n
            offs = np.concatenate([[0], np.cumsum(blocks)])
            full = np.concatenate([data(q, blocks[q], it) for q in range(n)])
            if OP == "gather":
                res = comm.gather(data(r, blocks[r], it), root=root, counts=counts, algorithm="linear")
                if r == root:
                    check(res, full, f"gather counts={counts} iteration {it}")
            else:
                out = np.zeros(blocks[r], np.float32)
                res = comm.scatter(full if r == root else None, root=root, counts=counts, out=out,
                                   algorithm="linear")
                check(res, full[offs[r]:offs[r + 1]], f"scatter counts={counts} iteration {it}")
            forms.append([OP, {"count": int(offs[-1]), "root": root, "counts": counts}])
    elif OP == "all_to_all":
        for uneven in (False, True):
            splits = ([[(q + 2 * p) % 3 * COUNT // 2 + q for p in range(n)] for q in range(n)] if uneven
                      else [[COUNT] * n for _ in range(n)])  # uneven: rank 0 sends nothing to itself and to 3
            x = data(r, sum(splits[r]), it)
            res = comm.all_to_all(x, splits[r] if uneven else None, [splits[q][r] for q in range(n)] if uneven else None,
                                  algorithm="pairwise")
            # block r of rank q's input, for every q, in rank order
            want = np.concatenate([data(q, sum(splits[q]), it)[sum(splits[q][:r]):sum(splits[q][:r + 1])]
                                   for q in range(n)])
            check(res, want, f"all_to_all uneven={uneven} iteration {it}")
            forms.append(["all_to_all", {"count": n * COUNT, "splits": splits if uneven else None}])
    elif OP == "send_recv":
        right, left = (r + 1) % n, (r - 1) % n
        y = np.zeros(COUNT, np.float32)
        ws = comm.batch_isend_irecv([ringcomm.P2POp("irecv", y, left, 3),
                                     ringcomm.P2POp("isend", data(r, COUNT, it), right, 3)])
        for w in ws:
            w.wait()
        check(y, data(left, COUNT, it), f"ring isend/irecv iteration {it}")
        forms += [["send", {"count": COUNT, "root": right}], ["recv", {"count": COUNT, "root": left}]]
        # Blocking, the other way round: even ranks send first, odd ranks receive first.
        z = np.zeros(COUNT + right, np.float32)
        for step in ((0, 1) if r % 2 == 0 else (1, 0)):
            if step == 0:
                comm.send(data(r, COUNT + r, it + 1), left, tag=5)
            else:
                src = comm.recv(z, None if r == 0 else right, tag=5)
                if src != right:
                    errors.append(f"rank {r}: recv from any source returned {src}, expected {right}")
                check(z, data(right, COUNT + right, it + 1), f"blocking recv from {right} iteration {it}")
        forms += [["send", {"count": COUNT + r, "root": left}], ["recv", {"count": COUNT + right, "root": right}]]
    else:
        raise SystemExit(f"unknown op {OP!r}")

t = comm.traffic()
print("LEDGER " + json.dumps({
    "rank": r,
    "errors": errors,
    "forms": forms,
    "payload_sent": t.per_peer("bytes_sent", kind="payload"),
    "control_sent": t.per_peer("bytes_sent", kind="control"),
    "msgs_sent": t.per_peer("msgs_sent", kind="all"),
    "received": t.per_peer("bytes_received", kind="all"),
    "msgs_received": t.per_peer("msgs_received", kind="all"),
    "by_collective": {c: {"sent": t.per_peer("bytes_sent", c), "received": t.per_peer("bytes_received", c)}
                      for c in vocab.COLLECTIVES if t.msgs_sent(c, kind="all") or t.msgs_received(c, kind="all")},
}), flush=True)
comm.close()

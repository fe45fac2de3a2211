"""Traffic: what a collective must move (closed form) and what it did move (the ledger).

``expected(collective, count, dtype, n, rank)`` is derived from the ring
schedule on paper, independently of the native code, so comparing it with
the ledger checks the implementation. Under the split rule (chunk c has
count//n elements, plus one if c < count % n) rank r sends only to r+1 and
receives only from r-1:

================  ==========================  ==========================
collective        sent to r+1 (elements)      received from r-1
================  ==========================  ==========================
reduce_scatter    count - c[r]                count - c[r-1]
all_gather        count - c[r+1]              count - c[r]
all_reduce        both of the above, summed   both of the above, summed
broadcast         count (except root-1)       count (except root)
barrier           0                           0
================  ==========================  ==========================

The rooted collectives and all_to_all talk to other peers (see
``expected``'s docstring): reduce (binomial tree, or the ring's
reduce-scatter + the chunks to the root), gather and scatter (linear: each
block straight to or from the root), all_to_all (pairwise: block p of rank
r's input to rank p).

For count divisible by n this is (n-1)/n of the buffer per half, and
2(n-1)/n for all_reduce. (For all_gather, ``count`` is the gathered total.)

On shared memory (algorithm "shm", "shm_flat": csrc/algorithms/shm_*.cpp)
nothing is sent: a rank books as sent to j what j reads from its slot and
as received from j what it reads from j's. The direct all_reduce then moves
c[j] + c[r] elements each way per peer j, 2(n-1)/n of the buffer per rank
as the ring, but spread over every peer (``_shared``).

The other all_reduce algorithms (csrc/algorithms/recursive_doubling.cpp,
csrc/algorithms/halving_doubling.cpp) talk to other peers. With p = 2^floor(log2 n)
and rem = n - p, ranks below 2*rem fold: even rank r sends its buffer to
r+1 and gets the result back from it; the others have virtual rank v
(odd r < 2*rem: r//2, else r - rem) and run on p ranks, where virtual v is
real rank 2v+1 if v < rem, else v + rem:

* recursive doubling: at step k, the whole buffer to and from v XOR 2^k;
* halving-doubling, blocks b = 0..p-1 by the split rule over p: at step k
  of the halving, with m = p >> (k+1), the half of the current block range
  not holding block v goes to v XOR m and the partner's copy of the other
  half comes back; the doubling then sends the 2^k blocks of v's aligned
  group to v XOR 2^k and receives that rank's group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import algorithms, vocab
from ._native import core

__all__ = ["expected", "expected_hierarchical", "Expected", "Traffic", "COLLECTIVES"]

COLLECTIVES = tuple(vocab.COLLECTIVES)


@dataclass(frozen=True)
class Expected:
    """Payload bytes one rank must send and receive, per peer."""
    sent: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())


def expected(collective: str, count: int, dtype: str, n: int, rank: int, root: int = 0,
             algorithm: str = "ring", counts=None, splits=None, single_copy_min: int | None = None,
             segment_bytes: int = 0) -> Expected:
    """Exact payload bytes `rank` sends to / receives from each peer in one call.

    algorithm="naive" (all_reduce only): the master-centric scheme, where rank 0
    receives and sends the whole buffer once per other rank;
    "recursive_doubling" (all_reduce) and "halving_doubling" (all_reduce; its
    reduce_scatter and all_gather on a power-of-two n): see the module
    docstring. ``comm.last_algorithm`` says which one a call ran.

    send, recv: one message of `count` elements to / from the peer given as
    `root` (booked under the kinds "send" and "recv").

    reduce: algorithm "binomial" or "ring" (its reduce-scatter, then the
    chunks to the root); not symmetric: the root only receives (binomial)
    or receives more. gather, scatter: `count` is the total; `counts`, the
    per-rank counts when the call had them (else equal blocks of count // n);
    the root receives (gather) or sends (scatter) every other rank's block,
    the others send or receive their own once. all_to_all: `count` is one
    rank's input length (equal blocks of count // n), or `splits` the n x n
    matrix splits[q][p] of elements rank q sends to rank p.

    segment_bytes: the call's segment size, for a closed form that depends on
    it (a row whose form is "native"; 0: the communicator's default).

    single_copy_min: the window's single-copy limit (bytes), where the call
    ran in one (``comm._engine.window.single_copy_min``): reduce "shm" with
    chunks (count / n, rounded up) of at least that many bytes runs by
    single copy, in the parts of ``sc_reduce_parts``. None: the direct
    algorithm's chunks.
    """
    if collective not in vocab.COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for n={n}")
    size = _itemsize(dtype)
    if collective in vocab.P2P:
        return _p2p(collective, count, size, n, rank, root)
    if n == 1:
        return Expected()
    if (collective == "reduce" and algorithm == "shm" and single_copy_min is not None
            and vocab.chunk_count(count, n, 0) * size >= single_copy_min):
        return _sc_reduce(count, size, n, rank, root)
    # The table's row names its closed form (csrc/algorithms/registry.cpp):
    # "native" is the row's own, written next to its algorithm in C++
    # (_core.closed_form); the others are this module's functions (_FORMS).
    # Where the engine has no such row, the branches below say why.
    row = algorithms.row(collective, algorithm)
    form = row["traffic"] if row else None
    if form == "native":
        sent, received = core.closed_form(vocab.COLLECTIVES[collective], vocab.ALGORITHMS[algorithm], n, rank,
                                          count, size, segment_bytes)
        return Expected(dict(sent), dict(received))
    if form in _FORMS:
        return _FORMS[form](collective, count, size, n, rank, root, algorithm, counts, splits)
    if collective in _ROOTED:
        return _ROOTED[collective](count, size, n, rank, root, algorithm, counts, splits)
    if algorithm == "naive":
        return _naive(collective, count, size, n, rank)
    if algorithm in ("recursive_doubling", "halving_doubling"):
        return _pairwise(collective, count, size, n, rank, algorithm)
    if algorithm in ("shm", "shm_flat", "zero_copy"):
        return _shared(collective, count, size, n, rank, root, algorithm)
    if algorithm != "ring":
        raise ValueError(f"unknown algorithm {algorithm!r}")
    return _ring(collective, count, size, n, rank, root)


def _itemsize(dtype) -> int:
    return vocab.itemsize(str(np.dtype(dtype)) if dtype not in vocab.NUMPY else dtype)


def _p2p(collective: str, count: int, size: int, n: int, rank: int, root: int) -> Expected:
    """One message: `root` is the peer; a send books count elements sent to
    it, a receive as many received from it (under their own kinds)."""
    if not 0 <= root < n or root == rank:
        raise ValueError(f"{collective}: peer (root=) {root} must be another rank of 0..{n - 1}")
    e = Expected()
    nbytes = count * size
    if collective == "send":
        e.sent[root] = nbytes
    else:
        e.received[root] = nbytes
    return e


def _naive(collective: str, count: int, size: int, n: int, rank: int) -> Expected:
    """The master-centric all_reduce: rank 0 receives and sends the whole buffer once per other rank."""
    if collective != "all_reduce":
        raise ValueError("algorithm 'naive' exists for all_reduce only")
    nbytes = count * size
    if not nbytes:
        return Expected()
    if rank == 0:
        peers = {p: nbytes for p in range(1, n)}
        return Expected(dict(peers), dict(peers))
    return Expected({0: nbytes}, {0: nbytes})


# The ring, per collective: (elements sent to the right, received from the
# left) of rank r, c(i) being chunk i's count; broadcast passes the buffer on.
_RING = {
    "reduce_scatter": lambda c, count, r, n, hop: (count - c(r), count - c(r - 1)),
    "all_gather": lambda c, count, r, n, hop: (count - c(r + 1), count - c(r)),
    "all_reduce": lambda c, count, r, n, hop: ((count - c(r)) + (count - c(r + 1)),
                                               (count - c(r - 1)) + (count - c(r))),
    "broadcast": lambda c, count, r, n, hop: (count if hop < n - 1 else 0, count if hop > 0 else 0),
}


def _ring(collective: str, count: int, size: int, n: int, rank: int, root: int) -> Expected:
    left, right = (rank - 1) % n, (rank + 1) % n
    c = lambda i: vocab.chunk_count(count, n, i % n)  # noqa: E731
    form = _RING.get(collective)
    out, inn = form(c, count, rank, n, (rank - root) % n) if form else (0, 0)
    sent = {right: out * size} if out else {}
    received = {left: inn * size} if inn else {}
    return Expected(sent, received)


def expected_hierarchical(count: int, dtype: str, hosts: list, rank: int, between: str = "ring",
                          collective: str = "all_reduce") -> tuple[Expected, Expected]:
    """The hierarchical all_reduce, reduce_scatter or all_gather (ranks on
    several hosts, the same number on each): (intra, inter) for `rank`, by
    communicator rank. `hosts[q]` names rank q's host. Inside a host (its L
    ranks in rank order, local index l) the direct shm algorithm; between
    hosts (the ranks of local index l, one per host in the order hosts first
    appear) the same collective by the algorithm `between`
    (``comm.last_algorithm_between_hosts``), on chunk l of the L chunks
    (all_reduce), or on part l (reduce_scatter, all_gather): the chunks of
    the N that those ranks own (csrc/algorithms/shm_hierarchical.cpp)."""
    order = list(dict.fromkeys(hosts))
    layout = [[q for q in range(len(hosts)) if hosts[q] == h] for h in order]
    local = layout[order.index(hosts[rank])]
    L, li = len(local), local.index(rank)
    cross = [layout[h][li] for h in range(len(order))]
    if collective == "all_reduce":
        e = expected("all_reduce", count, dtype, L, li, algorithm="shm")
        intra = Expected({local[j]: b for j, b in e.sent.items()}, {local[j]: b for j, b in e.received.items()})
        # in pieces (the pipeline): piece p of this rank's chunk, each its own all_reduce between hosts
        chunk = vocab.chunk_count(count, L, li)
        P = core.hierarchical_pieces(count, L, _itemsize(dtype))
        parts = [chunk * (p + 1) // P - chunk * p // P for p in range(P)]
    elif collective in ("reduce_scatter", "all_gather"):
        intra, part = _hierarchical_halves(collective, count, _itemsize(dtype), hosts, layout, (local, li))
        parts = [part]
    else:
        raise ValueError(f"no hierarchical {collective}: all_reduce, reduce_scatter and all_gather only")
    sent: dict = {}
    received: dict = {}
    for part in parts:
        x = expected(collective, part, dtype, len(order), order.index(hosts[rank]), algorithm=between)
        for into, got in ((sent, x.sent), (received, x.received)):
            for j, b in got.items():
                into[cross[j]] = into.get(cross[j], 0) + b
    return intra, Expected(sent, received)


def _hierarchical_halves(collective: str, count: int, size: int, hosts: list, layout: list, here: tuple) -> tuple:
    """Inside a host, reduce_scatter's or all_gather's direct half over
    parts (local index j's part: the chunks of the N that the ranks of
    index j own), as _shared's over chunks; `here`: (this host's ranks, this
    rank's local index). Returns (intra, this rank's part)."""
    local, li = here
    L = len(local)
    parts = [sum(vocab.chunk_count(count, len(hosts), layout[h][j]) for h in range(len(layout))) for j in range(L)]
    theirs = {local[j]: parts[j] * size for j in range(L) if j != li and parts[j]}
    mine = {local[j]: parts[li] * size for j in range(L) if j != li and parts[li]}
    intra = Expected(theirs, mine) if collective == "reduce_scatter" else Expected(mine, theirs)
    return intra, parts[li]


def _shared(collective: str, count: int, size: int, n: int, rank: int, root: int, algorithm: str) -> Expected:
    """shm / shm_flat (csrc/algorithms/shm_*.cpp): nothing is sent; rank r books
    as sent to j what j reads from r's slot, and as received from j what it
    reads from j's. The direct all_reduce: j reads chunk j's part of r's
    input and r's reduced chunk r; the one-sync one: j reads all of r's
    input. reduce_scatter and all_gather are the direct one's halves; a
    broadcast's peers read the root's buffer."""
    if algorithm == "shm_flat" and collective != "all_reduce":
        raise ValueError("algorithm 'shm_flat' exists for all_reduce only")
    form = _shared_flat if algorithm == "shm_flat" else _SHARED.get(collective)
    if form is None:
        raise ValueError(f"algorithm 'shm' does not run {collective}")
    c = lambda i: vocab.chunk_count(count, n, i)  # noqa: E731
    return form(c, count, size, [j for j in range(n) if j != rank], rank, root)


def _both(both: dict) -> Expected:
    return Expected(both, dict(both))


def _shared_broadcast(c, count, size, peers, rank, root) -> Expected:
    if not count:
        return Expected()
    if rank == root:
        return Expected({j: count * size for j in peers}, {})
    return Expected({}, {root: count * size})


def _shared_flat(c, count, size, peers, rank, root) -> Expected:
    """shm_flat: every peer reads all of this rank's input."""
    return _both({j: count * size for j in peers if count})


# The window's collectives: what (c(i): chunk i's count) rank r books per peer.
_SHARED = {
    "all_reduce": lambda c, count, size, peers, r, root: _both(
        {j: (c(j) + c(r)) * size for j in peers if c(j) + c(r)}),
    "reduce_scatter": lambda c, count, size, peers, r, root: Expected(
        {j: c(j) * size for j in peers if c(j)}, {j: c(r) * size for j in peers if c(r)}),
    "all_gather": lambda c, count, size, peers, r, root: Expected(
        {j: c(r) * size for j in peers if c(r)}, {j: c(j) * size for j in peers if c(j)}),
    "broadcast": _shared_broadcast,
    "barrier": lambda c, count, size, peers, r, root: Expected(),
}


def _pairwise(collective: str, count: int, size: int, n: int, rank: int, algorithm: str) -> Expected:
    """recursive_doubling / halving_doubling: the schedule of the module docstring."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    if algorithm == "recursive_doubling" and collective != "all_reduce":
        raise ValueError("algorithm 'recursive_doubling' exists for all_reduce only")
    if collective not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(f"algorithm {algorithm!r} does not run {collective}")
    if collective != "all_reduce" and rem:
        raise ValueError(f"halving_doubling {collective} needs a power-of-two number of ranks, not {n}")
    sent: dict = {}
    received: dict = {}

    def move(peer: int, out_elems: int, in_elems: int) -> None:
        if out_elems:
            sent[peer] = sent.get(peer, 0) + out_elems * size
        if in_elems:
            received[peer] = received.get(peer, 0) + in_elems * size

    if rank < 2 * rem:  # fold and unfold: the whole buffer, once each way
        move(rank + 1 if rank % 2 == 0 else rank - 1, count, count)
        if rank % 2 == 0:
            return Expected(sent, received)
    v = rank // 2 if rank < 2 * rem else rank - rem

    def real(u: int) -> int:
        return 2 * u + 1 if u < rem else u + rem

    steps = p.bit_length() - 1
    if algorithm == "recursive_doubling":
        for k in range(steps):
            move(real(v ^ (1 << k)), count, count)
        return Expected(sent, received)

    start = [0] * (p + 1)  # split-rule block offsets
    for b in range(p):
        start[b + 1] = start[b] + vocab.chunk_count(count, p, b % p)
    elems = lambda lo, hi: start[hi] - start[lo]  # noqa: E731
    if collective in ("all_reduce", "reduce_scatter"):
        lo, hi = 0, p
        for k in range(steps):
            m, half = p >> (k + 1), (hi - lo) // 2
            keep, give = ((lo + half, hi), (lo, lo + half)) if v & m else ((lo, lo + half), (lo + half, hi))
            move(real(v ^ m), elems(*give), elems(*keep))
            lo, hi = keep
    if collective in ("all_reduce", "all_gather"):
        for k in range(steps):
            g = 1 << k
            mine, theirs = v & ~(g - 1), (v ^ g) & ~(g - 1)
            move(real(v ^ g), elems(mine, mine + g), elems(theirs, theirs + g))
    return Expected(sent, received)


def _reduce(count, size, n, rank, root, algorithm, counts, splits) -> Expected:
    """reduce: "binomial" (relative rank v = rank - root mod n; at step k,
    v with bit k set sends the whole buffer to v - 2^k and stops; v below
    it receives from v + 2^k when that is < n), "ring" (the ring
    reduce-scatter, then every chunk but the root's to the root), or "shm"
    (the window's direct reduce-scatter, then the same chunks to the root;
    from the window's single-copy limit the parts of sc_reduce_parts:
    ``expected``'s single_copy_min),
    or "shm_flat" (every other rank's whole input to the root).
    gather, scatter and all_to_all book the same bytes in the window ("shm")
    as linearly and pairwise."""
    if algorithm == "binomial":
        v = (rank - root) % n
        sent, received = {}, {}
        m = 1
        while m < n:
            if v & m:
                if count:
                    sent[(v - m + root) % n] = count * size
                break
            if v + m < n and count:
                received[(v + m + root) % n] = count * size
            m <<= 1
        return Expected(sent, received)
    if algorithm == "shm_flat":  # every other rank's whole input to the root
        if not count:
            return Expected()
        if rank != root:
            return Expected({root: count * size}, {})
        return Expected({}, {q: count * size for q in range(n) if q != root})
    if algorithm not in ("ring", "shm"):
        raise ValueError(f"reduce runs 'binomial', 'ring', 'shm' or 'shm_flat', not {algorithm!r}")
    rs = expected("reduce_scatter", count, "uint8", n, rank, algorithm=algorithm)  # elements (itemsize 1)
    sent = {p: b * size for p, b in rs.sent.items()}
    received = {p: b * size for p, b in rs.received.items()}
    if rank != root:
        c = vocab.chunk_count(count, n, rank)
        if c:
            sent[root] = sent.get(root, 0) + c * size
    else:
        for q in range(n):
            c = vocab.chunk_count(count, n, q)
            if q != root and c:
                received[q] = received.get(q, 0) + c * size
    return Expected(sent, received)


def sc_reduce_parts(count: int, n: int, root: int) -> list[int]:
    """The elements each rank reduces in the window's single-copy reduce, in
    rank order (csrc/algorithms/shm_rooted.cpp, ReduceParts): the root's part
    larger, as it writes nothing into a peer (root : leaf = 1.4(n-1) + 1 :
    1.4(n-1)), the leaves' split alike."""
    if n == 1:
        return [count]
    leaf = 7 * (n - 1)
    mine = leaf + 5
    at_root = count * mine // (mine + leaf * (n - 1))
    leaves = iter(vocab.chunk_counts(count - at_root, n - 1))
    return [at_root if q == root else next(leaves) for q in range(n)]


def _sc_reduce(count, size, n, rank, root) -> Expected:
    """reduce by single copy: rank r reads its part of every peer's input
    (each peer j reads part j of r's: booked as sent to j), and writes its
    reduced part into the root's output."""
    parts = sc_reduce_parts(count, n, root)
    sent = {q: parts[q] * size for q in range(n) if q != rank and parts[q]}
    received = {q: parts[rank] * size for q in range(n) if q != rank and parts[rank]}
    if rank != root:
        if parts[rank]:
            sent[root] = sent.get(root, 0) + parts[rank] * size
    else:
        for q in range(n):
            if q != root and parts[q]:
                received[q] = received.get(q, 0) + parts[q] * size
    return Expected(sent, received)


def _blocks(count, n, counts) -> list[int]:
    """Per-rank counts, or equal blocks of count // n (gather, scatter: `count` is the total)."""
    return list(counts) if counts is not None else [count // n] * n


def _gather(count, size, n, rank, root, algorithm, counts, splits) -> Expected:
    """gather (linear): rank q != root sends its block to the root, once."""
    b = _blocks(count, n, counts)
    if rank != root:
        return Expected({root: b[rank] * size} if b[rank] else {}, {})
    return Expected({}, {q: b[q] * size for q in range(n) if q != root and b[q]})


def _scatter(count, size, n, rank, root, algorithm, counts, splits) -> Expected:
    """scatter (linear): the root sends block q to rank q, once."""
    g = _gather(count, size, n, rank, root, algorithm, counts, splits)
    return Expected(g.received, g.sent)


def _all_to_all(count, size, n, rank, root, algorithm, counts, splits) -> Expected:
    """all_to_all (pairwise): block p of this rank's input to rank p, block q
    of its output from rank q. `splits`: the n x n matrix, splits[q][p] =
    elements rank q sends to rank p (None: equal blocks of count // n)."""
    if splits is None:
        splits = [[count // n] * n for _ in range(n)]
    sent = {p: splits[rank][p] * size for p in range(n) if p != rank and splits[rank][p]}
    received = {q: splits[q][rank] * size for q in range(n) if q != rank and splits[q][rank]}
    return Expected(sent, received)


_ROOTED = {"reduce": _reduce, "gather": _gather, "scatter": _scatter, "all_to_all": _all_to_all}
# The closed forms by the name a row of the table gives (its "traffic"), each
# called as (collective, count, size, n, rank, root, algorithm, counts, splits).
_FORMS = {
    "pairwise": lambda coll, count, size, n, rank, root, algo, counts, splits: _pairwise(coll, count, size, n, rank,
                                                                                           algo),
    "shared": lambda coll, count, size, n, rank, root, algo, counts, splits: _shared(coll, count, size, n, rank,
                                                                                       root, algo),
    **{name: (lambda f: lambda coll, *a: f(*a))(f) for name, f in _ROOTED.items()},
}


class Traffic:
    """A snapshot of a communicator's ledger (``comm.traffic()``).

    ``kind`` is "payload" (the user's data), "control" (ringcomm's headers and
    abort notices) or "all".
    """

    _FIELDS = {"bytes_sent": 0, "msgs_sent": 1, "bytes_received": 2, "msgs_received": 3}

    def __init__(self, table: np.ndarray, rank: int):
        self._t = table  # [collective, peer, (payload, control), field]
        self.rank = rank
        self.nranks = table.shape[1]

    def _get(self, fld: str, collective, peer, kind) -> int:
        t = self._t
        if collective is not None:
            t = t[vocab.COLLECTIVES[collective]][None]
        if peer is not None:
            t = t[:, peer][:, None]
        k = {"payload": [0], "control": [1], "all": [0, 1]}[kind]
        return int(t[:, :, k, self._FIELDS[fld]].sum())

    def bytes_sent(self, collective=None, peer=None, kind="payload") -> int:
        return self._get("bytes_sent", collective, peer, kind)

    def bytes_received(self, collective=None, peer=None, kind="payload") -> int:
        return self._get("bytes_received", collective, peer, kind)

    def msgs_sent(self, collective=None, peer=None, kind="payload") -> int:
        return self._get("msgs_sent", collective, peer, kind)

    def msgs_received(self, collective=None, peer=None, kind="payload") -> int:
        return self._get("msgs_received", collective, peer, kind)

    def per_peer(self, field_name="bytes_sent", collective=None, kind="payload") -> dict:
        """{peer: value} for peers with a non-zero value."""
        out = {}
        for p in range(self.nranks):
            v = self._get(field_name, collective, p, kind)
            if v:
                out[p] = v
        return out

    def to_dict(self) -> dict:
        """Nested plain data: {collective: {peer: {payload|control: {field: value}}}}."""
        d = {}
        for name, ci in vocab.COLLECTIVES.items():
            for p in range(self.nranks):
                for ki, kname in enumerate(("payload", "control")):
                    vals = {f: int(self._t[ci, p, ki, fi]) for f, fi in self._FIELDS.items()}
                    if any(vals.values()):
                        d.setdefault(name, {}).setdefault(p, {})[kname] = vals
        return d

    def __sub__(self, other: "Traffic") -> "Traffic":
        return Traffic(self._t - other._t, self.rank)

    def __str__(self) -> str:
        lines = [f"traffic of rank {self.rank} (bytes, messages)"]
        for name, peers in self.to_dict().items():
            for p, kinds in peers.items():
                for kname, v in kinds.items():
                    lines.append(f"  {name:<15} peer {p:<3} {kname:<8} sent {v['bytes_sent']:>12} B "
                                 f"{v['msgs_sent']:>6} msg  received {v['bytes_received']:>12} B "
                                 f"{v['msgs_received']:>6} msg")
        return "\n".join(lines)

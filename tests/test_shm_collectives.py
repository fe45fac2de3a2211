"""Shared memory between the ranks of one host, in process: the
collectives through the window (ringcomm/shm/, csrc/core/shm_window.h,
csrc/algorithms/shm_*.cpp).

In process, every world has a window, so algorithm="shm" / "shm_flat" run
the same native code the processes of one host run (the window is plain
memory instead of a segment). Every case checks exact results against numpy
(suite.py) and the ledger against traffic.expected. Split from the former
test_shm.py (shared helpers: tests/shm_helpers.py); over Open MPI:
tests/test_shm_processes.py, failures: tests/test_shm_faults.py, several
hosts: tests/test_shm_hierarchy.py, auto's limits and tune:
tests/test_shm_tuning.py.
"""

import os
import time

import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import CommunicatorAborted, InvalidArgument, MismatchError
from ringcomm import shm as shm_mod
from tiers import slow_except


def flat(results):
    return [e for errs in results for e in errs]


# ------------------------------------------------------------ in process
def cases(comm, algorithm, big):
    n = comm.size
    errs = suite.run_cases(comm, [0, 1, max(n - 1, 0), n + 1, 101, 7 * n + 3], algorithm=algorithm)
    if big:  # several rounds per call (a 256 KiB slot): the parity rotation
        errs += suite.run_cases(comm, [100003], suite.COMBOS[::3], algorithm=algorithm)
    errs += suite.run_broadcasts(comm, [0, 1, n + 1, 100003], dtypes=["float32", "int8", "bfloat16"],
                                 algorithm="shm")
    errs += suite.run_barrier(comm, algorithm="shm")
    return errs


@pytest.mark.parametrize("algorithm", ["shm", "shm_flat"])
@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], [1, 2, 3, 4, 5, 8, 13]))
def test_suite_in_process(n, algorithm):
    errs = flat(ringcomm.run_local(n, cases, algorithm, n in (2, 3, 5)))
    assert not errs, "\n".join(errs[:20])


FEW = [("float32", "sum"), ("int8", "prod"), ("float64", "avg"), ("int64", "max")]


@pytest.mark.parametrize("n", slow_except([1, 2, 3, 5], [1, 2, 3, 5, 8]))
def test_rooted_collectives_in_process(n):
    # reduce, gather, scatter (equal and per-rank counts, two roots) and
    # all_to_all in the window: results against numpy, the ledger per peer
    # equal to the closed form, the algorithm the one asked for
    import collectives_suite as cs
    errs = flat(ringcomm.run_local(n, lambda comm: cs.run_all(comm, [0, 1, max(n - 1, 0), n + 1, 101, 7 * n + 3],
                                                              FEW, algorithms="shm")))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 5, 8]))
def test_single_copy_in_process(n, monkeypatch):
    # Every block by single copy (limit 1 byte; in process a memcpy from or
    # into the peer's array): all_gather, gather and scatter (one array and
    # the root's list of arrays, equal and per-rank counts) and all_to_all
    # against numpy and the ledger's closed form, with the rest of the
    # window's collectives around them; a 4 KiB slot, so the slots' path
    # would book many pieces per peer where single copy books one.
    import collectives_suite as cs
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "1")
    monkeypatch.setenv("RINGCOMM_SHM_SLOT", "4096")

    def body(comm):
        assert comm._engine.window.single_copy_min == 1
        errs = cs.run_all(comm, [0, 1, max(n - 1, 0), n + 1, 101, 7 * n + 3, 4099], FEW, algorithms="shm")
        errs += cs.run_all_to_all_mixed(comm)  # per-peer blocks in the slot and by single copy
        errs += cases(comm, "shm", True)
        k = 3001  # elements per block: a whole block per peer in one piece
        x = ((np.arange(k * n) * 7 + 13 * comm.rank) % 1009).astype(np.float32)
        before = comm.traffic()
        got = comm.all_to_all(x, algorithm="shm")
        used = comm.traffic() - before
        want = np.concatenate([((np.arange(k * n) * 7 + 13 * q) % 1009).astype(np.float32)[comm.rank * k:(comm.rank + 1) * k]
                               for q in range(n)])
        errs += suite.compare(got, want, "all_to_all of 3001-element blocks", comm.rank)
        msgs = {p: m for p, m in used.per_peer("msgs_received", "all_to_all").items() if m}
        if msgs != {p: 1 for p in range(n) if p != comm.rank}:
            errs.append(f"rank {comm.rank}: single copy should read one block per peer, booked {msgs}")
        return errs
    errs = flat(ringcomm.run_local(n, body))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", slow_except([1, 2, 3], [1, 2, 3, 5]))
@pytest.mark.parametrize("single", ["off", "2048"])
def test_per_peer_all_to_all_through_the_slots_in_rounds(n, single, monkeypatch):
    # Per-peer blocks below the single-copy limit go through the slots, a
    # part of a 4 KiB slot per destination and round; the call's rounds are
    # those of the longest block between any two ranks, which only those two
    # know from their splits: the others count them from the tables of the
    # first round (a rank that counted fewer would leave its peers waiting).
    # Blocks of 0, 1, a part +-1, several parts and primes; with "2048" the
    # larger ones by single copy beside them. Against numpy and the ledger.
    import collectives_suite as cs
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", single)
    monkeypatch.setenv("RINGCOMM_SHM_SLOT", "4096")
    part = (4096 - (16 * n + 63) // 64 * 64) // n // 64 * 64  # bytes of one destination's piece per round
    sizes = [0, 1, part // 4 - 1, part // 4, part // 4 + 1, 3 * part // 4 + 1, 1009, 4099]  # (float32 elements)

    def body(comm):
        errs = []
        for shift in range(3):
            m = [[sizes[(3 * q + 5 * p + shift) % len(sizes)] for p in range(n)] for q in range(n)]
            if n > 2:  # one long block between ranks 0 and 1 only
                m[0][1] = 3 * part + 7
            for dtype in ("float32", "int8", "float64"):
                errs += cs.per_peer_case(comm, m, dtype, "shm", f"slot 4096 single copy {single}")
        before = comm.traffic()
        k = 5 * part // 8 + 1  # float32 elements per block: 2.5 parts and 4 bytes, 3 pieces by the slots
        x = ((np.arange(k * n) * 7 + 13 * comm.rank) % 1009).astype(np.float32)
        comm.all_to_all(x, [k] * n, [k] * n, algorithm="shm")
        msgs = {p: m for p, m in (comm.traffic() - before).per_peer("msgs_received", "all_to_all").items() if m}
        by_single = single != "off" and 4 * k >= int(single)
        want = {p: (1 if by_single else 3) for p in range(n) if p != comm.rank}
        if msgs != want:
            errs.append(f"rank {comm.rank}: blocks of {k * 4} bytes should be booked {want} messages, got {msgs}")
        return errs
    errs = flat(ringcomm.run_local(n, body, timeout=60))
    assert not errs, "\n".join(errs[:20])


def test_all_to_all_where_a_slot_cannot_hold_the_table(monkeypatch):
    # 47 ranks and 4 KiB slots: under 88 bytes per rank, no room for the
    # per-peer table (24 bytes per rank) and a part per rank beside it.
    # Equal blocks from the single-copy limit then take the slots' rounds
    # (they divided by a part of 0 bytes before); per-peer splits run
    # pairwise under auto and are refused by "shm", naming why.
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "1")
    monkeypatch.setenv("RINGCOMM_SHM_SLOT", "4096")
    n, k = 47, 5

    def body(comm):
        r = comm.rank
        x = (np.arange(k * n) * 7 + 13 * r).astype(np.float32)
        got = comm.all_to_all(x, algorithm="shm")
        want = np.concatenate([(np.arange(k * n) * 7 + 13 * q).astype(np.float32)[r * k:(r + 1) * k]
                               for q in range(n)])
        errs = suite.compare(got, want, "equal blocks, 47 ranks, 4 KiB slots", r)
        got = comm.all_to_all(x, [k] * n, [k] * n)
        errs += [] if comm.last_algorithm == "pairwise" else [f"rank {r}: per-peer ran {comm.last_algorithm}"]
        errs += suite.compare(got, want, "per-peer blocks, 47 ranks, 4 KiB slots", r)
        try:
            comm.all_to_all(x, [k] * n, [k] * n, algorithm="shm")
            errs.append(f"rank {r}: per-peer 'shm' ran")
        except InvalidArgument as e:
            if "24 bytes per rank" not in str(e):
                errs.append(f"rank {r}: {e}")
        return errs
    errs = flat(ringcomm.run_local(n, body, timeout=120))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("case", ["scatter root", "all_to_all vs all_gather", "gather count", "all_gather root-less"])
def test_single_copy_calls_that_disagree_raise_on_every_rank(case, monkeypatch):
    # Single copy lets a rank read from a peer as soon as that peer has
    # arrived (scatter's leaves wait for the root only): the peer's call is
    # compared first. Every rank raises, within the deadline, and no rank
    # reads a block its peer did not offer.
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "1")

    def body(comm):
        n, r = comm.size, comm.rank
        x = np.arange(4 * n, dtype=np.float32) + 100 * r
        t0 = time.monotonic()
        try:
            if case == "scatter root":  # the last rank names rank 1 as the root
                comm.scatter(x, root=0 if r < n - 1 else 1, out=np.zeros(4, np.float32), algorithm="shm")
            elif case == "all_to_all vs all_gather":  # the same bytes, another collective on rank 1
                if r == 1:
                    comm.all_gather(x[:4], algorithm="shm")
                else:
                    comm.all_to_all(x, algorithm="shm")
            elif case == "gather count":  # the root gathers 5 per rank, the leaves send 4
                comm.gather(x[:5] if r == 0 else x[:4], root=0, algorithm="shm")
            else:  # rank 2 gathers to rank 0 while the others all_gather
                if r == 2:
                    comm.gather(x[:4], root=0, algorithm="shm")
                else:
                    comm.all_gather(x[:4], algorithm="shm")
            return "no error", "", time.monotonic() - t0
        except (MismatchError, CommunicatorAborted) as e:
            return type(e).__name__, str(e), time.monotonic() - t0

    res = ringcomm.run_local(4, body, timeout=20)
    for r, (kind, msg, took) in enumerate(res):
        assert kind in ("MismatchError", "CommunicatorAborted"), f"rank {r}: {kind} {msg}"
        assert took < 10, f"rank {r} took {took:.1f} s: {msg}"
    assert any(kind == "MismatchError" and "disagree" in msg for kind, msg, _ in res), res


def test_single_copy_off_keeps_the_slots(monkeypatch):
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "off")
    assert shm_mod.single_copy_min() == shm_mod.UNLIMITED
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "65536")
    assert shm_mod.single_copy_min() == 65536
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "lots")
    with pytest.raises(InvalidArgument, match="RINGCOMM_SHM_SINGLE_COPY"):
        shm_mod.single_copy_min()
    monkeypatch.delenv("RINGCOMM_SHM_SINGLE_COPY")
    assert shm_mod.single_copy_min() == shm_mod.DEFAULT_SINGLE_COPY_MIN
    # blocks in 4 KiB pages: their own limit, never below the other
    assert shm_mod.single_copy_min_4k() == shm_mod.DEFAULT_SINGLE_COPY_MIN_4K
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY_4K", "1024")
    assert shm_mod.single_copy_min_4k() == shm_mod.DEFAULT_SINGLE_COPY_MIN
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY_4K", "1048576")
    assert shm_mod.single_copy_min_4k() == 1 << 20
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY_4K", "off")
    assert shm_mod.single_copy_min_4k() == shm_mod.UNLIMITED
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY_4K", "some")
    with pytest.raises(InvalidArgument, match="RINGCOMM_SHM_SINGLE_COPY_4K"):
        shm_mod.single_copy_min_4k()
    monkeypatch.delenv("RINGCOMM_SHM_SINGLE_COPY_4K")
    # with single copy the window takes all_gather, gather, scatter and all_to_all back from 256 KiB
    monkeypatch.delenv("RINGCOMM_SHM_MAX", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent")  # no tune file: the built-in limits
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "auto")
    got = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_from(2, single_copy=True)))
    assert got["all_gather"] == got["gather"] == got["scatter"] == got["all_to_all"] == 256 << 10, got
    got = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_from(2, single_copy=False)))
    assert got["all_gather"] == got["scatter"] == got["all_to_all"] == shm_mod.UNLIMITED, got
    assert got["gather"] == 1 << 20, got


def test_empty_torch_chunks_in_the_window():
    # An empty torch tensor's address is 0: a rank whose chunk (or block) is
    # empty must still take the same steps as its peers, and the next call
    # must find everyone in step (a review found reduce_scatter choosing its
    # branch by that pointer).
    torch = pytest.importorskip("torch")

    def body(comm):
        n, r = comm.size, comm.rank
        errs = []
        for count in (0, 1, n - 1):
            x = torch.arange(count, dtype=torch.float32) + r
            got = comm.reduce_scatter(x, algorithm="shm")
            lo, k = ringcomm.vocab.chunk_offset(count, n, r), ringcomm.vocab.chunk_count(count, n, r)
            want = (torch.arange(count, dtype=torch.float32) * n + sum(range(n)))[lo:lo + k]
            if not torch.equal(got, want):
                errs.append(f"rank {r}: reduce_scatter count={count}: {got} != {want}")
            back = comm.all_gather(got, out=torch.zeros(count), algorithm="shm")
            if not torch.equal(back, torch.arange(count, dtype=torch.float32) * n + sum(range(n))):
                errs.append(f"rank {r}: all_gather count={count}: {back}")
            for algorithm in ("shm", "shm_flat"):
                y = torch.arange(count, dtype=torch.float32) + r
                comm.reduce(y, root=n - 1, algorithm=algorithm)
            g = comm.gather(torch.zeros(0), root=0, algorithm="shm")
            a = comm.all_to_all(torch.zeros(0), out=torch.zeros(0), algorithm="shm")
            if (r == 0 and g.numel()) or a.numel():
                errs.append(f"rank {r}: empty gather/all_to_all returned data")
        z = torch.full((5,), float(r))
        comm.all_reduce(z, algorithm="shm")  # every rank still in step
        if not torch.equal(z, torch.full((5,), float(sum(range(n))))):
            errs.append(f"rank {r}: all_reduce after the empty calls: {z}")
        return errs
    errs = flat(ringcomm.run_local(4, body, timeout=20))
    assert not errs, "\n".join(errs[:20])


def test_rooted_collectives_that_disagree_or_cannot_run_in_the_window():
    def body(comm):
        out = []
        try:  # rank 2 names another root
            comm.gather(np.ones(4, np.float32), root=0 if comm.rank < 2 else 1,
                        out=np.zeros(12, np.float32), algorithm="shm")
            out.append("no error")
        except MismatchError as e:
            out.append("mismatch" if "root=0" in str(e) and "root=1" in str(e) else str(e))
        return out
    for r, m in enumerate(ringcomm.run_local(3, body, timeout=20)):
        assert m == ["mismatch"], f"rank {r}: {m}"

    def splits(comm):
        # per-peer splits run in the window with single copy off too (the slots)
        splits, out_splits = ([1, 3], [1, 2]) if comm.rank == 0 else ([2, 2], [3, 2])
        got = comm.all_to_all(np.arange(4, dtype=np.float32) + 10 * comm.rank, splits, out_splits, algorithm="shm")
        assert comm.last_algorithm == "shm"
        assert got.tolist() == ([0, 10, 11] if comm.rank == 0 else [1, 2, 3, 12, 13]), (comm.rank, got)
        with pytest.raises(InvalidArgument, match="runs algorithm 'auto', 'linear' or 'shm'"):
            comm.gather(np.zeros(4, np.float32), algorithm="ring")
        return True
    os.environ["RINGCOMM_SHM_SINGLE_COPY"] = "off"
    try:
        assert all(ringcomm.run_local(2, splits, timeout=20))
    finally:
        del os.environ["RINGCOMM_SHM_SINGLE_COPY"]

    def sizes(comm):
        # with it: both ranks pass [1, 3], so each sends the other a block of
        # another size than the other expects; each names both sizes, and
        # nothing lands where the peer's block goes (its own block may)
        out = np.full(4, -1, np.float32)
        try:
            comm.all_to_all(np.zeros(4, np.float32), [1, 3], [1, 3], out=out, algorithm="shm")
        except MismatchError as e:
            return str(e), (out[1:] if comm.rank == 0 else out[:1]).tolist()
        return "no error", []
    for r, (msg, rest) in enumerate(ringcomm.run_local(2, sizes, timeout=20)):
        want = "rank 1 sends 4 bytes to rank 0, which expects 12" if r == 0 else \
            "rank 0 sends 12 bytes to rank 1, which expects 4"
        assert want in msg or "reported to rank" in msg, f"rank {r}: {msg}"
        assert rest == [-1.0] * (3 if r == 0 else 1), f"rank {r}: {rest}"


@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 7]))
def test_many_rounds_with_a_small_slot(n, monkeypatch):
    # 4 KiB slots: a piece of 4096 / n bytes per chunk, so a few hundred
    # elements already take many rounds (and both parities many times).
    monkeypatch.setenv("RINGCOMM_SHM_SLOT", "4096")

    def body(comm):
        errs = suite.run_cases(comm, [1, n + 1, 1000, 4099], algorithm="shm")
        errs += suite.run_cases(comm, [1000, 5003], suite.COMBOS[::2], algorithm="shm_flat")
        errs += suite.run_broadcasts(comm, [5003], dtypes=["float64"], algorithm="shm")
        import collectives_suite as cs
        errs += cs.run_all(comm, [1000, 4099], FEW[:2], algorithms="shm")
        return errs
    errs = flat(ringcomm.run_local(n, body))
    assert not errs, "\n".join(errs[:20])


def at_page_offset(count, dtype, off):
    """A zeroed array of `count` elements starting `off` bytes into a page."""
    nbytes = count * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + 8192, np.uint8)
    i = (off - raw.ctypes.data) % 4096
    return raw[i:i + nbytes].view(dtype)


@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 5]))
def test_arrays_at_any_page_offset_through_the_window(n, monkeypatch):
    # The slots follow each call's array to its offset in the page
    # (ShmWindow::align_slots_to). Ranks here use different offsets, so a
    # writer's slot and a reader's array disagree; 4 KiB slots make every
    # call many rounds over both parities, each parity written at the
    # offset of the call that last used it. (Between processes:
    # test_over_mpi_one_host_uses_shared_memory_and_leaves_nothing.)
    monkeypatch.setenv("RINGCOMM_SHM_SLOT", "4096")
    offsets = [0, 8, 16, 48, 4080]

    def body(comm):
        r, errs = comm.rank, []
        for i, off in enumerate(offsets):
            mine = offsets[(i + r) % len(offsets)] if off else 0  # (offset 0 on every rank once)
            for dtype in ("float64", "float32", "int8"):
                es = np.dtype(dtype).itemsize
                o = mine // es * es
                k = 1000 + 7 * n  # a multiple of n would hide a short last piece
                k -= k % n

                def data(rank, count=k):
                    return ((np.arange(count) * (rank + 3) + rank) % 101).astype(dtype)

                def arr(count, values=None):
                    a = at_page_offset(count, dtype, o)
                    if values is not None:
                        a[...] = values
                    return a
                want_sum = sum(data(q).astype(np.int64) for q in range(n))
                got = {}
                x = arr(k, data(r))
                comm.broadcast(x, 1 % n, algorithm="shm")
                got["broadcast"] = (x, data(1 % n))
                out = arr(k)
                comm.all_reduce(arr(k, data(r)), out=out, algorithm="shm")
                got["all_reduce"] = (out, want_sum.astype(dtype))
                out = arr(k)
                comm.reduce(arr(k, data(r)), 0, out=out, algorithm="shm")
                if r == 0:
                    got["reduce"] = (out, want_sum.astype(dtype))
                out = arr(k)
                comm.all_gather(arr(k // n, data(r, k // n)), out=out, algorithm="shm")
                got["all_gather"] = (out, np.concatenate([data(q, k // n) for q in range(n)]))
                out = arr(k)
                comm.gather(arr(k // n, data(r, k // n)), 0, out=out if r == 0 else None, algorithm="shm")
                if r == 0:
                    got["gather"] = (out, np.concatenate([data(q, k // n) for q in range(n)]))
                out = arr(k // n)
                comm.scatter(arr(k, data(0)) if r == 0 else None, 0, out=out, algorithm="shm")
                got["scatter"] = (out, data(0)[r * (k // n):(r + 1) * (k // n)])
                out = arr(k)
                comm.all_to_all(arr(k, data(r)), out=out, algorithm="shm")
                b = k // n
                got["all_to_all"] = (out, np.concatenate([data(q)[r * b:(r + 1) * b] for q in range(n)]))
                out = arr(k // n)  # (the one path without a trailing sync)
                comm.reduce_scatter(arr(k, data(r)), out=out, algorithm="shm")
                got["reduce_scatter"] = (out, want_sum.astype(dtype)[r * b:(r + 1) * b])

                def split(q, p):  # what rank q sends rank p: uneven, some empty
                    return (q * 7 + p * 13) % 9 * 40
                sends = [split(r, p) for p in range(n)]
                recvs = [split(q, r) for q in range(n)]
                out = arr(sum(recvs))
                comm.all_to_all(arr(sum(sends), data(r, sum(sends))), sends, recvs, out=out, algorithm="shm")

                def block(q, p):  # rank q's block for rank p
                    start = sum(split(q, x) for x in range(p))
                    return data(q, sum(split(q, x) for x in range(n)))[start:start + split(q, p)]
                got["all_to_all (per-peer splits)"] = (out, np.concatenate([block(q, r) for q in range(n)]))
                for name, (g, w) in got.items():
                    bad = np.flatnonzero(g != w)
                    if bad.size:
                        errs.append(f"rank {r} {name} {dtype} page offset {o}: {bad.size} wrong, first at index "
                                    f"{bad[0]}: {g[bad[0]]} != {w[bad[0]]}")
        return errs
    errs = flat(ringcomm.run_local(n, body))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 5, 8]))
def test_zero_copy_suite_in_process(n):
    # Arrays from comm.empty (the shared arena): auto runs zero_copy, peers
    # read them where they are; every dtype and op, sizes 0..multi-slot.
    def body(comm):
        arrays = suite.ArenaArrays(comm)
        errs = suite.run_cases(comm, [0, 1, n - 1, n + 1, 101], arrays=arrays, algorithm="zero_copy")
        errs += suite.run_cases(comm, [100003], suite.COMBOS[::4], arrays=arrays, algorithm="zero_copy")
        x = comm.empty(10, "float32")
        x[:] = comm.rank
        comm.all_reduce(x)  # auto: the arena means zero copy
        if comm.last_algorithm != "zero_copy" or not np.all(x == sum(range(n))):
            errs.append(f"rank {comm.rank}: auto ran {comm.last_algorithm}: {x}")
        return errs
    errs = flat(ringcomm.run_local(n, body))
    assert not errs, "\n".join(errs[:20])


def test_zero_copy_arrays_may_sit_anywhere_in_each_ranks_part():
    # Each rank announces where its arrays are: no symmetric allocation needed.
    def body(comm):
        pad = comm.empty(4096 * (comm.rank + 1), "uint8")  # each rank's next block sits elsewhere
        x = comm.empty(1000, "float32")
        x[:] = np.arange(1000) + comm.rank
        out = comm.empty(1000, "float32")
        comm.all_reduce(x, out=out)
        rs = comm.reduce_scatter(x)
        del pad
        return out.copy(), rs, comm.last_algorithm
    res = ringcomm.run_local(3, body)
    want = sum(np.arange(1000, dtype=np.float32) + r for r in range(3))
    for r, (out, rs, algo) in enumerate(res):
        assert algo == "zero_copy" and np.array_equal(out, want), f"rank {r}"
        lo = ringcomm.vocab.chunk_offset(1000, 3, r)
        assert np.array_equal(rs, want[lo:lo + rs.size]), f"rank {r}"


def test_zero_copy_on_some_ranks_only_is_a_mismatch():
    def body(comm):
        x = comm.empty(100, "float32") if comm.rank == 0 else np.zeros(100, np.float32)
        x[:] = 1
        try:
            comm.all_reduce(x)
        except MismatchError as e:
            return str(e)
        return "no error"
    msgs = ringcomm.run_local(2, body, timeout=20)
    for r, m in enumerate(msgs):
        assert "zero_copy" in m, f"rank {r}: {m}"


def test_zero_copy_needs_arena_arrays_and_frees_them():
    def body(comm):
        with pytest.raises(InvalidArgument, match="shared arena"):
            comm.all_reduce(np.ones(4, np.float32), algorithm="zero_copy")
        x = comm.empty((3, 5), "float64")
        assert x.shape == (3, 5) and x.dtype == np.float64
        win = comm._engine.window
        free_before = win.arena_bytes
        a = comm.empty(win.arena_bytes - 8192, "uint8")  # nearly everything
        with pytest.raises(InvalidArgument, match="arena is full"):
            comm.empty(1 << 20, "uint8")
        del a  # the block comes back when its last array is gone
        b = comm.empty(1 << 20, "uint8")
        assert free_before == win.arena_bytes and b.nbytes == 1 << 20
        t = comm.empty(6, "bfloat16", family="torch")
        t.fill_(2.5)
        comm.all_reduce(t)
        return float(t[0]), comm.last_algorithm
    pytest.importorskip("torch")
    res = ringcomm.run_local(2, body)
    assert res == [(5.0, "zero_copy")] * 2, res


def test_sums_agree_bitwise_across_the_shm_algorithms():
    # Every rank sums in rank order 0..n-1: the reduce-scatter's chunk, the
    # direct all_reduce, the one-sync all_reduce and reduce by single copy
    # (its parts not the chunks) give the same bits (what makes ZeRO's sums
    # equal DDP's on this path too).
    def body(comm):
        rng = np.random.default_rng(1000 + comm.rank)
        x = rng.standard_normal(10007).astype(np.float32)
        a = comm.all_reduce(x.copy(), algorithm="shm")
        b = comm.all_reduce(x.copy(), algorithm="shm_flat")
        c = comm.reduce_scatter(x.copy(), algorithm="shm")
        lo = ringcomm.vocab.chunk_offset(x.size, comm.size, comm.rank)
        window = comm._engine.window
        limit, window.single_copy_min = window.single_copy_min, 1  # (every rank: reduce by single copy)
        try:
            d = comm.reduce(x.copy(), root=2, algorithm="shm")
        finally:
            window.single_copy_min = limit
        return a, b, c, lo, d
    for r, (a, b, c, lo, d) in enumerate(ringcomm.run_local(5, body)):
        assert a.tobytes() == b.tobytes(), f"rank {r}: shm and shm_flat differ"
        assert a[lo:lo + c.size].tobytes() == c.tobytes(), f"rank {r}: reduce_scatter differs from all_reduce"
        if r == 2:
            assert d.tobytes() == a.tobytes(), "rank 2: reduce by single copy differs from all_reduce"
    ref = sum(np.random.default_rng(1000 + q).standard_normal(10007).astype(np.float32) for q in range(5))
    assert np.allclose(a, ref, rtol=1e-5, atol=1e-5)


def test_emulated_device_has_no_window():
    def body(comm):
        with pytest.raises(InvalidArgument, match="shared-memory window"):
            comm.all_reduce(np.ones(3, np.float32), algorithm="shm")
        return True
    assert all(ringcomm.run_local(2, body, device="emulated"))


def test_empty_takes_torch_dtypes_and_refuses_what_cannot_fit():
    torch = pytest.importorskip("torch")

    def body(comm):
        t = comm.empty((2, 3), torch.bfloat16, family="torch")
        a = comm.empty(4, np.dtype("float32"))
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == (2, 3) and a.dtype == np.float32
        for shape, dtype, match in (((2**62 - 1,), "float32", "do not fit"), (4, "nonsense", "unsupported dtype"),
                                    ((2, -1), "float32", "negative")):
            with pytest.raises(InvalidArgument, match=match):
                comm.empty(shape, dtype)
        return True
    assert all(ringcomm.run_local(2, body))

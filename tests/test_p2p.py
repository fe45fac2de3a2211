"""Point-to-point over in-process ranks: send/recv/isend/irecv/batch_isend_irecv
against rank-dependent numpy references, the ledger's closed form, and the
failure model (sizes, dtypes, bad peers, deadlines)."""

import gc
import time
import weakref

import ml_dtypes
import numpy as np
import pytest

import ringcomm
import suite
from ringcomm import traffic, vocab
from tiers import slow_except

pytestmark = pytest.mark.timeout(120)


def data(rank, count, dtype, salt=0):
    """Rank-dependent values that every dtype holds exactly."""
    v = (np.arange(count) * 7 + 13 * rank + 3 * salt + 1) % 97
    return v.astype(vocab.NUMPY[dtype])


def check(got, want, rank, what):
    bad = np.flatnonzero(got.astype(np.float64) != want.astype(np.float64))
    assert bad.size == 0, (f"rank {rank}: {what}: {bad.size} wrong, first at index {bad[0]}: "
                           f"got {got[bad[0]]}, want {want[bad[0]]}")


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("count", [0, 1, 97, 40000])
def test_ring_shift_blocking(n, count):
    def body(comm):
        r = comm.rank
        comm.segment_bytes = 1024
        x = data(r, count, "float32")
        y = np.full(count, -1, np.float32)
        if r % 2 == 0:  # alternate so blocking calls never wait on each other in a cycle
            comm.send(x, (r + 1) % n)
            src = comm.recv(y, (r - 1) % n)
        else:
            src = comm.recv(y, (r - 1) % n)
            comm.send(x, (r + 1) % n)
        check(y, data((r - 1) % n, count, "float32"), r, "ring shift")
        assert src == (r - 1) % n
        t = comm.traffic()
        e_s = traffic.expected("send", count, "float32", n, r, root=(r + 1) % n)
        e_r = traffic.expected("recv", count, "float32", n, r, root=(r - 1) % n)
        assert t.bytes_sent("send") == e_s.bytes_sent == count * 4
        assert t.bytes_received("recv") == e_r.bytes_received == count * 4
        assert t.bytes_sent("all_reduce") == 0
        return True
    assert all(ringcomm.run_local(n, body))


@pytest.mark.parametrize("dtype", list(vocab.DTYPES))
@pytest.mark.parametrize("n", [2, 3])
def test_all_pairs_every_dtype(n, dtype):
    def body(comm):
        r = comm.rank
        ops, outs = [], {}
        for p in range(n):
            if p == r:
                continue
            outs[p] = np.zeros(31, vocab.NUMPY[dtype])
            ops.append(ringcomm.P2POp("isend", data(r, 31, dtype, salt=p), p, tag=5))
            ops.append(ringcomm.P2POp("irecv", outs[p], p, tag=5))
        for w in ops and comm.batch_isend_irecv(ops):
            w.wait()
        for p, y in outs.items():
            check(y, data(p, 31, dtype, salt=r), r, f"from rank {p}")
        return True
    assert all(ringcomm.run_local(n, body))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_any_source_collects_every_rank(n):
    def body(comm):
        r = comm.rank
        if r != 0:
            comm.send(data(r, 10, "int32"), 0, tag=1)
            return None
        seen = {}
        for _ in range(n - 1):
            y = np.zeros(10, np.int32)
            src = comm.recv(y, None, tag=1)
            check(y, data(src, 10, "int32"), r, f"any-source message from {src}")
            seen[src] = True
        return sorted(seen)
    assert ringcomm.run_local(n, body)[0] == list(range(1, n))


def test_any_source_behind_a_receive_from_one_rank_takes_another_ranks_message():
    def body(comm):
        comm.timeout = 20
        return suite.any_source_behind_one_rank(comm)
    assert ringcomm.run_local(3, body)[0] == suite.ANY_SOURCE_BEHIND_ONE_RANK


def test_batch_with_a_bad_op_posts_none():
    # The tag limit is the transport's (less the dtype's bits), checked for
    # every op before any is posted: rank 1 must never see the isend's data.
    def body(comm):
        comm.timeout = 20
        if comm.rank == 0:
            limit = comm._door.p2p_max_tag
            with pytest.raises(ringcomm.InvalidArgument, match=f"tag {limit + 1} is out of range"):
                comm.batch_isend_irecv([ringcomm.P2POp("isend", np.full(3, 5.0), 1),
                                        ringcomm.P2POp("irecv", np.zeros(3), 1, tag=limit + 1)])
            comm.barrier()
            comm.send(np.full(3, 7.0), 1)
            return None
        comm.barrier()
        y = np.zeros(3)
        comm.recv(y, 0)
        return y.tolist()
    assert ringcomm.run_local(2, body)[1] == [7.0, 7.0, 7.0]


@pytest.mark.parametrize("order", ["sends_first", "recvs_first"])
def test_batch_both_directions_large_no_deadlock(order):
    count = 300000  # well beyond any eager limit

    def body(comm):
        r, n = comm.rank, comm.size
        y1, y2 = np.empty(count, np.float64), np.empty(count, np.float64)
        ops = [ringcomm.P2POp("irecv", y1, (r - 1) % n), ringcomm.P2POp("irecv", y2, (r + 1) % n),
               ringcomm.P2POp("isend", data(r, count, "float64", 1), (r + 1) % n),
               ringcomm.P2POp("isend", data(r, count, "float64", 2), (r - 1) % n)]
        works = comm.batch_isend_irecv(ops)
        for w in (works[2:] + works[:2]) if order == "sends_first" else works:
            w.wait()
        check(y1, data((r - 1) % n, count, "float64", 1), r, "from the left")
        check(y2, data((r + 1) % n, count, "float64", 2), r, "from the right")
        assert works[0].source == (r - 1) % n
        return True
    assert all(ringcomm.run_local(3, body))


def test_order_per_tag_and_tags_apart():
    def body(comm):
        if comm.rank == 0:
            for i in range(5):
                comm.isend(np.full(3, i, np.int64), 1, tag=7)
                comm.isend(np.full(3, 100 + i, np.int64), 1, tag=8)
            comm.barrier()
            return None
        got8 = [int(comm.irecv(np.zeros(3, np.int64), 0, tag=8).wait()[0]) for _ in range(5)]
        got7 = [int(comm.irecv(np.zeros(3, np.int64), 0, tag=7).wait()[0]) for _ in range(5)]
        comm.barrier()
        return got7, got8
    assert ringcomm.run_local(2, body)[1] == ([0, 1, 2, 3, 4], [100, 101, 102, 103, 104])


def test_interleaved_with_collectives():
    def body(comm):
        r, n = comm.rank, comm.size
        total = 0
        for it in range(5):
            x = data(r, 50, "float32", it)
            s = comm.all_reduce(x.copy())
            y = np.empty(50, np.float32)
            works = [comm.isend(x, (r + 1) % n, tag=it), comm.irecv(y, (r - 1) % n, tag=it)]
            comm.barrier()
            for w in works:
                w.wait()
            check(y, data((r - 1) % n, 50, "float32", it), r, f"iteration {it}")
            total += float(s.sum())
        t = comm.traffic()
        assert t.bytes_sent("send") == 5 * 200 and t.bytes_received("recv") == 5 * 200
        return total
    res = ringcomm.run_local(3, body)
    assert len(set(res)) == 1


def test_a_dropped_work_still_completes_and_holds_no_later_one():
    """An isend / irecv whose Work is dropped unwaited keeps its array alive
    while in flight, still completes (the communicator progresses it), and
    then lets its array go; it never pins the Works that come after it (it
    did: 200 rounds later a rank held 601 Works and all their arrays)."""
    rounds = 200

    def body(comm):
        r = comm.rank
        if r == 0:
            x = data(0, 1000, "float64")
            gone = weakref.ref(x)
            comm.isend(x, 1)  # the Work dropped at once
            del x
            gc.collect()
            held = gone() is not None
            comm.barrier()
        else:
            comm.barrier()  # so rank 0's send is surely in flight when it looks
            y = np.full(1000, -1.0)
            comm.irecv(y, 0)  # dropped too: y lands all the same
        for i in range(rounds):
            got = np.empty(3)
            s = comm.isend(np.full(3, 10.0 * r + i), 1 - r, tag=1)
            comm.irecv(got, 1 - r, tag=1).wait()
            s.wait()
            assert got.tolist() == [10.0 * (1 - r) + i] * 3, f"rank {r}, round {i}: got {got.tolist()}"
            comm.all_reduce(np.arange(4.0), async_op=True).wait()
        comm.barrier()
        gc.collect()
        inflight = len(comm._inflight)
        if r == 0:
            return held, gone() is None, inflight
        check(y, data(0, 1000, "float64"), r, "a dropped irecv")
        return inflight

    (held, released, inflight0), inflight1 = ringcomm.run_local(2, body)
    assert held, "rank 0: the array of a send in flight was let go"
    assert released, "rank 0: the dropped send's array is still held after it completed"
    assert inflight0 <= 64 and inflight1 <= 64, f"Works in flight after {rounds} rounds: {inflight0}, {inflight1}"


def test_a_dropped_receive_that_never_matches_aborts_nothing():
    """A dropped irecv whose message never comes stays pending (as in MPI):
    the communicator's sweeps progress it but never fail it at its deadline,
    which would abort the communicator with no Work left to say why."""
    def body(comm):
        comm.irecv(np.zeros(3), 1 - comm.rank, tag=5)  # dropped; no rank ever sends with tag 5
        time.sleep(1.0)  # past the deadline (timeout 0.5 s)
        for i in range(100):  # well past a sweep
            s = comm.isend(np.full(2, float(i)), 1 - comm.rank)
            got = comm.irecv(np.empty(2), 1 - comm.rank).wait()
            s.wait()
            assert got.tolist() == [float(i)] * 2, f"rank {comm.rank}, round {i}: {got.tolist()}"
        return float(comm.all_reduce(np.full(4, comm.rank + 1.0))[0])
    assert ringcomm.run_local(2, body, timeout=0.5) == [3.0, 3.0]


def test_torch_tensors():
    torch = pytest.importorskip("torch")

    def body(comm):
        r = comm.rank
        x = torch.arange(6, dtype=torch.bfloat16) + r
        y = torch.zeros(6, dtype=torch.bfloat16)
        ws = comm.batch_isend_irecv([ringcomm.P2POp(comm.isend, x, 1 - r), ringcomm.P2POp(comm.irecv, y, 1 - r)])
        [w.wait() for w in ws]
        assert torch.equal(y, torch.arange(6, dtype=torch.bfloat16) + (1 - r)), f"rank {r}: {y}"
        return True
    assert all(ringcomm.run_local(2, body))


# ---- errors -------------------------------------------------------------------
@pytest.mark.parametrize("device", [None, "emulated", "emulated-nccl"])
def test_recv_smaller_than_message_fails_both_sides(device):
    def body(comm):
        comm.timeout = 5
        if comm.rank == 0:
            try:
                comm.send(np.arange(10, dtype=np.float32), 1)
                comm.barrier()  # the receiver aborted: this rank hears of it
            except ringcomm.RingcommError as e:
                return type(e).__name__, str(e)
            return "no error", ""
        y = np.full(12, -7, np.float32)
        guard = y[8:].copy()
        with pytest.raises(ringcomm.MismatchError) as ei:
            comm.recv(y[:8], 0)
        assert (y[8:] == guard).all() and (y[:8] == -7).all(), "bytes landed"
        return "MismatchError", str(ei.value)
    (k0, m0), (k1, m1) = ringcomm.run_local(2, body, device=device)
    assert "40 bytes" in m1 and "32 bytes" in m1 and "rank 0" in m1, m1
    assert k0 != "no error", "the sender never heard of the mismatch"


def test_recv_larger_than_message_is_an_error():
    def body(comm):
        comm.timeout = 5
        if comm.rank == 0:
            comm.send(np.arange(4, dtype=np.int32), 1)
            return None
        with pytest.raises(ringcomm.MismatchError, match="exactly"):
            comm.recv(np.zeros(8, np.int32), 0)
        return True
    ringcomm.run_local(2, body)


def test_dtype_mismatch():
    def body(comm):
        comm.timeout = 5
        if comm.rank == 0:
            comm.send(np.arange(4, dtype=np.float32), 1)
            return None
        with pytest.raises(ringcomm.MismatchError, match="float32.*int32|int32.*float32"):
            comm.recv(np.zeros(4, np.int32), 0)
        return True
    ringcomm.run_local(2, body)


@pytest.mark.parametrize("device", [None, "emulated", "emulated-nccl"])
def test_recv_without_send_times_out_naming_the_peer(device):
    def body(comm):
        comm.timeout = 0.5
        if comm.rank == 1:
            with pytest.raises(ringcomm.CollectiveTimeout, match="rank 0"):
                comm.recv(np.zeros(3, np.float32), 0, tag=4)
            return comm.aborted
        return None
    assert ringcomm.run_local(2, body, device=device)[1] is True


def test_abort_wakes_pending_recv():
    import threading

    def body(comm):
        if comm.rank == 0:
            w = comm.irecv(np.zeros(3), 1)
            threading.Timer(0.3, comm.abort, kwargs={"wait": False}).start()
            with pytest.raises(ringcomm.RingcommError):
                w.wait()
        return True
    ringcomm.run_local(2, body)


@pytest.mark.parametrize("case", ["mismatch", "timeout", "tag", "tag_any_source", "dtype_any_source"])
def test_peers_hear_which_p2p_op_failed(case):
    """A failed p2p op aborts the communicator; the ranks that hear of it
    through the ring (the sender, and rank 2, a bystander) are told which op
    failed where: rank 1's recv from rank 0 with its tag, not a collective
    (an all_reduce ran before, so a wrong message would cite it). "tag":
    rank 0 sent with tag 3 (before a barrier of all, so it has arrived)
    what rank 1 receives with tag 4, from rank 0 or from any rank; rank 1's
    timeout names the message that waits unreceived. "dtype_any_source":
    the same tag, another dtype, from any rank (a receive from one rank
    fails early on that, a MismatchError), named alike."""
    told = {"tag": "rank 0's next message to rank 1 has tag 3 (20 bytes (5 float32)) and waits unreceived",
            "dtype_any_source": "rank 0's next message to rank 1 has this tag but is 20 bytes (5 float32) "
                                "(this receive: float64) and waits unreceived: do the ranks agree on the dtype?"}
    told["tag_any_source"] = told["tag"]
    unreceived = case in told  # rank 0's message has arrived (a barrier of all) before rank 1 receives

    def body(comm):
        r = comm.rank
        comm.all_reduce(np.arange(4, dtype=np.float32) + r)
        comm.timeout = 0.5 if r == 1 else 10
        try:
            if r == 0 and case != "timeout":
                comm.send(np.arange(5, dtype=np.float32), 1, tag=4 if case == "dtype_any_source" else 3)
            if unreceived:
                comm.barrier()
            if r == 1:
                comm.recv(np.zeros(4, np.float64 if case == "dtype_any_source" else np.float32),
                          None if case.endswith("any_source") else 0, tag=3 if case == "mismatch" else 4)
            else:
                comm.barrier()  # rank 1 never comes: this rank hears of its failure
        except ringcomm.RingcommError as e:
            return type(e).__name__, str(e)
        return "no error", ""
    out = ringcomm.run_local(3, body)
    want = ("MismatchError", "tag 3") if case == "mismatch" else ("CollectiveTimeout", "tag 4")
    assert out[1][0] == want[0], f"rank 1: {out[1]}"
    assert (told[case] in out[1][1]) if unreceived else ("waits unreceived" not in out[1][1]), f"rank 1: {out[1]}"
    for r in (0, 2):
        kind, msg = out[r]
        assert kind != "no error", f"rank {r} never heard of rank 1's failure"
        source = "from any rank" if case.endswith("any_source") else "from rank 0"
        assert "rank 1" in msg and "recv" in msg and want[1] in msg and source in msg, \
            f"rank {r} is not told which op failed: {msg}"
        assert "all_reduce" not in msg, f"rank {r} is told of a collective that did not fail: {msg}"
        if case == "timeout":
            assert "timed out" in msg, f"rank {r}: {msg}"


def test_bad_input_before_any_byte_moves():
    def body(comm):
        x = np.zeros(4, np.float32)
        for call, match in [(lambda: comm.send(x, 2), "out of range"), (lambda: comm.send(x, -1), "out of range"),
                            (lambda: comm.send(x, comm.rank), "itself"), (lambda: comm.recv(x, 0 if comm.rank else 1, tag=-1), "tag"),
                            (lambda: comm.recv(np.zeros((4, 4), np.float32)[:, 0], 1 - comm.rank), "contiguous"),
                            (lambda: comm.isend(x, "1"), "int"),
                            (lambda: comm.batch_isend_irecv([ringcomm.P2POp("put", x, 1)]), "isend")]:
            with pytest.raises(ringcomm.InvalidArgument, match=match):
                call()
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ringcomm.InvalidArgument, match="read-only"):
            comm.recv(ro, 1 - comm.rank)
        assert not comm.aborted
        comm.barrier()
        return True
    assert all(ringcomm.run_local(2, body))


def test_flight_record_names_send_and_recv():
    def body(comm):
        y = np.zeros(2)
        if comm.rank == 0:
            comm.send(np.ones(2), 1)
        else:
            comm.recv(y, 0)
        return [r["collective"] for r in comm.flight_record()]
    assert ringcomm.run_local(2, body) == [["send"], ["recv"]]


def test_flight_record_p2p_fields():
    def body(comm):
        y = np.zeros(2)
        if comm.rank == 0:
            comm.send(np.ones(2), 1, tag=7)
            comm.isend(np.ones(2), 1, tag=3).wait()
        else:
            comm.recv(y, 0, tag=7)
            comm.irecv(y, None, tag=3).wait()
        comm.all_reduce(y)
        return [(r["collective"], r.get("peer"), r.get("tag"), r["root"], r["algorithm"], r["state"])
                for r in comm.flight_record()]
    r0, r1 = ringcomm.run_local(2, body)
    assert r0[:2] == [("send", 1, 7, None, None, "done"), ("send", 1, 3, None, None, "done")]
    assert r1[:2] == [("recv", 0, 7, None, None, "done"), ("recv", None, 3, None, None, "done")]
    assert r0[2][:3] == ("all_reduce", None, None) and r0[2][4] is not None


def test_analyze_sets_p2p_records_aside(tmp_path):
    from ringcomm import flight
    coll = {"seq": 1, "collective": "all_reduce", "count": 2, "dtype": "float64", "op": "sum", "root": None,
            "algorithm": "ring", "peer": None, "tag": None, "state": "done", "t_issue": 1.0, "t_start": 1.0,
            "t_end": 1.1, "waiting_for": None, "bytes_sent": 0, "bytes_received": 0}
    p2p = dict(coll, seq=(1 << 62) + 1, collective="recv", op=None, algorithm=None, peer=1, tag=5,
               state="running", t_issue=2.0, t_end=None)
    for r in range(2):
        flight.dump(str(tmp_path), rank=r, size=2, label="inproc", index=0,
                    records=[coll] + ([p2p] if r == 0 else []), error=None)
    text = flight.analyze(str(tmp_path))
    assert "nobody is behind" in text and "#1 all_reduce" in text
    assert "Point-to-point still waiting: rank 0: #4611686018427387905 recv(count=2, float64, peer=1, tag=5)" in text


def test_blocking_fast_lane_and_its_fallbacks():
    # numpy arrays with plain ints take the native fast lane; numpy ints,
    # bools, buffers and odd tags take the Door, whose checks and errors stay.
    def body(comm):
        r, o = comm.rank, 1 - comm.rank
        got = []
        for peer, tag, make in [(o, 0, lambda v: np.full(3, v, np.int32)),
                                (np.int64(o), np.int32(2), lambda v: np.full(3, v, np.int32)),
                                (o, 1, lambda v: bytearray(np.full(3, v, np.int32).tobytes()))]:
            x, y = make(10 + r), make(0)
            if r == 0:
                comm.send(x, peer, tag)
                src = comm.recv(y, None if tag == 1 else peer, tag)
            else:
                src = comm.recv(y, peer, tag)
                comm.send(x, peer, tag)
            got.append((src, np.frombuffer(bytes(y), np.int32).tolist()))
        with pytest.raises(ringcomm.InvalidArgument, match="tag"):
            comm.send(np.zeros(1), o, 2**40)
        with pytest.raises(ringcomm.InvalidArgument, match="int"):
            comm.send(np.zeros(1), True)
        assert not comm.aborted
        return got
    a, b = ringcomm.run_local(2, body)
    assert a == [(1, [11] * 3)] * 3 and b == [(0, [10] * 3)] * 3


def test_torch_tensors_blocking():
    torch = pytest.importorskip("torch")

    def body(comm):
        r = comm.rank
        x = torch.arange(5, dtype=torch.float32) + r
        y = torch.zeros(5, dtype=torch.float32)
        if r == 0:
            comm.send(x, 1)
            src = comm.recv(y, 1)
        else:
            src = comm.recv(y, 0)
            comm.send(x, 0)
        assert src == 1 - r and torch.equal(y, torch.arange(5, dtype=torch.float32) + (1 - r))
        return comm.flight_record()[-1]["state"]
    assert ringcomm.run_local(2, body) == ["done", "done"]


@pytest.mark.parametrize("device", [None, "emulated"])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("how", ["auto", "ring", "async"])
def test_a_receive_posted_before_a_collective_takes_its_message_during_it(device, n, how):
    """Rank 1 posts an irecv, runs an all_reduce, then waits; rank 0 sends
    (blocking, 1.2 MB) and then joins it (suite.irecv_across_a_collective).
    The collective's waits match the pending receive, as MPI's progress
    engine moves posted receives: before, a deadlock until the timeout."""
    errs = ringcomm.run_local(n, lambda comm: suite.irecv_across_a_collective(comm, how), device=device, timeout=10)
    assert not [e for es in errs for e in es], errs


# ---- sendrecv ----------------------------------------------------------------
@pytest.mark.parametrize("device", [None, "emulated", "emulated-nccl"])
@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 5]))
@pytest.mark.parametrize("count", [0, 1, 97, 40000])
def test_sendrecv_ring_shift_both_ways(device, n, count):
    """Every rank sends right and receives from the left in one call, then
    the other way round with another dtype and tags apart; host arrays take
    the native fast lane, a device communicator the staged path."""
    def body(comm):
        r = comm.rank
        comm.segment_bytes = 1024
        left, right = (r - 1) % n, (r + 1) % n
        y = np.full(count, -1, np.float32)
        src = comm.sendrecv(data(r, count, "float32"), right, y, left)
        check(y, data(left, count, "float32"), r, "sendrecv to the right")
        z = np.full(count, -1, np.int64)
        src2 = comm.sendrecv(data(r, count, "int64", 1), left, z, None, tag=5, recv_tag=5)  # (any source)
        check(z, data(right, count, "int64", 1), r, "sendrecv to the left, any source")
        assert (src, src2) == (left, right), f"rank {r}: sources {src}, {src2}"
        t = comm.traffic()
        assert t.bytes_sent("send") == count * 12 and t.bytes_received("recv") == count * 12, f"rank {r}: {t}"
        want = {}  # per peer, from the closed forms of its two sends and two receives
        for dt, to, frm in (("float32", right, left), ("int64", left, right)):
            for p, b in traffic.expected("send", count, dt, n, r, root=to).sent.items():
                want.setdefault(p, [0, 0])[0] += b
            for p, b in traffic.expected("recv", count, dt, n, r, root=frm).received.items():
                want.setdefault(p, [0, 0])[1] += b
        for p, (s_, r_) in want.items():
            got = (t.bytes_sent("send", peer=p), t.bytes_received("recv", peer=p))
            assert got == (s_, r_), f"rank {r}, peer {p}: (sent, received) {got} != {(s_, r_)}"
        return [rec["collective"] for rec in comm.flight_record()]
    out = ringcomm.run_local(n, body, device=device, timeout=60)
    assert all(recs == ["send", "recv"] * 2 for recs in out), out


@pytest.mark.parametrize("device", [None, "emulated", "emulated-nccl"])
@pytest.mark.parametrize("n", [1, 3])
def test_sendrecv_with_itself_is_a_copy(device, n):
    """dst == rank (a ring shift at world size 1; MPI_Sendrecv allows it):
    `x` copied into `out`, src the rank or None, through the fast lane and
    the adapter; no message, nothing in the ledger, no flight record; the
    ranks' exchanges with peers that follow still match."""
    torch = pytest.importorskip("torch")

    def body(comm):
        r = comm.rank
        for count in (0, 1, 97, 40000):
            for k, dt in enumerate(("float32", "int64", "float16")):
                y = np.full(count, -1, dt)
                src = comm.sendrecv(data(r, count, dt, k), r, y, r if k % 2 else None, tag=k, recv_tag=k)
                assert src == r, f"rank {r}: source {src}"
                check(y, data(r, count, dt, k), r, f"sendrecv with itself, {count} {dt}")
        t = torch.zeros(6, dtype=torch.bfloat16)
        assert comm.sendrecv(torch.arange(6, dtype=torch.bfloat16) + r, r, t, r) == r  # (fast lane)
        b = bytearray(8)
        assert comm.sendrecv(bytearray(np.full(2, 7 + r, np.int32).tobytes()), np.int64(r), b, None) == r  # (adapter)
        tr = comm.traffic()
        assert tr.bytes_sent() == 0 and tr.bytes_received() == 0, f"rank {r}: {tr}"
        records = [rec["collective"] for rec in comm.flight_record()]
        z = np.zeros(5, np.int32)
        right, left = (r + 1) % comm.size, (r - 1) % comm.size
        assert comm.sendrecv(np.full(5, r, np.int32), right, z, left) == left
        return records, t.float().tolist(), np.frombuffer(bytes(b), np.int32).tolist(), z.tolist()
    out = ringcomm.run_local(n, body, device=device, timeout=60)
    for r, (records, t, b, z) in enumerate(out):
        assert records == [], f"rank {r}: {records}"
        assert (t, b, z) == ([float(i + r) for i in range(6)], [7 + r] * 2, [(r - 1) % n] * 5), f"rank {r}"


def test_sendrecv_fallbacks_and_torch():
    """Numpy ints, a bytearray and torch tensors: the Door's path and the fast lane agree."""
    torch = pytest.importorskip("torch")

    def body(comm):
        r, o = comm.rank, 1 - comm.rank
        y = bytearray(12)
        x = bytearray(np.full(3, 10 + r, np.int32).tobytes())  # (a buffer: bytes, as the receive's)
        assert comm.sendrecv(x, np.int64(o), y, np.int32(o), tag=np.int32(2)) == o
        t = torch.zeros(5, dtype=torch.bfloat16)
        assert comm.sendrecv(torch.arange(5, dtype=torch.bfloat16) + r, o, t, o) == o
        return np.frombuffer(bytes(y), np.int32).tolist(), t.float().tolist()
    a, b = ringcomm.run_local(2, body)
    assert a == ([11] * 3, [1.0, 2.0, 3.0, 4.0, 5.0]) and b == ([10] * 3, [0.0, 1.0, 2.0, 3.0, 4.0])


def test_sendrecv_of_host_arrays_never_takes_the_adapter():
    """numpy arrays and torch CPU tensors with int peers and tags are described
    natively (one call): the Python adapter, made to fail here, is never asked."""
    torch = pytest.importorskip("torch")

    class NoDoor:
        def p2p(self, *a):
            raise AssertionError("sendrecv went through the Python adapter")

    def body(comm):
        r, o = comm.rank, 1 - comm.rank
        comm._door = NoDoor()
        y, t = np.zeros(4, np.int16), torch.zeros(3, dtype=torch.float64)
        srcs = (comm.sendrecv(np.arange(4, dtype=np.int16) * (r + 1), o, y, o, tag=9),
                comm.sendrecv(torch.full((3,), 0.5 + r, dtype=torch.float64), o, t, None))
        return srcs, y.tolist(), t.tolist()
    a, b = ringcomm.run_local(2, body)
    assert a == ((1, 1), [0, 2, 4, 6], [1.5] * 3) and b == ((0, 0), [0, 1, 2, 3], [0.5] * 3)


def test_sendrecv_bad_input_posts_nothing():
    """Each error is raised before either side is posted: the exchange that
    follows, with other sizes, would take a stray message (a MismatchError)."""
    def body(comm):
        r, o = comm.rank, 1 - comm.rank
        x = np.arange(8, dtype=np.float32)
        for call, match in [(lambda: comm.sendrecv(x, o, x[4:], o), "overlap"),
                            (lambda: comm.sendrecv(x, o, np.zeros(8, np.float32), 2), "out of range"),
                            (lambda: comm.sendrecv(x, o, np.zeros(8, np.float32), r), "itself"),
                            (lambda: comm.sendrecv(x, r, np.zeros(8, np.float32), o), "itself"),
                            (lambda: comm.sendrecv(x, r, np.zeros(8, np.float32), r, recv_tag=1), "never be received"),
                            (lambda: comm.sendrecv(x, r, np.zeros(7, np.float32), r), "does not match"),
                            (lambda: comm.sendrecv(x, r, np.zeros(8, np.int32), None), "does not match"),
                            (lambda: comm.sendrecv(x, r, x, r), "overlap"),
                            (lambda: comm.sendrecv(x, o, np.zeros(8, np.float32), o, recv_tag=-1), "tag"),
                            (lambda: comm.sendrecv(x, 5, np.zeros(8, np.float32), o), "out of range"),
                            (lambda: comm.sendrecv(x, o, np.zeros((4, 4), np.float32)[:, 0], o), "contiguous")]:
            with pytest.raises(ringcomm.InvalidArgument, match=match):
                call()
        ro = np.zeros(8, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ringcomm.InvalidArgument, match="read-only"):
            comm.sendrecv(x, o, ro, o)
        y = np.zeros(3, np.float64)
        assert comm.sendrecv(np.full(3, r + 0.5), o, y, o) == o
        assert not comm.aborted
        return y.tolist()
    assert ringcomm.run_local(2, body) == [[1.5] * 3, [0.5] * 3]


def test_sendrecv_failures_name_the_peer_on_both_sides():
    """A receive of the wrong size fails the receiver and the sender; a
    peer that never sends: a timeout naming it."""
    def body(comm):
        r, o = comm.rank, 1 - comm.rank
        comm.timeout = 5
        try:  # rank 1 expects 8 floats, rank 0 sends 10 (and may be done: it hears at the barrier)
            comm.sendrecv(np.arange(10 if r == 0 else 8, dtype=np.float32), o, np.zeros(8, np.float32), o)
            comm.barrier()
            first = "no error"
        except ringcomm.RingcommError as e:
            first = f"{type(e).__name__}: {e}"
        return first
    m0, m1 = ringcomm.run_local(2, body)
    assert m1.startswith("MismatchError") and "40 bytes" in m1 and "rank 0" in m1, m1
    assert m0 != "no error", "rank 0 never heard of the mismatch"

    def lonely(comm):
        comm.timeout = 0.5
        if comm.rank == 1:
            return None
        with pytest.raises(ringcomm.CollectiveTimeout, match="rank 1"):
            comm.sendrecv(np.zeros(3, np.float32), 1, np.zeros(3, np.float32), 1)
        return comm.aborted
    assert ringcomm.run_local(2, lonely)[0] is True


# ---- device communicators -------------------------------------------------
# The payload goes through host memory, copied out of and into the device
# buffer on the caller's stream (csrc/engine/p2p.h; on the emulated device
# the caller is the host: a plain copy). "emulated": the collectives between
# the p2p ops run on queues with random delays; "emulated-nccl": the NCCL
# transport's own code (GroupedTransport) carries the collectives' payload,
# and its host transport the p2p messages. (The size-mismatch and timeout
# tests above run on both too.)
DEVICES = ["emulated", "emulated-nccl"]


def run_dev(n, body, device, **kw):
    kw.setdefault("timeout", 60)
    return ringcomm.run_local(n, body, device=device, jitter_us=100, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", slow_except([2, 3], [2, 3, 5]))
@pytest.mark.parametrize("count", [0, 1, 97, 40000])
def test_device_ring_shift_blocking_and_batched(device, n, count):
    def body(comm):
        r = comm.rank
        left, right = (r - 1) % n, (r + 1) % n
        x = data(r, count, "float32")
        y = np.full(count, -1, np.float32)
        if r % 2 == 0:
            comm.send(x, right)
            src = comm.recv(y, left)
        else:
            src = comm.recv(y, left)
            comm.send(x, right)
        check(y, data(left, count, "float32"), r, "blocking ring shift")
        assert src == left
        # Both directions at once, large and small, with a collective of the
        # same communicator in between (its payload on the device path).
        y1, y2 = np.full(count, -1, np.float32), np.full(count, -1, np.float32)
        works = comm.batch_isend_irecv([ringcomm.P2POp("irecv", y1, left, tag=3),
                                        ringcomm.P2POp("irecv", y2, right, tag=3),
                                        ringcomm.P2POp("isend", data(r, count, "float32", 1), right, tag=3),
                                        ringcomm.P2POp("isend", data(r, count, "float32", 2), left, tag=3)])
        z = data(r, count, "float32", 5)
        comm.all_reduce(z)
        for w in reversed(works):
            w.wait()
        check(y1, data(left, count, "float32", 1), r, "batched, from the left")
        check(y2, data(right, count, "float32", 2), r, "batched, from the right")
        check(z, sum(data(p, count, "float32", 5).astype(np.float64) for p in range(n)), r, "all_reduce between")
        t = comm.traffic()
        assert t.bytes_sent("send") == 3 * count * 4 and t.bytes_received("recv") == 3 * count * 4, t
        return True
    assert all(run_dev(n, body, device))


@pytest.mark.parametrize("device", DEVICES)
def test_device_any_source_and_every_dtype(device):
    n = 4

    def body(comm):
        r = comm.rank
        out = {}
        for dtype in vocab.DTYPES:
            if r != 0:
                comm.send(data(r, 33, dtype), 0, tag=2)
                continue
            for _ in range(n - 1):
                y = np.zeros(33, vocab.NUMPY[dtype])
                src = comm.recv(y, None, tag=2)
                check(y, data(src, 33, dtype), r, f"{dtype} from rank {src} (any source)")
                out.setdefault(dtype, []).append(src)
        return {d: sorted(s) for d, s in out.items()}
    got = run_dev(n, body, device)[0]
    assert got == {d: [1, 2, 3] for d in vocab.DTYPES}, got


@pytest.mark.parametrize("device", DEVICES)
def test_device_isend_takes_its_copy_at_once(device):
    # The staged copy is what travels: the caller may reuse its buffer once
    # isend returns (the copy out is done), before the receiver has taken it.
    count = 100000  # well past any eager limit

    def body(comm):
        if comm.rank == 0:
            x = data(0, count, "float32")
            w = comm.isend(x, 1)
            x[:] = -1  # before rank 1 receives
            comm.barrier()
            w.wait()
            return True
        comm.barrier()
        y = np.zeros(count, np.float32)
        comm.recv(y, 0)
        check(y, data(0, count, "float32"), 1, "isend's data, overwritten by the sender after isend returned")
        return True
    assert all(run_dev(2, body, device))


@pytest.mark.parametrize("device", DEVICES)
def test_device_send_beside_a_queued_collective(device):
    # Rank 0 queues an all_reduce, then sends to rank 1, which receives
    # before it joins the collective: the send must not wait for the queued
    # collective (its copy goes on the caller's stream, not the device's
    # queues), as on a host communicator.
    def body(comm):
        r = comm.rank
        z = data(r, 5000, "float32", 9)
        if r == 0:
            w = comm.all_reduce(z, async_op=True)
            comm.send(data(0, 3000, "float32"), 1)
            w.wait()
        elif r == 1:
            y = np.zeros(3000, np.float32)
            comm.recv(y, 0)
            check(y, data(0, 3000, "float32"), r, "the send beside the queued all_reduce")
            comm.all_reduce(z)
        else:
            comm.all_reduce(z)
        check(z, sum(data(p, 5000, "float32", 9).astype(np.float64) for p in range(comm.size)), r, "all_reduce")
        return True
    assert all(run_dev(3, body, device, timeout=20))

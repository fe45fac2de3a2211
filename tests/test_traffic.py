"""traffic.expected (the closed form) on its own, and the Traffic snapshot API."""

import numpy as np
import pytest

import ringcomm
from ringcomm import traffic
from tiers import slow_except

COLLS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"]


@pytest.mark.parametrize("n", slow_except([2, 3, 8], [2, 3, 4, 8, 64]))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float64"])
def test_textbook_fractions_for_divisible_counts(n, dtype):
    count = 12 * n * 7
    nbytes = count * np.dtype(ringcomm.vocab.NUMPY[dtype]).itemsize
    for r in range(n):
        ar = traffic.expected("all_reduce", count, dtype, n, r)
        rs = traffic.expected("reduce_scatter", count, dtype, n, r)
        ag = traffic.expected("all_gather", count, dtype, n, r)
        assert ar.bytes_sent == ar.bytes_received == 2 * (n - 1) * nbytes // n
        assert rs.bytes_sent == ag.bytes_sent == (n - 1) * nbytes // n
        assert ar.sent == {(r + 1) % n: ar.bytes_sent}, "only the right neighbour receives"
        assert ar.received == {(r - 1) % n: ar.bytes_received}, "only the left neighbour sends"


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("n,count", [(1, 10), (2, 0), (3, 1), (3, 2), (5, 4), (5, 6), (7, 100003)])
def test_what_is_sent_is_received(coll, n, count):
    exp = [traffic.expected(coll, count, "float32", n, r, root=n // 2) for r in range(n)]
    for r in range(n):
        for peer, b in exp[r].sent.items():
            assert exp[peer].received.get(r) == b
    if n == 1:
        assert all(e.bytes_sent == 0 and e.bytes_received == 0 for e in exp)


@pytest.mark.parametrize("n,count,root", [(2, 262144, 0), (2, 262144, 1), (3, 7, 2), (4, 10, 2), (5, 100003, 0),
                                          (8, 3, 5)])
def test_single_copy_reduce_parts(n, count, root):
    # the window's single-copy reduce: every element in one part, the root's
    # the largest (it writes into no peer), the leaves' alike within one;
    # each rank's sends are what its peers receive
    parts = traffic.sc_reduce_parts(count, n, root)
    assert sum(parts) == count and len(parts) == n
    leaves = [c for q, c in enumerate(parts) if q != root]
    assert max(leaves) - min(leaves) <= 1 and parts[root] >= max(leaves) - 1
    if count >= 1000:
        assert parts[root] > max(leaves)
    if n == 2 and count == 262144:
        assert parts[root] == 262144 * 12 // 19  # root : leaf = 1.4 + 1 : 1.4
    exp = [traffic.expected("reduce", count, "float32", n, r, root=root, algorithm="shm", single_copy_min=4)
           for r in range(n)]
    for r in range(n):
        for peer, b in exp[r].sent.items():
            assert exp[peer].received.get(r) == b
    leaf = (root + 1) % n
    assert exp[leaf].sent.get(root, 0) == (4 * (parts[root] + parts[leaf]) if parts[leaf] else 4 * parts[root])
    # under the limit: the direct algorithm's equal chunks
    direct = traffic.expected("reduce", count, "float32", n, root, root=root, algorithm="shm")
    assert traffic.expected("reduce", count, "float32", n, root, root=root, algorithm="shm",
                            single_copy_min=4 * count + 1) == direct


def test_broadcast_chain():
    exp = [traffic.expected("broadcast", 10, "int64", 4, r, root=2) for r in range(4)]
    assert [e.bytes_sent for e in exp] == [80, 0, 80, 80]      # rank 1 = root-1 ends the chain
    assert [e.bytes_received for e in exp] == [80, 80, 0, 80]  # the root receives nothing


def test_expected_rejects_bad_arguments():
    with pytest.raises(ValueError):
        traffic.expected("allreduce", 10, "float32", 2, 0)
    with pytest.raises(ValueError):
        traffic.expected("all_reduce", 10, "float32", 2, 2)


def test_snapshot_api():
    def body(comm):
        comm.all_reduce(np.arange(8, dtype=np.float32), algorithm="ring")
        t = comm.traffic()
        d = t.to_dict()
        assert t.bytes_sent("all_reduce") == traffic.expected("all_reduce", 8, "float32", 2, comm.rank).bytes_sent
        # the ring's header: one control message of its own
        assert t.bytes_sent("all_reduce", kind="control") > 0 and t.msgs_sent("all_reduce", kind="control") == 1
        assert set(d) == {"all_reduce"} and "payload" in d["all_reduce"][1 - comm.rank]
        assert "all_reduce" in str(t)
        comm.reset_traffic()
        # recursive doubling on two ranks: the one payload message's stamp is
        # the header (outside its bytes): no control byte at all
        comm.all_reduce(np.arange(8, dtype=np.float32), algorithm="recursive_doubling")
        t = comm.traffic()
        assert t.msgs_sent("all_reduce") == 1 and t.bytes_sent("all_reduce") == 32
        assert t.msgs_sent("all_reduce", kind="control") == 0 and t.bytes_sent("all_reduce", kind="control") == 0
        comm.reset_traffic()
        return comm.traffic().bytes_sent(kind="all")
    assert ringcomm.run_local(2, body) == [0, 0]

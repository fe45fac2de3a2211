"""Step traces from the engine, the teaching demos, and their pictures."""

import io
import json
import re

import numpy as np
import pytest

import ringcomm
from ringcomm import traffic
from ringcomm.teach import demo
from ringcomm.trace import to_chrome
from tiers import slow_except


def traced_allreduce(n, count, segment_bytes=None, values=False):
    def body(comm):
        x = np.arange(count, dtype=np.float32) + comm.rank
        comm.reset_traffic()
        with comm.trace(values=values) as t:
            comm.all_reduce(x, algorithm="ring")
        return t, comm.traffic()
    return ringcomm.run_local(n, body, segment_bytes=segment_bytes)


@pytest.mark.parametrize("n", slow_except([1, 2, 3, 8], range(1, 9)))
@pytest.mark.parametrize("count,seg", [(24, None), (29, None), (29, 8)])
def test_trace_follows_the_ring_schedule(n, count, seg):
    out = traced_allreduce(n, count, seg)
    split = [count // n + (1 if c < count % n else 0) for c in range(n)]
    for r, (t, led) in enumerate(out):
        steps = t.steps
        assert len(steps) == 2 * (n - 1), f"rank {r}: {len(steps)} steps"
        rs = [s for s in steps if s.phase == "reduce-scatter"]
        ag = [s for s in steps if s.phase == "all-gather"]
        assert [s.step for s in rs] == list(range(n - 1)) and [s.step for s in ag] == list(range(n - 1))
        for s in steps:
            assert s.rank == r and s.send_peer == (r + 1) % n and s.recv_peer == (r - 1) % n
            assert s.t_end_ns >= s.t_start_ns
        for k, s in enumerate(rs):
            assert (s.send_chunk, s.recv_chunk) == ((r - k - 1) % n, (r - k - 2) % n), f"rank {r} rs step {k}"
        for k, s in enumerate(ag):
            assert (s.send_chunk, s.recv_chunk) == ((r - k) % n, (r - k - 1) % n), f"rank {r} ag step {k}"
        for s in steps:
            assert s.send_bytes == split[s.send_chunk] * 4 and s.recv_bytes == split[s.recv_chunk] * 4
        assert sum(s.send_bytes for s in steps) == led.bytes_sent("all_reduce")
        assert sum(s.recv_bytes for s in steps) == led.bytes_received("all_reduce")


def test_trace_is_off_by_default_and_records_values():
    def body(comm):
        x = np.arange(6, dtype=np.int64) * (comm.rank + 1)
        comm.all_reduce(x, algorithm="ring")  # not traced
        with comm.trace(values=True) as t:
            comm.all_reduce(x, algorithm="ring")
        comm.all_reduce(x, algorithm="ring")  # not traced
        return t
    traces = ringcomm.run_local(3, body)
    for t in traces:
        assert {s.seq for s in t.steps} == {2}
        last_rs = [s for s in t.steps if s.phase == "reduce-scatter"][-1]
        assert last_rs.recv_chunk == t.rank
        # after the last reduce-scatter step the rank holds the full sum of its chunk
        # (the first call left 6*arange(6) everywhere; the traced one sums three of those)
        lo = 2 * t.rank
        np.testing.assert_array_equal(last_rs.values, (np.arange(6) * 18)[lo:lo + 2])


def test_chrome_trace_has_one_track_per_rank(tmp_path):
    traces = [t for t, _ in traced_allreduce(4, 16)]
    path = tmp_path / "ring.json"
    to_chrome(traces, str(path))
    doc = json.load(open(path))
    tracks = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks == {0, 1, 2, 3}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 4 * 6 and all(e["dur"] > 0 for e in slices)


def table_rows(text):
    """(rank, sent, received, expected sent, expected received) rows of a demo traffic table."""
    return [tuple(map(int, m)) for m in re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", text, re.M)]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [10, 15])
def test_demo_ring_prints_real_steps_and_exact_traffic(n, count):
    buf = io.StringIO()
    demo.print_ring(n, count, out=buf)
    text = buf.getvalue()
    assert "(equal)" in text
    rows = table_rows(text)
    assert [r[0] for r in rows] == list(range(n))
    for rank, sent, recv, exp_sent, exp_recv in rows:
        assert (sent, recv) == (exp_sent, exp_recv)
        e = traffic.expected("all_reduce", count, "int64", n, rank)
        assert (sent, recv) == (e.bytes_sent, e.bytes_received)
    assert text.count("holds c") == n * (n - 1)   # one line per rank per reduce-scatter step
    assert text.count("got c") == n * (n - 1)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_demo_traffic_master_centric_vs_ring(n):
    count = 120  # divisible by every n here: the textbook fractions are exact
    rows = demo.measure_traffic(n, count)
    nbytes = count * 8
    assert rows[0]["naive"] == ((n - 1) * nbytes, (n - 1) * nbytes)
    for r in range(1, n):
        assert rows[r]["naive"] == (nbytes, nbytes)
    for r in range(n):
        assert rows[r]["ring"] == (2 * (n - 1) * nbytes // n,) * 2
        assert rows[r]["reduce_scatter"] == rows[r]["all_gather"] == ((n - 1) * nbytes // n,) * 2
    buf = io.StringIO()
    demo.print_traffic(n, count, out=buf)
    assert f"{(n - 1) * nbytes}" in buf.getvalue()


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_naive_all_reduce_is_correct(n):
    def body(comm):
        x = (np.arange(13) + 10 * comm.rank).astype(np.float64)
        comm.all_reduce(x, op="avg", algorithm="naive")
        y = np.arange(13, dtype=np.int32) * (comm.rank + 1)
        out = np.empty_like(y)
        comm.all_reduce(y, op="max", out=out, algorithm="naive")
        return x, out
    for x, y in ringcomm.run_local(n, body, segment_bytes=16):
        np.testing.assert_array_equal(x, np.arange(13) + 10 * (n - 1) / 2)
        np.testing.assert_array_equal(y, np.arange(13) * n)


def test_algorithm_mismatch_is_detected():
    def body(comm):
        with pytest.raises(ringcomm.MismatchError, match="naive"):
            comm.all_reduce(np.ones(4), algorithm="naive" if comm.rank == 0 else "ring")
        return True
    assert all(ringcomm.run_local(3, body))


def test_drawings_are_well_formed(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg
    traces, _, _ = demo.record_ring(3, 7)
    png, gif = tmp_path / "ring.png", tmp_path / "ring.gif"
    demo.draw_ring(traces, 3, 7, str(png))
    demo.draw_ring(traces, 3, 7, str(gif))
    assert mpimg.imread(str(png)).shape[0] > 100
    assert open(gif, "rb").read(6) in (b"GIF89a", b"GIF87a")
    bars = tmp_path / "traffic.png"
    demo.draw_traffic(demo.measure_traffic(4, 16), 4, 16, str(bars))
    assert mpimg.imread(str(bars)).shape[0] > 100


def test_demo_scaling_fits_the_model(tmp_path):
    buf = io.StringIO()
    res = demo.scaling(max_n=4, nbytes=4096, mpi_max=2, reps=2, out=buf, png=None)
    text = buf.getvalue()
    assert "alpha-beta fit" in text and "1024" in text
    assert res["model"].alpha >= 0 and res["model"].beta >= 0
    assert res["measured"][2][1] is not None  # the MPI run happened


def test_cli_demo_ring(tmp_path):
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "demo", "ring", "-n", "4", "--count", "8"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "result on every rank: [60, 64, 68, 72, 76, 80, 84, 88]" in res.stdout


def test_demo_algorithms_prints_steps_and_peers_from_the_engine(tmp_path):
    import subprocess
    import sys
    png = tmp_path / "a.png"
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "demo", "algorithms", "-n", "4", "--count", "64",
                          "--png", str(png)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    table = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines() if ln.strip().split()[:1]
             and ln.split()[0] in ("ring", "recursive_doubling", "halving_doubling", "naive")}
    # steps (trace) and the busiest rank's bytes (ledger) of one all_reduce of 512 B on 4 ranks
    assert table["ring"][1:3] == ["6", "768"]
    assert table["recursive_doubling"][1:3] == ["2", "1024"]
    assert table["halving_doubling"][1:3] == ["4", "768"]
    assert table["naive"][1:3] == ["6", "1536"]
    assert png.stat().st_size > 1000


# ---- issue 23: all_to_all and reduce (tree next to the ring) -------------------

@pytest.mark.parametrize("n,block", [(1, 2), (2, 3), (3, 1), (4, 2), (5, 2)])
def test_demo_all_to_all_prints_the_transpose_and_the_closed_form(n, block):
    from ringcomm.teach import rooted_demo
    buf = io.StringIO()
    res = rooted_demo.print_all_to_all(n, block, out=buf)
    text = buf.getvalue()
    assert res["equal"] and "input table transposed: equal" in text
    count = n * block
    # the output table, parsed back: row r, column q holds 10*q + r
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("output:")) + 2
    for r in range(n):
        assert [int(v) for v in lines[start + r].split()] == [r] + [10 * q + r for q in range(n)]
    # the ledger table, parsed back, against traffic.expected (per peer and in total)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("bytes rank r sent")) + 2
    for r in range(n):
        nums = [int(v) for v in lines[start + r].split()]
        exp = traffic.expected("all_to_all", count, "int64", n, r)
        assert nums[0] == r
        assert nums[1:1 + n] == [exp.sent.get(q, 0) for q in range(n)]
        assert nums[1 + n:] == [exp.bytes_sent, exp.bytes_received, exp.bytes_sent, exp.bytes_received]
        assert exp.bytes_sent == (n - 1) * block * 8
    # one traced step per partner on every rank
    for x, y, t, led in res["results"]:
        assert len(t.steps) == n - 1
        assert sorted(s.send_peer for s in t.steps) == [q for q in range(n) if q != t.rank]


@pytest.mark.parametrize("n,count,root", [(1, 3, 0), (2, 8, 0), (3, 5, 1), (4, 8, 0), (5, 7, 3)])
def test_demo_reduce_tree_and_ring_match_the_closed_forms(n, count, root):
    from ringcomm.teach import rooted_demo
    buf = io.StringIO()
    res = rooted_demo.print_reduce(n, count, root, out=buf)
    text = buf.getvalue()
    assert res["equal"] and "DIFFERENT" not in text
    want = sum(rooted_demo.reduce_data(r, count) for r in range(n)).tolist()
    assert text.count(f"result on rank {root}: {want} (equal to numpy)") == 2
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("bytes per rank")) + 3
    for r in range(n):
        nums = [int(v) for v in lines[start + r].split()]
        assert nums[0] == r
        for k, alg in ((1, "binomial"), (6, "ring")):
            exp = traffic.expected("reduce", count, "int64", n, r, root=root, algorithm=alg)
            steps, sent, received, esent, erecv = nums[k:k + 5]
            assert (sent, received) == (exp.bytes_sent, exp.bytes_received) == (esent, erecv), (alg, r, nums)
    # the tree: ceil(log2 n) steps on the root, every other rank sends the whole buffer once
    lt = res["ledger_tree"]
    assert lt[root]["steps"] == (n - 1).bit_length()
    assert all(lt[r]["sent"] == count * 8 for r in range(n) if r != root) and lt[root]["sent"] == 0


def test_cli_demo_all_to_all_and_reduce(capsys):
    assert demo.main(["all_to_all", "-n", "3", "--count", "1"]) == 0
    assert "transposed: equal" in capsys.readouterr().out
    assert demo.main(["reduce", "-n", "3", "--root", "2"]) == 0
    out = capsys.readouterr().out
    assert "binomial tree" in out and "ring reduce-scatter + gather" in out
    with pytest.raises(SystemExit):
        demo.main(["reduce", "-n", "2", "--root", "2"])

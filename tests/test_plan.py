"""The ring plan (csrc/algorithms/plan.h) against numpy.array_split and the ring's invariants."""

import numpy as np
import pytest

from ringcomm._native import core


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 64])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 100003])
@pytest.mark.parametrize("seg_elems", [1, 3, 1000, 10**9])
def test_chunks_and_segments_follow_the_split_rule(n, count, seg_elems):
    es = 4
    p = core.ring_plan(count, n, es, min(seg_elems * es, 1 << 30))
    want = np.array_split(np.arange(count), n)
    for c, (begin, size) in enumerate(p["chunks"]):
        assert size == len(want[c]), f"chunk {c}"
        if size:
            assert begin == want[c][0], f"chunk {c} begins at {begin}, expected {want[c][0]}"
    k = p["segments"]
    assert k >= 1
    for c, segs in enumerate(p["segment_spans"]):
        assert len(segs) == k, "every chunk has the same number of segments"
        idx = np.concatenate([np.arange(b, b + s) for b, s in segs]) if segs else np.array([])
        np.testing.assert_array_equal(idx, want[c], err_msg=f"segments of chunk {c} do not tile it")
        assert max(s for _, s in segs) <= max(1, seg_elems), f"chunk {c} has a segment above the limit"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13])
def test_ring_schedule(n):
    p = core.ring_plan(10 * n, n, 4, 1 << 20)
    for r in range(n):
        left = (r - 1) % n
        rs, ag = p["reduce_scatter_schedule"][r], p["all_gather_schedule"][r]
        assert len(rs) == len(ag) == n - 1
        # reduce-scatter: sends every chunk but its own; receives every chunk but left's
        assert sorted(s for s, _ in rs) == sorted(set(range(n)) - {r})
        assert sorted(v for _, v in rs) == sorted(set(range(n)) - {left})
        assert n == 1 or rs[-1][1] == r, "the last chunk received completes chunk r"
        # all-gather: starts by sending its own chunk; receives every other chunk once
        assert n == 1 or ag[0][0] == r
        assert sorted(v for _, v in ag) == sorted(set(range(n)) - {r})
        for s in range(n - 1):
            # what arrives from the left is what the left sent at the same step
            assert rs[s][1] == p["reduce_scatter_schedule"][left][s][0]
            assert ag[s][1] == p["all_gather_schedule"][left][s][0]
            # and it is forwarded at the next step
            if s + 1 < n - 1:
                assert rs[s][1] == rs[s + 1][0] and ag[s][1] == ag[s + 1][0]

"""Arrays ringcomm hands out (gradient views, the torch DDP wrapper's grads,
ZeRO gradients and gathered parameters), held across iterations with the
ready order shuffled per iteration: the exact average on every rank in every
iteration, or StaleViewError at the first use of a stale one; never a wrong
number (issue 50: the bucketer's rebuild used to leave held numpy views
aliasing other parameters' new places, some in flight).

The cases are tests/scripts/held_views.py, run in process (run_local) and
under `ringcomm run`."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ringcomm
from ringcomm.train.handed import HandedOut

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
import held_views  # noqa: E402
from tiers import slow_except  # noqa: E402

ITERS = 50
BUCKETER = [("refetch", "numpy"), ("refetch", "torch"), ("held", "torch"), ("no_sync", "torch"),
            ("find_unused", "torch"), ("find_unused", "numpy")]


def needs(fam):
    if fam == "torch":
        pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case,fam", BUCKETER)
def test_views_give_the_average_every_iteration(case, fam, n):
    needs(fam)
    for d in ringcomm.run_local(n, held_views.run, case, fam, ITERS):
        assert d.get("ok") == ITERS and d["layout"] == 1, d  # (rebuilt once, after the first iteration)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["held", "no_sync"])
def test_held_numpy_views_fail_at_the_first_stale_use(case, n):
    # numpy views cannot move with a rebuild: the first iteration's averages
    # are read through them (checked inside), the next iteration's first
    # write raises, on every rank, naming grad_views.
    for d in ringcomm.run_local(n, held_views.run, case, "numpy", ITERS):
        assert d.get("stale_at") == 1, d
        assert "grad_views()" in d["message"] and "rebuilt" in d["message"], d


def test_a_retired_view_refuses_reads_and_writes_through_every_numpy_path():
    def body(comm):
        b = ringcomm.GradBucketer([np.zeros(10, np.float32), np.zeros(20, np.float32)], comm,
                                  bucket_cap_mb=0, first_bucket_mb=0)
        old = b.grad_views()
        assert all(isinstance(v, HandedOut) for v in old) and repr(old[0]).startswith("array(")
        for i in (0, 1):  # forward order: the rebuild changes the layout
            old[i][...] = i + 1
            b.mark_ready(i)
        b.finalize()
        assert b.layout_version == 1
        assert float(old[1][3]) == 2.0 and np.asarray(old[0] * 2)[0] == 2.0  # still readable: the result
        refused = []
        for use in (lambda v: v.__setitem__(0, 1), lambda v: v.__iadd__(1), lambda v: np.copyto(v, 1),
                    lambda v: np.add(v, 1, out=v), lambda v: v.fill(1)):
            try:
                use(old[0])
            except (ringcomm.StaleViewError, ValueError) as exc:
                refused.append(type(exc).__name__)
        b.zero_grad()  # the next iteration: reading is refused too
        for use in (lambda v: v[0], lambda v: v + 1, lambda v: v.sum(), lambda v: np.dot(v, v)):
            try:
                use(old[0])
            except ringcomm.StaleViewError:
                refused.append("read")
        live = b.grad_views()
        assert not any(v is w for v, w in zip(old, live)) and all(w.flags.writeable for w in live)
        return refused
    for refused in ringcomm.run_local(2, body):
        assert refused == ["StaleViewError", "StaleViewError", "ValueError", "StaleViewError", "ValueError",
                           "read", "read", "read", "read"], refused


@pytest.mark.parametrize("n", [2, 3])
def test_torch_ddp_grads_held_across_the_rebuild(n):
    needs("torch")
    for d in ringcomm.run_local(n, held_views.run, "ddp", "torch", 8):
        assert d.get("ok") == 8 and d["layout"] == 1, d


@pytest.mark.parametrize("case,what", [("zero_grads", "grads(0)"), ("zero_gathered", "gathered(0)")])
def test_zero_arrays_held_past_their_memory(case, what):
    for d in ringcomm.run_local(3, held_views.run, case, "numpy", 4):
        assert d.get("stale_at") == (1 if case == "zero_grads" else 0) and what in d["message"], d


RUN = [sys.executable, "-m", "ringcomm.cli", "run"]


@pytest.mark.parametrize("n", slow_except([2], [2, 3]))
@pytest.mark.parametrize("case,fam", slow_except([("held", "numpy"), ("ddp", "torch")],
                                              [("held", "numpy"), ("held", "torch"), ("refetch", "numpy"),
                                               ("ddp", "torch")]))
def test_under_ringcomm_run(case, fam, n):
    needs(fam)
    script = os.path.join(os.path.dirname(__file__), "scripts", "held_views.py")
    iters = 8 if case == "ddp" else 20
    res = subprocess.run(RUN + ["-n", str(n), "--", sys.executable, script, case, fam, str(iters)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    out = [json.loads(l[7:]) for l in res.stdout.splitlines() if l.startswith("RESULT ")]
    assert sorted(d["rank"] for d in out) == list(range(n)), res.stdout
    for d in out:
        if case == "held" and fam == "numpy":
            assert d.get("stale_at") == 1 and "grad_views()" in d["message"], d
        else:
            assert d.get("ok") == iters and d["layout"] == 1, d


def test_a_numpy_view_is_read_only_from_mark_ready_to_the_end_of_finalize():
    # Writing a gradient after declaring it final would race its bucket's
    # all_reduce (in flight from the moment the bucket is full): refused.
    def body(comm):
        b = ringcomm.GradBucketer([np.zeros(10, np.float32), np.zeros(20, np.float32)], comm,
                                  bucket_cap_mb=0, first_bucket_mb=0, rebuild_buckets=False)
        g = b.grad_views()
        g[1][...] = comm.rank
        b.mark_ready(1)
        refused = False
        try:
            g[1] += 1
        except ValueError:
            refused = True
        g[0][...] = comm.rank  # not marked yet: writable
        b.mark_ready(0)
        b.finalize()
        g[1] *= 2  # the next iteration may write again
        return refused, float(g[0][0]), float(g[1][0])
    for refused, a, c in ringcomm.run_local(2, body):
        assert refused and a == 0.5 and c == 1.0, (refused, a, c)

"""GradBucketer: bucketed gradient all_reduce, checked against per-gradient
all_reduce and numpy references, in-process (threads) and over MPI.

Gradients are exactly predictable and rank-dependent: small dyadic values, so
float sums over ranks are exact and every reference is known in closed form.
Failure messages name the rank and parameter index.
"""

import json

import ml_dtypes
import numpy as np
import pytest

import ringcomm
from ringcomm.errors import DivergenceError, RegistrationMismatchError, UnusedParametersError
from ringcomm.train.bucketer import GradBucketer
from ringcomm.train.consistency import broadcast_parameters, check_consistency
from ringcomm.trace import merge_chrome_traces
from tiers import slow_except

# Shapes include a scalar, an empty tensor and one larger than the small caps.
SHAPES = [(3, 5), (7,), (), (2, 3, 4), (0,), (11, 13), (1,), (40,)]
NAMES = [f"p{i}" for i in range(len(SHAPES))]
DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
          "bfloat16": ml_dtypes.bfloat16, "int32": np.int32}
CAPS_MB = [0.0, 60 / 2**20, 1 / 1024, 25.0]  # per-parameter, 60 B (< most params), 1 KiB, one bucket


def grad_value(i, shape, rank, step=0, dtype=None):
    """Gradient of parameter i on `rank`: rank-dependent dyadic values (exact in every
    dtype used; integers for integer dtypes)."""
    k = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    v = ((k % 7) - 3) * (rank + 1) + 4 * i - 2 * step
    return v if dtype == "int32" else v / 4


def params_for(dtype, shapes=SHAPES):
    return [np.zeros(s, DTYPES[dtype]) for s in shapes]


def compare(got, want, what, rank, dtype):
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2}.get(dtype, 0)
    got64 = np.asarray(got, dtype=np.float64)
    if got64.shape != np.shape(want):
        return [f"rank {rank} {what}: shape {got64.shape}, expected {np.shape(want)}"]
    bad = ~np.isclose(got64, want, rtol=tol, atol=tol)
    if bad.any():
        j = np.flatnonzero(bad.ravel())[0]
        return [f"rank {rank} {what}: {bad.sum()} wrong elements, first at flat index {j}: "
                f"got {got64.ravel()[j]}, expected {np.ravel(want)[j]}"]
    return []


def reference(i, shape, n, average, step=0, dtype=None):
    s = sum(grad_value(i, shape, r, step, dtype) for r in range(n))
    return s / n if average else s


def one_iteration(b, rank, step=0, order=None, dtype=None):
    views = b.grad_views()
    for i in (order if order is not None else reversed(range(b.num_params))):
        views[i][...] = grad_value(i, views[i].shape, rank, step, dtype)
        b.mark_ready(i)
    return [v.copy() for v in b.finalize()]


# ---------------------------------------------------------------------------
def _matches_body(comm, dtype, cap):
    n, rank, errs = comm.size, comm.rank, []
    average = dtype != "int32"
    b = GradBucketer(params_for(dtype), comm, bucket_cap_mb=cap, first_bucket_mb=min(cap, 1e-4),
                     names=NAMES, average=average)
    for step in range(2):  # the second runs on the rebuilt buckets
        got = one_iteration(b, rank, step, dtype=dtype)
        for i, shape in enumerate(SHAPES):
            # The unbucketed reference: one all_reduce per gradient, same averaging rule.
            g = np.asarray(grad_value(i, shape, rank, step, dtype)).astype(DTYPES[dtype])
            if average and dtype in ("float16", "bfloat16") and n > 1:
                g[...] = g.astype(np.float32) * np.float32(1 / n)
                comm.all_reduce(g, op="sum")
            else:
                comm.all_reduce(g, op="avg" if average and n > 1 else "sum")
            if dtype in ("float32", "float64", "int32") and not np.array_equal(got[i], g):
                errs.append(f"rank {rank} step {step} parameter {i}: bucketed {got[i].ravel()[:4]} != "
                            f"unbucketed {g.ravel()[:4]}")
            want = reference(i, shape, n, average, step, dtype)
            errs += compare(got[i], want, f"step {step} parameter {i}", rank, dtype)
            errs += compare(g, want, f"unbucketed parameter {i}", rank, dtype)
    return errs


@pytest.mark.parametrize("n", slow_except([1, 2, 3], [1, 2, 3, 4, 5]))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_bucketed_equals_unbucketed(n, dtype):
    for cap in CAPS_MB:
        errs = [e for es in ringcomm.run_local(n, _matches_body, dtype, cap) for e in es]
        assert not errs, f"cap {cap} MiB:\n" + "\n".join(errs[:20])


def test_bucket_layout_caps_and_dtypes():
    params = [np.zeros(5, np.float32), np.zeros(5, np.float64), np.zeros(1000, np.float32),
              np.zeros(2, np.float64), np.zeros(5, np.float32), np.zeros(5, np.float32)]

    def body(comm):
        b = GradBucketer(params, comm, bucket_cap_mb=80 / 2**20, first_bucket_mb=40 / 2**20)
        return [(x.params, x.dtype) for x in b.buckets]

    layout = ringcomm.run_local(2, body)[0]
    # Reverse order 5,4,3,2,1,0, one open bucket per dtype. float32: 5+4 reach the
    # first cap (40 B); 2 (4000 B) exceeds the cap alone; 0 is left over. float64:
    # 3+1 (56 B) reach the first cap. Launch order: by the position of the last member.
    assert layout == [((5, 4), "float32"), ((2,), "float32"), ((3, 1), "float64"), ((0,), "float32")]
    # Zero cap: one bucket per parameter, launched in reverse parameter order.
    assert [x.params for x in ringcomm.run_local(1, lambda c: GradBucketer(params, c, bucket_cap_mb=0,
                                                 first_bucket_mb=0).buckets)[0]] == [(5,), (4,), (3,), (2,), (1,), (0,)]


def test_float16_average_does_not_overflow():
    # 4 ranks x 60000 would be 240000 > float16 max (65504) if summed before dividing.
    def body(comm):
        p = [np.zeros(64, np.float16), np.zeros(8, ml_dtypes.bfloat16)]
        b = GradBucketer(p, comm)
        v = b.grad_views()
        v[0][...] = 60000 + 32 * comm.rank
        v[1][...] = 3e38 * (1 if comm.rank % 2 else 0.5)
        b.sync()
        return [x.astype(np.float64) for x in b.grad_views()]

    for rank, (a, c) in enumerate(ringcomm.run_local(4, body)):
        assert np.isfinite(a).all() and np.allclose(a, 60048, rtol=1e-3), f"rank {rank}: {a[:4]}"
        assert np.isfinite(c).all() and np.allclose(c, 2.25e38, rtol=1e-2), f"rank {rank}: {c[:4]}"


class Recording:
    """A communicator proxy that records the all_reduce launches (buffer id, element count)."""

    def __init__(self, comm, log):
        self._comm, self.log = comm, log

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def all_reduce(self, x, *a, **kw):
        self.log.append(("all_reduce", x.size))
        return self._comm.all_reduce(x, *a, **kw)


def test_launch_order_strict_and_early():
    shapes = [(4,), (4,), (4,), (4,), (4,), (4,)]   # 16 B each; cap 32 B: buckets (5,4) (3,2) (1,0)

    def body(comm):
        log = []
        rc = Recording(comm, log)
        b = GradBucketer([np.zeros(s, np.float32) for s in shapes], rc, bucket_cap_mb=32 / 2**20,
                         first_bucket_mb=32 / 2**20, rebuild_buckets=False)
        assert [x.params for x in b.buckets] == [(5, 4), (3, 2), (1, 0)]
        v = b.grad_views()
        for i in range(6):
            v[i][...] = grad_value(i, (4,), comm.rank)
        seen = []
        # Complete the last bucket first, then the middle one: nothing may launch
        # before bucket 0 is complete; then 0, 1, 2 launch together in order.
        for i in [1, 0, 3, 2, 5]:
            b.mark_ready(i)
            seen.append(len(log))
        b.mark_ready(4)
        seen.append(len(log))
        b.finalize()
        return seen, log

    for rank, (seen, log) in enumerate(ringcomm.run_local(3, body)):
        assert seen == [0, 0, 0, 0, 0, 3], f"rank {rank}: launches after each mark_ready {seen}"
        assert [c for _, c in log] == [9, 9, 9], f"rank {rank}: {log}"

    def early(comm):  # the first bucket launches as soon as its parameters are ready
        log = []
        b = GradBucketer([np.zeros(s, np.float32) for s in shapes], Recording(comm, log),
                         bucket_cap_mb=32 / 2**20, first_bucket_mb=32 / 2**20)
        b.mark_ready(5)
        after_one = len(log)
        b.mark_ready(4)
        after_two = len(log)
        for i in [3, 2, 1, 0]:
            b.mark_ready(i)
        b.finalize()
        return after_one, after_two

    assert ringcomm.run_local(2, early) == [(0, 1), (0, 1)]


def test_rebuild_uses_rank0_order_on_every_rank():
    shapes = [(4,)] * 6
    orders = {0: [0, 1, 2, 3, 4, 5], 1: [5, 4, 3, 2, 1, 0], 2: [2, 0, 4, 1, 5, 3]}

    def body(comm):
        b = GradBucketer([np.zeros(s, np.float32) for s in shapes], comm, bucket_cap_mb=32 / 2**20,
                         first_bucket_mb=16 / 2**20)
        before = [x.params for x in b.buckets]
        got1 = one_iteration(b, comm.rank, 0, orders[comm.rank])
        after = [x.params for x in b.buckets]
        got2 = one_iteration(b, comm.rank, 1, orders[comm.rank])
        return before, after, b.layout_version, got1, got2

    res = ringcomm.run_local(3, body)
    for rank, (before, after, version, got1, got2) in enumerate(res):
        assert before == [(5,), (4, 3), (2, 1), (0,)], f"rank {rank}: {before}"
        # Rank 0 marked 0..5 in forward order: everyone rebuilds in that order.
        assert after == [(0,), (1, 2), (3, 4), (5,)], f"rank {rank}: {after}"
        assert version == 1
        for step, got in enumerate([got1, got2]):
            for i, s in enumerate(shapes):
                np.testing.assert_array_equal(got[i], reference(i, s, 3, True, step),
                                              err_msg=f"rank {rank} step {step} parameter {i}")


@pytest.mark.parametrize("copy_in", [False, True])
def test_no_sync_accumulates_without_communication(copy_in):
    n = 3

    def body(comm):
        b = GradBucketer(params_for("float64"), comm, bucket_cap_mb=1e-4, first_bucket_mb=0)
        sent = []
        owned = [np.zeros(s) for s in SHAPES]
        with b.no_sync():
            for micro in range(2):
                v = b.grad_views()
                for i in reversed(range(len(SHAPES))):
                    g = grad_value(i, SHAPES[i], comm.rank, micro)
                    if copy_in:
                        owned[i][...] = g
                        b.mark_ready(i, owned[i])
                    else:
                        v[i][...] = g if micro == 0 else v[i] + g
                        b.mark_ready(i)
                b.finalize()
                sent.append(comm.traffic().bytes_sent("all_reduce"))
        v = b.grad_views()
        for i in reversed(range(len(SHAPES))):
            g = grad_value(i, SHAPES[i], comm.rank, 2)
            if copy_in:
                owned[i][...] = g
                b.mark_ready(i, owned[i])
            else:
                v[i] += g
                b.mark_ready(i)
        out = [x.copy() for x in b.finalize()]
        return sent, out, owned

    for rank, (sent, out, owned) in enumerate(ringcomm.run_local(n, body)):
        assert sent == [0, 0], f"rank {rank}: all_reduce bytes during no_sync {sent}"
        for i, s in enumerate(SHAPES):
            want = sum(reference(i, s, n, True, step) for step in range(3))
            np.testing.assert_allclose(out[i], want, rtol=1e-12, err_msg=f"rank {rank} parameter {i}")
            if copy_in:  # copy-in: the reduced result is copied back into the caller's array
                np.testing.assert_allclose(owned[i], want, rtol=1e-12, err_msg=f"rank {rank} owned {i}")


def _unused_body(comm, find_unused, skip):
    """Rank r skips the parameters in skip.get(r, ()). Returns (error or None, grads, last_unused)."""
    b = GradBucketer(params_for("float32"), comm, bucket_cap_mb=60 / 2**20, first_bucket_mb=0,
                     names=NAMES, find_unused=find_unused)
    v = b.grad_views()
    err = None
    for it in range(2):
        for i in reversed(range(len(SHAPES))):
            v[i][...] = grad_value(i, SHAPES[i], comm.rank)
            if i not in skip.get(comm.rank, ()):
                b.mark_ready(i)
        try:
            v = b.finalize()
        except UnusedParametersError as exc:
            err = exc
        if it == 0:
            first = ([x.copy() for x in v], dict(b.last_unused), err)
        skip = {}  # second iteration: everyone uses everything; must work after the error
    second = [x.copy() for x in b.grad_views()]
    return first, second


def test_unused_parameters_raise_on_every_rank_naming_them():
    res = ringcomm.run_local(4, _unused_body, False, {1: (2,), 3: (2, 5)})
    for rank, ((_, unused, err), second) in enumerate(res):
        assert isinstance(err, UnusedParametersError), f"rank {rank}: {err!r}"
        msg = str(err)
        assert "parameter 2 ('p2') on ranks 1, 3" in msg, f"rank {rank}: {msg}"
        assert "parameter 5 ('p5') on rank 3" in msg, f"rank {rank}: {msg}"
        assert "find_unused=True" in msg
        assert err.unused == {2: [1, 3], 5: [3]}
        for i, s in enumerate(SHAPES):  # the next iteration is correct again
            np.testing.assert_array_equal(second[i], reference(i, s, 4, True), err_msg=f"rank {rank} param {i}")
    # Unused on every rank.
    res = ringcomm.run_local(2, _unused_body, False, {0: (0,), 1: (0,)})
    assert "parameter 0 ('p0') on all ranks" in str(res[1][0][2])


def test_find_unused_zero_fills_and_reduces():
    n = 4
    res = ringcomm.run_local(n, _unused_body, True, {1: (2,), 3: (2, 5)})
    for rank, ((got, unused, err), _) in enumerate(res):
        assert err is None, f"rank {rank}: {err}"
        assert unused == {2: [1, 3], 5: [3]}
        for i, s in enumerate(SHAPES):
            skipped = {2: (1, 3), 5: (3,)}.get(i, ())
            want = sum(grad_value(i, s, r) for r in range(n) if r not in skipped) / n
            np.testing.assert_array_equal(got[i], want, err_msg=f"rank {rank} parameter {i}")


def test_registration_mismatch_raises_on_every_rank():
    def body(comm, variant):
        shapes = list(SHAPES)
        kw = {}
        if comm.rank == 1 and variant == "shape":
            shapes[3] = (4, 3, 2)
        if comm.rank == 2 and variant == "count":
            shapes = shapes[:-1]
        if comm.rank == 1 and variant == "cap":
            kw["bucket_cap_mb"] = 1.0
        try:
            GradBucketer(params_for("float32", shapes), comm, names=NAMES[:len(shapes)], **kw)
        except RegistrationMismatchError as exc:
            return str(exc)
        return None

    for rank, msg in enumerate(ringcomm.run_local(3, body, "shape")):
        assert msg and "first difference at parameter 3 ('p3')" in msg, f"rank {rank}: {msg}"
        assert "rank 0 has (2, 3, 4) float32" in msg and "rank 1 has (4, 3, 2) float32" in msg, msg
    for rank, msg in enumerate(ringcomm.run_local(3, body, "count")):
        assert msg and "rank 2: 7 parameters" in msg and "rank 0: 8 parameters" in msg, f"rank {rank}: {msg}"
    for rank, msg in enumerate(ringcomm.run_local(3, body, "cap")):
        assert msg and "bucket settings differ" in msg and "rank 1: bucket_cap=1048576 B" in msg, msg


def test_registration_names_a_family_or_a_deep_shape_that_differs():
    # A numpy parameter on one rank and a torch one elsewhere lay buckets out
    # differently: refused at registration, naming it (it was a MismatchError
    # naming no parameter at the first all_reduce). Shapes of more than 8
    # dimensions are named in full.
    import torch

    def body(comm, variant):
        if variant == "family":
            ps = [np.zeros(3, np.float32) if comm.rank == 0 else torch.zeros(3), torch.zeros(5)]
        else:
            ps = [np.zeros((1,) * 8 + (2 + comm.rank,), np.float64)]
        with pytest.raises(RegistrationMismatchError) as e:
            GradBucketer(ps, comm)
        return str(e.value)
    for msg in ringcomm.run_local(2, body, "family"):
        assert "rank 0 has (3,) float32 (numpy), rank 1 has (3,) float32 (torch)" in msg, msg
    for msg in ringcomm.run_local(2, body, "deep"):
        assert "rank 0 has (1, 1, 1, 1, 1, 1, 1, 1, 2) float64" in msg and "(1, 1, 1, 1, 1, 1, 1, 1, 3)" in msg, msg


def test_broadcast_parameters_refuses_different_models_on_every_rank():
    # Same element count, other shape (it wrote scrambled values); a dtype
    # one rank lacks (it waited for the deadline); one parameter more.
    cases = {"shape": lambda r: [np.arange(4.0)] if r == 0 else [np.zeros((2, 2)) + 9],
             "missing": lambda r: [] if r == 0 else [np.zeros(3)],
             "extra": lambda r: [np.zeros(3)] * (1 + r)}
    want = {"shape": "rank 0 has (4,) float64 (numpy), rank 1 has (2, 2) float64 (numpy)",
            "missing": "rank 0: 0 parameters, 0 elements; rank 1: 1 parameters, 3 elements",
            "extra": "the first 1 parameters agree; rank 1 has 1 more"}
    for case, params in cases.items():
        def body(comm):
            ps = params(comm.rank)
            before = [p.copy() for p in ps]
            with pytest.raises(ringcomm.MismatchError) as e:
                broadcast_parameters(ps, comm)
            assert all(np.array_equal(a, b) for a, b in zip(ps, before)), f"rank {comm.rank}: written"
            return str(e.value)
        for r, msg in enumerate(ringcomm.run_local(2, body, timeout=10)):
            assert want[case] in msg, f"{case}, rank {r}: {msg}"


def test_gradients_of_another_family_shape_or_subclass():
    # mark_ready(i, grad) with a torch grad for a numpy parameter of 2
    # dimensions, a numpy bfloat16 grad for a torch parameter, and a user's
    # nn.Parameter subclass as a parameter.
    import torch

    class MyParam(torch.nn.Parameter):
        pass

    def body(comm):
        r = comm.rank
        ps = [np.zeros((3, 4), np.float32), torch.zeros(4, dtype=torch.bfloat16), MyParam(torch.zeros(2, 3))]
        b = GradBucketer(ps, comm)
        b.mark_ready(0, torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1))
        b.mark_ready(1, np.full(4, 2.0 * (r + 1), ml_dtypes.bfloat16))
        out = torch.zeros(2, 3)
        b.mark_ready(2, out + (r + 1))
        g = b.finalize()
        return g[0].tolist(), g[1].float().tolist(), g[2].tolist()
    n = 3
    mean = sum(range(1, n + 1)) / n
    for r, (g0, g1, g2) in enumerate(ringcomm.run_local(n, body)):
        assert g0 == (np.arange(12).reshape(3, 4) * mean).tolist(), f"rank {r}: {g0}"
        assert g1 == [2.0 * mean] * 4 and g2 == [[mean] * 3] * 2, f"rank {r}: {g1} {g2}"


def test_a_refused_second_mark_adds_nothing():
    def body(comm):
        b = GradBucketer([np.zeros(2)], comm)
        b.mark_ready(0, np.full(2, 1.0))
        with pytest.raises(ringcomm.errors.BucketerError, match="marked ready twice"):
            b.mark_ready(0, np.full(2, 100.0))
        return b.finalize()[0].tolist()
    assert ringcomm.run_local(1, body) == [[1.0, 1.0]]


@pytest.mark.parametrize("fam", ["numpy", "torch"])
def test_rebuilt_buckets_stay_in_a_small_arena(monkeypatch, fam):
    # With gradients over half the arena a second block cannot be made. torch
    # buckets are laid out again in the block they have (the views handed out
    # move with them); numpy buckets keep their layout, since a numpy view
    # cannot move and its old memory must hold the iteration's result. Either
    # way the buckets never leave the arena (zero copy) for a better order.
    if fam == "torch":
        pytest.importorskip("torch")
    import ringcomm.train.tensors as tensors
    monkeypatch.setenv("RINGCOMM_SHM_ARENA", "65536")
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "shm")  # (in process the window runs only when asked)
    shapes = [(1000,)] * 10  # 40 KB of float32 gradients in a 64 KiB arena

    def body(comm):
        ps = [tensors.zeros((fam, "float32", "cpu" if fam == "torch" else None), s[0]) for s in shapes]
        b = GradBucketer(ps, comm, bucket_cap_mb=8000 / 2**20, first_bucket_mb=0)
        held = b.grad_views()
        for it in range(3):
            for i in range(len(shapes)):  # forward order: not the default (reverse), so a rebuild
                b.mark_ready(i, grad_value(i, shapes[i], comm.rank, it).astype(np.float32))
            b.finalize()
            for i, g in enumerate(held if fam == "torch" else b.grad_views()):
                want = np.mean([grad_value(i, shapes[i], q, it) for q in range(comm.size)], axis=0)
                assert np.array_equal(np.asarray(g), want.astype(np.float32)), f"rank {comm.rank} it {it} param {i}"
        algos = {d["algorithm"] for d in comm.flight_record() if d["collective"] == "all_reduce" and d["count"] > 1}
        return algos, b.layout_version
    for algos, version in ringcomm.run_local(2, body):
        assert version == (1 if fam == "torch" else 0) and algos == {"zero_copy"}, (algos, version)


def test_check_consistency_names_the_perturbed_rank():
    def body(comm, perturb):
        params = [np.asarray(grad_value(i, s, 0)).astype(np.float32) for i, s in enumerate(SHAPES)]
        ok = check_consistency(params, comm)
        if comm.rank == perturb:
            params[5][3, 4] = np.nextafter(params[5][3, 4], np.float32(np.inf))  # one ulp
        try:
            check_consistency(params, comm, names=NAMES)
        except DivergenceError as exc:
            return ok.ok, str(exc), exc.report.diverged_ranks, exc.report.params_by_rank
        return ok.ok, None, None, None

    for rank, (ok, msg, ranks, by_rank) in enumerate(ringcomm.run_local(4, body, 2)):
        assert ok
        assert ranks == [2] and by_rank == {2: [5]}, f"rank {rank}: {ranks} {by_rank}"
        assert "rank 2 (parameters 5 ('p5'))" in msg, msg


def test_broadcast_parameters_mixed_dtypes():
    def body(comm):
        ps = [np.full((2, 3), comm.rank, np.float32), np.arange(5) * (comm.rank + 1),
              np.full(4, comm.rank + 0.5, np.float16), np.full((2, 2), comm.rank, np.float32)]
        broadcast_parameters(ps, comm, root=1)
        return ps

    for rank, ps in enumerate(ringcomm.run_local(3, body)):
        np.testing.assert_array_equal(ps[0], np.full((2, 3), 1, np.float32), err_msg=f"rank {rank}")
        np.testing.assert_array_equal(ps[1], np.arange(5) * 2, err_msg=f"rank {rank}")
        np.testing.assert_array_equal(ps[2], np.full(4, 1.5, np.float16), err_msg=f"rank {rank}")
        np.testing.assert_array_equal(ps[3], np.full((2, 2), 1, np.float32), err_msg=f"rank {rank}")


def test_timeline_and_chrome_trace(tmp_path):
    def body(comm):
        b = GradBucketer(params_for("float32"), comm, bucket_cap_mb=60 / 2**20, first_bucket_mb=0)
        for step in range(3):
            one_iteration(b, comm.rank, step)
        path = tmp_path / f"trace{comm.rank}.json"
        b.export_chrome_trace(str(path))
        return b.timeline(), len(b.buckets), str(path)

    res = ringcomm.run_local(2, body)
    for rank, (tl, nb, path) in enumerate(res):
        buckets = [e for e in tl if e["kind"] == "bucket"]
        assert len(buckets) == 3 * nb and len([e for e in tl if e["kind"] == "finalize"]) == 3
        assert all(e["launch"] <= e["complete"] for e in buckets)
        assert sum(e["bytes"] for e in buckets if e["iteration"] == 0) == 4 * (sum(
            int(np.prod(s)) for s in SHAPES) + nb)  # gradients + one status element per bucket
        trace = json.load(open(path))
        xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert len(xs) == 3 * nb + 3 and all(e["pid"] == rank and e["dur"] >= 0 for e in xs)
    merged = merge_chrome_traces([p for *_, p in res])
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}


def test_mark_ready_twice_and_bad_average_dtype():
    def body(comm):
        b = GradBucketer(params_for("float32"), comm)
        b.mark_ready(3)
        with pytest.raises(ringcomm.RingcommError, match="parameter 3 was marked ready twice"):
            b.mark_ready(3)
        with pytest.raises(ringcomm.InvalidArgument, match="average=True needs floating"):
            GradBucketer([np.zeros(3, np.int32)], comm)
    ringcomm.run_local(1, body)


def test_a_narrow_integer_bucket_that_cannot_count_the_ranks_is_refused():
    # The status slot sums each rank's 1 in the bucket's dtype: int8/uint8 wrap
    # to 0 at 256 ranks (an unused gradient would pass unnoticed). The check
    # runs before any collective, so a stand-in with the world's size shows it.
    import types
    world = types.SimpleNamespace(size=256, rank=0)
    for dtype in (np.int8, np.uint8):
        with pytest.raises(ringcomm.InvalidArgument, match="cannot count 256 ranks in its status slot"):
            GradBucketer([np.zeros(3, dtype)], world, average=False)

    def body(comm):  # wide enough: runs
        b = GradBucketer([np.zeros(3, np.int8)], comm, average=False)
        return b.sync([np.full(3, comm.rank + 1, np.int8)])[0].tolist()
    assert ringcomm.run_local(3, body) == [[6, 6, 6]] * 3


def test_after_a_failed_finalize_the_next_iteration_names_the_failure():
    # In the second iteration rank 1 stops half way: rank 0's wait for a
    # bucket times out, which aborts its communicator. The bucketer ends that
    # iteration anyway, so the next one reports the abort (and its cause),
    # not "marked ready twice".
    def body(comm):
        b = GradBucketer(params_for("float32"), comm, bucket_cap_mb=CAPS_MB[2])
        b.sync([grad_value(i, s, comm.rank).astype(np.float32) for i, s in enumerate(SHAPES)])
        for i in reversed(range(len(SHAPES))):
            if comm.rank == 1 and i < len(SHAPES) // 2:
                return "left"
            b.mark_ready(i, grad_value(i, SHAPES[i], comm.rank).astype(np.float32))
        with pytest.raises(ringcomm.CollectiveTimeout):
            b.finalize()
        with pytest.raises(ringcomm.CommunicatorAborted, match="timed out"):
            b.sync()
        return "raised"
    assert ringcomm.run_local(2, body, timeout=1) == ["raised", "left"]


# ---------------------------------------------------------------------------
def _assert_no_errors_anywhere(errs):
    from mpi4py import MPI
    everyone = [e for es in MPI.COMM_WORLD.allgather(errs) for e in es]
    assert not everyone, "\n".join(everyone[:30])


def _guarded(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported after the allgather
        from mpi4py import MPI
        return [f"rank {MPI.COMM_WORLD.rank}: {type(exc).__name__}: {exc}"]


@pytest.mark.parallel([2, 3])
def test_bucketer_over_mpi():
    def body():
        comm = ringcomm.init()
        errs = []
        for dtype in ["float32", "bfloat16", "int32"]:
            for cap in [0.0, 60 / 2**20, 25.0]:
                errs += _matches_body(comm, dtype, cap)
        # Unused parameter on the last rank only: every rank raises the same error.
        first, second = _unused_body(comm, False, {comm.size - 1: (2,)})
        msg = str(first[2])
        if f"parameter 2 ('p2') on rank {comm.size - 1}" not in msg:
            errs.append(f"rank {comm.rank}: unexpected unused-parameter error: {msg!r}")
        for i, s in enumerate(SHAPES):
            errs += compare(second[i], reference(i, s, comm.size, True), f"after error parameter {i}",
                            comm.rank, "float32")
        comm.close()
        return errs
    _assert_no_errors_anywhere(_guarded(body))


@pytest.mark.parametrize("device", ["emulated", "emulated-nccl"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_bucketer_on_the_device_path(device, dtype):
    """The same bucketed sync over the device path (asynchronous queues:
    the bucketer's async launches and waits must still give exact results)."""
    for cap in CAPS_MB:
        errs = [e for es in ringcomm.run_local(3, _matches_body, dtype, cap, device=device, jitter_us=50,
                                               segment_bytes=512) for e in es]
        assert not errs, f"{device} cap {cap} MiB:\n" + "\n".join(errs[:20])
    res = ringcomm.run_local(4, _unused_body, True, {1: (2,), 3: (2, 5)}, device=device, jitter_us=50)
    for rank, ((got, unused, err), _) in enumerate(res):
        assert err is None and unused == {2: [1, 3], 5: [3]}, f"rank {rank}: {err}"

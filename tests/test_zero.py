"""ringcomm.zero: ZeRO stages 1-3 give the same parameters as DDP (stage 0),
bit for bit, on in-process ranks N = 1..5, float32 and float16 (mixed
precision: fp32 master weights); the memory each rank holds and the traffic of
a step match the articles' formulas (exactly, per rank, under the split rule)."""

import numpy as np
import pytest

import ringcomm
from ringcomm import traffic
from ringcomm.zero import ZeroOptimizer, expected_memory, expected_traffic
from tiers import slow_except

SIZES = [(13, 17), (17,), (17, 11), (11,), (11, 5), (5,)]  # 3 linear layers: (W, b) per unit


def init_units(dtype, seed=0):
    rng = np.random.default_rng(seed)
    ps = [(rng.standard_normal(s) * 0.3).astype(dtype) for s in SIZES]
    return [ps[0:2], ps[2:4], ps[4:6]]


def exact_memory(stage, counts, n, r, param_bytes=2):
    """Bytes rank r must hold per kind: the articles' table with this rank's
    exact share under the split rule (units of `counts` parameters each)."""
    psi = sum(counts)
    mine = sum(c // n + (1 if r < c % n else 0) for c in counts)
    p, k = param_bytes, 12
    return {0: {"params": p * psi, "grads": p * psi, "optimizer": k * psi},
            1: {"params": p * psi, "grads": p * psi, "optimizer": k * mine},
            2: {"params": p * psi, "grads": p * mine, "optimizer": k * mine},
            3: {"params": p * mine, "grads": p * mine, "optimizer": k * mine}}[stage]


def batch(rank, step):
    rng = np.random.default_rng(1000 * step + rank)
    return rng.standard_normal((8, 13)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)


def train(comm, stage, dtype, steps=4, prefetch=False):
    zero = ZeroOptimizer(init_units(dtype, seed=comm.rank), comm, stage=stage, lr=1e-2)  # rank 0's values win
    for step in range(steps):
        _step(zero, comm.rank, step, dtype, prefetch)
    return [p for unit in zero.full_parameters() for p in unit], zero.memory()


@pytest.mark.parametrize("n", slow_except([1, 2, 3], [1, 2, 3, 4, 5]))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_stage_equals_ddp_bitwise(n, dtype):
    ref = ringcomm.run_local(n, train, 0, dtype)
    for stage in (1, 2, 3):
        got = ringcomm.run_local(n, train, stage, dtype, prefetch=(stage == 3))
        for r in range(n):
            for i, (a, b) in enumerate(zip(ref[r][0], got[r][0])):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), \
                    f"stage {stage}, rank {r}, parameter {i}: differs from DDP by {np.abs(a - b).max()}"
    # and training did something: rank 0's first layer moved from its initial value
    assert not np.array_equal(ref[0][0][0], init_units(dtype, 0)[0][0])


@pytest.mark.parametrize("n", [2, 3])
def test_every_stage_equals_ddp_bitwise_in_shared_memory(n, monkeypatch):
    # In the window (ranks of one host): stages 0-1 keep their gradients in
    # the shared arena and reduce them zero copy, stages 2-3 through the
    # staged shm path; every stage's sums in rank order, so the same bits.
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "shm")

    def algorithms(comm, stage):
        zero = ZeroOptimizer(init_units(np.float32), comm, stage=stage)
        for gr in zero.grads(0):
            gr[...] = comm.rank + 1
        zero.reduce(0)
        ran = comm.last_algorithm  # (chosen when the call is issued)
        zero.step()
        return zero._grads_in_arena, ran
    for stage, want in ((0, (True, "zero_copy")), (1, (True, "zero_copy")), (2, (False, "shm"))):
        assert ringcomm.run_local(n, algorithms, stage) == [want] * n, stage
    ref = ringcomm.run_local(n, train, 0, np.float32)
    for stage in (1, 2, 3):
        got = ringcomm.run_local(n, train, stage, np.float32)
        for r in range(n):
            for i, (a, b) in enumerate(zip(ref[r][0], got[r][0])):
                assert a.tobytes() == b.tobytes(), f"stage {stage}, rank {r}, parameter {i} differs from DDP"


@pytest.mark.parametrize("device", ["emulated", "emulated-nccl"])
@pytest.mark.parametrize("n", [2, 3])
def test_every_stage_equals_ddp_bitwise_on_the_device_path(n, device):
    # The device path on a CPU: every copy and reduction of the collectives is
    # enqueued on per-rank queues ordered only by events, with random delays
    # (jitter), as on GPU streams; ZeRO must still match host DDP bit for bit
    # (a missing wait on a Work would show up as wrong or stale values).
    for dtype in (np.float32, np.float16):
        ref = ringcomm.run_local(n, train, 0, dtype)
        for stage in (0, 1, 2, 3):
            got = ringcomm.run_local(n, train, stage, dtype, prefetch=(stage == 3), device=device, jitter_us=20,
                                     timeout=60)
            for r in range(n):
                for i, (a, b) in enumerate(zip(ref[r][0], got[r][0])):
                    assert a.tobytes() == b.tobytes(), \
                        f"{device} stage {stage}, rank {r}, parameter {i}: differs from DDP by {np.abs(a - b).max()}"


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_and_traffic_match_the_formulas(n, stage):
    dtype = np.float16
    counts = [sum(int(np.prod(s)) for s in SIZES[2 * k:2 * k + 2]) for k in range(3)]
    psi = sum(counts)

    def body(comm):
        zero = ZeroOptimizer(init_units(dtype), comm, stage=stage)
        steady = zero.memory()
        comm.reset_traffic()
        x, y = batch(comm.rank, 0)
        for u in range(3):
            with zero.gathered(u):
                pass
        for u in reversed(range(3)):
            with zero.gathered(u):
                for gr in zero.grads(u):
                    gr[...] = 1
            zero.reduce(u)
        zero.step()
        return steady, comm.traffic().bytes_sent(), zero.memory()

    res = ringcomm.run_local(n, body)
    for r, (steady, sent, after) in enumerate(res):
        want = exact_memory(stage, counts, n, r)
        for k, v in want.items():
            assert steady[k] == v, f"rank {r} stage {stage} {k}: {steady[k]} B held, formula {v}"
        assert after["params"] == steady["params"] and after["grads"] == steady["grads"]
        # formula check, to the byte: the closed form summed over units
        per_unit = {0: [("all_reduce", c) for c in counts],
                    1: [("reduce_scatter", c) for c in counts] + [("all_gather", c) for c in counts],
                    2: [("reduce_scatter", c) for c in counts] + [("all_gather", c) for c in counts],
                    3: [("all_gather", c) for c in counts] * 2 + [("reduce_scatter", c) for c in counts]}[stage]
        exact = sum(traffic.expected(coll, c, "float16", n, r).bytes_sent for coll, c in per_unit)
        assert sent == exact, f"rank {r} stage {stage}: sent {sent} B, expected {exact} B"
    # The articles' formula, which assumes Psi divisible by N: the mean over ranks matches it.
    mean_sent = np.mean([s for _, s, _ in res])
    assert abs(mean_sent - expected_traffic(stage, psi, n)) <= 2 * 3 * len(counts), (mean_sent, stage)
    mean_mem = {k: np.mean([m[k] for m, _, _ in res]) for k in ("params", "grads", "optimizer")}
    formula = expected_memory(stage, psi, n)
    for k in mean_mem:
        assert abs(mean_mem[k] - formula[k]) < 1e-6 * formula[k] + 1, (k, mean_mem[k], formula[k])


def test_bad_arguments():
    with pytest.raises(ringcomm.InvalidArgument, match="stage"):
        ringcomm.run_local(1, lambda c: ZeroOptimizer(init_units(np.float32), c, stage=4))
    with pytest.raises(ringcomm.InvalidArgument, match="one dtype"):
        ringcomm.run_local(1, lambda c: ZeroOptimizer([[np.zeros(3, np.float32), np.zeros(2, np.float16)]], c,
                                                      stage=1))
    with pytest.raises(ringcomm.InvalidArgument, match="floating"):
        ringcomm.run_local(1, lambda c: ZeroOptimizer([[np.zeros(3, np.int32)]], c, stage=1))

    def sharded(c):
        z = ZeroOptimizer(init_units(np.float32), c, stage=3)
        z.params(0)
    with pytest.raises(ringcomm.InvalidArgument, match="sharded"):
        ringcomm.run_local(2, sharded)


def test_demo_zero_json(tmp_path):
    import json
    import subprocess
    import sys
    path = tmp_path / "zero.json"
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "demo", "zero", "-n", "3", "--params", "30000",
                          "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(path.read_text())
    assert d["n"] == 3 and d["param_bytes"] == 2 and set(d["stages"]) == {"ddp", "zero1", "zero2", "zero3"}
    psi = d["psi"]
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        s = d["stages"][name]
        assert s["max_abs_param_diff_vs_ddp"] == 0.0
        f = expected_memory(stage, psi, 3)
        for k, v in s["memory_bytes"].items():  # max over ranks: at most one element per unit above the mean
            assert f[k] <= v <= f[k] + 16 * 9 * 2, (name, k, v, f[k])
        assert s["peak_memory_bytes"] >= sum(s["memory_bytes"].values())
        assert abs(s["sent_bytes_per_step"] - expected_traffic(stage, psi, 3)) <= 3 * 2 * 9 * 2
    assert "16Psi/N" in res.stdout


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_checkpoint_resume_is_bit_identical(stage, tmp_path):
    from ringcomm.zero import consolidate
    n = 3
    prefix = str(tmp_path / f"ckpt{stage}")

    def straight(comm):  # 4 steps without a break
        return train(comm, stage, np.float16, steps=4)[0]

    def resumed(comm):  # 2 steps, save, then a fresh optimizer (other initial values) loads and does 2 more
        zero = ZeroOptimizer(init_units(np.float16, seed=comm.rank), comm, stage=stage, lr=1e-2)
        for step in range(2):
            _step(zero, comm.rank, step)
        zero.save(prefix)
        fresh = ZeroOptimizer(init_units(np.float16, seed=99), comm, stage=stage, lr=1e-2)
        fresh.load(prefix)
        for step in range(2, 4):
            _step(fresh, comm.rank, step)
        return [p for unit in fresh.full_parameters() for p in unit]

    a = ringcomm.run_local(n, straight)
    b = ringcomm.run_local(n, resumed)
    for r in range(n):
        for x, y in zip(a[r], b[r]):
            assert x.tobytes() == y.tobytes(), f"stage {stage} rank {r}: resumed training differs"
    full = consolidate(prefix, str(tmp_path / "full.npz"))
    assert full["stage"] == stage and full["t"] == 2
    counts = [sum(int(np.prod(s)) for s in SIZES[2 * k:2 * k + 2]) for k in range(3)]
    assert [u["master"].size for u in full["units"]] == counts
    assert np.load(tmp_path / "full.npz")["master0"].shape == (counts[0],)


def _step(zero, rank, step, dtype=np.float16, prefetch=False):
    """One training step of a tanh MLP written here in numpy (independent of
    ringcomm.zero's own demo trainer): forward, backward, reduce, step."""
    x, y = batch(rank, step)
    acts, caches = [x], []
    for u in range(3):
        if prefetch and u + 1 < 3:
            zero.prefetch(u + 1)
        with zero.gathered(u) as (w, b):
            z = acts[-1] @ w.astype(np.float32) + b.astype(np.float32)
        caches.append(z)
        acts.append(np.tanh(z) if u < 2 else z)
    g = 2 * (acts[-1] - y) / y.size  # d(mean squared error)
    for u in reversed(range(3)):
        if prefetch and u > 0:
            zero.prefetch(u - 1)
        with zero.gathered(u) as (w, b):
            gz = g if u == 2 else g * (1 - np.tanh(caches[u]) ** 2)
            gw, gb = zero.grads(u)
            gw[...] = (acts[u].T @ gz).astype(dtype)
            gb[...] = gz.sum(0).astype(dtype)
            g = gz @ w.astype(np.float32).T
        zero.reduce(u)
    zero.step()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_float16_gradients_average_without_overflow(stage):
    def fn(comm):
        z = ZeroOptimizer([[np.zeros(4, np.float16)]], comm, stage=stage, lr=1.0, optimizer="sgd")
        with z.gathered(0):
            z.grads(0)[0][...] = 40000.0
        z.reduce(0)
        z.step()
        return (-z.full_parameters()[0][0].astype(np.float32)).tolist()
    for r, got in enumerate(ringcomm.run_local(2, fn)):
        assert got == [40000.0] * 4, f"stage {stage}, rank {r}: {got}"


def test_checkpoint_of_other_shapes_with_the_same_counts_is_refused(tmp_path):
    prefix = str(tmp_path / "c")
    ringcomm.run_local(2, lambda c: ZeroOptimizer([[np.zeros((4, 6), np.float32)]], c, stage=1).save(prefix))

    def fn(c):
        z = ZeroOptimizer([[np.zeros((6, 4), np.float32)]], c, stage=1)
        with pytest.raises(ringcomm.InvalidArgument, match=r"unit 0 has shapes \[\[4, 6\]\] there, \[\[6, 4\]\]"):
            z.load(prefix)
        return True
    assert ringcomm.run_local(2, fn) == [True, True]


@pytest.mark.parametrize("saved,loaded", [("adam", "sgd"), ("sgd", "adam")])
def test_checkpoint_refuses_another_optimizer_before_writing_anything(saved, loaded, tmp_path):
    prefix = str(tmp_path / "c")
    ringcomm.run_local(2, lambda c: ZeroOptimizer(init_units(np.float32), c, stage=1, optimizer=saved).save(prefix))

    def fn(c):
        z = ZeroOptimizer(init_units(np.float32, seed=1), c, stage=1, optimizer=loaded)
        before = [p.copy() for ps in z.full_parameters() for p in ps]
        with pytest.raises(ringcomm.InvalidArgument, match="holds the state of " + ("Adam" if saved == "adam" else "SGD")):
            z.load(prefix)
        after = [p for ps in z.full_parameters() for p in ps]
        assert z.t == 0 and all(np.array_equal(a, b) for a, b in zip(before, after)), f"rank {c.rank}: half-loaded"
        return True
    assert ringcomm.run_local(2, fn) == [True, True]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_reduce_twice_in_a_step_is_refused(stage):
    # Two reductions of one unit in flight would run on one buffer at once.
    def fn(comm):
        z = ZeroOptimizer([[np.arange(6, dtype=np.float32)]], comm, stage=stage, max_grads_in_flight=1)
        with z.gathered(0):
            z.grads(0)[0][...] = comm.rank + 1.0
        z.reduce(0)
        with pytest.raises(ringcomm.InvalidArgument, match=r"reduce\(0\) was already called in this step"):
            z.reduce(0)
        z.step()  # and the next step may reduce it again
        with z.gathered(0):
            z.grads(0)[0][...] = 1.0
        z.reduce(0)
        z.step()
        return True
    assert ringcomm.run_local(2, fn, timeout=20) == [True, True]


def test_checkpoint_refuses_another_layout(tmp_path):
    prefix = str(tmp_path / "c")
    ringcomm.run_local(2, lambda c: ZeroOptimizer(init_units(np.float32), c, stage=1).save(prefix))
    with pytest.raises(ringcomm.InvalidArgument, match="stage 1, rank 0 of 2"):
        ringcomm.run_local(2, lambda c: ZeroOptimizer(init_units(np.float32), c, stage=2).load(prefix))


@pytest.mark.parametrize("n", slow_except([2], [1, 2, 3, 4, 5]))
def test_every_stage_equals_ddp_bitwise_over_mpi(n):
    import json
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "scripts", "zero_mpi.py")
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, script],
                         capture_output=True, text=True, timeout=300)
    out = [json.loads(line[7:]) for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and len(out) == n, res.stdout + res.stderr
    for d in out:
        assert d["differences"] == [], d
        assert d["cases"] == 6


def test_demo_zero_under_mpirun(tmp_path):
    """`ringcomm run -n 2 ringcomm demo zero`: the demo runs on the MPI ranks (detected from mpirun's
    environment; -n is the world size then), rank 0 prints and writes the JSON."""
    import json
    import subprocess
    import sys
    path = tmp_path / "zero_mpi.json"
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", "2", "--", sys.executable, "-m",
                          "ringcomm.cli", "demo", "zero", "--params", "20000", "--json", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ZeRO on 2 MPI ranks") == 1, res.stdout  # rank 0 only
    d = json.loads(path.read_text())
    assert d["n"] == 2 and d["ranks"] == "mpi" and set(d["stages"]) == {"ddp", "zero1", "zero2", "zero3"}
    psi = d["psi"]
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        s = d["stages"][name]
        assert s["max_abs_param_diff_vs_ddp"] == 0.0, (name, s)
        f = expected_memory(stage, psi, 2)
        for k, v in s["memory_bytes"].items():  # max over ranks: at most one element per unit above the mean
            assert f[k] <= v <= f[k] + 16 * 9 * 2, (name, k, v, f[k])
        assert s["peak_memory_bytes"] >= sum(s["memory_bytes"].values())
        assert abs(s["sent_bytes_per_step"] - expected_traffic(stage, psi, 2)) <= 3 * 2 * 9 * 2


def test_a_unit_without_gradient_in_a_step_is_not_moved_again_at_every_stage():
    # Step 2 gives unit 0 no gradient: every stage must leave it where step 1
    # put it, as DDP would (stages 2-3 applied step 1's shard again).
    def run(stage):
        def fn(comm):
            units = [[np.linspace(-1, 1, 6, dtype=np.float32)], [np.ones(5, np.float32)]]
            z = ringcomm.zero.ZeroOptimizer(units, comm, stage=stage, lr=0.1, optimizer="sgd")
            for u in (1, 0):
                with z.gathered(u):
                    z.grads(u)[0][...] = 1.0 + comm.rank
                z.reduce(u)
            z.step()
            with z.gathered(1):
                z.grads(1)[0][...] = 1.0
            z.reduce(1)
            z.step()
            return [p.tolist() for ps in z.full_parameters() for p in ps]
        return ringcomm.run_local(2, fn)[0]
    ref = run(0)
    for stage in (1, 2, 3):
        assert run(stage) == ref, stage


def test_more_gradients_out_than_allowed_is_an_error_not_a_hang():
    def fn(comm):
        z = ringcomm.zero.ZeroOptimizer([[np.ones(4, np.float32)] for _ in range(3)], comm, stage=2)
        z.grads(2)
        z.grads(1)
        with pytest.raises(ringcomm.InvalidArgument, match="max_grads_in_flight"):
            z.grads(0)
        return True
    assert ringcomm.run_local(1, fn, timeout=20) == [True]


def test_gathered_is_reentrant_at_stage_3():
    def fn(comm):
        z = ringcomm.zero.ZeroOptimizer([[np.arange(4, dtype=np.float32)]] * 2, comm, stage=3)
        with z.gathered(0) as ps:
            full = z.full_parameters()
            still = ps[0].tolist()
        return full[0][0].tolist(), still
    for full, still in ringcomm.run_local(2, fn):
        assert full == still == [0.0, 1.0, 2.0, 3.0]

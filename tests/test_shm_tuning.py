"""The window's crossovers: what auto runs through the window (RINGCOMM_SHM_MAX,
the shm_from band), ``ringcomm tune``'s limits for it and ``ringcomm info``'s
account of them. Split from the former test_shm.py (shared helpers:
tests/shm_helpers.py).
"""

import os

import numpy as np
import pytest

import ringcomm
from ringcomm import InvalidArgument
from ringcomm import shm as shm_mod


def test_auto_in_process_uses_the_window_only_when_asked(monkeypatch):
    def algos(comm):
        out = []
        for count in (4, 1 << 16):
            comm.all_reduce(np.ones(count, np.float32))
            out.append(comm.last_algorithm)
        comm.reduce_scatter(np.ones(1 << 16, np.float32))
        out.append(comm.last_algorithm)
        comm.reduce(np.ones(8, np.float32))
        out.append(comm.last_algorithm)
        return out
    assert ringcomm.run_local(2, algos)[0][:3] != ["shm_flat", "shm", "shm"]
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "shm")
    assert ringcomm.run_local(2, algos)[0] == ["shm_flat", "shm", "shm", "shm_flat"]  # reduce too
    monkeypatch.setenv("RINGCOMM_SHM_FLAT_MAX", "0")
    assert ringcomm.run_local(2, algos)[0][0] == "shm"


def test_auto_runs_the_window_up_to_shm_max_and_again_from_shm_from(monkeypatch):
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "shm")
    k_coll = len(shm_mod.COLLECTIVES)

    def body(comm):
        n, r = comm.size, comm.rank
        again = [shm_mod.UNLIMITED] * k_coll
        again[shm_mod.COLLECTIVES.index("gather")] = again[shm_mod.COLLECTIVES.index("reduce")] = 1 << 20
        comm._engine.set_shm_auto(True, 0, [16 << 10] * k_coll, again)  # (the limits rank 0 would broadcast)
        got, errs = [], []
        for nbytes in (8 << 10, 256 << 10, 1 << 20, 2 << 20):
            k = nbytes // 4

            def data(q):  # rank q's input: rank-dependent, not periodic in the block size
                return ((np.arange(k) * 7 + 13 * q) % 1009).astype(np.float32)
            x = data(r)
            out = np.empty(k, np.float32) if r == 0 else None
            comm.gather(x[r * (k // n):(r + 1) * (k // n)], root=0, out=out)
            g = comm.last_algorithm
            if r == 0:
                want = np.concatenate([data(q)[q * (k // n):(q + 1) * (k // n)] for q in range(n)])
                bad = np.flatnonzero(out != want)
                if bad.size:
                    errs.append(f"gather {nbytes} B: rank 0 index {bad[0]}: {out[bad[0]]} != {want[bad[0]]}")
            res = comm.reduce(x, root=0, out=np.empty(k, np.float32) if r == 0 else None)
            if r == 0:
                want = sum(data(q) for q in range(n))
                bad = np.flatnonzero(res != want)
                if bad.size:
                    errs.append(f"reduce {nbytes} B: rank 0 index {bad[0]}: {res[bad[0]]} != {want[bad[0]]}")
            got.append((g, comm.last_algorithm))
        return got, errs
    for got, errs in ringcomm.run_local(2, body):
        assert not errs, errs
        assert got == [("shm", "shm"), ("linear", "binomial"), ("shm", "shm"), ("shm", "shm")], got


def test_shm_from_is_the_built_in_band_unless_a_variable_says_otherwise(monkeypatch):
    monkeypatch.delenv("RINGCOMM_SHM_MAX", raising=False)
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "auto")
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent")  # no tune file: the built-in limits
    got = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_from()))
    assert got["gather"] == 1 << 20 and got["reduce"] == 1 << 20
    assert got["all_reduce"] == got["scatter"] == got["all_to_all"] == shm_mod.UNLIMITED
    # more ranks than cores: gather leaves the window from 16 KiB and comes back from 4 MiB
    over = (os.cpu_count() or 1) + 1
    got = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_from(over)))
    assert got["gather"] == 4 << 20 and got["reduce"] == shm_mod.UNLIMITED, got
    limits = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_max(over)))
    assert (limits["gather"], limits["scatter"], limits["all_to_all"]) == (16 << 10, 256 << 10, 64 << 10), limits
    monkeypatch.setenv("RINGCOMM_SHM_MAX", "4096")  # one limit, nothing above it
    assert shm_mod.shm_from() == [shm_mod.UNLIMITED] * len(shm_mod.COLLECTIVES)
    monkeypatch.delenv("RINGCOMM_SHM_MAX")
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "shm")  # the window at every size anyway
    assert shm_mod.shm_from() == [shm_mod.UNLIMITED] * len(shm_mod.COLLECTIVES)


def test_bad_choices_are_clear_errors(monkeypatch):
    def body(comm):
        with pytest.raises(InvalidArgument, match="reduce runs algorithm"):
            comm.reduce(np.ones(2, np.float32), algorithm="zero_copy")
        with pytest.raises(InvalidArgument, match="all_reduce and reduce only"):
            comm.reduce_scatter(np.ones(4, np.float32), algorithm="shm_flat")
        comm.all_reduce(np.ones(3, np.float32), algorithm="shm")  # still usable
        return True
    assert all(ringcomm.run_local(2, body))
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "carrier-pigeon")
    with pytest.raises(InvalidArgument, match="RINGCOMM_TRANSPORT"):
        ringcomm.run_local(2, lambda c: None)


# ---- ringcomm tune: the window's crossovers --------------------------------
def _shm_rows(n, table):
    """tune's rows from {(collective, algorithm): [us per size]} at sizes 1K, 4K, 16K, 64K."""
    sizes = [1 << 10, 4 << 10, 16 << 10, 64 << 10]
    return [{"collective": c, "algorithm": a, "n": n, "bytes": b, "seconds": us * 1e-6}
            for (c, a), row in table.items() for b, us in zip(sizes, row)]


def test_tune_shm_limits_from_rows():
    from ringcomm.tuning.tune import shm_limits
    rows = _shm_rows(2, {
        ("all_reduce", "shm"): [3, 4, 6, 20], ("all_reduce", "shm_flat"): [2, 3, 7, 25],
        ("all_reduce", "ring"): [9, 10, 12, 15], ("all_reduce", "recursive_doubling"): [5, 6, 9, 30],
        ("all_reduce", "halving_doubling"): [8, 9, 11, 18],
        ("reduce_scatter", "shm"): [2, 2, 3, 5.4], ("reduce_scatter", "ring"): [3, 3, 4, 5],
        ("all_gather", "shm"): [4, 2, 3, 4], ("all_gather", "ring"): [3, 3, 4, 5],
        # the rooted ones: the window loses in the middle and wins again above
        ("reduce", "shm"): [2, 9, 9, 10], ("reduce", "binomial"): [3, 4, 10, 30], ("reduce", "ring"): [9, 8, 12, 11],
        ("gather", "shm"): [2, 9, 3, 9], ("gather", "linear"): [3, 4, 4, 5],
        ("scatter", "shm"): [4, 4, 4, 4], ("scatter", "linear"): [3, 3, 5, 5],
        ("all_to_all", "shm"): [1, 1, 1, 1], ("all_to_all", "linear"): [2, 2, 2, 2]})
    lim = shm_limits(rows, 2)
    # all_reduce: the window wins up to 16 KiB, loses at 64 KiB (20 > 15);
    # reduce_scatter wins everywhere (at 64 KiB 5.4 against 5: within
    # SHM_MARGIN, a tie, kept); all_gather loses at the smallest size
    # and wins from 4 KiB on. reduce: wins at 1 KiB, loses at 4 KiB (9 > 4),
    # wins from 16 KiB (9 < 10, 10 < 11: the faster rival counts); gather
    # wins at 16 KiB but loses again at 64: never from; scatter loses at
    # 1 KiB, 4 KiB, wins from 16 KiB; all_to_all's rival is pairwise, not
    # measured here: not in the limits (the built-in ones stay).
    U = shm_mod.UNLIMITED
    assert lim == {"all_reduce": 16 << 10, "reduce_scatter": U, "all_gather": 0,
                   "reduce": 1 << 10, "gather": 1 << 10, "scatter": 0, "flat_max": 4 << 10,
                   "from": {"all_reduce": U, "reduce_scatter": 1 << 10, "all_gather": 4 << 10,
                            "reduce": 16 << 10, "gather": U, "scatter": 16 << 10},
                   "single_copy": True}, lim
    from ringcomm.tuning.tune import describe_shm_limits
    words = describe_shm_limits(lim)
    assert [w.split()[0] for w in words[:-1]] == list(lim)[:6], words
    assert words[0] == "all_reduce      up to 16384 B" and words[1] == "reduce_scatter  at any size", words
    assert words[2] == "all_gather      from 4096 B" and words[3] == "reduce          up to 1024 B and from 16384 B"
    assert words[-1] == "all_reduce in one sync (shm_flat) up to 4096 B", words


def test_tune_chooses_single_copy_or_the_slots():
    from ringcomm.tuning.tune import choose_single_copy, shm_limits
    U = shm_mod.UNLIMITED
    sizes = [256 << 10, 1 << 20, 4 << 20]  # blocks of 128 KiB, 512 KiB, 2 MiB on 2 ranks

    def rows(single, slots, rival=(100, 100, 100)):
        got = []
        for c, a in (("all_to_all", "pairwise"), ("scatter", "linear")):
            for b, x, y, z in zip(sizes, single, slots, rival):
                got += [{"collective": c, "algorithm": al, "n": 2, "bytes": b, "seconds": v, "single_copy": True}
                        for al, v in (("shm", x), ("shm_slots", y), (a, z))]
        return got

    def table(r):
        return {(x["collective"], x["algorithm"], x["bytes"]): x["seconds"] for x in r}

    # the slots win up to 512 KiB blocks, single copy at 2 MiB: from 2 MiB
    r = rows(single=(20, 80, 300), slots=(15, 60, 400))
    assert choose_single_copy(table(r), 2) == 2 << 20
    # where "shm" ran the slots (all_to_all, all_gather from 4 KiB pages),
    # single copy's own row counts: here it wins everywhere
    t = table(r)
    t.update({("all_to_all", "shm", b): 15.0 for b in sizes})
    t.update({("all_to_all", "shm_single", b): 1.0 for b in sizes})
    t.update({("scatter", "shm", b): 1.0 for b in sizes})
    assert choose_single_copy(t, 2) == 128 << 10
    # single copy everywhere: the smallest block measured
    assert choose_single_copy(table(rows((10, 50, 300), (15, 60, 400))), 2) == 128 << 10
    # the slots everywhere: single copy from twice the largest block
    # measured (still on: above, and for per-peer blocks)
    r = rows(single=(20, 80, 500), slots=(15, 60, 400), rival=(18, 90, 450))
    assert choose_single_copy(table(r), 2) == 4 << 20
    lim = shm_limits(r, 2)
    assert lim["single_copy_min"] == 4 << 20 and lim["single_copy"] is True
    # the window's time is the slots' where single copy would not run: it
    # wins at 256 KiB (15 < 18) though single copy alone lost there (20)
    assert lim["all_to_all"] == U and lim["from"]["all_to_all"] == 256 << 10, lim
    # a size weighs as much as any other: single copy 10 % behind at 4 MiB
    # (100 us) does not outweigh its lead of a third and a sixth below
    # (15 us in all), as a sum of times would have it
    assert choose_single_copy(table(rows((10, 50, 1100), (15, 60, 1000))), 2) == 128 << 10
    # nothing measured both ways: no choice (an older tune; single copy off)
    assert choose_single_copy({("all_to_all", "shm", 1 << 20): 1.0}, 2) is None
    # all_to_all from 4 KiB pages: its own limit, from its own rows
    from ringcomm.tuning.tune import choose_single_copy_4k

    def pages(single, slots):
        return {("all_to_all", a, b): v for b, x, y in zip(sizes, single, slots)
                for a, v in (("shm_4k_single", x), ("shm_4k_slots", y))}
    assert choose_single_copy_4k(pages((20, 80, 500), (15, 60, 400)), 2) == 4 << 20  # (twice the largest block)
    assert choose_single_copy_4k(pages((20, 50, 300), (15, 60, 400)), 2) == 512 << 10
    assert choose_single_copy_4k(pages((10, 50, 300), (15, 60, 400)), 2) == 128 << 10
    assert choose_single_copy_4k(table(r), 2) is None
    lim = shm_limits(r + [{"collective": "all_to_all", "algorithm": a, "n": 2, "bytes": b, "seconds": v}
                          for (_, a, b), v in pages((20, 50, 300), (15, 60, 400)).items()], 2)
    assert lim["single_copy_min_4k"] == 4 << 20, lim  # (never below single_copy_min: 4 MiB here)
    assert "single_copy_min" not in shm_limits([{"collective": "all_to_all", "algorithm": a, "n": 2,
                                                 "bytes": 1 << 20, "seconds": 1.0} for a in ("shm", "pairwise")], 2)


def test_tuned_limits_are_what_auto_uses(tmp_path, monkeypatch):
    from ringcomm.tuning import selection
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("RINGCOMM_SHM_MAX", raising=False)
    monkeypatch.delenv("RINGCOMM_SHM_FLAT_MAX", raising=False)
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "auto")
    assert shm_mod.tuned(2) is None
    built_in_from = shm_mod.shm_from(2, True)
    # an older tune's entry: three collectives, no "from", no single copy
    selection.save_entry("shm", {"limits": {"2": {"all_reduce": 65536, "reduce_scatter": 8192,
                                                  "all_gather": 0, "flat_max": 4096}}})
    # what tune measures, and the built-in limits of what it does not
    assert shm_mod.shm_max(2) == [65536, 8192, 0] + [shm_mod.SHM_MAX[c] for c in shm_mod.COLLECTIVES[3:]]
    assert shm_mod.shm_from(2, True) == built_in_from
    assert shm_mod.flat_max(2) == 4096
    assert shm_mod.tuned(3) is None  # not measured on 3 ranks: the built-in limits
    monkeypatch.setenv("RINGCOMM_SHM_FLAT_MAX", "1024")
    assert shm_mod.flat_max(2) == 1024  # the variable wins
    monkeypatch.delenv("RINGCOMM_SHM_FLAT_MAX")
    monkeypatch.delenv("RINGCOMM_SHM_SINGLE_COPY", raising=False)
    assert shm_mod.single_copy_min(2) == shm_mod.DEFAULT_SINGLE_COPY_MIN  # (the older tune chose none)
    # today's: every collective but broadcast, each with its "from", measured with single copy on
    U = shm_mod.UNLIMITED
    measured = {"all_reduce": 65536, "reduce_scatter": 8192, "all_gather": 0, "reduce": 4096, "gather": 0,
                "scatter": 1 << 20, "all_to_all": 16384, "flat_max": 4096, "single_copy": True,
                "from": {"all_reduce": U, "reduce_scatter": U, "all_gather": 1 << 18, "reduce": 1 << 18,
                         "gather": 1 << 16, "scatter": U, "all_to_all": 1 << 22}, "single_copy_min": 1 << 20,
                "single_copy_min_4k": 2 << 20}
    selection.save_entry("shm", {"limits": {"2": measured}})
    assert shm_mod.single_copy_min(2) == 1 << 20 and shm_mod.single_copy_min(3) == shm_mod.DEFAULT_SINGLE_COPY_MIN
    assert shm_mod.single_copy_min_4k(2) == 2 << 20
    assert shm_mod.single_copy_min_4k(3) == shm_mod.DEFAULT_SINGLE_COPY_MIN_4K
    # a tune that chose a lower single-copy limit and none for 4 KiB pages: that limit for both
    selection.save_entry("shm", {"limits": {"2": {k: v for k, v in dict(measured, single_copy_min=16384).items()
                                                  if k != "single_copy_min_4k"}}})
    assert shm_mod.single_copy_min(2) == shm_mod.single_copy_min_4k(2) == 16384
    selection.save_entry("shm", {"limits": {"2": measured}})
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "4096")
    assert shm_mod.single_copy_min(2) == 4096  # the variable wins
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "off")
    assert shm_mod.single_copy_min(2) == U
    monkeypatch.delenv("RINGCOMM_SHM_SINGLE_COPY")
    got_max = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_max(2, True)))
    got_from = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_from(2, True)))
    for c in shm_mod.COLLECTIVES:
        if c == "broadcast":  # not measured: the built-in limits
            assert (got_max[c], got_from[c]) == (shm_mod.SHM_MAX[c], built_in_from[3]), c
        else:
            assert (got_max[c], got_from[c]) == (measured[c], measured["from"][c]), c
    # single copy off now (measured on): what it moves is not what was
    # measured, so those five take the built-in limits; the rest stay tuned
    got_max = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_max(2, False)))
    got_from = dict(zip(shm_mod.COLLECTIVES, shm_mod.shm_from(2, False)))
    for c in ("all_reduce", "reduce_scatter"):
        assert (got_max[c], got_from[c]) == (measured[c], measured["from"][c]), c
    for c in ("all_gather", "gather", "scatter", "all_to_all", "reduce"):  # (reduce: by single copy when large)
        assert got_max[c] == shm_mod.SHM_MAX[c], c
        assert got_from[c] == shm_mod.SHM_FROM.get(c, U), c


def test_ringcomm_info_says_what_auto_runs_in_the_window(tmp_path, monkeypatch):
    import json
    import subprocess
    import sys

    from ringcomm.tuning import selection
    U = shm_mod.UNLIMITED
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "auto")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_SHM")}
    measured = {"all_reduce": 65536, "reduce_scatter": 8192, "all_gather": U, "reduce": 4096, "gather": 0,
                "scatter": 1 << 20, "all_to_all": 16384, "flat_max": 4096, "single_copy": True,
                "from": {"all_reduce": U, "reduce_scatter": U, "all_gather": 256, "reduce": 1 << 18,
                         "gather": 1 << 16, "scatter": 1 << 20, "all_to_all": U}, "single_copy_min": 1 << 20}
    selection.save_entry("shm", {"limits": {"2": measured}})

    def info(*args):
        res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "info", *args], capture_output=True, text=True,
                             timeout=120, env=env)
        assert res.returncode == 0, res.stderr
        return res.stdout

    got = json.loads(info("--json"))["shm_auto"]
    assert got["2"]["tuned"] is True and got["4"]["tuned"] is False
    for c in ("all_reduce", "reduce", "gather", "scatter", "all_to_all"):
        assert (got["2"][c], got["2"]["from"][c]) == (measured[c], measured["from"][c]), c
    assert got["2"]["single_copy_min"] == 1 << 20 and got["4"]["single_copy_min"] == shm_mod.DEFAULT_SINGLE_COPY_MIN
    # the limit for blocks in 4 KiB pages: built in, the single-copy limit itself (never below it)
    assert got["2"]["single_copy_min_4k"] == 1 << 20, got["2"]
    assert got["4"]["single_copy_min_4k"] == shm_mod.DEFAULT_SINGLE_COPY_MIN_4K == shm_mod.DEFAULT_SINGLE_COPY_MIN
    text = info()
    two = text[text.index("on 2 ranks"):text.index("on 4 ranks")]
    assert "tuned: " + str(tmp_path) in two and "single copy from blocks of 1048576 B in any pages" in two, two
    measured["single_copy_min_4k"] = 4 << 20  # (as tune chooses where the slots won from 4 KiB pages)
    selection.save_entry("shm", {"limits": {"2": measured}})
    two = info()
    two = two[two.index("on 2 ranks"):two.index("on 4 ranks")]
    assert "blocks in 4 KiB pages (all_to_all, all_gather) by single copy from 4194304 B" in two, two
    for line in ("all_reduce      up to 65536 B", "all_gather      at any size", "broadcast       at any size",
                 "reduce          up to 4096 B and from 262144 B", "gather          from 65536 B",
                 "scatter         at any size", "all_to_all      up to 16384 B"):
        assert "  " + line + "\n" in two, (line, two)
    assert "built-in limits" in text[text.index("on 4 ranks"):]


def test_tune_measures_the_window_in_process():
    from ringcomm.tuning.tune import measure_shm, shm_limits

    def body(comm):
        def barrier(t):  # the slowest rank's time, so every rank makes the same number of calls
            v = np.array([t])
            comm.all_reduce(v, op="max", algorithm="ring")
            return float(v[0])
        on = comm._engine.window.single_copy_min < shm_mod.UNLIMITED
        return on, measure_shm(comm, sizes=(4, 4096, 1 << 20), reps=2, budget_s=0.002, barrier=barrier)

    single_copy, rows = ringcomm.run_local(2, body)[0]
    got = {(r["collective"], r["algorithm"], r["bytes"]) for r in rows}
    for b in (8, 4096, 1 << 20):  # (4 B rounds up to one element per rank)
        for c in ("all_reduce", "reduce_scatter", "all_gather"):
            for a in ("shm", "ring"):
                assert (c, a, b) in got, (c, a, b, sorted(got))
        for c, a in (("reduce", "shm"), ("reduce", "binomial"), ("reduce", "ring"), ("gather", "shm"),
                     ("gather", "linear"), ("scatter", "shm"), ("scatter", "linear"), ("all_to_all", "shm"),
                     ("all_to_all", "pairwise")):
            assert (c, a, b) in got, (c, a, b, sorted(got))
    assert ("all_reduce", "shm_flat", 4096) in got and ("all_reduce", "shm_flat", 1 << 20) not in got
    assert all(r["seconds"] > 0 and r["single_copy"] is single_copy for r in rows)
    # the five single copy moves, through the slots alone too, where a block reaches its limit
    slots = {(c, b) for c, a, b in got if a == "shm_slots"}
    pages = {(a, b) for c, a, b in got if a.startswith("shm_4k")}
    single = {(c, b) for c, a, b in got if a == "shm_single"}
    if single_copy:
        assert slots == {(c, 1 << 20) for c in ("reduce", "all_gather", "gather", "scatter", "all_to_all")}, \
            sorted(got)
        assert single == {(c, 1 << 20) for c in ("all_gather", "all_to_all")}, sorted(got)
        # and all_to_all from arrays in 4 KiB pages, both ways
        assert pages == {("shm_4k_single", 1 << 20), ("shm_4k_slots", 1 << 20)}, sorted(got)
    else:
        assert not slots and not pages and not single
    lim = shm_limits(rows, 2)
    measured = {"all_reduce", "reduce_scatter", "all_gather", "reduce", "gather", "scatter", "all_to_all"}
    extra = {"single_copy_min", "single_copy_min_4k"} if single_copy else set()
    assert set(lim) == measured | {"flat_max", "from", "single_copy"} | extra and set(lim["from"]) == measured, lim
    assert lim["single_copy"] is single_copy
    assert not single_copy or lim["single_copy_min"] in (512 << 10, 1 << 20), lim  # (blocks of 1 MiB / 2)
    assert not single_copy or lim["single_copy_min_4k"] in (512 << 10, 1 << 20), lim

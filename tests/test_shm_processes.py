"""Shared memory between the processes of one host, under Open MPI
(``ringcomm run``): the window is a real /dev/shm segment (found, mapped,
unlinked) and auto uses it; single copy (process_vm_readv / writev) or the
slots, by the pages an array lies in; ranks in separate scheduling groups.
Exact results against numpy (suite.py), the ledger, nothing left in
/dev/shm. Split from the former test_shm.py (shared helpers:
tests/shm_helpers.py).
"""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from store_launch import clean_env
from ringcomm import shm as shm_mod
from shm_helpers import RUN, shm_files, run_script, lines, pages_limit_env
from tiers import slow_except


@pytest.mark.parametrize("n", slow_except([2], [2, 3, 4]))
def test_over_mpi_one_host_uses_shared_memory_and_leaves_nothing(n):
    before = shm_files()
    res = run_script(n)
    assert res.returncode == 0, res.stdout + res.stderr
    got = lines(res)
    assert len(got) == n, res.stdout + res.stderr
    for line in got:
        assert "small=shm_flat big=shm errors=0 files=[]" in line, res.stdout
    assert shm_files() == before


SINGLE_COPY_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import ringcomm, suite, collectives_suite as cs
    comm = ringcomm.init()
    n, r = comm.size, comm.rank
    limit = comm._engine.window.single_copy_min
    # every form through the window by process_vm_readv (limit 1 byte), against numpy and the ledger
    errs = cs.run_all(comm, [0, 1, n + 1, 4099, 65537], cs.suite.COMBOS[::4], algorithms="shm")
    errs += cs.run_all_to_all_mixed(comm)  # per-peer blocks in the slot and by process_vm_readv
    errs += cs.run_all_to_all_mixed(comm, "auto")
    errs += suite.run_cases(comm, [100003], suite.COMBOS[::5], algorithm="shm")
    # auto at sizes that take single copy (256 KiB blocks)
    k = 65536
    x = ((np.arange(k * n) * 7 + 13 * r) % 1009).astype(np.float32)
    got = comm.all_to_all(x)
    algo = comm.last_algorithm
    want = np.concatenate([((np.arange(k * n) * 7 + 13 * q) % 1009).astype(np.float32)[r * k:(r + 1) * k]
                           for q in range(n)])
    errs += suite.compare(got, want, "auto all_to_all of 256 KiB blocks", r)
    from mpi4py import MPI
    errs = [e for es in MPI.COMM_WORLD.allgather(errs) for e in es]
    print(f"RANK {{r}} limit={{limit}} a2a={{algo}} errors={{len(errs)}}", flush=True)
    for e in errs[:10]:
        print("ERR", e, flush=True)
    comm.close()
''')


PAGES_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import ringcomm, suite
    from ringcomm.tuning.tune import array_in_pages
    comm = ringcomm.init()
    n, r = comm.size, comm.rank
    w = comm._engine.window
    k = (1 << 20) - 1024  # float32 elements per block: 4 MiB - 4 KiB
    for huge in (False, True):
        x = array_in_pages(k * n, huge)  # (madvise: huge pages asked for, or never)
        x[:] = (np.arange(k * n) * 7 + 13 * r) % 1009
        small = w.small_pages(x.ctypes.data, x.nbytes)
        for splits in (None, [k] * n):
            before = comm.traffic()
            got = comm.all_to_all(x, splits, splits, algorithm="shm")
            used = comm.traffic() - before
            want = np.concatenate([((np.arange(k * n) * 7 + 13 * q) % 1009).astype(np.float32)[r * k:(r + 1) * k]
                                   for q in range(n)])
            errs = suite.compare(got, want, f"all_to_all huge={{huge}} splits={{splits is not None}}", r)
            sent = used.per_peer("msgs_sent", "all_to_all")
            print(f"RANK {{r}} huge={{huge}} splits={{splits is not None}} small={{small}} "
                  f"sent={{sorted(sent.items())}} errors={{errs}}", flush=True)
    comm.close()
''')


def _smaps(addr: int) -> dict:
    """The /proc/self/smaps fields of the mapping that holds `addr`."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                if inside:
                    break
                inside = int(m.group(1), 16) <= addr < int(m.group(2), 16)
            elif inside:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    assert fields, f"no mapping holds {addr:#x}"
    return fields


def test_arrays_in_chosen_pages():
    # tune.array_in_pages backs the tune's 4 KiB rows, the pages test below
    # and two benchmarks: its arrays must have the pages it says. (It once
    # mapped MAP_SHARED anonymous memory, which is shmem: never huge pages
    # where shmem_enabled is never, so "huge" silently meant 4 KiB.)
    from ringcomm.tuning.tune import array_in_pages
    small, huge = array_in_pages(1 << 20, False), array_in_pages(1 << 20, True)
    assert small.dtype == np.float32 and small.size == 1 << 20 and np.all(small == 1) and np.all(huge == 1)
    assert small.ctypes.data % (2 << 20) == 0 and huge.ctypes.data % (2 << 20) == 0
    for a, flag in ((small, "nh"), (huge, "hg")):  # private (no "sh"), madvise'd as asked
        flags = _smaps(a.ctypes.data)["VmFlags"].split()
        assert "sh" not in flags and flag in flags, flags
    assert _smaps(small.ctypes.data)["AnonHugePages"] == "0 kB"

    def setting(name):
        try:
            return re.search(r"\[([\w+]+)\]", open(f"/sys/kernel/mm/transparent_hugepage/{name}").read()).group(1)
        except OSError:
            return "never"
    # Where the kernel compacts memory at fault time for a madvise'd region,
    # a touched 4 MiB one gets huge pages (elsewhere it may fall back to 4 KiB).
    if setting("enabled") != "never" and setting("defrag") in ("always", "madvise", "defer+madvise"):
        assert _smaps(huge.ctypes.data)["AnonHugePages"] != "0 kB", \
            f"transparent huge pages are {setting('enabled')!r} (defrag {setting('defrag')!r}), yet none backs the array"


def test_all_to_all_sender_pages_decide_single_copy_or_the_slots(tmp_path):
    # A block from the single-copy limit goes by single copy (one message per
    # peer) unless it lies in 4 KiB pages, which the sender asks the kernel
    # (arrays in mappings of their own, madvise'd for huge pages or against):
    # then through the slots (a piece per round), below the limit for 4 KiB
    # pages (set to 4 MiB blocks: 4 MiB - 4 KiB here). Equal blocks and
    # per-peer splits alike; results exact.
    tests = os.path.dirname(os.path.abspath(__file__))
    res = subprocess.run(RUN + ["-n", "2", "--", sys.executable, "-c", PAGES_SCRIPT.format(tests=tests)],
                         capture_output=True, text=True, timeout=240, env=pages_limit_env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    got = lines(res)
    assert len(got) == 8, res.stdout + res.stderr
    pagemap_scan = tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", os.uname().release).groups()) >= (6, 7)
    for line in got:
        assert "errors=[]" in line, line
        msgs = int(re.search(r"sent=\[\(\d+, (\d+)\)\]", line).group(1))
        small = "small=True" in line
        assert (msgs > 1) == small, line  # the slots' pieces, or one block by single copy
        if "huge=False" in line and pagemap_scan:
            assert small, line  # MADV_NOHUGEPAGE: the kernel says 4 KiB pages


GATHER_PAGES_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    from mpi4py import MPI
    sys.path.insert(0, {tests!r})
    import ringcomm, suite
    from ringcomm.tuning.tune import array_in_pages
    comm = ringcomm.init()
    n, r = comm.size, comm.rank
    w = comm._engine.window
    k = 1 << 19  # float32 elements per block: 2 MiB (under the 4 KiB limit; a whole huge page fits)
    def data(q, count=k):
        return ((np.arange(count) * 7 + 13 * q) % 1009).astype(np.float32)
    for case in ("all small", "all huge", "rank 1 small"):
        small_here = case == "all small" or (case == "rank 1 small" and r == 1)
        x = array_in_pages(k, not small_here)
        x[:] = data(r)
        said = any(MPI.COMM_WORLD.allgather(w.small_pages(x.ctypes.data, x.nbytes)))
        before = comm.traffic()
        got = comm.all_gather(x, algorithm="shm")
        used = comm.traffic() - before
        errs = suite.compare(got, np.concatenate([data(q) for q in range(n)]), f"all_gather {{case}}", r)
        msgs = used.per_peer("msgs_received", "all_gather")
        print(f"RANK {{r}} all_gather case={{case!r}} kernel_small={{said}} msgs={{sorted(msgs.items())}} "
              f"errors={{errs}}", flush=True)
    for case in ("root small", "root huge"):  # gather keeps single copy whatever the root's pages
        out = array_in_pages(k * n, case == "root huge") if r == 0 else None
        x = data(r).copy()
        before = comm.traffic()
        got = comm.gather(x, root=0, out=out, algorithm="shm")
        used = comm.traffic() - before
        errs = suite.compare(got, np.concatenate([data(q) for q in range(n)]), f"gather {{case}}", r) if r == 0 else []
        msgs = used.per_peer("msgs_sent", "gather")
        print(f"RANK {{r}} gather case={{case!r}} kernel_small=False msgs={{sorted(msgs.items())}} "
              f"errors={{errs}}", flush=True)
    comm.close()
''')


@pytest.mark.parametrize("n", slow_except([2], [2, 3]))
def test_all_gather_decides_by_the_pages_alike(n, tmp_path):
    # all_gather from the single-copy limit: single copy unless the array
    # its peers would pin (some rank's input) lies in 4 KiB pages, then
    # through the slots. Only the owner can ask the kernel, so every rank
    # says what it found before a sync: one rank in 4 KiB pages turns the
    # call to the slots on every rank (a rank that went its own way would
    # wait at a phase the others never reach). gather keeps single copy
    # whatever the root's pages. The ledger's messages per peer show the
    # path: one per segment by single copy (the engine's 1 MiB segments: at
    # most 2 per 2 MiB block), a piece per round through the slots (256 KiB:
    # 8 or more).
    tests = os.path.dirname(os.path.abspath(__file__))
    res = subprocess.run(RUN + ["-n", str(n), "--", sys.executable, "-c", GATHER_PAGES_SCRIPT.format(tests=tests)],
                         capture_output=True, text=True, timeout=240, env=pages_limit_env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    got = lines(res)
    assert len(got) == 5 * n, res.stdout + res.stderr
    pagemap_scan = tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", os.uname().release).groups()) >= (6, 7)
    for line in got:
        assert "errors=[]" in line, line
        counts = [int(c) for c in re.findall(r"\(\d+, (\d+)\)", line)]
        slots = "kernel_small=True" in line
        if " gather " in line and "RANK 0 " not in line:
            assert counts and all(c <= 2 for c in counts), line  # a leaf's single-copy writes to the root
        elif " all_gather " in line:
            assert len(counts) == n - 1 and all((c > 2) == slots for c in counts), line
        if pagemap_scan and ("all small" in line or "rank 1 small" in line):
            assert slots, line  # MADV_NOHUGEPAGE: the kernel says 4 KiB pages (on some rank)


@pytest.mark.parametrize("n", slow_except([2], [2, 3]))
def test_single_copy_between_processes(n):
    # process_vm_readv / writev between the ranks of one host: every form of
    # all_gather, scatter and all_to_all read straight from the peers'
    # arrays, gather written into the root's, results and ledger exact; and
    # `off` keeps the slots
    tests = os.path.dirname(os.path.abspath(__file__))
    src = SINGLE_COPY_SCRIPT.format(tests=tests)
    before = shm_files()
    res = subprocess.run(RUN + ["-n", str(n), "--", sys.executable, "-c", src], capture_output=True, text=True,
                         timeout=240, env=dict(os.environ, RINGCOMM_SHM_SINGLE_COPY="1",
                                               RINGCOMM_SHM_SINGLE_COPY_4K="1"))
    assert res.returncode == 0, res.stdout + res.stderr
    got = lines(res)
    assert len(got) == n, res.stdout + res.stderr
    for line in got:
        # (a kernel that refuses cross memory attach turns it off: then this is a failure worth seeing)
        assert "limit=1 " in line and "errors=0" in line, res.stdout
        assert "a2a=shm" in line, res.stdout  # single copy takes all_to_all back from 256 KiB
    res = subprocess.run(RUN + ["-n", "2", "--", sys.executable, "-c", src], capture_output=True, text=True,
                         timeout=240, env=dict(os.environ, RINGCOMM_SHM_SINGLE_COPY="off"))
    assert res.returncode == 0, res.stdout + res.stderr
    for line in lines(res):
        assert f"limit={shm_mod.UNLIMITED} " in line and "errors=0" in line and "a2a=pairwise" in line, res.stdout
    assert shm_files() == before


def test_over_mpi_transport_mpi_and_several_hosts_use_point_to_point():
    res = run_script(2, {"RINGCOMM_TRANSPORT": "mpi"}, check_suite=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert lines(res) and all("small=recursive_doubling" in line and "shm" not in line for line in lines(res)), \
        res.stdout
    # RINGCOMM_HOST_ID splits one machine: ranks on two "hosts" share no window
    res = run_script(2, {"RINGCOMM_HOST_ID": "x"}, check_suite=False)  # one id for both: one host
    assert all("big=shm" in line for line in lines(res)), res.stdout
    # above auto's limit with the ranks fitting the cores: Open MPI's single copy (shm.SHM_MAX)
    script0 = ("import ringcomm, numpy as np; c=ringcomm.init(); c.all_reduce(np.ones(1<<18,np.float32)); "
               "print('ALGO', c.last_algorithm); c.all_reduce(np.ones(1<<18,np.float32), algorithm='shm'); "
               "print('ALGO', c.last_algorithm)")
    res = subprocess.run(RUN + ["-n", "2", "--", sys.executable, "-c", script0], capture_output=True, text=True,
                         timeout=120)
    algos = [line for line in res.stdout.splitlines() if line.startswith("ALGO")]
    assert sorted(set(algos)) == ["ALGO ring", "ALGO shm"] and len(algos) == 4, res.stdout + res.stderr
    script = ("import os, ringcomm, numpy as np; os.environ['RINGCOMM_HOST_ID']='h'+os.environ['OMPI_COMM_WORLD_RANK']; "
              "c=ringcomm.init(); c.all_reduce(np.ones(1<<16,np.float32)); print('ALGO', c.last_algorithm)")
    res = subprocess.run(RUN + ["-n", "2", "--", sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [line for line in res.stdout.splitlines() if line.startswith("ALGO")] == ["ALGO ring"] * 2, res.stdout
    script = script.replace("c=ringcomm.init()", "c=ringcomm.init(transport='shm')")
    res = subprocess.run(RUN + ["-n", "2", "--", sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0 and "2 hosts" in res.stdout + res.stderr, res.stdout + res.stderr


# ------------------------------------------------ ranks in separate scheduling groups
def test_split_scheduling_needs_more_ranks_than_cores_and_different_groups(monkeypatch):
    monkeypatch.setattr(shm_mod.host, "_cores", lambda: 2)  # (where split_scheduling reads it)
    assert shm_mod.split_scheduling(["/autogroup-1", "/autogroup-2", "/autogroup-3"])
    assert not shm_mod.split_scheduling(["/autogroup-1"] * 3)  # one session (mpirun)
    assert not shm_mod.split_scheduling(["/autogroup-1", "/autogroup-2"])  # a core each
    assert not shm_mod.split_scheduling(["/autogroup-1", None, "/autogroup-3"])  # not grouped by session


SPLIT_JOB = textwrap.dedent('''
    import os, sys
    os.sched_setaffinity(0, {int(sys.argv[3])})  # both ranks on one core
    import warnings, numpy as np, torch.distributed as dist, ringcomm
    path, rank = sys.argv[1], int(sys.argv[2])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        comm = ringcomm.init(store=dist.FileStore(path, 2), rank=rank, size=2, timeout=30)
    x = np.arange(10, dtype=np.float64) * (rank + 1)
    comm.all_reduce(x)
    print("SUM", bool(np.array_equal(x, np.arange(10) * 3.0)), comm.shared_memory, flush=True)
    for w in seen:
        print("WARNING", str(w.message), flush=True)
    ''')


@pytest.mark.parametrize("sessions", slow_except(["own"], ["own", "shared"]))
def test_ranks_in_separate_scheduling_groups_are_told_once(tmp_path, sessions):
    # Two ranks pinned to one core: torchrun's way (a session, hence a kernel
    # scheduling group, per worker) gets one warning, on the host's first
    # rank; one session (mpirun's way) none. Either way the results are right.
    pytest.importorskip("torch")  # (its FileStore)
    if shm_mod.sched_group() is None:
        pytest.skip("this kernel does not group tasks by session here (autogroup off, or a cpu cgroup)")
    cpu = min(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", SPLIT_JOB, str(tmp_path / "store"), str(r), str(cpu)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                              start_new_session=(sessions == "own")) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and "SUM True True" in out, f"rank {r}: {out}{err}"
    warned = [["scheduling group of its own" in line for line in out.splitlines() if line.startswith("WARNING")]
              for out, _ in outs]
    if sessions == "own":
        assert warned == [[True], []], outs
    else:
        assert warned == [[], []], outs

"""Several hosts: the hierarchical shared-memory algorithms, hosts emulated
by a host id per rank (ringcomm/shm/), their results and the failures that
name ranks of the whole job. Split from the former test_shm.py (shared
helpers: tests/shm_helpers.py).
"""

import os
import subprocess
import sys
import textwrap

import pytest
from shm_helpers import RUN, shm_files, lines
from tiers import slow_except


# ------------------------------------------------------------ several hosts: hierarchical
HIER = textwrap.dedent('''
    import os, sys
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    n, per_host, placement = int(os.environ["OMPI_COMM_WORLD_SIZE"]), int(sys.argv[1]), sys.argv[2]
    nhosts = n // per_host
    def host_of(q):  # split this machine into hosts
        if placement == "blocked":
            return q // per_host
        if placement == "round_robin":
            return q % nhosts
        return [0, 1, 1, 0][q]  # "crossed": local index 1 is rank 3 on host 0, rank 2 on host 1
    os.environ["RINGCOMM_HOST_ID"] = "host%d" % host_of(rank)
    sys.path.insert(0, {tests!r})
    import numpy as np, ringcomm, suite
    from ringcomm import traffic
    comm = ringcomm.init()
    r = comm.rank
    hosts = ["host%d" % host_of(q) for q in range(n)]
    halves = "hierarchical" if placement != "crossed" else "ring"
    errs = []

    def ledger(tag, coll, count, dtype, before):
        between = comm.last_algorithm_between_hosts or "ring"
        intra, inter = traffic.expected_hierarchical(count, dtype, hosts, r, between, coll)
        for part, exp in (("intra", intra), ("inter", inter)):
            d = comm.traffic(part) - before[part]
            got = (d.per_peer("bytes_sent", coll), d.per_peer("bytes_received", coll))
            if got != (exp.sent, exp.received):
                errs.append(f"rank {{r}}: {{tag}}: {{part}} ledger {{got}}, expected {{(exp.sent, exp.received)}}")

    for count in (0, 1, n - 1, n + 1, 1001, 100003):
        for dtype, op in suite.COMBOS[::2]:
            want = suite.cached_reference(dtype, op, n, count)
            mine = suite.rank_data(dtype, op, n, count, [r])[0]
            lo, k = suite.offset(count, n, r), suite.split(count, n, r)
            for coll in ("all_reduce", "reduce_scatter", "all_gather"):
                if coll == "all_gather" and op != "sum":
                    continue
                tag = f"{{placement}} {{coll}} count={{count}} {{dtype}} {{op}}"
                before = {{p: comm.traffic(p) for p in ("intra", "inter")}}
                if coll == "all_reduce":
                    x = mine.copy()
                    comm.all_reduce(x, op)
                    errs += suite.compare(x, want, tag, r)
                elif coll == "reduce_scatter":
                    x = mine.copy()
                    got = comm.reduce_scatter(x, op)
                    errs += suite.compare(got, want[lo:lo + k], tag, r)
                    errs += suite.compare(x, mine, tag + " input modified", r)
                else:
                    full = suite.rank_data(dtype, op, n, count, range(n))
                    gathered = np.concatenate([full[q][suite.offset(count, n, q):][:suite.split(count, n, q)]
                                               for q in range(n)])
                    out = np.full(count, 77, mine.dtype)
                    comm.all_gather(mine[lo:lo + k].copy(), out=out)
                    errs += suite.compare(out, gathered, tag, r)
                ran = comm.last_algorithm
                if ran != ("hierarchical" if coll == "all_reduce" else halves) and n > 1:
                    errs.append(f"rank {{r}}: {{tag}}: ran {{ran}}")
                elif ran == "hierarchical":
                    ledger(tag, coll, count, dtype, before)
    # a buffer large enough that the hierarchical all_reduce pipelines it
    # (pieces of every rank's chunk, each its own step between hosts): results
    # and the ledger piece by piece; in place and not
    count = (5 << 20) // 4 * (n // nhosts) + 3
    from ringcomm._native import core
    if core.hierarchical_pieces(count, n // nhosts, 4) < 2:
        errs.append(f"rank {{r}}: {{count}} float32 is not pipelined")
    for dtype, op, inplace in (("float32", "sum", True), ("float32", "max", False)):
        want = suite.cached_reference(dtype, op, n, count)
        mine = suite.rank_data(dtype, op, n, count, [r])[0]
        before = {{p: comm.traffic(p) for p in ("intra", "inter")}}
        x = mine.copy()
        got = comm.all_reduce(x, op) if inplace else comm.all_reduce(x, op, out=np.empty_like(x))
        tag = f"{{placement}} pipelined all_reduce count={{count}} {{dtype}} {{op}}"
        errs += suite.compare(got, want, tag, r)
        if not inplace:
            errs += suite.compare(x, mine, tag + " input modified", r)
        if comm.last_algorithm == "hierarchical":
            ledger(tag, "all_reduce", count, dtype, before)
    # in place: the reduce-scatter's output a view of its input, the
    # all-gather's input a view of its output
    x = suite.rank_data("float64", "sum", n, 1001, [r])[0].copy()
    want = suite.cached_reference("float64", "sum", n, 1001)
    lo, k = suite.offset(1001, n, r), suite.split(1001, n, r)
    comm.reduce_scatter(x, out=x[lo:lo + k])
    errs += suite.compare(x[lo:lo + k], want[lo:lo + k], "reduce_scatter in place", r)
    y = np.full(1001, -1.0)
    y[lo:lo + k] = want[lo:lo + k]
    comm.all_gather(y[lo:lo + k], out=y)
    errs += suite.compare(y, want, "all_gather in place", r)
    if placement == "crossed":  # asked for, the halves name why they cannot run here
        try:
            comm.reduce_scatter(np.zeros(8, np.float32), algorithm="hierarchical")
            errs.append(f"rank {{r}}: hierarchical reduce_scatter ran on a crossed placement")
        except ringcomm.InvalidArgument as e:
            if "grow from host to host" not in str(e):
                errs.append(f"rank {{r}}: unexpected error {{e}}")
    # a receive posted before a hierarchical all_reduce takes its message during it
    # (the waits in the window and between hosts move pending receives), from another host
    errs += suite.irecv_across_a_collective(comm, "hierarchical", src=n - 1, dst=1)
    # broadcast runs over MPI point-to-point between every rank
    b = np.arange(10.0) * (r + 1)
    comm.broadcast(b, root=n - 1)
    errs += suite.compare(b, np.arange(10.0) * n, "broadcast", r)
    from mpi4py import MPI
    errs = [e for es in MPI.COMM_WORLD.allgather(errs) for e in es]
    print(f"RANK {{r}} errors={{len(errs)}} between={{comm.last_algorithm_between_hosts}}", flush=True)
    for e in errs[:8]:
        print("ERR", e, flush=True)
    comm.close()
''')


@pytest.mark.parametrize("n,per_host,placement", slow_except([(4, 2, "blocked")],
                                                              [(4, 2, "blocked"), (6, 3, "blocked"), (6, 2, "blocked"),
                                                               (6, 3, "round_robin"), (4, 2, "crossed")]))
def test_hierarchical_over_hosts_split_by_host_id(n, per_host, placement):
    # RINGCOMM_HOST_ID makes one machine n // per_host hosts: shared memory
    # inside each, MPI between the ranks of equal local index. all_reduce,
    # reduce_scatter and all_gather run hierarchically (the two halves where
    # each local index's ranks grow from host to host: not "crossed"), their
    # results exact, the ledger's intra- and inter-host parts each equal to
    # the closed form.
    src = HIER.format(tests=os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run(RUN + ["-n", str(n), "--", sys.executable, "-c", src, str(per_host), placement],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = lines(res)
    assert len(got) == n and all("errors=0" in line for line in got), res.stdout
    assert shm_files() == []


HIER_FAULT = textwrap.dedent('''
    import os, sys, time
    rank, fault = int(os.environ["OMPI_COMM_WORLD_RANK"]), sys.argv[1]
    os.environ["RINGCOMM_HOST_ID"] = "host%d" % (rank // 2)  # hosts {0, 1} and {2, 3}
    import numpy as np, ringcomm
    # late: rank 3's deadline first (the others' would race it: rank 0 waits
    # for rank 2 between hosts, and its news reached rank 3 first, 1 in 5)
    comm = ringcomm.init(timeout=20 if fault == "abort" else 2 if rank == 3 else 10)
    comm.all_reduce(np.ones(4000), algorithm="hierarchical")
    if fault == "abort" and rank == 3:
        time.sleep(0.5)
        comm.abort()
    else:
        if fault == "late" and rank == 2:
            time.sleep(4)                 # late: rank 3 waits for it in their host's window
        try:
            comm.all_reduce(np.ones(4000), algorithm="hierarchical")
            print(f"RANK {rank} origin=None peer=None no error", flush=True)
        except ringcomm.RingcommError as e:
            print(f"RANK {rank} origin={e.origin} peer={e.peer} {e}", flush=True)
    comm.close()
''')


def hier_fault(fault: str) -> tuple:
    res = subprocess.run(RUN + ["-n", "4", "--", sys.executable, "-c", HIER_FAULT, fault],
                         capture_output=True, text=True, timeout=120)
    got = {int(line.split()[1]): line for line in res.stdout.splitlines() if line.startswith("RANK")}
    assert shm_files() == []
    return got, res.stdout + res.stderr


def test_hierarchical_failure_names_ranks_of_the_whole_job():
    # Rank 3 aborts. Rank 2 (its host's window) and rank 1 (its peer between
    # hosts) hear of it through the two parts of the hierarchy, whose own
    # rank numbers are a window index and a rank among the hosts' peers:
    # both must name rank 3 as the origin and themselves by their job rank.
    got, out = hier_fault("abort")
    assert set(got) == {0, 1, 2}, out
    for r in (1, 2):
        assert f"origin=3 peer=3 [rank {r}]" in got[r], got[r]
    # the part between hosts says how its own rank numbers map to the job's
    assert "between hosts (ranks there: 0 = 1, 1 = 3)" in got[1], got[1]
    assert "origin=None" not in got[0], got[0]


def test_hierarchical_window_timeout_names_ranks_of_the_whole_job():
    # The second host's window numbers its ranks 0 and 1; the timeout, the
    # error's peer and the flight record must say job ranks 3 and 2.
    got, out = hier_fault("late")
    assert set(got) == {0, 1, 2, 3}, out
    assert "peer=2 [rank 3] timed out" in got[3], got[3]
    assert "rank 3 waited for rank 2 to arrive in shared memory" in got[3], got[3]

"""The network's faults on an emulated cluster (ringcomm/cluster/netns.py):
a host's cable pulled for 10 s in the middle of a collective, a host's
ranks killed, 1 % of the frames lost, one host's link slowed to 100 Mbit/s.

The ranks (tests/scripts/cluster_faults.py) are launched here as
``ringcomm run --hosts`` launches them (cluster.rank_env: torchrun's
variables, the store on host 0, UCX over TCP between hosts, shared memory
within a host), so that the test holds the cluster and changes it while
they run. Every figure a test asserts on is also printed (``pytest -s``):
the time from the fault to each rank's error, the lossy links' slowdown,
the slow link's steps. Nothing is left behind: no namespace, no
/etc/netns entry, no interface in this namespace.

The slow tier; skipped, with the reason, where no network namespace can be
made (or UCX not loaded, or nftables missing for the lossy links).
"""

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

import pytest

from ringcomm.cluster import Cluster, LinkSpec, placement, rank_env
from test_cluster import can_make_clusters, left_by, root_links  # noqa: F401 (the module's skip)
from tiers import slow

pytestmark = [slow, pytest.mark.timeout(600)]
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "cluster_faults.py")
MIB = 1 << 20




@contextlib.contextmanager
def emulated(hosts: int, link: str = "1gbit"):
    """A cluster of this process's, and afterwards (when the test got that far) nothing left of it."""
    links_before = root_links()
    c = Cluster(hosts, LinkSpec.parse(link))
    try:
        yield c
    finally:
        c.close()
    assert left_by(os.getpid()) == {"namespaces": [], "etc": []}, left_by(os.getpid())
    assert root_links() <= links_before, root_links() - links_before


class Job:
    """The ranks of cluster_faults.py PHASE on cluster `c` (n // hosts per host, in blocks),
    each one's output in FOLDER/out.<rank>; killed on the way out if still running."""

    def __init__(self, c: Cluster, folder, n: int, phase: str, *args):
        self.c, self.folder, self.n = c, str(folder), n
        self.host_of = placement(c.hosts, n)
        self.procs = []
        for r in range(n):
            with open(os.path.join(self.folder, f"out.{r}"), "w") as out:
                self.procs.append(subprocess.Popen(
                    c.exec_argv(self.host_of[r], [sys.executable, SCRIPT, phase, self.folder, *map(str, args)]),
                    env=rank_env(c, self.host_of, r), stdout=out, stderr=subprocess.STDOUT))
        self.exited_at = [None] * n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def read(self, name: str) -> str:
        with open(os.path.join(self.folder, name)) as f:
            return f.read()

    def output(self) -> str:
        return "\n".join(f"--- rank {r}:\n" + self.read(f"out.{r}")[-2500:] for r in range(self.n))

    def wait_for(self, prefix: str, timeout: float) -> None:
        """Until FOLDER/<prefix>.<rank> exists for every rank; fails if a rank exits first."""
        deadline = time.monotonic() + timeout
        while not all(os.path.exists(os.path.join(self.folder, f"{prefix}.{r}")) for r in range(self.n)):
            gone = [r for r in range(self.n) if self.procs[r].poll() is not None]
            assert not gone and time.monotonic() < deadline, \
                f"waiting for {prefix}.*: ranks {gone} exited\n{self.output()}"
            time.sleep(0.02)

    def pid(self, r: int) -> int:
        return int(self.read(f"running.{r}"))

    def go(self, rnd: int) -> None:
        open(os.path.join(self.folder, f"go.{rnd}"), "w").close()

    def watch(self, seconds: float) -> None:
        """Note when each rank exits (time.monotonic(), within 20 ms), for `seconds` or until all have."""
        until = time.monotonic() + seconds
        while True:
            for r, p in enumerate(self.procs):
                if self.exited_at[r] is None and p.poll() is not None:
                    self.exited_at[r] = time.monotonic()
            if None not in self.exited_at or time.monotonic() >= until:
                return
            time.sleep(0.02)

    def finish(self, timeout: float) -> dict:
        """Every rank's exit, within `timeout` (else a hang); the results by rank."""
        self.watch(timeout)
        hung = [r for r, p in enumerate(self.procs) if p.poll() is None]
        assert not hung, f"ranks {hung} still running {timeout} s on (a hang)\n{self.output()}"
        results = {}
        for f in glob.glob(os.path.join(self.folder, "result.*.json")):
            d = json.loads(self.read(os.path.basename(f)))
            results[d["rank"]] = d
        return results


def named_hosts(text: str) -> list[tuple[int, str]]:
    """The (rank, host) pairs an error's text names: "(rank 4 is on host2, rank 0 on host0)"."""
    return [(int(r), h) for r, h in re.findall(r"rank (\d+) (?:is )?on (host\d+)", text)]


def test_what_a_failure_calls_a_host():
    # (ringcomm/shm/host.py) The hostname where the hostnames tell the
    # hosts apart (an emulated cluster's host0, host1, ...; real nodes),
    # else the host key: RINGCOMM_HOST_ID's id where it splits one machine.
    from ringcomm.shm.host import host_names
    keys = ["id:ringcomm-7-h0", "id:ringcomm-7-h0", "id:ringcomm-7-h1"]
    assert host_names(keys, ["host0", "host0", "host1"]) == ["host0", "host0", "host1"]
    assert host_names(keys, ["box", "box", "box"]) == ["ringcomm-7-h0", "ringcomm-7-h0", "ringcomm-7-h1"]
    assert host_names(["n1:b1", "n2:b2"], ["n1", "n2"]) == ["n1", "n2"]


# ---- 1. a host's cable pulled for 10 s ------------------------------------

@pytest.mark.parametrize("hosts,per_host,how", [(2, 2, "set"), (3, 1, "init")])
def test_link_down_for_10_s_mid_collective(hosts, per_host, how, tmp_path):
    # Ranks loop all_reduce of 4 MiB (results against numpy) with a 5 s
    # deadline; host 1's switch port goes down for 10 s. Every rank must
    # raise a ringcomm error naming the rank it waited for (and that rank's
    # host) within the deadline plus a slack, well before the cable is back:
    # none hangs, none returns a wrong result; then every rank closes its
    # communicator and exits. 2 x 2: the hierarchy, the deadline set after
    # init (comm.timeout, which must reach the engine between hosts too);
    # 3 x 1: a ring over UCX, the deadline given to init.
    deadline, down, slack = 5.0, 10.0, 3.0
    n = hosts * per_host
    with emulated(hosts) as c, Job(c, tmp_path, n, "loop", 1 << 20, deadline, how) as job:
        job.wait_for("running", 120)
        time.sleep(0.3)  # a few calls more: the cut lands inside one
        t_cut = time.monotonic()
        c.set_link(1, False)
        job.watch(down)  # (the ranks' exits, while the cable is out)
        c.set_link(1, True)
        t_back = time.monotonic()
        results = job.finish(60)
        out = job.output()
    assert sorted(results) == list(range(n)), out
    print(f"\n[link down {down:g} s: {hosts} hosts x {per_host} ranks, host 1 cut, deadline {deadline:g} s "
          f"({'comm.timeout =' if how == 'set' else 'init(timeout=)'})] time from the cut:")
    for r in range(n):
        d = results[r]
        e = d["error"] or {}
        ttf = e.get("when", float("nan")) - t_cut
        print(f"  rank {r} ({d['host']}): error after {ttf:6.3f} s, {e.get('type')} (peer {e.get('peer')}), "
              f"{d['calls']} calls before, close {d.get('close_s')} s, exit after {job.exited_at[r] - t_cut:.2f} s")
        print(f"      {e.get('text')}")
    for r in range(n):
        d = results[r]
        assert job.procs[r].returncode == 0 and not d["wrong"] and d["calls"] >= 1, (d, out)
        e = d["error"]
        assert e is not None and not d.get("outside_loop"), (d, out)
        assert e["type"] in ("CollectiveTimeout", "CommunicatorAborted", "TransportError"), e
        assert e["peer"] is not None and re.search(r"rank \d+", e["text"]), e
        assert named_hosts(e["text"]), e  # (the peer's host, on a cluster)
        ttf = e["when"] - t_cut
        assert 0 < ttf <= deadline + slack and e["when"] < t_back, (r, ttf, e)


# ---- 3. a host's ranks killed ----------------------------------------------

@pytest.mark.parametrize("hosts,killed", [(3, (4, 5)), (2, (3,))], ids=["whole_host", "one_rank_of_it"])
def test_host_ranks_killed(hosts, killed, tmp_path):
    # H hosts x 2 ranks loop all_reduce (the hierarchy: shared memory within
    # a host, UCX between the ranks of equal local index); SIGKILL to the
    # last host's ranks (3 x 2), or to one of them (2 x 2: its host-mate
    # sees it die in their window and tells its peers between hosts which
    # rank it was). Every survivor raises at once (the deadline is 30 s)
    # naming a killed rank and its host, in this communicator's ranks (not
    # only the numbering between hosts).
    deadline, n = 30.0, 2 * hosts
    dead_host = f"host{hosts - 1}"
    with emulated(hosts) as c, Job(c, tmp_path, n, "loop", 1 << 20, deadline, "set") as job:
        job.wait_for("running", 120)
        pids = [job.pid(r) for r in killed]
        time.sleep(0.3)
        t_kill = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        results = job.finish(60)
        out = job.output()
    survivors = [r for r in range(n) if r not in killed]
    assert sorted(results) == survivors, out
    print(f"\n[SIGKILL of rank(s) {list(killed)} on {dead_host}, {hosts} hosts x 2 ranks, deadline {deadline:g} s] "
          "time from the kill:")
    for r in survivors:
        d, e = results[r], results[r]["error"] or {}
        print(f"  rank {r} ({d['host']}): error after {e.get('when', float('nan')) - t_kill:6.3f} s, {e.get('type')} "
              f"(peer {e.get('peer')}, origin {e.get('origin')}), close {d.get('close_s')} s")
        print(f"      {e.get('text')}")
    for r in killed:
        assert job.procs[r].returncode == -signal.SIGKILL
    for r in survivors:
        d, e = results[r], results[r]["error"]
        assert job.procs[r].returncode == 0 and not d["wrong"] and e is not None, (d, out)
        assert e["type"] in ("TransportError", "CommunicatorAborted"), e
        assert 0 < e["when"] - t_kill < 5.0, (r, e["when"] - t_kill, e)  # seen, not waited out
        assert any(k in killed and h == dead_host for k, h in named_hosts(e["text"])), e


# ---- 2. 1 % of the frames lost ---------------------------------------------

def lose_frames(c: Cluster, pct: float) -> None:
    """Drop `pct` % of the frames each host sends (as `ringcomm run --link 1gbit,loss=1%`)."""
    for k in range(c.hosts):
        c.reshape(k, dataclasses.replace(c.link, loss_pct=pct))


def stop_losing(c: Cluster) -> int:
    """The frames lose_frames dropped; then none are any more."""
    got = c.dropped()
    for k in range(c.hosts):
        c.reshape(k, c.link)
    return got


def test_one_percent_loss_exact_and_slower(tmp_path):
    # 2 hosts x 2 ranks: rounds of 5 all_reduces of 16 MiB, on clean links
    # and with 1 % of every host's frames dropped, alternating (clean,
    # lossy, clean, lossy: the machine's load drifts alike over both).
    # Every result exact (TCP retransmits; nothing reaches ringcomm), none
    # stalled; how much slower the lossy ones were is printed, not asserted
    # (TCP recovers most losses at once at these round trips, and the
    # machine's noise is of the same order). The frames are dropped by
    # nftables at the host's switch port (ringcomm/cluster/netns.py).
    if shutil.which("nft") is None:
        pytest.skip("the lossy links need nftables' `nft` (apt-get install nftables)")
    n, count, repeat, rounds = 4, 4 * MIB, 5, 4
    dropped = frames = 0
    with emulated(2) as c, Job(c, tmp_path, n, "timed", count, repeat, rounds) as job:
        for rnd in range(1, rounds):
            job.wait_for(f"done.{rnd - 1}", 120)
            if rnd % 2:
                c.reset_counters()
                lose_frames(c, 1.0)
            else:
                dropped += stop_losing(c)
                frames += sum(h["tx_packets"] for h in c.counters())
            job.go(rnd)
        results = job.finish(120)
        out = job.output()
        dropped += stop_losing(c)
        frames += sum(h["tx_packets"] for h in c.counters())
    assert sorted(results) == list(range(n)), out
    for d in results.values():
        assert d["error"] is None and not d["wrong"], (d, out)
    # a call's time is its slowest rank's
    per_call = [[max(results[r]["rounds"][k]["times"][i] for r in range(n)) for i in range(repeat)]
                for k in range(rounds)]
    clean = statistics.median(t for k in range(0, rounds, 2) for t in per_call[k])
    lossy = statistics.median(t for k in range(1, rounds, 2) for t in per_call[k])
    print(f"\n[1 % loss, 2 hosts x 2 ranks, all_reduce of {count * 4 // MIB} MiB, {rounds} rounds of {repeat}, "
          f"clean and lossy by turns] clean: median {clean * 1e3:.1f} ms, lossy: median {lossy * 1e3:.1f} ms, "
          f"slowdown {lossy / clean:.2f}x; {dropped} of {frames} frames dropped ({100 * dropped / frames:.2f} %)")
    for k in range(rounds):
        print(f"  round {k} ({'lossy' if k % 2 else 'clean'}): {[round(t * 1e3, 1) for t in per_call[k]]} ms")
    assert 0.3 <= 100 * dropped / frames <= 3, (dropped, frames)  # the loss was there
    assert lossy < 20 * clean + 2.0, per_call  # slower at most: no stall


# ---- 4. one slow link ------------------------------------------------------

def test_slow_link_shows_in_the_trace_not_in_the_bytes(tmp_path):
    # 3 hosts x 1 rank: gather to rank 0, scatter from it and a ring
    # all_reduce of 4 MiB per rank, traced, on 1 Gbit links; then again
    # with host 2's link at 100 Mbit. The root's gather receives one peer
    # per step, and each rank's scatter step receives from the root alone:
    # the steps waiting on host 2's link take 6-10x as long as host 1's
    # (at 1 Gbit the gather's step from rank 2 is the shorter: much of its
    # block came in alongside rank 1's).
    # (The ring's own steps cannot tell: each waits on its left neighbour,
    # who waits on its own, so every step runs at the slowest link's pace;
    # the ring as a whole takes what host 2's link needs for its share.)
    # The bytes do not change: each rank's ledger per peer equals the
    # closed form in both rounds, and the kernel counted as many bytes on
    # host 2's link as on host 1's.
    #   Then what the slow link showed (ranks finish a call apart, and one
    # that has finished its last call closes its communicator and exits
    # while its neighbours still finish theirs), made certain: a last gather
    # to rank 0, rank 2 late to it by 3 s. Rank 1 is done at once and exits
    # (about 1 s later) while rank 0 still waits for rank 2's block, and
    # rank 2 has not yet started. Rank 1 told its neighbours it left
    # (Link::leave); its process's end (the connection reset) must fail
    # neither rank 0's gather nor rank 2's: no receive stays posted to a
    # neighbour that left, and what a peer sent before it went is taken.
    n, count = 3, MIB
    with emulated(n) as c, Job(c, tmp_path, n, "slow", count, MIB // 4, 2) as job:
        job.wait_for("done.0", 120)
        c.reshape(2, LinkSpec.parse("100mbit"))
        c.reset_counters()
        job.go(1)
        job.wait_for("done.1", 120)
        links = c.counters()
        job.go(2)
        results = job.finish(120)
        out = job.output()
    assert sorted(results) == list(range(n)), out
    for d in results.values():
        assert d["error"] is None and not d["wrong"], (d, out)  # results exact, ledger = closed form

    def step(rnd, rank, coll, peer):
        (s,) = [s for s in results[rank]["rounds"][rnd]["steps"] if s["collective"] == coll and s["recv_peer"] == peer]
        return s["us"] / 1e6

    b = 4 * count
    print(f"\n[slow link: 3 hosts x 1 rank, host 2 at 100 Mbit in round 1; {b // MIB} MiB blocks]")
    seen = []
    for rnd, name in ((0, "all at 1 Gbit"), (1, "host 2 at 100 Mbit")):
        g = {p: step(rnd, 0, "gather", p) for p in (1, 2)}
        s = {r: step(rnd, r, "scatter", 0) for r in (1, 2)}
        ring = [results[r]["rounds"][rnd]["times"]["all_reduce"] for r in range(n)]
        seen.append((g[2] / g[1], s[2] / s[1], max(ring)))
        print(f"  round {rnd} ({name}): gather at rank 0, step from rank 1 {g[1] * 1e3:.1f} ms "
              f"({b / g[1] / 1e6:.0f} MB/s), from rank 2 {g[2] * 1e3:.1f} ms ({b / g[2] / 1e6:.0f} MB/s); "
              f"scatter, rank 1's step {s[1] * 1e3:.1f} ms, rank 2's {s[2] * 1e3:.1f} ms; "
              f"ring all_reduce {max(ring) * 1e3:.1f} ms")
        for r in range(n):
            print(f"    rank {r} ledger sent {results[r]['rounds'][rnd]['sent']} "
                  f"received {results[r]['rounds'][rnd]['received']}")
    print(f"  round 1, each host's link (kernel counters): {links}")
    (g0, s0, ring0), (g1, s1, ring1) = seen
    # the steps waiting on host 2's link are the slow ones, only when it is slow
    assert g1 >= 3 and s1 >= 3, seen
    assert g0 < 2 and s0 < 2, seen
    # the ring: host 2's link carries 2(n-1)/n of the buffer each way at 12.5 MB/s
    assert ring1 >= 0.7 * (2 * (n - 1) / n * b) / 12.5e6 and ring1 > 3 * ring0, seen
    # the bytes: the same per peer in both rounds (the closed form, checked by each rank), and on both links
    for r in range(n):
        assert results[r]["rounds"][0]["sent"] == results[r]["rounds"][1]["sent"], results[r]["rounds"]
        assert results[r]["rounds"][0]["received"] == results[r]["rounds"][1]["received"], results[r]["rounds"]
    for key in ("tx_bytes", "rx_bytes"):
        assert abs(links[2][key] - links[1][key]) <= 0.05 * links[1][key], links
    # the last round: every rank's gather returned, exact (above), rank 0's after rank 1 had exited
    t1 = results[1]["t_end"]
    print(f"  last round (rank 2 late by 3 s), from rank 1's gather's end: rank 1 exited after "
          f"{job.exited_at[1] - t1:.3f} s, rank 0's gather returned after {results[0]['t_end'] - t1:.3f} s, "
          f"rank 2's after {results[2]['t_end'] - t1:.3f} s")
    assert job.exited_at[1] < results[0]["t_end"], (job.exited_at, results[0]["t_end"])  # the case was there


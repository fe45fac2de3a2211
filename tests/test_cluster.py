"""The emulated cluster (``ringcomm run --hosts``): hosts as network
namespaces on one switch, links shaped by tc, the ranks launched in them.

Every collective and the point-to-point set over H = 2, 3, 4 hosts x 1, 2
ranks (tests/scripts/cluster_suite.py: results against numpy, each call's
ledger against traffic.expected), by the three launchers; what crossed the
links (the kernel's counters) against the ledger; and that a cluster leaves
nothing behind (namespaces, links, hosts files), however its launcher ends.
The slow tier (each launch builds a cluster and starts a job on it);
skipped, with the reason, where no network namespace can be made.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ringcomm import cluster
from tiers import slow

pytestmark = [slow, pytest.mark.timeout(600)]
SUITE = os.path.join(os.path.dirname(__file__), "scripts", "cluster_suite.py")


@pytest.fixture(scope="module", autouse=True)
def can_make_clusters():
    why = cluster.why_not()
    if why:
        pytest.skip(f"no emulated cluster here: {why}")
    res = subprocess.run([sys.executable, "-c", "from ringcomm import ucx; print(ucx.version())"],
                         capture_output=True, text=True, timeout=60)
    if res.returncode:
        pytest.skip("UCX cannot be loaded: " + (res.stderr or res.stdout).strip()[-300:])


def root_links() -> set:
    """This namespace's interfaces that a cluster could have left (it makes none here: a switch port
    h<k> or bridge br0 in this namespace would be a leak)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}
    return {n for n in names if re.fullmatch(r"h\d+|br0", n)}


def left_by(owner: int) -> dict:
    """What the cluster of launcher `owner` left: namespaces, /etc/netns entries, processes in them."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    etc = os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []
    mine = f"{cluster.netns.PREFIX}{owner}-"
    return {"namespaces": [n for n in ns if n.startswith(mine)], "etc": [e for e in etc if e.startswith(mine)]}


def launch(hosts, n, *args, launcher="direct", link="1gbit", timeout=300, phase="suite", env=None):
    """`ringcomm run --hosts` of the cluster suite; returns (results by rank, the process, stdout, stderr)."""
    links_before = root_links()
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "--hosts", str(hosts), "-n", str(n), "--link", link,
           "--launcher", launcher, *args, "--", sys.executable, SUITE, phase]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=timeout)
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            results[d["rank"]] = d
    assert left_by(p.pid) == {"namespaces": [], "etc": []}, left_by(p.pid)
    assert root_links() <= links_before, root_links() - links_before
    return results, p, out, err


def report_rows(err: str) -> list[dict]:
    """The launcher's table: per host, link sent, ledger sent, link received, ledger received."""
    rows = []
    for line in err.splitlines():
        m = re.match(r"(\d+)\s+(\S+)\s+([\d,]+)\s+([\d,]+)\s+\S+\s+([\d,]+)\s+([\d,]+)\s+\S+$", line)
        if m:
            v = [int(x.replace(",", "")) for x in m.groups()[2:]]
            rows.append({"host": int(m.group(1)), "link_sent": v[0], "ledger_sent": v[1], "link_received": v[2],
                         "ledger_received": v[3]})
    return rows


def check_ok(results, p, out, err, n):
    text = f"exit {p.returncode}\n{out[-3000:]}\n{err[-4000:]}"
    assert p.returncode == 0 and sorted(results) == list(range(n)), text
    errs = [e for d in results.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])
    assert "UCX  WARN" not in err and "UCX  ERROR" not in err, err[-3000:]


@pytest.mark.parametrize("hosts,per_host", [(2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)])
def test_every_collective_across_hosts(hosts, per_host):
    # Every collective and point-to-point, results and ledger exact; ranks of
    # one host share a window (the hierarchy where hosts have 2), and reach
    # the other hosts over TCP only (cluster_suite.check_shape).
    n = hosts * per_host
    results, p, out, err = launch(hosts, n)
    check_ok(results, p, out, err, n)
    assert all("tcp" in d["transport"] for d in results.values()), results
    rows = report_rows(err)
    assert len(rows) == hosts, err
    for row in rows:  # the suite crossed every link; the ledger saw it
        assert row["ledger_sent"] > 0 and row["link_sent"] >= row["ledger_sent"], row


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_other_launchers(launcher):
    # torchrun: an agent per host, the c10d rendezvous on host 0 (the
    # hostname resolves there); mpirun: its daemons started through
    # ringcomm's agent in place of ssh, MPI over TCP on eth0.
    results, p, out, err = launch(2, 4, launcher=launcher)
    check_ok(results, p, out, err, 4)
    want = "mpi" if launcher == "mpirun" else "ucx("
    assert all(d["transport"].startswith(want) for d in results.values()), results


@pytest.mark.parametrize("hosts,n", [(2, 4), (4, 4)])
def test_link_counters_equal_the_ledger(hosts, n):
    # A 16 MiB all_reduce (and the bootstrap): what the kernel counted on
    # each host's link is what the ledger booked between hosts, plus the
    # frames' headers, the acknowledgements, the store and UCX's wireup:
    # within 5 % (jumbo frames: about 0.5 %).
    results, p, out, err = launch(hosts, n, phase="big")
    check_ok(results, p, out, err, n)
    rows = report_rows(err)
    assert len(rows) == hosts, err
    per = n // hosts
    # the closed form: hierarchical (per host >= 2) moves B per host link
    # each way; the ring among H ranks 2(H-1)/H B per rank
    b = 16 << 20
    want = b if per > 1 else 2 * (hosts - 1) * b // hosts
    for row in rows:
        for side in ("sent", "received"):
            assert abs(row[f"ledger_{side}"] - want) <= 0.01 * want, (row, want)
            ratio = row[f"link_{side}"] / row[f"ledger_{side}"]
            assert 1.0 <= ratio <= 1.05, (row, ratio)


def test_nothing_left_however_the_launcher_ends(tmp_path):
    # Ctrl-C (SIGINT to the launcher), SIGTERM and SIGKILL while the ranks
    # run all_reduce in a loop: every rank is stopped, every namespace and
    # hosts file removed (after a SIGKILL, by the cluster's janitor).
    script = tmp_path / "loop.py"
    script.write_text("import numpy as np, ringcomm, sys\n"
                      "comm = ringcomm.init()\n"
                      "x = np.ones(1 << 18, np.float32)\n"
                      "comm.all_reduce(x); print('RUNNING', flush=True)\n"
                      "while True:\n"
                      "    comm.all_reduce(x)\n")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        links_before = root_links()
        p = subprocess.Popen([sys.executable, "-m", "ringcomm.cli", "run", "--hosts", "2", "-n", "4", "--",
                              sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        # (the ranks share the launcher's stdout, and under PYTHONUNBUFFERED
        # a print's text and its newline are two writes: lines may interleave)
        while "RUNNING" not in (line := p.stdout.readline()):
            assert line and p.poll() is None, p.stderr.read()[-3000:]
        assert left_by(p.pid)["namespaces"], "the cluster was not made"
        p.send_signal(sig)
        p.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while left_by(p.pid) != {"namespaces": [], "etc": []} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left_by(p.pid) == {"namespaces": [], "etc": []}, (sig, left_by(p.pid))
        assert root_links() <= links_before, (sig, root_links() - links_before)
        if sig != signal.SIGKILL:
            assert p.returncode != 0, sig


def test_clear_errors_before_anything_is_made():
    # Ranks that do not divide over the hosts, a link that cannot be read:
    # said at once, exit 2 or a SystemExit message, nothing made.
    run = lambda *a: subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", *a, "--", "python", "-c", "0"],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    r = run("--hosts", "2", "-n", "3")
    assert r.returncode != 0 and "divide evenly" in r.stderr, r.stderr
    r = run("--hosts", "2", "-n", "4", "--link", "fast")
    assert r.returncode == 2 and "rate must read like 1gbit" in r.stderr, r.stderr
    r = run("--hosts", "2", "-n", "4", "--link", "1gbit,jitter=3ms")
    assert r.returncode == 2 and "unknown setting" in r.stderr, r.stderr
    assert cluster.LinkSpec.parse("100mbit,delay=1ms,loss=0.5%,mtu=1500") == \
        cluster.LinkSpec(rate_bit=10**8, delay_ms=1.0, loss_pct=0.5, mtu=1500)


def test_bench_on_the_cluster():
    # `ringcomm bench --hosts`: ringcomm and gloo side by side, every call
    # checked, a row per size with the fraction of the link and the bytes
    # the kernel counted per call (the hierarchy: B on each host link).
    links_before = root_links()
    p = subprocess.run([sys.executable, "-m", "ringcomm.cli", "bench", "--hosts", "2", "-n", "4", "--link", "1gbit",
                        "-b", "1M", "-e", "4M", "-r", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "all exact" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [line.split() for line in p.stdout.splitlines() if re.match(r"\s+\d+M\s", line)]
    assert [r[0] for r in rows] == ["1M", "4M"], p.stdout
    for r in rows:  # size, rc time, s, [p10, p90], of link, link/B, gloo time, s, [p10, p90], of link, link/B, ratio
        assert 0.5 < float(r[5]) < 1.3 and 0.95 < float(r[6]) < 1.05, r
    assert root_links() <= links_before

"""The shared suites over the UCX transport, under real mpirun (N = 1..4):
tests/scripts/ucx_suite.py, one launch per phase, with RINGCOMM_TRANSPORT=ucx.
Skipped, with one reason, where UCX cannot be loaded."""

import json
import os
import subprocess
import sys
import time

import pytest
from tiers import slow_except

pytestmark = pytest.mark.timeout(300)
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ucx_suite.py")


@pytest.fixture(scope="module")
def ucx():
    """UCX's version, or the module skips (in a child: loading UCX here
    would put a copy in the test process that MPI's own could meet)."""
    res = subprocess.run([sys.executable, "-c", "from ringcomm import ucx; print(ucx.version())"],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        pytest.skip("UCX cannot be loaded: " + (lines[-1] if lines else f"exit {res.returncode}"))
    return res.stdout.strip()


def run(n, phase):
    env = dict(os.environ, RINGCOMM_TRANSPORT="ucx")
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", sys.executable, SCRIPT, phase]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    assert len(out) == n and res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    # UCX prints its warnings on stderr: none is expected (an unmatched
    # message left at close would be one).
    assert "UCX  WARN" not in res.stderr and "UCX  ERROR" not in res.stderr, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("n", slow_except([2, 3], [1, 2, 3, 4]))
def test_suite_over_ucx(ucx, n):
    # Every collective and point-to-point at N ranks: results against numpy,
    # each call's ledger against traffic.expected, sizes 0, 1, N+-1, primes,
    # many segments; peers running ahead into the next call.
    out = run(n, "suite")
    assert all(d["transport"].startswith("ucx(") for d in out.values()), out
    errs = [e for d in out.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])


def test_faults_over_ucx(ucx):
    # A count and a dtype mismatch (MismatchError everywhere), a wrong-sized
    # point-to-point receive (both sides fail), a missing rank (a timeout
    # naming it), abort.
    out = run(3, "faults")
    errs = [e for d in out.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])



DEATH = os.path.join(os.path.dirname(__file__), "scripts", "ucx_peer_death.py")


def ucx_shm_files() -> set:
    # (Not Open MPI's sm_segment files: this job does not use its shared
    # memory, and another job on the machine may hold some at the moment;
    # conftest.py counts them for the whole session.)
    return {f for f in os.listdir("/dev/shm") if f.startswith(("ringcomm", "ucx"))}


@pytest.mark.parametrize("tls,how", slow_except([(None, "sigkill")], [("tcp", "sigkill"), ("tcp", "exit"), (None, "sigkill"), ("sysv,self", "exit")]))
def test_a_dead_peer_is_named_at_once(ucx, tls, how, tmp_path):
    # Rank 1 of 3 dies mid-all_reduce (timeout 30 s): the others raise within
    # seconds, naming it, and close without hanging. UCX_TLS=tcp: the kernel
    # resets the dead process's connections; UCX's default here (sysv/cma):
    # a cma copy from the dead process fails, else UCP's keepalive sees the
    # process gone (1 s interval, set by ucx_transport.cpp; sysv alone: only
    # the keepalive). A neighbour may
    # hear of it from the other first (CommunicatorAborted naming rank 1).
    # mpirun --enable-recovery: else mpirun itself
    # ends the job when a rank dies, before anyone could notice. Open MPI's
    # own messages (the address exchange) over TCP: its shared-memory
    # segments are unlinked at MPI_Finalize, which the survivors skip (its
    # fence would wait for the dead rank).
    from ringcomm.launch import mpirun_command
    env = dict(os.environ, RINGCOMM_TRANSPORT="ucx")
    env.pop("UCX_TLS", None)
    extra = ["--enable-recovery", "--mca", "btl", "self,tcp", "-x", "RINGCOMM_TRANSPORT"]
    if tls:
        env["UCX_TLS"] = tls
        extra += ["-x", "UCX_TLS"]
    before = ucx_shm_files()
    cmd = mpirun_command(3, [sys.executable, DEATH, how, str(tmp_path)], extra)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    text = f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert sorted(out) == [0, 2], text
    for r, d in out.items():
        assert d["transport"].startswith("ucx(") and (tls is None or tls.split(",")[0] in d["transport"]), d
        # Its own endpoint's failure (TransportError), or its neighbour's,
        # heard through the ring (CommunicatorAborted): rank 1 named either way.
        assert d["error"] in ("TransportError", "CommunicatorAborted"), (d, text)
        # (or its pid, seen gone: ranks of one host watch each other's)
        assert ("rank 1 died" in d["text"] or "rank 1 (pid " in d["text"] if d["error"] == "TransportError"
                else "transport error with rank 1" in d["text"]), d
        assert d["after_s"] < 10, d
        assert d["close_s"] < 5, d
    assert not ucx_shm_files() - before, sorted(ucx_shm_files() - before)
    print(f"\n{tls or 'default'} {how}: " + ", ".join(
        f"rank {r} {d['error']} after {d['after_s']:.2f} s (close {d['close_s']:.2f} s)" for r, d in sorted(out.items())))


STORE_DEATH = r'''
import json, os, sys, time
import numpy as np
import torch.distributed as dist
import ringcomm
path, rank, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
comm = ringcomm.init(store=dist.FileStore(path, 2), rank=rank, size=2, timeout=30)
comm.all_reduce(np.ones(10))  # in the window: UCX has carried nothing yet (transport "ucx": over UCX)
if rank == 1:
    time.sleep(0.5)
    os._exit(7)
t0 = time.monotonic()
try:
    if what == "all_reduce":
        for _ in range(1000):
            comm.all_reduce(np.ones(1 << 18, np.float32))  # 1 MiB: the ring, over UCX
    elif what == "recv":
        comm.recv(np.zeros(1 << 20, np.uint8), 1)
    elif what == "recv_any":  # every rank that could send is gone
        comm.recv(np.zeros(1 << 20, np.uint8), None)
    else:
        comm.send(np.zeros(1 << 24, np.uint8), 1)  # 16 MiB: waits for the receiver
    out = {"error": None}
except ringcomm.RingcommError as e:
    out = {"error": type(e).__name__, "text": str(e)}
out["after_s"] = round(time.monotonic() - t0, 2)
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)
'''


@pytest.mark.parametrize("what,transport", slow_except([("all_reduce", "auto"), ("recv", "ucx")],
                                                       [("all_reduce", "auto"), ("recv", "auto"), ("recv_any", "auto"),
                                                        ("send", "auto"), ("recv", "ucx"), ("recv_any", "ucx")]))
def test_a_dead_peer_of_this_host_is_named_before_the_deadline_in_store_mode(ucx, what, transport, tmp_path):
    # Store mode on one host (torchrun's way): a window between the ranks,
    # UCX for the ring's messages and point-to-point. Rank 1 dies before UCX
    # carried anything between them, so UCX's keepalive never watches that
    # endpoint: the wait sees the process gone through the window (its pid),
    # within about 0.1 s, not at the 30 s deadline. transport "ucx": no
    # window (UCX's shared memory, which never reported it here): the engine
    # watches the pid itself (Link::watch_processes).
    script = tmp_path / "death.py"
    script.write_text(STORE_DEATH)
    store = str(tmp_path / "store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "RINGCOMM_"))}
    if transport == "ucx":
        env.pop("UCX_TLS", None)
        env["RINGCOMM_TRANSPORT"] = "ucx"
    procs = [subprocess.Popen([sys.executable, str(script), store, str(r), what], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    out0, err0 = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=30)
    lines = [json.loads(line[7:]) for line in out0.splitlines() if line.startswith("RESULT ")]
    assert lines, out0[-2000:] + err0[-3000:]
    d = lines[0]
    assert d["error"] == "TransportError" and "rank 1 (pid " in d["text"] and "died" in d["text"], d
    assert d["after_s"] < 5, d


STRANGER_JOB = '''
import sys, os, time, numpy as np, torch.distributed as dist, ringcomm
path, rank, size, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
comm = ringcomm.init(store=dist.FileStore(path, size), rank=rank, size=size, timeout=20)
x = np.arange(1001, dtype=np.float64) * (rank + 1)
comm.all_reduce(x)
print("READY", os.getpid(), comm.transport, flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
for i in range(300):
    n = (1, 1001, 70001)[i % 3]
    x = (np.arange(n) * 3 + i + 7 * rank).astype(np.float64)
    comm.all_reduce(x)
    want = sum((np.arange(n) * 3 + i + 7 * r).astype(np.float64) for r in range(size))
    bad = np.flatnonzero(x != want)
    assert bad.size == 0, f"rank {rank} call {i} index {bad[:1]}"
comm.close()
print("OK", rank, flush=True)
'''


def _listening(pid: int) -> list:
    """The TCP (address, port) pairs process `pid` listens on (/proc)."""
    import socket
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            p = line.split()
            if p[3] == "0A" and p[9] in inodes:  # LISTEN, one of its sockets
                addr, port = p[1].split(":")
                found.append((socket.inet_ntoa(bytes.fromhex(addr)[::-1]), int(port, 16)))
    return found


def test_strangers_on_the_ucx_ports_are_never_taken_for_a_rank(ucx, tmp_path):
    # Two store-launched ranks as two hosts (UCX over TCP). While they run 300
    # all_reduces, anything that can reach their UCX ports connects and sends
    # random bytes, zeros, or nothing and holds the connection: UCX drops what
    # is not its protocol, and the ranks' results stay exact.
    import socket
    import threading
    import time
    script = tmp_path / "job.py"
    script.write_text(STRANGER_JOB)
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "RINGCOMM_"))}
    env.update(UCX_TLS="tcp", RINGCOMM_SINGLETON_OK="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), str(r), "2", str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(env, RINGCOMM_HOST_ID=f"host{r}")) for r in (0, 1)]
    try:
        ready = [p.stdout.readline().split() for p in procs]
        assert all(r[:1] == ["READY"] and r[2].startswith("ucx(") for r in ready), ready
        ports = [a for r in ready for a in _listening(int(r[1]))]
        assert ports, "found no UCX listening port"
        held, stop, made = [], threading.Event(), [0]

        def strangers():
            k = 0
            while not stop.is_set():
                for addr in ports:
                    try:
                        s = socket.create_connection(addr, timeout=2)
                        made[0] += 1
                        s.sendall([os.urandom(4096), b"\0" * 4096, b""][k % 3])
                    except OSError:
                        continue  # (dropped by UCX mid-send: what it should do)
                    if k % 3 == 2 and len(held) < 8:
                        held.append(s)
                    else:
                        s.close()
                k += 1
                time.sleep(0.005)
        t = threading.Thread(target=strangers, daemon=True)
        t.start()
        time.sleep(0.2)  # some strangers before the first call
        go.write_text("")
        outs = [p.communicate(timeout=120) for p in procs]
        stop.set()
        t.join()
        for s in held:
            s.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, f"rank {r}: exit {p.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    assert made[0] >= 3 * len(ports), f"only {made[0]} stranger connections to {ports}"
    print(f"\n{made[0]} stranger connections to {len(ports)} UCX ports during 300 all_reduces")


@pytest.mark.parametrize("n", slow_except([2], [2, 3]))
def test_store_launch_of_the_device_path_with_the_emulated_device(ucx, n, tmp_path):
    # The GPU store launch's structure on a CPU (issue 25): processes no MPI
    # launcher started, bootstrapped through a store, control messages over
    # UCX, the payload in NCCL-like groups on the emulated device over a
    # second UCX worker (device="emulated-nccl", jitter). The whole suite
    # phase: every collective against numpy and its ledger, point-to-point,
    # peers running ahead with every all_reduce algorithm.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "RINGCOMM_"))}
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, SCRIPT, "emulated", store, str(r), str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(n)]
    outs = [p.communicate(timeout=240) for p in procs]
    got = {}
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-2000:]}\n{err[-3000:]}"
        for line in out.splitlines():
            if line.startswith("RESULT "):
                d = json.loads(line[7:])
                got[d["rank"]] = d
    assert sorted(got) == list(range(n)), outs
    assert all(d["transport"].startswith("grouped(emulated:") for d in got.values()), got
    errs = [e for d in got.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])


EMULATED_DEATH = '''
import sys, time, numpy as np, torch.distributed as dist, ringcomm
store, rank = sys.argv[1], int(sys.argv[2])
comm = ringcomm.init(store=dist.FileStore(store, 2), rank=rank, size=2, timeout=5, device="emulated-nccl")
x = np.ones(1 << 20, np.float32)
t0 = None
try:
    for i in range(100000):
        comm.all_reduce(x)
        if i == 3:
            print("LOOPING", flush=True)
            t0 = time.monotonic()
    print("NO ERROR", flush=True)
except ringcomm.RingcommError as e:
    print("RAISED", type(e).__name__, round(time.monotonic() - t0, 2), str(e).replace(chr(10), " ")[:300], flush=True)
'''


def test_a_peer_killed_mid_collective_on_the_emulated_device_path_is_an_error_not_a_crash(ucx, tmp_path):
    # The payload's groups run on the emulated device's queue thread; when
    # the peer dies, UCX raises there. That ended the process (an exception
    # out of a thread). Now the group ends and keeps the failure, which the
    # rank raises at its next wait (as NCCL's asynchronous error), naming the
    # peer; where UCX never sees the death (its shared-memory transports may
    # not), the group ends at the timeout and is raised likewise: an error
    # either way, never the group's wrong data passed on as a result.
    script = tmp_path / "death.py"
    script.write_text(EMULATED_DEATH)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "RINGCOMM_"))}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    assert procs[1].stdout.readline().strip() == "LOOPING"
    time.sleep(0.3)  # both deep in the loop: some call is in flight
    procs[1].kill()
    out0, err0 = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=30)
    assert procs[0].returncode == 0 and "RAISED" in out0, f"exit {procs[0].returncode}\n{out0}\n{err0[-3000:]}"
    took = float(out0.split("RAISED", 1)[1].split()[1])
    assert took < 30 and "rank 1" in out0, out0


HOSTS_APART = '''
import json, sys, numpy as np, torch.distributed as dist, ringcomm
path, rank = sys.argv[1], int(sys.argv[2])
comm = ringcomm.init(store=dist.FileStore(path, 2), rank=rank, size=2, timeout=30)
x = (np.arange(300001) % 101 + 5 * rank).astype(np.float32)
comm.all_reduce(x)
ok = bool(np.array_equal(x, (2 * (np.arange(300001) % 101) + 5).astype(np.float32)))
print("RESULT " + json.dumps({"transport": comm.transport, "ok": ok}), flush=True)
comm.close()
'''


def test_ranks_with_different_host_ids_never_share_memory(ucx, tmp_path):
    # Two processes of one kernel, told they are on different hosts
    # (RINGCOMM_HOST_ID): UCX would find each other's shared memory; each
    # gets only the other's network address, so the all_reduce crosses
    # over TCP (an emulated cluster's hosts are such processes).
    script = tmp_path / "apart.py"
    script.write_text(HOSTS_APART)
    store = str(tmp_path / "store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "RINGCOMM_", "UCX_"))}
    procs = [subprocess.Popen([sys.executable, str(script), store, str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(env, RINGCOMM_HOST_ID=f"host{r}"))
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        got = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        assert p.returncode == 0 and got, out[-2000:] + err[-3000:]
        tls = got[0]["transport"].split(", ", 1)[1].rstrip(")").split("/")
        assert got[0]["ok"] and tls == ["tcp"], got[0]  # not sysv, posix or cma

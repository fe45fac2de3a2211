"""Launches without MPI (issue 25): real torchrun jobs and plain processes
meeting in a store.

* ``torchrun --standalone --nproc-per-node 2`` and ``4``
  (tests/scripts/torchrun_job.py): every collective against numpy, new_group,
  a 2-D DeviceMesh, ``ringcomm.init()`` from torchrun's variables, the
  ledger, MPI never initialized, shared memory within the host.
* The backend's whole matrix (tests/scripts/torch_backend_check.py: every op,
  DDP and FSDP2 against gloo) and the PyTorch programs
  (tests/scripts/torch_programs.py: DTensor, tensor, sequence and pipeline
  parallelism, MoE, checkpointing) under torchrun at N = 2.
* Two torchrun agents on this machine as two nodes (c10d rendezvous on
  127.0.0.1, ``RINGCOMM_HOST_ID`` per node, UCX over loopback TCP): the
  hierarchical path.
* A restart (``--max-restarts 1``) after a worker died mid-job.
* ``ringcomm.init(store=FileStore(...), rank=, size=)`` in plain processes,
  and a peer that dies: the other raises within the timeout, naming it.

Every launch must leave ``/dev/shm`` as it found it.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytest.importorskip("torch")
from ringcomm import ucx  # noqa: E402
from store_launch import clean_env  # noqa: E402
from tiers import slow_except  # noqa: E402

HERE = os.path.dirname(__file__)
JOB = os.path.join(HERE, "scripts", "torchrun_job.py")

if not ucx.available():
    pytest.skip(f"UCX cannot be loaded: {ucx.why_not()}", allow_module_level=True)


def shm_files() -> set:
    # (Open MPI's sm_segment files are counted once for the whole session in
    # conftest.py: a store launch starts no MPI, which the job checks itself,
    # and another MPI job on this machine may hold one at the moment.)
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith(("ringcomm", "ucx"))}
    except OSError:
        return set()


def results(out: str) -> dict:
    got = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            got[d["rank"]] = d
    return got


def worker_stdout(log_dir) -> str:
    """The workers' stdout, one file each (torchrun --redirects 1): the
    ranks' lines never interleave mid-line as they do on torchrun's own
    stdout. The last attempt's files come last."""
    files = sorted(glob.glob(os.path.join(str(log_dir), "**", "stdout.log"), recursive=True),
                   key=lambda f: ("attempt_" in f and int(f.split("attempt_")[1].split(os.sep)[0]), f))
    return "".join(open(f).read() for f in files)


def torchrun(args, script, *script_args, env=None, timeout=300):
    """torchrun `args` `script`; returns the completed process, its stdout
    replaced by the workers' (every attempt, in order)."""
    before = shm_files()
    with tempfile.TemporaryDirectory() as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--log-dir={logs}", "--redirects=1", *args, script,
               *script_args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or clean_env())
        res.stdout = worker_stdout(logs) + res.stdout
    left = shm_files() - before
    assert not left, f"left in /dev/shm: {sorted(left)}"
    return res


def check_job(res, n, *, shared=True, hierarchical=False):
    got = results(res.stdout)
    assert res.returncode == 0 and sorted(got) == list(range(n)), res.stdout[-3000:] + res.stderr[-3000:]
    fails = [f for d in got.values() for f in d["fails"]]
    assert not fails, "\n".join(fails)
    c = got[0]["counts"]
    for op in ("no_mpi", "label", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all",
               "new_group", "init_env", "init_env_transport") + (("send_recv",) if n > 1 else ()) + \
            (("mesh_dp", "mesh_tp") if n == 4 else ()) + (("ledger",) if not hierarchical else ()):
        assert c.get(op, 0) > 0, f"no {op} cases ran: {c}"
    for d in got.values():
        assert d["shared_memory"] is shared, d
        assert d["hierarchical"] is hierarchical, d
    return got


@pytest.mark.parametrize("n", slow_except([2], [2, 4]))
def test_torchrun_standalone(n):
    res = torchrun(["--standalone", f"--nproc-per-node={n}"], JOB)
    got = check_job(res, n)
    print(f"\nn={n}: init_process_group {max(d['init_s'] for d in got.values()):.2f} s (slowest rank); "
          f"transport {got[0]['transport']}; all_reduce ran {got[0]['algorithm']}")


@pytest.mark.slow
def test_torchrun_backend_matrix_and_programs():
    for script in ("torch_backend_check.py", "torch_programs.py"):
        res = torchrun(["--standalone", "--nproc-per-node=2"], os.path.join(HERE, "scripts", script), timeout=600)
        got = results(res.stdout)
        assert res.returncode == 0 and sorted(got) == [0, 1], script + res.stdout[-3000:] + res.stderr[-3000:]
        if script == "torch_backend_check.py":
            fails = [f for d in got.values() for f in d["fails"]]
            assert not fails, "\n".join(fails)
            assert got[0]["ddp_diff"] == 0.0 and set(got[0]["fsdp_diffs"]) == {"float32", "bf16", "fp16"}, got[0]
        else:
            for r, d in got.items():
                bad = {k: v for k, v in d["programs"].items() if not v.get("ok")}
                assert not bad, f"rank {r}: {bad}"


def test_two_agents_as_two_nodes():
    # The rendezvous store is this process's (port 0: the kernel picks a
    # free one), the agents its clients: a port chosen free and then bound
    # by an agent could be taken meanwhile (seen with UCX jobs beside it).
    import datetime
    import torch.distributed as dist
    rdzv = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=300))
    port = rdzv.port
    procs = []
    before = shm_files()
    logs = tempfile.mkdtemp()
    flight_dir = os.path.join(logs, "flight")
    for node in (0, 1):
        # (UCX_TLS=tcp: between the "nodes" UCX would otherwise find the
        # same machine and use shared memory. The flight records of every
        # rank that fails land in flight_dir: a failure here names what each
        # rank was waiting for, on both nodes.)
        env = clean_env(RINGCOMM_HOST_ID=f"node{node}", UCX_TLS="tcp", RINGCOMM_DUMP_ON_ERROR=flight_dir)
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--log-dir={logs}/{node}", "--redirects=1",
               "--nnodes=2", f"--node-rank={node}",
               "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               "--rdzv-conf=is_host=false", "--rdzv-id=ringcomm-two-nodes", JOB]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=300) for p in procs]
    assert not shm_files() - before
    if any(p.returncode for p in procs):
        from ringcomm import flight
        report = [f"node {node}: exit {p.returncode}\n{out[-2000:]}{err[-4000:]}"
                  for node, (p, (out, err)) in enumerate(zip(procs, outs))]
        report.append("flight records:\n" + (flight.analyze(flight_dir) if os.path.isdir(flight_dir) else "none"))
        pytest.fail(f"logs in {logs}\n" + "\n".join(report))
    got = results(worker_stdout(logs))
    shutil.rmtree(logs, ignore_errors=True)
    assert sorted(got) == [0, 1, 2, 3], outs
    fails = [f for d in got.values() for f in d["fails"]]
    assert not fails, "\n".join(fails)
    assert all(d["hierarchical"] for d in got.values()), got


@pytest.mark.slow
def test_restart_after_a_worker_died():
    res = torchrun(["--standalone", "--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.2"], JOB,
                   env=clean_env(RINGCOMM_TEST_DIE_AT_ATTEMPT=0, JOB_TIMEOUT=20))
    got = check_job(res, 2)
    assert all(d["attempt"] == 1 for d in got.values()), got


STORE_JOB = textwrap.dedent("""
    import sys, os, time, signal, threading, numpy as np, torch.distributed as dist, ringcomm
    path, rank, size, fault = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    comm = ringcomm.init(store=dist.FileStore(path, size), rank=rank, size=size, timeout=5)
    assert "mpi4py.MPI" not in sys.modules
    x = np.arange(100003, dtype=np.float64) * (rank + 1)
    comm.all_reduce(x)
    assert np.array_equal(x, np.arange(100003) * sum(range(1, size + 1))), rank
    print("OK", rank, comm.transport, comm.shared_memory, flush=True)
    if fault.startswith("die") and rank == 1:
        os._exit(7)                       # killed in the middle of the job
    if fault == "interrupt":
        if rank == 0:                     # Ctrl-C while waiting for rank 1 (the handler set: a
            # test started in the background inherits SIGINT ignored, which Python keeps)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        if rank == 1:                     # away until rank 0 was interrupted (not a fixed time: a
            t1 = time.monotonic()         # loaded machine may start rank 0's wait late)
            while not os.path.exists(path + ".interrupted") and time.monotonic() - t1 < 30:
                time.sleep(0.01)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            n = 1001 if fault == "mismatch" and rank == 1 else 1000
            # (the ring: rank 3 waits for rank 2 alone, which must tell it)
            comm.all_reduce(np.ones(n), algorithm="ring" if fault.startswith("die_over_ucx") else "auto")
        print("NO ERROR", flush=True)
    except (ringcomm.RingcommError, KeyboardInterrupt) as e:
        if fault == "none":
            raise
        if isinstance(e, KeyboardInterrupt):
            open(path + ".interrupted", "w").close()
        print("RAISED", type(e).__name__, f"after {time.monotonic() - t0:.1f} s:",
              str(e).replace(chr(10), " ")[:400], flush=True)
    """)


@pytest.mark.parametrize("fault", slow_except(["none", "die"], ["none", "die", "die_over_ucx", "die_over_ucx_shm", "mismatch", "interrupt"]))
def test_init_with_a_store_in_plain_processes(tmp_path, fault):
    """The fault matrix's cases on a store launch (shared memory + UCX):
    a peer killed mid-job, ranks that disagree on the call, Ctrl-C.
    die_over_ucx: four ranks over UCX alone (no window; TCP, whose kernel
    resets the dead rank's connections), so rank 3, which has no connection
    to rank 1, hears of its death only through the ring's ABORT notice,
    which must still say that rank 1 died (it said "transport error with
    rank 1" alone: seen in CI with three ranks, where a rank heard the
    notice before it saw the pid gone). Each rank says it is a host of its
    own (RINGCOMM_HOST_ID), so no rank watches another's pid: UCX's own
    report is what is tested. die_over_ucx_shm: one host, over UCX's
    shared-memory transports, which did not report the dead left neighbour
    (UCX 1.20 here): the engine watches the pids itself (rank 2 waited for
    the 5 s deadline before)."""
    n = 4 if fault.startswith("die_over_ucx") else 3
    env = clean_env()
    if fault.startswith("die_over_ucx"):
        env.pop("UCX_TLS", None)
        env.update(RINGCOMM_TRANSPORT="ucx", **({"UCX_TLS": "tcp"} if fault == "die_over_ucx" else {}))
    before = shm_files()
    hosts = (lambda r: {"RINGCOMM_HOST_ID": f"node{r}"}) if fault == "die_over_ucx" else (lambda r: {})
    procs = [subprocess.Popen([sys.executable, "-c", STORE_JOB, str(tmp_path / "store"), str(r), str(n), fault],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **hosts(r)})
             for r in range(n)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert not shm_files() - before
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert f"OK {r} ucx" in out, out + err
        if fault == "die_over_ucx_shm":  # (else the case tests TCP again)
            assert "sysv" in out or "posix" in out, out
        if fault == "none":
            assert p.returncode == 0 and "NO ERROR" in out, out + err
            continue
        if fault.startswith("die") and r == 1:
            assert p.returncode == 7
            continue
        assert "RAISED" in out, out + err
        kind, secs = out.split("RAISED ")[1].split()[0], float(out.split(" after ")[1].split()[0])
        if fault.startswith("die"):  # noticed by the peer's pid (or UCX), well before the 5 s deadline
            assert "rank 1" in out and "died" in out and secs < 4, out
            if fault.startswith("die_over_ucx") and r in (0, 2):  # rank 1's neighbours: each saw it
                # itself, or heard the other's notice, if that one saw it first (seen in CI: rank 2 told by 0)
                if "through the ring" in out:
                    assert kind == "CommunicatorAborted" and f"rank {2 - r} failed" in out, out
                    assert "(rank 1 died)" in out, out
                elif r == 2:  # waited for rank 1: UCX's report, or the pid's (rank 0, the sender, either)
                    assert ("UCX reported" in out) == (fault == "die_over_ucx"), out
                    assert ("(pid " in out) == (fault == "die_over_ucx_shm"), out
            if fault.startswith("die_over_ucx") and r == 3:  # waited for rank 2 alone: told through the ring
                assert kind == "CommunicatorAborted" and "reported to rank 3 through the ring" in out, out
        elif fault == "mismatch":
            assert kind in ("MismatchError", "CommunicatorAborted") and "1001" in out and secs < 4, out
        else:  # interrupt: rank 0 stops at once; its peers hear of it, none waits for its deadline
            assert (kind == "KeyboardInterrupt") == (r == 0) and secs < 4, out
    if fault.startswith("die_over_ucx"):  # at least one neighbour saw rank 1 die itself
        assert any("through the ring" not in outs[r][0] for r in (0, 2)), outs


HIER_JOB = textwrap.dedent("""
    import sys, numpy as np, torch.distributed as dist, ringcomm
    path, rank, size, times = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    store = dist.FileStore(path, size)
    def data(c, r, dt=np.float32):
        return (((np.arange(c) * 7 + 3 * r) % 11) - 5 + r).astype(dt)
    for k in range(times):
        comm = ringcomm.init(store=dist.PrefixStore(f"k{k}/", store), rank=rank, size=size, timeout=15)
        assert comm._engine.hierarchical
        for count in (0, 1, 5):
            x = data(count, rank)
            comm.all_reduce(x)
            assert np.array_equal(x, np.sum([data(count, r) for r in range(size)], axis=0)), (rank, k, count)
            b = data(count, rank)
            comm.broadcast(b, root=size - 1)         # not hierarchical: the first message between the hosts
            assert np.array_equal(b, data(count, size - 1)), (rank, k, count)
        comm.close()
    print("OK", rank, flush=True)
    """)


def test_first_message_between_hosts_after_hierarchical_calls(tmp_path):
    """Two "hosts" of two ranks (RINGCOMM_HOST_ID, UCX over loopback TCP):
    hierarchical all_reduces (shared memory, and the engine between hosts)
    come first, then a broadcast, the first message on the communicator's
    own UCX connections. Its header often leaves only after the
    connection's handshake, while the sender goes on to the next
    hierarchical call, which never progresses that transport: the receiver
    then waited for the header until the deadline (seen once in CI). A
    collective now ends only once its header was delivered. Ten
    communicators in a row, each a fresh connection."""
    n = 4
    before = shm_files()
    procs = [subprocess.Popen([sys.executable, "-c", HIER_JOB, str(tmp_path / "store"), str(r), str(n), "10"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(RINGCOMM_HOST_ID=f"node{r // 2}", UCX_TLS="tcp"))
             for r in range(n)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert not shm_files() - before
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {r}" in out, f"rank {r}: {out}{err[-3000:]}"


EARLY_ABORT_JOB = textwrap.dedent("""
    import sys, time, numpy as np, torch.distributed as dist, ringcomm
    path, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    comm = ringcomm.init(store=dist.FileStore(path, size), rank=rank, size=size, timeout=20)
    t0 = time.monotonic()
    if rank == 1:
        comm.abort()                      # before any collective, then away (alive, not calling)
        time.sleep(3)
        sys.exit(0)
    try:
        # every rank needs a block from rank 1, by messages (not the window)
        comm.all_to_all(np.arange(8.0) + rank, algorithm="pairwise")
        print("NO ERROR", flush=True)
    except ringcomm.RingcommError as e:
        print("RAISED", type(e).__name__, f"after {time.monotonic() - t0:.1f} s:", str(e), flush=True)
    """)


def test_an_abort_before_the_first_collective_reaches_both_hosts_at_once(tmp_path):
    """Rank 1 aborts right after init and stays alive without calling: its
    ABORT notice is the first message on new UCX connections between the
    hosts (the one a handshake may hold back). Every other rank raises at
    once, not at its deadline, and the text says the abort came before any
    collective (it named a call "#0 all_reduce(count=0, dtype=float16)")."""
    n = 4
    procs = [subprocess.Popen([sys.executable, "-c", EARLY_ABORT_JOB, str(tmp_path / "store"), str(r), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(RINGCOMM_HOST_ID=f"node{r // 2}", UCX_TLS="tcp"))
             for r in range(n)]
    outs = [p.communicate(timeout=120) for p in procs]
    for r, (out, err) in enumerate(outs):
        if r == 1:
            continue
        assert "RAISED CommunicatorAborted" in out, f"rank {r}: {out}{err[-3000:]}"
        assert float(out.split(" after ")[1].split()[0]) < 5, out  # the deadline is 20 s
        assert "rank 1 aborted the communicator (before its first collective)" in out, out


TERM_JOB = textwrap.dedent("""
    import sys, os, time, torch.distributed as dist, ringcomm, ringcomm.shm as shm
    path, rank = sys.argv[1], int(sys.argv[2])
    if rank == 1:
        def die(*args):                   # a rank that dies while mapping the window
            time.sleep(0.5)
            os._exit(3)
        shm.segment._open_and_map = die  # (the hand-shake: ringcomm/shm/segment.py)
    print("STARTED", flush=True)
    ringcomm.init(store=dist.FileStore(path, 2), rank=rank, size=2, timeout=20)
    print("NO ERROR", flush=True)
    """)


def test_sigterm_during_the_hand_shake_leaves_no_segment(tmp_path):
    # torchrun's agent ends the other workers with SIGTERM once one failed;
    # rank 0, waiting in the hand-shake with the segment made, ran no
    # `finally` and left it in /dev/shm. Now it unlinks it, then ends by the
    # signal as before.
    import signal
    import time
    before = shm_files()
    procs = [subprocess.Popen([sys.executable, "-c", TERM_JOB, str(tmp_path / "store"), str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
             for r in range(2)]
    procs[1].communicate(timeout=60)
    time.sleep(1.0)  # rank 0 waits for rank 1's answer, its segment made
    procs[0].send_signal(signal.SIGTERM)
    out, err = procs[0].communicate(timeout=30)
    assert procs[1].returncode == 3
    assert "STARTED" in out and "NO ERROR" not in out, out + err
    assert procs[0].returncode == -signal.SIGTERM, (procs[0].returncode, out + err)
    assert not shm_files() - before, sorted(shm_files() - before)

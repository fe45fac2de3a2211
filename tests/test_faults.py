"""The fault matrix: what each fault produces, on which ranks, within what time.

Every case runs real processes under real Open MPI (or in-process ranks),
bounded in time, and prints its measured figures (pytest -s shows them):

* a straggler that arrives after the others timed out, while they wait, make
  further calls, close, or have exited: no signal anywhere, exit code 0, the
  straggler raises CommunicatorAborted (with the original cause and rank)
  within 1 s of arriving, and no late message lands in an array the program
  reused;
* Ctrl-C (SIGINT) during a waiting collective, sync and async, over MPI and
  in-process: KeyboardInterrupt within 0.5 s, the peers fail within one trip;
* a rank killed with SIGKILL mid-collective: the job ends within 10 s;
* Open MPI's TCP path (the transport between machines): correctness suite
  and the monitoring cross-check of the ledger;
* a soak of 10^4 mixed collectives: RSS, threads and file descriptors flat;
* the flight recorder's dumps of a real straggler, and ``ringcomm analyze``.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ringcomm
from ringcomm import CollectiveTimeout, CommunicatorAborted
from tiers import slow_except

HERE = os.path.dirname(__file__)
SCRIPTS = os.path.join(HERE, "scripts")
RUN = [sys.executable, "-m", "ringcomm.cli", "run"]


def results(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[7:])
            out[d["rank"]] = d
    return out


@pytest.fixture(autouse=True)
def no_segment_left_behind():
    """After every fault, on either path: no ringcomm segment in /dev/shm
    (each is unlinked as soon as every rank has mapped it)."""
    def segments():
        return {f for f in os.listdir("/dev/shm") if f.startswith("ringcomm-")}
    before = segments()
    yield
    assert segments() <= before, f"left in /dev/shm: {sorted(segments() - before)}"


def mpirun(n, script, *args, mca=(), timeout=120, env=None):
    extra = [x for k, v in mca for x in ("--mca", k, v)]
    cmd = RUN + ["-n", str(n)] + extra + ["--", sys.executable, os.path.join(SCRIPTS, script), *map(str, args)]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return res, time.monotonic() - t0


def assert_clean_exit(res):
    text = res.stdout + res.stderr
    assert res.returncode == 0, f"exit code {res.returncode}\n{text[-4000:]}"
    for bad in ("signal", "Segmentation", "core dumped", "Traceback"):
        assert bad not in text, f"{bad!r} in the job's output:\n{text[-4000:]}"


# ---------------------------------------------------------------- stragglers
@pytest.mark.parametrize("variant,count,transport", slow_except(
    [("exit", 64 * 1024, "mpi"), ("wait", 64 * 1024, "shm")], [
    ("wait", 64 * 1024, "mpi"), ("next", 64 * 1024, "mpi"), ("close", 64 * 1024, "mpi"),
    ("exit", 64 * 1024, "mpi"), ("exit", 3 << 20, "mpi"),
    # the same faults in the shared-memory window (ranks of one host)
    ("wait", 64 * 1024, "shm"), ("next", 64 * 1024, "shm"), ("exit", 3 << 20, "shm")]))
def test_straggler_after_the_others_timed_out(variant, count, transport):
    # N = 3, timeout 2 s, the last rank sleeps 4 s before its 6th call; 3 Mi
    # float32 (12 MiB, 4 segments per chunk) leaves several rendezvous sends
    # in flight when the others give up.
    late, timeout = 4.0, 2.0
    res, wall = mpirun(3, "straggler.py", variant, late, count, 5, timeout, timeout=120,
                       env=dict(os.environ, RINGCOMM_TRANSPORT=transport))
    assert_clean_exit(res)
    r = results(res.stdout)
    assert sorted(r) == [0, 1, 2], res.stdout + res.stderr
    for rank in (0, 1):
        d = r[rank]
        assert d["calls_ok"] == 5 and "wrong" not in d
        assert d["error"] in ("CollectiveTimeout", "CommunicatorAborted"), d
        assert d["error_after_s"] < timeout + 1.0, d
        assert d["reused_intact"], f"rank {rank}: a late message landed in a reused array"
    # The ring: rank 0 waits on the straggler, its left neighbour. In shared
    # memory ranks 0 and 1 both wait for it; whichever's deadline comes
    # first publishes the failure, and the other may hear of it first.
    # On a loaded machine rank 1's deadline (it waits on rank 0) can pass
    # first on the ring too: then rank 0 hears of that timeout instead.
    if transport == "mpi" and r[0]["error"] == "CommunicatorAborted":
        assert r[1]["error"] == "CollectiveTimeout" and r[1]["peer"] == 0, r[1]
        assert "rank 1 timed out" in r[0]["message"], r[0]
    else:
        first = r[0] if transport == "mpi" else next(
            (r[k] for k in (0, 1) if r[k]["error"] == "CollectiveTimeout"), r[0])
        assert first["error"] == "CollectiveTimeout" and first["peer"] == 2, first
        # the peer's last known state: #5 announced in the window, or its
        # messages of #5 and none of #6 (over MPI)
        assert ("#5: it has not reached #6" in first["message"]
                or "started is #5 (a header or message of it arrived); nothing shows it has started #6"
                in first["message"]), first
    s = r[2]
    assert s["calls_ok"] == 5
    assert s["error"] == "CommunicatorAborted" and s["origin"] in (0, 1), s
    assert "timed out" in s["message"], s  # the original cause travels with it
    assert s["error_after_s"] < 1.0, s
    assert s["reused_intact"]
    if variant == "next":
        for rank in (0, 1):
            assert r[rank]["next_calls"] > 10 and r[rank]["next_max_s"] < 0.5, r[rank]
    if variant == "close":
        assert max(r[k]["close_s"] for k in r) < 2.0
    print(f"\nstraggler/{variant}/{count * 4 >> 10} KiB/{transport}: job {wall:.1f} s; timeouts after "
          f"{r[0]['error_after_s']:.2f} / {r[1]['error_after_s']:.2f} s; straggler raised "
          f"{s['error_after_s'] * 1e3:.1f} ms after arriving; quarantined at exit "
          f"{[r[k]['pending_at_exit'] for k in range(3)]}")


@pytest.mark.parametrize("transport", slow_except(["shm"], ["mpi", "shm"]))
def test_straggler_dumps_and_analyze(tmp_path, transport):
    env = dict(os.environ, RINGCOMM_DUMP_ON_ERROR=str(tmp_path), RINGCOMM_TRANSPORT=transport)
    res, _ = mpirun(3, "straggler.py", "wait", 3.0, 64 * 1024, 5, 1.5, env=env)
    assert_clean_exit(res)
    files = sorted(os.listdir(tmp_path))
    assert files == ["mpi-1-rank0.json", "mpi-1-rank1.json", "mpi-1-rank2.json"], files
    doc = json.load(open(tmp_path / "mpi-1-rank0.json"))
    last = doc["records"][-1]
    assert last["seq"] == 6 and last["state"] == "failed" and last["waiting_for"] == 2
    assert last["waiting_to"] == "receive"
    assert last["waiting_what"] == ("its header" if transport == "mpi" else "its part in shared memory"), last
    assert [x["state"] for x in doc["records"][:5]] == ["done"] * 5
    text = subprocess.run([sys.executable, "-m", "ringcomm.cli", "analyze", str(tmp_path)],
                          capture_output=True, text=True, timeout=60).stdout
    print("\n" + text)
    assert "Behind: rank 2" in text and "#6 all_reduce" in text
    assert "after the first rank had given up" in text
    what = "its header" if transport == "mpi" else "its part in shared memory"
    assert "rank 0: issued at" in text and f"waiting for rank 2 to send {what}" in text


def test_analyze_the_documented_example():
    # The dumps in docs/ (a real straggler run) and the paragraph the README shows.
    example = os.path.join(os.path.dirname(HERE), "docs", "flight_record_example")
    text = subprocess.run([sys.executable, "-m", "ringcomm.cli", "analyze", example],
                          capture_output=True, text=True, timeout=60).stdout
    readme = open(os.path.join(os.path.dirname(HERE), "README.md")).read()
    assert text.strip().startswith("Communicator mpi#1, 3 rank(s)")
    assert " ".join(text.split()) in " ".join(readme.split()), "README's analyze example is stale"


# ---------------------------------------------------------------- Ctrl-C
@pytest.mark.parametrize("mode", slow_except(["sync"], ["sync", "async", "handler", "recv", "sendrecv"]))
def test_sigint_during_a_waiting_collective_over_mpi(mode):
    # 3 ranks, timeout 60 s; rank 1 joins 4 s late; rank 0 gets SIGINT 0.5 s
    # into its wait. It must raise KeyboardInterrupt within 0.5 s; rank 2
    # (waiting on the ring) must fail within one trip, not after 60 s.
    cmd = RUN + ["-n", "3", "--", sys.executable, os.path.join(SCRIPTS, "interrupt.py"), mode, "4"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, pids = [], {}
    try:
        t_end = time.monotonic() + 60
        while len(pids) < 3 and time.monotonic() < t_end:
            line = p.stdout.readline()
            lines.append(line)
            if line.startswith("PID "):
                _, rank, pid = line.split()
                pids[int(rank)] = int(pid)
        assert len(pids) == 3, "".join(lines)
        time.sleep(0.5)
        t_sig = time.monotonic()
        os.kill(pids[0], signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    out = "".join(lines) + rest
    r = results(out)
    assert sorted(r) == [0, 1, 2], out
    # A handler of the program's own (mode "handler") calls comm.abort() from
    # inside the waiting collective: the collective ends as aborted, no hang.
    expected = "CommunicatorAborted" if mode == "handler" else "KeyboardInterrupt"
    assert r[0]["outcome"] == expected, r[0]
    delay = r[0]["raised_at"] - t_sig
    assert delay < 0.5, f"{expected} {delay:.3f} s after SIGINT"
    # The send to the late rank that was in flight is quarantined with its array held.
    assert r[0]["quarantined"] == 0 or r[0]["held_arrays"] >= 1, r[0]
    if mode == "sendrecv":  # its send (400 KB: MPI's rendezvous, never received, not cancellable) is kept
        assert r[0]["quarantined"] >= 1 and r[0]["held_arrays"] >= 1, r[0]
    assert r[2]["outcome"] == "CommunicatorAborted" and r[2]["origin"] == 0, r[2]
    assert ("interrupted" in r[2]["message"]) == (mode != "handler"), r[2]
    if mode in ("recv", "sendrecv"):  # the ring names the op that was interrupted, not a collective
        assert "rank 0's recv(" in r[2]["message"] and "tag 7" in r[2]["message"], r[2]
    peer_delay = r[2]["raised_at"] - t_sig
    assert peer_delay < 1.0, f"rank 2 failed {peer_delay:.3f} s after the SIGINT"
    assert r[1]["outcome"] == "CommunicatorAborted" and r[1]["waited_s"] < 1.0, r[1]
    assert p.returncode == 0, out
    print(f"\nSIGINT/{mode} over MPI: {expected} {delay * 1e3:.0f} ms after the signal; rank 2 failed "
          f"{peer_delay * 1e3:.0f} ms after it; the late rank 1 {r[1]['waited_s'] * 1e3:.1f} ms after calling; "
          f"rank 0 quarantined {r[0]['quarantined']} request(s), holding {r[0]['held_arrays']} call's arrays")


def _start(n, mode, count, transport, results_dir):
    """The job of leave_or_interrupt.py and each rank's pid (once all are up)."""
    cmd = RUN + ["-n", str(n), "--", sys.executable, os.path.join(SCRIPTS, "leave_or_interrupt.py"), mode, str(count)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, RINGCOMM_TRANSPORT=transport, RESULTS_DIR=str(results_dir)))
    lines, pids = [], {}
    t_end = time.monotonic() + 60
    while len(pids) < n and time.monotonic() < t_end:
        line = p.stdout.readline()
        if not line and p.poll() is not None:
            break
        lines.append(line)
        if line.startswith("PID "):
            _, rank, pid = line.split()
            pids[int(rank)] = int(pid)
    if len(pids) < n:
        p.kill()
        raise AssertionError("".join(lines) + p.stdout.read())
    return p, pids, lines


# 8 B and 64 MiB; shared memory (auto), MPI and UCX point-to-point
LOOP = [(n, count, transport) for transport in ("auto", "mpi", "ucx") for n, count in
        [(2, 2), (3, 2), (4, 2), (2, 16 << 20), (3, 16 << 20), (4, 16 << 20)]]


@pytest.mark.parametrize("n,count,transport", slow_except([(3, 2, "auto")], LOOP))
def test_sigint_to_one_rank_of_a_loop(n, count, transport, tmp_path):
    # Every rank loops on all_reduce; SIGINT to one rank lands wherever it
    # is (at 8 B nearly always between two calls, in Python: no ringcomm
    # wait sees it). Its peers must raise naming it within a second, and the
    # job must end, as after any uncaught exception. (They used to sleep in
    # their next call until killed, and the interrupted rank with them, in
    # MPI_Finalize.)
    victim = n - 1 if n > 2 else 1
    p, pids, lines = _start(n, "loop", count, transport, tmp_path)
    try:
        time.sleep(0.5)
        t_sig = time.monotonic()
        os.kill(pids[victim], signal.SIGINT)
        rest, _ = p.communicate(timeout=30)
        t_end = time.monotonic()
    finally:
        if p.poll() is None:
            p.kill()
    out = "".join(lines) + rest
    r = {int(f.stem): json.loads(f.read_text()) for f in tmp_path.glob("*.json")}
    assert sorted(r) == list(range(n)), out
    assert r[victim]["outcome"] == "KeyboardInterrupt", r[victim]
    for rank in set(range(n)) - {victim}:
        d = r[rank]
        assert d["outcome"] == "CommunicatorAborted" and d["origin"] == victim, d
        assert f"rank {victim} was interrupted (KeyboardInterrupt)" in d["message"], d
        assert d["raised_at"] - t_sig < 1.0, f"rank {rank} raised {d['raised_at'] - t_sig:.3f} s after the SIGINT"
    assert p.returncode != 0 and t_end - t_sig < 10, (p.returncode, t_end - t_sig, out[-3000:])
    print(f"\nSIGINT to rank {victim} of {n} looping on {count * 4} B over {r[0]['transport']}: peers raised "
          f"{max(r[q]['raised_at'] for q in r if q != victim) - t_sig:.3f} s after it, job ended after "
          f"{t_end - t_sig:.2f} s")


@pytest.mark.parametrize("mode", ["close", "exit"])
@pytest.mark.parametrize("n,count,transport", slow_except([(2, 2, "auto")],
                                                           [(2, 2, "auto"), (3, 16 << 20, "auto"), (3, 2, "mpi"),
                                                            (3, 16 << 20, "mpi"), (3, 2, "ucx"), (2, 16 << 20, "ucx")]))
def test_a_rank_that_leaves_tells_its_peers(mode, n, count, transport, tmp_path):
    # Rank 1 stops after call #6 (the first one and 5 more) and closes its
    # communicator (or returns from its script), staying alive in close's
    # sleep or in MPI_Finalize; the others call #7. They raise at once,
    # naming rank 1 and its last call, not after their 60 s deadline.
    p, pids, lines = _start(n, mode, count, transport, tmp_path)
    try:
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    out = "".join(lines) + rest
    r = {int(f.stem): json.loads(f.read_text()) for f in tmp_path.glob("*.json")}
    assert sorted(r) == sorted(set(range(n)) - {1}), out
    for rank, d in r.items():
        assert d["outcome"] == "CommunicatorAborted" and d["origin"] == 1, d
        assert "rank 1 closed its communicator" in d["message"], d
        if "heard of it" not in d["message"]:  # (second-hand, through the ring: the call is not known)
            assert "after its call #6" in d["message"], d
        assert d["waited_s"] < 1.0, d
    print(f"\n{mode} of rank 1 of {n} at {count * 4} B over {r[0]['transport']}: the peers raised after "
          f"{max(d['waited_s'] for d in r.values()):.3f} s in their call #7")


@pytest.mark.parametrize("transport", ["auto", "shm"])
def test_a_rank_that_closes_in_process_tells_its_peers(monkeypatch, transport):
    monkeypatch.setenv("RINGCOMM_TRANSPORT", transport)

    def body(comm):
        x = np.arange(1000, dtype=np.float32)
        for _ in range(3):
            comm.all_reduce(x)
        if comm.rank == 1:
            comm.close()
            return None
        t0 = time.monotonic()
        try:
            comm.all_reduce(x)
        except CommunicatorAborted as exc:
            return time.monotonic() - t0, str(exc), exc.origin
        return "completed"
    for rank, got in enumerate(ringcomm.run_local(3, body, timeout=30)):
        if rank != 1:
            waited, msg, origin = got
            assert waited < 1.0 and origin == 1 and "rank 1 closed its communicator" in msg, (rank, got)


def test_sigint_during_run_local():
    # A notebook's "interrupt kernel": SIGINT to the process while run_local
    # waits for ranks stuck in a collective (one rank never joins).
    code = textwrap.dedent("""
        import json, os, signal, threading, time
        import numpy as np, ringcomm
        # (started in the background, e.g. under nohup or `&`, the test
        # inherits SIGINT ignored, and Python then keeps ignoring it)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        def fn(comm):
            if comm.rank == 2:
                time.sleep(30)
            comm.all_reduce(np.ones(1000))
        t_sig = []
        def send():
            time.sleep(0.5)
            t_sig.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=send, daemon=True).start()
        try:
            ringcomm.run_local(3, fn, timeout=60)
            print("RESULT " + json.dumps({"rank": 0, "outcome": "returned"}))
        except KeyboardInterrupt:
            print("RESULT " + json.dumps({"rank": 0, "outcome": "KeyboardInterrupt",
                                          "delay": time.monotonic() - t_sig[0]}), flush=True)
    """)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - t0
    r = results(res.stdout)
    assert r and r[0]["outcome"] == "KeyboardInterrupt", res.stdout + res.stderr
    assert r[0]["delay"] < 0.5, r
    assert res.returncode == 0, res.stderr
    print(f"\nSIGINT/run_local: KeyboardInterrupt {r[0]['delay'] * 1e3:.0f} ms after the signal; "
          f"process done in {wall:.1f} s (a rank thread asleep in user code is left behind as a daemon)")


def test_abort_wakes_in_process_peers_within_a_trip():
    # The in-process counterpart of the Ctrl-C path: a rank that fails while
    # the others wait aborts its communicator and the ring is told.
    def fn(comm):
        if comm.rank == 1:
            time.sleep(0.2)
            raise KeyboardInterrupt  # what Ctrl-C raises in a rank's code
        t0 = time.monotonic()
        try:
            comm.all_reduce(np.ones(100))
        except CommunicatorAborted as exc:
            return time.monotonic() - t0, exc.origin
    with pytest.raises(KeyboardInterrupt):
        ringcomm.run_local(3, fn, timeout=60)


# ---------------------------------------------------------------- SIGKILL
def test_rank_killed_mid_collective_ends_the_job():
    cmd = RUN + ["-n", "3", "--", sys.executable, os.path.join(SCRIPTS, "kill_rank.py")]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    t_kill = next((float(line.split()[1]) for line in res.stdout.splitlines() if line.startswith("KILL ")), None)
    assert t_kill is not None, res.stdout + res.stderr
    ended = time.monotonic()
    assert res.returncode != 0  # the job failed (mpirun reports the killed rank)
    assert ended - t_kill < 10.0, f"the job ended {ended - t_kill:.1f} s after the kill"
    print(f"\nSIGKILL mid-collective: job ended {ended - t_kill:.2f} s after the kill "
          f"(mpirun exit code {res.returncode}; whole run {ended - t0:.1f} s)")


# ---------------------------------------------------------------- TCP
TCP = [("btl", "tcp,self")]


def test_a_queued_tcp_message_reaches_its_peer_while_the_sender_waits_in_shared_memory():
    # Deterministic form of a CI deadlock (tests/scripts/tcp_lazy_connect.py).
    res, wall = mpirun(4, "tcp_lazy_connect.py", mca=TCP, timeout=120)
    assert_clean_exit(res)
    assert res.stdout.count("RESULT ok") == 4, res.stdout
    assert wall < 60, f"{wall:.0f} s: a rank waited for its deadline"


@pytest.mark.parametrize("n", slow_except([3], [2, 3, 4]))
def test_suite_over_open_mpi_tcp(n):
    res, wall = mpirun(n, "mpi_suite.py", mca=TCP, timeout=600)
    assert_clean_exit(res)
    r = results(res.stdout)
    assert sorted(r) == list(range(n)), res.stdout + res.stderr
    errs = [e for d in r.values() for e in d["errors"]]
    assert not errs, "\n".join(errs[:30])
    assert all(d["cases"] > 0 for d in r.values())
    print(f"\nsuite over TCP, n={n}: {r[0]['cases']} sizes x every collective, dtype and op, {wall:.1f} s")


# ---------------------------------------------------------------- soak
@pytest.mark.slow
def test_soak_over_mpi():
    res, wall = mpirun(3, "soak.py", 10000, timeout=600)
    assert_clean_exit(res)
    r = results(res.stdout)
    assert sorted(r) == [0, 1, 2]
    for rank, d in r.items():
        assert d["bad"] == 0, d
        growth = (d["rss_kib"][1] - d["rss_kib"][0]) / 1024
        assert growth < 5.0, f"rank {rank}: RSS grew {growth:.1f} MiB over {d['calls']} collectives"
        assert d["threads"][1] == d["threads"][0], d
        assert d["fds"][1] == d["fds"][0], d
    print(f"\nsoak over MPI: 3 ranks x 10^4 mixed collectives in {wall:.1f} s; RSS KiB (after warm-up, end) "
          f"{[r[k]['rss_kib'] for k in range(3)]}; threads {r[0]['threads']}; fds {r[0]['fds']}")


@pytest.mark.slow
def test_soak_in_process():
    res = subprocess.run([sys.executable, os.path.join(SCRIPTS, "soak.py"), "2500", "local", "4"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    d = results(res.stdout)[0]
    assert d["bad"] == 0
    growth = (d["rss_kib"][1] - d["rss_kib"][0]) / 1024
    assert growth < 5.0, f"RSS grew {growth:.1f} MiB: {d}"
    assert d["threads"][1] == d["threads"][0] and d["fds"][1] == d["fds"][0], d
    print(f"\nsoak in process: {d['calls']} collectives; RSS KiB {d['rss_kib']}; threads {d['threads']}; "
          f"fds {d['fds']}")


# ---------------------------------------------------------------- in-process failures
def test_timeout_names_the_newest_call_a_peer_ran_in_shared_memory():
    # It said "rank 1 has not announced any collective yet" when rank 1's
    # calls had run in the window (they send no header).
    res, _ = mpirun(2, "skipped_call.py", timeout=60)
    r = results(res.stdout)
    assert r[0]["first"] in ("shm", "shm_flat"), r
    assert "The newest call rank 1 has announced is #1: it has not reached #2" in r[0]["error"], r[0]


STOPPED = [
    # (algorithm, RINGCOMM_TRANSPORT, when rank 1 stops, what rank 0's timeout must say of it)
    ("shm", "auto", "inside", "Rank 1 has started #2 too (announced in shared memory) but has not arrived at this "
                              "step of it."),
    ("shm", "auto", "before", "The newest call rank 1 has announced is #1: it has not reached #2."),
    # pairwise on two ranks: the first message is the header (none on its own)
    ("halving_doubling", "auto", "inside", "Rank 1 has started this call ("),
    ("halving_doubling", "auto", "before", "The newest call rank 1 has announced is #1: it has not reached #2."),
    ("halving_doubling", "mpi", "inside", "Rank 1 has started this call (a message of it arrived)."),
    ("halving_doubling", "mpi", "before", "The newest call rank 1 is known to have started is #1 (a header or "
                                          "message of it arrived); nothing shows it has started #2."),
    ("ring", "auto", "inside", "Rank 1 has started this call ("),
]


@pytest.mark.parametrize("algorithm,transport,when,says", slow_except([STOPPED[0], STOPPED[4]], STOPPED),
                         ids=[f"{a}-{t}-{w}" for a, t, w, _ in STOPPED])
def test_a_stopped_rank_is_described_truly_in_the_timeout(algorithm, transport, when, says):
    # A 64 MiB all_reduce with rank 1 stopped (SIGSTOP) in it said "The
    # newest call rank 1 has announced is #74: it has not reached #74" (in
    # the window; over messages too, where the window knew of the call);
    # stopped before it, over MPI alone with pairwise algorithms (no header
    # of their own), "Rank 1 has not announced any collective yet", 73 calls
    # in. What is said now is what rank 0 knows: rank 1's announcement, its
    # header, or a message of the call.
    env = dict(os.environ, RINGCOMM_TRANSPORT=transport)
    cmd = RUN + ["-n", "2", "--", sys.executable, os.path.join(SCRIPTS, "stopped_rank.py"), algorithm, when]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    pid, error, text = None, None, []
    try:
        for line in p.stdout:  # until rank 0 has timed out; then rank 1 goes on
            text.append(line)
            if line.startswith("PID"):
                pid = int(line.split()[1])
            if line.startswith("RESULT ") and json.loads(line[7:])["rank"] == 0:
                error = json.loads(line[7:]).get("error")
                break
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        rest = p.communicate(timeout=60)[0]
    assert error, "".join(text) + rest
    assert "timed out" in error and says in error, error
    for announced, reached in re.findall(r"announced is #(\d+): it has not reached #(\d+)", error):
        assert int(announced) < int(reached), error


def test_in_process_timeout_names_what_the_peer_is_doing():
    def fn(comm):  # the ring: rank 0 waits for rank 2, its left neighbour
        comm.all_reduce(np.ones(10), algorithm="ring")
        if comm.rank == 2:
            time.sleep(1.0)
            return None
        comm.all_reduce(np.ones(10), algorithm="ring")
    with pytest.raises(CollectiveTimeout) as info:
        ringcomm.run_local(3, fn, timeout=0.3)
    msg = str(info.value)
    # Rank 0 waits for rank 2; rank 1 waits for rank 0, which waits for rank
    # 2. Both waits start within microseconds of each other, so on a loaded
    # machine either may expire first: each names what its peer is doing.
    assert ("Rank 2: its latest collective #1 all_reduce finished" in msg and "has not issued #2" in msg
            or "Rank 0: it is in #2 all_reduce, waiting" in msg and "for rank 2 to send its header" in msg), msg
    recs = info.value.flight_records
    assert sorted(recs) == [0, 1, 2]
    assert recs[0][-1]["state"] == "failed" and recs[0][-1]["waiting_for"] == 2
    assert recs[2][-1]["seq"] == 1 and recs[2][-1]["state"] == "done"
    assert ringcomm.quarantined() == 0  # in-process requests are always withdrawn exactly


def test_flight_record_fields_and_capacity(monkeypatch):
    monkeypatch.setenv("RINGCOMM_FLIGHT_RECORDER", "4")

    def fn(comm):
        for k in range(6):
            comm.all_reduce(np.arange(1000, dtype=np.float32) + k, op="max", algorithm="ring")
        comm.broadcast(np.zeros(5, np.int32), root=1)
        comm.barrier()
        return comm.flight_record()
    recs = ringcomm.run_local(2, fn)
    for rank, rs in enumerate(recs):
        # The last 4 of 8 collectives; the running barrier is the last.
        assert [r["seq"] for r in rs] == [5, 6, 7, 8]
        assert [r["collective"] for r in rs] == ["all_reduce", "all_reduce", "broadcast", "barrier"]
        a = rs[0]
        assert (a["count"], a["dtype"], a["op"], a["algorithm"], a["state"]) == (1000, "float32", "max", "ring",
                                                                                  "done")
        assert a["t_issue"] <= a["t_start"] <= a["t_end"] and abs(a["t_end"] - time.time()) < 60
        assert a["bytes_sent"] == a["bytes_received"] == 2 * 500 * 4  # ring: 2(N-1)/N of 4000 B
        assert rs[2]["root"] == 1 and rs[2]["op"] is None and rs[0]["rank"] == rank


def test_flight_record_shows_a_running_collective():
    import threading

    def fn(comm):
        if comm.rank == 1:
            time.sleep(0.6)
            comm.all_reduce(np.ones(10), algorithm="ring")
            return None
        w = comm.all_reduce(np.ones(10), async_op=True, algorithm="ring")  # the ring waits for the header first
        time.sleep(0.3)
        running = comm.flight_record()[-1]
        w.wait()
        return running
    r = ringcomm.run_local(2, fn)[0]
    assert r["state"] == "running" and r["waiting_for"] == 1 and r["waiting_to"] == "receive"
    assert r["waiting_what"] == "its header" and time.time() - r["waiting_since"] > 0.2
    assert threading.active_count() >= 1


@pytest.mark.parametrize("exc, peer_type", [(ringcomm.InvalidArgument("must be an integer"), ringcomm.InvalidArgument),
                                            (OSError("unreadable tune file"), ringcomm.RingcommError),
                                            (KeyboardInterrupt(), ringcomm.RingcommError)])
def test_from_rank0_raises_rank0s_failure_on_every_rank(exc, peer_type):
    """What rank 0 alone computes for everyone (window limits, cost models,
    ports): its failure, a Ctrl-C included, reaches the peers waiting in the
    broadcast instead of leaving them there."""
    from ringcomm.errors import from_rank0
    sent = []

    def bcast(obj, root=0):  # rank 0 runs first here, so the peer finds what it broadcast
        if obj is not None:
            sent.append(obj)
            return obj
        return sent[-1]

    def compute():
        raise exc
    with pytest.raises(type(exc)):
        from_rank0(bcast, True, compute, "choose the limits")
    with pytest.raises(peer_type) as ei:
        from_rank0(bcast, False, compute, "choose the limits")
    assert str(ei.value).startswith(f"rank 0 failed to choose the limits: {type(exc).__name__}: {exc}"), ei.value
    assert from_rank0(bcast, True, lambda: 7, "x") == 7 and from_rank0(bcast, False, None, "x") == 7


def test_a_bad_argument_leaves_the_flight_record_dump_to_a_real_failure(tmp_path, monkeypatch):
    """Each communicator dumps its flight record once, on its first error:
    a bad argument (nothing moved) must not use that up."""
    monkeypatch.setenv("RINGCOMM_DUMP_ON_ERROR", str(tmp_path))

    def body(comm):
        comm.timeout = 0.5
        x = np.zeros(4, np.float32)
        for call in (lambda: comm.send(x, 5), lambda: comm.sendrecv(x, 1 - comm.rank, x[2:], 1 - comm.rank),
                     lambda: comm.recv(x, comm.rank)):
            with pytest.raises(ringcomm.InvalidArgument):
                call()
        after_bad = sorted(os.listdir(tmp_path))
        comm.barrier()
        if comm.rank == 1:  # a real failure: rank 0 never sends
            with pytest.raises(ringcomm.CollectiveTimeout):
                comm.recv(x, 0)
        return after_bad
    assert ringcomm.run_local(2, body) == [[], []]
    dumped = sorted(os.listdir(tmp_path))
    assert len(dumped) == 1 and dumped[0].endswith("rank1.json"), dumped
    assert json.load(open(tmp_path / dumped[0]))["error"]["type"] == "CollectiveTimeout"

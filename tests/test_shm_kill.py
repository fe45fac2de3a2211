"""A SIGKILL of every rank, at any moment of the shared segments' hand-shake,
leaves nothing in /dev/shm (issue 50).

A segment used to be created under a name, which its creator removed once
every rank had mapped it: every rank killed in between (a job cancelled,
the OOM killer, a node agent) left the 1 MiB window, or a 128 MiB per rank
arena, in /dev/shm for good (3 of 3 kills in that window). Now the
creator's file has no name (O_TMPFILE) and the peers open it through
/proc/<pid>/fd/<fd>, so nothing can stay; only a peer in another pid
namespace gets a name (".flock"), which the creator's flock guards and any
later hand-shake on the host sweeps once its creator is gone.

The ranks are real processes: under mpirun (``ringcomm run``) and in plain
processes through a FileStore. tests/scripts/shm_kill.py stops each at one
moment (or loops, for kills at random times) and prints the inode of the
file it made or mapped; a test counts only those files, and names carrying
its own job's prefix, never another job's.
"""

import itertools
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from store_launch import clean_env
from tiers import slow_except

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "shm_kill.py")
RUN = [sys.executable, "-m", "ringcomm.cli", "run"]
_stores = itertools.count()


def on_dev_shm() -> dict:
    """(device, inode) -> name of every file in /dev/shm now."""
    out = {}
    for name in os.listdir("/dev/shm"):
        try:
            st = os.lstat("/dev/shm/" + name)
        except FileNotFoundError:
            continue
        out[(st.st_dev, st.st_ino)] = name
    return out


def _unshare_prefix():
    """A command prefix that runs a process in a pid namespace of its own
    (with its own /proc: it cannot see the other ranks' processes), killed
    with its parent; None where this machine allows none."""
    for cmd in (["unshare", "--pid", "--mount-proc", "--kill-child"],
                ["unshare", "--user", "--map-root-user", "--pid", "--mount-proc", "--kill-child"]):
        try:
            if subprocess.run(cmd + ["true"], capture_output=True, timeout=30).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


UNSHARE = _unshare_prefix()
needs_unshare = pytest.mark.skipif(UNSHARE is None, reason="no pid namespace can be made here (unshare)")


class Job:
    """The ranks of one launch of shm_kill.py, their output read as it comes."""

    def __init__(self, launcher, n, moment, tmp_path, env=None, unshared=()):
        self.launcher, self.n = launcher, n
        self.lines = queue.Queue()
        self.pids, self.paused, self.paused_pids, self.prefixes, self.text = [], [], [], set(), []
        if launcher == "mpirun":
            cmd = RUN + ["-n", str(n), "--", sys.executable, SCRIPT, moment]
            self.procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           env=dict(os.environ, **(env or {})), start_new_session=True)]
        else:
            store = str(tmp_path / f"store{next(_stores)}")
            self.procs = [subprocess.Popen((UNSHARE if r in unshared else []) +
                                           [sys.executable, SCRIPT, moment, store, str(r), str(n)],
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           env=clean_env(**(env or {})))
                          for r in range(n)]
        for p in self.procs:
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p):
        for line in p.stdout:
            self.lines.put(line)

    def wait_for(self, paused, timeout=90):
        """Until every rank has started and `paused` ranks have stopped."""
        deadline = time.monotonic() + timeout
        while len(self.pids) < self.n or len(self.paused) < paused:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.launcher}: {len(self.pids)} ranks started, {len(self.paused)} stopped "
                                     "in time:\n" + "".join(self.text)[-4000:]) from None
            self.text.append(line)
            words = line.split()
            if words[:1] == ["PID"]:
                self.pids.append(int(words[1]))
                self.prefixes.add(words[2])
            elif words[:1] == ["PAUSED"]:
                self.paused.append((int(words[2]), int(words[3]), words[4]))
                self.paused_pids.append(int(words[1]))
            elif line.startswith("NOT PAUSED") or "Traceback" in line:
                raise AssertionError("".join(self.text)[-4000:] + "".join(self._rest()))

    def _rest(self):
        try:
            while True:
                yield self.lines.get(timeout=1)
        except queue.Empty:
            return

    def kill(self):
        """SIGKILL every rank, then wait until every process of the job is gone."""
        if self.launcher == "mpirun":
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:  # (one in a pid namespace of its own: its unshare, whose child dies with it)
            for p in self.procs:
                p.kill()
        self.close()
        if self.launcher == "mpirun":
            deadline = time.monotonic() + 30
            while any(os.path.exists(f"/proc/{pid}") for pid in self.pids):
                assert time.monotonic() < deadline, "a killed rank is still there"
                time.sleep(0.05)

    def close(self):
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                if self.launcher == "mpirun":  # the ranks (each in a process group of its own), then mpirun's
                    for pid in self.pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.kill()
                p.wait(timeout=30)

    def ours(self) -> dict:
        """Files in /dev/shm now that this job made: a stopped rank's file
        (by device and inode), or a name with the job's prefix."""
        files = on_dev_shm()
        mine = {(dev, ino) for dev, ino, _ in self.paused}
        return {key: name for key, name in files.items()
                if key in mine or any(("/" + name).startswith(p) for p in self.prefixes)}


def sweep_by_a_later_job(tmp_path):
    """One more launch on this host (two plain processes): its hand-shake
    sweeps what a killed job left."""
    job = Job("store", 2, "once", tmp_path)
    job.close()
    text = "".join(job._rest())
    assert all(p.returncode == 0 for p in job.procs), text[-4000:]


# (launcher, ranks, moment, ranks that stop there, ranks per host)
MOMENTS = [
    ("mpirun", 3, "created", 1, None),   # rank 0 made the window, no peer has it yet: the case
    ("mpirun", 3, "mapped", 2, None),    # every peer has mapped it, rank 0 still holds its file
    ("mpirun", 3, "arena", 1, None),     # the arena (first comm.empty), made, no peer has it yet
    ("mpirun", 4, "created", 2, 2),      # each host's window of a hierarchical job (RINGCOMM_HOST_ID: 2 x 2)
    ("store", 3, "created", 1, None),
    ("store", 3, "mapped", 2, None),
    ("store", 3, "arena", 1, None),
]


@pytest.mark.parametrize("launcher,n,moment,stopped,per_host", slow_except([MOMENTS[0], MOMENTS[5]], MOMENTS),
                         ids=[f"{m[0]}-{m[2]}" + ("-hierarchical" if m[4] else "") for m in MOMENTS])
def test_sigkill_of_every_rank_during_the_hand_shake_leaves_nothing(launcher, n, moment, stopped, per_host,
                                                                       tmp_path):
    env = {"SHM_KILL_PER_HOST": str(per_host)} if per_host else {}
    job = Job(launcher, n, moment, tmp_path, env)
    try:
        job.wait_for(stopped)
        for pid, (dev, ino, _) in zip(job.paused_pids, job.paused):  # what each stopped rank maps: that file
            with open(f"/proc/{pid}/maps") as f:
                assert any(line.split()[4] == str(ino) for line in f), f"rank process {pid} maps no inode {ino}"
        files = on_dev_shm()
        named = [files[(dev, ino)] for dev, ino, _ in job.paused if (dev, ino) in files]
        assert not named, f"the segment has a name while the ranks live: {named}"
    finally:
        job.kill()
    left = job.ours()
    print(f"\n{launcher} {moment}: {len(job.paused)} rank(s) stopped with the segment, all {n} killed, "
          f"{len(left)} file(s) of theirs left in /dev/shm")
    assert not left, f"left in /dev/shm: {sorted(left.values())}"


@needs_unshare
def test_a_named_segment_left_by_a_kill_goes_with_the_next_hand_shake(tmp_path):
    # Rank 1 runs in a pid namespace of its own: it cannot open rank 0's
    # file through /proc, so rank 0 names it. Every rank is killed while
    # the name exists (rank 1 about to open it): the name stays, and the
    # next hand-shake on this host (another job) removes it, its creator
    # being gone (its flock is free).
    job = Job("store", 2, "named", tmp_path, {"UCX_TLS": "tcp,self"}, unshared={1})
    try:
        job.wait_for(1)
        (dev, ino, name), = job.paused
        assert name.startswith("/ringcomm-") and name.endswith(".flock"), name
    finally:
        job.kill()
    assert on_dev_shm().get((dev, ino)) == name[1:], "the kill left no name: the moment was missed"
    sweep_by_a_later_job(tmp_path)
    left = job.ours()
    assert not left, f"left in /dev/shm after the next hand-shake: {sorted(left.values())}"


@needs_unshare
def test_ranks_in_other_pid_namespaces_share_the_window_by_name_and_leave_nothing(tmp_path):
    # The named way end to end: every rank but 0 in a pid namespace of its
    # own (as containers sharing /dev/shm but not their pids): the window and
    # the arena are made, the collective runs in the window, nothing stays.
    job = Job("store", 3, "once", tmp_path, {"UCX_TLS": "tcp,self", "SHM_KILL_REPORT": "1"}, unshared={1, 2})
    job.close()
    text = "".join(job._rest())
    assert all(p.returncode == 0 for p in job.procs), text[-4000:]
    ran = [line for line in text.splitlines() if line.startswith("RAN")]
    assert len(ran) == 3 and all(line.split()[2] in ("shm", "shm_flat") for line in ran), text[-4000:]
    assert not job.ours(), sorted(job.ours().values())


def test_the_sweep_removes_only_named_segments_whose_creator_is_gone(tmp_path):
    # What a sweep may remove: this user's "ringcomm-*.flock" files whose
    # lock no one holds. A live creator's (locked), a name of another form
    # (an older ringcomm's, never locked) and another user's stay.
    from ringcomm import shm
    core = shm.core
    tag = f"sweeptest{os.getpid()}x{random.randrange(1 << 30)}"
    live = core.ShmFile.create(4096, 0)
    dead = core.ShmFile.create(4096, 0)
    names = {"live": f"/ringcomm-{tag}-live.flock", "dead": f"/ringcomm-{tag}-dead.flock",
             "old": f"/ringcomm-{tag}-old", "other": f"/ringcomm-{tag}-other.flock"}
    try:
        live.link(names["live"])
        dead.link(names["dead"])
        dead.close()  # its creator is gone: its lock with it
        with open("/dev/shm" + names["old"], "wb") as f:
            f.write(b"\0" * 4096)
        other_user = os.geteuid() == 0
        if other_user:  # (a file of another user: only root can make one here)
            with open("/dev/shm" + names["other"], "wb") as f:
                f.write(b"\0" * 4096)
            os.chown("/dev/shm" + names["other"], 65534, 65534)
        # The sweep of another process (the next job's rank 0)
        res = subprocess.run([sys.executable, "-c", "from ringcomm import shm; print(shm.core.shm_sweep())"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        there = {k: os.path.exists("/dev/shm" + v) for k, v in names.items()}
        assert names["dead"] in res.stdout and not there["dead"], (res.stdout, there)
        assert there["live"] and there["old"] and (there["other"] or not other_user), there
        assert not any(names[k] in res.stdout for k in ("live", "old", "other")), res.stdout
    finally:
        live.close()
        for name in names.values():
            try:
                os.unlink("/dev/shm" + name)
            except FileNotFoundError:
                pass


RANDOM_KILLS = 6


@pytest.mark.parametrize("launcher", ["mpirun", "store"])
@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_nothing(launcher, tmp_path):
    # The ranks loop over init, a collective, the arena and close; every
    # rank is killed at a random time in that loop. Nothing of theirs may
    # stay, whatever it was doing.
    rng = random.Random(50)
    lefts = []
    for _ in range(RANDOM_KILLS):
        job = Job(launcher, 3, "loop", tmp_path)
        try:
            job.wait_for(0)
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            job.kill()
        lefts += job.ours().values()
    print(f"\n{launcher}: {RANDOM_KILLS} kills at random moments, {len(lefts)} file(s) left")
    assert not lefts, f"left in /dev/shm: {sorted(lefts)}"


@needs_unshare
@pytest.mark.slow
def test_sigkill_at_random_moments_in_other_pid_namespaces_leaves_nothing_after_the_next_hand_shake(tmp_path):
    # The same over the named way (rank 1 in a pid namespace of its own):
    # a kill may leave a name; the next hand-shake on the host removes it.
    rng = random.Random(51)
    jobs = []
    for _ in range(RANDOM_KILLS):
        job = Job("store", 2, "loop", tmp_path, {"UCX_TLS": "tcp,self"}, unshared={1})
        jobs.append(job)
        try:
            job.wait_for(0)
            time.sleep(rng.uniform(0.0, 0.8))
        finally:
            job.kill()
    before = sorted(name for job in jobs for name in job.ours().values())
    sweep_by_a_later_job(tmp_path)
    left = sorted(name for job in jobs for name in job.ours().values())
    print(f"\nnamed way: {RANDOM_KILLS} kills at random moments, {len(before)} name(s) left by them, "
          f"{len(left)} after the next hand-shake")
    assert not left, f"left in /dev/shm: {left}"


TERM_JOB = """
import os, sys, time, torch.distributed as dist, ringcomm, ringcomm.shm as shm
path, rank = sys.argv[1], int(sys.argv[2])
by_name = shm.segment._open_and_map  # (the hand-shake: ringcomm/shm/segment.py)
def die(path, *args):                     # rank 1 dies as it is about to open the named segment
    if not path.startswith("/dev/shm/"):
        return by_name(path, *args)       # (through /proc: fails, from another pid namespace)
    print("NAMED", path[len("/dev/shm"):], flush=True)
    time.sleep(0.5)
    os._exit(3)
shm.segment._open_and_map = die
print("STARTED", flush=True)
ringcomm.init(store=dist.FileStore(path, 2), rank=rank, size=2, timeout=20)
print("NO ERROR", flush=True)
"""


@needs_unshare
def test_sigterm_while_the_segment_has_a_name_removes_it(tmp_path):
    # torchrun's agent ends the other workers with SIGTERM once one failed.
    # Rank 0, waiting in the hand-shake with its segment named (rank 1, in a
    # pid namespace of its own, died as it was to open it), removes the
    # name at once, then ends by the signal: nothing waits for a sweep.
    procs = [subprocess.Popen((UNSHARE if r else []) + [sys.executable, "-c", TERM_JOB, str(tmp_path / "store"), str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(UCX_TLS="tcp,self"))
             for r in range(2)]
    try:
        out1, err1 = procs[1].communicate(timeout=60)
        name = [line.split()[1] for line in out1.splitlines() if line.startswith("NAMED")]
        assert name and procs[1].returncode == 3, out1 + err1
        time.sleep(1.0)  # rank 0 waits for rank 1's answer, its segment named
        assert os.path.exists("/dev/shm" + name[0])
        procs[0].send_signal(signal.SIGTERM)
        out, err = procs[0].communicate(timeout=30)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "STARTED" in out and "NO ERROR" not in out, out + err
    assert procs[0].returncode == -signal.SIGTERM, (procs[0].returncode, out + err)
    assert not os.path.exists("/dev/shm" + name[0]), name

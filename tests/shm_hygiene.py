"""Nothing left in /dev/shm (issue 25), counting only what this test
session's own processes made (a pytest plugin; tests/conftest.py loads it).

No run of ringcomm, by any launcher or none, successful or failed, may leave
a file in /dev/shm: a new ``ringcomm*``, ``sm_segment*`` or ``ucx*`` file
left at the end of the session fails it. Another job on the machine (an
unrelated ``mpirun -n 2`` beside CI once left ``sm_segment.vm.0.b3500001.0``
and ``.1``) must not fail it, so a file counts only when it is attributed to
this session's processes:

* a tracker process (``python tests/shm_hygiene.py ROOT_PID``) samples, every
  0.1 s, the processes descended from the session (pytest and everything it
  started, directly or not, orphans included once seen), and records every
  /dev/shm file they map or hold open, and how ``ringcomm/shm/``'s
  ``_segment_name`` would begin a name in each (from its environment);
* a new file is the session's when one of its processes was seen using it;
  an Open MPI ``sm_segment.<host>.<uid>.<jobid>.<rank>`` when a process of the
  session was seen using a segment of that job id; a ringcomm
  ``ringcomm-<user>_<job>-<nonce>`` when it begins as the names of a
  session process do (the job: the pid of a process without a launcher,
  ``PMIX_NAMESPACE`` under ``mpirun``, which names the ``prterun`` pid);
* any other new file (no process of the session seen with it) is another
  job's: named in a note on stderr, not a failure.

A file of the session still mapped by a live process 2 s after the end is not
counted either (a job of the session still ending). The limit of sampling: a
process of the session that lives less than 0.1 s, or is orphaned before it
is first seen, and leaves a file no process of the session was seen using
(nor of its Open MPI job id or ringcomm name prefix) goes unseen; its file is
then named in the note, not counted. The ranks of a job map their segments
for their whole run, which takes far longer. tests/test_shm_hygiene.py
runs sessions that leak and sessions beside a foreign job that leaks.
"""

import json
import os
import select
import sys
import time

LEAKS = ("ringcomm", "sm_segment", "ucx")
INTERVAL = 0.1


def shm_names() -> set:
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith(LEAKS)}
    except OSError:
        return set()


def segment_prefix(env: dict, pid: int, uid: int) -> str:
    """How ringcomm/shm/'s _segment_name begins a name in the process with
    this environment, pid and uid: "ringcomm-" + the user and the job,
    sanitised and cut as there, + "-" (then a nonce)."""
    user = next((env[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(k)), None)  # getpass.getuser()
    if user is None:
        try:
            import pwd
            user = pwd.getpwuid(uid).pw_name
        except (KeyError, OSError):
            user = str(uid)
    job = (env.get("OMPI_MCA_orte_ess_jobid") or env.get("PMIX_NAMESPACE")
           or env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or str(pid))
    safe = "".join(c if c.isalnum() else "_" for c in f"{user}-{job}")[:120]
    return f"ringcomm-{safe}-"


def sm_jobid(name: str):
    """The job id of an Open MPI segment name, sm_segment.<host>.<uid>.<jobid>.<rank>
    (the host may hold dots: parsed from the right); None for other names."""
    if not name.startswith("sm_segment."):
        return None
    parts = name.rsplit(".", 3)
    return parts[2] if len(parts) == 4 else None


def attribute(new: set, seen: dict, prefixes: set) -> tuple:
    """Split new /dev/shm names into (the session's, others'). `seen` maps
    names to the pid of a session process seen using them; `prefixes` holds
    the session processes' ringcomm name prefixes (segment_prefix)."""
    jobids = {sm_jobid(n) for n in seen} - {None}
    ours = {n for n in new if n in seen or sm_jobid(n) in jobids
            or n.startswith("ringcomm-") and any(n.startswith(p) for p in prefixes)}
    return ours, new - ours


def in_use() -> set:
    """Names in /dev/shm some live process maps now."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        used.add(line[i + 9:].split(" (deleted)")[0].strip())
        except OSError:
            pass
    return used


# ------------------------------------------------------------ the tracker process
_HAS_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")  # CONFIG_PROC_CHILDREN


def _children(pid: int) -> list:
    out = []
    if not _HAS_CHILDREN:  # every process's parent, from /proc/<pid>/stat
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/stat", "rb") as f:
                        if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                            out.append(int(p))
                except (OSError, IndexError, ValueError):
                    pass
        return out
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _start_time(pid: int):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _shm_used_by(pid: int) -> set:
    names = set()
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()
        i = data.find(b"/dev/shm/")
        while i >= 0:
            end = data.find(b"\n", i)
            names.add(data[i + 9:end if end >= 0 else None].decode(errors="replace").split(" (deleted)")[0].strip())
            i = data.find(b"/dev/shm/", i + 9)
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                names.add(target[9:].split(" (deleted)")[0])
    except OSError:
        pass
    return {n for n in names if n.startswith(LEAKS)}


def _uid(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def track(root: int, interval: float = INTERVAL) -> None:
    """Sample root's descendants until stdin closes (or says anything), then
    print what was seen as one JSON line: {"seen": {name: pid}, "prefixes":
    [...], "pids": n}."""
    me = os.getpid()
    tracked = {}  # pid -> start time: once seen, followed after it is reparented
    seen, prefixes = {}, set()

    def sample():
        stack = [root] + list(tracked)
        while stack:
            pid = stack.pop()
            if pid == me:
                continue
            st = _start_time(pid)
            if st is None:
                tracked.pop(pid, None)
                continue
            if tracked.get(pid) != st:  # new (or a reused pid: a new process)
                tracked[pid] = st
                prefixes.add(segment_prefix(_environ(pid), pid, _uid(pid)))
                stack += _children(pid)
            else:
                stack += [c for c in _children(pid) if c not in tracked]
            for name in _shm_used_by(pid):
                seen.setdefault(name, pid)

    while True:
        sample()
        ready, _, _ = select.select([sys.stdin], [], [], interval)
        if ready:
            sys.stdin.read()
            sample()
            break
    print(json.dumps({"seen": seen, "prefixes": sorted(prefixes), "pids": len(tracked)}), flush=True)


class Tracker:
    """The tracker process for the processes descended from `root`."""

    def __init__(self, root: int, interval: float = INTERVAL):
        import subprocess
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(root), str(interval)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def stop(self, timeout: float = 30) -> tuple:
        """(seen, prefixes): the names a tracked process used, and their
        ringcomm name prefixes."""
        out, _ = self.proc.communicate("", timeout=timeout)
        if self.proc.returncode != 0 or not out.strip():
            raise RuntimeError(f"the /dev/shm tracker failed (exit {self.proc.returncode})")
        report = json.loads(out.strip().splitlines()[-1])
        return report["seen"], set(report["prefixes"])


# ------------------------------------------------------------ the pytest plugin
_state = {}


def pytest_sessionstart(session):
    if os.environ.get("_PYTEST_MPI_CHILD_PROCESS"):
        return  # a rank of mpi-pytest's job: the session that launched it counts, once the job is over
    _state["at_start"] = shm_names()
    _state["tracker"] = Tracker(os.getpid())


def pytest_sessionfinish(session, exitstatus):
    tracker = _state.pop("tracker", None)
    if tracker is None:
        return
    new = shm_names() - _state["at_start"]
    if new:
        time.sleep(2)  # a file a job of ours is still ending with goes away
        new &= shm_names()
    seen, prefixes = tracker.stop()
    ours, others = attribute(new, seen, prefixes)
    ours -= in_use()
    if others:
        print(f"\nnote: {len(others)} new file(s) in /dev/shm that no process of this test session was seen "
              f"using (another job's; not counted): {sorted(others)[:10]}", file=sys.stderr)
    if ours:
        print(f"\nFAILED: the test session left {len(ours)} file(s) in /dev/shm: {sorted(ours)[:10]}",
              file=sys.stderr)
        session.exitstatus = 1


if __name__ == "__main__":
    track(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else INTERVAL)

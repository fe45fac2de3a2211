"""The session's /dev/shm check (tests/shm_hygiene.py) counts only what the
session's own processes made: a file another job leaves beside it is not
counted, a file a process of the session leaves is.

Each test runs a pytest session of its own (the plugin alone, no MPI) on a
small test file, and a "foreign" process started by this test, outside that
session's process tree. Every file made here has a name of this test's own
(a random job id) and is removed at the end.
"""

import ast
import inspect
import os
import secrets
import socket
import subprocess
import sys
import textwrap

import pytest

import shm_hygiene

TESTS = os.path.dirname(os.path.abspath(__file__))

# A process that makes /dev/shm files and exits leaving them: a name "m:..."
# it maps (for "hold" seconds, as a rank maps its segments while it runs), the
# others it only makes; "{ringcomm}" in a name is a name ringcomm/shm/'s
# _segment_name gives in this process (its user and job). With MAKER_AFTER set it
# starts once that file exists; with MAKER_DONE it makes that file as it ends.
MAKER = textwrap.dedent("""
    import mmap, os, sys, time
    hold, names = float(sys.argv[1]), sys.argv[2:]
    after, done = os.environ.get("MAKER_AFTER"), os.environ.get("MAKER_DONE")
    t0 = time.monotonic()
    while after and not os.path.exists(after):
        assert time.monotonic() - t0 < 60, "never started"
        time.sleep(0.02)
    maps = []
    for name in names:
        if "{ringcomm}" in name:
            from ringcomm.shm import _segment_name
            name = name.replace("{ringcomm}", _segment_name().lstrip("/"))
        path = "/dev/shm/" + name.removeprefix("m:")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, 4096)
        if name.startswith("m:"):
            maps.append(mmap.mmap(fd, 4096))
        os.close(fd)
    time.sleep(hold)
    for m in maps:
        m.close()
    if done:
        open(done, "w").close()
    print("made", flush=True)
""")


def maker(hold, names, **env):
    return subprocess.Popen([sys.executable, "-c", MAKER, str(hold)] + names, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, **env))


def sm_name(jobid: str, rank: int) -> str:
    return f"sm_segment.{socket.gethostname()}.{os.getuid()}.{jobid}.{rank}"


def session(tmp_path, body: str) -> subprocess.CompletedProcess:
    """A pytest session with the plugin (and nothing else of conftest.py), on
    one test whose body is `body` (MAKER and maker() at hand)."""
    (tmp_path / "test_one.py").write_text(
        "import os, subprocess, sys, time\n"
        f"MAKER = {MAKER!r}\n\n\n"
        + textwrap.dedent(inspect.getsource(maker)) + "\n\n"
        + "def test_one():\n" + textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "shm_hygiene",
                           "-p", "no:mpi-pytest", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


@pytest.fixture
def tag():
    """A tag for this test's names; every /dev/shm file holding it is removed after."""
    tag = secrets.token_hex(4)
    yield tag
    for f in os.listdir("/dev/shm"):
        if tag in f:
            os.unlink("/dev/shm/" + f)


def left(tag: str) -> list:
    return sorted(f for f in os.listdir("/dev/shm") if tag in f)


def counted(res) -> list:
    """The names the session's check counted as left behind (none: [])."""
    line = [ln for ln in res.stderr.splitlines() if "FAILED: the test session left" in ln]
    return sorted(ast.literal_eval(line[0].split(": ", 2)[2])) if line else []


def test_a_file_another_job_leaves_beside_the_session_is_not_counted(tmp_path, tag):
    # Another job (processes this session never started) runs while the
    # session does and leaves Open MPI segments of its job id, one of them
    # mapped while it ran, as the 2-rank mpirun beside CI did, and a ringcomm
    # name of a job of its own: the session passes and names them in a note.
    foreign = [sm_name("b" + tag, 0), sm_name("b" + tag, 1), "{ringcomm}-" + tag + ".flock"]
    proc = maker(0.5, ["m:" + foreign[0]] + foreign[1:], MAKER_AFTER=str(tmp_path / "started"),
                 MAKER_DONE=str(tmp_path / "foreign_done"))
    res = session(tmp_path, """
        open("started", "w").close()
        t0 = time.monotonic()
        while not os.path.exists("foreign_done"):  # the other job starts, runs, ends meanwhile
            assert time.monotonic() - t0 < 60
            time.sleep(0.02)
    """)
    assert proc.wait(timeout=60) == 0 and proc.stdout.read() == "made\n"
    made = left(tag)
    assert len(made) == 3 and set(foreign[:2]) < set(made), made  # the other job's files, there for the check
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
    assert counted(res) == [], res.stderr
    note = [ln for ln in res.stderr.splitlines() if "not counted" in ln]
    assert len(note) == 1 and all(f in note[0] for f in made), res.stderr


@pytest.mark.parametrize("kind", ["mapped", "same jobid", "ringcomm job"])
def test_a_file_a_process_of_the_session_leaves_fails_it(tmp_path, tag, kind):
    # A child of the session's test makes files and exits leaving them: a
    # segment it mapped (seen in use); beside it an Open MPI segment it never
    # mapped, of the job id of one it did; a ringcomm name it never opened
    # (as _segment_name gives it: its user and job, its pid without a launcher).
    # The session fails naming exactly
    # those, and not the file another job leaves meanwhile (another job id).
    made = {"mapped": ["m:" + sm_name("c" + tag, 0)],
            "same jobid": ["m:" + sm_name("c" + tag, 0), sm_name("c" + tag, 1)],
            "ringcomm job": ["{ringcomm}-" + tag]}[kind]
    other = sm_name("d" + tag, 0)
    proc = maker(0.5, ["m:" + other], MAKER_AFTER=str(tmp_path / "started"))
    res = session(tmp_path, f"""
        open("started", "w").close()
        p = maker(0.5, {made!r})
        assert p.wait(timeout=60) == 0 and p.stdout.read() == "made\\n"
    """)
    assert proc.wait(timeout=60) == 0
    ours = sorted(f for f in left(tag) if f != other)
    assert len(ours) == len(made) and other in left(tag), left(tag)
    assert res.returncode == 1 and "1 passed" in res.stdout, res.stdout + res.stderr
    assert counted(res) == ours, res.stderr
    note = [ln for ln in res.stderr.splitlines() if "not counted" in ln]
    assert len(note) == 1 and other in note[0], res.stderr


def test_attribution_rules():
    # The rules alone: seen in use; an Open MPI job id seen in use (host names
    # may hold dots); a ringcomm name that begins as a session process's do.
    seen = {"sm_segment.a.b.host.0.c0de0001.0": 11, "ucx_shm_posix_1": 12}
    new = {"sm_segment.a.b.host.0.c0de0001.0", "sm_segment.a.b.host.0.c0de0001.1", "sm_segment.vm.0.b3500001.0",
           "ucx_shm_posix_1", "ucx_shm_posix_2", "ringcomm-root_prterun_vm_123_1-0a1b2c3d4e5f.flock",
           "ringcomm-root_prterun_vm_1234_1-0a1b2c3d4e5f.flock", "ringcomm-root_77-0a1b2c3d4e5f-arena.flock",
           "ringcomm-root_777-0a1b2c3d4e5f.flock"}
    ours, others = shm_hygiene.attribute(new, seen, {"ringcomm-root_prterun_vm_123_1-", "ringcomm-root_77-"})
    assert sorted(ours) == ["ringcomm-root_77-0a1b2c3d4e5f-arena.flock",
                            "ringcomm-root_prterun_vm_123_1-0a1b2c3d4e5f.flock",
                            "sm_segment.a.b.host.0.c0de0001.0", "sm_segment.a.b.host.0.c0de0001.1",
                            "ucx_shm_posix_1"], sorted(ours)
    assert sorted(others) == ["ringcomm-root_777-0a1b2c3d4e5f.flock",
                              "ringcomm-root_prterun_vm_1234_1-0a1b2c3d4e5f.flock", "sm_segment.vm.0.b3500001.0",
                              "ucx_shm_posix_2"], sorted(others)
    assert shm_hygiene.sm_jobid("sm_segment.a.b.host.0.c0de0001.1") == "c0de0001"
    assert shm_hygiene.sm_jobid("ringcomm-x") is None


def test_the_prefix_is_the_one_ringcomm_names_segments_with(monkeypatch):
    # shm_hygiene.segment_prefix must stay how ringcomm/shm/'s
    # _segment_name begins a name, else a leaked named segment would go
    # uncounted: this process's names under no launcher, mpirun, torchrun.
    from ringcomm import shm
    for env in ({}, {"PMIX_NAMESPACE": "prterun-vm-4242@1"}, {"TORCHELASTIC_RUN_ID": "run.7"}):
        for k in ("OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        name = shm._segment_name().lstrip("/")
        prefix = shm_hygiene.segment_prefix(dict(os.environ), os.getpid(), os.getuid())
        assert name.startswith(prefix) and len(name) == len(prefix) + 12, (env, name, prefix)

"""A process no launcher started (python script.py) is an Open MPI singleton:
init() starts MPI with btl=self (no /dev/shm file left behind), says once on
stderr that it runs one rank, and keeps quiet when one rank was asked for."""

import os
import subprocess
import sys

from ringcomm import _singleton

# Prints the Open MPI shared-memory segments the process maps after init()
# (in /dev/shm unless btl_sm_backing_directory says otherwise; mapped by the
# process that creates them), and what is left of OMPI_MCA_btl in its environment.
CHILD = r"""
import json, os, ringcomm
comm = ringcomm.init()
import numpy as np
x = np.arange(4.0); comm.all_reduce(x)
maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if '/sm_segment.' in l})
print(json.dumps({"size": comm.size, "shm": maps, "btl": os.environ.get("OMPI_MCA_btl"), "x": x.tolist()}))
"""


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in _singleton.LAUNCHER_VARS and k != "OMPI_MCA_btl"
           and k != "RINGCOMM_SINGLETON_OK" and not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))}
    env.update(extra)
    return env


def run_child(env, cmd=None):
    import json
    cmd = cmd or [sys.executable, "-c", CHILD]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads([l for l in res.stdout.splitlines() if l.startswith("{")][0]), res.stderr


def test_singleton_leaves_nothing_in_dev_shm_and_says_it_is_one_rank():
    d, err = run_child(clean_env())
    assert d["size"] == 1 and d["x"] == [0.0, 1.0, 2.0, 3.0]
    assert d["shm"] == [], f"the singleton mapped {d['shm']}: Open MPI leaves those files behind"
    assert d["btl"] is None  # set only while MPI started: children of this process never inherit it
    assert err.count(_singleton.NOTICE) == 1, err


def test_without_btl_self_the_singleton_would_leave_its_segment(tmp_path):
    # The control: the user's own btl choice is kept, and with the shared-memory
    # btl a singleton maps a /dev/shm segment that outlives it (the bug worked around).
    d, _ = run_child(clean_env(OMPI_MCA_btl="self,sm"))
    assert d["btl"] == "self,sm"
    leaked = [p for p in d["shm"] if os.path.exists(p)]
    print(f"\nwith btl=self,sm the singleton mapped {d['shm']}; still there after it exited: {leaked}")
    assert d["shm"] and leaked == d["shm"]
    for p in leaked:  # ours: remove it
        os.unlink(p)


def test_asked_for_one_rank_no_notice():
    _, err = run_child(clean_env(RINGCOMM_SINGLETON_OK="1"))
    assert _singleton.NOTICE not in err
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", "1", "--", sys.executable, "-c", CHILD]
    d, err = run_child(clean_env(), cmd)
    assert d["size"] == 1 and d["shm"] == [] or all(not os.path.exists(p) for p in d["shm"])
    assert _singleton.NOTICE not in err


def test_mpirun_ranks_leave_nothing_in_dev_shm():
    # a real 2-rank job maps Open MPI's shared segment, and Open MPI unlinks it
    cmd = [sys.executable, "-m", "ringcomm.cli", "run", "-n", "2", "--", sys.executable, "-c", CHILD]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=clean_env(), cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
    import json
    maps = [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]
    assert [m["size"] for m in maps] == [2, 2] and all(m["x"] == [0.0, 2.0, 4.0, 6.0] for m in maps)
    assert _singleton.NOTICE not in res.stderr
    left = [p for m in maps for p in m["shm"] if os.path.exists(p)]
    assert left == [], left


def test_the_pytest_process_itself_maps_no_segment():
    # conftest.py started this process's MPI (mpi-pytest needs it) through ringcomm's door
    from mpi4py import MPI
    assert MPI.Is_initialized()
    maps = {l.split()[-1] for l in open("/proc/self/maps") if "/sm_segment." in l}
    assert maps == set(), maps


def test_launcher_detection():
    assert not _singleton.launched({})
    assert _singleton.launched({"OMPI_COMM_WORLD_SIZE": "2"})
    assert _singleton.launched({"PMIX_RANK": "0"})
    assert _singleton.launched({"PMI_RANK": "0"})


# A singleton's MPI_Init may export its runtime's variables into the C
# environment: Debian's Open MPI 4.1.6 adds PMIX_NAMESPACE, OMPI_MCA_ess and
# 25 more (seen on the GPU machine), and a child `ringcomm run` then exited 1
# without a word (its mpirun took itself for part of the singleton's job).
# _singleton.mpi() takes them out again; os.environ cannot show them (Python's
# copy from startup), so the child reads the C environment and a grandchild's.
ENV_CHILD = r"""
import json, os, subprocess, sys
from ringcomm import _singleton
before = _singleton._c_environ()
os.putenv("RINGCOMM_TEST_SET_BY_A_LIBRARY", "1")  # what Open MPI 4 does (adds, changes), minus Open MPI
os.putenv("HOME", "/changed")
os.unsetenv("PATH")
_singleton._restore_c_environ(before)
restored = _singleton._c_environ() == before
_singleton.mpi()
after = _singleton._c_environ()
seen = subprocess.run(["env", "-0"], capture_output=True).stdout.split(b"\0")
keys = {kv.partition(b"=")[0].decode() for kv in seen if kv}
print(json.dumps({"restored": restored, "same_after_init": after == before,
                  "added": sorted(k.decode() for k in set(after) - set(before)),
                  "grandchild_extra": sorted(keys - {k.decode() for k in before})}))
"""


def test_mpi_init_leaves_no_variable_for_children():
    got, _ = run_child(clean_env(), [sys.executable, "-c", ENV_CHILD])
    assert got["restored"], got
    assert got["same_after_init"], got
    assert got["grandchild_extra"] == [], got

"""A rank that stops for good at one moment of a shared segment's
hand-shake, for tests/test_shm_kill.py to SIGKILL every rank there.

    shm_kill.py MOMENT [STORE RANK SIZE]

Without STORE the rank starts under MPI (``ringcomm run``), else in plain
processes through a FileStore at STORE. MOMENT:

* ``created``: the creator of every window (rank 0, or each host's first
  rank with RINGCOMM_HOST_ID), once it has made and mapped the segment and
  before any peer has it: the moment a named segment was left behind;
* ``mapped``: every other rank, once it has mapped the window (the creator
  still holds its file);
* ``arena``: the creator of the shared arena (the first comm.empty), once
  it has made and mapped it;
* ``named``: a peer told to open the segment by its name (one that could
  not through /proc: another pid namespace), just before it does;
* ``loop``: no stop: init, a collective, the arena, close, over and over,
  so that a kill at a random time lands anywhere in them;
* ``once``: one round of that, then exit (with SHM_KILL_REPORT set, each
  rank prints ``RAN <rank> <algorithm>``).

On stopping it prints ``PAUSED <pid> <dev> <ino> <name or ->``: the file it
made or mapped (device, inode), which the test looks for in /dev/shm after
the kill. Every rank prints ``PID <pid> <prefix>`` first: the start of any
name it would give a segment (``/ringcomm-<user>_<job>-``).
SHM_KILL_PER_HOST=k makes every k ranks of an MPI launch one "host"
(RINGCOMM_HOST_ID): a hierarchical job, a window per host.
"""
import os
import sys
import time

import numpy as np

import ringcomm
from ringcomm import shm

moment = sys.argv[1]
print("PID", os.getpid(), shm._segment_name().rsplit("-", 1)[0] + "-", flush=True)
if os.environ.get("SHM_KILL_PER_HOST"):
    os.environ["RINGCOMM_HOST_ID"] = "host%d" % (int(os.environ["OMPI_COMM_WORLD_RANK"])
                                                 // int(os.environ["SHM_KILL_PER_HOST"]))


def pause(f, name="-"):
    print("PAUSED", os.getpid(), f.dev, f.ino, name, flush=True)
    time.sleep(600)  # until the test kills every rank


window, arena, by_name = shm.core.shm_window, shm.core.shm_arena_map, shm.segment._open_and_map


def window_paused(f, rank, n, slot, create):
    w = window(f, rank, n, slot, create)
    if (moment == "created" and create) or (moment == "mapped" and not create):
        pause(f)
    return w


def arena_paused(w, f, per_rank):
    arena(w, f, per_rank)
    if moment == "arena" and w.rank == 0:
        pause(f)


class Described:  # what the peer was told: the file is that inode
    def __init__(self, where):
        self.dev, self.ino = where[2], where[3]


def by_name_paused(path, where, nbytes, rank, map_it):
    if moment == "named" and path.startswith("/dev/shm/"):
        pause(Described(where), path[len("/dev/shm"):])
    return by_name(path, where, nbytes, rank, map_it)


shm.core.shm_window, shm.core.shm_arena_map, shm.segment._open_and_map = window_paused, arena_paused, by_name_paused


if len(sys.argv) > 2:
    import torch.distributed as dist
    rank, size = int(sys.argv[3]), int(sys.argv[4])
    store = dist.FileStore(sys.argv[2], size)  # one for all the communicators (each its own keys)


def init():
    if len(sys.argv) > 2:
        return ringcomm.init(store=store, rank=rank, size=size, timeout=30)
    return ringcomm.init(timeout=30)


while True:
    comm = init()
    comm.all_reduce(np.ones(1024, np.float32))
    if os.environ.get("SHM_KILL_REPORT"):
        print("RAN", comm.rank, comm.last_algorithm, flush=True)
    comm.empty(1024)  # the arena
    comm.close()
    if moment == "once":
        break
    if moment != "loop":
        print("NOT PAUSED", comm.rank, flush=True)  # (a moment that never came: the test fails)
        break

"""The transport table (ringcomm/transports.py) and the policy table
(ringcomm/policy.py): which row init() runs, what each row says it can do,
and where each threshold of auto comes from (its variable, tune, its
default). No launch: these read the tables and the environment only."""

import ast
import json
import os

import pytest

from ringcomm import policy, shm, transports
from ringcomm.errors import InvalidArgument

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("bootstrap, device, transport, label", [
    ("mpi", None, None, "mpi"), ("mpi", None, "auto", "mpi"), ("mpi", None, "shm", "mpi"),
    ("mpi", None, "ucx", "ucx"),  # UCX moves every message; MPI only swaps the addresses
    ("store", None, None, "ucx"), ("store", None, "shm", "ucx"),
    ("mpi", "cuda", None, "nccl"), ("store", 0, None, "nccl"),
    ("store", "emulated-nccl", None, "ucx(emulated-nccl)"),
])
def test_choose_picks_the_row_init_runs(bootstrap, device, transport, label, monkeypatch):
    monkeypatch.delenv("RINGCOMM_TRANSPORT", raising=False)
    row = transports.choose(bootstrap, device, transport)
    assert row.label == label
    assert bootstrap in row.make, f"{label} has no engine under a {bootstrap} launch"


def test_the_environment_chooses_when_init_does_not(monkeypatch):
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "UCX ")
    assert transports.mode() == "ucx" and transports.choose("mpi", None, None).label == "ucx"
    assert transports.mode("mpi") == "mpi"  # the argument wins
    monkeypatch.setenv("RINGCOMM_TRANSPORT", "tcp")
    with pytest.raises(InvalidArgument, match=r"RINGCOMM_TRANSPORT must be one of auto, mpi, shm, ucx, got 'tcp'"):
        transports.mode()
    assert shm.mode is transports.mode and shm.MODES == transports.MODES  # (ringcomm.shm's names, as before)


def test_rows_say_what_they_can_do():
    for name, row in transports.TRANSPORTS.items():
        assert row.memory in ("host", "device"), name
        assert set(row.make) <= {"mpi", "store", "local"} and row.make, name
        assert not row.arena or row.window, f"{name}: an arena lives in a window"
        assert not row.window or row.memory == "host", f"{name}: the window is host memory"
        assert row.costs in ("mpi", "ucx", "nccl") or row.costs.startswith("inproc"), name
        assert ("local" in row.make) == row.label.startswith("inproc"), name


def test_world_assembles_communicators_through_the_constructor_only():
    # No module but comm.py sets a Communicator's private attributes (world.py
    # used to set _arena_maker and _bootstrap from outside).
    tree = ast.parse(open(os.path.join(ROOT, "ringcomm", "world.py")).read())
    wrong = [ast.unparse(t) for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Attribute) and t.attr.startswith("_")]
    assert not wrong, wrong


def test_every_quantity_has_one_default_and_its_variable_is_documented():
    readme = open(os.path.join(ROOT, "README.md")).read()
    for name, q in policy.POLICY.items():
        assert q.name == name and q.what, name
        if q.env:
            assert q.env.startswith("RINGCOMM_") and f"`{q.env}`" in readme, q.env
    # ringcomm.shm's old names are the table's values, not copies
    assert shm.SHM_MAX is policy.POLICY["max"].default and shm.SHM_FROM is policy.POLICY["from"].default
    assert shm.DEFAULT_SINGLE_COPY_MIN == policy.POLICY["single_copy_min"].default
    from ringcomm.tuning import selection
    assert selection.MARGIN == policy.POLICY["margin"].default
    assert selection.REDUCE_TREE_MAX == policy.POLICY["reduce_tree_max"].default


def test_a_value_comes_from_the_variable_then_tune_then_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for var in ("RINGCOMM_SHM_FLAT_MAX", "RINGCOMM_SHM_SINGLE_COPY", "RINGCOMM_SHM_MAX", "RINGCOMM_TRANSPORT"):
        monkeypatch.delenv(var, raising=False)
    assert policy.flat_max(2) == policy.POLICY["flat_max"].default  # nothing tuned
    assert policy.single_copy_min(2) == policy.POLICY["single_copy_min"].default
    (tmp_path / "ringcomm").mkdir()
    (tmp_path / "ringcomm" / "tune.json").write_text(json.dumps(
        {"shm": {"limits": {"2": {"all_reduce": 4096, "flat_max": 8192, "single_copy_min": 1 << 20}}}}))
    assert policy.flat_max(2) == 8192 and policy.single_copy_min(2) == 1 << 20
    assert policy.shm_max(2)[policy.COLLECTIVES.index("all_reduce")] == 4096
    assert policy.flat_max(3) == policy.POLICY["flat_max"].default  # tuned on 2 ranks only
    monkeypatch.setenv("RINGCOMM_SHM_FLAT_MAX", "1024")
    monkeypatch.setenv("RINGCOMM_SHM_SINGLE_COPY", "off")
    assert policy.flat_max(2) == 1024 and policy.single_copy_min(2) == policy.UNLIMITED
    monkeypatch.setenv("RINGCOMM_SHM_SLOT", "100")
    with pytest.raises(InvalidArgument, match="RINGCOMM_SHM_SLOT must be at least 4096 bytes, got 100"):
        policy.slot_bytes()


@pytest.mark.parametrize("device, label", [(None, "inproc"), ("emulated", "inproc(emulated)"),
                                           ("emulated-nccl", "inproc(emulated-nccl)"), ("cuda", "inproc(cuda)"),
                                           ([0, 0, 0], "inproc(cuda)")])
def test_choose_local_picks_run_locals_row(device, label):
    row = transports.choose_local(device, 3)
    assert row.label == label and "local" in row.make
    assert row.window == (device is None)  # the in-process window: plain memory, host arrays only


@pytest.mark.parametrize("device", ["cuda:1", [0, 1], "gpu"])
def test_choose_local_refuses_other_devices_as_run_local_did(device):
    with pytest.raises(InvalidArgument, match=r"device must be None, 'emulated', 'cuda' or a list of 3 GPU ordinals"):
        transports.choose_local(device, 3)

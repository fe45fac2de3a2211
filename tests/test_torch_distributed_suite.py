"""PyTorch's own torch.distributed tests over the "ringcomm" backend: the
collective and point-to-point part of
torch.testing._internal.distributed.distributed_test.DistributedTest
(tests/scripts/torch_distributed_suite.py: every all_reduce, reduce,
broadcast, all_gather, all_gather_coalesced, gather, scatter, all_to_all,
barrier, object-collective and send/recv/isend/irecv test, and the
process-group basics), at world size 2, ranks started by torch's own
multiprocess harness from a FileStore (no MPI launcher), and the same
selection over gloo as the control.

Nothing may fail. A test may skip only for a reason listed in SKIPS (torch
gates it to another backend by name, it needs CUDA, it needs more ranks, or
torch itself disables it); any other skip fails this test, since a skip
from inside the ranks could hide an error.

The ranks are forked from the harness's process (torch's
MultiProcessTestCase._start_processes with a fork context), which has
imported torch and the suite already: about 30 s per backend here. torch's
own test_distributed_spawn.py spawns them (a fresh interpreter per rank and
test, about 4.5 s a test on 2 cores, some 6 minutes per backend):
RINGCOMM_TORCH_SPAWN=1 also runs that form.

    pytest tests/test_torch_distributed_suite.py -s     # prints the table
"""

import collections
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal imports it (the "test" extra installs it)

from store_launch import clean_env  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torch_distributed_suite.py")
WORLD_SIZE = 2

# Why a test of the selection may skip, by torch's own skip message. Each
# group says why that is legitimate here.
SKIPS = {
    "gated by torch to other backends by name": [
        r"Test requires backend \w+ to be one of \{.*\}",  # require_backend_is_available({...})
        r"Only (Nccl|NCCL|MPI|Gloo|gloo|Gloo and N[Cc][Cc][Ll]) (backends? )?(supports?|will have) .*",
        r"(NCCL|GLOO) (Batch )?Send Recv (Only|CPU)",
        r"Coalescing manager currently tests with NCCL only.*",
    ],
    "needs CUDA (this backend is registered for CPU tensors)": [
        r"CUDA is not available\.", r"Need at least \d+ CUDA devices?",
    ],
    "needs more ranks (torch's skip_if_small_worldsize wants 8 outside MPI)": [
        r"Skipped due to small world size\.", r"Test requires an exact world size of \d+",
    ],
    "disabled by torch itself (an open torch issue)": [
        r"https://github\.com/pytorch/pytorch/(issues|pull)/\d+", r"Test is failing, see https://\S+",
    ],
}


def skip_group(reason: str):
    for group, patterns in SKIPS.items():
        if any(re.fullmatch(p, reason) for p in patterns):
            return group
    return None


def run_suite(backend: str, tmp_path, start: str = "fork") -> dict:
    out = tmp_path / f"{backend}-{start}.json"
    temp_dir = tmp_path / f"{backend}-temp"
    for sub in ("barrier", "test_dir"):
        (temp_dir / sub).mkdir(parents=True, exist_ok=True)
    # RINGCOMM_DIST_FEATURES: torch gates the object collectives on its
    # feature table (DistTestCases.backend_feature["gpu"], which gloo is in
    # too), not on a backend's name: ringcomm joins it.
    # INIT_METHOD: a file, as torch's run_test.py passes it (test_barrier_timeout_global
    # starts its group again from it; the other tests rendezvous through
    # TestDistBackend.init_method, a file too).
    env = clean_env(BACKEND=backend, WORLD_SIZE=WORLD_SIZE, TEMP_DIR=temp_dir,
                    INIT_METHOD=f"file://{temp_dir}/shared_init_file",
                    RINGCOMM_DIST_START=start,
                    RINGCOMM_DIST_FEATURES="gpu" if backend == "ringcomm" else "",
                    DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=120, PYTORCH_PRINT_REPRO_ON_FAILURE=0)
    res = subprocess.run([sys.executable, SCRIPT, "--json", str(out)], capture_output=True, text=True,
                         env=env, timeout=1500 if start == "spawn" else 600)
    assert out.exists(), f"the suite did not finish (rc {res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return json.loads(out.read_text())


def check(result: dict) -> list:
    """The problems in one run: failures (with their rank's traceback) and
    skips for no listed reason."""
    problems = []
    for name, t in sorted(result["tests"].items()):
        if t["outcome"] in ("failed", "error"):
            problems.append(f"{result['backend']}: {name} {t['outcome'].upper()}:\n{t['text'][-2500:]}")
        elif t["outcome"] == "skipped" and skip_group(t["text"]) is None:
            problems.append(f"{result['backend']}: {name} skipped for an unlisted reason: {t['text']!r}")
    return problems


def table(results: list) -> str:
    """passed / skipped (by group) / failed per backend, and wall time."""
    lines = [f"DistributedTest selection, world size {WORLD_SIZE}:"]
    for r in results:
        c = collections.Counter(t["outcome"] for t in r["tests"].values())
        lines.append(f"  {r['backend']:<9} {r['start']:<5} {len(r['tests'])} tests: {c['passed']} passed, "
                     f"{c['skipped']} skipped, {c['failed'] + c['error']} failed, {r['secs']:.1f} s")
        groups = collections.Counter(skip_group(t["text"]) or f"UNLISTED: {t['text']}"
                                     for t in r["tests"].values() if t["outcome"] == "skipped")
        lines += [f"      skipped {k:>3}: {g}" for g, k in groups.most_common()]
    if len(results) == 2:
        a, b = results
        only = sorted(n for n in a["tests"] if a["tests"][n]["outcome"] != b["tests"][n]["outcome"])
        lines.append(f"  outcome differs ({a['backend']} / {b['backend']}): " +
                     (", ".join(f"{n} ({a['tests'][n]['outcome']} / {b['tests'][n]['outcome']})" for n in only)
                      or "none"))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    return run_suite("gloo", tmp_path_factory.mktemp("gloo"))


@pytest.mark.slow
def test_distributed_test_selection_over_ringcomm(tmp_path, gloo_run):
    rc = run_suite("ringcomm", tmp_path)
    print("\n" + table([rc, gloo_run]))
    assert not check(rc), "\n\n".join(check(rc))
    # issue 50: torch's all_gather_coalesced layout (one output list per rank)
    for name in ("test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
                 "test_all_gather_coalesced_full_group", "test_all_gather_coalesced_with_empty"):
        assert rc["tests"][name]["outcome"] == "passed", (name, rc["tests"][name])


@pytest.mark.slow
def test_distributed_test_selection_over_gloo(gloo_run):
    """The control: torch's own CPU backend through the same harness."""
    assert not check(gloo_run), "\n\n".join(check(gloo_run))
    assert sum(t["outcome"] == "passed" for t in gloo_run["tests"].values()) > 50


def test_skip_reasons_are_recognised():
    assert skip_group("Test requires backend ringcomm to be one of {'gloo'}")
    assert skip_group("Only MPI supports CPU all_to_all_single")
    assert skip_group("Only Gloo and NCCL backends will have CUDA allReduce tested")
    assert skip_group("Skipped due to small world size.")
    assert skip_group("Need at least 2 CUDA devices")
    # torch's "skipped inside a rank" exit code and an unavailable backend are no reason
    assert skip_group("Test skipped at subprocess level, look at subprocess log for skip reason") is None
    assert skip_group("Skipped because distributed backend is not available.") is None


@pytest.mark.skipif(not os.environ.get("RINGCOMM_TORCH_SPAWN"),
                    reason="torch's spawn start (some 6 minutes per backend on 2 cores): RINGCOMM_TORCH_SPAWN=1")
@pytest.mark.timeout(3600)
@pytest.mark.slow
def test_distributed_test_selection_spawned(tmp_path):
    results = [run_suite(b, tmp_path, start="spawn") for b in ("ringcomm", "gloo")]
    print("\n" + table(results))
    problems = check(results[0]) + check(results[1])
    assert not problems, "\n\n".join(problems)

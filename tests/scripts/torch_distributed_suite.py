"""PyTorch's own torch.distributed tests
(torch.testing._internal.distributed.distributed_test.DistributedTest) over
the backend named by BACKEND, the ranks started by torch's multiprocess
harness the way torch's test/distributed/test_distributed_spawn.py starts
them: TestDistBackend + DistributedTest._DistTestBase, one test at a time,
WORLD_SIZE processes per test, each calling
``init_process_group(BACKEND, init_method="file://...")``. No MPI launcher:
the "ringcomm" backend bootstraps from the FileStore torch hands it.

Environment (torch's names; torch's module reads them when it is imported):
BACKEND ("ringcomm", "gloo", ...), WORLD_SIZE (default 2), TEMP_DIR (made
here when missing; torch's setUp makes a fresh one per test), INIT_METHOD
(a file:// path, as torch's run_test.py passes it: gloo's
test_barrier_timeout_global starts its group again from it; every other
test rendezvouses through a file of torch's own). RINGCOMM_DIST_START: "spawn"
(default, torch's) or "fork" (--start). RINGCOMM_DIST_FEATURES: see below.

    BACKEND=ringcomm python tests/scripts/torch_distributed_suite.py [--start spawn|fork]
        [--json FILE] [--list] [NAME ...]

NAME: test names (test_all_gather) or fnmatch patterns (test_all_gather*);
none: the whole selection (SELECTION below). Prints torch's unittest output,
then one line "RESULT {json}": every test's outcome ("passed", "skipped",
"failed", "error"), skip reason, seconds, and the failure's text.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import tempfile
import time
import unittest

os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="ringcomm-dist-")  # (torch's setUp replaces it per test)
    for sub in ("barrier", "test_dir"):
        os.makedirs(os.path.join(os.environ["TEMP_DIR"], sub), exist_ok=True)
if "BACKEND" not in os.environ:
    raise SystemExit("set BACKEND (ringcomm, gloo) and WORLD_SIZE (default 2)")

import torch  # noqa: E402

import ringcomm.torch  # noqa: E402,F401 - registers the backend "ringcomm" (also in every spawned rank)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# RINGCOMM_DIST_FEATURES="gpu,subgroup": BACKEND joins these sets of torch's
# feature table (DistTestCases.backend_feature: where torch's gates look for
# a backend by feature rather than by name, and where a backend of its own
# is meant to declare itself) before the tests are defined. The object
# collectives' tests (all_gather_object, gather_object, ...) are gated on
# "gpu", a set gloo is in; on CPU their GPU-only cousins still skip.
for _feature in filter(None, os.environ.get("RINGCOMM_DIST_FEATURES", "").split(",")):
    DistTestCases.backend_feature[_feature].add(os.environ["BACKEND"])
    DistTestCases.backend_feature["plugin"].add(os.environ["BACKEND"])

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

torch.backends.cuda.matmul.allow_tf32 = False

# The collective and point-to-point part of DistributedTest, by name: every
# test of an op (sync, async, group, full group, complex, profiler variants,
# the object collectives), barriers, and the process-group basics the others
# stand on. torch's own decorators still decide what runs on a backend:
# tests gated to another backend by name (BACKEND != "nccl", "Only MPI
# supports ...", require_backend_is_available({"gloo"})), to CUDA, or to a
# world size of 8 or more skip themselves, each with its reason.
SELECTION = (
    "test_get_rank*", "test_get_backend", "test_Backend_enum_class", "test_destroy_*group",
    "test_send_recv*", "test_isend*", "test_irecv*", "test_batch_isend_irecv*",
    "test_broadcast*", "test_reduce_*", "test_all_reduce*", "test_sparse_all_reduce*",
    "test_scatter*", "test_gather*", "test_all_gather*", "test_all_to_all*",
    "test_barrier*", "test_monitored_barrier*", "test_coalescing_manager*", "test_nccl_backend_bool_*",
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """What test_distributed_spawn.py defines (there for gloo, nccl and ucc
    only), with the start method chosen by RINGCOMM_DIST_START: "spawn"
    (torch's) or "fork" (the parent has imported torch already, so each
    rank starts in a fraction of the time)."""

    def setUp(self):
        super().setUp()
        if os.environ.get("RINGCOMM_DIST_START", "spawn") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def all_tests() -> list[str]:
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))


def select(patterns) -> list[str]:
    names = all_tests()
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    missing = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if missing:
        raise SystemExit(f"no DistributedTest test matches {missing}")
    return chosen


class _Result(unittest.TextTestResult):
    """unittest's result, with every test's outcome and time recorded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict = {}
        self._t0 = 0.0

    def startTest(self, test):  # noqa: N802 - unittest's name
        self._t0 = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, text=""):
        name = test.id().split(".")[-1]
        self.outcomes[name] = {"outcome": outcome, "secs": round(time.monotonic() - self._t0, 2),
                               "text": text[-4000:]}

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason))

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._record(test, "failed", "expected failure (the suite itself marks it): " +
                     self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._record(test, "passed")


def main(argv) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="test names or fnmatch patterns (default: the selection)")
    ap.add_argument("--start", choices=("spawn", "fork"), default=os.environ.get("RINGCOMM_DIST_START", "spawn"))
    ap.add_argument("--json", help="also write the RESULT dict to this file")
    ap.add_argument("--list", action="store_true", help="print the selected names and exit")
    args = ap.parse_args(argv)
    os.environ["RINGCOMM_DIST_START"] = args.start
    names = select(args.names or SELECTION)
    if args.list:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    t0 = time.monotonic()
    result = unittest.TextTestRunner(verbosity=2, resultclass=_Result, stream=sys.stdout).run(suite)
    out = {"backend": os.environ["BACKEND"], "world_size": int(os.environ["WORLD_SIZE"]), "start": args.start,
           "torch": torch.__version__, "secs": round(time.monotonic() - t0, 1), "tests": result.outcomes}
    line = json.dumps(out)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line)
    print("RESULT " + line, flush=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

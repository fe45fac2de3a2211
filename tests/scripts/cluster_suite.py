"""The shared suites on an emulated cluster (tests/test_cluster.py), in
each rank launched as torchrun launches workers (``ringcomm run --hosts``,
or torchrun itself in every host's namespace): ``ringcomm.init()``
bootstraps through the store on host 0, UCX carries what crosses hosts.

  suite   every collective and the point-to-point set (tests/scripts/ucx_suite.py's
          run_suite: results against numpy, each call's ledger against
          traffic.expected), and what the cluster must be: the ranks of one
          host in a window (the hierarchy where every host has >= 2), the
          others reached over TCP only
  big     all_reduce of 16 MiB float32, exact, then what crossed hosts by
          the ledger (for the launcher's report beside the link counters)

Prints one "RESULT {json}" line per rank: {"rank", "transport", "errors"}.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/scripts
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import numpy as np  # noqa: E402

import ringcomm  # noqa: E402
import suite  # noqa: E402
from ucx_suite import run_suite  # noqa: E402


def local_size() -> int:
    """Ranks per host, as torchrun's or mpirun's variables say."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])


def check_shape(comm) -> list[str]:
    """One window per host (the hierarchy across >= 2 hosts of >= 2 ranks), TCP to other hosts."""
    per_host = local_size()
    hosts = comm.size // per_host
    errs = []
    want_hier = hosts > 1 and per_host > 1
    if comm._engine.hierarchical != want_hier:
        errs.append(f"rank {comm.rank}: hierarchical={comm._engine.hierarchical} on {hosts} x {per_host}")
    if hosts > 1 and comm.transport.startswith("ucx") and "tcp" not in comm.transport:
        errs.append(f"rank {comm.rank}: {comm.transport}: no TCP between hosts")
    return errs


def run_big(comm) -> list[str]:
    count = 4 << 20
    x = (np.arange(count) % 1009 + 3 * comm.rank).astype(np.float32)
    comm.all_reduce(x)
    want = (comm.size * (np.arange(count) % 1009) + 3 * comm.size * (comm.size - 1) // 2).astype(np.float32)
    return suite.compare(x, want, "all_reduce 16 MiB", comm.rank)


def main():
    phase = sys.argv[1]
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    transport = ""
    try:
        comm = ringcomm.init(timeout=60)
        transport = comm.transport
        per_host = local_size()  # the launchers' blocked placement
        suite.HOSTS = [q // per_host for q in range(comm.size)]
        errs = check_shape(comm)
        errs += run_suite(comm) if phase == "suite" else run_big(comm)
        comm.close()
    except Exception as e:  # noqa: BLE001 - reported; the launcher stops the others
        errs = [f"rank {rank}: {type(e).__name__}: {e}"]
    # one write (the ranks share the launcher's stdout: lines must not interleave)
    os.write(1, ("RESULT " + json.dumps({"rank": rank, "transport": transport, "errors": errs[:50]}) + "\n").encode())
    sys.exit(1 if errs else 0)


if __name__ == "__main__":
    main()

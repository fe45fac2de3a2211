"""``ringcomm run --hosts H -n N [--link SPEC] -- program``: N ranks on an
emulated cluster of H hosts (ringcomm/cluster/netns.py), N/H per host in
blocks (ranks 0..N/H-1 on host 0, ...), launched as torchrun launches its
workers: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK`` and ``MASTER_ADDR``/``MASTER_PORT`` (host 0's address) in
each rank's environment, so ``ringcomm.init()`` and torch's ``env://``
bootstrap through a store on host 0, and the bytes between hosts go over
the emulated links. Each host is a host to ringcomm too (its own
``RINGCOMM_HOST_ID``); gloo and UCX are pointed at the host's eth0.

Or by torchrun (one agent per host, c10d rendezvous on host 0) or mpirun
(on host 0, its daemons started on the others by ringcomm/cluster/agent.py
in place of ssh): ``--launcher``.

Fail-fast, as ``ringcomm run``: when a rank (or a host's launcher) exits
with an error, the others get ``grace`` seconds to report theirs, then are
stopped; the job's status is the first failure's. Ctrl-C and SIGTERM stop every rank and remove
the cluster; a SIGKILL of the launcher leaves that to the cluster's janitor.

At the end it prints, per host, what the kernel counted on the host's link
beside what ringcomm's ledger says its ranks sent to and received from
other hosts (ringcomm/cluster/ledger.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from . import ledger
from .netns import Cluster, LinkSpec

__all__ = ["run", "rank_env", "report"]

PORT = 29500  # host 0 is a namespace of this job's own: no other job's port to meet

# An MPI launcher's variables and torchrun's belong to the job that set them,
# never to ranks started here.
_FOREIGN = ("OMPI_", "PMIX_", "PMI_", "PRTE_", "TORCHELASTIC_")
_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def placement(hosts: int, n: int) -> list[int]:
    """The host of each rank: blocks of n/hosts."""
    if hosts < 1 or n < hosts or n % hosts:
        raise SystemExit(f"ringcomm run --hosts {hosts} -n {n}: the ranks must divide evenly over the hosts "
                         f"(n a multiple of hosts, at least one rank per host)")
    per = n // hosts
    return [r // per for r in range(n)]


def rank_env(cluster: Cluster, host_of: list[int], r: int, base: dict | None = None) -> dict:
    """Rank r's environment on its host."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(_FOREIGN) and k not in _TORCH_VARS}
    h = host_of[r]
    per = host_of.count(h)
    env.update({
        "RANK": str(r), "WORLD_SIZE": str(len(host_of)), "LOCAL_RANK": str(r - host_of.index(h)),
        "LOCAL_WORLD_SIZE": str(per), "GROUP_RANK": str(h),
        "MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(PORT),
        "RINGCOMM_HOST_ID": cluster.names[h], "RINGCOMM_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
        "RINGCOMM_SINGLETON_OK": "1",
    })
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _program(argv: list[str]) -> list[str]:
    if not argv:
        raise SystemExit("ringcomm run --hosts: no program given (ringcomm run --hosts 2 -n 4 -- python train.py)")
    from ..launch import python_argv
    return python_argv(argv)


def _direct(cluster: Cluster, host_of: list[int], program: list[str], ledger_dir: str) -> list:
    """One process per rank, with torchrun's variables (fail-fast is the launcher's: _wait)."""
    procs = []
    for r in range(len(host_of)):
        env = rank_env(cluster, host_of, r)
        env[ledger.ENV] = ledger_dir
        # A process group of their own: the terminal's Ctrl-C reaches the launcher alone, which hands
        # each rank exactly one SIGINT (a second one would land in the rank's exit handlers).
        procs.append(subprocess.Popen(cluster.exec_argv(host_of[r], program), env=env, process_group=0))
    return procs


def _torchrun(cluster: Cluster, host_of: list[int], program: list[str], ledger_dir: str) -> list:
    """One torchrun agent per host, meeting by the c10d rendezvous on host 0 (as on real nodes)."""
    per = host_of.count(0)
    procs = []
    for k in range(cluster.hosts):
        env = rank_env(cluster, host_of, 0)
        for v in _TORCH_VARS:  # torchrun sets them for its workers
            env.pop(v, None)
        env.update({ledger.ENV: ledger_dir, "RINGCOMM_HOST_ID": cluster.names[k]})
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(cluster.hosts),
                "--nproc-per-node", str(per), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{cluster.hostname(0)}:{PORT}", "--rdzv-id", cluster.switch,
                *(program[1:] if program[0] == sys.executable else ["--no-python", *program])]
        procs.append(subprocess.Popen(cluster.exec_argv(k, argv), env=env, process_group=0))
    return procs


def _mpirun(cluster: Cluster, host_of: list[int], program: list[str], ledger_dir: str) -> list:
    """mpirun on host 0, its daemons started on the other hosts by ringcomm's agent
    (ringcomm/cluster/agent.py, in place of ssh); MPI's own messages over TCP on eth0."""
    from .._failfast import wrap_argv
    from ..launch import find_mpirun
    per = host_of.count(0)
    hostfile = os.path.join(ledger_dir, "hostfile")
    with open(hostfile, "w") as f:
        f.write("".join(f"{cluster.hostname(k)} slots={per}\n" for k in range(cluster.hosts)))
    env = rank_env(cluster, host_of, 0)
    for v in _TORCH_VARS + ("RINGCOMM_HOST_ID",):  # MPI's ranks are told by MPI; the hostname names the host
        env.pop(v, None)
    env.update({ledger.ENV: ledger_dir, "RINGCOMM_CLUSTER": cluster.prefix})
    cmd = [find_mpirun(), "-n", str(len(host_of)), "--hostfile", hostfile, "--bind-to", "none",
           "--prtemca", "plm_ssh_agent", f"{sys.executable} -m ringcomm.cluster.agent",
           "--prtemca", "oob_tcp_if_include", "eth0", "--mca", "pml", "ob1", "--mca", "btl", "tcp,sm,self",
           "--mca", "btl_tcp_if_include", "eth0"]
    cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd += ["--oversubscribe"] if per > (os.cpu_count() or 1) else []
    for v in (ledger.ENV, "RINGCOMM_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "PYTHONPATH", "PATH"):
        if v in env:
            cmd += ["-x", v]
    return [subprocess.Popen(cluster.exec_argv(0, cmd + wrap_argv(program)), env=env, process_group=0)]


# How ranks are started on the cluster: `ringcomm run --hosts --launcher NAME`.
LAUNCHERS = {"direct": _direct, "torchrun": _torchrun, "mpirun": _mpirun}


def run(hosts: int, n: int, link: LinkSpec, argv: list[str], *, launcher: str = "direct", grace: float = 5.0,
        quiet: bool = False, out=None) -> int:
    """Run `argv` as n ranks on `hosts` emulated hosts; returns the job's status."""
    if launcher not in LAUNCHERS:
        raise SystemExit(f"ringcomm run --hosts: --launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    host_of = placement(hosts, n)
    program = _program(argv)
    out = out or sys.stderr
    with tempfile.TemporaryDirectory(prefix="ringcomm-ledger-") as ledger_dir, Cluster(hosts, link) as cluster:
        stop = _Stopper()
        procs = []
        try:
            procs = LAUNCHERS[launcher](cluster, host_of, program, ledger_dir)
            status = _wait(procs, grace, stop)
        finally:
            _stop_all(procs)
            stop.restore()
        if not quiet:
            print(report(cluster, ledger_dir, host_of), file=out)
    return status


class _Stopper:
    """SIGINT/SIGTERM to the launcher: remembered, and handed to the ranks by _wait."""

    def __init__(self):
        self.signum = None
        self._old = {s: signal.signal(s, self._note) for s in (signal.SIGINT, signal.SIGTERM)}

    def _note(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _wait(procs: list, grace: float, stop: _Stopper) -> int:
    """Until every rank ends; the first failure (or a signal) starts the grace, then the rest are stopped."""
    first, failed_at, forwarded = 0, None, False
    while True:
        codes = [p.poll() for p in procs]
        for c in codes:
            if c not in (None, 0) and first == 0:
                first, failed_at = (128 - c if c < 0 else c), time.monotonic()
        if all(c is not None for c in codes):
            return 128 + stop.signum if stop.signum and first == 0 else first
        if stop.signum and not forwarded:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(stop.signum)
            forwarded, failed_at = True, failed_at or time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            return first or 128 + (stop.signum or signal.SIGTERM)
        time.sleep(0.05)


def _stop_all(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def report(cluster: Cluster, ledger_dir: str, host_of: list[int]) -> str:
    """Per host: the kernel's counters on its link beside the ledger's bytes to and from other hosts."""
    counters = cluster.counters()
    books, missing = ledger.collect(ledger_dir, host_of)
    lines = [f"ringcomm: {cluster.hosts} emulated hosts, link {cluster.link} "
             f"({cluster.link.bytes_per_s / 1e6:.0f} MB/s each way): what each host's link carried",
             f"{'host':<6}{'ranks':<10}{'link sent':>14}{'ledger sent':>14}{'ratio':>7}"
             f"{'link received':>16}{'ledger received':>17}{'ratio':>7}"]
    for h, (c, b) in enumerate(zip(counters, books)):
        ranks = [r for r, x in enumerate(host_of) if x == h]
        rk = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
        lines.append(f"{h:<6}{rk:<10}{c['tx_bytes']:>14,}{b['sent']:>14,}{_ratio(c['tx_bytes'], b['sent']):>7}"
                     f"{c['rx_bytes']:>16,}{b['received']:>17,}{_ratio(c['rx_bytes'], b['received']):>7}")
    lines.append("(link: the kernel's byte counters of the host's eth0, frames with their headers, and the "
                 "store's and the transport's own messages; ledger: what ringcomm booked between ranks on different "
                 "hosts)")
    if missing:
        lines.append(f"(no ledger from rank(s) {missing}: they ended before closing their communicators)")
    return "\n".join(lines)


def _ratio(link: int, book: int) -> str:
    return f"{link / book:.3f}" if book else "-"

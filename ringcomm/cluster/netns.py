"""An emulated cluster on one machine: each host a network namespace, every
host joined to one switch by its own link, each link shaped with ``tc`` (and nftables for loss).

Layout (names carry the launcher's pid, so a cluster is found and removed
by its owner, and one whose owner died is recognised as stale)::

    ringcomm-<pid>-sw        the switch: a bridge br0, and one veth end hK per host
    ringcomm-<pid>-h<k>      host k: lo, and eth0 = the other end of hK, 10.77.0.<k+1>/24;
                             hostname host<k> and /etc/netns/ringcomm-<pid>-h<k>/hosts for its programs

Nothing is made in the caller's namespace: no interface, no address, no
route; deleting the namespaces removes every link with them (and the
hosts files go with their namespace). The rate
shapes both ends of a host's link (what the host sends, and what the switch
sends it); delay and loss apply to what the host sends, so a message between
two hosts meets each once. Delay needs the kernel's netem (some kernels,
this project's CI machine's among them, are built without it: then
``--link ...,delay=`` is refused, saying so); loss is nftables' random drop.

Cleanup on every exit path: ``Cluster.close()`` (the context manager, or
atexit and SIGTERM in the launcher), and a janitor process started with the
cluster, in a session of its own, that removes it when its owner's pipe
closes: the owner's Ctrl-C, exit, crash or SIGKILL alike. ``sweep_stale()``
removes clusters whose owner is gone (a janitor killed as well).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

__all__ = ["LinkSpec", "Cluster", "why_not", "sweep_stale", "PREFIX", "SUBNET"]

PREFIX = "ringcomm-"
SUBNET = "10.77.0"  # private to the namespaces: nothing outside them sees it
_ETC = "/etc/netns"  # per-namespace files `ip netns exec` mounts over /etc (a host's /etc/hosts)
_IP = "ip"


def _run(*args: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    cmd = [_IP] + (["-n", ns] if ns else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {(p.stderr or p.stdout).strip()}")
    return p


def _tc(ns: str, *args: str) -> None:
    p = subprocess.run([_IP, "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if p.returncode:
        raise ClusterError(f"`tc {' '.join(args)}` in {ns} failed: {(p.stderr or p.stdout).strip()}")


class ClusterError(RuntimeError):
    """The emulated cluster could not be made or changed (what failed, and why)."""


_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


@dataclass(frozen=True)
class LinkSpec:
    """One host's link: rate (bits/s), one-way delay (ms), loss (%), MTU.

    MTU 9000 by default: the jumbo frames of a cluster network, where the
    ledger and the kernel's counters then agree within about 1 % (headers
    and acknowledgements); mtu=1500 shows the ordinary Ethernet overhead
    (about 6 %)."""
    rate_bit: int = 10**9
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    mtu: int = 9000

    @classmethod
    def parse(cls, text: str) -> "LinkSpec":
        """"1gbit", "100mbit,delay=1ms", "10gbit,loss=0.1%,mtu=1500"."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise ValueError("--link: empty (e.g. 1gbit, 100mbit,delay=1ms, 10gbit,loss=0.1%)")
        kw = {"rate_bit": _rate(parts[0])}
        for p in parts[1:]:
            key, _, val = p.partition("=")
            if key == "delay":
                kw["delay_ms"] = _number(val, "ms", p)
            elif key == "loss":
                kw["loss_pct"] = _number(val, "%", p)
            elif key == "mtu":
                kw["mtu"] = int(_number(val, "", p))
            else:
                raise ValueError(f"--link: unknown setting {p!r} (rate first, then delay=, loss=, mtu=)")
        spec = cls(**kw)
        if not 68 <= spec.mtu <= 65535 or spec.loss_pct < 0 or spec.loss_pct > 100 or spec.delay_ms < 0:
            raise ValueError(f"--link: out of range: {text!r}")
        return spec

    @property
    def bytes_per_s(self) -> float:
        return self.rate_bit / 8

    def __str__(self) -> str:
        s = _rate_text(self.rate_bit)
        s += f",delay={self.delay_ms:g}ms" if self.delay_ms else ""
        s += f",loss={self.loss_pct:g}%" if self.loss_pct else ""
        return s + (f",mtu={self.mtu}" if self.mtu != 9000 else "")


def _rate(text: str) -> int:
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?bit)", text.lower())
    if not m:
        raise ValueError(f"--link: the rate must read like 1gbit, 100mbit, 10gbit; got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _rate_text(bits: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits >= _UNITS[unit] and bits % _UNITS[unit] == 0:
            return f"{bits // _UNITS[unit]}{unit}"
    return f"{bits}bit"


def _number(val: str, unit: str, whole: str) -> float:
    v = val.strip().lower()
    if unit and v.endswith(unit):
        v = v[: -len(unit)]
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"--link: cannot read {whole!r}") from None


def why_not() -> str | None:
    """Why an emulated cluster cannot be made here (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if shutil.which(_IP) is None or shutil.which("tc") is None:
        return "needs iproute2's `ip` and `tc` (apt-get install iproute2)"
    if os.geteuid() != 0:
        return ("needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to make network namespaces; as a user, run it in a "
                "user namespace: `unshare --user --map-root-user --net --mount ringcomm run --hosts ...`")
    name = f"{PREFIX}{os.getpid()}-probe"
    p = _run("netns", "add", name, check=False)
    if p.returncode:
        return f"cannot make a network namespace: {(p.stderr or p.stdout).strip()}"
    _run("netns", "delete", name, check=False)
    return None


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    p = _run("-j", "netns", "list", check=False)
    try:
        return [d["name"] for d in json.loads(p.stdout or "[]")]
    except json.JSONDecodeError:
        return []


def _owned(owner: int) -> list[str]:
    return [n for n in _namespaces() if n.startswith(f"{PREFIX}{owner}-")]


def sweep_stale() -> list[str]:
    """Remove the clusters whose owner process is gone; returns their namespaces."""
    gone = []
    for name in _namespaces():
        m = re.fullmatch(rf"{re.escape(PREFIX)}(\d+)-(sw|h\d+|probe)", name)
        if m and not _owner_alive(int(m.group(1))):
            _remove([name])
            gone.append(name)
    return gone


def _remove(names: list[str]) -> None:
    """Kill what runs in the namespaces, then delete them (their links go with them)."""
    for name in names:
        pids = _run("netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for name in names:
        for _ in range(50):  # a killed process may hold the namespace a moment
            if _run("netns", "delete", name, check=False).returncode == 0 or name not in _namespaces():
                break
            time.sleep(0.1)
        shutil.rmtree(os.path.join(_ETC, name), ignore_errors=True)


def _no_ipv6(ns: str) -> None:
    """IPv6 off in a namespace: its router solicitations and neighbour discovery would add to the link counters."""
    for conf in ("all", "default"):
        subprocess.run([_IP, "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1"],
                       capture_output=True)


class Cluster:
    """`hosts` hosts on one switch, each link shaped by `link` (a LinkSpec).

    ``with Cluster(2, LinkSpec.parse("1gbit")) as c: subprocess.run(c.exec_argv(0, argv))``.
    """

    def __init__(self, hosts: int, link: LinkSpec | None = None):
        if hosts < 1:
            raise ValueError(f"an emulated cluster needs at least 1 host, got {hosts}")
        if hosts > 250:
            raise ValueError(f"at most 250 hosts on one switch, got {hosts}")
        why = why_not()
        if why:
            raise ClusterError(f"ringcomm: no emulated cluster here: {why}")
        self.hosts = hosts
        self.link = link or LinkSpec()
        self.owner = os.getpid()
        self.prefix = f"{PREFIX}{self.owner}"
        self.switch = f"{self.prefix}-sw"
        self.names = [f"{self.prefix}-h{k}" for k in range(hosts)]
        self._janitor = None
        self._closed = False
        sweep_stale()
        if _owned(self.owner):
            raise ClusterError(f"this process (pid {self.owner}) already has an emulated cluster")
        self._start_janitor()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self._base = self._read_counters()

    def address(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def hostname(self, k: int) -> str:
        return f"host{k}"

    def exec_argv(self, k: int, argv: list[str]) -> list[str]:
        """`argv` run on host k: in its network namespace, under its own hostname
        (a UTS namespace of its own), with its /etc/hosts naming every host."""
        return [_IP, "netns", "exec", self.names[k], "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostname(k), *argv]

    # ---- building and removing -------------------------------------------
    def _start_janitor(self) -> None:
        # Its own session: the terminal's Ctrl-C does not reach it, so it
        # outlives the owner exactly as long as it takes to clean up.
        self._janitor = subprocess.Popen(
            [sys.executable, "-c", "import sys; from ringcomm.cluster.netns import _janitor; _janitor(sys.argv[1:])",
             str(self.owner)], stdin=subprocess.PIPE, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _build(self) -> None:
        sw = self.switch
        # (the v4-mapped form too: torch's store, listening on both families, looks its clients up so)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(k)} {self.hostname(k)}\n"
                                                  f"::ffff:{self.address(k)} {self.hostname(k)}\n"
                                                  for k in range(self.hosts))
        for ns in self.names:  # `ip netns exec` mounts /etc/netns/NAME/hosts over /etc/hosts
            os.makedirs(os.path.join(_ETC, ns), exist_ok=True)
            with open(os.path.join(_ETC, ns, "hosts"), "w") as f:
                f.write(hosts)
        _run("netns", "add", sw)
        _no_ipv6(sw)
        _run("link", "add", "br0", "type", "bridge", ns=sw)
        _run("link", "set", "br0", "up", ns=sw)
        for k, ns in enumerate(self.names):
            _run("netns", "add", ns)
            _no_ipv6(ns)
            _run("link", "set", "lo", "up", ns=ns)
            _run("link", "add", f"h{k}", "mtu", str(self.link.mtu), "type", "veth", "peer", "name", "eth0",
                 "mtu", str(self.link.mtu), "netns", ns, ns=sw)
            _run("link", "set", f"h{k}", "master", "br0", ns=sw)
            _run("link", "set", f"h{k}", "up", ns=sw)
            _run("addr", "add", f"{self.address(k)}/24", "dev", "eth0", ns=ns)
            _run("link", "set", "eth0", "up", ns=ns)
            self._shape(k, self.link)
        # every host reaches every other before anyone is launched
        for k in range(1, self.hosts):
            self._wait_reachable(0, k)

    def _wait_reachable(self, a: int, b: int) -> None:
        deadline = time.monotonic() + 10
        while True:
            p = subprocess.run([_IP, "netns", "exec", self.names[a], "ping", "-c", "1", "-W", "1", self.address(b)],
                               capture_output=True, text=True)
            if p.returncode == 0 or shutil.which("ping") is None:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"host {a} cannot reach host {b} ({self.address(b)}): {p.stdout.strip()}")
            time.sleep(0.05)

    def _shape(self, k: int, link: LinkSpec, change: bool = False) -> None:
        """The rate on both ends of host k's link (tbf); delay where the host sends (netem, the
        tbf under it); loss on what the host sends, dropped as it reaches the switch (nftables)."""
        for ns, dev, own_end in ((self.names[k], "eth0", True), (self.switch, f"h{k}", False)):
            rate = ["tbf", "rate", f"{link.rate_bit}bit", "burst", str(max(256 * 1024, 4 * link.mtu)),
                    "latency", "100ms"]
            if change:
                subprocess.run([_IP, "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
            if own_end and link.delay_ms:
                try:
                    _tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "limit", "100000",
                        "delay", f"{link.delay_ms}ms")
                except ClusterError as e:
                    raise ClusterError(f"--link delay needs the kernel's netem queueing discipline "
                                       f"(CONFIG_NET_SCH_NETEM), which this kernel lacks: {e}") from None
                _tc(ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *rate)
            else:
                _tc(ns, "qdisc", "add", "dev", dev, "root", *rate)
        self._loss(k, link.loss_pct)

    def _loss(self, k: int, pct: float) -> None:
        """Drop pct % of what host k sends, at random, where it reaches the switch (a lossy cable:
        TCP sees the loss as on a wire, not as a local error)."""
        chain = f"loss_h{k}"
        have = self._nft(f"list chain netdev ringcomm {chain}", check=False).returncode == 0
        if not pct and not have:
            return
        if not have:
            self._nft("add table netdev ringcomm")
            self._nft(f"add chain netdev ringcomm {chain} "
                      f"{{ type filter hook ingress device \"h{k}\" priority 0 ; }}")
        self._nft(f"flush chain netdev ringcomm {chain}")
        if pct:
            self._nft(f"add rule netdev ringcomm {chain} numgen random mod 10000 < {round(pct * 100)} "
                      "counter drop")

    def dropped(self) -> int:
        """Frames the lossy links dropped since their loss was last set (nftables' counters)."""
        p = self._nft("list table netdev ringcomm", check=False)
        return sum(int(x) for x in re.findall(r"counter packets (\d+)", p.stdout)) if p.returncode == 0 else 0

    def _nft(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        if shutil.which("nft") is None:
            raise ClusterError("--link loss needs nftables' nft (apt-get install nftables)")
        p = subprocess.run([_IP, "netns", "exec", self.switch, "nft", *command.split()], capture_output=True,
                           text=True)
        if check and p.returncode:
            raise ClusterError(f"`nft {command}` failed: {(p.stderr or p.stdout).strip()}")
        return p

    def close(self) -> None:
        """Kill what still runs on the hosts, remove every namespace and link."""
        if self._closed:
            return
        self._closed = True
        _remove(self.names + [self.switch])
        if self._janitor is not None:
            with contextlib.suppress(OSError):
                self._janitor.stdin.close()  # nothing left for it: it exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._janitor.wait(timeout=10)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- faults ------------------------------------------------------------
    def set_link(self, k: int, up: bool) -> None:
        """Host k's cable pulled (False) or put back (True): its switch port goes down."""
        _run("link", "set", f"h{k}", "up" if up else "down", ns=self.switch)

    def reshape(self, k: int, link: LinkSpec) -> None:
        """Give host k's link another rate, delay or loss (a slow or lossy link)."""
        self._shape(k, link, change=True)

    # ---- what the links carried -----------------------------------------
    def _read_counters(self) -> list[dict]:
        out = []
        for ns in self.names:
            p = _run("-s", "-j", "link", "show", "dev", "eth0", ns=ns)
            st = json.loads(p.stdout)[0]["stats64"]
            out.append({"tx_bytes": st["tx"]["bytes"], "rx_bytes": st["rx"]["bytes"],
                        "tx_packets": st["tx"]["packets"], "rx_packets": st["rx"]["packets"]})
        return out

    def counters(self) -> list[dict]:
        """What each host's link carried since the cluster was made (the kernel's counters of its eth0)."""
        now = self._read_counters()
        return [{key: n[key] - b[key] for key in n} for n, b in zip(now, self._base)]

    def reset_counters(self) -> None:
        self._base = self._read_counters()


def _janitor(argv: list[str]) -> None:
    """Wait for the owner's pipe to close (however the owner ended), then remove its cluster."""
    owner = int(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()
    _remove(_owned(owner))

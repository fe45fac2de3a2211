"""Open MPI's launch agent on an emulated cluster: what mpirun runs in place
of ssh to start its daemon on another host (``--prtemca plm_ssh_agent``).
Called as ssh is, ``agent [ssh options] HOST COMMAND...``: runs COMMAND in
HOST's namespace, under its hostname, with a shell (as sshd would).
The cluster is named by ``RINGCOMM_CLUSTER`` (its namespaces' prefix),
which ``ringcomm run --hosts --launcher mpirun`` sets."""

from __future__ import annotations

import os
import re
import sys


def main(argv: list[str]) -> int:
    args = list(argv)
    while args and args[0].startswith("-"):  # ssh's options (-x, -o Key=Value, ...)
        opt = args.pop(0)
        if opt in ("-o", "-p", "-l", "-i", "-F") and args:
            args.pop(0)
    if len(args) < 2:
        print(f"ringcomm agent: expected HOST COMMAND..., got {argv}", file=sys.stderr)
        return 255
    host, command = args[0], " ".join(args[1:])
    m = re.fullmatch(r"host(\d+)", host)
    prefix = os.environ.get("RINGCOMM_CLUSTER")
    if not m or not prefix:
        print(f"ringcomm agent: {host!r} is no host of an emulated cluster (RINGCOMM_CLUSTER={prefix!r})",
              file=sys.stderr)
        return 255
    ns = f"{prefix}-h{m.group(1)}"
    os.execvp("ip", ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c",
                     'hostname "$0" && exec sh -c "$1"', host, command])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

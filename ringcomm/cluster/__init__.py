"""An emulated cluster on one machine (``ringcomm run --hosts``): hosts as
network namespaces on one switch, links shaped with ``tc``, the ranks
launched in them, and what each link carried beside the ledger.

``Cluster`` and ``LinkSpec`` (netns.py) make and change the cluster;
``run`` (launch.py) launches a program on it; ledger.py is the ranks' side
of the report.
"""

from .launch import placement, rank_env, run
from .netns import Cluster, ClusterError, LinkSpec, sweep_stale, why_not

__all__ = ["Cluster", "ClusterError", "LinkSpec", "run", "placement", "rank_env", "sweep_stale", "why_not"]

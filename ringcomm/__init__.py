"""ringcomm: ring ReduceScatter, AllGather and AllReduce over MPI and in-process
transports, with an exact traffic ledger.

    import ringcomm, numpy as np
    comm = ringcomm.init()                      # under mpirun (ringcomm run -n 4 ...)
    x = np.arange(8, dtype=np.float32) * (comm.rank + 1)
    comm.all_reduce(x)                          # in place, op="sum"
    print(comm.traffic().bytes_sent())          # 2(n-1)/n * x.nbytes

    ringcomm.run_local(4, lambda comm: comm.all_reduce(np.ones(8) * comm.rank))
"""

from . import traffic
from .comm import Communicator
from .quarantine import quarantined
from .p2p import P2POp, P2PWork
from .work import Work
from .world import init, run_local
from .errors import (CollectiveTimeout, CommunicatorAborted, InvalidArgument, MismatchError,
                     RingcommError, StaleViewError, TransportError, WaitTimeout)

__version__ = "0.1.0"

__all__ = [
    "P2POp", "P2PWork",
    "init", "run_local", "Communicator", "Work", "traffic", "quarantined",
    "RingcommError", "InvalidArgument", "CollectiveTimeout", "MismatchError",
    "CommunicatorAborted", "TransportError", "WaitTimeout", "StaleViewError", "__version__",
]
from .train.bucketer import GradBucketer  # noqa: E402
from .train.consistency import broadcast_parameters, check_consistency  # noqa: E402

__all__ += ["GradBucketer", "broadcast_parameters", "check_consistency"]

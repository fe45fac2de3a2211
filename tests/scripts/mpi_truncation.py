"""Shows what a receive posted for fewer bytes than the message gets under Open MPI.

    mpirun -n 2 python tests/scripts/mpi_truncation.py              # default: smsc/cma on
    mpirun -n 2 --mca smsc ^cma python tests/scripts/mpi_truncation.py

Rank 1 sends `size` bytes; rank 0 receives into the first half of a buffer
of `size` bytes and reports MPI's error and how many bytes of the second
half changed. MPI requires those bytes untouched (MPI_ERR_TRUNCATE). On
Open MPI 5.0.11 with its single-copy component (smsc/cma), messages above
the eager limit (4 KiB) are written in full: 2500 bytes past a 2500-byte
buffer for a 5000-byte message. Without cma: none. This is why every
ringcomm receive names its call's stamp as the MPI tag: a message of another
call (another size) can never match it (csrc/transports/mpi_transport.cpp).
"""
import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
for size in (1000, 4000, 5000, 16000, 100000, 2000000):
    if c.rank == 1:
        c.Send(np.full(size, 1, np.uint8), dest=0, tag=7)
    elif c.rank == 0:
        buf = np.zeros(size, np.uint8)
        half = size // 2
        try:
            c.Recv([buf[:half], MPI.BYTE], source=1, tag=7)
            err = "no error"
        except MPI.Exception as e:
            err = "MPI_ERR_TRUNCATE" if e.Get_error_class() == MPI.ERR_TRUNCATE else str(e)
        print(f"message {size:8d} B into {half:8d} B: {err}, bytes past the buffer changed: {int(buf[half:].sum())}",
              flush=True)
    c.Barrier()

"""Each rank holds a different number of items (some none). exscan of the
counts (op sum) gives every rank its offset in the concatenation of all
ranks' items (rank 0 gets 0, the identity of sum): where its items go in a
shared file or a global array, with no rank knowing the others' counts.

To build the concatenation itself on every rank, the ranks need each
other's counts (gather's ``counts=``, the same list on every rank): a
one-element all_gather of them, then a gather of the uneven parts on rank 0
(gatherv) and a broadcast of the result. The offsets exscan gave agree with
the counts' running sum.

    python docs/examples/uneven_offsets.py                   # 4 in-process ranks
    ringcomm run -n 3 python docs/examples/uneven_offsets.py # 3 processes (MPI)
"""

import os

import numpy as np

import ringcomm


def my_count(rank: int) -> int:
    return (rank * 3 + 2) % 5  # 2, 0, 3, 1, 4, ...: uneven, some ranks empty


def my_items(rank: int) -> list[int]:
    return [100 * rank + i for i in range(my_count(rank))]


def body(comm):
    n, r = comm.size, comm.rank
    mine = np.array(my_items(r), dtype=np.int64)
    count = np.array([len(mine)], dtype=np.int64)
    offset = int(comm.exscan(count.copy())[0])  # my place in the concatenation (exscan works in place)
    # everyone's count (one element per rank), for gather's counts=
    counts = comm.all_gather(count, out=np.empty(n, np.int64)).tolist()
    assert offset == sum(counts[:r]), (offset, counts)
    total = sum(counts)
    everything = comm.gather(mine, root=0, counts=counts)  # rank 0: the concatenation; others: None
    if r != 0:
        everything = np.empty(total, np.int64)
    comm.broadcast(everything, root=0)
    return offset, total, everything.tolist()


if __name__ == "__main__":
    if "OMPI_COMM_WORLD_SIZE" in os.environ:  # launched by `ringcomm run` / mpirun: one rank per process
        comm = ringcomm.init()
        offset, total, gathered = body(comm)
        print(f"rank {comm.rank}: offset {offset} of {total}: {gathered}", flush=True)
        comm.close()
    else:
        for rank, (offset, total, gathered) in enumerate(ringcomm.run_local(4, body)):
            print(f"rank {rank}: offset {offset} of {total}: {gathered}")

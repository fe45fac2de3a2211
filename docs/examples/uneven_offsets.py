"""Each rank holds a different number of items; exscan of the counts (op sum)
gives every rank its offset in the concatenation, and the total follows from
one all_reduce. Each rank then writes its items at its offset in a zeroed
buffer of the total, and an all_reduce(sum) of those buffers is the
concatenation on every rank: an all_gather of uneven parts. (The same offsets
place a rank's block for scatter/gather with per-rank counts.)

    python docs/examples/uneven_offsets.py        # 4 in-process ranks
"""

import numpy as np

import ringcomm


def my_count(rank: int) -> int:
    return (rank * 3 + 2) % 5  # 2, 0, 3, 1, 4, ...: uneven, some ranks empty


def my_items(rank: int) -> list[int]:
    return [100 * rank + i for i in range(my_count(rank))]


def body(comm):
    mine = np.array(my_items(comm.rank), dtype=np.int64)
    count = np.array([len(mine)], dtype=np.int64)
    offset = int(comm.exscan(count.copy())[0])  # rank 0: 0, the identity of sum
    total = int(comm.all_reduce(count.copy())[0])
    everything = np.zeros(total, dtype=np.int64)
    everything[offset:offset + len(mine)] = mine
    comm.all_reduce(everything)
    return offset, total, everything.tolist()


if __name__ == "__main__":
    for rank, (offset, total, gathered) in enumerate(ringcomm.run_local(4, body)):
        print(f"rank {rank}: offset {offset} of {total}: {gathered}")

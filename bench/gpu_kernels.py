"""Reduction-kernel bandwidth against device-to-device copy bandwidth (GPU only).

    python bench/gpu_kernels.py [--bytes 256M] [--reps 20]

A reduce reads two buffers and writes one: bytes moved = 3 x buffer. A copy
reads one and writes one: 2 x buffer. Each is timed as a batch of --batch
launches back to back between two CUDA events on one stream (the device never
waits for the host between them: a single launch timed alone also counts the
tens of microseconds Python takes to issue it, which at 256 MiB is 15 % of a
reduce). Batches of both alternate, median of --reps; the ratio (target >=
90%) says how close the kernel is to the memory system's limit.
"""
import argparse
import sys

import numpy as np

import ringcomm.cuda as rcuda
from ringcomm.config import parse_size


class View:
    """A typed __cuda_array_interface__ over a raw cupy byte buffer (cupy has no bfloat16)."""

    def __init__(self, raw, n, dtype):
        np_dtype = rcuda.vocab.NUMPY[dtype]
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": np_dtype.str, "data": (raw.data.ptr, False),
                                         "version": 3, "strides": None}
        self.dtype = np_dtype


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", default="256M")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=10)
    args = ap.parse_args()
    if not rcuda.available():
        print(f"no GPU: ringcomm._cuda is {rcuda.status()}")
        return 1
    import cupy
    nbytes = parse_size(args.bytes)
    print(f"# {rcuda.status()}; buffer {nbytes} B, median of {args.reps} batches of {args.batch} launches")
    print(f"# {'dtype':>8} {'op':>4} {'reduce GB/s':>12} {'copy GB/s':>10} {'ratio':>6}")
    ratios = {}
    for dtype, op in (("float32", "sum"), ("float16", "sum"), ("bfloat16", "sum"), ("float64", "max"),
                      ("int8", "sum"), ("int32", "prod")):
        n = nbytes // np.dtype(rcuda.vocab.NUMPY[dtype]).itemsize
        raw = [cupy.ones(nbytes, cupy.uint8) for _ in range(3)]

        d, a, b = (View(r, n, dtype) for r in raw)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()

        def batch(launch):
            launch()  # one ahead, not timed: the device is already busy when `start` is reached
            start.record()
            for _ in range(args.batch):
                launch()
            end.record()
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end) / 1e3 / args.batch

        def copy():
            raw[0][...] = raw[1]

        red, cpy = [], []
        for _ in range(args.reps):
            red.append(batch(lambda: rcuda.reduce(d, a, b, op)))
            cpy.append(batch(copy))
        r_bw = 3 * nbytes / np.median(red) / 1e9
        c_bw = 2 * nbytes / np.median(cpy) / 1e9
        print(f"  {dtype:>8} {op:>4} {r_bw:12.1f} {c_bw:10.1f} {r_bw / c_bw:6.2f}")
        ratios[dtype] = r_bw / c_bw
    worst = min(ratios, key=ratios.get)
    print(f"FIGURE reduce/copy bandwidth {min(ratios.values()):.2f} (worst: {worst}) .. {max(ratios.values()):.2f} "
          f"at {nbytes >> 20} MiB (goal >= 0.90)")
    return 0 if min(ratios.values()) >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())

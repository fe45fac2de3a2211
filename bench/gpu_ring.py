"""In-process ring all_reduce on one GPU against the time its bytes allow (GPU only).

    python bench/gpu_ring.py [-n 4] [--bytes 256M] [--reps 10]

N in-process ranks share one GPU (run_local(device="cuda")). The ring moves,
summed over all ranks: 2(N-1)/N x S bytes copied per rank (N x that in all)
and (N-1)/N x S bytes reduced per rank (a reduce reads two and writes one:
1.5 x the memory traffic of a copy of the same size). All of it goes through
one GPU's memory, so the bound is

    t_bound = (2(N-1) S + 1.5 (N-1) S) / copy_bw

with copy_bw the measured device-to-device copy bandwidth (bytes copied per
second). Target: measured / bound <= 1.3. The time of one all_reduce is from
a host barrier to the last rank's stream synchronize (median of --reps).
The result is checked exactly on rank-dependent data.

Beside it, the same copies and reductions (one segment per chunk, each rank's
copies on its own transfer stream, its reductions on its main stream, events
for the ring's order) are issued straight from one thread while a kernel
holds the device; timed from when it lets go. That is what the device does
with no host in the loop: the gap between it and the measured time is the
library's (matching, events and launches from N threads on one context).
"""
import argparse
import os
import sys
import threading
import time

import numpy as np

import ringcomm
import ringcomm.cuda as rcuda
from ringcomm.benchmark import device_copy_gbps
from ringcomm.config import DEFAULT_GPU_SEGMENT_BYTES, parse_size


HOLD = r"""
extern "C" __global__ void hold(unsigned long long ns) {  // keeps its stream busy for ns nanoseconds
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def schedule_alone(n: int, nbytes: int, reps: int) -> float:
    """Median seconds of the ring's device work issued with no host in the loop (module docstring)."""
    import cupy
    hold = cupy.RawModule(code=HOLD).get_function("hold")
    ce = nbytes // 4 // n
    xs = [cupy.full(ce * n, r + 1, cupy.float32) for r in range(n)]
    slots = [cupy.empty(ce, cupy.float32) for _ in range(n)]
    main = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
    xfer = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
    chunk = [[x[c * ce:(c + 1) * ce] for c in range(n)] for x in xs]
    gate = cupy.cuda.Stream(non_blocking=True)
    times = []
    for _ in range(reps + 1):
        for r in range(n):
            xs[r].fill(r + 1)
        cupy.cuda.Device().synchronize()
        hold((1,), (1,), (cupy.uint64(50_000_000),), stream=gate)  # 50 ms: longer than the issuing below
        start = gate.record()
        ready = []
        for r in range(n):
            main[r].wait_event(start)
            ready.append(main[r].record())
        for step in range(2 * (n - 1)):
            reduce_step = step < n - 1
            done = []
            for r in range(n):
                left = (r - 1) % n
                c = (r - step - 2) % n if reduce_step else (r - step + n - 2) % n
                xfer[r].wait_event(ready[left])
                xfer[r].wait_event(main[r].record())  # the slot (or chunk) is free
                dst = slots[r] if reduce_step else chunk[r][c]
                cupy.cuda.runtime.memcpyAsync(dst.data.ptr, chunk[left][c].data.ptr, ce * 4, 3, xfer[r].ptr)
                main[r].wait_event(xfer[r].record())
                if reduce_step:
                    rcuda.reduce(chunk[r][c], chunk[r][c], slots[r], "sum", stream=main[r])
                done.append(main[r].record())
            ready = done
        for r in range(n):
            gate.wait_event(main[r].record())
        end = gate.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    if not all(bool((x == n * (n + 1) // 2).all()) for x in xs):
        raise AssertionError("the reference schedule computed a wrong sum")
    return float(np.median(times[1:]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--bytes", default="256M")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--segment-bytes", default=None,
                    help="default: the library's for GPUs (config.DEFAULT_GPU_SEGMENT_BYTES)")
    args = ap.parse_args()
    if not rcuda.available():
        print(f"no GPU: ringcomm._cuda is {rcuda.status()}")
        return 1
    import cupy
    n, nbytes = args.n, parse_size(args.bytes)
    count = nbytes // 4
    copy_bw = device_copy_gbps(nbytes) * 1e9
    bound = (2 * (n - 1) * nbytes + 1.5 * (n - 1) * nbytes) / copy_bw
    gate = threading.Barrier(n)
    times = [[0.0] * args.reps for _ in range(n)]
    starts = [0.0] * args.reps

    def body(comm):
        r = comm.rank
        x = cupy.full(count, r + 1, dtype=cupy.float32)
        comm.all_reduce(x)  # warm-up (scratch, events, kernels loaded)
        cupy.cuda.get_current_stream().synchronize()
        ok = bool((x == n * (n + 1) // 2).all())
        for k in range(args.reps):
            x.fill(r + 1)
            cupy.cuda.get_current_stream().synchronize()
            gate.wait()
            if r == 0:
                starts[k] = time.perf_counter()
            gate.wait()
            comm.all_reduce(x)
            cupy.cuda.get_current_stream().synchronize()
            times[r][k] = time.perf_counter()
        ok = ok and bool((x == n * (n + 1) // 2).all())
        return ok

    alone = schedule_alone(n, nbytes, args.reps)
    env_seg = os.environ.get("RINGCOMM_SEGMENT_BYTES")
    segments = args.segment_bytes or (f"{env_seg} (RINGCOMM_SEGMENT_BYTES)" if env_seg else
                                      f"default ({DEFAULT_GPU_SEGMENT_BYTES >> 20} MiB)")
    ok = ringcomm.run_local(n, body, device="cuda", segment_bytes=args.segment_bytes, timeout=120)
    per_rep = [max(times[r][k] for r in range(n)) - starts[k] for k in range(args.reps)]
    med = float(np.median(per_rep))
    print(f"# in-process ring all_reduce, N = {n} ranks on one GPU, {nbytes} B float32, "
          f"segments {segments}, median of {args.reps}")
    print(f"# device copy bandwidth {copy_bw / 1e9:.0f} GB/s; bytes-moved bound {bound * 1e3:.2f} ms")
    print(f"the same copies and reductions with no host in the loop: {alone * 1e3:.2f} ms, "
          f"{alone / bound:.2f}x the bound")
    print(f"measured {med * 1e3:.2f} ms [p10 {np.percentile(per_rep, 10) * 1e3:.2f}, "
          f"p90 {np.percentile(per_rep, 90) * 1e3:.2f}]; measured / bound = {med / bound:.2f} (target <= 1.3); "
          f"results {'exact' if all(ok) else 'WRONG'}")
    print(f"FIGURE N = {n} on one GPU, {nbytes >> 20} MiB: {med * 1e3:.2f} ms, {med / bound:.2f}x the bytes-moved "
          f"bound (goal <= 1.3; its device work alone {alone / bound:.2f}x); results {'exact' if all(ok) else 'WRONG'}")
    return 0 if all(ok) and med / bound <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())

"""The torch.distributed backend "ringcomm" against gloo, in one MPI job
(tests/test_torch_backend.py runs it under mpirun at N = 2 and 3).

The default group is "ringcomm" (dist.init_process_group("ringcomm") with no
other argument: rank and size from MPI); a gloo group over the same ranks is
created beside it. Every op runs on both with the same rank-dependent data;
results are compared to each other and to a numpy reference. Then torch's
DDP and FSDP2 train the same model over each backend and the parameters are
compared; then the ledger is checked against what DDP moved; then errors.

Prints one line "RESULT {json}" per rank: per-op case counts and failures.
"""

import datetime
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

import ringcomm
import ringcomm.torch as rt

warnings.filterwarnings("ignore")
dist.init_process_group("ringcomm")
R, N = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")
counts: dict = {}
fails: list = []


def case(op: str, ok: bool, what: str) -> None:
    counts[op] = counts.get(op, 0) + 1
    if not ok:
        fails.append(f"rank {R}: {op}: {what}")


def data(count: int, dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Exactly predictable, rank-dependent values that every dtype holds exactly."""
    v = (np.arange(count) * 7 + 3 * rank + salt) % 11 - 5 + rank
    if dtype in (torch.uint8,):
        v = np.abs(v)
    return torch.tensor(v, dtype=torch.float64).to(dtype)


def equal(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if exact:
        return torch.equal(a, b)
    return torch.allclose(a.double(), b.double(), rtol=1e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-6,
                          atol=1e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-9)


SIZES = [0, 1, N - 1, N + 1, 13, 4099, 100003]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.uint8]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX, "AVG": dist.ReduceOp.AVG}


def reference(name: str, count: int, dtype) -> torch.Tensor:
    xs = [data(count, dtype, r).double() for r in range(N)]
    if name in ("SUM", "AVG", "PREMUL_SUM"):
        out = sum(xs)
        out = out / N if name == "AVG" else out * (2.0 if name == "PREMUL_SUM" else 1.0)
    elif name == "PRODUCT":
        out = xs[0]
        for x in xs[1:]:
            out = out * x
    elif name == "MIN":
        out = torch.stack(xs).min(0).values
    else:
        out = torch.stack(xs).max(0).values
    return out


# ---- allreduce: every op x dtype x size, sync and async, vs gloo and numpy
for name, op in list(OPS.items()) + [("PREMUL_SUM", None)]:
    for dtype in DTYPES:
        if name == "AVG" and not dtype.is_floating_point:
            continue
        if name == "PREMUL_SUM" and not dtype.is_floating_point:
            continue
        if name == "PRODUCT" and dtype in (torch.int8, torch.uint8, torch.float16, torch.bfloat16):
            continue  # overflow/rounding make the reference ambiguous; covered for the other dtypes
        for count in SIZES:
            for async_op in (False, True):
                x = data(count, dtype, R)
                g = x.clone()
                the_op = dist._make_nccl_premul_sum(2.0) if name == "PREMUL_SUM" else op
                w = dist.all_reduce(x, op=the_op, async_op=async_op)
                if async_op:
                    w.wait()
                if name in ("PREMUL_SUM",):
                    g.mul_(2.0)
                    dist.all_reduce(g, op=dist.ReduceOp.SUM, group=GLOO)
                elif not (name == "AVG" and dtype in (torch.float16, torch.bfloat16)):
                    dist.all_reduce(g, op=op, group=GLOO)
                else:
                    g = None  # gloo has no AVG for half types; numpy reference only
                ref = reference(name, count, dtype).to(dtype) if dtype.is_floating_point else \
                    reference(name, count, dtype).to(torch.int64).to(dtype)
                # Integers and N = 2 sums are exact; larger floating rings add in another order than gloo.
                exact = not dtype.is_floating_point or (N == 2 and name in ("SUM", "MIN", "MAX", "PRODUCT"))
                case("allreduce", equal(x, ref, exact or name in ("MIN", "MAX")),
                     f"{name} {dtype} count={count} async={async_op}: vs numpy")
                if g is not None:
                    case("allreduce", equal(x, g, exact or name in ("MIN", "MAX")),
                         f"{name} {dtype} count={count} async={async_op}: vs gloo")

# bitwise: BAND, BOR, BXOR on integers and bool (all_reduce sync and async, reduce to every root), vs gloo
# and a reference; a floating tensor is a TypeError before anything moves
BITWISE = {"BAND": (dist.ReduceOp.BAND, torch.bitwise_and), "BOR": (dist.ReduceOp.BOR, torch.bitwise_or),
           "BXOR": (dist.ReduceOp.BXOR, torch.bitwise_xor)}
for name, (op, fn) in BITWISE.items():
    for dtype in (torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool):
        for count in (0, 1, N + 1, 4099):
            def bits(rank):
                v = data(count, torch.int64, rank) * 37 + (rank + 1) * 1000003
                return (v % 2 == 0) if dtype == torch.bool else v.to(dtype)
            ref = bits(0)
            for r in range(1, N):
                ref = fn(ref, bits(r))
            for async_op in (False, True):
                x, g = bits(R), bits(R)
                w = dist.all_reduce(x, op=op, async_op=async_op)
                if async_op:
                    w.wait()
                dist.all_reduce(g, op=op, group=GLOO)
                case("bitwise", equal(x, ref, True), f"all_reduce {name} {dtype} count={count} async={async_op}: "
                                                     "vs reference")
                case("bitwise", equal(x, g, True), f"all_reduce {name} {dtype} count={count} async={async_op}: "
                                                   "vs gloo")
            for root in range(N):
                x = bits(R)
                dist.reduce(x, dst=root, op=op)
                if R == root:
                    case("bitwise", equal(x, ref, True), f"reduce {name} {dtype} count={count} root={root}")
    try:
        dist.all_reduce(torch.ones(3), op=op)
        case("bitwise", False, f"{name} of a float32 tensor did not raise")
    except TypeError as exc:
        case("bitwise", "needs an integer or bool dtype" in str(exc), str(exc))

# non-contiguous, requires_grad, futures
x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (R + 1)  # not contiguous
dist.all_reduce(x)
case("allreduce", equal(x, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (N * (N + 1) // 2), True),
     "non-contiguous")
p = torch.nn.Parameter(torch.ones(5) * (R + 1))
dist.all_reduce(p.data)
dist.all_reduce(p)  # requires_grad: through its storage, as gloo does
case("allreduce", equal(p.detach(), torch.ones(5) * (N * (N + 1) // 2) * N, True), "requires_grad tensor")
fut = dist.all_reduce(torch.ones(4) * R, async_op=True).get_future()
case("allreduce", equal(fut.wait()[0], torch.ones(4) * (N * (N - 1) // 2), True), "future value")
z = torch.tensor([1 + 2j, -3j], dtype=torch.complex64) * (R + 1)  # torch passes complex as a real view
dist.all_reduce(z)
case("allreduce", equal(z, torch.tensor([1 + 2j, -3j], dtype=torch.complex64) * (N * (N + 1) // 2), True), "complex")
# bool: every op, as gloo (sum and max are "or", product and min "and")
for name, op in OPS.items():
    if name == "AVG":
        continue
    for count in (0, 1, N + 1, 4099):
        i = torch.arange(count)
        b = (i * 7 + R * 3) % (N + 2) == 0
        b = b if name in ("SUM", "MAX") else ~b
        want = torch.stack([(i * 7 + r * 3) % (N + 2) == 0 for r in range(N)])
        want = want.any(0) if name in ("SUM", "MAX") else (~want).all(0)
        g = b.clone()
        dist.all_reduce(b, op=op)
        dist.all_reduce(g, op=op, group=GLOO)
        case("allreduce", equal(b, want, True) and equal(b, g, True), f"bool {name} count={count}: {b[:8]}")
bb = torch.tensor([R == 0, True, False])
dist.broadcast(bb, 0)
gb = [torch.empty(2, dtype=torch.bool) for _ in range(N)]
dist.all_gather(gb, torch.tensor([R % 2 == 0, True]))
case("broadcast", equal(bb, torch.tensor([True, True, False]), True), f"bool: {bb}")
case("all_gather", all(equal(gb[r], torch.tensor([r % 2 == 0, True]), True) for r in range(N)), f"bool: {gb}")
# 16-bit and unsigned integers (gloo: "Invalid scalar type"): against the
# wrap-around numpy computes; 65535 * 65535 overflows an int (the C++
# promotion of uint16): the engine multiplies in unsigned int.
for dtype, npd in ((torch.int16, np.int16), (torch.uint16, np.uint16), (torch.uint32, np.uint32),
                   (torch.uint64, np.uint64)):
    base = np.array([np.iinfo(npd).max, 3, 2 ** (np.iinfo(npd).bits - 1) - 1, 0], dtype=npd)
    for name, op in OPS.items():
        if name == "AVG":
            continue
        mine = base + np.array([0, R, R, R], dtype=npd)
        rows = np.stack([base + np.array([0, r, r, r], dtype=npd) for r in range(N)])
        with np.errstate(over="ignore"):
            want = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}[name].reduce(rows, 0, dtype=npd)
        t = torch.from_numpy(mine.copy())
        dist.all_reduce(t, op=op)
        case("allreduce", np.array_equal(t.numpy(), want), f"{dtype} {name}: {t.tolist()} want {want.tolist()}")
    out = [torch.empty(2, dtype=dtype) for _ in range(N)]
    dist.all_gather(out, torch.from_numpy(base[:2] + np.array([0, R], dtype=npd)))
    case("all_gather", all(np.array_equal(out[r].numpy(), base[:2] + np.array([0, r], dtype=npd)) for r in range(N)),
         f"{dtype}: {out}")
# dtypes the engine has no type for: refused by every collective, naming the
# dtype; send/recv move their bytes (gloo does too)
try:
    dist.all_reduce(torch.zeros(3, dtype=torch.float8_e4m3fn))
    case("allreduce", False, "float8 accepted")
except TypeError as exc:
    case("allreduce", "float8_e4m3fn" in str(exc), f"float8: {exc}")

# ---- broadcast
for dtype in DTYPES:
    for count in SIZES:
        for root in range(N):
            x = data(count, dtype, R)
            dist.broadcast(x, src=root)
            case("broadcast", equal(x, data(count, dtype, root), True), f"{dtype} count={count} root={root}")

# ---- all_gather (list), all_gather_single (incl. in place), vs gloo
for dtype in DTYPES:
    for count in SIZES:
        mine = data(count, dtype, R)
        outs = [torch.empty(count, dtype=dtype) for _ in range(N)]
        dist.all_gather(outs, mine)
        gl = [torch.empty(count, dtype=dtype) for _ in range(N)]
        dist.all_gather(gl, mine, group=GLOO)
        case("all_gather", all(equal(a, b, True) for a, b in zip(outs, gl)), f"{dtype} count={count}")
        case("all_gather", all(equal(outs[r], data(count, dtype, r), True) for r in range(N)), f"{dtype} {count}")
        # into chunks of one buffer (all_gather_object's form), once with the input as its own chunk
        for own in (False, True):
            whole = torch.full((N * count,), 7, dtype=dtype)
            chunks = list(whole.split(count)) if count else [whole[:0] for _ in range(N)]
            if own:
                chunks[R].copy_(mine)
            dist.all_gather(chunks, chunks[R] if own else mine)
            case("all_gather", equal(whole, torch.cat([data(count, dtype, r) for r in range(N)]), True),
                 f"into chunks of one buffer {dtype} count={count} input is its chunk={own}")
        single = torch.empty(N * count, dtype=dtype)
        w = dist.all_gather_single(single, mine, async_op=True)
        w.wait()
        case("all_gather_single", equal(single, torch.cat([data(count, dtype, r) for r in range(N)]), True),
             f"{dtype} count={count}")
        inplace = torch.zeros(N * count, dtype=dtype)
        inplace[R * count:(R + 1) * count] = mine
        dist.all_gather_into_tensor(inplace, inplace[R * count:(R + 1) * count])
        case("all_gather_single", equal(inplace, single, True), f"in place {dtype} count={count}")

# ---- reduce_scatter (list and single) vs gloo
for name in ("SUM", "MAX", "AVG"):
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        if name == "AVG" and not dtype.is_floating_point:
            continue
        for count in (1, 7, 4099):
            full = data(N * count, dtype, R)
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, full, op=OPS[name])
            ref = reference(name, N * count, dtype)[R * count:(R + 1) * count].to(dtype)
            exact = not dtype.is_floating_point or name == "MAX" or N == 2 and name == "SUM"
            case("reduce_scatter_single", equal(out, ref, exact), f"{name} {dtype} count={count}")
            lst = list(full.chunk(N))
            out2 = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(out2, lst, op=OPS[name])
            case("reduce_scatter", equal(out2, out, True), f"list form {name} {dtype} count={count}")
            if dtype != torch.bfloat16 and name != "AVG":
                g = torch.empty(count, dtype=dtype)
                dist.reduce_scatter_tensor(g, full, op=OPS[name], group=GLOO)
                case("reduce_scatter_single", equal(out, g, exact), f"vs gloo {name} {dtype} count={count}")

# ---- coalesced forms
with dist._coalescing_manager(async_ops=True) as cm:
    a, b = torch.ones(5) * R, torch.arange(3.0) * R
    dist.all_reduce(a)
    dist.all_reduce(b)
cm.wait()
case("coalesced", equal(a, torch.ones(5) * (N * (N - 1) // 2), True) and
     equal(b, torch.arange(3.0) * (N * (N - 1) // 2), True), "all_reduce x2")
ins = [data(4, torch.float32, R, s) for s in range(3)]
outs = [torch.empty(4 * N) for _ in range(3)]
with dist._coalescing_manager(async_ops=True) as cm:
    for o, i in zip(outs, ins):
        dist.all_gather_into_tensor(o, i)
cm.wait()
case("coalesced", all(equal(o, torch.cat([data(4, torch.float32, r, s) for r in range(N)]), True)
                      for s, o in enumerate(outs)), "all_gather_into_tensor x3")

# ---- all_gather_coalesced: output_lists[r][i] is rank r's input i (one list
# per rank, as torch passes it and gloo fills it); shapes differ, some empty;
# outputs apart, non-contiguous, or views of one buffer in order; sync and
# async; vs gloo and the reference
SHAPES = [(2, 3), (0,), (5,), (1, 1, 4), (0, 2), (7,)]
for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
    for layout in ("apart", "non-contiguous", "one buffer"):
        for async_op in (False, True):
            ins = [data(math.prod(s), dtype, R, salt=i).reshape(s) for i, s in enumerate(SHAPES)]
            if layout == "one buffer":  # all_gather_coalesced writes these straight
                whole = torch.full((N * sum(math.prod(s) for s in SHAPES),), 9, dtype=dtype)
                views = iter(whole.split([math.prod(s) for _ in range(N) for s in SHAPES]))
                outs = [[next(views).view(s) for s in SHAPES] for _ in range(N)]
            elif layout == "non-contiguous":
                outs = [[torch.full(s[::-1], 9, dtype=dtype).t() if len(s) == 2 else torch.full(s, 9, dtype=dtype)
                         for s in SHAPES] for _ in range(N)]
            else:
                outs = [[torch.full(s, 9, dtype=dtype) for s in SHAPES] for _ in range(N)]
            w = dist.all_gather_coalesced(outs, ins, async_op=async_op)
            if async_op:
                w.wait()
            for r in range(N):
                for i, s in enumerate(SHAPES):
                    case("all_gather_coalesced", equal(outs[r][i], data(math.prod(s), dtype, r, salt=i).reshape(s),
                                                       True),
                         f"{dtype} {layout} async={async_op}: output list {r} (rank {r}'s), index {i} {s}: "
                         f"{outs[r][i].reshape(-1)[:6].tolist()}")
            if dtype != torch.bfloat16 and layout == "apart" and not async_op:
                gl = [[torch.full(s, 9, dtype=dtype) for s in SHAPES] for _ in range(N)]
                dist.all_gather_coalesced(gl, ins, group=GLOO)
                for r in range(N):
                    for i in range(len(SHAPES)):
                        case("all_gather_coalesced", equal(outs[r][i], gl[r][i], True),
                             f"vs gloo {dtype}: output list {r}, index {i}")
# what torch's Python layer passes unchecked is refused on every rank before
# anything moves (gloo refuses it too)
for what, outs, ins, exc_type, needle in (
        ("one list per input (N + 1 inputs)", [[torch.empty(2)] * N for _ in range(N + 1)], [torch.ones(2)] * (N + 1),
         ValueError, "one output list per rank"),
        ("a list short of a tensor", [[torch.empty(2)] for _ in range(N)], [torch.ones(2), torch.ones(3)],
         ValueError, "output list 0 has 1 tensors"),
        ("a wrong shape", [[torch.empty(2), torch.empty(4)] for _ in range(N)], [torch.ones(2), torch.ones(3)],
         ValueError, "tensor 1"),
        ("no inputs", [[] for _ in range(N)], [], ValueError, "non-empty")):
    try:
        dist.all_gather_coalesced(outs, ins)
        case("all_gather_coalesced", False, f"{what}: accepted")
    except exc_type as exc:
        case("all_gather_coalesced", needle in str(exc), f"{what}: {exc}")
try:
    dist.distributed_c10d._get_default_group().allgather_coalesced(
        [[torch.empty(2), torch.empty(2, dtype=torch.int32)] for _ in range(N)],
        [torch.ones(2), torch.ones(2, dtype=torch.int32)])
    case("all_gather_coalesced", False, "mixed dtypes accepted")
except TypeError as exc:
    case("all_gather_coalesced", "one dtype per call" in str(exc), f"mixed dtypes: {exc}")

# allgather with several inputs (the process group's list-of-lists form; gloo
# takes it): k output lists of k * N tensors, each list the whole result with
# rank r's input i at index r * k + i; vs gloo and the reference
PG = dist.distributed_c10d._get_default_group()
for k in (2, 3):
    for async_op in (False, True):
        ins = [data(5, torch.float32, R, salt=i) for i in range(k)]
        outs = [[torch.full((5,), 9.0) for _ in range(k * N)] for _ in range(k)]
        opts = dist.distributed_c10d.AllgatherOptions()
        opts.asyncOp = async_op
        PG.allgather(outs, ins, opts).wait()
        gl = [[torch.full((5,), 9.0) for _ in range(k * N)] for _ in range(k)]
        GLOO.allgather(gl, ins).wait()
        for j in range(k):
            for r in range(N):
                for i in range(k):
                    got = outs[j][r * k + i]
                    case("allgather_several", equal(got, data(5, torch.float32, r, salt=i), True),
                         f"k={k} async={async_op}: output list {j}, index {r * k + i} (rank {r}'s input {i}): "
                         f"{got.tolist()}")
                    case("allgather_several", equal(got, gl[j][r * k + i], True),
                         f"k={k} vs gloo: output list {j}, index {r * k + i}")
for what, outs, ins in (("one output list for 2 inputs", [[torch.empty(2)] * (2 * N)], [torch.ones(2)] * 2),
                        ("2 output lists for 1 input", [[torch.empty(2)] * N] * 2, [torch.ones(2)]),
                        ("a short output list", [[torch.empty(2)] * (2 * N), [torch.empty(2)] * N],
                         [torch.ones(2)] * 2),
                        ("inputs of two shapes", [[torch.empty(2)] * (2 * N)] * 2, [torch.ones(2), torch.ones(3)])):
    try:
        PG.allgather(outs, ins).wait()
        case("allgather_several", False, f"{what}: accepted")
    except ValueError as exc:
        case("allgather_several", "ringcomm backend: allgather" in str(exc), f"{what}: {exc}")

# ---- reduce: every root, ops, dtypes, sync and async, PREMUL_SUM, non-contiguous; vs gloo and numpy
for name in ("SUM", "MAX", "MIN", "PRODUCT", "AVG", "PREMUL_SUM"):
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        if name in ("AVG", "PREMUL_SUM") and not dtype.is_floating_point:
            continue
        if name == "PRODUCT" and dtype == torch.bfloat16:
            continue
        for count in (0, 1, 13, 4099):
            for root in range(N):
                async_op = (root + count) % 2 == 1
                x = data(count, dtype, R)
                orig = x.clone()
                the_op = dist._make_nccl_premul_sum(2.0) if name == "PREMUL_SUM" else OPS[name]
                w = dist.reduce(x, dst=root, op=the_op, async_op=async_op)
                if async_op:
                    w.wait()
                exact = not dtype.is_floating_point or name in ("MIN", "MAX") or (N == 2 and name != "AVG")
                if R == root:
                    ref = reference(name, count, dtype)
                    ref = ref.to(dtype) if dtype.is_floating_point else ref.to(torch.int64).to(dtype)
                    case("reduce", equal(x, ref, exact), f"{name} {dtype} count={count} root={root} async={async_op}")
                else:  # a non-root's input is only read (as NCCL; gloo leaves scratch values there)
                    case("reduce", equal(x, orig, True), f"non-root input changed: {name} {dtype} count={count}")
                if name not in ("AVG", "PREMUL_SUM") and dtype != torch.bfloat16:
                    g = data(count, dtype, R)
                    dist.reduce(g, dst=root, op=OPS[name], group=GLOO)
                    if R == root:
                        case("reduce", equal(x, g, exact), f"vs gloo {name} {dtype} count={count} root={root}")
x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (R + 1)  # not contiguous
dist.reduce(x, dst=N - 1)
if R == N - 1:
    case("reduce", equal(x, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (N * (N + 1) // 2), True),
         "non-contiguous")

# ---- gather and scatter: every root, dtypes, sizes, async, non-contiguous; vs gloo
for dtype in (torch.float32, torch.int64, torch.int8, torch.bfloat16):
    for count in (0, 1, 13, 4099):
        for root in range(N):
            async_op = (root + count) % 2 == 0
            mine = data(count, dtype, R)
            gl = [torch.full((count,), -1, dtype=dtype) for _ in range(N)] if R == root else None
            w = dist.gather(mine, gl, dst=root, async_op=async_op)
            if async_op:
                w.wait()
            if R == root:
                case("gather", all(equal(gl[r], data(count, dtype, r), True) for r in range(N)),
                     f"{dtype} count={count} root={root} async={async_op}")
                gg = [torch.empty(count, dtype=dtype) for _ in range(N)]
            else:
                gg = None
            dist.gather(mine, gg, dst=root, group=GLOO)
            if R == root:
                case("gather", all(equal(a, b, True) for a, b in zip(gl, gg)), f"vs gloo {dtype} count={count}")
            out = torch.full((count,), -1, dtype=dtype)
            sl = [data(count, dtype, r, salt=5) for r in range(N)] if R == root else None
            w = dist.scatter(out, sl, src=root, async_op=async_op)
            if async_op:
                w.wait()
            case("scatter", equal(out, data(count, dtype, R, salt=5), True),
                 f"{dtype} count={count} root={root} async={async_op}")
            g = torch.empty(count, dtype=dtype)
            dist.scatter(g, sl, src=root, group=GLOO)
            case("scatter", equal(out, g, True), f"vs gloo {dtype} count={count} root={root}")
# Blocks of one buffer (torch.chunk), which the backend reads and writes in place, sync and async.
for async_op in (False, True):
    whole = torch.full((N * 5,), -1.0)
    w = dist.gather(torch.arange(5.0) + 10 * R, list(whole.chunk(N)) if R == 1 % N else None, dst=1 % N,
                    async_op=async_op)
    if async_op:
        w.wait()
    if R == 1 % N:
        case("gather", equal(whole, torch.cat([torch.arange(5.0) + 10 * r for r in range(N)]), True),
             f"into chunks of one buffer, async={async_op}")
    src = torch.arange(N * 4, dtype=torch.int32)
    out = torch.full((4,), -1, dtype=torch.int32)
    w = dist.scatter(out, list(src.chunk(N)) if R == 0 else None, src=0, async_op=async_op)
    if async_op:
        w.wait()
    case("scatter", equal(out, src[4 * R:4 * R + 4], True), f"from chunks of one buffer, async={async_op}")
nc = [torch.zeros(4, 3).t() for _ in range(N)] if R == 0 else None  # non-contiguous outputs
dist.gather(torch.arange(12.0).reshape(3, 4) + R, nc, dst=0)
if R == 0:
    case("gather", all(equal(nc[r], torch.arange(12.0).reshape(3, 4) + r, True) for r in range(N)), "non-contiguous")
out = torch.zeros(4, 3).t()
dist.scatter(out, [torch.arange(12.0).reshape(3, 4) * r for r in range(N)] if R == 0 else None, src=0)
case("scatter", equal(out, torch.arange(12.0).reshape(3, 4) * R, True), "non-contiguous output")

# ---- all_to_all_single: equal and uneven splits (rows of dim 0), 2-D, async; the list form; vs gloo
for dtype in (torch.float32, torch.int32, torch.float16):
    for rows in (0, 1, 5):
        # rank R sends (R + p + rows) % 3 rows of width 3 to peer p: uneven, some zero
        ins = [(R + p + rows) % 3 for p in range(N)]
        outs = [(p + R + rows) % 3 for p in range(N)]
        x = data(sum(ins) * 3, dtype, R).reshape(-1, 3)
        for async_op in (False, True):
            y = torch.full((sum(outs), 3), -1, dtype=dtype)
            w = dist.all_to_all_single(y, x, outs, ins, async_op=async_op)
            if async_op:
                w.wait()
            g = torch.empty_like(y)
            dist.all_to_all_single(g, x, outs, ins, group=GLOO)
            case("all_to_all_single", equal(y, g, True), f"uneven {dtype} rows={rows} async={async_op}")
        xe = data(N * rows * 2, dtype, R).reshape(N * rows, 2)
        ye, ge = torch.empty_like(xe), torch.empty_like(xe)
        dist.all_to_all_single(ye, xe)
        dist.all_to_all_single(ge, xe, group=GLOO)
        case("all_to_all_single", equal(ye, ge, True), f"equal {dtype} rows={rows}")
# What the synchronous fast lane hands back to the general path (InvalidArgument
# before any byte moves): non-contiguous tensors, and the output being the input.
xc = data(N * 2 * 3, torch.float32, R).reshape(N * 2, 3)
want = torch.empty_like(xc)
dist.all_to_all_single(want, xc)
xt = xc.t().contiguous().t()  # the same values, column-major: not contiguous
yt = torch.full((3, N * 2), -1.0).t()
dist.all_to_all_single(yt, xt)
case("all_to_all_single", not xt.is_contiguous() and equal(yt, want, True), "non-contiguous input and output")
xi = xc.clone()
dist.all_to_all_single(xi, xi)
case("all_to_all_single", equal(xi, want, True), "in place (the output is the input)")
xs = [data(3, torch.int64, R, salt=p) for p in range(N)]
ys = [torch.empty(3, dtype=torch.int64) for _ in range(N)]
gs = [torch.empty(3, dtype=torch.int64) for _ in range(N)]
dist.all_to_all(ys, xs)
dist.all_to_all(gs, xs, group=GLOO)
case("all_to_all", all(equal(a, b, True) for a, b in zip(ys, gs)), "list form vs gloo")
# Uneven list form (gloo refuses it; NCCL does it): rank R sends p + 1 elements to p.
ys = [torch.empty(R + 1) for _ in range(N)]
dist.all_to_all(ys, [torch.full((p + 1,), float(R)) for p in range(N)])
case("all_to_all", all(equal(ys[p], torch.full((R + 1,), float(p)), True) for p in range(N)), "uneven list form")
# Non-contiguous tensors in both lists, async (the backend hands the engine each tensor's place).
xs = [(torch.arange(6.0).reshape(2, 3) + 10 * R + p).t() for p in range(N)]
ys, gs = [torch.zeros(3, 2).t() for _ in range(N)], [torch.zeros(3, 2) for _ in range(N)]
dist.all_to_all(ys, xs, async_op=True).wait()
dist.all_to_all(gs, [x.contiguous() for x in xs], group=GLOO)  # (gloo: same shapes, contiguous)
case("all_to_all", all(equal(a.reshape(-1), b.reshape(-1), True) for a, b in zip(ys, gs)),
     "non-contiguous list form vs gloo")
# gather into a list whose root entry is the input itself (in place), as torch's own tests do.
mine = torch.arange(4.0) + R
gl = [mine if r == R else torch.zeros(4) for r in range(N)] if R == 0 else None
dist.gather(mine, gl, dst=0)
if R == 0:
    case("gather", all(equal(gl[r], torch.arange(4.0) + r, True) for r in range(N)), "the input as its own list entry")

# ---- forms an independent review found refused or wrong (all of them gloo does)
# all_to_all_single: rank 0 leaves the split sizes empty, the others spell the equal blocks out.
x = torch.arange(2.0 * N) + 100 * R
sp = [] if R == 0 else [2] * N
y, g = torch.empty(2 * N), torch.empty(2 * N)
dist.all_to_all_single(y, x, sp, sp)
dist.all_to_all_single(g, x, sp, sp, group=GLOO)
case("all_to_all_single", equal(y, g, True), f"empty split sizes on rank 0 only: {y.tolist()} vs gloo {g.tolist()}")
# Uneven split sizes that happen to be equal on rank 0 only (it sends and receives 2 rows to and from everyone).
S = [[2] * N] + [[2] + [3 + i + j for j in range(N - 1)] for i in range(N - 1)]
x = torch.arange(float(sum(S[R]))) + 100 * R
y, g = torch.empty(sum(S[q][R] for q in range(N))), torch.empty(sum(S[q][R] for q in range(N)))
dist.all_to_all_single(y, x, [S[q][R] for q in range(N)], S[R])
dist.all_to_all_single(g, x, [S[q][R] for q in range(N)], S[R], group=GLOO)
case("all_to_all_single", equal(y, g, True), f"splits equal on rank 0 only: {y.tolist()} vs gloo {g.tolist()}")
# reduce_scatter_tensor into a chunk of the input that is not this rank's; gather from a block of
# the root's gather buffer that is not the root's own.
for grp in (None, GLOO):
    full = (torch.arange(4.0 * N) + 1) * (R + 1)
    k = (R + 1) % N
    out = full[4 * k:4 * k + 4]
    dist.reduce_scatter_tensor(out, full, group=grp)
    want = (torch.arange(4.0 * R, 4.0 * R + 4) + 1) * (N * (N + 1) // 2)
    case("reduce_scatter_single", equal(out, want, True), f"into another rank's chunk of the input, group={grp}")
    whole = torch.zeros(3 * N)
    mine = whole[3 * k:3 * k + 3].fill_(R + 1)
    dist.gather(mine, list(whole.chunk(N)) if R == 0 else None, dst=0, group=grp)
    if R == 0:
        case("gather", equal(whole, torch.repeat_interleave(torch.arange(1.0, N + 1), 3), True),
             f"from another block of the root's buffer, group={grp}: {whole.tolist()}")
# complex reduce and reduce_scatter (SUM, AVG) as gloo; MAX of complex numbers is refused
z = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64) * (R + 1)
for name in ("SUM", "AVG"):
    zr, zg = z.clone(), z.clone()
    dist.reduce(zr, dst=0, op=OPS[name])
    dist.reduce(zg, dst=0, op=OPS[name] if name == "SUM" else dist.ReduceOp.SUM, group=GLOO)
    if name == "AVG":
        zg = zg / N if R == 0 else zg
    if R == 0:
        case("reduce", equal(zr, zg, False), f"complex64 {name}: {zr.tolist()} vs {zg.tolist()}")
zs = torch.arange(2.0 * N, dtype=torch.float64).to(torch.complex128) * (1 + 1j) * (R + 1)
o1, o2 = torch.empty(2, dtype=torch.complex128), torch.empty(2, dtype=torch.complex128)
dist.reduce_scatter_tensor(o1, zs)
dist.reduce_scatter_tensor(o2, zs, group=GLOO)
case("reduce_scatter_single", equal(o1, o2, True), f"complex128: {o1.tolist()} vs gloo {o2.tolist()}")
try:
    dist.reduce(z.clone(), dst=0, op=dist.ReduceOp.MAX)
    case("errors", False, "MAX of complex numbers accepted")
except TypeError as exc:
    case("errors", "complex" in str(exc), str(exc))
# is_completed() only once the results are in the caller's tensors (the list all_gather copies back)
for _ in range(3):
    outs = [torch.full((4,), -1.0) for _ in range(N)]
    w = dist.all_gather(outs, torch.full((4,), float(R)), async_op=True)
    t0 = time.monotonic()
    while not w.is_completed() and time.monotonic() - t0 < 20:
        pass
    case("all_gather", [o[0].item() for o in outs] == [float(r) for r in range(N)] and w.is_success(),
         f"is_completed() before the copy back: {[o[0].item() for o in outs]} success={w.is_success()}")
# One output tensor given for every block (gloo takes it: the last block wins).
shared = torch.zeros(2)
dist.all_to_all([shared] * N, [torch.full((2,), float(10 * R + p)) for p in range(N)])
case("all_to_all", torch.equal(shared, torch.full((2,), float(10 * (N - 1) + R))), f"one output tensor reused: {shared}")
shared = torch.zeros(2)
dist.gather(torch.full((2,), float(R)), [shared] * N if R == 0 else None, dst=0)
if R == 0:
    case("gather", torch.equal(shared, torch.full((2,), float(N - 1))), f"one output tensor reused: {shared}")
# The root of a broadcast may pass an expanded tensor (only read there), as with gloo.
src = torch.full((1,), 5.0).expand(4) if R == 0 else torch.zeros(4)
dist.broadcast(src, src=0)
case("broadcast", torch.equal(src, torch.full((4,), 5.0)), f"from an expanded tensor on the root: {src.tolist()}")
# What an async op's result() and future hold: the same as gloo's (a flat list of the output tensors).
for name, make in (("all_gather", lambda g: (lambda outs: (dist.all_gather(outs, torch.full((2,), float(R)), group=g,
                                                                         async_op=True), outs))(
                       [torch.zeros(2) for _ in range(N)])),
                   ("gather", lambda g: (lambda outs: (dist.gather(torch.full((2,), float(R)), outs if R == 0 else None,
                                                                   dst=0, group=g, async_op=True), outs))(
                       [torch.zeros(2) for _ in range(N)]))):
    shapes = []
    for g in (None, GLOO):
        w, outs = make(g)
        value = w.get_future().wait()
        w.wait()
        shapes.append([type(v).__name__ for v in value] if isinstance(value, list) else type(value).__name__)
        if R == 0 and g is None:
            case(name, all(isinstance(v, torch.Tensor) for v in value) and torch.equal(torch.cat(value), torch.cat(outs)),
                 f"future value {value}")
    case(name, shapes[0] == shapes[1], f"async result: ringcomm {shapes[0]}, gloo {shapes[1]}")
# wait(timeout): raises once it passes, the work goes on (rank N-1 comes 1.5 s late)
if R == N - 1:
    time.sleep(1.5)
w = dist.all_reduce(torch.ones(8) * R, async_op=True)
if R == 0:
    t0 = time.monotonic()
    try:
        w.wait(timeout=datetime.timedelta(seconds=0.3))
        case("errors", False, "wait(timeout=0.3 s) returned with a rank 1.5 s late")
    except ringcomm.WaitTimeout as exc:
        case("errors", isinstance(exc, RuntimeError) and time.monotonic() - t0 < 1.2, f"{exc} after "
             f"{time.monotonic() - t0:.2f} s")
w.wait()
case("allreduce", w.is_success(), "the work after a wait timeout")
dist.barrier()

# ---- errors of the new ops reach the caller
try:
    dist.all_to_all_single(torch.empty(N + 1), torch.ones(N + 1))
    case("errors", False, "all_to_all_single with rows not divisible by N accepted")
except ValueError as exc:
    case("errors", "not divisible" in str(exc), str(exc))
# all_gather into outputs of another shape (same size): refused, as gloo does
# (ringcomm reshaped the blocks silently); our own output of another size too
for bad in ([torch.empty(2, 2) for _ in range(N)], [torch.empty(5) if q == R else torch.empty(4) for q in range(N)]):
    for grp, label in ((None, "ringcomm"), (GLOO, "gloo")):
        try:
            dist.all_gather(bad, torch.ones(4), group=grp)
            case("errors", False, f"{label}: all_gather into {[tuple(o.shape) for o in bad]} from (4,) accepted")
        except (ValueError, RuntimeError) as exc:
            case("errors", label == "gloo" or f"invalid tensor size at index {R}" in str(exc), f"{label}: {exc}")
bad23 = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=3))
t0 = time.monotonic()
try:  # one rank's block differs: the root and that rank raise, also through an async Work
    w = dist.gather(torch.ones(4 + (R == N - 1)), [torch.empty(4) for _ in range(N)] if R == 0 else None, dst=0,
                    group=bad23, async_op=True)
    w.wait()
    # A leaf whose block did not depend on the rank that disagrees may finish
    # (the engine's rule, tests/test_collectives.py): its next call fails at once.
    case("errors", R not in (0, N - 1), "gather size mismatch not detected on the root or the rank that differs")
    try:
        dist.barrier(group=bad23)
        case("errors", False, "the call after a gather mismatch did not fail")
    except (ringcomm.MismatchError, ringcomm.CommunicatorAborted) as exc:
        case("errors", time.monotonic() - t0 < 3.0, f"after a gather mismatch: {type(exc).__name__}")
except ringcomm.MismatchError as exc:
    case("errors", time.monotonic() - t0 < 3.0, f"gather mismatch: {exc}")

# ---- barrier, and ops ringcomm does not have
dist.barrier()
case("barrier", True, "")
# monitored_barrier: torch's dist.monitored_barrier refuses every backend but gloo before it reaches the group;
# the group's own method says the same.
for what, call in (("monitored_barrier", lambda: dist.distributed_c10d._get_default_group().monitored_barrier()),):
    try:
        call()
        case("unsupported", False, f"{what} did not raise")
    except NotImplementedError as exc:
        case("unsupported", "ringcomm backend" in str(exc) and "not implemented" in str(exc)
             and (what != "monitored_barrier" or "gloo" in str(exc)), str(exc))
# Sparse tensors: all_reduce SUM as gloo's (DDP with nn.Embedding(sparse=True) reduces them), sync and
# async, hybrid (a dense part per index), ranks with different and with no entries; other ops refuse them.
for dense in ((), (3,)):
    for async_op in (False, True):
        i = torch.tensor([[R % 5, 2, 5 + R % 3]]) if R % 2 == 0 else torch.zeros(1, 0, dtype=torch.int64)
        v = (torch.arange(i.shape[1] * (3 if dense else 1), dtype=torch.float32) + R).reshape(i.shape[1], *dense)
        mine, theirs = torch.sparse_coo_tensor(i, v, (10, *dense)), torch.sparse_coo_tensor(i, v, (10, *dense))
        w = dist.all_reduce(mine, async_op=async_op)
        if async_op:
            w.wait()
        dist.all_reduce(theirs, group=GLOO)
        case("sparse", mine.layout == torch.sparse_coo and torch.equal(mine.to_dense(), theirs.to_dense()),
             f"all_reduce dense part {dense} async={async_op}: {mine.to_dense().tolist()} vs gloo "
             f"{theirs.to_dense().tolist()}")
emb = torch.nn.Embedding(10, 4, sparse=True)
emb_gloo = torch.nn.Embedding(10, 4, sparse=True)
emb_gloo.load_state_dict(emb.state_dict())
ddp, ddp_gloo = (torch.nn.parallel.DistributedDataParallel(emb),
                 torch.nn.parallel.DistributedDataParallel(emb_gloo, process_group=GLOO))
words = torch.tensor([R, 3, R + 4])
ddp(words).pow(2).sum().backward()
ddp_gloo(words).pow(2).sum().backward()
case("sparse", torch.allclose(emb.weight.grad.to_dense(), emb_gloo.weight.grad.to_dense()), "DDP sparse embedding")
sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
for what, call in (("all_reduce MAX", lambda: dist.all_reduce(sparse, op=dist.ReduceOp.MAX)),
                   ("broadcast", lambda: dist.broadcast(sparse, src=0))):
    try:
        call()
        case("sparse", False, f"{what} of a sparse tensor did not raise")
    except NotImplementedError as exc:
        case("sparse", "sparse" in str(exc), f"{what}: {exc}")


# ---- point-to-point: send/recv between every pair, isend/irecv, any source, batch_isend_irecv; vs gloo
def p2p_data(count, dtype, src, dst, salt=0):
    return data(count, dtype, src, salt=7 * dst + salt)


comm = rt.communicator()
for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
    for count in (0, 1, 13, 100003):
        got = {}
        for group in (None, GLOO):
            for i in range(N):  # one pair at a time, in the same order on every rank: blocking calls never cycle
                for j in range(N):
                    if i == j:
                        continue
                    if R == i:
                        dist.send(p2p_data(count, dtype, i, j), j, group=group, tag=5)
                    elif R == j:
                        y = torch.full((count,), 99, dtype=dtype)
                        src = dist.recv(y, i, group=group, tag=5)
                        got.setdefault(group is None, {})[i] = (y, src)
        for i in range(N):
            if i == R:
                continue
            (y, src), (g, gsrc) = got[True][i], got[False][i]
            case("send_recv", equal(y, p2p_data(count, dtype, i, R), True) and equal(y, g, True) and src == gsrc == i,
                 f"{dtype} count={count} from {i}: src {src} (gloo {gsrc})")

# isend/irecv with every peer at once (receives posted after the sends, and the other way), two tags per pair
for order in ("sends first", "receives first"):
    res = {}
    for group in (None, GLOO):
        ys = {(p, tag): torch.empty(40 + p + tag) for p in range(N) if p != R for tag in (1, 2)}
        sends = [lambda p=p, tag=tag: dist.isend(p2p_data(40 + R + tag, torch.float32, R, p, tag), p, group=group,
                                                 tag=tag) for p in range(N) if p != R for tag in (1, 2)]
        recvs = [lambda p=p, tag=tag: dist.irecv(ys[(p, tag)], p, group=group, tag=tag)
                 for p in range(N) if p != R for tag in (1, 2)]
        works = [f() for f in (sends + recvs if order == "sends first" else recvs + sends)]
        for w in reversed(works):  # wait in another order than issued
            w.wait()
        res[group is None] = ys
    for (p, tag), y in res[True].items():
        case("isend_irecv", equal(y, p2p_data(40 + p + tag, torch.float32, p, R, tag), True)
             and equal(y, res[False][(p, tag)], True), f"{order}: from {p} tag {tag}")

# recv from any source: rank 0 hears from everyone, in whatever order they arrive; the sender is reported
for group in (None, GLOO):
    if R == 0:
        seen = []
        for _ in range(N - 1):
            y = torch.empty(3, dtype=torch.int64)
            src = dist.recv(y, group=group, tag=9)
            seen.append(src)
            case("recv_anysource", equal(y, torch.full((3,), src, dtype=torch.int64), True), f"from {src}: {y}")
        case("recv_anysource", sorted(seen) == list(range(1, N)), f"senders {seen}")
        w = dist.irecv(torch.empty(2), group=group, tag=10)  # irecv with no source: the Work's source rank
        w.wait()
        case("recv_anysource", w._source_rank() == N - 1, f"irecv from any source: source {w._source_rank()}")
    else:
        dist.send(torch.full((3,), R, dtype=torch.int64), 0, group=group, tag=9)
        if R == N - 1:
            dist.send(torch.ones(2), 0, group=group, tag=10)

# batch_isend_irecv: a ring exchange both ways (pipeline parallelism's pattern), sizes 1 and multi-segment
sent0 = comm.traffic().bytes_sent("send")
for count in (1, 4099, 100003):
    res = {}
    for group in (None, GLOO):
        nxt, prv = (R + 1) % N, (R - 1) % N
        from_prv, from_nxt = torch.empty(count), torch.empty(count)
        ops = [dist.P2POp(dist.irecv, from_prv, prv, group=group, tag=3),
               dist.P2POp(dist.isend, p2p_data(count, torch.float32, R, nxt), nxt, group=group, tag=3),
               dist.P2POp(dist.isend, p2p_data(count, torch.float32, R, prv, 1), prv, group=group, tag=4),
               dist.P2POp(dist.irecv, from_nxt, nxt, group=group, tag=4)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        res[group is None] = (from_prv, from_nxt)
    a, b = res[True]
    case("batch_isend_irecv", equal(a, p2p_data(count, torch.float32, prv, R), True)
         and equal(b, p2p_data(count, torch.float32, nxt, R, 1), True)
         and equal(a, res[False][0], True) and equal(b, res[False][1], True), f"ring exchange count={count}")
sent = comm.traffic().bytes_sent("send") - sent0
case("ledger", sent == 2 * 4 * (1 + 4099 + 100003), f"batch_isend_irecv: {sent} B on 'send' in the ledger")

# non-contiguous receive, a send of a tensor that requires grad, complex
x = torch.nn.Parameter(torch.arange(12, dtype=torch.float32) * (R + 1))
y = torch.zeros(4, 3).t()  # not contiguous
z = torch.tensor([1 + 2j, -3j], dtype=torch.complex64) * (R + 1)
zr = torch.empty(2, dtype=torch.complex64)
ws = [dist.isend(x, (R + 1) % N), dist.irecv(y, (R - 1) % N), dist.isend(z, (R + 1) % N, tag=1),
      dist.irecv(zr, (R - 1) % N, tag=1)]
for w in ws:
    w.wait()
want = (torch.arange(12, dtype=torch.float32) * ((R - 1) % N + 1)).reshape(3, 4)
case("send_recv", equal(y, want, True), f"non-contiguous receive: {y}")
case("send_recv", equal(zr, torch.tensor([1 + 2j, -3j], dtype=torch.complex64) * ((R - 1) % N + 1), True),
     f"complex: {zr}")
# float8 (no engine type: its bytes travel, as over gloo) and bool, a 0-d tensor too, against gloo
for group in (None, GLOO):
    f8 = (torch.arange(5, dtype=torch.float32) - R).to(torch.float8_e4m3fn)
    f8r, b0r = torch.empty(5, dtype=torch.float8_e4m3fn), torch.tensor(False)
    ws = [dist.isend(f8, (R + 1) % N, group=group, tag=2), dist.irecv(f8r, (R - 1) % N, group=group, tag=2),
          dist.isend(torch.tensor(R % 2 == 0), (R + 1) % N, group=group, tag=3),
          dist.irecv(b0r, (R - 1) % N, group=group, tag=3)]
    for w in ws:
        w.wait()
    want8 = (torch.arange(5, dtype=torch.float32) - (R - 1) % N).to(torch.float8_e4m3fn)
    case("send_recv", torch.equal(f8r.view(torch.uint8), want8.view(torch.uint8)) and
         bool(b0r) == ((R - 1) % N % 2 == 0), f"float8 {f8r} and bool {b0r} over {'gloo' if group else 'ringcomm'}")

# a receive of the wrong size: an error on the receiver within the deadline, not an overrun
bad_p2p = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=3))
t0 = time.monotonic()
if R in (0, 1):
    y = torch.full((6,), -1.0)
    try:
        if R == 0:
            dist.send(torch.ones(5), 1, group=bad_p2p)
        else:
            dist.recv(y[:4], 0, group=bad_p2p)
        case("errors", R == 0, "p2p size mismatch not detected on the receiver")
    except (ringcomm.MismatchError, ringcomm.CommunicatorAborted, ringcomm.CollectiveTimeout) as exc:
        case("errors", time.monotonic() - t0 < 3.0 and (R == 0 or isinstance(exc, ringcomm.MismatchError)) and
             bool((y == -1).all()), f"p2p size mismatch: {type(exc).__name__}: {exc}; receive buffer {y}")
dist.barrier(group=GLOO)

# ---- a subgroup (new_group with a subset of ranks)
sub_ranks = list(range(0, N, 2)) if N > 2 else [0, 1]
sub = dist.new_group(sub_ranks, backend="ringcomm")
if R in sub_ranks:
    x = torch.ones(10) * (R + 1)
    dist.all_reduce(x, group=sub)
    case("subgroup", equal(x, torch.ones(10) * sum(r + 1 for r in sub_ranks), True), f"ranks {sub_ranks}")


# ---- DDP: same parameters over "ringcomm" and over gloo
def train_ddp(group, dtype=torch.float32, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).to(dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.002)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + R)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen).to(dtype)
        ddp(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


a = train_ddp(None)
b = train_ddp(GLOO)
diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
case("ddp", diff == 0.0 if N == 2 else diff < 1e-6, f"float32 max |ringcomm - gloo| = {diff}")
ddp_diff = diff

# The ledger saw exactly the gradients DDP all-reduced in one step.
comm = rt.communicator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
comm.reset_traffic()
ddp(torch.randn(8, 16)).sum().backward()
numel = sum(p.numel() for p in model.parameters())
sent = comm.traffic().bytes_sent("all_reduce")
algo = comm.last_algorithm  # DDP's one bucket: what algorithm="auto" chose for its size
want = ringcomm.traffic.expected("all_reduce", numel, "float32", N, R, algorithm=algo).bytes_sent
case("ledger", sent == want, f"DDP step ({algo}): ledger {sent} B, expected {want} B for {numel} float32")
ledger_line = f"{sent} B sent for {numel} float32 gradients (expected {want})"


# ---- FSDP2 (fully_shard): float32, bf16 and fp16 mixed precision, vs gloo
def train_fsdp(group, mp=None, steps=3):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    kw = {"mesh": mesh}
    if mp is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp, reduce_dtype=mp)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(200 + R)
    for _ in range(steps):
        model(torch.randn(6, 16, generator=gen)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


fsdp_diffs = {}
for mp in (None, torch.bfloat16, torch.float16):
    a = train_fsdp(None, mp)
    b = train_fsdp(GLOO, mp)
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    label = {None: "float32", torch.bfloat16: "bf16", torch.float16: "fp16"}[mp]
    fsdp_diffs[label] = diff
    # Ring and gloo add in different orders for N > 2; 16-bit gradients round
    # differently then (bf16 keeps 8 bits of mantissa, fp16 11).
    tol = 0.0 if (N == 2 and mp is None) else {None: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}[mp]
    case("fsdp2", diff <= tol, f"{label}: max |ringcomm - gloo| = {diff} (tolerance {tol})")

# ---- errors reach the caller: a count mismatch, a rank that never joins
bad = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=3))
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(10 + (R == 1)), group=bad)
    case("errors", False, "count mismatch not detected")
except ringcomm.MismatchError as exc:
    case("errors", time.monotonic() - t0 < 3.0 and "count=10" in str(exc), f"mismatch: {exc}")
late = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=1))
t0 = time.monotonic()
if R != N - 1:
    try:
        w = dist.all_reduce(torch.ones(10), group=late, async_op=True)
        w.wait()
        case("errors", False, "missing rank not detected")
    except (ringcomm.CollectiveTimeout, ringcomm.CommunicatorAborted) as exc:
        case("errors", time.monotonic() - t0 < 3.0, f"never-joining rank: {type(exc).__name__} after "
             f"{time.monotonic() - t0:.1f} s")
dist.barrier(group=GLOO)

print("RESULT " + json.dumps({"rank": R, "counts": counts, "fails": fails[:40], "ddp_diff": ddp_diff,
                              "fsdp_diffs": fsdp_diffs, "ledger": ledger_line,
                              "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}}),
      flush=True)
dist.destroy_process_group()
sys.exit(0)

"""Data-parallel training of a numpy MLP with a hand-written backward and ringcomm.GradBucketer.

    ringcomm run -n 4 python examples/numpy_mlp.py          # any N dividing the global batch (64)

Dataset: scikit-learn's digits (8x8 images, 10 classes; ``pip install scikit-learn``).

Each rank takes its slice of every global batch, computes its mean-loss
gradient layer by layer from the top (the order backward produces them),
writes each gradient straight into the bucketer's view of it and calls
mark_ready, so a bucket's all_reduce starts while lower layers are still being
differentiated. finalize() leaves the average over ranks, which is the gradient
of the mean loss over the global batch. The script checks, on every rank:

1. N ranks with averaged gradients == one process on the global batch
   (max |difference| of the parameters after training, float64: round-off only);
2. summing instead of averaging == an N times larger learning rate
   (sum with lr/N == average with lr, exactly up to round-off; and sum with lr
   diverges from average with lr, tracking single-process training with N*lr).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # N processes on a small machine: one BLAS thread each

import numpy as np  # noqa: E402

import ringcomm  # noqa: E402

GLOBAL_BATCH, HIDDEN, STEPS, LR = 64, 64, 150, 0.1


def load_digits():
    from sklearn.datasets import load_digits as _load
    d = _load()
    x = (d.data / 16.0).astype(np.float64)
    x -= x.mean(axis=0)
    return x, d.target.astype(np.int64)


def init_params(n_in, n_hidden, n_out):
    rng = np.random.default_rng(0)  # same on every rank; broadcast_parameters makes sure anyway
    return [rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_hidden)), np.zeros(n_hidden),
            rng.normal(0, 1 / np.sqrt(n_hidden), (n_hidden, n_out)), np.zeros(n_out)]


def forward(params, x):
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return h, p


def backward(params, x, y, grads, ready):
    """Gradients of the mean cross-entropy over this batch, written into `grads`
    (the bucketer's views) top layer first; ready(i) is called as each is final."""
    w1, b1, w2, b2 = params
    h, p = forward(params, x)
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    np.matmul(h.T, d, out=grads[2]); ready(2)       # dL/dW2
    np.sum(d, axis=0, out=grads[3]); ready(3)       # dL/db2
    dh = (d @ w2.T) * (1 - h * h)
    np.matmul(x.T, dh, out=grads[0]); ready(0)      # dL/dW1
    np.sum(dh, axis=0, out=grads[1]); ready(1)      # dL/db1


def train(comm, x, y, lr, average=True, steps=STEPS):
    """Data-parallel SGD: rank r takes rows [r*B/N, (r+1)*B/N) of each global batch."""
    n, rank = comm.size, comm.rank
    params = init_params(x.shape[1], HIDDEN, 10)
    ringcomm.broadcast_parameters(params, comm, root=0)
    bucketer = ringcomm.GradBucketer(params, comm, bucket_cap_mb=0.01, first_bucket_mb=0.001,
                                     names=["W1", "b1", "W2", "b2"], average=average)
    local = GLOBAL_BATCH // n
    for step in range(steps):
        rows = (np.arange(GLOBAL_BATCH) + step * GLOBAL_BATCH) % len(x)
        mine = rows[rank * local:(rank + 1) * local]
        grads = bucketer.grad_views()
        backward(params, x[mine], y[mine], grads, bucketer.mark_ready)
        grads = bucketer.finalize()
        for p, g in zip(params, grads):
            p -= lr * g
    return params, bucketer


def train_single(x, y, lr, steps=STEPS):
    """The reference: one process, the whole global batch, no communication."""
    params = init_params(x.shape[1], HIDDEN, 10)
    grads = [np.empty_like(p) for p in params]
    for step in range(steps):
        rows = (np.arange(GLOBAL_BATCH) + step * GLOBAL_BATCH) % len(x)
        backward(params, x[rows], y[rows], grads, lambda i: None)
        for p, g in zip(params, grads):
            p -= lr * g
    return params


def max_diff(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def accuracy(params, x, y):
    return float((forward(params, x)[1].argmax(axis=1) == y).mean())


def main():
    comm = ringcomm.init()
    n, rank = comm.size, comm.rank
    if GLOBAL_BATCH % n:
        raise SystemExit(f"the global batch ({GLOBAL_BATCH}) must be divisible by the number of ranks ({n})")
    x, y = load_digits()
    out = print if rank == 0 else (lambda *a, **k: None)
    out(f"digits: {len(x)} samples x {x.shape[1]} features, 10 classes; MLP 64-{HIDDEN}-10 (float64); "
        f"global batch {GLOBAL_BATCH} = {n} ranks x {GLOBAL_BATCH // n}; {STEPS} SGD steps")

    # 1. Averaged gradients == one process on the global batch.
    avg, bucketer = train(comm, x, y, LR)
    single = train_single(x, y, LR)
    d1 = max_diff(avg, single)
    ringcomm.check_consistency(avg, comm)  # raises, naming the rank, if any rank diverged
    out(f"\n[1] {n} ranks, averaged gradients, lr={LR}  vs  1 process on the global batch, lr={LR}")
    out(f"    max |param difference| = {d1:.2e}   (train accuracy {accuracy(avg, x, y):.4f} "
        f"vs {accuracy(single, x, y):.4f})")
    out(f"    buckets: {[(b.params, b.nbytes) for b in bucketer.buckets]} "
        f"(parameter indices in launch order, bytes)")

    # 2. Summing instead of averaging == an N times larger learning rate.
    summed_small, _ = train(comm, x, y, LR / n, average=False)
    summed, _ = train(comm, x, y, LR, average=False)
    single_big = train_single(x, y, LR * n)
    d2, d3, d4 = max_diff(summed_small, avg), max_diff(summed, avg), max_diff(summed, single_big)
    out("\n[2] sum instead of average:")
    out(f"    sum, lr={LR / n:g}  vs  average, lr={LR:g}:   max |param difference| = {d2:.2e}")
    out(f"    sum, lr={LR:g}  vs  average, lr={LR:g}:   max |param difference| = {d3:.2e}")
    out(f"    sum, lr={LR:g}  vs  1 process, lr={LR * n:g}:  max |param difference| = {d4:.2e}")
    out(f"    first-step update size |dW2|: average {LR * first_step_norm(comm, x, y, True):.4e}, "
        f"sum {LR * first_step_norm(comm, x, y, False):.4e} (ratio = N = {n})")
    ok = d1 < 1e-10 and d2 < 1e-10 and d4 < 1e-10 and (n == 1 or d3 > 1e-3)
    out("\nOK" if ok else "\nFAILED")
    comm.close()
    raise SystemExit(0 if ok else 1)


def first_step_norm(comm, x, y, average):
    """Norm of the reduced W2 gradient at the first step (sum is N x the average)."""
    _, b = train(comm, x, y, 0.0, average=average, steps=1)
    return float(np.linalg.norm(b.grad_views()[2]))


if __name__ == "__main__":
    main()

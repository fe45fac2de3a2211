"""The README's Python code blocks, run and held to what their comments promise,
so the README cannot drift from the code.

* A block whose first comment says ``run with:  ringcomm run -n N python
  NAME.py`` is written to NAME.py in a folder outside the checkout and run
  under ``ringcomm run -n N`` (real Open MPI), as a reader would.
* A complete program (no undefined names) runs in this process.
* A fragment (``params``, ``model``, a GPU) cannot run here: it must compile,
  and every ``ringcomm.*`` name it uses, and every method it calls on an
  object made by a ringcomm class, must exist.

The numbers and names their comments promise are read from the comments
themselves (``= 48``, ``arange(8) * 10``, ``recursive_doubling``, ...), so a
comment changed without the code (or the reverse) fails here.
"""

import ast
import builtins
import glob
import importlib
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import ringcomm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RUN_WITH = re.compile(r"(?:run with|or):\s+ringcomm run -n (\d+) python (\S+\.py)")
TORCHRUN_WITH = re.compile(r"run with:\s+torchrun --standalone --nproc-per-node (\d+) (\S+\.py)")


def blocks() -> list[tuple[str, str]]:
    """(heading, code) of every ```python block, in order."""
    out, heading, code = [], "", None
    for line in open(README, encoding="utf-8").read().splitlines():
        if code is not None:
            if line.startswith("```"):
                out.append((heading, "\n".join(code) + "\n"))
                code = None
            else:
                code.append(line)
        elif line.startswith("#"):
            heading = line.lstrip("# ").strip()
        elif line.strip() == "```python":
            code = []
    return out


BLOCKS = blocks()


def block(heading: str) -> str:
    found = [c for h, c in BLOCKS if h == heading]
    assert len(found) == 1, f"README section {heading!r}: {len(found)} python blocks"
    return found[0]


def comment_of(code: str, needle: str) -> str:
    """The comment on the line that contains `needle`."""
    lines = [l for l in code.splitlines() if needle in l and "#" in l]
    assert lines, f"no commented line with {needle!r}"
    return lines[0].split("#", 1)[1].strip()


def undefined_names(code: str) -> set[str]:
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.arg)):
            bound.add(node.name if isinstance(node, ast.FunctionDef) else node.arg)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def test_the_readme_has_the_blocks_this_test_knows():
    headings = [h for h, _ in BLOCKS]
    assert headings == ["Ten lines over MPI", "Without MPI: ranks as threads",
                        "Training: bucketed gradient synchronisation", "Use from PyTorch",
                        "Sharded training: ZeRO-1/2/3", "GPU"], headings
    for _, code in BLOCKS:
        compile(code, "README.md", "exec")


def run_under_mpi(code: str, tmp_path) -> tuple[int, str, subprocess.CompletedProcess]:
    m = RUN_WITH.search(code)
    assert m, "the block names no `run with: ringcomm run -n N python NAME.py`"
    n, name = int(m.group(1)), m.group(2)
    (tmp_path / name).write_text(code)
    res = subprocess.run([sys.executable, "-m", "ringcomm.cli", "run", "-n", str(n), "--", "python", name],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))  # auto: the built-in constants
    assert res.returncode == 0, res.stdout + res.stderr
    return n, name, res


def test_ten_lines_over_mpi(tmp_path):
    code = block("Ten lines over MPI")
    n, _, res = run_under_mpi(code, tmp_path)
    lines = res.stdout.splitlines()
    # print(comm.rank, x)  -- "every rank: arange(8) * 10"
    promise = comment_of(code, "print(comm.rank, x)").split("every rank:")[1].strip()
    want = eval(promise, {"arange": np.arange})  # noqa: S307 - the README's own expression
    rows = [l for l in lines if re.match(r"^\d+ \[", l)]
    assert sorted(int(l.split()[0]) for l in rows) == list(range(n)), res.stdout
    for l in rows:
        got = np.array(l.split("[", 1)[1].rstrip("]").split(), dtype=np.float64)
        np.testing.assert_array_equal(got, want)
    # print(comm.traffic().bytes_sent("all_reduce"))  -- "the ring: 2(n-1)/n * x.nbytes = 48"
    c = comment_of(code, "bytes_sent")
    assert "ring" in c and 'algorithm="ring"' in code
    promised = int(re.search(r"= (\d+)$", c).group(1))
    assert promised == 2 * (n - 1) * 8 * 4 // n  # the formula in the comment, at this n
    sent = [int(l) for l in lines if l.strip().isdigit()]
    assert sent == [promised] * n, res.stdout
    # print(comm.last_algorithm)  -- "shm_flat (one host, 8 elements: one sync)"
    algo = comment_of(code, "print(comm.last_algorithm)").split()[0]
    ran = [l for l in lines if l in ringcomm.vocab.ALGORITHMS]
    assert ran == [algo] * n, res.stdout
    assert "1 rank" not in res.stderr  # no singleton notice under ringcomm run


def test_without_mpi_ranks_as_threads(capsys):
    code = block("Without MPI: ranks as threads")
    assert not undefined_names(code)
    printed = []
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__", "print": lambda *a: printed.append(a)})
    (result,), = printed
    n = 4
    assert f"run_local({n}" in code and "(0+1+2+3)/4 = 1.5" in comment_of(code, 'op="avg"')
    full = n * np.arange(10.0)                                 # "chunk `rank` of 4*arange(10)"
    for rank, (g0, shard, gathered) in enumerate(result):
        assert g0 == 1.5
        np.testing.assert_array_equal(shard, np.array_split(full, n)[rank])
        np.testing.assert_array_equal(gathered, full)      # "back to the full 4*arange(10)"


def resolve(dotted: str):
    obj = importlib.import_module(dotted.split(".")[0])
    for i, part in enumerate(dotted.split(".")[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(dotted.split(".")[:i + 1]))
    return obj


def names_exist(code: str) -> list[str]:
    """Every ringcomm.* chain the code (or a comment of it) uses, and every
    method it calls on a variable assigned from a ringcomm class or init(),
    resolved; returns them."""
    tree = ast.parse(code)
    checked, kinds = [], {}

    def dotted(node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            return ".".join([node.id] + parts[::-1])
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            target = node.targets[0]
            d = dotted(node.value.func)
            if isinstance(target, ast.Name) and d and d.startswith("ringcomm."):
                made = resolve(d)
                kinds[target.id] = ringcomm.Communicator if d == "ringcomm.init" else made
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.value, ast.Attribute):
            d = dotted(node)
            if d and d.startswith("ringcomm."):
                resolve(d)
                checked.append(d)
            elif d and d.split(".")[0] in kinds and isinstance(kinds[d.split(".")[0]], type):
                cls = kinds[d.split(".")[0]]
                assert hasattr(cls, node.attr), f"{cls.__name__} has no {node.attr!r}"
                checked.append(f"{cls.__name__}.{node.attr}")
        elif isinstance(node, ast.Attribute):
            d = dotted(node)
            if d and d.startswith("ringcomm."):
                resolve(d)
                checked.append(d)
    for line in code.splitlines():  # and the names its comments mention
        if "#" in line:
            for d in re.findall(r"\bringcomm(?:\.\w+)+", line.split("#", 1)[1]):
                resolve(d)
                checked.append(d)
    return checked


def test_bucketer_fragment_names_exist():
    code = block("Training: bucketed gradient synchronisation")
    assert undefined_names(code) == {"ringcomm", "params", "comm", "compute_grad", "steps"}
    got = names_exist(code)
    for name in ("GradBucketer.grad_views", "GradBucketer.mark_ready", "GradBucketer.finalize"):
        assert name in got


@pytest.mark.parametrize("family", ["numpy", "torch"])
@pytest.mark.parametrize("n", [2, 3])
def test_bucketer_fragment_runs_with_what_the_readme_says_params_is(family, n):
    # "params is the list of the model's parameters: numpy arrays (or torch
    # tensors)"; "grads hold the average over ranks" after every step, read
    # through the very `grads` the fragment holds, with sizes that make
    # several buckets at 4 MiB. (Its ready order is the default one, so its
    # buckets are not rebuilt: tests/test_held_views.py covers rebuilds.)
    if family == "torch":
        pytest.importorskip("torch")
        import torch
    code = block("Training: bucketed gradient synchronisation")
    shapes = [(5,), (2, 3), (1_100_000,), (7,), (600_000,), (1,)]
    steps = 6

    def compute(rank, step, i):
        k = int(np.prod(shapes[i]))
        return ((rank + 1) * ((np.arange(k) % 5) + i + step)).reshape(shapes[i]).astype(np.float32)

    def rank(comm):
        params = [np.zeros(s, np.float32) if family == "numpy" else torch.zeros(s) for s in shapes]
        seen = []

        class Recording(ringcomm.GradBucketer):
            def finalize(self):
                out = super().finalize()
                seen.append([np.array(g.numpy() if family == "torch" else g) for g in ns["grads"]])
                return out

        as_family = (lambda a: a) if family == "numpy" else torch.from_numpy
        proxy = type("ringcomm", (), {"GradBucketer": Recording})
        ns = {"ringcomm": proxy, "params": params, "comm": comm, "steps": steps,
              "compute_grad": lambda step, i: as_family(compute(comm.rank, step, i))}
        exec(compile(code, "README.md", "exec"), ns)  # noqa: S102
        return seen

    for r, seen in enumerate(ringcomm.run_local(n, rank)):
        assert len(seen) == steps
        for step, grads in enumerate(seen):
            for i, g in enumerate(grads):
                want = sum(compute(q, step, i) for q in range(n)) / n
                bad = np.flatnonzero(g.reshape(-1) != want.reshape(-1))
                assert bad.size == 0, f"rank {r}, step {step}, parameter {i}, index {bad[:1]}: " \
                    f"{g.reshape(-1)[bad[:1]]} != {want.reshape(-1)[bad[:1]]}"


def test_zero_and_gpu_fragments_names_exist():
    got = names_exist(block("Sharded training: ZeRO-1/2/3"))
    assert {"ringcomm.zero.TorchZero", "TorchZero.step", "TorchZero.save", "ringcomm.zero.consolidate"} <= set(got)
    got = names_exist(block("GPU"))
    assert {"ringcomm.init", "ringcomm.run_local", "Communicator.all_reduce"} <= set(got)


def test_use_from_pytorch(tmp_path):
    pytest.importorskip("torch")  # the [test] extra installs it; [quicktest] does not
    code = block("Use from PyTorch")
    n, _, res = run_under_mpi(code, tmp_path)
    moved = [int(l) for l in res.stdout.splitlines() if l.strip().isdigit()]
    assert len(moved) == n and len(set(moved)) == 1, res.stdout
    # "what DDP moved": 10 steps of one all_reduce bucket of Linear(32, 4)'s 132 float32, at least
    # the ring's 2(n-1)/n of it per step
    assert moved[0] >= 10 * 2 * (n - 1) * 132 * 4 // n
    # the same block under torchrun, its first launcher: the store bootstrap
    m = TORCHRUN_WITH.search(code)
    assert m, "the block names no `run with: torchrun --standalone --nproc-per-node N NAME.py`"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    with tempfile.TemporaryDirectory() as logs:
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={m.group(1)}", f"--log-dir={logs}", "--redirects=1", m.group(2)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        out = "".join(open(f).read() for f in glob.glob(os.path.join(logs, "**", "stdout.log"), recursive=True))
    assert res.returncode == 0, out + res.stderr[-3000:]
    moved_tr = [int(l) for l in out.splitlines() if l.strip().isdigit()]
    assert len(moved_tr) == int(m.group(1)) and moved_tr[0] >= 10 * 2 * (int(m.group(1)) - 1) * 132 * 4 // int(
        m.group(1)), out

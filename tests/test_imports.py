"""ringcomm's modules import each other in one direction only: the graph of
imports between them, read from the source (imports inside functions
included, since a lazy import still ties two modules together), has no cycle."""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = ("_core", "_cuda")  # setup.py's extension modules


def module_files(pkg_dir: str) -> dict[str, str]:
    """{dotted module name: path} for every .py under pkg_dir (a package), and
    its compiled extension modules (leaves: they import nothing of ours)."""
    top = os.path.basename(os.path.normpath(pkg_dir))
    out = {}
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, pkg_dir)
        parts = [top] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(filenames):
            if f.endswith(".py"):
                name = parts if f == "__init__.py" else parts + [f[:-3]]
                out[".".join(name)] = os.path.join(dirpath, f)
            elif f.endswith((".so", ".pyd")):
                out[".".join(parts + [f.split(".")[0]])] = os.path.join(dirpath, f)
    if top == "ringcomm":  # the extensions setup.py builds are leaves even where one was not built
        for ext in NATIVE:
            out.setdefault(f"{top}.{ext}", os.path.join(pkg_dir, ext + ".so"))
    return out


def import_graph(pkg_dir: str) -> dict[str, dict[str, int]]:
    """{module: {imported module: line of the first such import}}, for imports
    between the package's own modules: `from . import x`, `from .x import y`,
    `from .. import x`, `import pkg.x`, `from pkg.x import y`, at any depth of
    the file (functions, methods, try blocks). `from .x import y` where y is a
    submodule counts as importing it; a name that is not a submodule counts
    as importing the package that defines it."""
    files = module_files(pkg_dir)
    top = os.path.basename(os.path.normpath(pkg_dir))
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    sources = {m: p for m, p in files.items() if p.endswith(".py")}

    def add(src, dst, line):
        if dst != src and (dst == top or dst.startswith(top + ".")):
            graph[src].setdefault(dst, line)

    for mod, path in sources.items():
        is_pkg = path.endswith("__init__.py")
        package = mod if is_pkg else mod.rpartition(".")[0]
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    # the deepest module of a dotted name that exists (pkg.mod.attr never appears here)
                    while name and name not in files and "." in name:
                        name = name.rpartition(".")[0]
                    add(mod, name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    if node.level > 1:
                        base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts)
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                if not (target == top or target.startswith(top + ".")):
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in files:
                        add(mod, f"{target}.{alias.name}", node.lineno)
                if node.module or any(f"{target}.{a.name}" not in files for a in node.names):
                    add(mod, target, node.lineno)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle [a, b, ..., a] of the graph, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m):
        color[m] = GREY
        stack.append(m)
        for d in sorted(graph.get(m, {})):
            if color.get(d, BLACK) == GREY:
                return stack[stack.index(d):] + [d]
            if color.get(d) == WHITE:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def describe(graph, files, cycle) -> str:
    steps = [f"  {a} -> {b}  ({os.path.relpath(files[a], ROOT)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle among ringcomm's modules:\n" + "\n".join(steps)


def test_ringcomm_modules_import_without_cycles():
    pkg = os.path.join(ROOT, "ringcomm")
    graph = import_graph(pkg)
    # the walk sees the package's modules and their imports, lazy ones included
    assert "ringcomm.comm" in graph and "ringcomm.cli" in graph and "ringcomm.benchmark" in graph
    assert "ringcomm.door" in graph["ringcomm.comm"] and "ringcomm._arrays" in graph["ringcomm.door"]
    assert "ringcomm.flight" in graph["ringcomm.comm"]  # imported inside a method
    cycle = find_cycle(graph)
    assert cycle is None, describe(graph, module_files(pkg), cycle)


def test_every_subpackage_is_installed():
    """pyproject.toml lists the packages explicitly: a new subpackage of
    ringcomm must be named there, or `pip install .` leaves it out."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    pkgs = {m for m, p in module_files(os.path.join(ROOT, "ringcomm")).items() if p.endswith("__init__.py")}
    assert pkgs <= listed, f"add {sorted(pkgs - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_the_check_sees_lazy_and_relative_cycles(tmp_path):
    """The checker itself: a cycle closed by an import inside a function, and
    one through `from .. import` in a subpackage, are both found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from .a import g\n",
        "c.py": "import pkg.sub.d\n",
        "sub/__init__.py": "",
        "sub/d.py": "def f():\n    from .. import c\n",
        "e.py": "from .sub import d\nimport os\nfrom json import dumps\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    graph = import_graph(str(pkg))
    assert graph["pkg.a"] == {"pkg.b": 1} and graph["pkg.b"] == {"pkg.a": 2}
    assert graph["pkg.c"] == {"pkg.sub.d": 1} and graph["pkg.sub.d"] == {"pkg.c": 2}
    assert graph["pkg.e"] == {"pkg.sub.d": 1, "pkg.sub": 1}
    cycle = find_cycle(graph)
    assert cycle in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.c", "pkg.sub.d", "pkg.c"])
    (pkg / "b.py").write_text("x = 1\n")
    (pkg / "c.py").write_text("x = 1\n")
    assert find_cycle(import_graph(str(pkg))) is None


# The layers, bottom up (shared/DESIGN.md): the core (vocabulary, arrays, the
# door, the communicator and the worlds that make it, ledgers, traces) never
# imports a wing; training is framework-neutral (never imports the torch
# wing); teaching and benchmarks sit on top. A wing may import the core and
# the wings listed below it here.
WINGS = {  # wing: the wings it may import
    "ringcomm.tuning": set(),
    "ringcomm.train": set(),
    "ringcomm.torch": {"ringcomm.train"},
    "ringcomm.teach": {"ringcomm.train", "ringcomm.tuning"},
    "ringcomm.benchmark": {"ringcomm.tuning", "ringcomm.torch"},
}
# Core modules that reach a wing, and why (each one lazily, inside a function).
CORE_EXCEPTIONS = {
    ("ringcomm.world", "ringcomm.tuning"): "init/run_local give every communicator the cost model of auto",
    ("ringcomm.comm", "ringcomm.tuning"): "Communicator.set_costs turns a model into the engine's limits",
    ("ringcomm.shm.window", "ringcomm.tuning"): "the hierarchical path's engine between hosts gets auto's cost model too",
    ("ringcomm.zero", "ringcomm.train"): "the public face of ZeRO (ringcomm.zero) names train.zero_optimizer's API",
    ("ringcomm.zero", "ringcomm.torch"): "... and torch.torch_zero's TorchZero, on demand",
    ("ringcomm.cli", "ringcomm.tuning"): "the command line starts tune, info",
    ("ringcomm.cli", "ringcomm.teach"): "... and demo",
    ("ringcomm.cli", "ringcomm.benchmark"): "... and bench",
    ("ringcomm", "ringcomm.train"): "the package exports GradBucketer, broadcast_parameters, check_consistency",
}


def _wing(mod: str) -> str | None:
    return next((w for w in WINGS if mod == w or mod.startswith(w + ".")), None)


def test_arrows_point_down_the_layers():
    graph = import_graph(os.path.join(ROOT, "ringcomm"))
    wrong = []
    for src, dsts in graph.items():
        for dst, line in dsts.items():
            ws, wd = _wing(src), _wing(dst)
            if wd is None or ws == wd:
                continue
            allowed = wd in WINGS[ws] if ws is not None else (src, wd) in CORE_EXCEPTIONS
            if not allowed:
                wrong.append(f"{src} -> {dst} (line {line})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_module_imports_another_modules_private_names():
    """`from .x import _name` ties a module to another's internals: what
    modules share is a public name (the leading underscore of a private
    *module*, like _arrays or _native, is fine: it is private to the package)."""
    wrong = []
    for mod, path in module_files(os.path.join(ROOT, "ringcomm")).items():
        if not path.endswith(".py"):
            continue
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and \
                            alias.name not in NATIVE and alias.name not in (
                                "_arrays", "_native", "_cuda_native", "_failfast", "_singleton"):
                        wrong.append(f"{mod}:{node.lineno} imports {alias.name} from {node.module or '.'}")
    assert not wrong, "\n".join(wrong)


def test_importing_ringcomm_leaves_out_what_it_does_not_need():
    """`import ringcomm` (every rank of every job does it) imports neither
    torch nor ml_dtypes (its import took 0.9-1.6 s here: ringcomm.vocab);
    bfloat16 still works, importing ml_dtypes on first use."""
    code = ("import sys, ringcomm, numpy as np; from ringcomm import vocab; "
            "print(sorted(m for m in ('torch', 'ml_dtypes') if m in sys.modules)); "
            "print(vocab.numpy_name(np.float32), 'bfloat16' in vocab.NUMPY, list(vocab.NUMPY) == list(vocab.DTYPES)); "
            "print(vocab.NUMPY['bfloat16'], 'ml_dtypes' in sys.modules); "
            "import ml_dtypes; print(vocab.numpy_name(ml_dtypes.bfloat16), vocab.numpy_name(ml_dtypes.float8_e4m3fn), "
            "vocab.itemsize('bfloat16'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["[]", "float32 True True", "bfloat16 True", "bfloat16 None 2"], out.stdout

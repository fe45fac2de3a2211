"""Every file path the code's comments and the docs name exists.

Files move (the Python layout of issue 21 moved ringcomm/selection.py to
ringcomm/tuning/, and comments went on naming the old place): this scans the
sources and docs for path-like mentions and fails listing each missing one as
file:line.

What counts as a mention (precise on purpose, few false positives):
* a path from the checkout's root that starts with one of ROOTS plus "/" and
  ends with a file extension or "/" (a folder): "ringcomm/tuning/tune.py",
  "bench/results/", not "ringcomm/gloo" (a comparison) or a store key like
  "ringcomm/comm{use}";
* a path from csrc/ as the native code includes it: one of CSRC_DIRS, "/",
  a C++ or CUDA source or header name ("core/link.h" is csrc/core/link.h);
* not part of a longer path ("/tmp/ringcomm/x.py", "~/.cache/ringcomm/..",
  URLs, "$VAR/tests/..." are not mentions of the checkout's files).
Brace expansions ("run{1,2}.{txt,json}") name each expansion; a "*" is a glob
that must match something; a brace without a comma ("{name}.py") is a
template and names nothing.
"""

import glob
import itertools
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCANNED = ["README.md", "csrc", "ringcomm", "docs", "bench", "tests", "examples"]
ROOTS = ["csrc", "ringcomm", "docs", "tests", "bench", "examples"]
CSRC_DIRS = ["core", "engine", "algorithms", "transports", "cuda", "python"]
TEXT = (".py", ".md", ".h", ".hpp", ".cpp", ".cc", ".cu", ".sh", ".c", ".txt", ".toml", ".cfg", ".ipynb", ".rst")

# Skipped while scanning:
NOT_SCANNED = {
    "bench/results",  # raw outputs of past runs, kept as measured (the mentions are the tools' own text)
    "tests/test_paths.py",  # this file: its docstring shows mentions as examples
}

# Mentions that are not files of the checkout, each with why:
ALLOWED = {
    "bench/out/",  # bench/ddp.py's default output folder, made when it runs (git-ignored)
}

_piece = r"(?:[\w.*/-]|\{[\w.,-]*\})"
MENTION = re.compile(
    r"(?<![\w/.~$@-])("
    + r"(?:" + "|".join(ROOTS) + r")/" + _piece + r"*"
    + r"|(?:" + "|".join(CSRC_DIRS) + r")/[\w/.-]*\.(?:h|hpp|cpp|cc|cu)(?![\w.])"
    + r")")
EXTENSION = re.compile(r"\.[A-Za-z0-9]+$")


def expand(mention: str) -> list:
    """Brace expansion: "a{1,2}.{x,y}" -> a1.x a1.y a2.x a2.y; [] for a
    template ("{name}": a brace without a comma)."""
    groups = re.findall(r"\{([^{}]*)\}", mention)
    if any("," not in g for g in groups):
        return []
    parts = re.split(r"\{[^{}]*\}", mention)
    out = []
    for choice in itertools.product(*[g.split(",") for g in groups]):
        out.append("".join(p + c for p, c in zip(parts, list(choice) + [""])))
    return out


def mentions(text: str):
    """(line number, mention, [paths it names]) of each path-like mention."""
    for i, line in enumerate(text.splitlines(), 1):
        for m in MENTION.finditer(line):
            mention = m.group(1).rstrip(".,:;")
            paths = [p for p in expand(mention) if EXTENSION.search(p) or p.endswith("/")]
            if paths:
                yield i, mention, paths


def exists(path: str) -> bool:
    first = path.split("/", 1)[0]
    base = REPO if first in ROOTS else os.path.join(REPO, "csrc")
    full = os.path.join(base, path)
    return bool(glob.glob(full)) if "*" in path else os.path.exists(full)


def scanned_files():
    for top in SCANNED:
        full = os.path.join(REPO, top)
        if os.path.isfile(full):
            yield top
            continue
        for d, dirs, files in os.walk(full):
            rel_d = os.path.relpath(d, REPO)
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and os.path.join(rel_d, x) not in NOT_SCANNED)
            for f in sorted(files):
                rel = os.path.join(rel_d, f)
                if f.endswith(TEXT) and rel not in NOT_SCANNED:
                    yield rel


def test_mentions_are_found_as_meant():
    # The rules on examples: what is a mention, what it names.
    def names(s):
        return [p for _, _, ps in mentions(s) for p in ps]
    assert names("see ringcomm/tuning/selection.py.") == ["ringcomm/tuning/selection.py"]
    assert names("`csrc/core/link.h`, core/shm_window.h and engine/engine.cpp") == [
        "csrc/core/link.h", "core/shm_window.h", "engine/engine.cpp"]
    assert names("Raw: `bench/results/colls23_n2_run{1,2}.{txt,json}`") == [
        "bench/results/colls23_n2_run1.txt", "bench/results/colls23_n2_run1.json",
        "bench/results/colls23_n2_run2.txt", "bench/results/colls23_n2_run2.json"]
    assert names("PNGs in bench/out/ and docs/") == ["bench/out/", "docs/"]
    for not_a_mention in ('f"ringcomm/comm{use}"', "ringcomm/mpi/gloo", "ratio ringcomm/mpi4py",
                          "/tmp/ringcomm/x.py", "~/.cache/ringcomm/tune.json", "$TMP/tests/a.py",
                          "https://github.com/x/ringcomm/README.md", 'f"tests/{name}.py"', "/usr/cuda/x.h",
                          "libcore/x.h", "tests/scripts"):
        assert names(not_a_mention) == [], not_a_mention
    assert exists("csrc/core/link.h") and exists("core/link.h") and exists("tests/test_*.py")
    assert not exists("ringcomm/selection.py") and not exists("tests/no_such_*.py")


def test_every_path_named_in_code_and_docs_exists():
    missing, count = [], 0
    for rel in scanned_files():
        try:
            with open(os.path.join(REPO, rel), encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        for line, mention, paths in mentions(text):
            for p in paths:
                count += 1
                if p not in ALLOWED and not exists(p):
                    where = "" if p.split("/", 1)[0] in ROOTS else f" (csrc/{p})"
                    missing.append(f"{rel}:{line}: {p}{where}" + (f" (in {mention})" if mention != p else ""))
    assert count > 300, f"only {count} mentions found: the scan is broken"
    assert not missing, f"{len(missing)} path(s) named in the code or docs do not exist:\n" + "\n".join(missing)

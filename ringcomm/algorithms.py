"""The engine's table of algorithms, as Python reads it.

One row per (collective, algorithm) the engine runs (``csrc/algorithms/
registry.h``, exported as ``_core.algorithm_table()``): where it runs
(``path``: "messages" on any transport and device, "window" in the
shared-memory window of one host's ranks, "hosts" across hosts), what a
call needs beyond that (``needs``: "pow2", "arena", "slot_table",
"ordered_hosts"), whether ``algorithm="auto"`` may pick it, whether the
engine divides avg after it, and the name of its closed form in
:mod:`ringcomm.traffic`. The door's, the tuner's and the benchmark's lists
of algorithms are lookups here, so a new row reaches them all.

Importing this module also checks that :mod:`ringcomm.vocab`'s dtype, op,
collective and algorithm codes are the native vocabulary's (they cross the
binding as numbers: a drift would run the wrong collective).
"""

from __future__ import annotations

from . import vocab
from ._native import core

__all__ = ["TABLE", "row", "names", "auto_ok", "collectives"]

TABLE: tuple[dict, ...] = tuple(core.algorithm_table())
_BY_KEY = {(r["collective"], r["algorithm"]): r for r in TABLE}


def _check_vocabulary() -> None:
    native = core.vocabulary_codes()
    for what, ours in (("dtypes", vocab.DTYPES), ("ops", vocab.OPS), ("collectives", vocab.COLLECTIVES),
                       ("algorithms", vocab.ALGORITHMS)):
        if dict(native[what]) != ours:
            raise ImportError(f"ringcomm.vocab's {what} {ours} differ from the native core's {dict(native[what])}: "
                              "rebuild the extension (python setup.py build_ext --inplace)")


_check_vocabulary()


def row(collective: str, algorithm: str) -> dict | None:
    """The table's row of (collective, algorithm), or None where the engine does not run it."""
    return _BY_KEY.get((collective, algorithm))


def names(collective: str, *, path: str | None = None, auto: bool | None = None,
          needs: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The algorithms that run `collective`, in code order; only those on
    `path`, those auto may (auto=True) or may not (False) pick, and those
    whose needs are all among `needs` (``()``: those that need nothing),
    where given."""
    return tuple(r["algorithm"] for r in TABLE
                 if r["collective"] == collective and (path is None or r["path"] == path)
                 and (auto is None or r["auto"] == auto) and (needs is None or set(r["needs"]) <= set(needs)))


def auto_ok(collective: str, algorithm: str) -> bool:
    """Whether algorithm="auto" may run `algorithm` for `collective`."""
    r = row(collective, algorithm)
    return bool(r and r["auto"])


def collectives(algorithm: str) -> tuple[str, ...]:
    """The collectives `algorithm` runs, in code order."""
    return tuple(r["collective"] for r in TABLE if r["algorithm"] == algorithm)

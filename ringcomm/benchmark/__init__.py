"""Collective benchmark in the spirit of nccl-tests: ringcomm against Open MPI and Gloo.

Run under MPI (``mpirun -n 4 python bench/collectives.py ...``) or let
``ringcomm bench [-n N] ...`` launch the ranks. Every implementation works on
the same numpy buffers in the same run; repetitions are interleaved across
implementations (round-robin, rotating the order) because shared machines
drift; every timed iteration of every implementation starts after the same
barrier, an iteration's time is the maximum over ranks, a repetition's the
mean of its iterations'; the table shows the median and the 10th/90th
percentiles over repetitions. Each size is also measured as a concurrent
memcpy (every rank copies a buffer of that size at once), the reference of
the /memcpy column; --mode hot reuses the same buffers, cold rotates them
through a pool of twice the last-level cache per rank.

Correctness is checked outside the timed loop on exactly predictable data:
``#wrong`` is the exact number of wrong elements over all ranks, and any
wrong element makes the exit status non-zero.

An implementation is a class with ``supports`` and ``run`` (see ``Impl``);
``IMPLS`` maps names to them.

Layout (imports point down this list, never up):
  cli.py      options (parser, parse), run_mpi (every rank), cli_main (`ringcomm bench`)
  report.py   rows, per-size blocks, footer, alpha-beta fits, plot, --json document and schema
  harness.py  Bench (allocate, check, time interleaved repetitions), the cold pool and the LLC,
              single-core copy bandwidth
  impls.py    Case, Impl and the implementations (ringcomm, mpi, mpi-ring, gloo, nccl, corrupt),
              MemcpyImpl (the concurrent memcpy reference)
  checks.py   collectives, ops, sizes, bus factor, exactly predictable check data
This package re-exports what other code uses (``from ringcomm.benchmark import run_mpi``).
"""

from .. import vocab  # noqa: F401
from .checks import COLLECTIVES, OPS, bus_factor, check_data, check_expected, count_for, size_list, split
from .cli import cli_main, parse, parser, run_mpi
from .harness import MODES, Bench, ColdPool, cold_pool_bytes, device_copy_gbps, llc_info, memcpy_gbps, summarize
from .impls import (
                     DEVICE_IMPLS,
                     IMPLS,
                     RING_MCA,
                     MemcpyImpl,
                     Case,
                     CorruptImpl,
                     GlooImpl,
                     Impl,
                     MpiImpl,
                     MpiRingImpl,
                     NcclImpl,
                     RingcommImpl,
)
from .report import (
                     HEADER,
                     ROW_KEYS,
                     fit_models,
                     fmt_size,
                     footer,
                     machine_info,
                     make_rows,
                     memcpy_table,
                     plot,
                     print_size_block,
                     validate_json,
)

__all__ = [
    "COLLECTIVES", "OPS", "bus_factor", "check_data", "check_expected", "count_for", "size_list", "split",
    "cli_main", "parse", "parser", "run_mpi",
    "MODES", "Bench", "ColdPool", "cold_pool_bytes", "device_copy_gbps", "llc_info", "memcpy_gbps", "summarize",
    "DEVICE_IMPLS", "IMPLS", "RING_MCA", "MemcpyImpl", "Case", "CorruptImpl", "GlooImpl", "Impl", "MpiImpl",
    "MpiRingImpl", "NcclImpl", "RingcommImpl",
    "HEADER", "ROW_KEYS", "fit_models", "fmt_size", "footer", "machine_info", "make_rows", "memcpy_table", "plot",
    "print_size_block", "validate_json",
]

"""Configuration: every knob, its environment variable and its default, in one place.

A keyword argument to :func:`ringcomm.init` / :func:`ringcomm.run_local` wins
over the environment, which wins over the default.

============================  =======  =====================================================
variable                      default  meaning
============================  =======  =====================================================
``RINGCOMM_TIMEOUT``          ``300``  seconds any blocking wait inside a collective may
                                       take before it raises CollectiveTimeout naming the
                                       peer it waited for (the communicator is then aborted)
``RINGCOMM_SEGMENT_BYTES``    ``1M``   largest message: each ring step is pipelined in
                                       segments of at most this many bytes (64 MiB on
                                       GPUs). Must be equal on all ranks (checked).
                                       Suffixes K, M, G accepted.
``RINGCOMM_WINDOW``           ``4``    receives kept in flight per ring pass (>= 2)
``RINGCOMM_DEBUG``            unset    ``1``: log every collective call (rank, sequence
                                       number, arguments) to stderr
``RINGCOMM_FLIGHT_RECORDER``  ``256``  collectives each communicator's flight recorder
                                       keeps (``0``: off); ``Communicator.flight_record()``
``RINGCOMM_DUMP_ON_ERROR``    unset    a directory: on its first error (not a bad
                                       argument) each communicator writes its flight
                                       record there as JSON (one file per rank);
                                       ``ringcomm analyze DIR`` explains them
``RINGCOMM_LIBMPI``           unset    path of libmpi to load, when it is not in
                                       <sys.prefix>/lib
============================  =======  =====================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_TIMEOUT = 300.0
DEFAULT_SEGMENT_BYTES = 1 << 20
# On a GPU each message costs the host tens of microseconds (matching, events,
# a copy enqueued on another rank's stream) while 1 MiB takes the device under
# a microsecond: the host, not the memory, then sets the pace. Measured on an
# H200, in-process N = 4 all_reduce of 256 MiB (bench/gpu_ring.py), time /
# bytes-moved bound: 4 MiB segments 7.4x, 16 MiB 2.6x, 64 MiB 1.6x, 256 MiB 1.65x.
DEFAULT_GPU_SEGMENT_BYTES = 64 << 20
DEFAULT_WINDOW = 4


def parse_size(text: str | int) -> int:
    """'64K' -> 65536, '1M' -> 1048576, '2G', or a plain integer."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    if mult != 1:
        s = s[:-1]
    try:
        value = float(s) * mult
    except ValueError:
        raise ValueError(f"not a size: {text!r} (expected e.g. 4096, 64K, 1M, 2G)") from None
    if value != int(value) or value < 0:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


MAX_TIMEOUT = 1e9  # seconds: a larger timeout (inf included) means this


@dataclass(frozen=True)
class Settings:
    timeout: float
    segment_bytes: int
    window: int
    debug: bool
    flight_records: int = 256
    dump_dir: str | None = None


def on_gpu(device) -> bool:
    """Whether a `device=` argument puts the payload in GPU memory (the
    emulated devices keep it in host memory)."""
    return device is not None and not (isinstance(device, str) and device.startswith("emulated"))


def settings(timeout: float | None = None, segment_bytes: int | str | None = None,
             window: int | None = None, gpu: bool = False) -> Settings:
    """The settings of one communicator; `gpu`: its payload is in GPU memory
    (the default segment is then DEFAULT_GPU_SEGMENT_BYTES)."""
    env = os.environ
    t = float(timeout if timeout is not None else env.get("RINGCOMM_TIMEOUT", DEFAULT_TIMEOUT))
    seg = parse_size(segment_bytes if segment_bytes is not None
                     else env.get("RINGCOMM_SEGMENT_BYTES",
                                  DEFAULT_GPU_SEGMENT_BYTES if gpu else DEFAULT_SEGMENT_BYTES))
    w = int(window if window is not None else env.get("RINGCOMM_WINDOW", DEFAULT_WINDOW))
    if not t > 0:
        raise ValueError(f"timeout must be positive, got {t}")
    # "Never" (inf, or torch's timedelta.max): the engine counts deadlines in
    # int64 nanoseconds, where anything past ~292 years wrapped and every wait
    # timed out at once ("timed out after inf s"). 1e9 s (31 years) is never.
    t = min(t, MAX_TIMEOUT)
    if not 1 <= seg <= 1 << 30:
        raise ValueError(f"segment_bytes must be between 1 and 1G, got {seg}")
    if w < 2:
        raise ValueError(f"window must be at least 2, got {w}")
    k = int(env.get("RINGCOMM_FLIGHT_RECORDER", 256))
    if k < 0:
        raise ValueError(f"RINGCOMM_FLIGHT_RECORDER must be >= 0, got {k}")
    return Settings(t, seg, w, env.get("RINGCOMM_DEBUG", "") not in ("", "0"), k,
                    env.get("RINGCOMM_DUMP_ON_ERROR") or None)

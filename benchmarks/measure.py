"""Timing statistics and memory probes.

Memory is reported two ways, both per system run:

* ``window_alloc_kib``: Python allocation peak of **one** 4,000-token window fetch,
  from ``tracemalloc`` (a separate, untimed call: tracing slows everything down).
  It shows how much a fetch materialises; allocations inside C libraries (SQLite's
  page cache, libpq buffers) are not traced.
* ``*_peak_rss_mib``: the process's resident-set high-water mark during a phase
  minus its RSS when the phase began (Linux ``VmHWM``, reset through
  ``/proc/self/clear_refs``). It includes C allocations but not memory the
  allocator had already reserved before the phase, so it is a lower bound.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MemoryPhase", "stats", "traced_peak_kib"]


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 1]) of sorted values."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


def stats(seconds: Sequence[float]) -> dict[str, Any]:
    """``n``, ``p50_ms``, ``p95_ms``, ``mean_ms``, ``min_ms``, ``max_ms``."""
    xs = sorted(s * 1000 for s in seconds)
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "p50_ms": _percentile(xs, 0.5),
        "p95_ms": _percentile(xs, 0.95),
        "mean_ms": sum(xs) / len(xs),
        "min_ms": xs[0],
        "max_ms": xs[-1],
    }


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MemoryPhase:
    """Peak RSS growth over a phase (``with MemoryPhase() as m: ...; m.peak_mib``)."""

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._start: int | None = None

    def __enter__(self) -> MemoryPhase:
        _trim()
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        self._start = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        hwm = _status_kib("VmHWM")
        if hwm is not None and self._start is not None:
            self.peak_mib = max(0, hwm - self._start) / 1024


def traced_peak_kib(fn: Callable[[], Any]) -> float:
    """Peak Python allocation (KiB) while ``fn`` runs, with ``tracemalloc``."""
    _trim()
    tracemalloc.start()
    try:
        fn()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1024

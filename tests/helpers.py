"""Helpers shared by the tests."""

from __future__ import annotations

import inspect
import os
from typing import Any

#: The whole suite: every property test at full strength and the stress tests (marked
#: ``slow``). CI sets it (``CI=true``); so can anyone: ``MEMSTORE_FULL_TESTS=1``. Without
#: it the README's test command runs the quick suite, a few minutes on two cores.
FULL = (os.environ.get("MEMSTORE_FULL_TESTS") == "1"
        or os.environ.get("CI", "").lower() == "true")

#: The quick suite runs each property test on this fraction of its examples.
QUICK_FRACTION = 4


def examples(n: int) -> int:
    """Hypothesis examples for a property test: ``n`` in the whole suite, fewer in the quick one.

    The quick run keeps at least 10 (or ``n`` when smaller), so every property is still
    exercised; CI runs all ``n``.
    """
    return n if FULL else max(min(n, 10), n // QUICK_FRACTION)


async def call(value: Any) -> Any:
    """Await ``value`` if it is awaitable: lets one test body drive both stores."""
    if inspect.isawaitable(value):
        return await value
    return value

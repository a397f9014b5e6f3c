"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from typing import Any

import pytest

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


def erasure_ways(monkeypatch: pytest.MonkeyPatch, force: str | None = None) -> list[str]:
    """The ways forget's SQLite erasure chooses from now on (`memstore._db.erasure`).

    ``force``: ``"rebuild"`` or ``"merge"`` makes every forget that deletes something
    take that way (a rebuild above a share of 0, a merge below a share of 2); ``None``
    leaves the choice as it is.
    """
    from memstore._db import erasure

    if force is not None:
        monkeypatch.setattr(erasure, "REBUILD_SHARE", 0.0 if force == "rebuild" else 2.0)
    chosen: list[str] = []
    begin = erasure.begin

    def record(*args: Any) -> Any:
        found = begin(*args)
        chosen.append(found.way)
        return found

    monkeypatch.setattr(erasure, "begin", record)
    return chosen


async def call(value: Any) -> Any:
    """Await ``value`` if it is awaitable: lets one test body drive both stores."""
    if inspect.isawaitable(value):
        return await value
    return value


class Cases:
    """The cases of a table-driven test, checked in one test on one fixture.

    For many independent inputs against the same store: building the store once per input
    cost more than checking it. Each case runs in ``with cases.case(name):``; a case that
    fails (an assertion, ``pytest.raises`` not raising, any exception) is recorded under
    its name and the next case runs; `check` then fails naming every failing case. Use it
    only for cases that leave the fixture as they found it (reads, refused writes), or
    give each case its own conversation.
    """

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.count = 0

    @contextlib.contextmanager
    def case(self, name: object) -> Iterator[None]:
        """Run one case; its failure is recorded under ``name`` (a repr cut to 80 chars)."""
        self.count += 1
        label = name if isinstance(name, str) else repr(name)
        if len(label) > 80:
            label = f"{label[:77]}..."
        try:
            yield
        except (Exception, pytest.fail.Exception) as exc:
            detail = f"{type(exc).__name__}: {exc}"
            if len(detail) > 500:
                detail = f"{detail[:497]}..."
            self.failures.append(f"{label}: {detail}")

    def check(self) -> None:
        """Fail naming every failing case (and how it failed)."""
        assert self.count, "no case ran"
        assert not self.failures, (
            f"{len(self.failures)} of {self.count} cases failed:\n" + "\n".join(self.failures))

"""Helpers shared by the tests."""

from __future__ import annotations

import inspect
from typing import Any


async def call(value: Any) -> Any:
    """Await ``value`` if it is awaitable: lets one test body drive both stores."""
    if inspect.isawaitable(value):
        return await value
    return value

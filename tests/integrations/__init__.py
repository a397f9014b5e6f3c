"""Tests of the framework integrations and provider formats.

Each module needs its framework installed (the ``test`` extra installs them all).
Without it the module is skipped with the reason, except when ``CI=true``: then the
missing package fails the run, like an unreachable PostgreSQL does.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import ``module``; skip the calling test module without it (fail under ``CI=true``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = f"{module} is not installed ({exc}); `pip install -e '.[test]'` installs it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (required when CI=true)", pytrace=False)
        pytest.skip(reason, allow_module_level=True)

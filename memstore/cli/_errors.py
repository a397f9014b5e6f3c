"""Errors of the ``memstore`` command and their one-line rendering."""

from __future__ import annotations

from pydantic import ValidationError

from memstore._validate import validation_summary
from memstore.errors import MemstoreError

__all__ = ["FileFormatError", "UsageError", "one_line"]


class UsageError(MemstoreError):
    """The command line is wrong in a way argparse cannot see (exit status 2)."""


class FileFormatError(MemstoreError):
    """An input file is not what the command reads; the message names file and line (exit 1)."""


def one_line(exc: BaseException) -> str:
    """The error as one readable line."""
    if isinstance(exc, ValidationError):
        return f"invalid {exc.title}: {validation_summary(exc)}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    text = " ".join(str(exc).split())
    return text or type(exc).__name__

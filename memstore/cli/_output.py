"""Output of the ``memstore`` command: Rich tables on a terminal, JSON for programs.

Data goes to standard output; progress bars and status lines go to standard error,
progress only when standard error is a terminal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

__all__ = [
    "FORMATS",
    "console",
    "counted",
    "default_format",
    "err_console",
    "preview",
    "print_json",
    "print_jsonl",
    "progress_bar",
    "status",
    "table",
]

#: Every output format; each command accepts those that make sense for its data.
FORMATS = ("table", "json", "jsonl", "openai")


def console(file: TextIO | None = None) -> Console:
    """A Rich console on standard output (looked up at call time, so tests can capture it)."""
    return Console(file=file or sys.stdout, highlight=False, markup=False, soft_wrap=False)


def err_console() -> Console:
    """A Rich console on standard error."""
    return Console(file=sys.stderr, highlight=False, markup=False, stderr=True)


def default_format() -> str:
    """``table`` when standard output is a terminal, else ``jsonl`` (the tool's own input)."""
    return "table" if sys.stdout.isatty() else "jsonl"


def print_json(value: Any) -> None:
    """Pretty JSON on standard output."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2, default=str) + "\n")


def print_jsonl(lines: Sequence[str]) -> None:
    """Already-serialised JSON lines on standard output."""
    for line in lines:
        sys.stdout.write(line + "\n")


def counted(n: int, word: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for 1: ``counted(1, "message")`` is ``1 message``."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def status(message: str) -> None:
    """A status line on standard error (kept out of the data on standard output)."""
    sys.stderr.write(message + "\n")


def preview(text: str, width: int = 60) -> str:
    """One line of ``text``, at most ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(columns: Sequence[str | tuple[str, dict[str, Any]]], rows: Sequence[Sequence[Any]],
          *, title: str | None = None, caption: str | None = None) -> Table:
    """A Rich table; a column is a header or ``(header, Column options)``."""
    t = Table(title=title, caption=caption, caption_justify="left", show_lines=False)
    for i, column in enumerate(columns):
        header, options = column if isinstance(column, tuple) else (column, {})
        if i < len(columns) - 1:  # the last column (the text) wraps; the others never do
            options = {"no_wrap": True, **options}
        t.add_column(header, **options)
    for row in rows:
        t.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    return t


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``: a Rich progress bar on standard error when it is a terminal.

    ``n`` is the number of items handled since the previous call (the ``progress``
    callback of :mod:`memstore.transfer`). Off a terminal, calls are ignored (no output
    at all), so pipes and logs stay clean.
    """
    if not sys.stderr.isatty():
        yield lambda _done: None
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn() if total else TextColumn("{task.completed:,}"),
               TimeElapsedColumn()]
    with Progress(*columns, console=err_console(), transient=True) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: int) -> None:
            progress.advance(task, n)

        yield advance

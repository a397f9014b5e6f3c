"""Output of the ``memstore`` command: Rich tables on a terminal, JSON for programs.

Data goes to standard output; progress bars and status lines go to standard error,
progress only when standard error is a terminal. Rich is imported by the functions
that draw, so a command that prints JSON (or ``--help``) never loads it.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # Rich is imported by the functions that draw (not for --help)
    from rich.console import Console
    from rich.progress import Progress, ProgressColumn, TaskID
    from rich.table import Table

__all__ = [
    "FORMATS",
    "NARROW",
    "ProgressBar",
    "console",
    "counted",
    "default_format",
    "err_console",
    "preview",
    "print_json",
    "print_jsonl",
    "prepare_stdout",
    "progress_bar",
    "progress_shown",
    "safe",
    "shell_word",
    "status",
    "table",
    "utf8_stdout",
]

#: Below this terminal width tables drop their outer borders (and the messages table its
#: score and created columns), so the text keeps some room.
NARROW = 64

#: Every output format; each command accepts those that make sense for its data.
FORMATS = ("table", "json", "jsonl", "openai")


_CONSOLE_CLASS: type[Console] | None = None


def _console_class() -> type[Console]:
    """A Rich console whose closed pipe is a `BrokenPipeError`, not ``SystemExit(1)``.

    Rich's own handler exits with status 1; re-raised, the error reaches the command's
    handler, which ends quietly with status 0 (the reader of ``| head`` went away).
    (Defined on first use: Rich is not imported until a command draws.)
    """
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                self.quiet = True
                raise BrokenPipeError

        _CONSOLE_CLASS = _Console
    return _CONSOLE_CLASS


def _is_utf8(stream: Any) -> bool:
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("_", "-")
    return encoding in ("utf-8", "utf8")


def prepare_stdout() -> None:
    """On a standard output that is not UTF-8, replace what it cannot encode.

    A table or a status line then shows ``?`` for a character the terminal's encoding
    lacks instead of failing; JSON switches the stream to UTF-8 (`utf8_stdout()`).
    """
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and not _is_utf8(stream):
        stream.reconfigure(errors="replace")


def utf8_stdout() -> TextIO:
    """Standard output, switched to UTF-8 first when it is not: JSON is UTF-8 text.

    (``PYTHONIOENCODING=ascii`` or a C locale would otherwise fail on the first
    character outside the terminal's encoding; the data is written exactly.)
    """
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and not _is_utf8(stream):
        stream.reconfigure(encoding="utf-8", errors="strict")
    return stream


def console(file: TextIO | None = None, width: int | None = None) -> Console:
    """A Rich console on standard output (looked up at call time, so tests can capture it)."""
    return _console_class()(file=file or sys.stdout, highlight=False, markup=False, soft_wrap=False,
                    emoji=False, width=width)


def err_console() -> Console:
    """A Rich console on standard error."""
    from rich.console import Console

    return Console(file=sys.stderr, highlight=False, markup=False, stderr=True, emoji=False)


def default_format() -> str:
    """``table`` when standard output is a terminal, else ``jsonl`` (the tool's own input)."""
    return "table" if sys.stdout.isatty() else "jsonl"


def print_json(value: Any) -> None:
    """Pretty JSON on standard output (UTF-8)."""
    utf8_stdout().write(json.dumps(value, ensure_ascii=False, indent=2, default=str) + "\n")


def print_jsonl(lines: Sequence[str]) -> None:
    """Already-serialised JSON lines on standard output (UTF-8)."""
    stream = utf8_stdout()
    for line in lines:
        stream.write(line + "\n")


def counted(n: int, word: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for 1: ``counted(1, "message")`` is ``1 message``."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def status(message: str) -> None:
    """A status line on standard error (kept out of the data on standard output)."""
    sys.stderr.write(message + "\n")


#: Unicode categories shown as escapes: control and format characters (a terminal acts on
#: them: ESC starts a colour or title sequence, U+202E reverses the text), surrogates,
#: and line and paragraph separators.
_UNSAFE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def safe(text: str) -> str:
    r"""``text`` as it may reach a terminal: control and format characters as escapes.

    Stored content and ids come from users, LLMs and tools; printed raw, an ESC or a
    bidi override would act on the terminal. ``\x1b``, ``\u202e`` and the like are
    shown instead (a backslash stays a backslash). JSON output is never escaped this way.
    """
    if text.isprintable():  # the common case: nothing to escape (a space is printable)
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _UNSAFE else c for c in text)


def shell_word(text: str) -> str:
    """``text`` quoted for a POSIX shell, printable: ``$'...'`` when it holds escapes."""
    if safe(text) == text:
        return shlex.quote(text)
    body = "".join("\\\\" if c == "\\" else "\\'" if c == "'" else c for c in text)
    return "$'" + safe(body) + "'"


def preview(text: str, width: int = 60) -> str:
    """One line of ``text``, at most ``width`` characters, control characters escaped.

    Runs of whitespace (newlines and tabs included) become one space.
    """
    flat = safe(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(columns: Sequence[str | tuple[str, dict[str, Any]]], rows: Sequence[Sequence[Any]],
          *, title: str | None = None, caption: str | None = None) -> Table:
    """A Rich table; a column is a header or ``(header, Column options)``.

    Every cell that is not already a `Text` goes through `safe()`.
    Columns justified right (numbers: seq, tokens) never wrap and keep their widest
    cell whole. The others wrap when the terminal is narrow (a long word is folded):
    rows grow taller rather than a number turning into "…" or the text vanishing.
    Below `NARROW` columns the table has no outer border.
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    narrow = console().width < NARROW
    compact: dict[str, Any] = {"box": box.SIMPLE_HEAD, "show_edge": False,
                               } if narrow else {}
    t = Table(title=safe(title) if title else None, caption=caption, caption_justify="left",
              show_lines=False, **compact)
    cells = [[cell if isinstance(cell, Text) else Text(safe(str(cell))) for cell in row]
             for row in rows]
    for i, column in enumerate(columns):
        header, options = column if isinstance(column, tuple) else (column, {})
        if options.get("justify") == "right":  # a number: whole, on one line
            least = max([len(header), *(r[i].cell_len for r in cells)])
            options = {"no_wrap": True, "min_width": least, **options}
        else:
            options = {"overflow": "fold", **options}
        t.add_column(header, **options)
    for row in cells:
        t.add_row(*row)
    return t


def progress_shown() -> bool:
    """Whether progress bars are drawn: only when standard error is a terminal."""
    return sys.stderr.isatty()


class ProgressBar:
    """What `progress_bar()` yields: a callable taking the items handled since its last call.

    It is the ``progress`` callback of `memstore.transfer`.

    ``total`` is what the bar fills up to (items, or bytes when it follows a file's
    position), ``None`` when it is not known; ``done`` the items handled so far.
    """

    def __init__(self, total: int | None, position: Callable[[], int] | None = None,
                 progress: Progress | None = None, task: TaskID | None = None) -> None:
        self.total = total
        self.done = 0
        self._position = position
        self._progress = progress
        self._task = task

    def __call__(self, n: int) -> None:
        self.done += n
        if self._progress is None or self._task is None:
            return
        completed = self._position() if self._position is not None else self.done
        self._progress.update(self._task, completed=completed, items=self.done)


def _columns(total: int | None, bytes_total: bool, unit: str) -> list[ProgressColumn | str]:
    """The bar's columns: a real bar, percentage and time left only when the total is known."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    items = TextColumn("{task.fields[items]:,} " + unit)
    head: list[ProgressColumn | str] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is None:  # no bar that looks full (or empty): how many so far, and how long
        return [*head, items, TimeElapsedColumn()]
    done = [items, DownloadColumn()] if bytes_total else \
        [TextColumn("{task.completed:,}/{task.total:,} " + unit)]
    return [*head, BarColumn(), TaskProgressColumn(), *done, TimeElapsedColumn(), "eta",
            TimeRemainingColumn()]


@contextmanager
def progress_bar(description: str, total: int | None = None, *,
                 position: Callable[[], int] | None = None,
                 unit: str = "messages") -> Iterator[ProgressBar]:
    """Yield a `ProgressBar`: a Rich progress bar on standard error when it is a terminal.

    With a ``total`` the bar fills up to it and shows the percentage, the count and
    the time left; without one it shows the count and the time spent (no bar: it
    could only pretend). With ``position`` (bytes of a file read so far) the bar
    follows it up to ``total`` bytes, and the count of items is shown beside it.
    Off a terminal, calls only count (no output at all), so pipes and logs stay clean.
    """
    if not progress_shown():
        yield ProgressBar(total, position)
        return
    from rich.progress import Progress

    with Progress(*_columns(total, position is not None, unit), console=err_console(),
                  transient=True) as progress:
        task = progress.add_task(description, total=total, items=0,
                                 completed=position() if position is not None else 0)
        yield ProgressBar(total, position, progress, task)

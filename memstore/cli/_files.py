"""``memstore import`` and ``memstore export``: files in and out, over `memstore.transfer`.

Import reads memstore's export format or OpenAI chat JSON lines (a file that is
not what ``--format`` says is recognised and named, with the command that reads it),
with real progress when the file's size is known; export streams conversations to a
file written next to its target and moved into place.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import stat
from collections.abc import Callable
from typing import IO, Any, cast

from pydantic import ValidationError

from memstore._validate import JSON_TOO_DEEP, validation_summary
from memstore.cli import _output as out
from memstore.cli._commands import (
    last_seq,
    not_utf8,
    open_store,
    read_text,
    replaced_file,
    stdin_utf8,
)
from memstore.cli._errors import FileFormatError, UsageError
from memstore.errors import (
    ConflictError,
    InvalidInputError,
    MemstoreError,
)
from memstore.models import Message

__all__ = ["export", "import_"]


def _openai_items(text: str, name: str) -> list[tuple[str, Any]]:
    """``(where, item)`` pairs from a JSON list or JSON lines."""
    if text.lstrip().startswith("["):
        items = _json(text, name, lines=True)
        return [(f"{name}: item {i}", item) for i, item in enumerate(items, 1)]
    pairs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        pairs.append((f"{name}:{lineno}", _json(line, f"{name}:{lineno}")))
    return pairs


def _json(text: str, where: str, *, lines: bool = False) -> Any:
    """JSON text decoded, or an error naming ``where``.

    ``where`` is ``file:line``, or with ``lines`` the file (the error's line is added).
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        place = f"{where}:{exc.lineno}" if lines else where
        raise FileFormatError(f"{place}: not JSON: {exc.msg}") from None
    except RecursionError:
        raise FileFormatError(f"{where}: {JSON_TOO_DEEP}") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise FileFormatError(f"{where}: not JSON memstore can read: {exc}") from None


def _import_openai(args: argparse.Namespace) -> int:
    if not args.target:
        raise UsageError("--format openai needs --into CONV (the conversation to append to)")
    name = "<stdin>" if args.file == "-" else args.file
    messages = []
    for where, item in _openai_items(read_text(args.file), name):
        if not isinstance(item, dict):
            raise FileFormatError(f"{where}: expected a JSON object (an OpenAI message)")
        kind = _kind(item)
        if kind in ("export", "messages"):  # not OpenAI messages: say what to run instead
            raise UsageError(f"{where}: not an OpenAI message: " + _memstore_file_hint(
                kind, args.file, args.target, "drop --format openai and --into"))
        try:
            messages.append(Message.from_openai(item))
        except ValidationError as exc:
            raise FileFormatError(f"{where}: {validation_summary(exc)}") from None
    with open_store(args, write=True, create=True) as store:
        before = last_seq(store, args.target)
        stored = store.extend(args.target, messages)
    # a message whose id is stored is not new; one repeated in the file is stored once
    new = len({m.seq for m in stored if m.seq > before})
    if new == len(stored):
        print(f"stored {out.counted(new, 'message')} in {args.target!r}")
    elif new:
        print(f"stored {out.counted(new, 'message')} in {args.target!r} "
              f"({len(stored) - new:,} already stored)")
    else:
        print(f"nothing new in {args.target!r} ({out.counted(len(stored), 'message')} "
              "already stored)")
    return 0




def _kind(line: Any) -> str | None:
    """What a file's first JSON value says the file is, or None.

    ``export``: a memstore export header; ``messages``: a stored message line (as
    ``memstore messages --format jsonl`` prints them); ``openai``: an OpenAI chat
    message, or a JSON list.
    """
    if isinstance(line, list):
        return "openai"
    if not isinstance(line, dict):
        return None
    if "memstore_export" in line:
        return "export"
    if "seq" in line and "token_count" in line:
        return "messages"
    return "openai" if "role" in line else None


def _sniff(path: str) -> str | None:
    """`_kind()` of a file's first non-blank line (None when it cannot be read)."""
    if path == "-":
        return None  # not read for a hint: it would be gone for the import
    try:
        with open(path, encoding="utf-8") as fp:
            while True:
                line = fp.readline(1 << 20)
                if not line:
                    return None
                if line.strip():
                    break
        if line.lstrip().startswith("["):
            return "openai"
        return _kind(json.loads(line))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def _memstore_file_hint(kind: str, path: str, conversation: str | None, drop: str) -> str:
    """How to import a memstore file (``kind`` from `_kind()`): the command to run.

    ``drop`` says what to leave out of the command that was given; ``conversation``
    is the id the user meant the messages for, if known.
    """
    file = out.shell_word(path)
    conv = out.shell_word(conversation) if conversation is not None else None
    if kind == "messages":
        return (f"{path} holds memstore message lines (as 'memstore messages --format "
                f"jsonl' prints them): {drop}, and run memstore import {file} --as "
                f"{conv or 'CONV'}")
    hint = (f"{path} is a memstore export file, which names its own conversations: {drop}, "
            f"and run memstore import {file}")
    if conv is not None:
        hint += f" (or add --as {conv} to store its one conversation under that id)"
    return hint


def import_(args: argparse.Namespace) -> int:
    """``memstore import FILE``."""
    if args.extra is not None:
        # the old 'memstore import CONV FILE': what the file holds says what to run now
        kind = _sniff(args.extra)
        if kind in ("export", "messages"):
            raise UsageError(_memstore_file_hint(kind, args.extra, args.file,
                                                 "drop the conversation argument"))
        raise UsageError(
            f"'memstore import CONV FILE' is now 'memstore import FILE --into CONV --format "
            f"openai': run memstore import {out.shell_word(args.extra)} --into "
            f"{out.shell_word(args.file)} --format openai (a file written by 'memstore "
            f"export' needs no conversation: memstore import {out.shell_word(args.extra)})")
    if args.format == "openai":
        if args.replace:
            raise UsageError("--replace applies to --format memstore (openai messages are "
                             "appended)")
        return _import_openai(args)
    transfer = _transfer()
    name = "<stdin>" if args.file == "-" else args.file
    fp: IO[str] = stdin_utf8() if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
    size, position = _size_and_position(fp)
    try:
        # The file's first line is checked before the database is opened (and perhaps
        # created and migrated): a wrong file changes nothing.
        head, first = _first_lines(fp, name, args.file)
        if first is None:
            print("the file holds no conversation")
            return 0
        try:
            transfer.check_first_line(first, line_no=len(head), rename=args.target)
        except InvalidInputError as exc:
            raise _file_error(exc, name) from exc
        with open_store(args, write=True, create=True) as store, \
                out.progress_bar(f"importing {name}", size, position=position) as progress:
            try:
                result = transfer.import_jsonl(store, cast(IO[str], _Replay(head, fp)),
                                               replace=args.replace,
                                               rename=args.target, progress=progress)
            except (MemstoreError, ValidationError) as exc:
                for done in getattr(exc, "imported", None) or ():
                    _print_imported(done)  # conversations earlier in the file are stored
                if isinstance(exc, ConflictError):
                    if args.replace or not transfer.conflicts_with_stored(exc):
                        raise  # --replace would not help
                    raise ConflictError(f"{exc} (pass --replace to overwrite the stored "
                                        "conversation with the file's)") from exc
                if not isinstance(exc, (InvalidInputError, ValidationError)):
                    raise  # a database error, say
                raise _file_error(exc, name) from exc
    finally:
        if args.file != "-":
            fp.close()
    for c in result.conversations:
        _print_imported(c)
    if not result.conversations:
        print("the file holds no conversation")
    return 0


def _file_error(exc: InvalidInputError | ValidationError, name: str) -> FileFormatError:
    """An import's error about the file, as ``file:line: problem`` in the CLI's words."""
    transfer = _transfer()
    line = getattr(exc, "line", None)
    where = f"{name}:{line}" if line else name
    text = validation_summary(exc) if isinstance(exc, ValidationError) else str(exc)
    # the library's words for its argument, the CLI's for its flag
    text = text.replace(transfer.RENAME_HINT, _AS_HINT).replace(transfer.RENAME_ONE, _AS_ONE)
    return FileFormatError(f"{where}: {text.removeprefix(f'line {line}: ')}")


def _first_lines(fp: IO[str], name: str,
                 path: str) -> tuple[list[str], dict[str, Any] | None]:
    """The lines of ``fp`` up to its first non-blank one, and that line parsed.

    It must be a JSON object. ``([], None)`` when the file holds only blank lines. Not
    UTF-8 text, or not JSON, is an error naming the file (and the line).
    """
    head: list[str] = []
    while True:
        try:
            line = fp.readline()
        except UnicodeDecodeError as exc:
            raise not_utf8(path, exc) from None
        if not line:
            return [], None
        head.append(line)
        if line.strip():
            break
    first = _json(line, f"{name}:{len(head)}")
    if not isinstance(first, dict):
        raise FileFormatError(f"{name}:{len(head)}: expected a JSON object (a memstore "
                              f"export line), got {type(first).__name__}")
    return head, first


def _size_and_position(fp: IO[str]) -> tuple[int | None, Callable[[], int] | None]:
    """For a progress bar: a regular file's bytes still to read, and how many are read since.

    The second is a function reading the file's offset, which its buffers keep ahead
    of the text handed out by at most a few kilobytes.
    ``(None, None)`` for a pipe or a terminal (standard input that is not redirected
    from a file): the total is not known there.
    """
    try:
        fd = fp.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, None
        start = os.lseek(fd, 0, os.SEEK_CUR)
        size = os.fstat(fd).st_size - start
    except (OSError, ValueError):  # no descriptor (a test's StringIO), or not seekable
        return None, None
    return size, lambda: os.lseek(fd, 0, os.SEEK_CUR) - start


class _Replay:
    """A file's ``readline`` that first gives back the lines already read from it."""

    def __init__(self, head: list[str], fp: IO[str]) -> None:
        self._head = list(head)
        self._fp = fp

    def readline(self, size: int = -1) -> str:
        return self._head.pop(0) if self._head else self._fp.readline(size)


#: `memstore.transfer.RENAME_HINT` and ``RENAME_ONE`` said of ``memstore import``'s
#: flag that sets ``rename``.
_AS_HINT = "pass --as CONV to import bare message lines into one conversation"
_AS_ONE = "--as imports one conversation, and the file holds more"


def _print_imported(c: Any) -> None:
    """One line per imported conversation: what was written, or that nothing was new."""
    if c.replaced:
        what = f"replaced ({out.counted(c.written, 'message')} written)"
    elif c.written:
        what = f"{out.counted(c.written, 'message')} written"
        what += f", {c.unchanged:,} already stored" if c.unchanged else ""
    else:
        what = f"nothing new ({out.counted(c.unchanged, 'message')} already stored)"
    what += f", {out.counted(c.summaries, 'summary', 'summaries')} stored" if c.summaries else ""
    print(f"{out.safe(c.id)}: {what}")


def _transfer() -> Any:
    """`memstore.transfer` (imported late: only export and import need it)."""
    return importlib.import_module("memstore.transfer")


def export(args: argparse.Namespace) -> int:
    """``memstore export [CONV...] [-o FILE]``."""
    transfer = _transfer()
    target = args.output if args.output and args.output != "-" else None
    with open_store(args) as store:
        # an unknown id: an error before any output; the known ones give the bar's total
        counts = {cid: store.get_conversation(cid).message_count
                  for cid in dict.fromkeys(args.conversation_ids)}
        total: int | None = sum(counts[cid] for cid in args.conversation_ids)
        if not args.conversation_ids:  # every conversation (read only for a bar)
            total = store.stats().messages if out.progress_shown() else None
        with out.progress_bar("exporting", total) as progress, \
                (replaced_file(target) if target
                 else contextlib.nullcontext(out.utf8_stdout())) as fp:
            result = transfer.export_jsonl(store, fp, args.conversation_ids or None,
                                           progress=progress)
    out.status(f"exported {out.counted(result.conversations, 'conversation')}, "
               f"{out.counted(result.messages, 'message')}"
               + (f", {out.counted(result.summaries, 'summary', 'summaries')}"
                  if result.summaries else "")
               + (f" to {out.safe(target)}" if target else ""))
    return 0

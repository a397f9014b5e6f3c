"""The ``memstore`` commands: thin layers over the public API of `memstore`.

This module is imported when a command runs (not for ``--help``); Rich is imported
only by the commands that draw a table.

Reading a conversation that was never written is not an error for the library (an
empty list, an empty window); here it is, for the commands that read one named
conversation (``messages``, ``window``, ``conversations show``, ``state save``,
``export CONV``): a mistyped id then says so, instead of printing nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import shlex
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from memstore import migrate
from memstore._db.engine import default_url, parse_url, sync_url
from memstore._validate import JSON_TOO_DEEP, validation_summary
from memstore.cli import _output as out
from memstore.cli._errors import FileFormatError, UsageError
from memstore.cli._lifecycle_args import listing_filters, listing_words
from memstore.errors import (
    ConfigurationError,
    ConflictError,
    ContextBudgetError,
    ConversationNotFoundError,
    DatabaseError,
    InvalidInputError,
    MemstoreError,
    SchemaOutOfDateError,
)
from memstore.models import Conversation, ConversationState, Message, StoredMessage
from memstore.store import MemoryStore
from memstore.views.window import ContextWindow

__all__ = [
    "REASONS",
    "DeferredCounter",
    "append",
    "check_exists",
    "clear",
    "conversations_list",
    "conversations_show",
    "db_check",
    "db_create_partitioned",
    "db_current",
    "db_downgrade",
    "db_upgrade",
    "delete",
    "export",
    "import_",
    "message_preview",
    "messages",
    "open_store",
    "pop",
    "state_load",
    "state_save",
    "stats",
    "window",
]

#: Short, human words for a window report's omission reasons.
REASONS = {
    "budget": "over budget",
    "buffer_size": "buffer full",
    "head_tail_gap": "middle gap",
    "max_turns": "older turn",
    "score": "low score",
    "incomplete_unit": "pending call",
    "tool_messages_removed": "tool unit",
    "start_on_user": "before user",
}


# ---- opening the database ---------------------------------------------------------------


def url_of(args: argparse.Namespace) -> str:
    """The database URL of a command: ``--url``, else ``$MEMSTORE_URL``, else ./memstore.db.

    It is checked as the library checks it (`memstore._db.engine.parse_url()`, so
    ``postgres://`` works too); a URL that is not one, or names a database memstore
    cannot use, is a usage error naming where the URL came from.
    """
    given = getattr(args, "url", None)
    if given == "":
        raise UsageError("--url: empty (leave it out for the default: $MEMSTORE_URL, else "
                         "sqlite:///./memstore.db)")
    url = given or default_url()
    source = url_source(args)
    try:
        sync_url(url).get_dialect()
    except ConfigurationError as exc:
        raise UsageError(f"{source}: {exc}") from None
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise UsageError(f"{source}: cannot use {_shown(url)!r}: {exc} (memstore works with "
                         "sqlite:// and postgresql:// URLs)") from None
    return url


def url_source(args: argparse.Namespace) -> str:
    """Where the command's URL came from, as an error names it: --url or MEMSTORE_URL."""
    if getattr(args, "url", None) is None and os.environ.get("MEMSTORE_URL"):
        return "MEMSTORE_URL"
    return "--url"


def _shown(url: str) -> str:
    """``url`` as it may be printed: the password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite file ``url`` names when that file does not exist, else None."""
    u = parse_url(url)
    path = u.database
    if u.get_backend_name() != "sqlite" or not path or path == ":memory:" \
            or path.startswith("file:"):
        return None
    return None if Path(path).exists() else path


def require_database(url: str) -> None:
    """Raise a clear error (and create nothing) when ``url`` names a missing SQLite file."""
    path = missing_sqlite_file(url)
    if path is not None:
        raise DatabaseError(f"no database at {path} (nothing was created; 'memstore append', "
                            "'memstore import' or 'memstore db upgrade' create one)")


class DeferredCounter:
    """The store's default counter, ``TiktokenCounter("cl100k_base")``, built on first count.

    Loading the encoding takes a quarter of a second, and a command that only reads
    (``window``, ``messages``, ``export``...) uses the token counts stored with the
    messages: it counts only new text (a head-and-tail placeholder, say), rarely. Its
    name and reply priming are the default counter's, so the store and its windows
    behave exactly as with it; every other attribute is the loaded counter's.
    """

    #: `memstore.tokens.default_counter()`'s name (a test checks that they agree).
    NAME = "tiktoken/cl100k_base"

    def __init__(self) -> None:
        self._loaded: Any = None

    def _counter(self) -> Any:
        if self._loaded is None:
            from memstore.tokens import default_counter

            self._loaded = default_counter()
        return self._loaded

    @property
    def name(self) -> str:
        """The default counter's name."""
        return self.NAME

    @property
    def priming(self) -> int:
        """The default counter's reply priming (a class constant: nothing is loaded)."""
        from memstore.tokens import TiktokenCounter

        return int(TiktokenCounter.reply_priming)

    def count_message(self, message: Message) -> int:
        """`TiktokenCounter.count_message`."""
        return int(self._counter().count_message(message))

    def count_messages(self, messages: Any) -> int:
        """`TiktokenCounter.count_messages`."""
        return int(self._counter().count_messages(messages))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._counter(), name)  # count_tools, count_each, ...


@contextmanager
def open_store(args: argparse.Namespace, *, write: bool = False,
               create: bool = False) -> Iterator[MemoryStore]:
    """A store on the command's database.

    Read-only commands open it with ``migrate="check"`` and never create a file; so do
    writes to an existing conversation (``create=False``). They count with a
    `DeferredCounter` (the tokenizer is loaded only if they count).
    """
    url = url_of(args)
    if not create:
        require_database(url)
    # (A file to create, on a path that is a directory or in one that does not exist, is
    # the store's ConfigurationError naming it.)
    try:
        store = MemoryStore(url, migrate="auto" if write else "check",
                            counter=None if write else DeferredCounter())
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise UsageError(f"{url_source(args)}: cannot use {_shown(url)!r}: {exc} (memstore "
                         "works with sqlite:// and postgresql:// URLs)") from None
    try:
        yield store
    finally:
        store.close()


def read_text(path: str) -> str:
    """A file's text, or standard input for ``-`` (not UTF-8: an error naming the file)."""
    try:
        return stdin_utf8().read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc) from None


def stdin_utf8() -> IO[str]:
    """Standard input read as UTF-8 (strict), whatever the locale's encoding says.

    A new file object on its descriptor, which never closes it: a wrapper around
    ``sys.stdin.buffer`` would close that buffer, and standard input with it, when
    it is garbage-collected (``main()`` called again in the same process would find
    it closed).
    """
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None or not isinstance(sys.stdin, io.TextIOWrapper):
        return sys.stdin  # replaced (a test's StringIO): already text
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):  # no descriptor (a wrapper around bytes in memory)
        return io.TextIOWrapper(buffer, encoding="utf-8")
    return open(fd, encoding="utf-8", closefd=False)


def not_utf8(path: str, exc: UnicodeDecodeError) -> FileFormatError:
    """The error for a file that is not UTF-8 text, naming it (``<stdin>`` for ``-``)."""
    name = "<stdin>" if path == "-" else path
    byte = bytes(exc.object[exc.start:exc.start + 1]).hex()
    return FileFormatError(f"{name}: not UTF-8 text: {exc.reason} (byte 0x{byte})")


@contextmanager
def replaced_file(path: str) -> Iterator[IO[str]]:
    """A UTF-8 text file that replaces ``path`` only when the block ends without an error.

    It is written as a temporary file in the same directory and renamed over ``path``
    (``os.replace``) at the end, so an existing file is never truncated or left half
    written: on an error the temporary file is removed and ``path`` is as it was. A
    symlink's target is replaced; a path that exists and is not a regular file (a FIFO,
    ``/dev/stdout``) is written in place.
    """
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isfile(real):
        with open(path, "w", encoding="utf-8") as fp:
            yield fp
        return
    if os.path.exists(real):
        mode = stat.S_IMODE(os.stat(real).st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real) or ".",
                               prefix=f".{os.path.basename(real)}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            yield fp
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fmt(args: argparse.Namespace) -> str:
    """The output format asked for, or the default (table on a terminal, else jsonl)."""
    return getattr(args, "format", None) or out.default_format()


# ---- rendering --------------------------------------------------------------------------


def message_preview(m: Message, width: int = 60) -> str:
    """One line describing a message: its text, or its tool calls."""
    text = m.text
    if m.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        text = f"{text} → {calls}" if text else f"→ {calls}"
    if m.role == "tool" and m.tool_call_id:
        text = f"[{m.tool_call_id}] {text}"
    return out.preview(text, width)


def _role(m: Message) -> str:
    return f"{m.role} (pinned)" if m.pinned else m.role


def print_messages(messages: Sequence[StoredMessage], form: str) -> None:
    """Stored messages in one of the four formats (the table narrower on a narrow terminal)."""
    if form == "jsonl":
        out.print_jsonl([m.model_dump_json() for m in messages])
    elif form == "json":
        out.print_json([m.model_dump(mode="json") for m in messages])
    elif form == "openai":
        out.print_json([m.to_openai() for m in messages])
    else:
        console = out.console()
        if console.width < out.NARROW:  # no room for six columns: the score and time go
            console.print(out.table(
                [("seq", {"justify": "right"}), "role", ("tokens", {"justify": "right"}),
                 "text"],
                [(m.seq, _role(m), m.token_count, message_preview(m)) for m in messages]))
            return
        rows = [(m.seq, _role(m), m.token_count, f"{m.score:g}",
                 m.created_at.strftime("%Y-%m-%d %H:%M:%S"), message_preview(m))
                for m in messages]
        console.print(out.table(
            [("seq", {"justify": "right"}), "role", ("tokens", {"justify": "right"}),
             ("score", {"justify": "right"}), "created (UTC)", "text"], rows))


def _conversation_dict(c: Conversation) -> dict[str, Any]:
    return c.model_dump(mode="json")


# ---- db ---------------------------------------------------------------------------------


def _schema_at(url: str) -> str:
    at = migrate.current(url)
    return ", ".join(at) if at else "base (no memstore tables)"


def out_of_date_message(args: argparse.Namespace, exc: SchemaOutOfDateError) -> str:
    """The CLI's words for a schema that is behind: the command that fixes it, with the URL.

    The library's message names a placeholder URL and a Python call; here the command
    is spelled out for the command's own database (its password hidden).
    """
    url = url_of(args)
    try:
        at = migrate.current(url)
    except MemstoreError:
        return str(exc)  # the database went away since: the library's words will do
    want = ", ".join(migrate.heads())
    if at:
        state, fix = (f"the database schema is at revision {', '.join(at)}, behind this "
                      f"memstore's {want}", "upgrade it")
    else:
        state, fix = "the database has no memstore tables yet", "create them"
    if not getattr(args, "url", None) and os.environ.get("MEMSTORE_URL"):
        command = f"`memstore db upgrade` (it uses MEMSTORE_URL, {_shown(url)})"
    else:
        command = f"`memstore db upgrade --url {shlex.quote(_shown(url))}`"
    return f"{state}: {fix} with {command}"


def db_upgrade(args: argparse.Namespace) -> int:
    """``memstore db upgrade``."""
    url = url_of(args)
    migrate.validate_revision(args.revision, "upgrade", sql=args.sql)  # before any database
    if args.sql:
        migrate.upgrade(url, args.revision, sql=True, output=sys.stdout,
                        search_language=args.search_language)
        return 0
    migrate.upgrade(url, args.revision, search_language=args.search_language)
    at = _schema_at(url)
    line = f"memstore schema at {at}"
    order = migrate.REVISIONS
    if args.revision in order and at in order and order.index(at) > order.index(args.revision):
        # upgrade leaves a database past its target as it is (a deploy step may ask for
        # "at least X"); say so, since the user may have meant to go back.
        line += (f" (already past {args.revision}; upgrade never moves down: "
                 f"`memstore db downgrade {args.revision}` does)")
    print(line)
    return 0


def db_downgrade(args: argparse.Namespace) -> int:
    """``memstore db downgrade``."""
    url = url_of(args)
    migrate.validate_revision(args.revision, "downgrade", sql=args.sql)  # before any database
    if args.sql:
        migrate.downgrade(url, args.revision, sql=True, output=sys.stdout)
        return 0
    require_database(url)
    migrate.downgrade(url, args.revision)
    print(f"memstore schema at {_schema_at(url)}")
    return 0


def db_current(args: argparse.Namespace) -> int:
    """``memstore db current``."""
    url = url_of(args)
    at = () if missing_sqlite_file(url) else migrate.current(url)
    print(f"current: {', '.join(at) if at else 'none'}\nhead:    {', '.join(migrate.heads())}")
    return 0


def db_check(args: argparse.Namespace) -> int:
    """``memstore db check``."""
    url = url_of(args)
    path = missing_sqlite_file(url)
    if path is not None:
        raise DatabaseError(f"no database at {path}: run 'memstore db upgrade' to create it")
    migrate.check(url)
    print("memstore schema is up to date")
    return 0


def db_create_partitioned(args: argparse.Namespace) -> int:
    """``memstore db create-partitioned``."""
    url = url_of(args)
    if args.sql:
        migrate.create_partitioned(url, args.partitions, sql=True, output=sys.stdout,
                                   search_language=args.search_language)
        return 0
    migrate.create_partitioned(url, args.partitions, search_language=args.search_language)
    print(f"memstore tables created with {out.counted(args.partitions, 'hash partition')} "
          "each; schema at "
          f"{', '.join(migrate.current(url))}")
    return 0


# ---- conversations ----------------------------------------------------------------------


def conversations_list(args: argparse.Namespace) -> int:
    """``memstore conversations [list]``: one keyset page, filtered as asked.

    With ``--order updated``, ``--after ID`` continues after that conversation's current
    ``updated_at`` (it is read first; an unknown id is an error).
    """
    limit = getattr(args, "limit", 100)
    filters = listing_filters(args)  # --where, --parent, --updated-after/-before, --order
    with open_store(args) as store:
        after: str | Conversation | None = getattr(args, "after", None)
        if isinstance(after, str) and filters.get("order") == "updated":
            after = store.get_conversation(after)
        page = store.list_conversations(limit=limit, after=after, **filters)
        # a full page may be the last one: look one conversation further
        more = len(page) == limit and bool(store.list_conversations(limit=1, after=page[-1],
                                                                   **filters))
    form = fmt(args)
    if form == "jsonl":
        out.print_jsonl([c.model_dump_json() for c in page])
    elif form == "json":
        out.print_json([_conversation_dict(c) for c in page])
    else:
        rows = [(c.id, f"{c.message_count:,}", f"{c.token_count:,}",
                 c.updated_at.strftime("%Y-%m-%d %H:%M:%S")) for c in page]
        out.console().print(out.table(
            ["id", ("messages", {"justify": "right"}), ("tokens", {"justify": "right"}),
             "updated (UTC)"], rows))
    if more:
        out.status(f"more after this page: {next_page_command(args, page[-1].id)}")
    return 0


def next_page_command(args: argparse.Namespace, last_id: str) -> str:
    """The command that lists the next page: this one's options, ``--after`` the last id.

    Shell-quoted (``$'...'`` for an id with control characters); ``--url`` is repeated
    with its password hidden (``***``: put it back, or use ``MEMSTORE_URL``).
    """
    words = ["memstore", "conversations", "list", "--after", out.shell_word(last_id)]
    if hasattr(args, "limit"):
        words += ["--limit", str(args.limit)]
    words += listing_words(args)  # the filters and --order
    if getattr(args, "format", None):
        words += ["--format", args.format]
    if getattr(args, "url", None):
        words += ["--url", out.shell_word(_shown(args.url))]
    return " ".join(words)


def conversations_show(args: argparse.Namespace) -> int:
    """``memstore conversations show CONV``."""
    with open_store(args) as store:
        conv = store.get_conversation(args.conversation_id)
    form = fmt(args)
    if form == "jsonl":
        out.print_jsonl([conv.model_dump_json()])
    elif form == "json":
        out.print_json(_conversation_dict(conv))
    else:
        rows = [("id", conv.id), ("messages", f"{conv.message_count:,}"),
                ("tokens", f"{conv.token_count:,}"), ("created", conv.created_at.isoformat()),
                ("updated", conv.updated_at.isoformat()),
                ("metadata", json.dumps(conv.metadata, ensure_ascii=False))]
        out.console().print(out.table(["field", "value"], rows))
    return 0


def delete(args: argparse.Namespace) -> int:
    """``memstore delete CONV`` (also ``conversations delete``)."""
    with open_store(args, write=True) as store:
        store.delete_conversation(args.conversation_id)
    print(f"deleted conversation {args.conversation_id!r}")
    return 0


def stats(args: argparse.Namespace) -> int:
    """``memstore stats``."""
    with open_store(args) as store:
        s = store.stats()
    form = fmt(args)
    data = s.model_dump(mode="json")
    if form == "jsonl":
        out.print_jsonl([s.model_dump_json()])
    elif form == "json":
        out.print_json(data)
    else:
        size = "unknown" if s.database_bytes is None else out.counted(s.database_bytes, "byte")
        rows = [("conversations", f"{s.conversations:,}"), ("messages", f"{s.messages:,}"),
                ("tokens", f"{s.tokens:,}"), ("database size", size),
                ("schema revision", s.schema_revision or "none")]
        out.console().print(out.table(["", ("value", {"justify": "right"})], rows))
    return 0


# ---- writing ----------------------------------------------------------------------------


def append(args: argparse.Namespace) -> int:
    """``memstore append CONV ROLE CONTENT``."""
    if args.role == "tool" and args.tool_call_id is None:
        raise UsageError("--tool-call-id is required for a tool message")
    if args.tool_call_id is not None and args.role != "tool":
        raise UsageError("--tool-call-id is only for tool messages")
    content = sys.stdin.read() if args.content == "-" else args.content
    fields: dict[str, Any] = {"role": args.role, "content": content}
    for key in ("tool_call_id", "name", "id"):
        if getattr(args, key) is not None:  # "" is the model's to refuse, not to drop
            fields[key] = getattr(args, key)
    message = Message.from_openai(fields, score=args.score, pinned=args.pin)
    with open_store(args, write=True, create=True) as store:
        # a client id stored before comes back as it was: not after the last seq
        before = _last_seq(store, args.conversation_id) if args.id is not None else None
        stored = store.append(args.conversation_id, message)
    if before is not None and stored.seq <= before:
        print(f"already stored as seq {stored.seq} (client id {args.id!r}): nothing new")
        return 0
    print(f"stored seq {stored.seq} ({out.counted(stored.token_count, 'token')}, "
          f"{stored.token_counter})")
    return 0


def _openai_items(text: str, name: str) -> list[tuple[str, Any]]:
    """``(where, item)`` pairs from a JSON list or JSON lines."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FileFormatError(f"{name}:{exc.lineno}: not JSON: {exc.msg}") from None
        except RecursionError:
            raise FileFormatError(f"{name}: {JSON_TOO_DEEP}") from None
        except ValueError as exc:  # an integer of more than 4,300 digits
            raise FileFormatError(f"{name}: not JSON memstore can read: {exc}") from None
        return [(f"{name}: item {i}", item) for i, item in enumerate(items, 1)]
    pairs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        pairs.append((f"{name}:{lineno}", _json_line(line, f"{name}:{lineno}")))
    return pairs


def _json_line(line: str, where: str) -> Any:
    """One line of a JSON Lines file, decoded; an error naming ``where`` (file:line)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"{where}: not JSON: {exc.msg}") from None
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
        before = _last_seq(store, args.target)
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


def _last_seq(store: MemoryStore, conversation_id: str) -> int:
    """The seq of a conversation's newest message (0 when it has none, or does not exist)."""
    newest = store.messages(conversation_id, limit=1, newest_first=True)
    return newest[0].seq if newest else 0


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
    first = _json_line(line, f"{name}:{len(head)}")
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


# ---- reading ----------------------------------------------------------------------------


def messages(args: argparse.Namespace) -> int:
    """``memstore messages CONV``."""
    if args.start is not None and args.stop is not None and args.start > args.stop:
        raise UsageError(f"--start {args.start} is after --stop {args.stop}: "
                         "the range start <= seq < stop is empty")
    with open_store(args) as store:
        found = store.messages(args.conversation_id, start=args.start, stop=args.stop,
                               limit=args.limit, newest_first=args.newest_first)
        if not found:  # nothing in the range, an empty conversation, or a mistyped id?
            check_exists(store, args.conversation_id)
    print_messages(found, fmt(args))
    return 0


def check_exists(store: MemoryStore, conversation_id: str) -> None:
    """Raise `ConversationNotFoundError` unless the conversation was ever written.

    The library reads a never-written conversation as empty; a command given one id
    to read says it does not exist (exit status 1), which is what a mistyped id needs.
    """
    store.get_conversation(conversation_id)


def make_view(args: argparse.Namespace) -> Any:
    """The view the ``window`` options describe."""
    from memstore import views

    if args.view == "token-limited":
        return views.TokenLimitedView(args.budget, reserve=args.reserve,
                                      start_on_user=args.start_on_user)
    if args.view == "score-based":
        return views.ScoreBasedView(args.budget, keep_rate=args.keep_rate,
                                    half_life=args.half_life, reserve=args.reserve)
    if args.view == "buffered":
        return views.BufferedView(args.size)
    if args.view == "head-and-tail":
        return views.HeadAndTailView(args.head, args.size)
    if args.view == "recent-turns":
        return views.RecentTurnsView(args.size, remove_tool_messages=args.remove_tool_messages)
    return views.UnboundedView()


_KEPT_BECAUSE = {
    "TokenLimitedView": "fits budget",
    "ScoreBasedView": "high score",
    "BufferedView": "in buffer",
    "HeadAndTailView": "tail",
    "RecentTurnsView": "recent turn",
    "UnboundedView": "complete unit",
}


def why_kept(window: ContextWindow) -> list[str]:
    """Per window message: why the view kept it."""
    msgs = window.messages
    reasons = [""] * len(msgs)
    newest = len(msgs) - 1
    while newest > 0 and msgs[newest].role == "tool":
        newest -= 1
    in_head = window.report.placeholder is not None
    for i, m in enumerate(msgs):
        if not isinstance(m, StoredMessage):
            reasons[i] = "placeholder"
            in_head = False
        elif m.anchored:
            reasons[i] = "pinned" if m.pinned else "anchored"
        elif i >= newest:
            reasons[i] = "newest unit"
        elif in_head:
            reasons[i] = "head"
        else:
            reasons[i] = _KEPT_BECAUSE.get(window.report.view, "kept")
    return reasons


def window(args: argparse.Namespace) -> int:
    """``memstore window CONV``."""
    if args.view in ("token-limited", "score-based") and args.reserve >= args.budget:
        raise UsageError(f"--reserve {args.reserve} must be less than --budget {args.budget} "
                         "(the reserve is the part of the budget kept free for the reply)")
    view = make_view(args)
    with open_store(args) as store:
        try:
            win = store.window(args.conversation_id, view)
        except ContextBudgetError as exc:
            required = getattr(exc, "required", None)
            if not isinstance(required, int) or required <= args.budget:
                raise
            raise ContextBudgetError(f"{exc}; use --budget {required} or more",
                                     required=required, budget=exc.budget) from exc
    if not win.report.conversation_exists:  # a mistyped id, not an empty conversation
        raise ConversationNotFoundError(args.conversation_id)
    form = fmt(args)
    if form == "json":
        out.print_json({"conversation_id": win.conversation_id, "messages": win.to_openai(),
                        "seqs": win.seqs, "token_count": win.token_count,
                        "budget": win.budget, "report": win.report.model_dump(mode="json")})
        return 0
    if form == "openai":
        out.print_json(win.to_openai())
        return 0
    if form == "jsonl":
        out.print_jsonl([m.model_dump_json() for m in win.messages
                         if isinstance(m, StoredMessage)])
        return 0
    from rich.text import Text

    report = win.report
    rows = []
    for m, why in zip(win.messages, why_kept(win)):
        seq = str(m.seq) if isinstance(m, StoredMessage) else "–"
        tokens = str(m.token_count) if isinstance(m, StoredMessage) else ""
        rows.append((seq, _role(m), tokens, why, message_preview(m)))
    console = out.console()
    console.print(out.table([("seq", {"justify": "right"}), "role",
                             ("tokens", {"justify": "right"}), "why kept", "text"], rows,
                            title=f"{report.view} window of {win.conversation_id!r}"))
    budget = f" of {win.budget:,}" if win.budget is not None else ""
    console.print(f"{out.counted(len(win.messages), 'message')}, "
                  f"{out.counted(win.token_count, 'token')}{budget}; "
                  f"{report.omitted_count:,} of "
                  f"{out.counted(report.conversation_message_count, 'stored message')} left "
                  f"out; {out.counted(report.rows_read, 'row')} read")
    for o in report.omitted:
        seqs = f"seq {o.first_seq}" if o.first_seq == o.last_seq else \
            f"seqs {o.first_seq}-{o.last_seq}"
        console.print(Text(f"  left out {seqs} ({o.count}): {REASONS.get(o.reason, o.reason)}"
                           f" [{o.reason}]"))
    return 0


# ---- destructive ------------------------------------------------------------------------


def pop(args: argparse.Namespace) -> int:
    """``memstore pop CONV [-n N]``: prints what it deletes, and deletes it once printed.

    The messages are printed (and standard output flushed) inside the transaction that
    deletes them ([`MemoryStore.rewrite()`][memstore.MemoryStore.rewrite] replacing the ``n`` newest
    with nothing,
    which is what [`MemoryStore.pop()`][memstore.MemoryStore.pop] does): when printing fails (a
    closed pipe, say)
    the transaction is rolled back and nothing is deleted.
    """
    form = fmt(args)

    def print_then_delete(newest: list[StoredMessage]) -> list[Message]:
        print_messages(newest, form)
        sys.stdout.flush()
        return []

    with open_store(args, write=True) as store:
        store.rewrite(args.conversation_id, print_then_delete, newest=args.n)
    return 0


def clear(args: argparse.Namespace) -> int:
    """``memstore clear CONV``."""
    with open_store(args, write=True) as store:
        n = store.clear(args.conversation_id)
    print(f"deleted {out.counted(n, 'message')} from {args.conversation_id!r}")
    return 0


# ---- state ------------------------------------------------------------------------------


def state_save(args: argparse.Namespace) -> int:
    """``memstore state save CONV``."""
    with open_store(args) as store:
        state = store.save_state(args.conversation_id)
    text = state.to_json()
    if args.output and args.output != "-":
        with replaced_file(args.output) as fp:
            fp.write(text)
    else:
        out.utf8_stdout().write(text + "\n")
    return 0


def _same_snapshot(stored: ConversationState, state: ConversationState) -> bool:
    """Whether loading ``state`` would change nothing that ``stored`` holds.

    Messages, summaries and metadata are compared; timestamps of the conversation row
    are not (a conversation that holds exactly the snapshot is left alone).
    """
    def key(s: ConversationState) -> tuple[Any, ...]:
        return ([m.model_dump(exclude={"conversation_id"}) for m in s.messages],
                [x.model_dump(exclude={"conversation_id"}) for x in s.summaries],
                s.conversation.metadata)

    return key(stored) == key(state)


def _holds(conv: Conversation, summaries: int) -> str:
    """What a stored conversation holds, in a few words (for the refusal of a load)."""
    n = conv.message_count
    parts = [f"{n} message{'' if n == 1 else 's'}"]
    if summaries:
        parts.append(f"{summaries} summar{'y' if summaries == 1 else 'ies'}")
    if conv.metadata:
        parts.append("metadata " + out.preview(json.dumps(conv.metadata, ensure_ascii=False),
                                               40))
    return ", ".join(parts)


def state_load(args: argparse.Namespace) -> int:
    """``memstore state load FILE``: refuses to overwrite a stored conversation unless told.

    Without ``--replace`` or ``--append`` the target must not exist (or already hold
    exactly the snapshot): a conversation that exists, even with no messages, has
    metadata, a creation time and perhaps summaries that a load would overwrite.
    """
    name = "<stdin>" if args.file == "-" else args.file
    try:
        state = ConversationState.model_validate_json(read_text(args.file))
    except ValidationError as exc:
        raise FileFormatError(f"{name}: not a memstore snapshot: "
                              f"{validation_summary(exc)}") from None
    target = args.conversation_id or state.conversation.id
    with open_store(args, write=True, create=True) as store:
        replace = bool(args.replace)
        if not args.replace and not args.append:
            try:
                conv = store.get_conversation(target)
            except ConversationNotFoundError:
                conv = None
            if conv is not None:
                stored = store.save_state(target) \
                    if conv.message_count == len(state.messages) else None
                if stored is not None and _same_snapshot(stored, state):
                    print(f"{target!r} already holds this snapshot: nothing to do")
                    return 0
                summaries = len(stored.summaries) if stored is not None \
                    else len(store.summaries(target))
                raise ConflictError(
                    f"conversation {target!r} exists ({_holds(conv, summaries)}): pass "
                    "--replace to overwrite it with the snapshot, or --append to add the "
                    "snapshot's messages after the stored ones")
            # A new conversation: appending into it writes exactly the snapshot, and a
            # conversation created by someone else since the check above is then
            # appended to (or refused on a repeated message id), never overwritten.
        conv = store.load_state(state, target, replace=replace)
    print(f"loaded {out.counted(len(state.messages), 'message')} into {conv.id!r}")
    return 0

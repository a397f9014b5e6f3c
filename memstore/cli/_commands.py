"""The ``memstore`` commands: thin layers over the public API of `memstore`.

This module is imported when a command runs (not for ``--help``); Rich is imported
only by the commands that draw a table. It also holds what every command shares
(opening the database, reading and replacing files, the output format); the
commands of one concern live beside it (``_files``: import and export; ``_state``:
snapshots; ``_lifecycle``, ``_search``, ``_demo``).

Reading a conversation that was never written is not an error for the library (an
empty list, an empty window); here it is, for the commands that read one named
conversation (``messages``, ``window``, ``conversations show``, ``state save``,
``export CONV``): a mistyped id then says so, instead of printing nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from memstore import migrate
from memstore._db.engine import default_url, parse_url, sync_url
from memstore.cli import _output as out
from memstore.cli._errors import FileFormatError, UsageError
from memstore.cli._lifecycle_args import listing_filters, listing_words
from memstore.errors import (
    ConfigurationError,
    ContextBudgetError,
    ConversationNotFoundError,
    DatabaseError,
    MemstoreError,
    SchemaOutOfDateError,
)
from memstore.models import Conversation, Message, StoredMessage
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
    "fmt",
    "last_seq",
    "message_preview",
    "messages",
    "open_store",
    "pop",
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
        before = last_seq(store, args.conversation_id) if args.id is not None else None
        stored = store.append(args.conversation_id, message)
    if before is not None and stored.seq <= before:
        print(f"already stored as seq {stored.seq} (client id {args.id!r}): nothing new")
        return 0
    print(f"stored seq {stored.seq} ({out.counted(stored.token_count, 'token')}, "
          f"{stored.token_counter})")
    return 0


def last_seq(store: MemoryStore, conversation_id: str) -> int:
    """The seq of a conversation's newest message (0 when it has none, or does not exist)."""
    newest = store.messages(conversation_id, limit=1, newest_first=True)
    return newest[0].seq if newest else 0


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

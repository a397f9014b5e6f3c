"""``MemoryStore``: durable conversation memory on SQLite or PostgreSQL (synchronous).

Example:
    >>> from memstore import MemoryStore, Message, TokenLimitedView
    >>> store = MemoryStore("sqlite://")                  # in-memory; default: ./memstore.db
    >>> _ = store.append("chat-1", Message.system("You are terse."))
    >>> _ = store.append("chat-1", Message.user("Hello!"))
    >>> window = store.window("chat-1", TokenLimitedView(token_limit=4000))
    >>> [m["role"] for m in window.to_openai()]
    ['system', 'user']
    >>> store.close()

Every public method validates its arguments, builds a `memstore._base.Plan`
and runs it in one transaction. [`memstore.aio.AsyncMemoryStore`][memstore.AsyncMemoryStore] has the
same
methods built from the same plans; only the ``await`` differs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any, Literal, TextIO, overload

from sqlalchemy import Connection, Engine

from memstore import _base, _streaming
from memstore._base import Durability, MessageLike, MigrateMode, Plan, Summarizer
from memstore._db import snapshots as _snapshots
from memstore._db import stateio as _stateio
from memstore._db.cache import DEFAULT_CACHE_SIZE, CacheInfo
from memstore._db.engine import make_engine, turn_of, write_options
from memstore._store_lifecycle import LifecycleMethods
from memstore._validate import check_flag
from memstore.errors import (
    ConnectionLostError,
    ConversationNotFoundError,
    translate_db_errors,
)
from memstore.migrate import migration_turn
from memstore.models import (
    Conversation,
    ConversationState,
    LoadReport,
    Message,
    StoredMessage,
    StoreStats,
    Summary,
)
from memstore.search import DEFAULT_MARK, SearchHit
from memstore.tokens import TokenCounter
from memstore.views import ContextView
from memstore.views.window import ContextWindow

__all__ = ["ChatContext", "MemoryStore"]


def _release_at_collection(store: MemoryStore, engine: Engine) -> Callable[[], Any]:
    """Dispose of ``engine`` when ``store`` is collected; call the result to do it now.

    Calling it again, or after the collection, does nothing.
    """
    release = weakref.finalize(store, engine.dispose)
    release.atexit = False
    return release


class MemoryStore(LifecycleMethods):
    """Conversation memory in a SQL database, with token-budgeted context windows.

    Args:
        url: database URL (``sqlite:///path.db``, ``postgresql://user@host/db``).
            Default: ``MEMSTORE_URL``, else ``sqlite:///./memstore.db``.
        engine: an existing `sqlalchemy.Engine` to use as is (instead of
            ``url``). memstore never disposes an injected engine. On SQLite it
            installs its connection hooks (WAL, ``BEGIN IMMEDIATE`` for writes).
        counter: the default token counter; each message is counted with it once,
            at write time. Default: ``TiktokenCounter("cl100k_base")`` (offline).
        migrate: ``"auto"`` (upgrade an embedded SQLite database; check that a server
            database is at head), ``"check"``, ``"upgrade"`` or ``"off"``.
        busy_timeout: seconds a SQLite writer waits for the write lock.
        cache_size: messages of decoded rows the store keeps in process memory
            (default ``DEFAULT_CACHE_SIZE``, 10,000), so a
            window re-reads from the database only what earlier windows did not
            already decode (usually just the newest messages). Cached rows are
            validated against the conversation's epoch in every read, so other
            processes' writes are always seen. ``0`` disables the cache. The bound
            counts messages, not bytes: the memory it takes is ``cache_size`` times
            the size of the messages read (lower it where messages are large).
        durability: ``"full"`` (default): on SQLite every commit is fsynced
            (``synchronous=FULL``), so a call that returned survives power loss or an
            OS crash. ``"normal"``: faster commits (``synchronous=NORMAL`` in WAL
            mode); the last commits before a power loss or OS crash may be lost (the
            database is never corrupted; a crash of the process alone loses nothing).
            PostgreSQL follows the server's settings (``synchronous_commit``,
            ``fsync``) in both modes.
        **engine_options: passed to `sqlalchemy.create_engine()` (``pool_size``…).

    Raises:
        SchemaOutOfDateError: the server schema is behind; the message names
            ``memstore db upgrade``.
        ConfigurationError: conflicting or invalid arguments.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        counter: TokenCounter | None = None,
        migrate: MigrateMode = "auto",
        busy_timeout: float = 30.0,
        cache_size: int = DEFAULT_CACHE_SIZE,
        durability: Durability = "full",
        **engine_options: Any,
    ) -> None:
        self._closed = False
        mode, self._plan, self._owns_engine, self._engine = _base.open_engine(
            url, engine, counter, migrate, busy_timeout, engine_options,
            cache_size=cache_size, durability=durability,
            make=make_engine, sync_engine_of=lambda e: e,
        )
        # A store dropped without close() releases its engine's connections when it is
        # collected, as a file closes itself (Python 3.13 warns of every sqlite3
        # connection collected unclosed). Not at exit: threads may still be using it.
        self._release: Callable[[], Any] = (
            _release_at_collection(self, self._engine) if self._owns_engine else lambda: None
        )
        # An in-memory database's one connection: calls take turns on it (threads).
        self._turn: Any = turn_of(self._engine) or nullcontext()
        try:
            _base.check_database_exists(self._engine.url, mode)
            # Read the schema revision without the write lock; take it only to migrate.
            with translate_db_errors(), self._engine.connect() as conn, conn.begin():
                needs_write = _base.schema_needs_write(conn, mode)
            if needs_write:
                # The process's migration lock first, then the database's (see migrate).
                with migration_turn(), translate_db_errors(), \
                        self._engine.connect() as conn:
                    conn.execution_options(**write_options())
                    with conn.begin():
                        _base.ensure_schema(conn, mode)
        except BaseException:
            self.close()
            raise

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine the store uses."""
        return self._engine

    @property
    def counter(self) -> TokenCounter:
        """The store's default token counter."""
        return self._plan.counter

    def clear_cache(self) -> None:
        """Forget every cached row (after editing memstore's tables by hand).

        Only needed when an UPDATE or DELETE outside memstore changed stored messages
        without setting a new ``memstore_conversations.epoch``.
        """
        self._plan.clear_cache()

    def cache_info(self) -> CacheInfo:
        """Statistics of the row cache: rows served from it, rows read, size."""
        return self._plan.cache_info()

    def _execute(self, plan: Plan) -> Any:
        _base.refuse_call(self._closed)
        prepared = plan.prepare() if plan.prepare is not None else None
        with self._turn:
            try:
                with translate_db_errors(), self._engine.connect() as conn:
                    return plan.run(conn, prepared)
            except ConnectionLostError:
                if plan.write:
                    raise  # the caller decides: a retry with the same client ids is exactly-once
            # A read on a connection that died (typically: the server restarted since it was
            # pooled; the pool has now discarded every connection that old) is retried once.
            with translate_db_errors(), self._engine.connect() as conn:
                return plan.run(conn, prepared)

    def close(self) -> None:
        """Release the store's connections (an injected engine is left open).

        The store then refuses every database call
        (`StoreClosedError`; ``cache_info()`` still answers);
        closing it again does nothing. A store collected without ``close()`` releases
        the connections of an engine it made then, as a file closes itself.
        """
        self._closed = True
        self._release()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- conversations --------------------------------------------------------------

    def create_conversation(
        self, id: str | None = None, metadata: dict[str, Any] | None = None
    ) -> Conversation:
        """Create an empty conversation.

        Args:
            id: the conversation id (1–255 characters); a UUID string when omitted.
            metadata: a JSON object stored with the conversation.

        Raises:
            ConflictError: a conversation with this id exists.
        """
        return self._execute(self._plan.create_conversation(id, metadata))  # type: ignore[no-any-return]

    def get_conversation(self, id: str) -> Conversation:
        """Return one conversation. Raises ConversationNotFoundError when unknown."""
        return self._execute(self._plan.get_conversation(id))  # type: ignore[no-any-return]

    def delete_conversation(self, id: str) -> None:
        """Delete a conversation and all its messages (one transaction)."""
        self._execute(self._plan.delete_conversation(id))

    def stats(self) -> StoreStats:
        """Totals of the whole database: conversations, messages, tokens, size, revision.

        One aggregate over the conversation rows (never over messages): an
        administrative call, not for a hot path.
        """
        return self._execute(self._plan.stats())  # type: ignore[no-any-return]

    # ---- writing --------------------------------------------------------------------

    def append(self, conversation_id: str, message: MessageLike) -> StoredMessage:
        """Store one message at the end of a conversation (created on first use).

        Its token count is computed once, now, with the store's counter. A message
        whose ``id`` is already stored returns the stored row if the content is the
        same, and raises ConflictError if it differs: retries never duplicate.

        Args:
            conversation_id: the conversation.
            message: a [`Message`][memstore.Message] or an OpenAI chat message dict.

        Raises:
            pydantic.ValidationError: the message is invalid (nothing is written).
            InvalidInputError: a bad conversation id, or ``message`` is neither a
                [`Message`][memstore.Message] nor a message dict (nothing is written).
            ConflictError: the message id is stored with other content.
        """
        return self._execute(self._plan.append(conversation_id, message))  # type: ignore[no-any-return]

    @overload
    def extend(self, conversation_id: str, messages: Iterable[MessageLike]) -> list[StoredMessage]:
        ...

    @overload
    def extend(self, conversation_id: str, messages: Iterable[MessageLike], *,
               return_messages: Literal[True]) -> list[StoredMessage]:
        ...

    @overload
    def extend(self, conversation_id: str, messages: Iterable[MessageLike], *,
               return_messages: Literal[False]) -> int:
        ...

    def extend(self, conversation_id: str, messages: Iterable[MessageLike], *,
               return_messages: bool = True) -> list[StoredMessage] | int:
        """Store several messages in one transaction: all of them or none.

        Returns one [`StoredMessage`][memstore.StoredMessage] per input message. With
        ``return_messages=False`` it returns how many messages it took instead, and
        reads, checks and writes them in chunks inside the transaction, so memory stays
        bounded however many there are (a generator of millions of messages is fine);
        still all of them or none.
        """
        if not check_flag(return_messages, "return_messages"):
            return self._execute(  # type: ignore[no-any-return]
                self._plan.extend_stream(conversation_id, messages))
        return self._execute(self._plan.extend(conversation_id, messages))  # type: ignore[no-any-return]

    def set_score(self, conversation_id: str, seq: int, score: float) -> StoredMessage:
        """Set a message's base importance (finite, >= 0)."""
        return self._execute(self._plan.set_score(conversation_id, seq, score))  # type: ignore[no-any-return]

    def pin(self, conversation_id: str, seq: int) -> StoredMessage:
        """Pin a message: every view keeps it (with its tool unit), like a system message."""
        return self._execute(self._plan.set_pinned(conversation_id, seq, True))  # type: ignore[no-any-return]

    def unpin(self, conversation_id: str, seq: int) -> StoredMessage:
        """Unpin a message.

        A pinned message that ``summarize`` left out of a summary (every view kept it)
        is in no summary: unpinning it deletes the summaries whose range reaches its
        seq, so [`SummaryView`][memstore.SummaryView] shows it again ([summaries](summaries.md)).
        """
        return self._execute(self._plan.set_pinned(conversation_id, seq, False))  # type: ignore[no-any-return]

    # ---- reading --------------------------------------------------------------------

    def messages(
        self,
        conversation_id: str,
        *,
        start: int | None = None,
        stop: int | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[StoredMessage]:
        """Stored messages with ``start <= seq < stop``, chronological or newest first.

        ``[]`` for a conversation that was never written (no error: see ``window``).
        """
        plan = self._plan.messages(conversation_id, start, stop, limit, newest_first)
        return self._execute(plan)  # type: ignore[no-any-return]

    def get_message(self, conversation_id: str, seq: int) -> StoredMessage:
        """One stored message; MessageNotFoundError when there is none at ``seq``."""
        return self._execute(self._plan.get_message(conversation_id, seq))  # type: ignore[no-any-return]

    def count_tokens(self, conversation_id: str) -> int:
        """Sum of the stored per-message token counts of a conversation (O(1)); 0 if unknown."""
        return self._execute(self._plan.count_tokens(conversation_id))  # type: ignore[no-any-return]

    def window(self, conversation_id: str, view: ContextView) -> ContextWindow:
        """Assemble a context window through ``view``. Reading never writes.

        Cost grows with the window, not the history: the view reads the
        conversation newest-first in pages and stops when older messages can no
        longer change its result.

        The messages are shared with the store's row cache, so they are read-only all
        the way down: changing a message's ``metadata``, ``content`` parts or
        ``tool_calls`` raises `ReadOnlyError`; change a copy
        (``message.model_copy(deep=True)``).

        A conversation that was never written has an empty window (its report's
        ``conversation_exists`` is ``False``), as ``messages`` and ``count_tokens``
        are empty: an agent's first turn needs no special case.

        Raises:
            ContextBudgetError: anchored messages and the newest complete unit do not
                fit a budgeted view's limit.
            InvalidInputError: a bad conversation id, or ``view`` is not a
                [`ContextView`][memstore.ContextView].
            ConfigurationError: a custom view's ``select`` returned no
                [`ContextWindow`][memstore.ContextWindow].
        """
        return self._execute(self._plan.window(conversation_id, view))  # type: ignore[no-any-return]

    def context(self, conversation_id: str, view: ContextView) -> ChatContext:
        """A stateful handle on one conversation read through ``view``."""
        return ChatContext(self, conversation_id, view)

    # ---- destructive ----------------------------------------------------------------

    def pop(self, conversation_id: str, n: int = 1) -> list[StoredMessage]:
        """Delete and return the ``n`` newest messages (chronological)."""
        return self._execute(self._plan.pop(conversation_id, n))  # type: ignore[no-any-return]

    def truncate(self, conversation_id: str, *, before_seq: int) -> int:
        """Delete messages with ``seq < before_seq``; returns how many were deleted."""
        return self._execute(self._plan.truncate(conversation_id, before_seq))  # type: ignore[no-any-return]

    def clear(self, conversation_id: str) -> int:
        """Delete every message (the conversation stays; seqs restart at 1)."""
        return self._execute(self._plan.clear(conversation_id))  # type: ignore[no-any-return]

    def rewrite(
        self,
        conversation_id: str,
        fn: Callable[[list[StoredMessage]], Iterable[Message]],
        *,
        newest: int | None = None,
    ) -> list[StoredMessage]:
        """Replace the newest messages of a conversation with what ``fn`` makes of them.

        One write transaction, with the conversation locked as ``pop`` and ``append``
        lock it: reads the ``newest`` newest messages, calls ``fn(messages)``
        (chronological) and stores the sequence it returns in their place, at contiguous
        seqs from the first seq read (after the last stored seq when nothing was read).
        A concurrent ``append`` lands before or after the rewrite, never inside it, and
        is never lost. A read-modify-write built from ``messages``/``pop``/``extend``
        is two or more transactions and can lose it.

        What ``fn`` returns decides what is kept:

        * a [`StoredMessage`][memstore.StoredMessage] (one of ``messages``, or a ``model_copy`` of
          one)
          keeps its id, ``created_at``, score, pin, name and metadata; only its seq
          changes;
        * a plain [`Message`][memstore.Message] is a new message: its ``id`` if it has one, else a
          new one (as `extend()` does), and the current time as ``created_at``.

        Token counts: a message with the id of a message read and the same content keeps
        the count stored for it; every other message is counted with the store's counter.
        Rows that do not change stay in place, and when nothing changes at all nothing is
        written. Stored summaries that reach the first position where the old and new
        sequences differ in content (another id there, or the same id with other
        content) are deleted: they describe replaced messages. The conversation gets a
        new epoch, so every row cache (in every process) drops its stale rows (unless
        the rewrite only appended after the messages read, which, like ``append``,
        leaves cached rows valid).

        ``fn`` runs inside the transaction, holding the conversation's write lock (on
        SQLite, the database's): keep it quick. A store call from inside it would wait
        for the rewrite itself, so it is refused with ``InvalidInputError``. It
        must be a plain function (on [`AsyncMemoryStore`][memstore.AsyncMemoryStore] too, where it
        runs in a worker thread). If it raises, the exception propagates and nothing is
        written.

        Example:
            >>> from memstore import MemoryStore, Message
            >>> store = MemoryStore("sqlite://")
            >>> _ = store.extend("c", [Message.user("hi"), Message.assistant("draft")])
            >>> store.rewrite(
            ...     "c", lambda ms: [ms[0].model_copy(update={"content": "final"})], newest=1
            ... )[0].text
            'final'
            >>> store.close()

        Args:
            conversation_id: the conversation.
            fn: ``list[StoredMessage] -> list[Message | StoredMessage]``: the replacement
                of the messages it is given.
            newest: how many of the newest messages to read and replace (``None``: all
                of them, which reads the whole conversation; ``0``: none, so ``fn``'s
                result is appended).

        Returns:
            The replacement as stored, chronological.

        Raises:
            ConversationNotFoundError: unknown conversation (``fn`` is not called).
            InvalidInputError: a bad argument (``fn`` a coroutine function, ``newest``
                negative), or a result of ``fn`` that is not a list of messages, or that
                repeats a message id (nothing is written).
            ConflictError: a replacement's id is the id of a stored message that is not
                replaced (nothing is written).
        """
        return self._execute(self._plan.rewrite(conversation_id, fn, newest))  # type: ignore[no-any-return]

    # ---- state ----------------------------------------------------------------------

    def save_state(self, conversation_id: str) -> ConversationState:
        """Snapshot a conversation as a versioned, JSON-serialisable document."""
        return self._execute(self._plan.save_state(conversation_id))  # type: ignore[no-any-return]

    def load_state(
        self,
        state: ConversationState | dict[str, Any] | str | TextIO,
        conversation_id: str | None = None,
        replace: bool = True,
    ) -> Conversation:
        """Write a snapshot into a conversation, in one transaction.

        Token counts are recomputed, not trusted (see `restore_state()`, which
        also reports what was recounted).

        Args:
            state: a ConversationState, its dict, its JSON text, or a text file
                holding it (a `dump_state()` file is read incrementally).
            conversation_id: the target; default: the snapshot's own id.
            replace: make the conversation exactly the snapshot (default: seqs,
                timestamps, scores and ids kept); ``False`` appends the snapshot's
                messages after the stored ones.
        """
        return self.restore_state(state, conversation_id, replace=replace).conversation

    # ---- search ---------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        conversation_id: str | Sequence[str] | None = None,
        where: Mapping[str, str | int | bool | None] | None = None,
        roles: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 10,
        context: int = 0,
        mark: tuple[str, str] = DEFAULT_MARK,
    ) -> list[SearchHit]:
        """Find stored messages by their words, best match first.

        Searches every conversation, or those named, for the messages whose text,
        tool-call names and arguments, or tool results match ``query`` (see
        [search](search.md) for what is indexed and the two databases' differences).

        The query language is PostgreSQL's ``websearch_to_tsquery``'s: plain words are
        ANDed, ``"a quoted phrase"`` matches in order, ``OR`` between two terms matches
        either, ``-word`` excludes. Matching ignores case (and, on SQLite and for
        PostgreSQL's folded text, Latin diacritics). Any query is searched or refused
        with ``InvalidInputError`` naming the problem.

        Args:
            query: what to look for.
            conversation_id: one conversation id, a list of them, or ``None`` for all.
            where: conversation-metadata equality filters (as ``list_conversations``'s).
            roles: only messages of these roles (e.g. ``["user", "assistant"]``).
            since: only messages created at or after this time (timezone-aware).
            until: only messages created before this time (timezone-aware).
            limit: most hits returned (1–1,000).
            context: messages of context each hit carries on each side (0–50).
            mark: what wraps each matched word in a hit's snippet.

        Returns:
            The hits ([`SearchHit`][memstore.SearchHit]), best first. A search reads one
            snapshot and never writes.

        Raises:
            InvalidInputError: a bad argument or a query that cannot be searched
                (nothing is read).
            MissingDependencyError: SQLite without FTS5 (the message names the fix).
        """
        plan = self._plan.search(query, conversation_id, where, roles, since, until, limit,
                                 context, mark)
        return self._execute(plan)  # type: ignore[no-any-return]

    # ---- streaming ------------------------------------------------------------------

    def iter_messages(
        self,
        conversation_id: str,
        *,
        start: int | None = None,
        stop: int | None = None,
        page_size: int = _streaming.DEFAULT_PAGE_SIZE,
    ) -> Iterator[StoredMessage]:
        """Iterate over the messages with ``start <= seq < stop``, in seq order.

        Reads keyset pages of ``page_size`` messages (each one indexed range read),
        all from one snapshot: the iteration sees the conversation as it was at the
        first page, whatever is written meanwhile, and memory stays bounded by one
        page however long the conversation is. Arguments are checked at once; a
        conversation that was never written gives no messages. Close the
        iterator (or exhaust it) to release its connection.

        An in-memory database (``sqlite://``) has one connection, which cannot hold a
        snapshot while others write: each page is its own read there. The iteration
        still ends at the newest message of the first page's read, but a message
        ``pop`` removed meanwhile is returned as whatever replaced its seq.

        Args:
            conversation_id: the conversation.
            start: the first seq wanted (default: the oldest stored).
            stop: one past the last seq wanted (default: the newest).
            page_size: messages per page (1–100000).
        """
        cid, start, stop, size = _streaming.check_page_args(conversation_id, start, stop, page_size)
        return (m for _, page in self._stream(cid, start, stop, size, missing_ok=True)
                for m in page)

    def _stream(
        self, cid: str, start: int | None, stop: int | None, size: int,
        summaries: list[Summary] | None = None, *, missing_ok: bool = False,
    ) -> Generator[tuple[Conversation | None, list[StoredMessage]], None, None]:
        """Keyset pages from one snapshot; the first item carries the conversation.

        With ``summaries`` given, the first page also reads the conversation's
        summaries into that list (from the header's snapshot).
        """
        _base.refuse_call(self._closed)
        pager = _streaming.Pager(size, _streaming.snapshot_pages(self._engine.url))
        conn: Connection | None = None
        try:
            while True:
                # The turn of an in-memory database (the only one without a held
                # snapshot) is taken per page: held across a yield, it was released by
                # whichever thread resumed the iterator last, and blocked every other.
                with self._turn, translate_db_errors():
                    if conn is None:
                        conn = self._engine.connect()
                    head, page, more = _streaming.read_stream_page(conn, pager, cid, start, stop,
                                                              summaries, missing_ok)
                    if not pager.snapshot:
                        conn.close()
                        conn = None
                yield head, page
                if not more:
                    return
        finally:
            if conn is not None:
                conn.close()

    def dump_state(
        self, conversation_id: str, fp: TextIO, *, view: ContextView | None = None,
        page_size: int = _streaming.DEFAULT_PAGE_SIZE,
    ) -> Conversation:
        """Write a snapshot of a conversation to a text file, one message per line.

        The same JSON document as ``save_state(conversation_id).to_json()`` (any
        JSON reader, and `load_state()`, read it), written incrementally from
        one read snapshot in keyset pages: memory stays bounded however long the
        conversation is. `load_state()` reads such a file back incrementally.

        Args:
            conversation_id: the conversation.
            fp: a text file open for writing.
            view: a view whose configuration is saved with the snapshot.
            page_size: messages read per page.

        Returns:
            The conversation as snapshotted (its ``message_count`` messages were written).
        """
        cid, _, _, size = _streaming.check_page_args(conversation_id, None, None, page_size)
        _stateio.check_writable(fp, "dump_state")
        config = _base.view_config(_base.check_view(view) if view is not None else None)
        summaries: list[Summary] = []
        stream = self._stream(cid, None, None, size, summaries)
        try:
            head, first = next(stream)
            assert head is not None
            writer = _stateio.StateWriter(fp, head, config, summaries)
            writer.write(first)
            for _, page in stream:
                writer.write(page)
            writer.close()
        finally:
            stream.close()
        return head

    def restore_state(
        self,
        state: ConversationState | dict[str, Any] | str | TextIO,
        conversation_id: str | None = None,
        *,
        replace: bool = True,
    ) -> LoadReport:
        """`load_state()`, returning a report of what was written and recounted.

        ``state`` may also be a text file holding a snapshot (from `dump_state()`
        or ``to_json()``); a `dump_state()` file is read incrementally and
        written in batches, still in one transaction, so memory stays bounded.

        A snapshot's token counts are not trusted: every message is recounted with
        the counter named by its ``token_counter`` when this process can build it,
        else with the store's counter (and relabelled). ``LoadReport.recounted``
        says how many counts changed.

        Raises:
            pydantic.ValidationError: the snapshot is malformed (nothing is written).
            InvalidInputError: a line of a snapshot file is malformed, or the file is
                truncated (nothing is written).
            ConflictError: ``replace=False`` and a message id is already stored.
        """
        replace = check_flag(replace, "replace")
        if _stateio.is_file(state):
            head, messages = _stateio.read_state(state)  # type: ignore[arg-type]
            cid = _streaming.stream_target(conversation_id, head)
            recounter = _snapshots.Recounter(self._plan.counter)
            with self._write_connection() as conn:
                conversation, written = _snapshots.load_stream(
                    conn, head, messages, cid, replace, recounter)
            return LoadReport(conversation=conversation, messages=written, written=written,
                              recounted=recounter.recounted)
        plan, recounter, count = _streaming.restore_plan(self._plan, state, conversation_id,
                                                         replace)
        conversation = self._execute(plan)
        return LoadReport(conversation=conversation, messages=count, written=count,
                          recounted=recounter.recounted)

    @contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        """One write transaction (committed when the block ends without an exception)."""
        _base.refuse_call(self._closed)
        with self._turn, translate_db_errors(), self._engine.connect() as conn:
            conn.execution_options(**write_options())
            with conn.begin():
                yield conn

    # ---- summaries ------------------------------------------------------------------

    def summarize(
        self,
        conversation_id: str,
        summarizer: Summarizer,
        *,
        keep_tokens: int,
        counter: TokenCounter | None = None,
    ) -> Summary | None:
        """Fold the units that aged out into a new stored summary (incremental).

        Keeps out of the summary the newest complete unit (the turn being answered,
        whatever its size) and the units before it while the kept units hold at most
        ``keep_tokens`` tokens (anchored messages aside: every view keeps them
        anyway), and summarizes every older complete unit that the latest summary
        does not cover yet. The summarizer receives the latest summary (as one
        ``system`` message, see [`Summary.to_message()`][memstore.Summary.to_message]), if there is
        one,
        followed by only those units' messages, and returns the new summary's text
        (a ``str`` or a [`Message`][memstore.Message]). The new summary's range runs from the first
        summarized
        seq to the newest seq folded in, so it contains the previous range. The
        original messages stay stored; [`SummaryView`][memstore.SummaryView] shows the
        latest summary and the recent tail.

        The summarizer is called with no transaction open. Concurrent calls on one
        conversation serialise on its row when they store their summary: a call
        whose summary is no longer based on the latest one (another call stored
        first) reads again and summarizes what is left, so the result is the same
        as running them one after the other.

        Args:
            conversation_id: the conversation.
            summarizer: ``list[Message] -> str | Message``, synchronous (an async one
                is refused: use [`AsyncMemoryStore`][memstore.AsyncMemoryStore]).
            keep_tokens: tokens of recent units to leave out of the summary (>= 0).
            counter: counts ``keep_tokens`` and the summary (default: the store's).

        Returns:
            The new summary, or the latest one (``None`` if there is none) when no
            complete unit aged out since it was made; the summarizer is then not
            called.

        Raises:
            ConversationNotFoundError: unknown conversation.
            InvalidInputError: a bad argument, or a summarizer result that is not a
                non-empty ``str`` or ``Message`` (nothing is written).
            ConflictError: concurrent summaries or rewrites won every attempt.
        """
        steps = self._plan.summarize(conversation_id, summarizer, keep_tokens, counter)
        value: Any = None
        while True:
            try:
                step = steps.send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            value = self._execute(step) if isinstance(step, Plan) else step.call_sync()

    def summaries(self, conversation_id: str) -> list[Summary]:
        """Every stored summary of a conversation, oldest first."""
        return self._execute(self._plan.summaries(conversation_id))  # type: ignore[no-any-return]


class ChatContext:
    """One conversation read through one view (autogen's ChatCompletionContext, persisted).

    Created by [`MemoryStore.context()`][memstore.MemoryStore.context]. ``add_message`` stores at
    once;
    ``get_messages`` returns the view's window. Unlike autogen, ``save_state``
    snapshots the stored history (every message, not the view) plus the view's
    configuration, and ``load_state`` is one transaction.
    """

    def __init__(self, store: MemoryStore, conversation_id: str, view: ContextView) -> None:
        self._store = store
        self.conversation_id, self.view = _base.check_context(
            store, MemoryStore, conversation_id, view)

    def add_message(self, message: MessageLike) -> StoredMessage:
        """Store a message."""
        return self._store.append(self.conversation_id, message)

    def get_messages(self) -> list[StoredMessage | Message]:
        """The view's window as a list of messages (empty before the first message)."""
        return list(self.get_window().messages)

    def get_window(self) -> ContextWindow:
        """The view's window with its token count and report."""
        return self._store.window(self.conversation_id, self.view)

    def clear(self) -> int:
        """Delete every stored message of the conversation (0 if it has none)."""
        try:
            return self._store.clear(self.conversation_id)
        except ConversationNotFoundError:
            return 0

    def save_state(self) -> ConversationState:
        """Snapshot the conversation with this context's view configuration.

        Before the first message (or after the conversation was deleted): an empty
        snapshot, as `get_messages()` is empty then.
        """
        plan = self._store._plan.save_state(self.conversation_id, self.view)
        try:
            return self._store._execute(plan)  # type: ignore[no-any-return]
        except ConversationNotFoundError:
            return _base.empty_state(self.conversation_id, self.view)

    def load_state(self, state: ConversationState | dict[str, Any] | str) -> None:
        """Replace the conversation with ``state`` (one transaction)."""
        self._store.load_state(state, self.conversation_id, replace=True)

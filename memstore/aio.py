"""``AsyncMemoryStore``: the full store on asyncio, built from the same plans as the sync one.

Example:
    >>> import asyncio
    >>> from memstore import AsyncMemoryStore, Message, TokenLimitedView
    >>> async def main() -> list[str]:
    ...     async with AsyncMemoryStore("sqlite+aiosqlite://") as store:
    ...         await store.append("chat-1", Message.user("Hello!"))
    ...         window = await store.window("chat-1", TokenLimitedView(token_limit=4000))
    ...         return [m["role"] for m in window.to_openai()]
    >>> asyncio.run(main())
    ['user']

Each method validates its arguments and builds a `memstore._base.Plan`
exactly as [`memstore.MemoryStore`][memstore.MemoryStore] does; the plan's SQL (in
`memstore._db.ops`) runs through ``AsyncConnection.run_sync``, so there is one
implementation. Large batches are validated and tokenised in a worker thread, and
inserted in chunks, so the event loop keeps running during a big ``extend``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import nullcontext, suppress
from datetime import datetime
from typing import Any, Literal, TextIO, overload

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from memstore import _base, _streaming
from memstore._base import Durability, MessageLike, MigrateMode, Plan, Summarizer
from memstore._db import snapshots as _snapshots
from memstore._db import stateio as _stateio
from memstore._db.cache import DEFAULT_CACHE_SIZE, CacheInfo
from memstore._db.engine import make_async_engine, turn_of, write_options
from memstore._store_lifecycle import AsyncLifecycleMethods
from memstore._validate import check_flag
from memstore.errors import (
    ConfigurationError,
    ConnectionLostError,
    ConversationNotFoundError,
    translate_db_errors,
)
from memstore.migrate import amigration_turn
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

__all__ = ["AsyncChatContext", "AsyncMemoryStore"]

#: Batches larger than this are validated and tokenised in a worker thread.
THREAD_PREPARE_THRESHOLD = 16


class AsyncMemoryStore(AsyncLifecycleMethods):
    """[`memstore.MemoryStore`][memstore.MemoryStore] on asyncio: same methods, as coroutines.

    Args:
        url: database URL; sync URLs are mapped to asyncio drivers
            (``sqlite://`` → aiosqlite, ``postgresql://`` → psycopg 3 async;
            ``postgresql+asyncpg://`` is used as given). Default: ``MEMSTORE_URL``,
            else ``sqlite:///./memstore.db``.
        engine: an existing `sqlalchemy.ext.asyncio.AsyncEngine`, used as is.
        counter: the default token counter (default: offline tiktoken cl100k_base).
        migrate: as for MemoryStore; applied on first use (or ``await store.setup()``).
        busy_timeout: seconds a SQLite writer waits for the write lock.
        cache_size: messages of decoded rows the store keeps in process memory, so a
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
        **engine_options: passed to `create_async_engine()` (one pool per store,
            sized by you: ``pool_size``, ``max_overflow``…).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: AsyncEngine | None = None,
        counter: TokenCounter | None = None,
        migrate: MigrateMode = "auto",
        busy_timeout: float = 30.0,
        cache_size: int = DEFAULT_CACHE_SIZE,
        durability: Durability = "full",
        **engine_options: Any,
    ) -> None:
        self._closed = False
        self._mode, self._plan, self._owns_engine, self._engine = _base.open_engine(
            url, engine, counter, migrate, busy_timeout, engine_options,
            cache_size=cache_size, durability=durability,
            make=make_async_engine, sync_engine_of=lambda e: e.sync_engine,
        )
        self._ready = False
        self._ready_lock = asyncio.Lock()
        # An in-memory database's one connection: calls take turns on it (tasks).
        self._turn: Any = _task_turn_of(self._engine) or nullcontext()
        # The event loop the store's locks and pooled connections belong to, and the
        # calls running on it (see _on_this_loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = 0
        self._generation = 0  # (counted per loop: see _on_this_loop)
        self._loop_guard = threading.Lock()
        # Whether close() released the pool (an injected engine is never disposed).
        self._disposed = not self._owns_engine

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy async engine the store uses."""
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

    def _on_this_loop(self) -> _LoopCall:
        """Run one call on the running event loop, moving the store to it if it is new.

        asyncio locks and SQLAlchemy's async pool belong to the loop that first used
        them: a store used from a second loop (``asyncio.run`` twice, pytest's loop per
        test) failed with a raw ``RuntimeError`` as soon as two calls contended. When no
        call is running on the previous loop, the store moves: new locks, and a new pool
        (the previous loop's connections are closed). Two loops at once (threads each
        running one) is a `ConfigurationError`: open one store per loop.

        (An async context manager object rather than a generator one: every call of
        the store enters it, and this costs a third as much.)
        """
        return _LoopCall(self)

    def _enter_loop(self) -> tuple[int, Any]:
        """Count a call on the running loop: (the loop's count generation, a move to await)."""
        loop = asyncio.get_running_loop()
        moved = None
        with self._loop_guard:
            if self._loop is not loop:
                previous = self._loop
                if self._active and previous is not None and not previous.is_closed():
                    raise ConfigurationError(
                        "this AsyncMemoryStore is in use on another event loop (another "
                        "thread's); an async store serves one event loop at a time: open "
                        "one store per loop"
                    )
                if previous is not None:
                    moved = self._move_to_this_loop()
                # Calls counted on a loop that is closed (a stream never closed, whose
                # generator the loop did not finalize) can no longer run: a new count.
                self._active = 0
                self._generation += 1
                self._loop = loop
            self._active += 1
            return self._generation, moved

    def _leave_loop(self, generation: int) -> bool:
        """Uncount a call; whether it must release the pool (close() came meanwhile)."""
        with self._loop_guard:
            if generation == self._generation:
                self._active -= 1
            last = self._closed and not self._active and not self._disposed
            if last:
                self._disposed = True
            return last

    def _move_to_this_loop(self) -> Any:
        """Renew the loop-bound parts now; the coroutine that closes the old pool's connections.

        The new pool is in place before any other call on the new loop can check a
        connection out. An in-memory database keeps its pool: its one connection is the
        database.
        """
        self._ready_lock = asyncio.Lock()
        if isinstance(self._turn, _TaskTurn):
            return None  # (the turn renews its lock itself: see _TaskTurn)
        sync_engine = self._engine.sync_engine
        old = sync_engine.pool
        sync_engine.pool = old.recreate()

        async def close_old() -> None:
            with suppress(Exception):  # the previous loop's connections: best effort
                await greenlet_spawn(old.dispose)

        return close_old()

    async def setup(self) -> None:
        """Apply the ``migrate`` policy now (otherwise done on first use).

        Raises:
            SchemaOutOfDateError: the server schema is behind memstore's head.
        """
        _base.refuse_closed(self._closed)
        async with self._on_this_loop():
            await self._setup_here()

    async def _setup_here(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            _base.check_database_exists(self._engine.url, self._mode)
            async with self._turn:
                await self._ensure_schema()
            self._ready = True

    async def _ensure_schema(self) -> None:
        """Read the schema revision; migrate as the ``migrate`` policy says."""
        with translate_db_errors():
            # Read the schema revision without the write lock; take it only to migrate.
            async with self._engine.connect() as conn, conn.begin():
                needs_write = await conn.run_sync(_base.schema_needs_write, self._mode)
            if needs_write:
                # The process's migration lock first, then the database's (see migrate).
                async with amigration_turn(), self._engine.connect() as conn:
                    await conn.execution_options(**write_options())
                    async with conn.begin():
                        await conn.run_sync(_base.ensure_schema, self._mode)

    async def _execute(self, plan: Plan) -> Any:
        _base.refuse_call(self._closed)
        async with self._on_this_loop():
            return await self._execute_here(plan)

    async def _execute_here(self, plan: Plan) -> Any:
        await self._setup_here()
        prepared = None
        if plan.prepare is not None:
            if plan.prepare_items > THREAD_PREPARE_THRESHOLD:
                prepared = await asyncio.to_thread(plan.prepare)
            else:
                prepared = plan.prepare()
        async with self._turn:
            try:
                with translate_db_errors():
                    async with self._engine.connect() as conn:
                        return await conn.run_sync(plan.run, prepared)
            except ConnectionLostError:
                if plan.write:
                    raise  # the caller decides: a retry with the same client ids is exactly-once
            # A read on a dead pooled connection (server restart) is retried once.
            with translate_db_errors():
                async with self._engine.connect() as conn:
                    return await conn.run_sync(plan.run, prepared)

    async def close(self) -> None:
        """Release the store's connections (an injected engine is left open).

        The store then refuses every database call
        (`StoreClosedError`; ``cache_info()`` still answers);
        closing it again does nothing. Calls already running finish, and the last of
        them releases the connections.
        """
        with self._loop_guard:
            self._closed = True
            now = not self._active and not self._disposed
            if now:
                self._disposed = True
        if now:
            await self._engine.dispose()
        # Otherwise the last call still running disposes of the pool when it ends, so
        # the connections it holds are closed too (they went back to a pool nobody
        # closed, and leaked).

    async def __aenter__(self) -> AsyncMemoryStore:
        await self.setup()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- conversations --------------------------------------------------------------

    async def create_conversation(
        self, id: str | None = None, metadata: dict[str, Any] | None = None
    ) -> Conversation:
        """Create an empty conversation.

        See [`MemoryStore.create_conversation()`][memstore.MemoryStore.create_conversation].
        """
        return await self._execute(self._plan.create_conversation(id, metadata))  # type: ignore[no-any-return]

    async def get_conversation(self, id: str) -> Conversation:
        """Return one conversation.

        See [`MemoryStore.get_conversation()`][memstore.MemoryStore.get_conversation].
        """
        return await self._execute(self._plan.get_conversation(id))  # type: ignore[no-any-return]

    async def delete_conversation(self, id: str) -> None:
        """Delete a conversation and its messages.

        See [`MemoryStore.delete_conversation()`][memstore.MemoryStore.delete_conversation].
        """
        await self._execute(self._plan.delete_conversation(id))

    async def stats(self) -> StoreStats:
        """Totals of the whole database.

        See [`MemoryStore.stats()`][memstore.MemoryStore.stats].
        """
        return await self._execute(self._plan.stats())  # type: ignore[no-any-return]

    # ---- writing --------------------------------------------------------------------

    async def append(self, conversation_id: str, message: MessageLike) -> StoredMessage:
        """Store one message (see [`MemoryStore.append()`][memstore.MemoryStore.append])."""
        return await self._execute(self._plan.append(conversation_id, message))  # type: ignore[no-any-return]

    @overload
    async def extend(self, conversation_id: str,
                     messages: Iterable[MessageLike]) -> list[StoredMessage]:
        ...

    @overload
    async def extend(self, conversation_id: str, messages: Iterable[MessageLike], *,
                     return_messages: Literal[True]) -> list[StoredMessage]:
        ...

    @overload
    async def extend(self, conversation_id: str, messages: Iterable[MessageLike], *,
                     return_messages: Literal[False]) -> int:
        ...

    async def extend(self, conversation_id: str, messages: Iterable[MessageLike], *,
                     return_messages: bool = True) -> list[StoredMessage] | int:
        """Store several messages atomically.

        See [`MemoryStore.extend()`][memstore.MemoryStore.extend]. With
        ``return_messages=False`` the messages are read and counted in chunks inside the
        transaction, in the event loop's thread (the count of a chunk holds the loop
        briefly); a plain iterable, not an async one.
        """
        if not check_flag(return_messages, "return_messages"):
            return await self._execute(  # type: ignore[no-any-return]
                self._plan.extend_stream(conversation_id, messages))
        return await self._execute(  # type: ignore[no-any-return]
            self._plan.extend(conversation_id, messages))

    async def set_score(self, conversation_id: str, seq: int, score: float) -> StoredMessage:
        """Set a message's base importance.

        See [`MemoryStore.set_score()`][memstore.MemoryStore.set_score].
        """
        return await self._execute(self._plan.set_score(conversation_id, seq, score))  # type: ignore[no-any-return]

    async def pin(self, conversation_id: str, seq: int) -> StoredMessage:
        """Pin a message (see [`MemoryStore.pin()`][memstore.MemoryStore.pin])."""
        return await self._execute(self._plan.set_pinned(conversation_id, seq, True))  # type: ignore[no-any-return]

    async def unpin(self, conversation_id: str, seq: int) -> StoredMessage:
        """Unpin a message (see [`MemoryStore.unpin()`][memstore.MemoryStore.unpin])."""
        return await self._execute(self._plan.set_pinned(conversation_id, seq, False))  # type: ignore[no-any-return]

    # ---- reading --------------------------------------------------------------------

    async def messages(
        self,
        conversation_id: str,
        *,
        start: int | None = None,
        stop: int | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[StoredMessage]:
        """Stored messages in a seq range.

        See [`MemoryStore.messages()`][memstore.MemoryStore.messages].
        """
        plan = self._plan.messages(conversation_id, start, stop, limit, newest_first)
        return await self._execute(plan)  # type: ignore[no-any-return]

    async def get_message(self, conversation_id: str, seq: int) -> StoredMessage:
        """One stored message.

        See [`MemoryStore.get_message()`][memstore.MemoryStore.get_message].
        """
        return await self._execute(self._plan.get_message(conversation_id, seq))  # type: ignore[no-any-return]

    async def count_tokens(self, conversation_id: str) -> int:
        """Stored token total.

        See [`MemoryStore.count_tokens()`][memstore.MemoryStore.count_tokens].
        """
        return await self._execute(self._plan.count_tokens(conversation_id))  # type: ignore[no-any-return]

    async def window(self, conversation_id: str, view: ContextView) -> ContextWindow:
        """Assemble a context window (see [`MemoryStore.window()`][memstore.MemoryStore.window])."""
        return await self._execute(self._plan.window(conversation_id, view))  # type: ignore[no-any-return]

    def context(self, conversation_id: str, view: ContextView) -> AsyncChatContext:
        """A stateful async handle on one conversation read through ``view``."""
        return AsyncChatContext(self, conversation_id, view)

    # ---- destructive ----------------------------------------------------------------

    async def pop(self, conversation_id: str, n: int = 1) -> list[StoredMessage]:
        """Delete and return the newest messages.

        See [`MemoryStore.pop()`][memstore.MemoryStore.pop].
        """
        return await self._execute(self._plan.pop(conversation_id, n))  # type: ignore[no-any-return]

    async def truncate(self, conversation_id: str, *, before_seq: int) -> int:
        """Delete older messages (see [`MemoryStore.truncate()`][memstore.MemoryStore.truncate])."""
        return await self._execute(self._plan.truncate(conversation_id, before_seq))  # type: ignore[no-any-return]

    async def clear(self, conversation_id: str) -> int:
        """Delete every message (see [`MemoryStore.clear()`][memstore.MemoryStore.clear])."""
        return await self._execute(self._plan.clear(conversation_id))  # type: ignore[no-any-return]

    async def rewrite(
        self,
        conversation_id: str,
        fn: Callable[[list[StoredMessage]], Iterable[Message]],
        *,
        newest: int | None = None,
    ) -> list[StoredMessage]:
        """Replace the newest messages with what ``fn`` makes of them, in one transaction.

        See [`MemoryStore.rewrite()`][memstore.MemoryStore.rewrite]. ``fn`` is a plain function (a
        coroutine
        function is refused with InvalidInputError): it runs inside the write
        transaction, in a worker thread, so the event loop keeps running meanwhile.
        """
        return await self._execute(self._plan.rewrite(conversation_id, fn, newest))  # type: ignore[no-any-return]

    # ---- state ----------------------------------------------------------------------

    async def save_state(self, conversation_id: str) -> ConversationState:
        """Snapshot a conversation.

        See [`MemoryStore.save_state()`][memstore.MemoryStore.save_state].
        """
        return await self._execute(self._plan.save_state(conversation_id))  # type: ignore[no-any-return]

    async def load_state(
        self,
        state: ConversationState | dict[str, Any] | str | TextIO,
        conversation_id: str | None = None,
        replace: bool = True,
    ) -> Conversation:
        """Write a snapshot into a conversation.

        See [`MemoryStore.load_state()`][memstore.MemoryStore.load_state].
        """
        report = await self.restore_state(state, conversation_id, replace=replace)
        return report.conversation

    # ---- search ---------------------------------------------------------------------

    async def search(
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

        See [`MemoryStore.search()`][memstore.MemoryStore.search].
        """
        plan = self._plan.search(query, conversation_id, where, roles, since, until, limit,
                                 context, mark)
        return await self._execute(plan)  # type: ignore[no-any-return]

    # ---- streaming ------------------------------------------------------------------

    def iter_messages(
        self,
        conversation_id: str,
        *,
        start: int | None = None,
        stop: int | None = None,
        page_size: int = _streaming.DEFAULT_PAGE_SIZE,
    ) -> AsyncIterator[StoredMessage]:
        """Iterate over messages in keyset pages from one snapshot (``async for``).

        See [`MemoryStore.iter_messages()`][memstore.MemoryStore.iter_messages].
        """
        cid, start, stop, size = _streaming.check_page_args(conversation_id, start, stop, page_size)
        return self._iter(cid, start, stop, size)

    def _iter(
        self, cid: str, start: int | None, stop: int | None, size: int
    ) -> AsyncIterator[StoredMessage]:
        return _Messages(self._stream(cid, start, stop, size, missing_ok=True))

    async def _stream(
        self, cid: str, start: int | None, stop: int | None, size: int,
        summaries: list[Summary] | None = None, *, missing_ok: bool = False,
    ) -> AsyncGenerator[tuple[Conversation | None, list[StoredMessage]], None]:
        # One generator, not a chain of them: when a loop shuts down it closes every
        # unfinished async generator at once, and a generator closing the one it wraps
        # meanwhile fails ("coroutine ignored GeneratorExit").
        _base.refuse_call(self._closed)
        async with self._on_this_loop():  # the whole stream: it holds a connection
            await self._setup_here()
            pager = _streaming.Pager(size, _streaming.snapshot_pages(self._engine.url))
            conn: AsyncConnection | None = None
            try:
                while True:
                    # The turn of an in-memory database (the only one without a held
                    # snapshot) is taken per page: held across a yield, it blocked every
                    # other task (``gather``, a task group, ``wait_for`` on 3.11) until
                    # the stream ended.
                    async with self._turn:
                        with translate_db_errors():
                            if conn is None:
                                conn = await self._engine.connect()
                            head, page, more = await conn.run_sync(
                                _streaming.read_stream_page, pager, cid, start, stop, summaries,
                                missing_ok)
                            if not pager.snapshot:
                                await conn.close()
                                conn = None
                    yield head, page
                    if not more:
                        return
            finally:
                if conn is not None:
                    await conn.close()

    async def dump_state(
        self, conversation_id: str, fp: TextIO, *, view: ContextView | None = None,
        page_size: int = _streaming.DEFAULT_PAGE_SIZE,
    ) -> Conversation:
        """Write a snapshot to a text file incrementally.

        See [`MemoryStore.dump_state()`][memstore.MemoryStore.dump_state].

        ``fp`` is written synchronously, one page at a time.
        """
        cid, _, _, size = _streaming.check_page_args(conversation_id, None, None, page_size)
        _stateio.check_writable(fp, "dump_state")
        config = _base.view_config(_base.check_view(view) if view is not None else None)
        summaries: list[Summary] = []
        stream = self._stream(cid, None, None, size, summaries)
        try:
            head, first = await stream.__anext__()
            assert head is not None
            writer = _stateio.StateWriter(fp, head, config, summaries)
            writer.write(first)
            async for _, page in stream:
                writer.write(page)
            writer.close()
        finally:
            await stream.aclose()
        return head

    async def restore_state(
        self,
        state: ConversationState | dict[str, Any] | str | TextIO,
        conversation_id: str | None = None,
        *,
        replace: bool = True,
    ) -> LoadReport:
        """Load a snapshot and report what was recounted.

        See [`MemoryStore.restore_state()`][memstore.MemoryStore.restore_state].

        A snapshot file is read synchronously, batch by batch, inside the transaction.
        """
        _base.refuse_call(self._closed)
        replace = check_flag(replace, "replace")
        await self.setup()
        if _stateio.is_file(state):
            async with self._on_this_loop():
                return await self._restore_file(state, conversation_id, replace)
        if isinstance(state, ConversationState):
            plan, recounter, count = _streaming.restore_plan(
                self._plan, state, conversation_id, replace)
        else:  # parsing a dict or JSON snapshot is tens of ms per 10,000 messages
            plan, recounter, count = await asyncio.to_thread(
                _streaming.restore_plan, self._plan, state, conversation_id, replace)
        conversation = await self._execute(plan)
        return LoadReport(conversation=conversation, messages=count, written=count,
                          recounted=recounter.recounted)

    async def _restore_file(self, state: Any, conversation_id: str | None,
                            replace: bool) -> LoadReport:
        head, messages = _stateio.read_state(state)
        cid = _streaming.stream_target(conversation_id, head)
        recounter = _snapshots.Recounter(self._plan.counter)
        with translate_db_errors():
            async with self._turn, self._engine.connect() as conn:
                await conn.execution_options(**write_options())
                async with conn.begin():
                    conversation, written = await conn.run_sync(
                        _snapshots.load_stream, head, messages, cid, replace, recounter)
        return LoadReport(conversation=conversation, messages=written, written=written,
                          recounted=recounter.recounted)

    # ---- summaries ------------------------------------------------------------------

    async def summarize(
        self,
        conversation_id: str,
        summarizer: Summarizer,
        *,
        keep_tokens: int,
        counter: TokenCounter | None = None,
    ) -> Summary | None:
        """Fold aged-out units into a new stored summary.

        See [`MemoryStore.summarize()`][memstore.MemoryStore.summarize].

        ``summarizer`` may be a coroutine function (awaited) or a plain callable (run
        in a worker thread, so a blocking model call does not stall the event loop).
        """
        steps = self._plan.summarize(conversation_id, summarizer, keep_tokens, counter)
        value: Any = None
        while True:
            try:
                step = steps.send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, Plan):
                value = await self._execute(step)
            else:
                value = await step.call_async()

    async def summaries(self, conversation_id: str) -> list[Summary]:
        """Every stored summary of a conversation.

        See [`MemoryStore.summaries()`][memstore.MemoryStore.summaries].
        """
        return await self._execute(self._plan.summaries(conversation_id))  # type: ignore[no-any-return]


class AsyncChatContext:
    """`memstore.store.ChatContext` on asyncio (``await ctx.add_message(...)``)."""

    def __init__(self, store: AsyncMemoryStore, conversation_id: str, view: ContextView) -> None:
        self._store = store
        self.conversation_id, self.view = _base.check_context(
            store, AsyncMemoryStore, conversation_id, view)

    async def add_message(self, message: MessageLike) -> StoredMessage:
        """Store a message."""
        return await self._store.append(self.conversation_id, message)

    async def get_messages(self) -> list[StoredMessage | Message]:
        """The view's window as a list of messages (empty before the first message)."""
        return list((await self.get_window()).messages)

    async def get_window(self) -> ContextWindow:
        """The view's window with its token count and report."""
        return await self._store.window(self.conversation_id, self.view)

    async def clear(self) -> int:
        """Delete every stored message of the conversation (0 if it has none)."""
        try:
            return await self._store.clear(self.conversation_id)
        except ConversationNotFoundError:
            return 0

    async def save_state(self) -> ConversationState:
        """Snapshot the conversation with this context's view configuration.

        Before the first message (or after the conversation was deleted): an empty
        snapshot, as `get_messages()` is empty then.
        """
        plan = self._store._plan.save_state(self.conversation_id, self.view)
        try:
            return await self._store._execute(plan)  # type: ignore[no-any-return]
        except ConversationNotFoundError:
            return _base.empty_state(self.conversation_id, self.view)

    async def load_state(self, state: ConversationState | dict[str, Any] | str) -> None:
        """Replace the conversation with ``state`` (one transaction)."""
        await self._store.load_state(state, self.conversation_id, replace=True)


class _LoopCall:
    """One store call on the running event loop (see ``AsyncMemoryStore._on_this_loop``)."""

    __slots__ = ("_generation", "_store")

    def __init__(self, store: AsyncMemoryStore) -> None:
        self._store = store
        self._generation = 0

    async def __aenter__(self) -> None:
        self._generation, moved = self._store._enter_loop()
        if moved is not None:
            try:
                await moved
            except BaseException:
                await self.__aexit__()
                raise

    async def __aexit__(self, *exc: object) -> None:
        if self._store._leave_loop(self._generation):
            # close() came while calls ran: the last one releases the pool
            await self._store._engine.dispose()


class _Messages:
    """The messages of a stream's pages, one at a time: what ``iter_messages`` returns.

    A plain async iterator over the one page generator (see ``_stream``), so there is a
    single generator to close; `aclose()` closes it (and releases its connection).
    """

    def __init__(self, pages: AsyncGenerator[tuple[Conversation | None, list[StoredMessage]],
                                             None]) -> None:
        self._pages = pages
        self._page: Iterator[StoredMessage] = iter(())

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> StoredMessage:
        while True:
            message = next(self._page, None)
            if message is not None:
                return message
            _, page = await self._pages.__anext__()  # StopAsyncIteration ends it
            self._page = iter(page)

    async def aclose(self) -> None:
        """Stop early: release the stream's connection now."""
        await self._pages.aclose()


def _task_turn_of(engine: AsyncEngine) -> _TaskTurn | None:
    """The turn tasks take on ``engine``'s one shared connection (in-memory SQLite), or ``None``.

    One per engine, like `memstore._db.engine.turn_of()`: every async store on an
    injected in-memory engine shares it (a turn per store let two stores interleave
    their transactions on the one connection).
    """
    sync_engine = engine.sync_engine
    if turn_of(sync_engine) is None:
        return None
    with _TASK_TURNS_GUARD:
        turn: _TaskTurn | None = getattr(sync_engine, "_memstore_task_turn", None)
        if turn is None:
            turn = _TaskTurn()
            sync_engine._memstore_task_turn = turn  # type: ignore[attr-defined]
    return turn


_TASK_TURNS_GUARD = threading.Lock()


class _TaskTurn:
    """An asyncio lock that the task holding it may take again (re-entrant per task).

    The turn on an in-memory database's one connection: tasks wait for each other,
    while a task reading a stream may still call the store. Its asyncio lock belongs to
    one event loop; taken on another while free, it is replaced by one of that loop.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owner: asyncio.Task[Any] | None = None
        self._depth = 0

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is not None and task is self._owner:
            self._depth += 1
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop and not self._lock.locked():
            self._lock, self._loop = asyncio.Lock(), loop
        await self._lock.acquire()
        self._owner, self._depth = task, 1

    async def __aexit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

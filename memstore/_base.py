"""What the sync and async stores share: configuration, argument checks, preparation.

The stores differ only in how they reach a ``Connection``: ``MemoryStore`` opens
one, ``AsyncMemoryStore`` hands the same function to ``AsyncConnection.run_sync``.
Everything else (validation, token counting, the SQL in `memstore._db.ops`, view
selection in `memstore.views`) is written once, here and there.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import math
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine

from memstore import migrate
from memstore._db import ops as _ops
from memstore._db import rewrite as _rewrite
from memstore._db import rows as _rows
from memstore._db import search_query as _search_query
from memstore._db import snapshots as _snapshots
from memstore._db import statements as _statements
from memstore._db import window as _window
from memstore._db.cache import CacheInfo, RowCache
from memstore._db.engine import (
    apply_options,
    check_durability,
    default_url,
    install_sqlite_hooks,
    read_options,
    write_options,
)
from memstore._validate import (
    MAX_SEQ,
    check_counter_name,
    check_flag,
    check_json,
    check_json_size,
    check_token_count,
    is_async_callable,
    refuse_awaitable,
    short_repr,
    text_problem,
)
from memstore.context.strategies import summary_text
from memstore.errors import (
    ConfigurationError,
    ConflictError,
    DatabaseNotFoundError,
    InvalidInputError,
    StoreClosedError,
)
from memstore.models import (
    MAX_ID_LENGTH,
    Conversation,
    ConversationState,
    Message,
    StoredMessage,
    Summary,
    checked_message,
)
from memstore.tokens import TokenCounter, count_each, default_counter, validate_counter
from memstore.views import ContextView

T = TypeVar("T")
E = TypeVar("E")

MigrateMode = Literal["auto", "check", "upgrade", "off"]
Durability = Literal["full", "normal"]
MIGRATE_MODES = ("auto", "check", "upgrade", "off")

MessageLike = Message | Mapping[str, Any]

#: What ``summarize`` calls: messages in, the summary's text (or a Message) out.
#: ``MemoryStore`` needs a synchronous one; ``AsyncMemoryStore`` also awaits coroutines.
Summarizer = Callable[[list[Message]], str | Message | Awaitable[str | Message]]


def run_in_transaction(
    conn: Connection,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    write: bool,
    snapshot: bool,
) -> T:
    """Run ``fn(conn, *args)`` in one transaction of the right kind.

    Writes are ``BEGIN IMMEDIATE`` on SQLite (see `memstore._db.engine`); reads that
    span several statements get one snapshot. Any exception rolls everything back.
    """
    options = write_options() if write else read_options(conn.dialect.name, snapshot=snapshot)
    apply_options(conn, options)
    with conn.begin():
        return fn(conn, *args)


def run_without_transaction(conn: Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """Run a read ``fn(conn, *args)`` with no transaction: each statement autocommits.

    For reads that validate themselves across statements and raise
    `memstore._db.window.StaleRead` otherwise (the window path). SQLite connections
    already autocommit until memstore emits ``BEGIN``; a PostgreSQL connection is
    switched to autocommit (the driver's client-side flag, reset before the connection
    is used otherwise, see `memstore._db.rows.autocommit_on()`), so no
    ``BEGIN``/``COMMIT`` round trips are made.
    """
    if conn.dialect.name != "postgresql":
        return fn(conn, *args)
    dbapi = _rows.autocommit_on(conn)
    try:
        return fn(conn, *args)
    finally:
        _rows.autocommit_off(conn, dbapi)


def schema_needs_write(conn: Connection, mode: MigrateMode) -> bool:
    """Apply the ``migrate`` policy as far as a read allows (no write lock taken).

    Reads the stamped revision. A revision this memstore does not know raises
    `SchemaTooNewError` in every mode (``"off"`` included: it never writes
    into a newer schema). At head, or with ``"off"``: nothing to do (``False``).
    Behind: ``True`` when the mode upgrades (the caller then runs
    `ensure_schema()` in a write transaction), else `SchemaOutOfDateError`.

    Also compiles the hot statements for the connection's dialect (see
    `memstore._db.statements.precompile()`): opening a store pays that, not the first
    window or append of a fresh process.
    """
    _statements.precompile(conn.dialect)
    at = migrate._current(conn)
    migrate.refuse_newer(at)
    if mode == "off" or set(at) == set(migrate.heads()):
        return False
    if mode == "upgrade" or (mode == "auto" and conn.dialect.name == "sqlite"):
        return True
    migrate.check_connection(conn)
    return False  # pragma: no cover - check_connection raised


def check_database_exists(url: Any, mode: MigrateMode) -> None:
    """Check a SQLite file path before connecting (SQLite's own error names no path).

    ``migrate="check"``/``"off"`` never create a SQLite file: a missing one is
    `DatabaseNotFoundError`. In every mode a path that is a directory, or (in a
    mode that creates the file) one whose directory does not exist, is a
    `ConfigurationError` naming it.
    """
    if url.get_backend_name() != "sqlite":
        return
    read_only = mode in ("check", "off")
    if migrate._missing_sqlite_file(url, create=not read_only) and read_only:
        raise DatabaseNotFoundError(url.database)


def ensure_schema(conn: Connection, mode: MigrateMode) -> None:
    """Apply the store's ``migrate`` policy on an open connection (in a write transaction)."""
    if mode == "off":
        return
    embedded = conn.dialect.name == "sqlite"
    if mode == "upgrade" or (mode == "auto" and embedded):
        migrate.upgrade_connection(conn)
    else:
        migrate.check_connection(conn)


def open_engine(
    url: str | None,
    engine: E | None,
    counter: TokenCounter | None,
    migrate: str,
    busy_timeout: float,
    engine_options: dict[str, Any],
    *,
    cache_size: int,
    make: Callable[..., E],
    sync_engine_of: Callable[[E], Engine],
    durability: str = "full",
) -> tuple[MigrateMode, Planner, bool, E]:
    """What both stores do on construction: check arguments, pick the counter, get an engine.

    Returns ``(migrate mode, planner, whether the store owns the engine, engine)``.
    An injected engine is used as is, apart from memstore's SQLite connection hooks.
    """
    if url is not None and engine is not None:
        raise ConfigurationError("pass either url or engine, not both")
    mode = check_migrate_mode(migrate)
    if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 0:
        raise ConfigurationError(f"cache_size must be an int >= 0, got {_short(cache_size)}")
    busy_timeout = check_busy_timeout(busy_timeout)
    chosen = default_counter() if counter is None else validate_counter(counter, "store counter")
    if counter is not None:
        check_counter_name(chosen)
    planner = Planner(chosen,
                      RowCache(cache_size) if cache_size else None)
    durability = check_durability(durability)
    if engine is None:
        made = make(url if url is not None else default_url(), busy_timeout=busy_timeout,
                    durability=durability,
                    **engine_options)
        return mode, planner, True, made
    install_sqlite_hooks(sync_engine_of(engine), busy_timeout=busy_timeout,
                         durability=durability)
    return mode, planner, False, engine


#: Longest SQLite busy timeout, in seconds (SQLite takes it in milliseconds as a
#: signed 32-bit integer).
MAX_BUSY_TIMEOUT = 2_000_000.0


def check_busy_timeout(value: Any) -> float:
    """Validate ``busy_timeout``: a finite number of seconds in [0, MAX_BUSY_TIMEOUT]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"busy_timeout must be a number of seconds, got {_short(value)}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_BUSY_TIMEOUT:
        raise ConfigurationError(
            f"busy_timeout must be a finite number of seconds in [0, {MAX_BUSY_TIMEOUT:g}], "
            f"got {_short(value)}"
        )
    return seconds


def check_migrate_mode(mode: str) -> MigrateMode:
    """Validate the ``migrate=`` argument."""
    if mode not in MIGRATE_MODES:
        raise ConfigurationError(
            f"migrate must be one of {', '.join(MIGRATE_MODES)}, not {_short(mode)}"
        )
    return mode  # type: ignore[return-value]


def check_conversation_id(cid: Any) -> str:
    """Validate a conversation id (1–255 characters of storable text: no NUL, no surrogate)."""
    if not isinstance(cid, str):
        raise InvalidInputError(f"conversation id must be a str, not {type(cid).__name__}")
    if not cid:
        raise InvalidInputError("conversation id must not be empty")
    if len(cid) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"conversation id is {len(cid)} characters long; the maximum is {MAX_ID_LENGTH}"
        )
    problem = text_problem(cid)
    if problem is not None:
        raise InvalidInputError(f"conversation id {_short(cid)} {problem}")
    return cid


def new_conversation_id(cid: str | None) -> str:
    """The given id (validated) or a fresh UUID string."""
    return str(uuid.uuid4()) if cid is None else check_conversation_id(cid)


_short = short_repr


def check_seq(seq: Any, name: str = "seq") -> int:
    """Validate a seq argument naming one message (an int in [1, MAX_SEQ])."""
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise InvalidInputError(f"{name} must be an int >= 1, got {_short(seq)}")
    if seq > MAX_SEQ:
        raise InvalidInputError(f"{name} must be at most 2**62 (no message has a larger seq), "
                                f"got {_short(seq)}")
    return seq


def check_bound(value: Any, name: str) -> int | None:
    """Validate a seq bound (``start``/``stop``/``before_seq``): an int or None.

    No message has a seq outside ``[1, MAX_SEQ]``, so the bound is clamped to
    ``[0, MAX_SEQ + 1]`` (same result, and it fits both databases' integers).
    """
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInputError(f"{name} must be an int or None, got {_short(value)}")
    return min(max(value, 0), MAX_SEQ + 1)


def check_count(n: Any, name: str) -> int:
    """Validate a count argument (an int >= 0); counts above MAX_SEQ mean "all"."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InvalidInputError(f"{name} must be an int >= 0, got {_short(n)}")
    return min(n, MAX_SEQ)


def check_score(score: Any) -> float:
    """Validate a base score (finite, >= 0)."""
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise InvalidInputError(f"score must be a number, got {_short(score)}")
    try:
        value = float(score)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"score must be finite and >= 0, got {_short(score)}")
    return value + 0.0  # -0.0 becomes 0.0, as Message does


def check_metadata(metadata: Any) -> dict[str, Any]:
    """Validate conversation metadata (a JSON object both databases read back exactly)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a JSON object, not {type(metadata).__name__}")
    try:
        check_json(metadata, "metadata")
        check_json_size(metadata, "metadata")
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    return dict(metadata)


def coerce_message(message: Any) -> Message:
    """Accept a Message (a StoredMessage is re-written as its plain fields) or an OpenAI dict.

    A Message that skipped validation (``model_copy(update=...)``, ``model_construct``,
    a metadata dict changed in place) is validated again: see
    `memstore.models.checked_message()`.
    """
    if isinstance(message, StoredMessage):
        return message.as_message()
    if isinstance(message, Message):
        return checked_message(message)
    if isinstance(message, Mapping):
        return Message.from_openai(message)
    raise InvalidInputError(
        f"a message must be a memstore Message or an OpenAI message dict, "
        f"not {type(message).__name__}"
    )


def prepare(counter: TokenCounter, messages: Iterable[Any]) -> list[_rows.Prepared]:
    """Validate every message and count its tokens, before any database work.

    A batch is counted through the counter's ``count_each`` (see
    `memstore.tokens.count_each()`): the default counter spreads a large one across
    threads.
    """
    items = list(map(coerce_message, messages))
    counts = [counter.count_message(items[0])] if len(items) == 1 else count_each(counter, items)
    return [_rows.Prepared(m, check_token_count(counter, n)) for m, n in zip(items, counts)]


def check_view(view: Any) -> ContextView:
    """Ensure ``view`` is a context view (an instance of a ContextView subclass)."""
    if not isinstance(view, ContextView):
        raise InvalidInputError(
            f"{_short(view)} is not a context view (subclass memstore.ContextView to write one)"
        )
    return view


def check_context(store: Any, store_type: type, cid: Any, view: Any) -> tuple[str, ContextView]:
    """A chat context's ``(conversation id, view)``, its store checked to be ``store_type``.

    The sync and async contexts both run it when made, directly or by ``store.context``.
    """
    if not isinstance(store, store_type):
        name = store_type.__name__
        raise InvalidInputError(
            f"a chat context needs {'an' if name[0] in 'AEIOU' else 'a'} {name}, "
            f"not {type(store).__name__}"
        )
    return check_conversation_id(cid), check_view(view)


def view_config(view: Any) -> dict[str, Any] | None:
    """A view's serialisable configuration (``None`` when there is no view)."""
    if view is None:
        return None
    return dict(view.to_config())


def coerce_state(state: Any) -> ConversationState:
    """Accept a ConversationState, its dict, or its JSON text.

    An instance is validated again: one edited with ``model_copy(update=...)``, or holding
    messages that were (pydantic validates neither, nor the models nested in an
    instance), could otherwise store values the rules refuse (NaN metadata, a lone
    surrogate, a tool message without its call id, a seq past the range).
    """
    if isinstance(state, ConversationState):
        return ConversationState.model_validate(state.model_dump())
    if isinstance(state, (str, bytes)):
        return ConversationState.model_validate_json(state)
    if isinstance(state, Mapping):
        return ConversationState.model_validate(dict(state))
    raise InvalidInputError(
        f"state must be a ConversationState, a dict or JSON text, not {type(state).__name__}"
    )


@dataclass(frozen=True)
class Plan:
    """One store call, ready to run: what both stores execute.

    Attributes:
        fn: an `memstore._db.ops` (or `memstore._db.snapshots`) function, called as
            ``fn(conn, *args[, prepared])``.
        args: its arguments (already validated).
        write: run in a write transaction.
        snapshot: read several statements from one snapshot.
        prepare: CPU work done before the transaction (validation, tokenisation);
            its result is passed as the last argument. The async store runs it in a
            worker thread so the event loop keeps going.
        prepare_items: how many items ``prepare`` handles (the async store's hint).
        optimistic: first try without a transaction (the read validates itself and
            raises `memstore._db.window.StaleRead` when it must be redone in one).
        direct: tried first, with no transaction open, called like ``fn``: it runs
            its own transaction on the DBAPI connection (see
            `memstore._db.ops.append_direct()`) or returns ``None``, untouched, when
            it does not apply; ``fn`` then runs as usual.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    write: bool = False
    snapshot: bool = False
    prepare: Callable[[], Any] | None = None
    prepare_items: int = 0
    optimistic: bool = False
    direct: Callable[..., Any] | None = None

    def run(self, conn: Connection, prepared: Any = None) -> Any:
        """Execute on ``conn`` inside one transaction (or optimistically without one)."""
        args = self.args if self.prepare is None else (*self.args, prepared)
        if self.direct is not None:
            done = self.direct(conn, *args)
            if done is not None:
                return done
        if self.optimistic:
            try:
                return run_without_transaction(conn, self.fn, args)
            except _window.StaleRead:
                pass  # a rewrite landed between two statements: read in one snapshot
        return run_in_transaction(conn, self.fn, args, self.write, self.snapshot)


class Planner:
    """Validates the arguments of every public store method and returns its Plan.

    The sync and async stores hold one planner each; their public methods differ
    only in whether they ``await`` the plan's execution.
    """

    def __init__(self, counter: TokenCounter, cache: RowCache | None = None) -> None:
        self.counter = counter
        self.cache = cache

    # the row cache (no I/O)
    def clear_cache(self) -> None:
        if self.cache is not None:
            self.cache.clear()

    def cache_info(self) -> CacheInfo:
        return self.cache.info() if self.cache is not None else CacheInfo(0, 0, 0, 0, 0)

    # conversations
    def create_conversation(self, id: Any, metadata: Any) -> Plan:
        return Plan(_ops.create_conversation, (new_conversation_id(id), check_metadata(metadata)),
                    write=True)

    def get_conversation(self, id: Any) -> Plan:
        return Plan(_ops.get_conversation, (check_conversation_id(id),))

    def delete_conversation(self, id: Any) -> Plan:
        return Plan(_ops.delete_conversation, (check_conversation_id(id),), write=True)

    def stats(self) -> Plan:
        return Plan(_ops.stats, snapshot=True)

    # writing
    def extend(self, conversation_id: Any, messages: Iterable[Any], *, one: bool = False) -> Plan:
        cid = check_conversation_id(conversation_id)
        if isinstance(messages, (str, bytes, Mapping, Message)):
            raise InvalidInputError("extend expects a list of messages, not a single message")
        try:
            items = list(messages)
        except TypeError:
            raise InvalidInputError(
                f"extend expects an iterable of messages, not {type(messages).__name__}"
            ) from None
        if self.cache is not None:
            self.cache.note(cid)  # the next window's rows are worth caching
        fn = _ops.append_one if one else _ops.append_messages
        direct = _ops.append_direct_one if one else _ops.append_direct
        return Plan(fn, (cid, self.counter.name), write=True,
                    prepare=lambda: prepare(self.counter, items), prepare_items=len(items),
                    direct=direct)

    def extend_stream(self, conversation_id: Any, messages: Iterable[Any]) -> Plan:
        """``extend(..., return_messages=False)``: read, check and write chunk by chunk.

        The messages are consumed inside the write transaction, ``INSERT_CHUNK`` at a
        time (each checked and counted, then inserted), so memory stays bounded by one
        chunk however many there are; any failure (a bad message, the iterable's own
        exception) rolls every chunk back.
        """
        cid = check_conversation_id(conversation_id)
        if isinstance(messages, (str, bytes, Mapping, Message)):
            raise InvalidInputError("extend expects a list of messages, not a single message")
        try:
            iterator = iter(messages)
        except TypeError:
            raise InvalidInputError(
                f"extend expects an iterable of messages, not {type(messages).__name__}"
            ) from None
        counter = self.counter

        def chunks() -> Iterator[list[_rows.Prepared]]:
            while True:
                items = list(itertools.islice(iterator, _ops.INSERT_CHUNK))
                if not items:
                    return
                yield prepare(counter, items)

        if self.cache is not None:
            self.cache.note(cid)
        return Plan(_ops.append_stream, (cid, counter.name, chunks()), write=True)

    def append(self, conversation_id: Any, message: Any) -> Plan:
        return self.extend(conversation_id, [message], one=True)

    def set_score(self, conversation_id: Any, seq: Any, score: Any) -> Plan:
        return Plan(_ops.set_score, (check_conversation_id(conversation_id), check_seq(seq),
                                     check_score(score)), write=True)

    def set_pinned(self, conversation_id: Any, seq: Any, pinned: bool) -> Plan:
        return Plan(_ops.set_pinned, (check_conversation_id(conversation_id), check_seq(seq),
                                      pinned), write=True)

    # reading
    def messages(self, conversation_id: Any, start: Any, stop: Any, limit: Any,
                 newest_first: Any) -> Plan:
        cid = check_conversation_id(conversation_id)
        start = check_bound(start, "start")
        stop = check_bound(stop, "stop")
        if limit is not None:
            limit = check_count(limit, "limit")
        return Plan(_ops.read_messages,
                    (cid, start, stop, limit, check_flag(newest_first, "newest_first")),
                    snapshot=True)

    def get_message(self, conversation_id: Any, seq: Any) -> Plan:
        return Plan(_ops.get_message, (check_conversation_id(conversation_id), check_seq(seq)))

    def count_tokens(self, conversation_id: Any) -> Plan:
        return Plan(_ops.count_tokens, (check_conversation_id(conversation_id),))

    def window(self, conversation_id: Any, view: Any) -> Plan:
        cid = check_conversation_id(conversation_id)
        counter = check_view(view).resolve_counter(self.counter)
        return Plan(_window.window, (cid, view, counter, self.cache), snapshot=True,
                    optimistic=True)

    # destructive
    def pop(self, conversation_id: Any, n: Any) -> Plan:
        return Plan(_ops.pop, (check_conversation_id(conversation_id), check_count(n, "n")),
                    write=True)

    def truncate(self, conversation_id: Any, before_seq: Any) -> Plan:
        cid = check_conversation_id(conversation_id)
        if not isinstance(before_seq, int) or isinstance(before_seq, bool) or before_seq < 1:
            raise InvalidInputError(f"before_seq must be an int >= 1, got {_short(before_seq)}")
        # Clamped like a range bound: a larger before_seq deletes everything all the same.
        return Plan(_ops.truncate, (cid, min(before_seq, MAX_SEQ + 1)), write=True)

    def clear(self, conversation_id: Any) -> Plan:
        return Plan(_ops.clear, (check_conversation_id(conversation_id),), write=True)

    # state
    def save_state(self, conversation_id: Any, view: Any = None) -> Plan:
        cid = check_conversation_id(conversation_id)
        return Plan(_snapshots.save_state, (cid, view_config(view)),
                    snapshot=True)

    def load_state(self, state: Any, conversation_id: Any, replace: Any,
                   recounter: _snapshots.Recounter) -> Plan:
        """The plan of loading an in-memory snapshot.

        ``recounter`` recounts its messages before the transaction (the plan's
        ``prepare``: a worker thread on the async store, past a few messages).
        """
        parsed = coerce_state(state)
        cid = check_conversation_id(
            parsed.conversation.id if conversation_id is None else conversation_id)
        messages = parsed.messages
        # (``replace`` was checked by restore_state, before any file was read)
        return Plan(_snapshots.load_state, (parsed, cid, replace), write=True,
                    prepare=functools.partial(_snapshots.recount, recounter, messages),
                    prepare_items=len(messages))

    def rewrite(self, conversation_id: Any, fn: Any, newest: Any) -> Plan:
        """Validate ``rewrite``'s arguments; ``fn`` runs inside the plan's transaction."""
        cid = check_conversation_id(conversation_id)
        if not callable(fn):
            raise InvalidInputError(f"rewrite's fn must be callable, got {short_repr(fn)}")
        if is_async_callable(fn) or inspect.isasyncgenfunction(fn):
            raise InvalidInputError(
                "rewrite's fn must be a plain (synchronous) function: it runs inside the "
                "write transaction, on AsyncMemoryStore too (got a coroutine function)"
            )
        n = None if newest is None else check_count(newest, "newest")
        return Plan(_ops.rewrite, (cid, n, RewriteCall(fn, self.counter)), write=True)

    # summaries
    def summaries(self, conversation_id: Any) -> Plan:
        return Plan(_ops.read_summaries, (check_conversation_id(conversation_id),),
                    snapshot=True)

    def summarize(self, conversation_id: Any, summarizer: Any, keep_tokens: Any,
                  counter: Any) -> SummarizeSteps:
        """Validate ``summarize``'s arguments; the steps both stores drive."""
        cid = check_conversation_id(conversation_id)
        if not callable(summarizer):
            raise InvalidInputError(f"summarizer must be callable, got {_short(summarizer)}")
        keep = check_count(keep_tokens, "keep_tokens")
        if counter is not None:
            if not hasattr(counter, "count_message"):
                raise InvalidInputError(
                    f"counter must be a TokenCounter, got {short_repr(counter)}"
                )
            check_counter_name(counter)
            # One count up front: a counter that returns no int (None, a float, a
            # negative or huge number) is refused before anything is read or folded.
            check_token_count(counter, counter.count_message(Message(role="system",
                                                                     content="summary")))
        return summarize_steps(cid, summarizer, keep, counter if counter is not None
                               else self.counter)


    # search
    def search(self, query: Any, conversation_id: Any, where: Any, roles: Any, since: Any,
               until: Any, limit: Any, context: Any, mark: Any) -> Plan:
        """Validate ``search``'s arguments (the query parsed) into one snapshot read."""
        from memstore import search as _query
        from memstore._validate import check_where

        parsed = _query.parse_query(query)
        ids: tuple[str, ...] | None
        if conversation_id is None:
            ids = None
        elif isinstance(conversation_id, str):
            ids = (check_conversation_id(conversation_id),)
        elif isinstance(conversation_id, (list, tuple, set, frozenset)):
            if len(conversation_id) > _query.MAX_LIMIT:
                raise InvalidInputError(
                    f"conversation_id lists {len(conversation_id)} conversations; at most "
                    f"{_query.MAX_LIMIT} (or None: every conversation)")
            ids = tuple(dict.fromkeys(check_conversation_id(c) for c in conversation_id))
        else:
            raise InvalidInputError(
                "conversation_id must be a conversation id, a list of them, or None, got "
                f"{_short(conversation_id)}")
        since = _query.check_moment(since, "since")
        until = _query.check_moment(until, "until")
        request = _query.SearchRequest(
            query=parsed, conversation_ids=ids, where=check_where(where),
            roles=_query.check_roles(roles), since=since, until=until,
            limit=_query.check_limit(limit), context=_query.check_context(context),
            mark=_query.check_mark(mark))
        # One statement (up to four for one SQLite conversation: where its messages lie,
        # their matches, and when that walk runs out of time, the index's statistics and
        # a lookup per message) needs no transaction: every plan returns the messages
        # that match when it runs. Hits and their context are read from one snapshot.
        return Plan(_search_query.search, (request,), snapshot=True,
                    optimistic=request.context == 0)

@dataclass(frozen=True)
class RewriteCall:
    """The user's ``rewrite`` function, wrapped: called inside the write transaction.

    Calls ``fn`` with the messages read, checks its result (`replacements()`) and
    counts the tokens of what changed. Anything it raises rolls the rewrite back.
    """

    fn: Callable[[list[StoredMessage]], Any]
    counter: TokenCounter

    def __call__(self, messages: list[StoredMessage]) -> list[_rewrite.Replacement]:
        token = _IN_REWRITE.set(True)
        try:
            result = self.fn(list(messages))
            if (isinstance(result, Iterable) and not isinstance(
                    result, (list, tuple, str, bytes, Mapping, Message))):
                # A generator's body runs as it is consumed: inside the guard, so a
                # store call it makes is refused too (it would wait for this rewrite).
                result = list(result)
        finally:
            _IN_REWRITE.reset(token)
        return replacements(result, messages, self.counter)


#: True while a rewrite's ``fn`` runs (in its thread or task context).
_IN_REWRITE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "memstore_in_rewrite", default=False)


def refuse_closed(closed: bool) -> None:
    """Refuse a call on a closed store (it would open a pool nothing closes again)."""
    if closed:
        raise StoreClosedError(
            "this store was closed (close(), or the end of its with block): open a new "
            "store to go on")


def refuse_call(closed: bool) -> None:
    """What every store call that takes a connection checks first (both stores).

    Raises:
        StoreClosedError: the store was closed.
        InvalidInputError: the call comes from inside a rewrite's ``fn``.
    """
    refuse_closed(closed)
    refuse_inside_rewrite()


def refuse_inside_rewrite() -> None:
    """Refuse a store call made from inside a rewrite's ``fn`` (it would wait for itself).

    ``fn`` runs while the rewrite holds the conversation's lock (on SQLite, the
    database's write lock), so a write there would wait for the rewrite that waits for
    ``fn``: forever on PostgreSQL, ``busy_timeout`` on SQLite.
    """
    if _IN_REWRITE.get():
        raise InvalidInputError(
            "a memstore store was called from inside rewrite's fn: fn runs while the "
            "rewrite holds the conversation's lock, so the call would wait for the rewrite "
            "itself; build the replacement from the messages fn receives, and call the "
            "store after rewrite returns"
        )


def replacements(result: Any, read: list[StoredMessage],
                 counter: TokenCounter) -> list[_rewrite.Replacement]:
    """Check a rewrite function's result and make it storable.

    ``result`` must be an iterable of [`Message`][memstore.Message] (each stored as a new message:
    its ``id`` if it has one, else a new one, and the current time) or
    [`StoredMessage`][memstore.StoredMessage] (it keeps its id, ``created_at``, score, pin, name and
    metadata; only its seq changes). Ids must be unique within the result.

    Token counts: a message with the id of a message read and the same content (see
    [`Message.same_content()`][memstore.Message.same_content]) keeps that message's stored count and
    counter name;
    every other message is counted with ``counter`` (the store's), as ``extend`` counts.

    Raises:
        InvalidInputError: an awaitable, something that is not a list of messages, or an
            id given twice.
        pydantic.ValidationError: a message that is not valid (one changed with
            ``model_copy(update=...)`` is validated again, as ``extend`` validates).
    """
    refuse_awaitable(result, InvalidInputError(
        "rewrite's fn returned an awaitable: fn must be a plain (synchronous) function "
        "returning the replacement messages"))
    if isinstance(result, (str, bytes, Mapping, Message)) or not isinstance(result, Iterable):
        raise InvalidInputError(
            "rewrite's fn must return a list of Message or StoredMessage (the replacement), "
            f"not {type(result).__name__}"
        )
    items = list(result)
    seen: dict[str, int] = {}
    as_read = {id(m) for m in read}
    for i, m in enumerate(items):
        if not isinstance(m, Message):
            raise InvalidInputError(
                f"item {i} of rewrite's result is a {type(m).__name__}, not a Message or "
                "StoredMessage"
            )
        if id(m) not in as_read:
            # Validated again, as extend validates: model_copy(update=...) and
            # model_construct skip pydantic's checks (ValidationError names the field).
            # (a field model_construct left unset is missing, and reported so)
            m = items[i] = type(m).model_validate(
                {name: getattr(m, name) for name in type(m).model_fields if hasattr(m, name)})
        if m.id is not None:
            j = seen.setdefault(m.id, i)
            if j != i:
                raise InvalidInputError(
                    f"message id {_short(m.id)} is the id of items {j} and {i} of rewrite's result "
                    "(message ids are unique within a conversation)"
                )
    by_id = {m.id: m for m in read}
    counts: list[tuple[int, str] | None] = []
    missing: list[Message] = []
    for m in items:
        prior = by_id.get(m.id) if m.id is not None else None
        if prior is not None and prior.same_content(m):
            counts.append((prior.token_count, prior.token_counter))
        else:
            counts.append(None)
            missing.append(m)
    fresh = iter(count_each(counter, missing) if missing else [])
    out = []
    for m, known in zip(items, counts):
        tokens, name = known if known is not None else (
            check_token_count(counter, next(fresh)), counter.name)
        out.append(_rewrite.Replacement(
            m, m.id, m.created_at if isinstance(m, StoredMessage) else None, tokens, name))
    return out


#: How many times ``summarize`` reads again after a concurrent summary or rewrite
#: made its draft stale, before it gives up with ConflictError.
SUMMARIZE_ATTEMPTS = 8


@dataclass(frozen=True)
class SummarizerCall:
    """A step of `summarize_steps()`: call the user's summarizer (outside any transaction)."""

    summarizer: Callable[[list[Message]], Any]
    messages: list[Message]

    def call_sync(self) -> Any:
        """Call a synchronous summarizer (an async one is refused)."""
        result = self.summarizer(self.messages)
        refuse_awaitable(result, InvalidInputError(
            "the summarizer returned an awaitable: use AsyncMemoryStore.summarize for an "
            "async summarizer"))
        return result

    async def call_async(self) -> Any:
        """Await an async summarizer; run a sync one in a worker thread."""
        fn = self.summarizer
        if is_async_callable(fn):
            return await fn(self.messages)
        result = await asyncio.to_thread(fn, self.messages)
        if inspect.isawaitable(result):
            result = await result
        return result


SummarizeSteps = Generator[Plan | SummarizerCall, Any, Summary | None]


def summarize_steps(
    cid: str, summarizer: Callable[[list[Message]], Any], keep_tokens: int,
    counter: TokenCounter,
) -> SummarizeSteps:
    """``summarize`` as steps: read (one snapshot), call the summarizer, write (one lock).

    Yields `Plan` objects (the store runs each in its own transaction and
    sends back the result) and one `SummarizerCall` per attempt (the store
    calls the summarizer, with no transaction open, and sends back its output).
    Returns the new summary, or the latest one when nothing aged out since.

    The summarizer runs outside any transaction, so no lock is held while a model
    thinks. The write then takes the conversation row lock and checks that the
    summary the draft extends is still the latest and that no message changed other
    than by appending (the epoch); if either moved, a concurrent call won and this
    one reads again from the new state, exactly as if it had run after it.
    """
    for _ in range(SUMMARIZE_ATTEMPTS):
        draft: _ops.SummaryDraft = yield Plan(
            _ops.summarize_read, (cid, keep_tokens, counter), snapshot=True
        )
        if not draft.messages:
            return draft.previous
        inputs: list[Message] = list(draft.messages)
        if draft.previous is not None:
            inputs.insert(0, draft.previous.to_message())
        text = summary_text((yield SummarizerCall(summarizer, inputs)))
        tokens = check_token_count(counter, counter.count_message(Message(role="system",
                                                                          content=text)))
        stored: Summary | None = yield Plan(
            _ops.summarize_write, (draft, text, tokens, counter.name), write=True
        )
        if stored is not None:
            return stored
    raise ConflictError(
        f"summarize on conversation {cid!r} gave up after {SUMMARIZE_ATTEMPTS} attempts: "
        "concurrent summaries or rewrites kept landing first"
    )


def empty_state(conversation_id: str, view: ContextView) -> ConversationState:
    """The snapshot of a conversation that does not exist yet (a context before its first add).

    Loading it gives an empty conversation, as a context that was cleared.
    """
    now = _rows.utcnow()
    return ConversationState(
        conversation=Conversation(id=conversation_id, created_at=now, updated_at=now),
        messages=[], view=view_config(view),
    )

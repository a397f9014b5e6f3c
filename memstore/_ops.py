"""Database logic, written once: functions on a SQLAlchemy ``Connection``.

Each function runs inside a transaction its caller opened. ``MemoryStore`` calls
them directly; ``AsyncMemoryStore`` calls the very same functions through
``AsyncConnection.run_sync``. They take and return pydantic models only; rows
never leave this module.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from sqlalchemy import Connection, Row
from sqlalchemy import exc as sa_exc
from sqlalchemy.util import await_only

from memstore import _statements as q
from memstore._cache import RowCache
from memstore.errors import (
    ConflictError,
    ConversationNotFoundError,
    InvalidInputError,
    MessageNotFoundError,
)
from memstore.history import SourceBase
from memstore.models import (
    ANCHOR_ROLES,
    Conversation,
    ConversationState,
    ImagePart,
    ImageURL,
    Message,
    StoredMessage,
    StoreStats,
    Summary,
    TextPart,
    ToolCall,
    build_trusted,
)
from memstore.summary_view import plan_fold
from memstore.tokens import TokenCounter

__all__ = ["Prepared", "SQLHistory", "StaleRead", "SummaryDraft"]

#: Rows per INSERT batch: bounds statement size and, on asyncio, how long the
#: event loop runs Python code between two awaits of the driver.
INSERT_CHUNK = 500


#: The epoch of conversations written before migration 0002 (its server default):
#: nothing guarantees it changed with their rows, so windows trust no cache for them.
UNTRUSTED_EPOCH = 0


class StaleRead(Exception):
    """A window read outside a transaction saw its conversation change under it.

    Internal: the store reads the window again in one snapshot transaction.
    """


class Prepared(NamedTuple):
    """A validated message with its token count, computed before the transaction."""

    message: Message
    token_count: int


def new_message_id() -> str:
    """A store-assigned message id: a time-ordered UUID (version 7, RFC 9562).

    Ids land in the ``UNIQUE(conversation_id, message_id)`` index. Random (version 4)
    ids would insert at random places in it, so once the index outgrows the database's
    page cache every append reads a cold page and appends slow down as history grows;
    time-ordered ids insert at the index's right edge like the seq key does.
    """
    ms = time.time_ns() // 1_000_000
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | secrets.randbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562 variant
    return str(uuid.UUID(int=value))


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


# ---- rows <-> models ------------------------------------------------------------------


def _parts(raw: list[Any]) -> list[Any]:
    out: list[Any] = []
    for part in raw:
        if part.get("type") == "text":
            out.append(build_trusted(TextPart, {"type": "text", "text": part["text"]}))
        else:
            image = part["image_url"]
            url = build_trusted(ImageURL, {"url": image["url"], "detail": image.get("detail")})
            out.append(build_trusted(ImagePart, {"type": "image_url", "image_url": url}))
    return out


def to_stored(row: Any) -> StoredMessage:
    """Build a StoredMessage from a trusted row without re-validating it (hot path).

    ``row`` holds :data:`memstore._statements.MESSAGE_COLUMNS` with Python values
    (SQLAlchemy-processed, or decoded by :func:`decode_raw`).
    """
    (cid, seq, mid, role, text, parts, name, calls, call_id, score, pinned, tokens, counter,
     created_at, meta) = row
    content: Any = text if text is not None else (_parts(parts) if parts is not None else None)
    tool_calls = (
        [build_trusted(ToolCall, {"id": c["id"], "name": c["name"], "arguments": c["arguments"],
                           "type": "function"}) for c in calls]
        if calls is not None else None
    )
    return build_trusted(StoredMessage, {
        "role": role, "content": content, "name": name, "tool_calls": tool_calls,
        "tool_call_id": call_id, "score": float(score), "pinned": bool(pinned),
        "metadata": meta if meta is not None else {}, "id": mid,
        "conversation_id": cid, "seq": int(seq), "created_at": created_at,
        "token_count": int(tokens), "token_counter": counter,
    })


def _sqlite_time(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def decode_raw(row: Any, dialect: str) -> StoredMessage:
    """Build a StoredMessage from a driver row of MESSAGE_COLUMNS (no SQLAlchemy types).

    SQLite returns JSON as text and timestamps as naive UTC text; psycopg returns
    decoded JSONB and aware timestamps.
    """
    if dialect == "sqlite":
        values = list(row)
        for i in (5, 7, 14):  # content_parts, tool_calls, metadata
            if values[i] is not None:
                values[i] = json.loads(values[i])
        values[13] = _sqlite_time(values[13])
        return to_stored(values)
    created_at = row[13]
    if created_at.tzinfo is None:
        row = (*row[:13], created_at.replace(tzinfo=timezone.utc), row[14])
    elif created_at.utcoffset():
        row = (*row[:13], created_at.astimezone(timezone.utc), row[14])
    return to_stored(row)


def _message_row(
    cid: str, seq: int, p: Prepared, mid: str, counter: str, now: datetime
) -> dict[str, Any]:
    m = p.message
    content = m.content
    return {
        "conversation_id": cid,
        "seq": seq,
        "message_id": mid,
        "role": m.role,
        "content_text": content if isinstance(content, str) else None,
        "content_parts": (
            [part.model_dump(exclude_none=True) for part in content]
            if isinstance(content, list) else None
        ),
        "name": m.name,
        "tool_calls": (
            [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
            if m.tool_calls else None
        ),
        "tool_call_id": m.tool_call_id,
        "score": m.score,
        "pinned": m.pinned,
        "anchored": m.pinned or m.role in ANCHOR_ROLES,
        "token_count": p.token_count,
        "token_counter": counter,
        "created_at": now,
        # Empty metadata is stored as NULL: no JSON to decode when reading it back.
        "metadata": dict(m.metadata) or None,
    }


def _stored_from_row_dict(row: Mapping[str, Any], message: Message) -> StoredMessage:
    values = {name: getattr(message, name) for name in Message.model_fields}
    values.update(
        id=row["message_id"], conversation_id=row["conversation_id"], seq=row["seq"],
        created_at=row["created_at"], token_count=row["token_count"],
        token_counter=row["token_counter"],
    )
    return build_trusted(StoredMessage, values)


def _to_conversation(row: Row[Any]) -> Conversation:
    m = row._mapping
    return build_trusted(Conversation, {
        "id": m["id"], "created_at": m["created_at"], "updated_at": m["updated_at"],
        "metadata": m["metadata"] if m["metadata"] is not None else {},
        "message_count": int(m["last_seq"]) - int(m["first_seq"]) + 1,
        "token_count": int(m["token_count"]),
    })


# ---- conversations --------------------------------------------------------------------


def _conversation_row(conn: Connection, cid: str, *, for_update: bool = False) -> Row[Any]:
    row = conn.execute(q.conversation(cid, for_update=for_update)).first()
    if row is None:
        raise ConversationNotFoundError(cid)
    return row


def create_conversation(
    conn: Connection, cid: str, metadata: dict[str, Any]
) -> Conversation:
    """Create an empty conversation; ConflictError when the id is taken."""
    if conn.execute(q.conversation(cid)).first() is not None:
        raise ConflictError(f"conversation {cid!r} already exists")
    now = utcnow()
    conn.execute(q.insert_conversation({
        "id": cid, "created_at": now, "updated_at": now, "metadata": metadata,
        "first_seq": 1, "last_seq": 0, "token_count": 0, "max_score": 1.0,
        "epoch": q.new_epoch(),
    }))
    return _to_conversation(_conversation_row(conn, cid))


def get_conversation(conn: Connection, cid: str) -> Conversation:
    """One conversation."""
    return _to_conversation(_conversation_row(conn, cid))


def list_conversations(conn: Connection, limit: int, after: str | None) -> list[Conversation]:
    """Conversations ordered by id, after ``after``."""
    return [_to_conversation(r) for r in conn.execute(q.list_conversations(limit, after))]


#: Messages deleted per DELETE statement when a whole conversation goes (one transaction):
#: SQLite collects the rowids a DELETE removes in memory, so one statement over a
#: 1,000,000-message conversation would hold ~25 MB.
DELETE_CHUNK = 10_000


def delete_conversation(conn: Connection, cid: str) -> None:
    """Delete a conversation and all its messages (bounded memory, one transaction)."""
    conv = _conversation_row(conn, cid, for_update=True)
    first, last = int(conv.first_seq), int(conv.last_seq)
    for start in range(first, last + 1 - DELETE_CHUNK, DELETE_CHUNK):
        conn.execute(q.delete_messages(cid, start=start, stop=start + DELETE_CHUNK))
    conn.execute(q.delete_messages(cid))  # the rest (and any row outside the live range)
    conn.execute(q.delete_summaries(cid))
    conn.execute(q.delete_conversation(cid))


# ---- writes ---------------------------------------------------------------------------


def append_one(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> StoredMessage:
    """Append one message (see :func:`append_messages`)."""
    return append_messages(conn, cid, counter, batch)[0]


def append_messages(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> list[StoredMessage]:
    """Append a batch atomically; returns one StoredMessage per input, in input order.

    A message whose client id is already stored returns the stored row when its
    content is the same and raises ConflictError when it differs; a client id
    repeated inside the batch is stored once.
    """
    if not batch:
        return []
    dialect = conn.dialect.name
    now = utcnow()
    results: list[StoredMessage | None] = [None] * len(batch)
    fresh: list[int] = []
    repeats: dict[int, int] = {}
    if any(p.message.id is not None for p in batch):
        # Take the conversation lock before looking ids up, so a concurrent retry
        # of the same id cannot slip in between the check and the insert.
        conn.execute(*q.allocate_seqs(dialect, cid, now, 0, 0, 0.0))
        ids = sorted({p.message.id for p in batch if p.message.id is not None})
        stored = stored_by_ids(conn, cid, ids)
        first_with_id: dict[str, int] = {}
        for i, p in enumerate(batch):
            mid = p.message.id
            if mid is None:
                fresh.append(i)
                continue
            prior = stored.get(mid)
            if prior is not None:
                if not prior.same_content(p.message):
                    raise ConflictError(
                        f"message id {mid!r} is already stored in conversation {cid!r} "
                        f"(seq {prior.seq}) with different content"
                    )
                results[i] = prior
            elif mid in first_with_id:
                j = first_with_id[mid]
                if not batch[j].message.same_content(p.message):
                    raise ConflictError(
                        f"message id {mid!r} appears twice in the batch with different content"
                    )
                repeats[i] = j
            else:
                first_with_id[mid] = i
                fresh.append(i)
    else:
        fresh = list(range(len(batch)))

    if fresh:
        tokens = sum(batch[i].token_count for i in fresh)
        top = max(1.0, *(batch[i].message.score for i in fresh))
        last = conn.execute(*q.allocate_seqs(dialect, cid, now, len(fresh), tokens, top)
                            ).scalar_one()
        first_seq = int(last) - len(fresh) + 1
        insert = q.insert_messages()
        # Build, insert and wrap one chunk at a time: on asyncio each chunk's execute
        # awaits the driver, so the event loop runs between chunks.
        for start in range(0, len(fresh), INSERT_CHUNK):
            chunk = fresh[start:start + INSERT_CHUNK]
            rows = []
            for offset, i in enumerate(chunk, start=start):
                p = batch[i]
                mid = p.message.id if p.message.id is not None else new_message_id()
                rows.append(_message_row(cid, first_seq + offset, p, mid, counter, now))
            conn.execute(insert, rows)
            for i, row in zip(chunk, rows):
                results[i] = _stored_from_row_dict(row, batch[i].message)
    for i, j in repeats.items():
        results[i] = results[j]
    return [r for r in results if r is not None]


def stored_by_ids(conn: Connection, cid: str, ids: list[str]) -> dict[str, StoredMessage]:
    """The stored messages of ``cid`` with the given client ids, by id."""
    dialect = conn.dialect.name
    found: dict[str, StoredMessage] = {}
    for start in range(0, len(ids), q.ID_LOOKUP_CHUNK):
        chunk = ids[start:start + q.ID_LOOKUP_CHUNK]
        for row in conn.execute(q.messages_by_ids(dialect, cid, chunk)):
            message = to_stored(row)
            found[message.id] = message
    return found


def append_direct(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> list[StoredMessage] | None:
    """:func:`append_messages` as precompiled SQL on the DBAPI cursor, or ``None``.

    The common append (no client ids) pays SQLAlchemy's per-statement machinery and
    its begin/commit hooks several times over; this sends the same statements
    (built from the same schema, parameters through the same type processors) on the
    driver's cursor:

    * SQLite: ``BEGIN IMMEDIATE``, the seq allocation (``RETURNING last_seq``), the
      insert, ``COMMIT`` (a rollback on any failure): one transaction, as before.
    * PostgreSQL, one message: one statement in autocommit (``WITH alloc AS (INSERT
      INTO memstore_conversations ... ON CONFLICT DO UPDATE ... RETURNING last_seq)
      INSERT INTO memstore_messages SELECT ... FROM alloc``), so one round trip. The
      conversation row lock the allocation takes is held until that statement
      commits, so concurrent appends still get contiguous seqs.
    * PostgreSQL, several messages: the allocation and one ``executemany`` in the
      driver's transaction, then ``COMMIT`` (the row lock is held until then).

    Returns ``None`` (nothing done, the connection untouched) when the fast path does
    not apply: client ids in the batch (the idempotency lookup needs the transactional
    path), a batch larger than one insert
    chunk (:data:`INSERT_CHUNK`; big batches keep the chunked path, which lets the
    event loop run between chunks on asyncio), or a connection already inside a
    transaction. Must be called with no transaction open.
    """
    if not batch or len(batch) > INSERT_CHUNK or any(p.message.id is not None for p in batch):
        return None
    dialect = conn.dialect
    if conn.in_transaction():
        return None
    fair = conn.connection.driver_connection
    if getattr(fair, "in_transaction", False):  # a shared SQLite connection mid-write
        return None
    if dialect.name == "postgresql":
        if getattr(conn.connection.dbapi_connection, "autocommit", False):
            return None  # (never the case on a fresh checkout)
        if len(batch) == 1:
            return [_append_one_postgresql(conn, cid, counter, batch[0])]
    elif dialect.name != "sqlite":
        return None
    return _append_batch(conn, cid, counter, batch)


def append_direct_one(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> StoredMessage | None:
    """:func:`append_direct` of one message (``None`` when it does not apply)."""
    done = append_direct(conn, cid, counter, batch)
    return done[0] if done is not None else None


def _allocation(cid: str, now: datetime, batch: Sequence[Prepared]) -> dict[str, Any]:
    return {"cid": cid, "now": now, "meta": {}, "count": len(batch),
            "tokens": sum(p.token_count for p in batch),
            "max_score": max(1.0, *(p.message.score for p in batch)),
            "epoch": q.new_epoch()}


def _append_one_postgresql(
    conn: Connection, cid: str, counter: str, p: Prepared
) -> StoredMessage:
    compiled = q.hot_write(conn.dialect, "append_one")
    now = utcnow()
    row = _message_row(cid, 0, p, new_message_id(), counter, now)
    params = compiled.params({**_allocation(cid, now, [p]), **row})
    conn.execution_options(isolation_level="AUTOCOMMIT")
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    try:
        cursor = dbapi.cursor()
        try:
            cursor.execute(compiled.sql, params)
            row["seq"] = int(cursor.fetchall()[0][0])
        finally:
            cursor.close()
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _driver_error(conn, exc, compiled.sql, params) from exc
    return _stored_from_row_dict(row, p.message)


def _append_batch(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> list[StoredMessage]:
    """Allocate and insert ``batch`` in one transaction on the DBAPI cursor.

    SQLite: ``BEGIN IMMEDIATE`` ... ``COMMIT`` (memstore drives SQLite's transactions);
    PostgreSQL: the driver's implicit transaction, committed or rolled back here.
    """
    sqlite = conn.dialect.name == "sqlite"
    allocate = q.hot_write(conn.dialect, "allocate")
    insert = q.hot_write(conn.dialect, "insert")
    now = utcnow()
    rows = [_message_row(cid, 0, p, new_message_id(), counter, now) for p in batch]
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    statement, params = "BEGIN IMMEDIATE", None
    cursor = dbapi.cursor()
    try:
        if sqlite:
            cursor.execute(statement)
        try:
            statement, params = allocate.sql, allocate.params(_allocation(cid, now, batch))
            cursor.execute(statement, params)
            first = int(cursor.fetchall()[0][0]) - len(rows) + 1
            for offset, row in enumerate(rows):
                row["seq"] = first + offset
            statement = insert.sql
            params = [insert.params(row) for row in rows]
            if len(params) == 1:
                cursor.execute(statement, params[0])
            else:
                cursor.executemany(statement, params)
            statement, params = "COMMIT", None
            if sqlite:
                cursor.execute(statement)
            else:
                dbapi.commit()
        except BaseException:
            # (no transaction may be left to roll back, e.g. when COMMIT failed)
            with contextlib.suppress(conn.dialect.loaded_dbapi.Error):
                if sqlite:
                    cursor.execute("ROLLBACK")
                else:
                    dbapi.rollback()
            raise
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _driver_error(conn, exc, statement, params) from exc
    finally:
        cursor.close()
    return [_stored_from_row_dict(row, p.message) for row, p in zip(rows, batch)]


def set_score(conn: Connection, cid: str, seq: int, score: float) -> StoredMessage:
    """Set a message's base score."""
    _conversation_row(conn, cid, for_update=True)
    row = conn.execute(q.update_message(cid, seq, score=score)).first()
    if row is None:
        raise MessageNotFoundError(cid, seq)
    conn.execute(*q.allocate_seqs(conn.dialect.name, cid, utcnow(), 0, 0, score))
    conn.execute(q.update_conversation(cid, epoch=q.new_epoch()))
    return to_stored(row)


def set_pinned(conn: Connection, cid: str, seq: int, pinned: bool) -> StoredMessage:
    """Pin or unpin a message (pinned messages are anchored: every view keeps them)."""
    _conversation_row(conn, cid, for_update=True)
    current = conn.execute(q.messages_range(cid, start=seq, stop=seq + 1)).first()
    if current is None:
        raise MessageNotFoundError(cid, seq)
    anchored = pinned or current.role in ANCHOR_ROLES
    row = conn.execute(q.update_message(cid, seq, pinned=pinned, anchored=anchored)).first()
    assert row is not None
    conn.execute(q.update_conversation(cid, epoch=q.new_epoch()))
    return to_stored(row)


def pop(conn: Connection, cid: str, n: int) -> list[StoredMessage]:
    """Delete and return the ``n`` newest messages (chronological)."""
    conv = _conversation_row(conn, cid, for_update=True)
    if n == 0:
        return []
    first, last = int(conv.first_seq), int(conv.last_seq)
    start = max(first, last - n + 1)
    removed = [to_stored(r) for r in conn.execute(q.messages_range(cid, start=start))]
    if removed:
        conn.execute(q.delete_messages(cid, start=start))
        # A summary standing for a popped seq would claim the seqs appended next.
        conn.execute(q.delete_summaries(cid, last_from=start))
        conn.execute(q.update_conversation(
            cid, last_seq=start - 1, updated_at=utcnow(), epoch=q.new_epoch(),
            token_count=int(conv.token_count) - sum(m.token_count for m in removed),
        ))
    return removed


def truncate(conn: Connection, cid: str, before_seq: int) -> int:
    """Delete every message with ``seq < before_seq``; returns how many were deleted."""
    conv = _conversation_row(conn, cid, for_update=True)
    first, last = int(conv.first_seq), int(conv.last_seq)
    cut = min(before_seq, last + 1)
    if cut <= first:
        return 0
    count, tokens = conn.execute(q.sum_tokens(cid, stop=cut)).one()
    conn.execute(q.delete_messages(cid, stop=cut))
    conn.execute(q.update_conversation(
        cid, first_seq=cut, updated_at=utcnow(), epoch=q.new_epoch(),
        token_count=int(conv.token_count) - int(tokens),
    ))
    return int(count)


def clear(conn: Connection, cid: str) -> int:
    """Delete every message; the next append gets seq 1 again. Returns how many."""
    conv = _conversation_row(conn, cid, for_update=True)
    count = int(conv.last_seq) - int(conv.first_seq) + 1
    conn.execute(q.delete_messages(cid))
    conn.execute(q.delete_summaries(cid))  # seqs restart at 1: no summary stands for them
    conn.execute(q.update_conversation(
        cid, first_seq=1, last_seq=0, token_count=0, updated_at=utcnow(), epoch=q.new_epoch()
    ))
    return count


# ---- reads ----------------------------------------------------------------------------


def read_messages(
    conn: Connection,
    cid: str,
    start: int | None,
    stop: int | None,
    limit: int | None,
    newest_first: bool,
) -> list[StoredMessage]:
    """Messages of one conversation in a seq range."""
    _conversation_row(conn, cid)
    stmt = q.messages_range(cid, start=start, stop=stop, limit=limit, newest_first=newest_first)
    return [to_stored(r) for r in conn.execute(stmt)]


def get_message(conn: Connection, cid: str, seq: int) -> StoredMessage:
    """One message by seq."""
    row = conn.execute(q.messages_range(cid, start=seq, stop=seq + 1)).first()
    if row is None:
        _conversation_row(conn, cid)
        raise MessageNotFoundError(cid, seq)
    return to_stored(row)


def count_tokens(conn: Connection, cid: str) -> int:
    """Sum of the stored per-message token counts (from the conversation row, O(1))."""
    return int(_conversation_row(conn, cid).token_count)


def stats(conn: Connection) -> StoreStats:
    """Totals over the conversation rows, the database size and the schema revision."""
    row = conn.execute(q.totals()).one()
    if conn.dialect.name == "sqlite":
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        database_bytes: int | None = int(pages) * int(size)
    elif conn.dialect.name == "postgresql":
        database_bytes = int(conn.exec_driver_sql(
            "SELECT pg_database_size(current_database())").scalar_one())
    else:  # pragma: no cover - memstore supports SQLite and PostgreSQL
        database_bytes = None
    revision = conn.execute(q.schema_revision()).scalar()
    return StoreStats(conversations=int(row[0]), messages=int(row[1] or 0),
                      tokens=int(row[2] or 0), database_bytes=database_bytes,
                      schema_revision=revision)


def _driver_error(conn: Connection, exc: Exception, statement: str, params: Any) -> Exception:
    """What SQLAlchemy does with a driver error, for statements run on the DBAPI cursor.

    Wraps it in the matching :class:`sqlalchemy.exc.DBAPIError` (which
    :func:`memstore.errors.translate_db_errors` turns into a memstore error) and, when
    the error means the connection is gone, invalidates it so the pool does not hand
    it out again.
    """
    dbapi_connection = conn.connection.dbapi_connection
    gone = conn.dialect.is_disconnect(exc, dbapi_connection, None)  # type: ignore[arg-type]
    if gone:
        # As SQLAlchemy does for its own statements: a lost connection usually means the
        # server restarted, so every pooled connection made before now is stale too.
        conn.engine.pool._invalidate(conn.connection, exc)
        conn.invalidate(exc)
    return sa_exc.DBAPIError.instance(
        statement, params, exc, conn.dialect.loaded_dbapi.Error,
        connection_invalidated=gone, dialect=conn.dialect,
    )


class SQLHistory(SourceBase):
    """:class:`memstore.history.HistorySource` over one conversation's rows.

    Every read is an indexed range on ``(conversation_id, seq)``; anchored messages
    come through the partial index, with the conversation row. The statements are
    precompiled per dialect (see :func:`memstore._statements.hot`) and run on the
    DBAPI cursor.

    With a :class:`~memstore._cache.RowCache`, rows decoded by earlier windows of the
    same conversation are reused while the conversation's epoch is unchanged (see
    :mod:`memstore._cache`): only missing seqs are read from the database, and
    :meth:`remember` stores what this window decoded. ``rows_read`` counts the rows
    returned to the view, ``rows_cached`` those of them that came from the cache.

    **Reads without a transaction.** On a connection with no transaction open, each
    statement is its own snapshot. The first one reads the conversation row (seq
    range, epoch) and its anchored messages; every later range read carries the
    condition "the epoch is still the one read first". Rows of ``[first_seq,
    last_seq]`` change only together with the epoch, so while it holds each range
    returns exactly the rows that snapshot held; if it changed in between, the range
    comes back short and :class:`StaleRead` makes the store read again in one
    snapshot transaction. A warm window thus costs one statement and no ``BEGIN``
    or ``COMMIT``: one round trip on PostgreSQL instead of three.
    """

    def __init__(self, conn: Connection, cid: str, cache: RowCache | None = None) -> None:
        self._conn = conn
        self._dialect = conn.dialect
        # The DBAPI connection (for asyncio drivers, SQLAlchemy's sync adapter of it).
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None  # a checked-out, open connection
        self._dbapi = dbapi
        self._aiosqlite = (
            conn.connection.driver_connection if conn.dialect.driver == "aiosqlite" else None
        )
        self._decode = "sqlite" if conn.dialect.name == "sqlite" else "postgresql"
        self._checked = not conn.in_transaction()
        if self._checked and getattr(conn.connection.driver_connection, "in_transaction", False):
            # A connection shared with an open write (SQLite ``:memory:`` shares one
            # connection): reading without BEGIN would see uncommitted rows. Take the
            # snapshot path, which refuses to start inside another transaction.
            raise StaleRead(cid)
        # One statement: the conversation's bookkeeping and its anchored messages.
        rows = self._execute("conversation", {"cid": cid})
        if not rows:
            raise ConversationNotFoundError(cid)
        head = rows[0]
        self._cid: str = cid
        self._first = int(head[0])
        self._last = int(head[1])
        self._max_score = float(head[2])
        self._token_total = int(head[3])
        self._epoch = int(head[4])
        if self._epoch == UNTRUSTED_EPOCH:
            # Written before migration 0002 (or by a process that predates it): writes
            # may have changed rows without a new epoch. No cache, one snapshot.
            if self._checked:
                raise StaleRead(cid)
            cache = None
        self._cache = cache
        entry = cache.get(cid) if cache is not None else None
        if entry is not None and entry.epoch != self._epoch:
            assert cache is not None
            cache.discard(cid)  # rewritten since: nothing in it can be used again
            entry = None
        # Seq -> decoded row. Shared with the cache (never mutated) until this window
        # decodes a row of its own; then it is copied once.
        self._known: dict[int, StoredMessage] = entry.rows if entry is not None else {}
        self._shared = entry is not None
        self._decoded = 0
        self._anchored: list[StoredMessage] = []
        for r in rows:
            if r[5] is None:  # the outer join's row when nothing is anchored
                continue
            message = self._known.get(int(r[6]))
            if message is None:
                message = decode_raw(r[5:], self._decode)
                self._add(message)
            self._anchored.append(message)
        self._anchored_cached = len(self._anchored) - self._decoded
        self._newest: datetime | None = None
        self._newest_loaded = False
        self.rows_read = 0
        self.rows_cached = 0
        self._summary: Summary | None = None
        self._summary_read = False

    def _execute(self, name: str, values: dict[str, Any]) -> Sequence[Any]:
        """Run a precompiled hot statement on the DBAPI cursor; all its rows.

        Inside the caller's transaction if one is open, else autocommitting. Going
        around SQLAlchemy's result objects matters here: for textual SQL they build
        column metadata on every execution, which costs more than the query.
        """
        compiled = q.hot(self._dialect, name)
        params = compiled.params(values)
        try:
            if self._aiosqlite is not None:
                # aiosqlite runs each driver call in its own thread, and SQLAlchemy's
                # cursor adapter makes four calls per statement; execute_fetchall one.
                rows: Sequence[Any] = await_only(
                    self._aiosqlite.execute_fetchall(compiled.sql, params)
                )
                return rows
            cursor = self._dbapi.cursor()
            try:
                cursor.execute(compiled.sql, params)
                return cursor.fetchall()
            finally:
                cursor.close()
        except self._dialect.loaded_dbapi.Error as exc:
            raise _driver_error(self._conn, exc, compiled.sql, params) from exc

    @property
    def epoch(self) -> int:
        """The conversation's epoch, as read with its row."""
        return self._epoch

    def latest_summary(self) -> Summary | None:
        """The newest stored summary ending at or before ``last_seq`` (one indexed read).

        Outside a transaction the read carries the epoch check of the range reads: a
        conversation rewritten since its row was read raises :class:`StaleRead`.
        Summaries stored after that row was read are used when their range lies
        within the snapshot's messages (they summarize exactly those rows).
        """
        if not self._summary_read:
            rows = self._execute("latest_summary",
                                 {"cid": self._cid, "last": self._last, "epoch": self._epoch})
            if not rows:
                raise StaleRead(self._cid)
            row = rows[0]
            self._summary = None if row[0] is None else to_summary((self._cid, *row))
            self._summary_read = True
        return self._summary

    def _add(self, message: StoredMessage) -> None:
        if self._shared:
            self._known = dict(self._known)
            self._shared = False
        self._known[message.seq] = message
        self._decoded += 1

    def _fetch(self, start: int, stop: int) -> None:
        """Read and decode ``[start, stop)`` (inside the stored range) into the known rows."""
        if self._checked:
            rows = self._execute("range_checked", {
                "cid": self._cid, "start": start, "stop": stop, "epoch": self._epoch,
            })
            if len(rows) != stop - start:
                raise StaleRead(self._cid)
        else:
            rows = self._execute("range", {"cid": self._cid, "start": start, "stop": stop})
        for r in rows:
            self._add(decode_raw(r, self._decode))

    def _range(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages in ``[start, stop)`` (clipped to the stored range), chronological."""
        start = max(start, self._first)
        stop = min(stop, self._last + 1)
        if stop <= start:
            return []
        decoded_before = self._decoded
        known = self._known
        missing_from = None
        for seq in range(start, stop + 1):  # one past the end closes a trailing run
            if seq < stop and seq not in known:
                if missing_from is None:
                    missing_from = seq
            elif missing_from is not None:
                self._fetch(missing_from, seq)
                missing_from = None
        known = self._known
        out = [m for seq in range(start, stop) if (m := known.get(seq)) is not None]
        self.rows_read += len(out)
        self.rows_cached += len(out) - (self._decoded - decoded_before)
        return out

    @property
    def newest_created_at(self) -> datetime | None:
        """``created_at`` of the newest message (one indexed lookup, on first use)."""
        if not self._newest_loaded:
            self._newest_loaded = True
            if self._last >= self._first:
                rows = self.read(self._last, self._last + 1)
                self._newest = rows[0].created_at if rows else None
        return self._newest

    def anchored(self) -> list[StoredMessage]:
        """Anchored messages, chronological (read with the conversation row)."""
        self.rows_read += len(self._anchored)
        self.rows_cached += self._anchored_cached
        return list(self._anchored)

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages in ``[start, stop)``, chronological."""
        return self._range(start, stop)

    def read_newest_first(self, before: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` messages older than ``before``, newest first."""
        if limit <= 0:
            return []
        before = min(before, self._last + 1)
        page = self._range(max(self._first, before - limit), before)
        page.reverse()
        return page

    def remember(self) -> None:
        """Store the rows this window decoded in the cache (a no-op without one)."""
        if self._cache is None:
            return
        self._cache.record(self.rows_cached, self.rows_read - self.rows_cached)
        if self._decoded:
            self._cache.put(self._cid, self._epoch, self._known)


def window(conn: Connection, cid: str, view: Any, counter: Any,
           cache: RowCache | None = None) -> Any:
    """Select a window through ``view`` (pure) over this conversation's rows.

    Runs in a read transaction, or with none (see :class:`SQLHistory`); never in a
    write transaction, so the rows it caches are committed ones.
    """
    source = SQLHistory(conn, cid, cache)
    result = view.select(source, counter)
    source.remember()
    return result


# ---- state ----------------------------------------------------------------------------


def save_state(
    conn: Connection, cid: str, view_config: dict[str, Any] | None
) -> ConversationState:
    """Snapshot one conversation (every message) as a ConversationState."""
    conv = _conversation_row(conn, cid)
    msgs = [to_stored(r) for r in conn.execute(q.messages_range(cid))]
    return ConversationState(
        conversation=_to_conversation(conv), messages=msgs, view=view_config,
        summaries=list_summaries(conn, cid),
    )


def load_state(
    conn: Connection, state: ConversationState, cid: str, replace: bool,
    recounter: Recounter | None = None,
) -> Conversation:
    """Write a snapshot into conversation ``cid`` (one transaction).

    ``replace=True`` makes the conversation exactly the snapshot (seqs, timestamps,
    scores, token counts, client ids kept). ``replace=False`` appends the snapshot's
    messages after the stored ones (new seqs; everything else kept).
    """
    src = state.messages
    if src and src[-1].seq - src[0].seq + 1 != len(src):
        raise InvalidInputError("state messages must have contiguous seqs")
    if recounter is not None:  # snapshots are not trusted: recount every message
        src = [m.model_copy(update=dict(zip(("token_count", "token_counter"),
                                            recounter.count(m)))) for m in src]
    dialect = conn.dialect.name
    existing = conn.execute(q.conversation(cid, for_update=True)).first()
    c = state.conversation
    if existing is None or replace:
        if existing is not None:
            conn.execute(q.delete_messages(cid))
            conn.execute(q.delete_summaries(cid))
            conn.execute(q.delete_conversation(cid))
        first = src[0].seq if src else first_seq_without_messages(state.summaries)
        conn.execute(q.insert_conversation({
            "id": cid, "created_at": c.created_at, "updated_at": c.updated_at,
            "metadata": dict(c.metadata), "first_seq": first, "last_seq": first + len(src) - 1,
            "token_count": sum(m.token_count for m in src),
            "max_score": max([1.0, *(m.score for m in src)]),
            "epoch": q.new_epoch(),
        }))
        seqs = [m.seq for m in src]
    else:
        if not src:
            return _to_conversation(existing)
        top = max([1.0, *(m.score for m in src)])
        last = conn.execute(*q.allocate_seqs(
            dialect, cid, utcnow(), len(src), sum(m.token_count for m in src), top
        )).scalar_one()
        seqs = list(range(int(last) - len(src) + 1, int(last) + 1))
    rows = []
    for m, seq in zip(src, seqs):
        row = _message_row(cid, seq, Prepared(m, m.token_count), m.id, m.token_counter,
                           m.created_at)
        rows.append(row)
    for start in range(0, len(rows), INSERT_CHUNK):
        conn.execute(q.insert_messages(), rows[start:start + INSERT_CHUNK])
    if existing is None or replace:
        write_state_summaries(conn, cid, state.summaries)
    return _to_conversation(_conversation_row(conn, cid))


def first_seq_without_messages(summaries: Sequence[Summary]) -> int:
    """The first seq of a conversation written with no messages and these summaries.

    With no messages left, seqs go on after the newest summarized one (so a summary
    never claims the seqs appended next).
    """
    return summaries[-1].last_seq + 1 if summaries else 1


def write_state_summaries(conn: Connection, cid: str, summaries: Sequence[Summary]) -> None:
    """Write a snapshot's summaries into a conversation just written from it.

    Only for a conversation created (or replaced) from the snapshot: its messages
    kept their seqs, so the summaries' seq ranges still mean the same rows. Messages
    appended to an existing conversation get new seqs, so their snapshot's summaries
    are not written.
    """
    if summaries:
        conn.execute(q.insert_summaries(), [
            {**_summary_row(s), "conversation_id": cid} for s in summaries
        ])


# ---- streaming: keyset pages, loading in bounded batches --------------------------------


def read_page(
    conn: Connection, cid: str, start: int | None, stop: int | None, after: int | None,
    limit: int, summaries: list[Summary] | None = None,
) -> tuple[Conversation | None, list[StoredMessage]]:
    """One keyset page: up to ``limit`` messages with ``seq > after`` in ``[start, stop)``.

    The first page (``after is None``) also reads the conversation (raising
    ConversationNotFoundError when there is none) and returns it; later pages return
    ``None`` in its place. Each page is one indexed range read on
    ``(conversation_id, seq)``: cost and memory grow with ``limit``, not the history.
    With ``summaries`` given, the first page also reads the conversation's summaries
    into it (same snapshot as the header).
    """
    conversation = None
    if after is None:
        conversation = _to_conversation(_conversation_row(conn, cid))
        if summaries is not None:
            summaries.extend(list_summaries(conn, cid))
        low = start
    else:
        low = after + 1 if start is None else max(after + 1, start)
    stmt = q.messages_range(cid, start=low, stop=stop, limit=limit)
    return conversation, [to_stored(r) for r in conn.execute(stmt)]


class Recounter:
    """Recomputes the token count of every loaded message (snapshots are not trusted).

    A message counted by a counter this process can rebuild (the store's own, or one
    :func:`memstore.tokens.counter_from_name` knows) is recounted with that counter;
    any other is recounted with the store's counter and relabelled with its name.
    ``recounted`` counts the messages whose stored count or counter changed.
    """

    def __init__(self, default: Any) -> None:
        self.default = default
        self._by_name: dict[str, Any] = {default.name: default}
        self.recounted = 0

    def _counter(self, name: str) -> Any:
        if name not in self._by_name:
            from memstore.errors import MemstoreError
            from memstore.tokens import counter_from_name

            try:
                self._by_name[name] = counter_from_name(name)
            except MemstoreError:
                self._by_name[name] = None
        return self._by_name[name]

    def count(self, message: StoredMessage) -> tuple[int, str]:
        """``(token_count, token_counter)`` to store for ``message``."""
        from memstore.errors import MemstoreError

        counter = self._counter(message.token_counter) or self.default
        try:
            tokens = counter.count_message(message)
        except MemstoreError:
            if counter is self.default:
                raise
            self._by_name[message.token_counter] = None  # e.g. an encoding not available
            counter = self.default
            tokens = counter.count_message(message)
        if tokens != message.token_count or counter.name != message.token_counter:
            self.recounted += 1
        return tokens, counter.name


LoadMode = str  # "replace" | "append" | "merge"


class Loader:
    """Writes one conversation from a stream of stored messages, batch by batch.

    Runs inside the caller's (one) write transaction; holds no more than one batch.

    Modes, for a conversation that exists:

    * ``"replace"``: delete it, then write the stream as a new conversation;
    * ``"append"``: append every message after the stored ones (new seqs; a client
      id already stored is a :class:`ConflictError`);
    * ``"merge"``: a message whose client id is stored with the same content is
      left alone (``unchanged``), a new one is appended, one stored with other
      content is a :class:`ConflictError` (idempotent re-import).

    A conversation that does not exist is created with the header's fields, and its
    messages keep their seqs (which must then be contiguous and increasing).
    """

    def __init__(
        self, conn: Connection, cid: str, header: Conversation | None, mode: LoadMode,
        recounter: Recounter,
    ) -> None:
        self.conn = conn
        self.cid = cid
        self.mode = mode
        self.recounter = recounter
        self.written = 0
        self.unchanged = 0
        self.replaced = False
        #: Every message so far is stored at its own seq (summaries keep their meaning).
        self.aligned = True
        self.last_seq: int | None = None  # the last seq of the stream (not the stored one)
        existing = conn.execute(q.conversation(cid, for_update=True)).first()
        if existing is not None and mode == "replace":
            conn.execute(q.delete_messages(cid))
            conn.execute(q.delete_summaries(cid))
            conn.execute(q.delete_conversation(cid))
            existing = None
            self.replaced = True
        self.fresh = existing is None
        self._next_seq: int | None = None
        self._first_seq = 1
        self._tokens = 0
        self._top = 1.0
        if self.fresh:
            now = utcnow()
            conn.execute(q.insert_conversation({
                "id": cid,
                "created_at": header.created_at if header is not None else now,
                "updated_at": header.updated_at if header is not None else now,
                "metadata": dict(header.metadata) if header is not None else {},
                "first_seq": 1, "last_seq": 0, "token_count": 0, "max_score": 1.0,
                "epoch": q.new_epoch(),
            }))

    def add(self, batch: Sequence[StoredMessage]) -> None:
        """Write one batch (at most :data:`INSERT_CHUNK` messages is a good size)."""
        if not batch:
            return
        self.last_seq = batch[-1].seq
        if self.mode == "merge" and not self.fresh:
            batch = self._new_only(batch)
            if not batch:
                return
        counted = [self.recounter.count(m) for m in batch]
        if self.fresh:
            seqs = []
            for m in batch:
                if self._next_seq is None:
                    self._first_seq = m.seq
                elif m.seq != self._next_seq:
                    raise InvalidInputError(
                        f"message seq {m.seq} follows seq {self._next_seq - 1}: the seqs of "
                        "a conversation must be contiguous and increasing"
                    )
                self._next_seq = m.seq + 1
                seqs.append(m.seq)
            self._tokens += sum(n for n, _ in counted)
            self._top = max(self._top, *(m.score for m in batch))
        else:
            tokens = sum(n for n, _ in counted)
            top = max(1.0, *(m.score for m in batch))
            last = int(self.conn.execute(*q.allocate_seqs(
                self.conn.dialect.name, self.cid, utcnow(), len(batch), tokens, top
            )).scalar_one())
            seqs = list(range(last - len(batch) + 1, last + 1))
            self.aligned = self.aligned and seqs == [m.seq for m in batch]
        rows = [
            _message_row(self.cid, seq, Prepared(m, n), m.id, name, m.created_at)
            for m, seq, (n, name) in zip(batch, seqs, counted)
        ]
        for start in range(0, len(rows), INSERT_CHUNK):
            self.conn.execute(q.insert_messages(), rows[start:start + INSERT_CHUNK])
        self.written += len(rows)

    def _new_only(self, batch: Sequence[StoredMessage]) -> list[StoredMessage]:
        ids = sorted({m.id for m in batch})
        stored = stored_by_ids(self.conn, self.cid, ids)
        fresh: list[StoredMessage] = []
        seen: dict[str, StoredMessage] = {}
        for m in batch:
            prior = stored.get(m.id) or seen.get(m.id)
            if prior is None:
                seen[m.id] = m
                fresh.append(m)
            elif prior.same_content(m):
                self.unchanged += 1
                self.aligned = self.aligned and prior.seq == m.seq
            else:
                raise ConflictError(
                    f"message id {m.id!r} is already stored in conversation {self.cid!r} "
                    "with different content"
                )
        return fresh

    def finish(self, summaries: Sequence[Summary] = ()) -> Conversation:
        """Complete the conversation row; returns the conversation as stored.

        ``summaries`` (the stream's, oldest first, checked with
        :func:`check_stream_summaries`) are written as :func:`load_state` writes a
        snapshot's: only into a conversation created (or replaced) by this load.
        """
        if self.fresh:
            if self._next_seq is None:
                first = self._first_seq = first_seq_without_messages(summaries)
                count = 0
            else:
                first, count = self._first_seq, self._next_seq - self._first_seq
            self.conn.execute(q.update_conversation(
                self.cid, first_seq=first, last_seq=first + count - 1,
                token_count=self._tokens, max_score=self._top, epoch=q.new_epoch(),
            ))
            write_state_summaries(self.conn, self.cid, summaries)
        return _to_conversation(_conversation_row(self.conn, self.cid))


def merge_summaries(
    conn: Connection, cid: str, summaries: Sequence[Summary], aligned: bool,
) -> tuple[int, int]:
    """Write an import's summaries into a conversation that existed (merge mode).

    A summary stored with the same number and the same range and text is left alone
    (a re-import stores nothing new); one stored with the same number and anything
    else is a :class:`ConflictError`. A new summary is written only when every
    imported message is stored at its own seq (``aligned``: its range means the same
    messages) and it extends the newest stored one; otherwise it is left out, as
    :func:`load_state` leaves out the summaries of appended messages.

    Returns:
        ``(written, unchanged)``.
    """
    stored = {s.number: s for s in list_summaries(conn, cid)}
    latest = max(stored.values(), key=lambda s: s.number, default=None)
    last_seq = int(_conversation_row(conn, cid).last_seq)
    written = unchanged = 0
    rows = []
    for s in summaries:
        prior = stored.get(s.number)
        if prior is not None:
            if (prior.first_seq, prior.last_seq, prior.text) != (s.first_seq, s.last_seq, s.text):
                raise ConflictError(
                    f"summary {s.number} is already stored in conversation {cid!r} "
                    "with a different range or text"
                )
            unchanged += 1
            continue
        if not aligned or s.last_seq > last_seq or (latest is not None and (
            s.number < latest.number or s.first_seq > latest.first_seq
            or s.last_seq < latest.last_seq
        )):
            continue
        rows.append({**_summary_row(s), "conversation_id": cid})
        latest = s
        written += 1
    if rows:
        conn.execute(q.insert_summaries(), rows)
    return written, unchanged


def check_stream_summaries(summaries: Sequence[Summary], last_seq: int | None) -> str | None:
    """Why a stream's summaries do not fit its messages (``None``: they fit).

    The rule :class:`ConversationState` applies to a whole snapshot: the newest
    summary ends at or before the newest message (``last_seq``; ``None`` when the
    stream has no messages, and then any summaries fit).
    """
    if summaries and last_seq is not None and summaries[-1].last_seq > last_seq:
        s = summaries[-1]
        return (f"summary {s.number} ends at seq {s.last_seq}, after the newest message "
                f"(seq {last_seq})")
    return None


def load_stream(
    conn: Connection, head: ConversationState, messages: Any, cid: str, replace: bool,
    recounter: Recounter, batch_size: int = INSERT_CHUNK,
) -> tuple[Conversation, int]:
    """Write a streamed snapshot in batches (one transaction: the caller's).

    ``messages`` is an iterator of StoredMessage (read lazily from a file). The
    header's summaries are written as :func:`load_state` writes them (a replace or
    a new conversation keeps them; an append does not). Returns the stored
    conversation and how many messages were written.
    """
    loader = Loader(conn, cid, head.conversation, "replace" if replace else "append", recounter)
    batch: list[StoredMessage] = []
    for message in messages:
        batch.append(message)
        if len(batch) >= batch_size:
            loader.add(batch)
            batch = []
    loader.add(batch)
    problem = check_stream_summaries(head.summaries, loader.last_seq)
    if problem is not None:
        raise InvalidInputError(f"the snapshot's {problem}")
    return loader.finish(head.summaries), loader.written


# ---- summaries ------------------------------------------------------------------------


def _summary_row(summary: Summary) -> dict[str, Any]:
    return {
        "conversation_id": summary.conversation_id, "number": summary.number,
        "first_seq": summary.first_seq, "last_seq": summary.last_seq, "text": summary.text,
        "token_count": summary.token_count, "token_counter": summary.token_counter,
        "created_at": summary.created_at,
    }


def to_summary(row: Sequence[Any]) -> Summary:
    """Build a Summary from a trusted row of :data:`memstore._statements.SUMMARY_COLUMNS`."""
    cid, number, first, last, text, tokens, counter, created_at = row
    if not isinstance(created_at, datetime):  # SQLite through the DBAPI cursor
        created_at = _sqlite_time(created_at)
    elif created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=timezone.utc)
    elif created_at.utcoffset():
        created_at = created_at.astimezone(timezone.utc)
    return build_trusted(Summary, {
        "conversation_id": cid, "number": int(number), "first_seq": int(first),
        "last_seq": int(last), "text": text, "token_count": int(tokens),
        "token_counter": counter, "created_at": created_at,
    })


def list_summaries(conn: Connection, cid: str) -> list[Summary]:
    """Every summary of one conversation, oldest first."""
    return [to_summary(r) for r in conn.execute(q.summaries_of(cid))]


def read_summaries(conn: Connection, cid: str) -> list[Summary]:
    """Every summary of one conversation (ConversationNotFoundError when unknown)."""
    _conversation_row(conn, cid)
    return list_summaries(conn, cid)


class SummaryDraft(NamedTuple):
    """What ``summarize`` read: the units to fold into the previous summary.

    Attributes:
        conversation_id: the conversation.
        epoch: its epoch when read (the write re-checks it).
        previous: the summary the new one extends, or ``None``.
        messages: the messages of the complete, non-anchored units to fold in
            (chronological); empty when there is nothing to summarize.
        first_seq: the new summary's first seq.
        last_seq: the new summary's last seq.
    """

    conversation_id: str
    epoch: int
    previous: Summary | None
    messages: list[StoredMessage]
    first_seq: int
    last_seq: int


def summarize_read(
    conn: Connection, cid: str, keep_tokens: int, counter: TokenCounter
) -> SummaryDraft:
    """Find the units ``summarize`` folds in (read in one snapshot; writes nothing).

    See :func:`memstore.summary_view.plan_fold`: reads the kept units and the
    folded ones, O(what changed since the last summary), never the summarized
    history again.
    """
    source = SQLHistory(conn, cid)
    fold = plan_fold(source, keep_tokens, counter)
    return SummaryDraft(cid, source.epoch, fold.previous, fold.messages, fold.first_seq,
                        fold.last_seq)


def summarize_write(
    conn: Connection, draft: SummaryDraft, text: str, tokens: int, counter: str
) -> Summary | None:
    """Store the summary made from ``draft``, or ``None`` when the draft is stale.

    Runs in a write transaction holding the conversation row lock, so concurrent
    ``summarize`` calls on one conversation serialise here. The draft is stale when
    another summary was stored since it was read, or when the conversation's
    messages changed other than by appending (a new epoch: pop, truncate, clear,
    load_state, a score or a pin); the caller then reads again.
    """
    cid = draft.conversation_id
    conv = conn.execute(q.conversation(cid, for_update=True)).first()
    if conv is None or int(conv.epoch) != draft.epoch:
        return None
    latest = conn.execute(q.latest_summary(cid)).first()
    number = int(latest.number) if latest is not None else 0
    expected = draft.previous.number if draft.previous is not None else 0
    if number != expected:
        return None
    summary = build_trusted(Summary, {
        "conversation_id": cid, "number": number + 1, "first_seq": draft.first_seq,
        "last_seq": draft.last_seq, "text": text, "token_count": tokens,
        "token_counter": counter, "created_at": utcnow(),
    })
    conn.execute(q.insert_summaries(), [_summary_row(summary)])
    return summary

"""Database logic, written once: functions on a SQLAlchemy ``Connection``.

Each function runs inside a transaction its caller opened. ``MemoryStore`` calls
them directly; ``AsyncMemoryStore`` calls the very same functions through
``AsyncConnection.run_sync``. They take and return pydantic models only; rows
never leave this layer (`memstore._db.rows` decodes them, `memstore._db.window`
serves a window's reads).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Row
from sqlalchemy import exc as sa_exc
from sqlalchemy.util import await_only

from memstore._db import rewrite as _rewrite
from memstore._db import statements as q
from memstore._db.rows import (
    Prepared,
    autocommit_off,
    autocommit_on,
    driver_error,
    message_row,
    new_message_id,
    new_message_ids,
    stored_from_row_dict,
    to_conversation,
    to_stored,
    to_summary,
    utcnow,
)
from memstore._db.window import SQLHistory
from memstore._validate import conversation_full
from memstore.errors import (
    ConflictError,
    ConversationNotFoundError,
    MessageNotFoundError,
)
from memstore.models import (
    ANCHOR_ROLES,
    Conversation,
    StoredMessage,
    StoreStats,
    Summary,
    build_trusted,
)
from memstore.tokens import TokenCounter
from memstore.views.summary import plan_fold

__all__ = ["SummaryDraft"]

#: Rows per INSERT batch: bounds statement size and, on asyncio, how long the
#: event loop runs Python code between two awaits of the driver.
INSERT_CHUNK = 500


# ---- conversations --------------------------------------------------------------------


def conversation_row(conn: Connection, cid: str, *, for_update: bool = False) -> Row[Any]:
    row = conn.execute(q.conversation(cid, for_update=for_update)).first()
    if row is None:
        raise ConversationNotFoundError(cid)
    return row


def create_conversation(
    conn: Connection, cid: str, metadata: dict[str, Any]
) -> Conversation:
    """Create an empty conversation; ConflictError when the id is taken."""
    taken = ConflictError(f"conversation {cid!r} already exists")
    if conn.execute(q.conversation(cid)).first() is not None:
        raise taken
    now = utcnow()
    try:
        conn.execute(q.insert_conversation({
            "id": cid, "created_at": now, "updated_at": now, "metadata": metadata,
            "first_seq": 1, "last_seq": 0, "token_count": 0, "max_score": 1.0,
            "epoch": q.new_epoch(),
        }))
    except sa_exc.IntegrityError as exc:  # another writer created it since the check
        raise taken from exc
    return to_conversation(conversation_row(conn, cid))


def get_conversation(conn: Connection, cid: str) -> Conversation:
    """One conversation."""
    return to_conversation(conversation_row(conn, cid))


#: Messages deleted per DELETE statement when a whole conversation goes (one transaction):
#: SQLite collects the rowids a DELETE removes in memory, so one statement over a
#: 1,000,000-message conversation would hold ~25 MB.
DELETE_CHUNK = 10_000


def delete_conversation(conn: Connection, cid: str) -> None:
    """Delete a conversation and all its messages (bounded memory, one transaction)."""
    delete_contents(conn, cid, conversation_row(conn, cid, for_update=True))
    conn.execute(q.delete_conversation(cid))


def delete_contents(conn: Connection, cid: str, conv: Row[Any]) -> None:
    """Delete every message and summary of a locked conversation (row ``conv``).

    In statements of `DELETE_CHUNK` messages, so memory stays bounded however long
    the conversation is (``delete_conversation``, ``clear``, a replacing load).
    """
    first, last = int(conv.first_seq), int(conv.last_seq)
    for start in range(first, last + 1 - DELETE_CHUNK, DELETE_CHUNK):
        conn.execute(q.delete_messages(cid, start=start, stop=start + DELETE_CHUNK))
    conn.execute(q.delete_messages(cid))  # the rest (and any row outside the live range)
    conn.execute(q.delete_summaries(cid))


# ---- writes ---------------------------------------------------------------------------


def append_one(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> StoredMessage:
    """Append one message (see `append_messages()`)."""
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
        last = allocated(conn.execute(*q.allocate_seqs(dialect, cid, now, len(fresh), tokens,
                                                       top)).scalar(), cid, len(fresh))
        first_seq = last - len(fresh) + 1
        # Build, insert and wrap one chunk at a time: on asyncio each chunk's execute
        # awaits the driver, so the event loop runs between chunks.
        for start in range(0, len(fresh), INSERT_CHUNK):
            chunk = fresh[start:start + INSERT_CHUNK]
            rows = []
            for offset, i in enumerate(chunk, start=start):
                p = batch[i]
                mid = p.message.id if p.message.id is not None else new_message_id()
                rows.append(message_row(cid, first_seq + offset, p, mid, counter, now))
            insert_message_rows(conn, rows)
            for i, row in zip(chunk, rows):
                results[i] = stored_from_row_dict(row, batch[i].message)
    for i, j in repeats.items():
        results[i] = results[j]
    return [r for r in results if r is not None]


def append_stream(
    conn: Connection, cid: str, counter: str, chunks: Iterator[Sequence[Prepared]]
) -> int:
    """Append chunk after chunk in the open transaction; returns how many messages it took.

    Each chunk is appended as `append_messages()` appends a batch (ids already stored,
    in this call or before, are returned, not stored again) and dropped before the next
    is read, so memory is bounded by one chunk however long ``chunks`` runs. The
    transaction is the caller's: all of it is stored, or none.
    """
    taken = 0
    for batch in chunks:
        taken += len(append_messages(conn, cid, counter, batch))
    return taken


def allocated(last: Any, cid: str, count: int) -> int:
    """The ``last_seq`` a seq allocation returned (``None``: it returned no row).

    No row means the conversation is full: ``count`` more seqs would pass
    `MAX_SEQ` (only a snapshot loaded near the top of the
    range gets there). The allocation changed nothing; the write is refused. The
    messages are valid: what is stored leaves no room for them, a
    `ConflictError` (replacing the conversation frees it).

    Raises:
        ConflictError: no row was returned.
    """
    if last is None:
        raise conversation_full(cid, f"{count} more message(s)")
    return int(last)


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
    """`append_messages()` as precompiled SQL on the DBAPI cursor, or ``None``.

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
    chunk (`INSERT_CHUNK`; big batches keep the chunked path, which lets the
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
    """`append_direct()` of one message (``None`` when it does not apply)."""
    done = append_direct(conn, cid, counter, batch)
    return done[0] if done is not None else None


def _allocation(cid: str, now: datetime, batch: Sequence[Prepared]) -> dict[str, Any]:
    return {"cid": cid, "now": now, "count": len(batch),
            "tokens": sum(p.token_count for p in batch),
            "max_score": max(1.0, *(p.message.score for p in batch)),
            "epoch": q.new_epoch()}


def _append_one_postgresql(
    conn: Connection, cid: str, counter: str, p: Prepared
) -> StoredMessage:
    compiled = q.hot_write(conn.dialect, "append_one")
    now = utcnow()
    row = message_row(cid, 0, p, new_message_id(), counter, now)
    params = compiled.params({**_allocation(cid, now, [p]), **row})
    dbapi = autocommit_on(conn)
    try:
        cursor = dbapi.cursor()
        try:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
            row["seq"] = allocated(rows[0][0] if rows else None, cid, 1)
        finally:
            cursor.close()
    except conn.dialect.loaded_dbapi.Error as exc:
        raise driver_error(conn, exc, compiled.sql, params) from exc
    finally:
        autocommit_off(conn, dbapi)
    return stored_from_row_dict(row, p.message)


def _append_batch(
    conn: Connection, cid: str, counter: str, batch: Sequence[Prepared]
) -> list[StoredMessage]:
    """Allocate and insert ``batch`` in one transaction on the DBAPI cursor.

    SQLite: ``BEGIN IMMEDIATE``, the allocation, multi-row INSERTs of the rows,
    ``COMMIT`` (memstore drives SQLite's transactions). PostgreSQL: the allocation and
    one ``COPY ... FROM STDIN`` of the rows in the driver's implicit transaction,
    committed or rolled back here.
    """
    sqlite = conn.dialect.name == "sqlite"
    allocate = q.hot_write(conn.dialect, "allocate")
    values = q.values_messages(conn.dialect)
    step = values.rows_per_statement(sqlite_variable_limit())
    now = utcnow()
    results: list[StoredMessage] = []
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
            rows = cursor.fetchall()
            first = allocated(rows[0][0] if rows else None, cid, len(batch)) - len(batch) + 1
            memo: dict[str, tuple[Any, Any]] = {}  # the batch's timestamp, processed once
            # Build, insert and wrap one chunk at a time: on asyncio each chunk's execute
            # awaits the driver, so the event loop runs between chunks.
            for start in range(0, len(batch), INSERT_CHUNK):
                chunk = batch[start:start + INSERT_CHUNK]
                ids = new_message_ids(len(chunk))
                rows = [message_row(cid, first + start + offset, p, ids[offset], counter, now)
                        for offset, p in enumerate(chunk)]
                if not sqlite:
                    insert_message_rows(conn, rows)  # one COPY; its errors come out wrapped
                else:  # one multi-row INSERT per statement's worth of rows
                    for part in range(0, len(rows), step):
                        some = rows[part:part + step]
                        statement = values.sql(len(some))
                        params = values.params(some, memo)
                        cursor.execute(statement, params)
                results.extend(stored_from_row_dict(row, p.message)
                               for row, p in zip(rows, chunk))
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
        raise driver_error(conn, exc, statement, params) from exc
    finally:
        cursor.close()
    return results


def insert_message_rows(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert message rows (`message_row()` dicts) inside the open transaction.

    PostgreSQL: one ``COPY ... FROM STDIN`` (see `memstore._db.statements.CopyMessages`);
    a driver error is wrapped as SQLAlchemy would, so it is translated the same way.
    SQLite: one multi-row INSERT per `sqlite_variable_limit` worth of rows (see
    `memstore._db.statements.ValuesMessages`).
    """
    if conn.dialect.name != "postgresql":
        if len(rows) == 1:
            conn.execute(q.insert_messages(), rows)
            return
        insert = q.values_messages(conn.dialect)
        step = insert.rows_per_statement(sqlite_variable_limit())
        processed: dict[str, tuple[Any, Any]] = {}
        for start in range(0, len(rows), step):
            chunk = rows[start:start + step]
            conn.exec_driver_sql(insert.sql(len(chunk)), insert.params(chunk, processed))
        return
    copy = q.copy_messages(conn.dialect)
    memo: dict[str, tuple[Any, Any]] = {}
    values = [copy.row(row, memo) for row in rows]
    try:
        _copy_rows(conn, copy.sql, values)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise driver_error(conn, exc, copy.sql, None) from exc


@functools.cache
def sqlite_variable_limit() -> int:
    """How many values one SQLite statement may bind, with this Python's SQLite library.

    Python 3.11+ asks the library (a build may set a lower limit); older Pythons go by
    its version (999 before SQLite 3.32, 32,766 since).
    """
    if sys.version_info >= (3, 11):
        with contextlib.closing(sqlite3.connect(":memory:")) as probe:
            return probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return 32_766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


def _copy_rows(conn: Connection, sql: str, rows: list[list[Any]]) -> None:
    """``COPY ... FROM STDIN`` of ``rows`` on the psycopg connection, in its transaction.

    On asyncio the driver's own async cursor runs it (SQLAlchemy's sync adapter of
    the connection has no ``copy``), awaited from inside ``run_sync``.
    """
    driver = conn.connection.driver_connection
    try:
        if conn.dialect.is_async:
            await_only(_copy_rows_async(driver, sql, rows))
            return
        with driver.cursor() as cursor, cursor.copy(sql) as copy:  # type: ignore[union-attr]
            for row in rows:
                copy.write_row(row)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            # Cancelled (or interrupted) in the middle of the COPY: the connection is
            # still in that command, so the transaction's rollback would fail and its
            # error replace this one. Invalidated, it is closed instead (the server
            # rolls back), and the cancellation propagates as itself. The socket is
            # closed now, so the server ends the transaction at once.
            with contextlib.suppress(Exception):
                driver.pgconn.finish()  # type: ignore[union-attr]
            conn.invalidate()
        raise


async def _copy_rows_async(driver: Any, sql: str, rows: list[list[Any]]) -> None:
    async with driver.cursor() as cursor, cursor.copy(sql) as copy:
        for row in rows:
            await copy.write_row(row)


def set_score(conn: Connection, cid: str, seq: int, score: float) -> StoredMessage:
    """Set a message's base score."""
    conversation_row(conn, cid, for_update=True)
    row = conn.execute(q.update_message(cid, seq, score=score)).first()
    if row is None:
        raise MessageNotFoundError(cid, seq)
    conn.execute(*q.allocate_seqs(conn.dialect.name, cid, utcnow(), 0, 0, score))
    conn.execute(q.update_conversation(cid, epoch=q.new_epoch()))
    return to_stored(row)


def set_pinned(conn: Connection, cid: str, seq: int, pinned: bool) -> StoredMessage:
    """Pin or unpin a message (pinned messages are anchored: every view keeps them)."""
    conversation_row(conn, cid, for_update=True)
    current = conn.execute(q.messages_range(cid, start=seq, stop=seq + 1)).first()
    if current is None:
        raise MessageNotFoundError(cid, seq)
    anchored = pinned or current.role in ANCHOR_ROLES
    row = conn.execute(q.update_message(cid, seq, pinned=pinned, anchored=anchored)).first()
    assert row is not None
    if current.pinned and not anchored:
        # summarize never gave the summarizer this message (it was anchored, kept by
        # every view): a summary reaching it does not stand for it, and SummaryView
        # would hide it behind that summary. Those summaries go, as pop's do.
        conn.execute(q.delete_summaries(cid, last_from=seq))
    conn.execute(q.update_conversation(cid, epoch=q.new_epoch()))
    return to_stored(row)


def pop(conn: Connection, cid: str, n: int) -> list[StoredMessage]:
    """Delete and return the ``n`` newest messages (chronological)."""
    conv = conversation_row(conn, cid, for_update=True)
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
    conv = conversation_row(conn, cid, for_update=True)
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
    conv = conversation_row(conn, cid, for_update=True)
    count = int(conv.last_seq) - int(conv.first_seq) + 1
    delete_contents(conn, cid, conv)  # (summaries too: seqs restart at 1)
    conn.execute(q.update_conversation(
        cid, first_seq=1, last_seq=0, token_count=0, updated_at=utcnow(), epoch=q.new_epoch()
    ))
    return count


def rewrite(
    conn: Connection, cid: str, newest: int | None, replace: _rewrite.Replace
) -> list[StoredMessage]:
    """Replace the ``newest`` messages of ``cid`` (all: ``None``) with ``replace``'s result.

    The conversation row is locked first (as ``pop`` and appends lock it), so the read,
    ``replace`` and the write are one step for every other writer. The rules (seqs,
    rows left in place, summaries, epoch) are in `memstore._db.rewrite`. Returns the
    replacement as stored; ConversationNotFoundError (``replace`` not called), or
    ConflictError for an id of a message that is not replaced.
    """
    conv = conversation_row(conn, cid, for_update=True)
    first, last = int(conv.first_seq), int(conv.last_seq)
    start = first if newest is None else max(first, last - newest + 1)
    old = ([to_stored(r) for r in conn.execute(q.messages_range(cid, start=start))]
           if start <= last else [])
    new = _rewrite.call(conn, replace, old)
    diff = _rewrite.compare(new, old)
    if diff.unchanged:
        return old  # nothing is written (no new epoch either)
    _rewrite.check_room(cid, start, len(new))
    tail = new[diff.keep:]
    ids = sorted({r.id for r in tail if r.id is not None})
    if start > first and ids:  # older messages stay: their ids are taken
        taken = _rewrite.taken_id(cid, start, stored_by_ids(conn, cid, ids))
        if taken is not None:
            raise taken
    if len(old) > diff.keep:
        conn.execute(q.delete_messages(cid, start=start + diff.keep))
    now = utcnow()
    rows = _rewrite.message_rows(cid, start + diff.keep, tail, now)
    for chunk in range(0, len(rows), INSERT_CHUNK):
        insert_message_rows(conn, rows[chunk:chunk + INSERT_CHUNK])
    if diff.same is not None:  # a summary reaching a changed position describes old content
        conn.execute(q.delete_summaries(cid, last_from=start + diff.same))
    tokens, top = _rewrite.totals(conv, start == first, new, diff, old)
    # Only appended: cached rows are still the stored ones, so the epoch stays, as an
    # append leaves it (epoch 0, from before migration 0002, gets a real one).
    epoch = int(conv.epoch) if diff.appended and int(conv.epoch) != 0 else q.new_epoch()
    conn.execute(q.update_conversation(cid, last_seq=start + len(new) - 1, token_count=tokens,
                                       max_score=top, updated_at=now, epoch=epoch))
    return [*old[:diff.keep],
            *(stored_from_row_dict(row, r.message) for row, r in zip(rows, tail))]


# ---- reads ----------------------------------------------------------------------------


def read_messages(
    conn: Connection,
    cid: str,
    start: int | None,
    stop: int | None,
    limit: int | None,
    newest_first: bool,
) -> list[StoredMessage]:
    """Messages of one conversation in a seq range (none for an unknown conversation)."""
    stmt = q.messages_range(cid, start=start, stop=stop, limit=limit, newest_first=newest_first)
    return [to_stored(r) for r in conn.execute(stmt)]


def get_message(conn: Connection, cid: str, seq: int) -> StoredMessage:
    """One message by seq."""
    row = conn.execute(q.messages_range(cid, start=seq, stop=seq + 1)).first()
    if row is None:
        conversation_row(conn, cid)
        raise MessageNotFoundError(cid, seq)
    return to_stored(row)


def count_tokens(conn: Connection, cid: str) -> int:
    """Sum of the stored per-message token counts (from the conversation row, O(1)).

    0 for a conversation that was never written, like its empty message list.
    """
    row = conn.execute(q.conversation(cid)).first()
    return 0 if row is None else int(row.token_count)


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


# ---- summaries ------------------------------------------------------------------------


def summary_row(summary: Summary) -> dict[str, Any]:
    return {
        "conversation_id": summary.conversation_id, "number": summary.number,
        "first_seq": summary.first_seq, "last_seq": summary.last_seq, "text": summary.text,
        "token_count": summary.token_count, "token_counter": summary.token_counter,
        "created_at": summary.created_at,
    }


def list_summaries(conn: Connection, cid: str) -> list[Summary]:
    """Every summary of one conversation, oldest first."""
    return [to_summary(r) for r in conn.execute(q.summaries_of(cid))]


def read_summaries(conn: Connection, cid: str) -> list[Summary]:
    """Every summary of one conversation (ConversationNotFoundError when unknown)."""
    conversation_row(conn, cid)
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

    See `memstore.views.summary.plan_fold()`: reads the kept units and the
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
    conn.execute(q.insert_summaries(), [summary_row(summary)])
    return summary

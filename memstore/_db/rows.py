"""Rows and models: decoding driver rows, building insert rows, driver errors.

The bottom of the database layer, shared by `memstore._db.ops` (every operation),
`memstore._db.snapshots` (state and streamed loads) and `memstore._db.window` (the
window's read path). Rows never leave these modules; callers get pydantic models.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone, tzinfo
from json.scanner import make_scanner
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Connection, Row
from sqlalchemy import exc as sa_exc
from sqlalchemy.util import await_only

from memstore._db.readonly import EMPTY, ReadOnlyList, freeze
from memstore.models import (
    ANCHOR_ROLES,
    Conversation,
    ImagePart,
    ImageURL,
    Message,
    StoredMessage,
    Summary,
    TextPart,
    ToolCall,
    build_trusted,
)

__all__ = [
    "Prepared",
    "autocommit_off",
    "autocommit_on",
    "decode_raw",
    "driver_error",
    "message_row",
    "new_message_id",
    "new_message_ids",
    "sqlite_time",
    "stored_from_row_dict",
    "to_conversation",
    "to_stored",
    "to_summary",
    "utcnow",
]


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
    h = f"{value:032x}"  # str(uuid.UUID(int=value)), without building the UUID object
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_message_ids(n: int) -> list[str]:
    """``n`` ids as `new_message_id()` makes them, for one batch.

    One clock read and one read of the system's random source for all of them.
    """
    ms = (time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF) << 80
    rand = int.from_bytes(os.urandom(10 * n), "big") if n else 0
    out = []
    for _ in range(n):
        value = ms | (rand & _RAND80)
        rand >>= 80
        value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
        value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562 variant
        h = f"{value:032x}"
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out


_RAND80 = (1 << 80) - 1


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


# ---- rows <-> models ------------------------------------------------------------------


def _parts(raw: list[Any]) -> list[Any]:
    parts: list[Any] = []
    for part in raw:
        if part.get("type") == "text":
            parts.append(build_trusted(TextPart, {"type": "text", "text": part["text"]}))
        else:
            image = part["image_url"]
            url = build_trusted(ImageURL, {"url": image["url"], "detail": image.get("detail")})
            parts.append(build_trusted(ImagePart, {"type": "image_url", "image_url": url}))
    return ReadOnlyList(parts)


def to_stored(row: Any) -> StoredMessage:
    """Build a StoredMessage from a trusted row without re-validating it.

    ``row`` holds `memstore._db.statements.MESSAGE_COLUMNS` as SQLAlchemy returns
    them (decoded JSON, aware UTC timestamps): `decode_raw()`'s decoded case.
    """
    return decode_raw(row[1:], "postgresql", row[0])


def as_utc(moment: datetime) -> datetime:
    """``moment`` with ``timezone.utc`` as its tzinfo (naive values are taken as UTC).

    psycopg returns a ``timestamptz`` in the session's time zone: ``ZoneInfo('Etc/UTC')``
    on a server set to ``Etc/UTC`` (Debian's default), or any zone a client sets (the
    ``TimeZone`` of ``PGOPTIONS``, a service file, ``SET TIME ZONE``). memstore leaves the
    session's settings alone and converts here, so every message read carries
    ``timezone.utc`` whichever path read it (a window, ``messages()``, a state). A zone
    that is UTC under another name only has its tzinfo replaced, a few times cheaper
    than a conversion.
    """
    tz = moment.tzinfo
    if tz is None or tz in _UTC_ZONES:
        return moment.replace(tzinfo=_UTC)
    return moment.astimezone(_UTC)


def _utc_zones() -> frozenset[tzinfo]:
    """The ``ZoneInfo`` objects that are UTC under another name (the ones available)."""
    zones: set[tzinfo] = set()
    for key in ("UTC", "Etc/UTC", "Etc/Universal", "Etc/Zulu", "Universal", "Zulu"):
        try:
            zones.add(ZoneInfo(key))  # ZoneInfo(key) is cached: psycopg gets the same object
        except (ZoneInfoNotFoundError, ValueError, OSError):  # no time zone data here
            continue
    return frozenset(zones)


def sqlite_time(value: Any) -> datetime:
    """A SQLite timestamp (naive UTC text, or a datetime) as an aware UTC datetime."""
    if type(value) is str and len(value) == _SQLITE_TIME_LENGTH:
        # SQLAlchemy's format, 'YYYY-MM-DD HH:MM:SS.ffffff': parsing it with the offset
        # is several times faster than parsing it naive and replacing tzinfo.
        return _fromisoformat(value + "+00:00")
    moment = value if isinstance(value, datetime) else _fromisoformat(value)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


_SQLITE_TIME_LENGTH = len("2026-01-01 00:00:00.000000")
_fromisoformat = datetime.fromisoformat
_UTC = timezone.utc
_UTC_ZONES = _utc_zones()
_new = object.__new__
_set = object.__setattr__
_STORED_FIELDS = set(StoredMessage.model_fields)


def _stored(values: dict[str, Any]) -> StoredMessage:
    """`memstore.models.build_trusted()` for StoredMessage, inlined (once per row)."""
    message: StoredMessage = _new(StoredMessage)
    _set(message, "__dict__", values)
    _set(message, "__pydantic_fields_set__", _STORED_FIELDS)
    _set(message, "__pydantic_extra__", None)
    _set(message, "__pydantic_private__", None)
    return message


def _tool_calls(calls: list[dict[str, Any]]) -> list[ToolCall]:
    return ReadOnlyList([build_trusted(ToolCall, {"id": c["id"], "name": c["name"],
                                                  "arguments": c["arguments"], "type": "function"})
                         for c in calls])


def decode_raw(row: Any, dialect: str, cid: str) -> StoredMessage:
    """Build a StoredMessage from a row of WINDOW_COLUMNS without re-validating it.

    The row has no conversation id: the window reading it knows it (``cid``).

    ``dialect`` ``"sqlite"``: the SQLite driver's values, JSON as text and timestamps
    as naive UTC text. Any other: decoded values, as psycopg returns them (JSONB
    decoded, aware timestamps) and as SQLAlchemy's types return them on both
    databases (`to_stored()`). This runs once per row a window reads: one
    function, no intermediate copies.
    """
    (seq, mid, role, text, parts, name, calls, call_id, score, pinned, tokens, counter,
     created_at, meta) = row
    if dialect == "sqlite":
        if parts is not None:
            parts = json.loads(parts)
        if calls is not None:
            calls = json.loads(calls)
        meta = freeze(json.loads(meta)) if meta is not None else EMPTY
        created_at = sqlite_time(created_at)
    else:
        meta = freeze(meta) if meta is not None else EMPTY
        if created_at.tzinfo is not _UTC:
            created_at = as_utc(created_at)
    return _stored({
        "role": role,
        "content": text if text is not None else (_parts(parts) if parts is not None else None),
        "name": name, "tool_calls": _tool_calls(calls) if calls is not None else None,
        "tool_call_id": call_id, "score": float(score), "pinned": bool(pinned),
        "metadata": meta, "id": mid, "conversation_id": cid, "seq": int(seq),
        "created_at": created_at, "token_count": int(tokens), "token_counter": counter,
    })


def message_row(
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


_MESSAGE_FIELDS = tuple(Message.__pydantic_fields__)


def stored_from_row_dict(row: Mapping[str, Any], message: Message) -> StoredMessage:
    """The StoredMessage of a just-inserted row (``message`` was validated on the way in)."""
    values = message.__dict__.copy() if len(message.__dict__) == len(_MESSAGE_FIELDS) else {
        name: getattr(message, name) for name in _MESSAGE_FIELDS}
    values["id"] = row["message_id"]
    values["conversation_id"] = row["conversation_id"]
    values["seq"] = row["seq"]
    values["created_at"] = row["created_at"]
    values["token_count"] = row["token_count"]
    values["token_counter"] = row["token_counter"]
    # The caller's containers are copied read-only, as a read would return them.
    values["metadata"] = freeze(values["metadata"])
    if type(values["content"]) is list:
        values["content"] = ReadOnlyList(values["content"])
    if values["tool_calls"] is not None:
        values["tool_calls"] = ReadOnlyList(values["tool_calls"])
    return _stored(values)


def to_conversation(row: Row[Any]) -> Conversation:
    m = row._mapping
    return _conversation(m["id"], m["created_at"], m["updated_at"], m["metadata"],
                         m["first_seq"], m["last_seq"], m["token_count"], m.get("expires_at"),
                         m.get("parent_id"), m.get("forked_at_seq"))


def _conversation(cid: str, created_at: datetime, updated_at: datetime, meta: Any, first: Any,
                  last: Any, tokens: Any, expires_at: datetime | None, parent: str | None,
                  forked: Any) -> Conversation:
    """A Conversation from its row's decoded values (no validation: they are stored).

    `memstore.models.build_trusted()` inlined, as `_stored` is (a listing builds one
    per row). The integer columns come back as ints from both drivers.
    """
    conversation: Conversation = _new(Conversation)
    _set(conversation, "__dict__", {
        "id": cid, "created_at": created_at, "updated_at": updated_at,
        "metadata": meta if meta is not None else {},
        "message_count": last - first + 1, "token_count": tokens,
        "expires_at": expires_at, "parent_id": parent, "forked_at_seq": forked,
    })
    _set(conversation, "__pydantic_fields_set__", _CONVERSATION_FIELDS)
    _set(conversation, "__pydantic_extra__", None)
    _set(conversation, "__pydantic_private__", None)
    return conversation


_CONVERSATION_FIELDS = set(Conversation.model_fields)


def conversations_from_raw(rows: Sequence[Sequence[Any]], dialect: str) -> list[Conversation]:
    """Conversations from rows of ``LISTING_COLUMNS``, as the driver returned them.

    See `decode_raw()`: SQLite's JSON text and naive UTC text, or psycopg's decoded
    values (``LISTING_COLUMNS`` is in ``memstore._db.lifecycle``). A listing is a hot
    read: the loop keeps its work per row to the decoding itself.
    """
    out = []
    build = _conversation
    if dialect == "sqlite":
        when, meta_of = sqlite_time, _json_object
        for (cid, created_at, updated_at, meta, first, last, tokens, expires_at, parent,
             forked) in rows:
            out.append(build(cid, when(created_at), when(updated_at),
                             None if meta is None else meta_of(meta), first, last, tokens,
                             None if expires_at is None else when(expires_at), parent, forked))
        return out
    utc = as_utc
    for (cid, created_at, updated_at, meta, first, last, tokens, expires_at, parent,
         forked) in rows:
        out.append(build(cid, utc(created_at), utc(updated_at), meta, first, last, tokens,
                         None if expires_at is None else utc(expires_at), parent, forked))
    return out


_scan_json: Callable[[str, int], tuple[Any, int]] = make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]  # typeshed types it as its own class


def _json_object(text: str) -> Any:
    """Stored JSON text, decoded.

    `json.loads` minus its checks when ``text`` is as memstore writes it (no whitespace
    around the value); anything else goes through `json.loads` itself.
    """
    try:
        value, end = _scan_json(text, 0)
        if end == len(text):
            return value
    except (StopIteration, ValueError, TypeError):
        pass
    return json.loads(text)  # a value written by hand: json's own errors and rules


def fetch_raw(conn: Connection, sql: str, params: Any) -> Sequence[Any]:
    """Run precompiled ``sql`` on the DBAPI cursor of ``conn``; all its rows, undecoded.

    Inside the caller's transaction if one is open, else autocommitting. Going
    around SQLAlchemy's result objects matters for short reads: for textual SQL they
    build column metadata on every execution, which costs more than the query. A
    driver error comes out wrapped as SQLAlchemy would wrap it.
    """
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None  # a checked-out, open connection
    aiosqlite = conn.connection.driver_connection if conn.dialect.driver == "aiosqlite" else None
    return run_raw(conn, dbapi, aiosqlite, sql, params)


def run_raw(conn: Connection, dbapi: Any, aiosqlite: Any, sql: str,
            params: Any) -> Sequence[Any]:
    """`fetch_raw()` with the connection's handles already looked up.

    The window's hot reads keep them: ``dbapi``, the DBAPI connection (for asyncio
    drivers SQLAlchemy's sync adapter of it); ``aiosqlite``, the aiosqlite connection
    or ``None``.
    """
    try:
        if aiosqlite is not None:
            # aiosqlite runs each driver call in its own thread, and SQLAlchemy's cursor
            # adapter makes four calls per statement; execute_fetchall makes one.
            rows: Sequence[Any] = await_only(aiosqlite.execute_fetchall(sql, params))
            return rows
        cursor = dbapi.cursor()
        try:
            cursor.execute(sql, params)
            return cursor.fetchall()  # type: ignore[no-any-return]
        finally:
            cursor.close()
    except conn.dialect.loaded_dbapi.Error as exc:
        raise driver_error(conn, exc, sql, params) from exc


def driver_error(conn: Connection, exc: Exception, statement: str, params: Any) -> Exception:
    """What SQLAlchemy does with a driver error, for statements run on the DBAPI cursor.

    Wraps it in the matching `sqlalchemy.exc.DBAPIError` (which
    `memstore.errors.translate_db_errors()` turns into a memstore error) and, when
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



def autocommit_on(conn: Connection) -> Any:
    """Switch a PostgreSQL connection's driver to autocommit; returns the DBAPI connection.

    The direct read and append paths run each statement as its own transaction. Setting
    the driver's flag costs a few microseconds; SQLAlchemy's
    ``execution_options(isolation_level="AUTOCOMMIT")`` costs 20-40 more (it records the
    characteristic and resets it on the way back to the pool), which is a tenth of a
    warm window. Only the DBAPI cursor runs statements in between, never SQLAlchemy,
    and `autocommit_off()` restores the flag before the connection is used again.
    Requires a connection with no transaction open (a fresh checkout).
    """
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None  # a checked-out, open connection
    try:
        dbapi.autocommit = True
    except conn.dialect.loaded_dbapi.Error as exc:  # a connection the driver knows is broken
        raise driver_error(conn, exc, "SET autocommit", None) from exc
    return dbapi


def autocommit_off(conn: Connection, dbapi: Any) -> None:
    """Undo `autocommit_on()`; a connection that cannot be reset is invalidated."""
    try:
        dbapi.autocommit = False
    except conn.dialect.loaded_dbapi.Error as exc:
        # (a lost connection: already invalidated by driver_error, or it is now)
        if not conn.invalidated:
            conn.invalidate(exc)


def to_summary(row: Sequence[Any]) -> Summary:
    """Build a Summary from a trusted row of `memstore._db.statements.SUMMARY_COLUMNS`."""
    cid, number, first, last, text, tokens, counter, created_at = row
    if not isinstance(created_at, datetime):  # SQLite through the DBAPI cursor
        created_at = sqlite_time(created_at)
    elif created_at.tzinfo is not _UTC:
        created_at = as_utc(created_at)
    return build_trusted(Summary, {
        "conversation_id": cid, "number": int(number), "first_seq": int(first),
        "last_seq": int(last), "text": text, "token_count": int(tokens),
        "token_counter": counter, "created_at": created_at,
    })

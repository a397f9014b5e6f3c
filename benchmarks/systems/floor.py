"""The raw-SQL floor: the least code and SQL that can serve a correct window.

One hand-written table, ``(conversation_id, seq)`` primary key, the cl100k count
stored per row at write time, and a window read newest-first over that index that
stops as soon as the budget is spent, keeping tool calls and their results together.
No ORM, no pydantic, no migrations: plain ``sqlite3`` and ``psycopg``. This is the
practical lower bound for memstore's ``TokenLimitedView`` (it assumes the system
prompt is seq 1, which memstore cannot).

* SQLite: WAL, ``synchronous=NORMAL``; the window is one lazily-iterated query
  (plus a primary-key lookup of the system prompt); bulk import is ``executemany``
  in one transaction per chunk.
* PostgreSQL: the system prompt and the first page of the newest rows come in one
  round trip; further pages (keyset ``seq < last``) only when the budget is not
  spent yet; bulk import is ``COPY``; autocommit appends.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from benchmarks.systems.base import Msg, System, WindowSpec, package_version

__all__ = ["FloorPostgres", "FloorPostgresAsync", "FloorSQLite", "FloorSQLiteAsync", "take_units"]

Row = tuple[str, str | None, str | None, str | None, int]  # role, content, calls, tcid, tokens

_DDL = """
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    role            TEXT    NOT NULL,
    content         TEXT,
    tool_calls      TEXT,
    tool_call_id    TEXT,
    token_count     INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
)
"""

_COLS = "role, content, tool_calls, tool_call_id, token_count"


def take_units(rows: Iterable[Row], left: int) -> list[Row]:
    """Newest-first rows → the newest whole units that fit in ``left`` tokens.

    A tool result is held until the assistant message that called it is read; the
    unit is then kept or refused whole. Reading stops at the first unit that does not
    fit. Returns the kept rows newest-first.
    """
    return _take(rows, left)[0]


def _take(rows: Iterable[Row], left: int) -> tuple[list[Row], bool]:
    """:func:`take_units`, and whether it stopped at a unit that did not fit."""
    kept: list[Row] = []
    pending: list[Row] = []
    pending_tokens = 0
    for row in rows:
        pending.append(row)
        pending_tokens += row[4]
        if row[0] == "tool":
            continue
        if pending_tokens > left:
            return kept, True
        left -= pending_tokens
        kept.extend(pending)
        pending = []
        pending_tokens = 0
    return kept, False


def _page(spec: WindowSpec) -> int:
    """Rows per page when a floor reads a window in pages (about the budget's worth)."""
    return max(16, spec.budget // 64)


def _window(system: Row, kept_newest_first: list[Row]) -> list[Msg]:
    out = [_to_msg(system)]
    out.extend(_to_msg(r) for r in reversed(kept_newest_first))
    return out


#: PostgreSQL: the system prompt and the first page of the newest rows, one statement.
_PG_FIRST = (
    f"(SELECT 0 AS k, seq, {_COLS} FROM messages "
    "  WHERE conversation_id = %s AND seq = 1) "
    f"UNION ALL (SELECT 1, seq, {_COLS} FROM messages "
    "  WHERE conversation_id = %s AND seq > 1 ORDER BY seq DESC LIMIT %s) "
    "ORDER BY k, seq DESC"
)
#: PostgreSQL: the next page, keyset on seq.
_PG_NEXT = (
    f"SELECT 1, seq, {_COLS} FROM messages WHERE conversation_id = %s "
    "AND seq > 1 AND seq < %s ORDER BY seq DESC LIMIT %s"
)
_PG_APPEND = (
    "INSERT INTO messages SELECT %s, COALESCE(MAX(seq), 0) + 1, %s, %s, %s, %s, %s "
    "FROM messages WHERE conversation_id = %s"
)
_SQLITE_APPEND = _PG_APPEND.replace("%s", "?")
_SQLITE_SYSTEM = f"SELECT {_COLS} FROM messages WHERE conversation_id = ? AND seq = 1"
_SQLITE_PAGE = (
    f"SELECT seq, {_COLS} FROM messages WHERE conversation_id = ? AND seq > 1 AND seq < ? "
    "ORDER BY seq DESC LIMIT ?"
)


def _to_msg(row: Row) -> Msg:
    role, content, calls, tcid, _tokens = row
    m: Msg = {"role": role, "content": content}
    if calls is not None:
        m["tool_calls"] = json.loads(calls)
    if tcid is not None:
        m["tool_call_id"] = tcid
    return m


def _encode(m: Msg, tokens: int) -> tuple[str, str | None, str | None, str | None, int]:
    calls = m.get("tool_calls")
    return (
        m["role"],
        m.get("content"),
        json.dumps(calls) if calls else None,
        m.get("tool_call_id"),
        tokens,
    )


class _Floor(System):
    measure_turns: ClassVar[bool] = True
    name: ClassVar[str] = "floor"
    label: ClassVar[str] = "raw SQL floor"
    import_chunk_size: ClassVar[int] = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_seq: dict[str, int] = {}

    def _rows(self, cid: str, chunk: list[Msg]) -> Iterator[tuple[Any, ...]]:
        count = self.ctx.formula.count
        seq = self._next_seq.get(cid, 1)
        for m in chunk:
            yield (cid, seq, *_encode(m, count(m)))
            seq += 1
        self._next_seq[cid] = seq

    def to_openai(self, native: Any) -> list[Msg]:
        return list(native)


class FloorSQLite(_Floor):
    """The floor on a SQLite file with the standard library's ``sqlite3``."""

    import_path: ClassVar[str] = "executemany, one transaction per 10,000 rows"

    @staticmethod
    def versions() -> str:
        return f"sqlite3 (SQLite {sqlite3.sqlite_version})"

    def setup(self) -> None:
        assert self.db.sqlite_path is not None
        self.con = sqlite3.connect(self.db.sqlite_path, isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=NORMAL")
        self.con.execute(_DDL)

    def close(self) -> None:
        self.con.close()

    def import_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        con = self.con
        con.execute("BEGIN")
        con.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)", self._rows(cid, chunk))
        con.execute("COMMIT")

    def fetch(self, cid: str, prepared: Any) -> list[Msg]:
        spec: WindowSpec = prepared
        con = self.con
        system = con.execute(_SQLITE_SYSTEM, (cid,)).fetchone()
        left = spec.budget - self.ctx.formula.priming - system[4]
        cur = con.execute(
            f"SELECT {_COLS} FROM messages WHERE conversation_id = ? AND seq > 1 ORDER BY seq DESC",
            (cid,),
        )
        kept = take_units(cur, left)
        cur.close()
        return _window(system, kept)

    def append(self, cid: str, message: Msg) -> None:
        tokens = self.ctx.formula.count(message)
        self.con.execute(_SQLITE_APPEND, (cid, *_encode(message, tokens), cid))


class FloorPostgres(_Floor):
    """The floor on PostgreSQL with ``psycopg`` 3 (no pool, one connection)."""

    import_path: ClassVar[str] = "COPY, one transaction per 10,000 rows"

    @staticmethod
    def versions() -> str:
        return package_version("psycopg")

    def setup(self) -> None:
        import psycopg

        self.conn = psycopg.connect(self.db.libpq_dsn, autocommit=True)
        self.conn.execute(_DDL)

    def close(self) -> None:
        self.conn.close()

    def import_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        conn = self.conn
        copy_sql = (
            "COPY messages (conversation_id, seq, role, content, tool_calls, "
            "tool_call_id, token_count) FROM STDIN"
        )
        with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
            for row in self._rows(cid, chunk):
                copy.write_row(row)

    def fetch(self, cid: str, prepared: Any) -> list[Msg]:
        spec: WindowSpec = prepared
        page = _page(spec)
        cur = self.conn.cursor()
        # System prompt + first page of the newest rows in one round trip.
        rows = cur.execute(_PG_FIRST, (cid, cid, page)).fetchall()
        system: Row = rows[0][2:]
        left = spec.budget - self.ctx.formula.priming - system[4]

        def newest_first() -> Iterator[Row]:
            batch = rows[1:]
            while True:
                yield from (r[2:] for r in batch)
                if len(batch) < page:
                    return
                batch = cur.execute(_PG_NEXT, (cid, batch[-1][1], page)).fetchall()

        kept = take_units(newest_first(), left)
        cur.close()
        return _window(system, kept)

    def append(self, cid: str, message: Msg) -> None:
        tokens = self.ctx.formula.count(message)
        self.conn.execute(_PG_APPEND, (cid, *_encode(message, tokens), cid))


class FloorSQLiteAsync(_Floor):
    """The floor on asyncio: ``aiosqlite``, its window read in pages like PostgreSQL's.

    aiosqlite runs every call in its connection's thread, so lazily iterating a cursor
    row by row would cost one thread hop per few rows: the window is read as the system
    prompt plus pages of about the budget's worth of rows (``execute_fetchall``, one hop
    each), keyset on seq.
    """

    name: ClassVar[str] = "floor-async"
    label: ClassVar[str] = "raw SQL floor (async)"
    is_async: ClassVar[bool] = True
    import_path: ClassVar[str] = "executemany, one transaction per chunk"

    @staticmethod
    def versions() -> str:
        return package_version("aiosqlite")

    def setup(self) -> None:
        import aiosqlite

        assert self.db.sqlite_path is not None

        async def connect() -> Any:
            con = await aiosqlite.connect(self.db.sqlite_path, isolation_level=None)
            await con.execute("PRAGMA journal_mode=WAL")
            await con.execute("PRAGMA synchronous=NORMAL")
            await con.execute(_DDL)
            return con

        self.con = self.run(connect())

    def close(self) -> None:
        self.run(self.con.close())

    async def aimport_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        await self.con.execute("BEGIN")
        await self.con.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)", list(self._rows(cid, chunk))
        )
        await self.con.execute("COMMIT")

    async def afetch(self, cid: str, prepared: Any) -> list[Msg]:
        spec: WindowSpec = prepared
        page = _page(spec)
        con = self.con
        system: Row = (await con.execute_fetchall(_SQLITE_SYSTEM, (cid,)))[0]
        left = spec.budget - self.ctx.formula.priming - system[4]
        rows: list[Row] = []
        before = 2**62
        while True:
            batch = await con.execute_fetchall(_SQLITE_PAGE, (cid, before, page))
            rows.extend(r[1:] for r in batch)
            kept, full = _take(rows, left)
            if full or len(batch) < page:
                return _window(system, kept)
            before = batch[-1][0]

    async def aappend(self, cid: str, message: Msg) -> None:
        tokens = self.ctx.formula.count(message)
        await self.con.execute(_SQLITE_APPEND, (cid, *_encode(message, tokens), cid))


class FloorPostgresAsync(_Floor):
    """The floor on asyncio: ``psycopg.AsyncConnection``, the same statements as the sync floor."""

    name: ClassVar[str] = "floor-async"
    label: ClassVar[str] = "raw SQL floor (async)"
    is_async: ClassVar[bool] = True
    import_path: ClassVar[str] = "COPY, one transaction per chunk"

    @staticmethod
    def versions() -> str:
        return package_version("psycopg")

    def setup(self) -> None:
        import psycopg

        self.conn = self.run(psycopg.AsyncConnection.connect(self.db.libpq_dsn, autocommit=True))

    def close(self) -> None:
        self.run(self.conn.close())

    async def aimport_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        copy_sql = (
            "COPY messages (conversation_id, seq, role, content, tool_calls, "
            "tool_call_id, token_count) FROM STDIN"
        )
        async with self.conn.transaction(), self.conn.cursor() as cur, cur.copy(copy_sql) as copy:
            for row in self._rows(cid, chunk):
                await copy.write_row(row)

    async def afetch(self, cid: str, prepared: Any) -> list[Msg]:
        spec: WindowSpec = prepared
        page = _page(spec)
        async with self.conn.cursor() as cur:
            await cur.execute(_PG_FIRST, (cid, cid, page))
            first = await cur.fetchall()
            system: Row = first[0][2:]
            left = spec.budget - self.ctx.formula.priming - system[4]
            rows: list[Row] = []
            batch = first[1:]
            while True:
                rows.extend(r[2:] for r in batch)
                kept, full = _take(rows, left)
                if full or len(batch) < page:
                    return _window(system, kept)
                await cur.execute(_PG_NEXT, (cid, batch[-1][1], page))
                batch = await cur.fetchall()

    async def aappend(self, cid: str, message: Msg) -> None:
        tokens = self.ctx.formula.count(message)
        await self.conn.execute(_PG_APPEND, (cid, *_encode(message, tokens), cid))

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

__all__ = ["FloorPostgres", "FloorSQLite", "take_units"]

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
    kept: list[Row] = []
    pending: list[Row] = []
    pending_tokens = 0
    for row in rows:
        pending.append(row)
        pending_tokens += row[4]
        if row[0] == "tool":
            continue
        if pending_tokens > left:
            break
        left -= pending_tokens
        kept.extend(pending)
        pending = []
        pending_tokens = 0
    return kept


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
        system = con.execute(
            f"SELECT {_COLS} FROM messages WHERE conversation_id = ? AND seq = 1", (cid,)
        ).fetchone()
        left = spec.budget - self.ctx.formula.priming - system[4]
        cur = con.execute(
            f"SELECT {_COLS} FROM messages WHERE conversation_id = ? AND seq > 1 ORDER BY seq DESC",
            (cid,),
        )
        kept = take_units(cur, left)
        cur.close()
        out = [_to_msg(system)]
        out.extend(_to_msg(r) for r in reversed(kept))
        return out

    def append(self, cid: str, message: Msg) -> None:
        tokens = self.ctx.formula.count(message)
        self.con.execute(
            "INSERT INTO messages SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ?, ? "
            "FROM messages WHERE conversation_id = ?",
            (cid, *_encode(message, tokens), cid),
        )


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
        page = max(16, spec.budget // 64)
        cur = self.conn.cursor()
        # System prompt + first page of the newest rows in one round trip.
        rows = cur.execute(
            f"(SELECT 0 AS k, seq, {_COLS} FROM messages "
            "  WHERE conversation_id = %s AND seq = 1) "
            f"UNION ALL (SELECT 1, seq, {_COLS} FROM messages "
            "  WHERE conversation_id = %s AND seq > 1 ORDER BY seq DESC LIMIT %s) "
            "ORDER BY k, seq DESC",
            (cid, cid, page),
        ).fetchall()
        system: Row = rows[0][2:]
        left = spec.budget - self.ctx.formula.priming - system[4]

        def newest_first() -> Iterator[Row]:
            batch = rows[1:]
            while True:
                yield from (r[2:] for r in batch)
                if len(batch) < page:
                    return
                batch = cur.execute(
                    f"SELECT 1, seq, {_COLS} FROM messages WHERE conversation_id = %s "
                    "AND seq > 1 AND seq < %s ORDER BY seq DESC LIMIT %s",
                    (cid, batch[-1][1], page),
                ).fetchall()

        kept = take_units(newest_first(), left)
        cur.close()
        out = [_to_msg(system)]
        out.extend(_to_msg(r) for r in reversed(kept))
        return out

    def append(self, cid: str, message: Msg) -> None:
        tokens = self.ctx.formula.count(message)
        self.conn.execute(
            "INSERT INTO messages SELECT %s, COALESCE(MAX(seq), 0) + 1, %s, %s, %s, %s, %s "
            "FROM messages WHERE conversation_id = %s",
            (cid, *_encode(message, tokens), cid),
        )

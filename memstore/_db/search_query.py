"""Full-text search: the queries over the index ``memstore._db.search`` keeps.

`search` runs one request. The common shapes (every conversation, or one, without
other filters) are precompiled SQL run on the driver's cursor, rows decoded as the
window decodes them; the others are built with SQLAlchemy. On SQLite a search of one
conversation picks among three plans (see `_sqlite_one`); on PostgreSQL the
``tsvector`` side table is searched and joined back to the messages by key.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
    true,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import await_only

from memstore._db.filters import conversation_filter
from memstore._db.rows import decode_raw, fetch_raw, to_stored
from memstore._db.schema import messages
from memstore._db.search import INDEX, VOCABULARY, averages, missing_index, side
from memstore._db.statements import MESSAGE_COLUMNS
from memstore.models import StoredMessage
from memstore.search import (
    SearchHit,
    SearchRequest,
    searchable_text,
)

__all__ = ["search"]

# ---- searching ---------------------------------------------------------------------------

#: SQLite: a search scoped to conversations holding at most this many messages may walk
#: them (one FTS5 lookup per message) instead of the index's matches; its hits are then
#: ranked here, by the BM25 FTS5 computes (the same formula, over the same statistics).
SCOPED_ROWS = 5_000
#: A lookup per message costs about as much as walking this many postings (measured on
#: 1,000,000 messages: a lookup 60-100 µs, a posting about 0.2 µs): one conversation's
#: messages whose rows lie within this many times their number are walked untimed, and
#: several conversations take the lookups when the query's rarest word has more matches.
SCOPED_WALK = 400
#: One conversation's messages lying further apart are walked timed: given this many
#: seconds per message (about a lookup's time), a walk that runs out of time gives way to
#: the lookups.
SCOPED_LOOKUP_SECONDS = 50e-6
#: How often (in SQLite virtual-machine steps) a timed walk checks its clock.
PROGRESS_STEPS = 1_000
#: Hits' context ranges per statement.
CONTEXT_CHUNK = 200
#: BM25's parameters (FTS5's own).
BM25_K1 = 1.2
BM25_B = 0.75

_M = messages.alias("m")
_M_ROWID: ColumnElement[int] = literal_column("m.rowid")
_FTS: ColumnElement[Any] = literal_column(INDEX)  # FTS5's hidden column named after its table
_FTS_ROWID: ColumnElement[int] = literal_column(f"{INDEX}.rowid")
_S = side.c


def _filters(request: SearchRequest, dialect: str, cid: Any, role: Any,
             created_at: Any) -> list[ColumnElement[bool]]:
    out: list[ColumnElement[bool]] = []
    ids = request.conversation_ids
    if ids is not None:
        out.append(cid == ids[0] if len(ids) == 1 else cid.in_(ids))
    if request.where:
        out.append(conversation_filter(request.where, dialect, id_column=cid))
    if request.roles is not None:
        roles = request.roles
        out.append(role == roles[0] if len(roles) == 1 else role.in_(roles))
    if request.since is not None:
        out.append(created_at >= request.since)
    if request.until is not None:
        out.append(created_at < request.until)
    return out


#: The message columns of a hit, in `memstore._db.rows.decode_raw()`'s order, then the id.
_COLUMNS = [c.name for c in MESSAGE_COLUMNS[1:]]


def _columns(alias: str) -> str:
    return ", ".join(f"{alias}.{name}" for name in [*_COLUMNS, "conversation_id"])


_WIDTH = len(_COLUMNS)
#: SQLite: whether the index stems (its tokenizer is porter's), as a column of the query.
_SQLITE_STEMS = (f"(SELECT instr(sql, 'porter') > 0 FROM sqlite_master WHERE type = 'table' "
                 f"AND name = '{INDEX}')")

#: The precompiled searches of the common shapes (no filter but one conversation): SQL
#: text run on the driver, rows decoded as the window decodes them.
_SQLITE_ALL = (
    f"SELECT {_columns('m')}, t.rank, {_SQLITE_STEMS} FROM (SELECT rowid AS rid, rank FROM "
    f"{INDEX} WHERE {INDEX} MATCH ? ORDER BY rank, rowid DESC LIMIT ?) AS t "
    "JOIN memstore_messages AS m ON m.rowid = t.rid ORDER BY t.rank, t.rid DESC"
)
_SQLITE_ONE = (
    f"SELECT {_columns('m')}, m.rowid, {_SQLITE_STEMS} FROM memstore_messages AS m "
    f"WHERE m.conversation_id = ? AND EXISTS (SELECT 1 FROM {INDEX} WHERE {INDEX} MATCH ? "
    f"AND {INDEX}.rowid = m.rowid)"
)
_PG_QUERY = "to_tsquery(memstore_search_config(), %(q)s)"


def _postgresql_sql(scoped: bool) -> str:
    scope = " AND conversation_id = %(cid)s" if scoped else ""
    outer = " AND m.conversation_id = %(cid)s" if scoped else ""
    # The query is parsed once, in FROM (in the SELECT list it would be parsed again
    # for each match ranked).
    return (
        f"SELECT {_columns('m')}, t.rank, memstore_search_config()::text FROM (SELECT "
        f"conversation_id, seq, created_at, ts_rank_cd(document, q, 1) AS rank "
        f"FROM {INDEX}, {_PG_QUERY} AS q WHERE document @@ q{scope} ORDER BY rank DESC, created_at "
        "DESC, conversation_id, seq DESC LIMIT %(limit)s) AS t JOIN memstore_messages AS m ON "
        f"m.conversation_id = t.conversation_id AND m.seq = t.seq{outer} ORDER BY t.rank DESC, "
        "t.created_at DESC, t.conversation_id, t.seq DESC"
    )


_PG_ALL = _postgresql_sql(False)
_PG_ONE = _postgresql_sql(True)

Ranked = list[tuple[StoredMessage, float]]


def search(conn: Connection, request: SearchRequest) -> list[SearchHit]:
    """Run a search: the hits, best first, with snippets and context.

    The common shapes (every conversation, or one, without other filters) run
    precompiled SQL on the driver; the others are built with SQLAlchemy.
    """
    if request.conversation_ids == () or request.roles == ():
        return []
    ranked, stemmed = (_sqlite_search(conn, request) if conn.dialect.name == "sqlite"
                       else _postgresql_search(conn, request))
    if not ranked:
        return []
    around = _context(conn, [m for m, _ in ranked], request.context) if request.context else {}
    keys = request.query.keys
    hits = []
    for message, rank in ranked:
        before, after = around.get((message.conversation_id, message.seq), ((), ()))
        hits.append(SearchHit.found(message, rank, keys, request.mark, stemmed=stemmed,
                                    before=before, after=after))
    return hits


def _simple(request: SearchRequest) -> bool:
    """No filter but at most one conversation: a precompiled statement serves it."""
    ids = request.conversation_ids
    return (not request.where and request.roles is None and request.since is None
            and request.until is None and (ids is None or len(ids) == 1))


def _missing_table(conn: Connection, exc: Exception) -> Exception | None:
    if "no such table" in str(exc) and INDEX in str(exc):
        return missing_index(conn)
    return None


def _sqlite_search(conn: Connection, request: SearchRequest) -> tuple[Ranked, bool]:
    from sqlalchemy import exc as sa_exc

    try:
        return _sqlite_ranked(conn, request)
    except sa_exc.OperationalError as exc:
        missing = _missing_table(conn, exc)
        if missing is not None:
            raise missing from None
        raise


def _sqlite_ranked(conn: Connection, request: SearchRequest) -> tuple[Ranked, bool]:
    ids = request.conversation_ids
    fts5 = request.query.fts5()
    if ids is not None and len(ids) == 1 and _simple(request):
        found = _sqlite_one(conn, request, ids[0], fts5)
        if found is not None:
            return found
        return _sqlite_scoped(conn, request, _sqlite_stats(conn, ids, sorted(request.query.keys)))
    if ids is not None:
        stats = _sqlite_stats(conn, ids, sorted(request.query.keys))
        if stats.scope <= SCOPED_ROWS and (stats.stemmed or _postings(request, stats)
                                           > SCOPED_WALK * stats.scope):
            return _sqlite_scoped(conn, request, stats)
    if _simple(request):  # every conversation (one is `_sqlite_one`'s)
        return _sqlite_hits(fetch_raw(conn, _SQLITE_ALL, (fts5, request.limit)))
    match = _FTS.op("MATCH")(bindparam("q", fts5))
    conditions = _filters(request, "sqlite", _M.c.conversation_id, _M.c.role, _M.c.created_at)
    fts: Any = select(_FTS_ROWID.label("rid"), literal_column(f"{INDEX}.rank").label("rank"))
    fts = fts.select_from(text(INDEX)).join(_M, _M_ROWID == _FTS_ROWID).where(*conditions)
    top = (fts.where(match).order_by(literal_column("rank"), _FTS_ROWID.desc())
           .limit(request.limit).subquery("top"))
    rows = conn.execute(
        select(*MESSAGE_COLUMNS, top.c.rank, literal_column(_SQLITE_STEMS))
        .select_from(messages.join(top, literal_column("memstore_messages.rowid") == top.c.rid))
        .order_by(top.c.rank, top.c.rid.desc())
    ).all()
    return ([(to_stored(row[:-2]), -float(row[-2])) for row in rows],
            bool(rows and rows[0][-1]))


def _sqlite_hits(rows: Sequence[Any]) -> tuple[Ranked, bool]:
    """Decoded hits of a precompiled SQLite search (message columns, rowid, rank, stems)."""
    return ([(decode_raw(r[:_WIDTH], "sqlite", r[_WIDTH]), -float(r[_WIDTH + 1]))
             for r in rows], bool(rows and rows[0][-1]))


def _sqlite_one(conn: Connection, request: SearchRequest, cid: str,
                fts5: str) -> tuple[Ranked, bool] | None:
    """A search of one conversation, with no other filter (the common shape).

    The conversation's rowid range is read first (at most ``SCOPED_ROWS + 1`` index
    entries, no statistics):

    * over ``SCOPED_ROWS`` messages: the index's matches filtered to it;
    * its messages close together (the range under ``SCOPED_WALK`` times their
      number): the index's matches in that range, a walk no longer than the lookups
      of the per-message plan;
    * spread further apart (written among many other conversations): the same walk,
      timed; it usually ends far sooner than the lookups would (the query's words are
      rarer than the range's messages are many). Given as long as the lookups would
      take and not done by then, it stops and the per-message plan runs: at worst
      about twice that plan's time.

    ``None``: the walk ran out of time; the caller runs the per-message plan.
    """
    ((low, high, size),) = fetch_raw(conn, _SQLITE_SPAN, (cid, max(SCOPED_ROWS, 0) + 1))
    if not size:
        return [], False
    if size > SCOPED_ROWS:
        rows = fetch_raw(conn, _SQLITE_IN_ONE, (fts5, cid, request.limit))
    else:
        params = (fts5, low, high, cid, request.limit)
        if high - low < SCOPED_WALK * size:
            rows = fetch_raw(conn, _SQLITE_IN_SPAN, params)
        else:
            timed = _timed(conn, _SQLITE_IN_SPAN, params, size * SCOPED_LOOKUP_SECONDS)
            if timed is None:
                return None
            rows = timed
    return _sqlite_hits(rows)


def _timed(conn: Connection, sql: str, params: Any, seconds: float) -> Sequence[Any] | None:
    """``sql``'s rows, or ``None`` when it ran longer than ``seconds`` (it is stopped).

    A SQLite progress handler checks the clock every `PROGRESS_STEPS` steps; returning
    true makes SQLite stop the statement with ``SQLITE_INTERRUPT``. A read is only
    stopped, nothing is rolled back: a transaction the caller has open stays open for
    its next statement. The handler is removed before the connection goes back to the
    pool; a connection where that cannot be made sure of (an asyncio cancellation while
    aiosqlite's thread sets or removes it) is invalidated instead, as
    `memstore._db.engine.apply_options` does.
    """
    clock = time.perf_counter
    deadline = [math.inf]  # set once the handler is in place (aiosqlite: a thread hop)

    def late() -> bool:
        return clock() > deadline[0]

    aiosqlite = conn.connection.driver_connection if conn.dialect.driver == "aiosqlite" else None
    if aiosqlite is not None:
        def handle(handler: Any, steps: int) -> None:
            await_only(aiosqlite.set_progress_handler(handler, steps))
    else:
        handle = conn.connection.dbapi_connection.set_progress_handler  # type: ignore[union-attr]
    try:
        handle(late, PROGRESS_STEPS)
        deadline[0] = clock() + seconds
        return fetch_raw(conn, sql, params)
    except (sa_exc.OperationalError, sqlite3.OperationalError) as exc:
        if "interrupted" not in str(getattr(exc, "orig", exc)):
            raise
        return None
    finally:
        try:
            handle(None, 0)
        except BaseException:
            conn.invalidate()
            raise


#: SQLite: the matches of the whole index, filtered to one conversation (when the
#: query's words are rarer than the conversation's messages are many).
_SQLITE_IN_ONE = (
    f"SELECT {_columns('m')}, t.rank, {_SQLITE_STEMS} FROM (SELECT {INDEX}.rowid AS rid, "
    f"{INDEX}.rank AS rank FROM {INDEX} JOIN memstore_messages AS c ON c.rowid = {INDEX}.rowid "
    f"WHERE {INDEX} MATCH ? AND c.conversation_id = ? ORDER BY {INDEX}.rank, {INDEX}.rowid "
    "DESC LIMIT ?) AS t JOIN memstore_messages AS m ON m.rowid = t.rid ORDER BY t.rank, "
    "t.rid DESC"
)


#: SQLite: where one conversation's messages lie in the table, and how many there are
#: (read no further than the limit: a larger conversation takes the statistics' plan).
_SQLITE_SPAN = ("SELECT min(r), max(r), count(*) FROM (SELECT rowid AS r FROM "
                "memstore_messages WHERE conversation_id = ? LIMIT ?)")

#: SQLite: `_SQLITE_IN_ONE` over the rowid range of the conversation's messages (FTS5
#: seeks each word's postings to the range, so only the range is walked).
_SQLITE_IN_SPAN = (
    f"SELECT {_columns('m')}, t.rank, {_SQLITE_STEMS} FROM (SELECT {INDEX}.rowid AS rid, "
    f"{INDEX}.rank AS rank FROM {INDEX} JOIN memstore_messages AS c ON c.rowid = {INDEX}.rowid "
    f"WHERE {INDEX} MATCH ? AND {INDEX}.rowid BETWEEN ? AND ? AND c.conversation_id = ? "
    f"ORDER BY {INDEX}.rank, {INDEX}.rowid DESC LIMIT ?) AS t JOIN memstore_messages AS m "
    "ON m.rowid = t.rid ORDER BY t.rank, t.rid DESC"
)


@dataclass
class _Stats:
    """What a scoped SQLite search reads first, in one statement."""

    scope: int  # messages in the conversations searched
    stemmed: bool
    rows: int  # messages indexed
    tokens: int  # tokens indexed
    frequency: dict[str, int]  # documents holding each of the query's words


def _sqlite_stats(conn: Connection, ids: Sequence[str], keys: list[str]) -> _Stats:
    marks = ", ".join("?" * len(ids))
    terms = ", ".join("?" * len(keys)) or "NULL"
    rows = fetch_raw(
        conn,
        f"SELECT 's', (SELECT sum(last_seq - first_seq + 1) FROM memstore_conversations WHERE "
        f"id IN ({marks})) UNION ALL SELECT 'p', {_SQLITE_STEMS} UNION ALL SELECT 'a', block "
        f"FROM {INDEX}_data WHERE id = 1 UNION ALL SELECT 't' || term, doc FROM {VOCABULARY} "
        f"WHERE term IN ({terms})", (*ids, *keys))
    stats = _Stats(0, False, 0, 0, {})
    for kind, value in rows:
        if kind == "s":
            stats.scope = int(value or 0)
        elif kind == "p":
            stats.stemmed = bool(value)
        elif kind == "a":
            stats.rows, stats.tokens = averages(value)
        else:
            stats.frequency[kind[1:]] = int(value)
    return stats


def _postings(request: SearchRequest, stats: _Stats) -> int:
    """About how many matches the index walks for the query: per OR group, its rarest word."""
    from memstore.search import _TOKEN_RE, _key

    total = 0
    for group in request.query.groups:
        counts = [stats.frequency.get(_key(word), 0) for term in group if not term.exclude
                  for word in _TOKEN_RE.findall(term.text)]
        total += min(counts, default=0)
    return total


def _sqlite_scoped(conn: Connection, request: SearchRequest,
                   stats: _Stats) -> tuple[Ranked, bool]:
    """A search of a few conversations: each of their messages is one FTS5 lookup.

    FTS5 recomputes ``bm25``'s statistics for each lookup, so the matches are ranked
    here instead, by the same BM25 over the index's own statistics (document
    frequencies from the vocabulary table, the row count and mean length from the
    index's averages record).
    """
    fts5 = request.query.fts5()
    ids = request.conversation_ids
    assert ids is not None
    if _simple(request):
        rows = fetch_raw(conn, _SQLITE_ONE, (ids[0], fts5))
        found = [decode_raw(r[:_WIDTH], "sqlite", r[_WIDTH]) for r in rows]
    else:
        conditions = _filters(request, "sqlite", _M.c.conversation_id, _M.c.role,
                              _M.c.created_at)
        lookup: Select[Any] = select(literal_column("1")).select_from(text(INDEX)).where(
            _FTS.op("MATCH")(bindparam("q", fts5)), _FTS_ROWID == _M_ROWID)
        rows = conn.execute(
            select(*(_M.c[name] for name in _MESSAGE_NAMES), _M_ROWID,
                   literal_column(_SQLITE_STEMS))
            .where(*conditions, lookup.exists())
        ).all()
        found = [to_stored(row[:-2]) for row in rows]
    if not found:
        return [], stats.stemmed
    scores = _bm25(found, request, stats)
    order = sorted(range(len(found)), key=lambda i: (
        -scores[i], -found[i].created_at.timestamp(), found[i].conversation_id, -found[i].seq))
    return [(found[i], scores[i]) for i in order[: request.limit]], stats.stemmed


_MESSAGE_NAMES = [c.name for c in MESSAGE_COLUMNS]


def _words(text_: str, stemmed: bool) -> list[str]:
    """The comparison keys of the words of ``text_`` (as `memstore.search` compares them)."""
    from memstore.search import _TOKEN_RE, _key, _stem

    if text_.isascii():
        words = _ASCII_WORD.findall(text_.lower())
    else:
        words = [_key(w) for w in _TOKEN_RE.findall(text_)]
    return [_stem(w) for w in words] if stemmed else words


_ASCII_WORD = re.compile(r"[a-z0-9]+")


def _bm25(found: list[StoredMessage], request: SearchRequest, stats: _Stats) -> list[float]:
    from memstore.search import _stem

    average = stats.tokens / stats.rows if stats.rows else 1.0
    weights: dict[str, float] = {}
    for key in sorted(request.query.keys):
        hits = stats.frequency.get(key, 1)
        idf = math.log((stats.rows - hits + 0.5) / (hits + 0.5)) if stats.rows else 1.0
        weights[_stem(key) if stats.stemmed else key] = idf if idf > 0 else 1e-6
    scores = []
    for message in found:
        words = _words(searchable_text(message.content, message.tool_calls), stats.stemmed)
        length = len(words) or 1
        score = 0.0
        for word, weight in weights.items():
            tf = words.count(word)
            if tf:
                score += weight * tf * (BM25_K1 + 1) / (
                    tf + BM25_K1 * (1 - BM25_B + BM25_B * length / average))
        scores.append(score)
    return scores


def _postgresql_search(conn: Connection, request: SearchRequest) -> tuple[Ranked, bool]:
    ids = request.conversation_ids
    tsquery = request.query.tsquery()
    if _simple(request):
        params: dict[str, Any] = {"q": tsquery, "limit": request.limit}
        if ids is not None:
            params["cid"] = ids[0]
        rows = fetch_raw(conn, _PG_ALL if ids is None else _PG_ONE, params)
        return ([(decode_raw(r[:_WIDTH], "postgresql", r[_WIDTH]), float(r[_WIDTH + 1]))
                 for r in rows], bool(rows and rows[0][-1] == "english"))
    # The query parsed once, in FROM (see `_postgresql_sql`).
    parsed = select(func.to_tsquery(func.memstore_search_config(), bindparam("q", tsquery))
                    .label("q")).subquery("tsq")
    rank = func.ts_rank_cd(_S.document, parsed.c.q, 1).label("rank")
    conditions = _filters(request, "postgresql", _S.conversation_id, _S.role, _S.created_at)
    top = (select(_S.conversation_id, _S.seq, _S.created_at, rank)
           .select_from(side.join(parsed, true()))
           .where(_S.document.op("@@")(parsed.c.q), *conditions)
           .order_by(rank.desc(), _S.created_at.desc(), _S.conversation_id, _S.seq.desc())
           .limit(request.limit).subquery("top"))
    M = messages.c
    on = [M.conversation_id == top.c.conversation_id, M.seq == top.c.seq]
    if ids is not None:  # so the messages' partition is pruned too
        on.append(M.conversation_id == ids[0] if len(ids) == 1 else M.conversation_id.in_(ids))
    rows = conn.execute(
        select(*MESSAGE_COLUMNS, top.c.rank,
               func.memstore_search_config().cast(String).label("language"))
        .select_from(messages.join(top, and_(*on)))
        .order_by(top.c.rank.desc(), top.c.created_at.desc(), top.c.conversation_id,
                  top.c.seq.desc())
    ).all()
    return ([(to_stored(row[:-2]), float(row[-2])) for row in rows],
            bool(rows and rows[0][-1] == "english"))


Around = tuple[tuple[StoredMessage, ...], tuple[StoredMessage, ...]]


def _context(conn: Connection, found: list[StoredMessage],
             context: int) -> dict[tuple[str, int], Around]:
    """Up to ``context`` messages on each side of each hit, by (conversation, seq)."""
    ranges: dict[str, list[list[int]]] = {}
    for m in sorted(found, key=lambda m: (m.conversation_id, m.seq)):
        low, high = max(1, m.seq - context), m.seq + context
        spans = ranges.setdefault(m.conversation_id, [])
        if spans and low <= spans[-1][1] + 1:
            spans[-1][1] = max(spans[-1][1], high)
        else:
            spans.append([low, high])
    M = messages.c
    spans_flat = [(cid, low, high) for cid, spans in ranges.items() for low, high in spans]
    near: dict[str, dict[int, StoredMessage]] = {}
    for start in range(0, len(spans_flat), CONTEXT_CHUNK):
        chunk = spans_flat[start:start + CONTEXT_CHUNK]
        statement = select(*MESSAGE_COLUMNS).where(or_(*(
            and_(M.conversation_id == cid, M.seq >= low, M.seq <= high)
            for cid, low, high in chunk)))
        for row in conn.execute(statement):
            message = to_stored(row)
            near.setdefault(message.conversation_id, {})[message.seq] = message
    out = {}
    for m in found:
        rows = near.get(m.conversation_id, {})
        before = tuple(rows[s] for s in range(m.seq - context, m.seq) if s in rows)
        after = tuple(rows[s] for s in range(m.seq + 1, m.seq + context + 1) if s in rows)
        out[(m.conversation_id, m.seq)] = (before, after)
    return out

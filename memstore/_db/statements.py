"""SQL statement builders shared by the sync and async stores.

Pure functions: they build SQLAlchemy Core statements and never execute them.
Every statement here is scoped to one conversation id except `totals()`
(administrative, not a hot path); the lifecycle's sweeps and listings, which span
conversations by design, are in ``memstore._db.lifecycle``.
"""

from __future__ import annotations

import functools
import operator
import secrets
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnClause,
    Delete,
    Double,
    Select,
    String,
    Update,
    and_,
    bindparam,
    case,
    column,
    delete,
    func,
    literal,
    literal_column,
    null,
    select,
    table,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.dml import Insert

from memstore._db.schema import VERSION_TABLE, conversations, messages, summaries
from memstore._validate import MAX_SEQ

_R = TypeVar("_R", bound="_MessageRows")

__all__ = [
    "CompiledSQL",
    "CopyMessages",
    "allocate_seqs",
    "conversation",
    "copy_messages",
    "delete_conversation",
    "delete_messages",
    "delete_summaries",
    "hot",
    "hot_write",
    "insert_conversation",
    "insert_messages",
    "insert_summaries",
    "latest_summary",
    "messages_by_ids",
    "messages_range",
    "new_epoch",
    "precompile",
    "schema_revision",
    "sum_tokens",
    "summaries_of",
    "totals",
    "update_conversation",
    "update_message",
]

C = conversations.c
M = messages.c
S = summaries.c

#: Columns a Summary is built from, in a fixed order.
SUMMARY_COLUMNS = (
    S.conversation_id, S.number, S.first_seq, S.last_seq, S.text, S.token_count,
    S.token_counter, S.created_at,
)

#: Columns a StoredMessage is built from, in a fixed order.
MESSAGE_COLUMNS = (
    M.conversation_id, M.seq, M.message_id, M.role, M.content_text, M.content_parts, M.name,
    M.tool_calls, M.tool_call_id, M.score, M.pinned, M.token_count, M.token_counter,
    M.created_at, M.metadata,
)


#: The window's message columns: MESSAGE_COLUMNS without the conversation id, which the
#: window knows. Reading it back costs SQLite about a fifth of a 57-row range read
#: (142 -> 115 us measured), more than any other column.
WINDOW_COLUMNS = MESSAGE_COLUMNS[1:]


def conversation(cid: str, *, for_update: bool = False) -> Select[Any]:
    """The conversation row; ``for_update`` locks it.

    (PostgreSQL; on SQLite the write transaction's BEGIN IMMEDIATE already holds the lock.)
    """
    stmt = select(conversations).where(C.id == cid)
    return stmt.with_for_update() if for_update else stmt


def totals() -> Select[Any]:
    """Conversations, messages and tokens of the whole database (administrative)."""
    stmt = select(func.count(), func.sum(C.last_seq - C.first_seq + 1), func.sum(C.token_count))
    return cast("Select[Any]", stmt)


def schema_revision() -> Select[Any]:
    """Memstore's migration revision (its own Alembic version table)."""
    version = table(VERSION_TABLE, column("version_num"))
    return select(version.c.version_num).limit(1)


def insert_conversation(values: dict[str, Any]) -> Insert:
    """Insert one conversation row."""
    return conversations.insert().values(**values)


_ALLOCATE: dict[str, Any] = {}


def _allocate_statement(dialect: str) -> Any:
    insert_fn = postgresql.insert if dialect == "postgresql" else sqlite.insert
    ins = insert_fn(conversations).values(
        id=bindparam("cid", type_=String()),
        created_at=bindparam("now", type_=conversations.c.created_at.type),
        updated_at=bindparam("now", type_=conversations.c.updated_at.type),
        # Constants are literals, not parameters: every parameter costs the driver an
        # adaptation per execution (the append's statement is run once per message).
        metadata=literal_column("'{}'"),
        epoch=bindparam("epoch", type_=BigInteger()),
        first_seq=literal_column("1"),
        last_seq=bindparam("count", type_=BigInteger()),
        token_count=bindparam("tokens", type_=BigInteger()),
        max_score=bindparam("max_score", type_=conversations.c.max_score.type),
    )
    excluded = ins.excluded
    return ins.on_conflict_do_update(
        index_elements=[C.id],
        set_={
            "last_seq": C.last_seq + excluded.last_seq,
            "token_count": C.token_count + excluded.token_count,
            "max_score": case((excluded.max_score > C.max_score, excluded.max_score),
                              else_=C.max_score),
            # A conversation from before migration 0002 (epoch 0) gets a real epoch on
            # its first write by this version; later appends keep it.
            "epoch": case((C.epoch == literal_column("0"), excluded.epoch), else_=C.epoch),
            "updated_at": case((excluded.last_seq > literal_column("0"), excluded.updated_at),
                               else_=C.updated_at),
        },
        # Seqs never pass MAX_SEQ: a conversation that is full (a snapshot loaded at the
        # top of the range) updates nothing and returns no row, so its caller refuses
        # the write with nothing changed (the one-statement append inserts nothing).
        where=C.last_seq + excluded.last_seq <= literal_column(str(MAX_SEQ)),
    ).returning(C.last_seq)


def allocate_seqs(
    dialect: str, cid: str, now: datetime, count: int, tokens: int, max_score: float
) -> tuple[Any, dict[str, Any]]:
    """Reserve ``count`` seqs in one statement; returns ``(statement, parameters)``.

    The statement returns no row when the seqs would pass `MAX_SEQ` (see
    `memstore._db.ops.allocated()`).

    ``INSERT ... ON CONFLICT (id) DO UPDATE SET last_seq = last_seq + count ...
    RETURNING last_seq``: creates the conversation on first use, and on PostgreSQL
    holds the conversation row lock until commit, so concurrent writers to one
    conversation queue up and seqs stay gap-free. With ``count=0`` it only takes
    the lock. The statement is built once per dialect (building a dialect upsert
    costs more than running it) and reused with new parameters.
    """
    stmt = _ALLOCATE.get(dialect)
    if stmt is None:
        stmt = _ALLOCATE[dialect] = _allocate_statement(dialect)
    return stmt, {"cid": cid, "now": now, "count": count, "tokens": tokens,
                  "max_score": max_score, "epoch": new_epoch()}


def new_epoch() -> int:
    """A fresh conversation epoch: a random positive 63-bit integer (fits BIGINT).

    Random rather than incremented, so a conversation deleted and created again
    never repeats an epoch a cache may still hold.
    """
    return secrets.randbits(63) | 1


def update_conversation(cid: str, **values: Any) -> Update:
    """Update fields of one conversation row."""
    return update(conversations).where(C.id == cid).values(**values)


def delete_conversation(cid: str) -> Delete:
    """Delete one conversation (its messages go by ON DELETE CASCADE and explicitly)."""
    return delete(conversations).where(C.id == cid)


def insert_messages() -> Insert:
    """Insert message rows (executed with a list of parameter dicts)."""
    return messages.insert()


def messages_range(
    cid: str | BindParameter[str],
    *,
    start: int | BindParameter[int] | None = None,
    stop: int | BindParameter[int] | None = None,
    limit: int | BindParameter[int] | None = None,
    newest_first: bool = False,
    columns: tuple[Any, ...] = MESSAGE_COLUMNS,
) -> Select[Any]:
    """Messages with ``start <= seq < stop`` over the ``(conversation_id, seq)`` key.

    Values may be bind parameters: the precompiled hot reads are built here too (with
    `WINDOW_COLUMNS`).
    """
    conds = [M.conversation_id == cid]
    if start is not None:
        conds.append(M.seq >= start)
    if stop is not None:
        conds.append(M.seq < stop)
    stmt = select(*columns).where(and_(*conds))
    stmt = stmt.order_by(M.seq.desc() if newest_first else M.seq)
    return stmt.limit(limit) if limit is not None else stmt


#: The partial index's predicate, spelled exactly as in the index: SQLite uses a partial
#: index only when the query repeats its WHERE term (``anchored = 1`` would not match).
#: (Untyped on purpose: a Boolean-typed column renders as ``anchored = 1`` on SQLite.)
ANCHORED: ColumnClause[Any] = literal_column("memstore_messages.anchored")




#: Client ids looked up per statement. SQLite binds each id as a variable (its limit is
#: 32,766, 999 on builds before 3.32); PostgreSQL binds one array per chunk.
ID_LOOKUP_CHUNK = 500


def messages_by_ids(dialect: str, cid: str, ids: list[str]) -> Select[Any]:
    """Messages with the given client ids (the idempotency lookup; at most a chunk of ids).

    On PostgreSQL every id is one probe of the unique ``(conversation_id, message_id)``
    index, whatever the planner's statistics say. ``message_id IN (...)`` left the plan
    to them, and with stale statistics (a conversation filled faster than autovacuum
    analyses it, or autovacuum off) the planner scanned the whole conversation and
    tested every row against the list: writing 1,000,000 messages with client ids in
    batches of 10,000 took 40 minutes, each batch slower than the last. A ``LATERAL``
    subquery with ``LIMIT 1`` cannot be flattened into a hash or merge join, so it stays
    a nested loop of index probes. SQLite's planner always probes the index for ``IN``.
    """
    if dialect != "postgresql":
        return select(*MESSAGE_COLUMNS).where(M.conversation_id == cid, M.message_id.in_(ids))
    wanted = func.unnest(bindparam("ids", ids, type_=postgresql.ARRAY(String()))
                         ).table_valued("id").render_derived(name="wanted")
    probe = (select(*MESSAGE_COLUMNS)
             .where(M.conversation_id == cid, M.message_id == wanted.c.id)
             .limit(1).lateral("probe"))
    return select(*probe.c).select_from(wanted).join(probe, literal(True))


def sum_tokens(cid: str, *, start: int | None = None, stop: int | None = None) -> Select[Any]:
    """``(count, sum(token_count))`` of messages in ``[start, stop)``."""
    conds = [M.conversation_id == cid]
    if start is not None:
        conds.append(M.seq >= start)
    if stop is not None:
        conds.append(M.seq < stop)
    return select(func.count(), func.coalesce(func.sum(M.token_count), literal(0))).where(
        and_(*conds)
    )


def delete_messages(cid: str, *, start: int | None = None, stop: int | None = None) -> Delete:
    """Delete messages with ``start <= seq < stop``."""
    conds = [M.conversation_id == cid]
    if start is not None:
        conds.append(M.seq >= start)
    if stop is not None:
        conds.append(M.seq < stop)
    return delete(messages).where(and_(*conds))


def update_message(cid: str, seq: int, **values: Any) -> Any:
    """Update one message and return its row."""
    return (
        update(messages)
        .where(M.conversation_id == cid, M.seq == seq)
        .values(**values)
        .returning(*MESSAGE_COLUMNS)
    )


# ---- summaries ---------------------------------------------------------------------------


def summaries_of(cid: str) -> Select[Any]:
    """Every summary of one conversation, oldest first."""
    return select(*SUMMARY_COLUMNS).where(S.conversation_id == cid).order_by(S.number)


def latest_summary(cid: str) -> Select[Any]:
    """The newest summary of one conversation (one row at most)."""
    return (select(*SUMMARY_COLUMNS).where(S.conversation_id == cid)
            .order_by(S.number.desc()).limit(1))


def insert_summaries() -> Insert:
    """Insert summary rows (executed with a list of parameter dicts)."""
    return summaries.insert()


def delete_summaries(cid: str, *, last_from: int | None = None) -> Delete:
    """Delete a conversation's summaries (only those with ``last_seq >= last_from``)."""
    stmt = delete(summaries).where(S.conversation_id == cid)
    return stmt.where(S.last_seq >= last_from) if last_from is not None else stmt


# ---- hot read statements, precompiled ---------------------------------------------------
#
# A window runs a handful of small SELECTs. SQLAlchemy's per-execution machinery costs
# more than the query itself here, so the window path compiles these builders once per
# dialect and runs the SQL text with ``exec_driver_sql`` (rows are decoded by
# ``memstore._db.ops``). The statements are still built here, once, from the schema.

@functools.cache
def _hot_statements() -> dict[str, Any]:
    cid: BindParameter[str] = bindparam("cid", type_=String())
    return {
        # The conversation row and its anchored messages in one statement (one row per
        # anchored message; one row with NULL message columns when there are none).
        "conversation": select(
            C.first_seq, C.last_seq, C.max_score, C.token_count, C.epoch, *WINDOW_COLUMNS
        ).select_from(
            conversations.outerjoin(messages, and_(M.conversation_id == C.id, ANCHORED))
        ).where(C.id == cid).order_by(M.seq),
        "conversation_page": _conversation_page(cid),
        "range": messages_range(
            cid, start=bindparam("start", type_=BigInteger),
            stop=bindparam("stop", type_=BigInteger), columns=WINDOW_COLUMNS,
        ),
        # The same range, outside a transaction: rows come back only while the
        # conversation's epoch is still the one the window started from (see
        # ``memstore._db.window.SQLHistory``). The subquery is uncorrelated: evaluated once.
        "range_checked": messages_range(
            cid, start=bindparam("start", type_=BigInteger),
            stop=bindparam("stop", type_=BigInteger), columns=WINDOW_COLUMNS,
        ).where(
            select(C.id).where(C.id == cid, C.epoch == bindparam("epoch", type_=BigInteger))
            .exists()
        ),
        # The newest summary ending at or before ``last`` (the window's snapshot of
        # last_seq), while the conversation's epoch is the window's: one row with NULL
        # summary columns when there is none, no row when the epoch moved. The number
        # is found by an uncorrelated subquery (evaluated once: a backward walk of the
        # primary key that stops at the first match, the newest summary as a rule),
        # then the row is joined by its key: no cost per older summary.
        "latest_summary": select(*SUMMARY_COLUMNS[1:]).select_from(
            conversations.outerjoin(summaries, and_(
                S.conversation_id == C.id,
                S.number == _latest_number(cid, bindparam("last", type_=BigInteger)),
            ))
        ).where(C.id == cid, C.epoch == bindparam("epoch", type_=BigInteger)),
    }


#: Rows of a prefetched first page: at most this many (``_viewparts.BUDGET_MAX_FIRST_PAGE``),
#: ``PAGE_WITHOUT_COUNTS`` when the conversation's token total is 0.
PAGE_MAX = 2048
PAGE_WITHOUT_COUNTS = 32
#: Columns before the message columns in a ``conversation_page`` row.
PAGE_HEAD_COLUMNS = 8


def _conversation_page(cid: BindParameter[str]) -> Any:
    """The conversation row, its anchored messages and its newest page: one statement.

    A budgeted window's first statement, one snapshot on both databases (one round
    trip on PostgreSQL). Rows are ``(first_seq, last_seq, max_score, token_count,
    epoch, page, part, *WINDOW_COLUMNS)``: ``part`` 0 for the conversation row with
    each anchored message (one row with NULL message columns when none is anchored),
    1 for each message of the page, in no particular order.

    The page is the newest ``page`` messages with a seq above ``known_last``:
    ``page`` estimates from the conversation's own counts how many messages a budget
    of ``budget`` tokens holds (``token_limit * message_count / token_count``, 20 %
    and 8 rows of slack, at most `PAGE_MAX`), as the view's first page does;
    ``known_last`` is ``cached_last`` while the conversation's epoch is still
    ``cached_epoch`` (those rows are in the row cache), else 0.
    """
    budget: BindParameter[float] = bindparam("budget", type_=Double())
    count = C.last_seq - C.first_seq + 1
    estimate = budget * 1.2 * count / C.token_count  # a float on both databases
    page = case(
        (C.token_count <= 0, PAGE_WITHOUT_COUNTS),
        (estimate >= PAGE_MAX - 8, PAGE_MAX),
        else_=func.cast(estimate, BigInteger) + 8,
    )
    known_last = case(
        (C.epoch == bindparam("cached_epoch", type_=BigInteger),
         bindparam("cached_last", type_=BigInteger)),
        else_=0,
    )
    conv = select(
        C.first_seq, C.last_seq, C.max_score, C.token_count, C.epoch,
        page.label("page"), known_last.label("known_last"),
    ).where(C.id == cid).cte("conv")
    head = select(
        conv.c.first_seq, conv.c.last_seq, conv.c.max_score, conv.c.token_count,
        conv.c.epoch, conv.c.page, literal_column("0").label("part"), *WINDOW_COLUMNS,
    ).select_from(conv.outerjoin(messages, and_(M.conversation_id == cid, ANCHORED)))
    newest = (
        select(*WINDOW_COLUMNS)
        .where(M.conversation_id == cid, M.seq > select(conv.c.known_last).scalar_subquery())
        .order_by(M.seq.desc())
        # No conversation: no page (SQLite refuses a NULL limit; PostgreSQL reads it as ALL).
        .limit(func.coalesce(select(conv.c.page).scalar_subquery(), 0))
        .subquery("newest")
    )
    tail = select(*(null() for _ in range(6)), literal_column("1"), *newest.c)
    return union_all(head, tail)


def _latest_number(cid: BindParameter[str], last: BindParameter[int]) -> Any:
    inner = summaries.alias("latest")
    return (
        select(inner.c.number)
        .where(inner.c.conversation_id == cid, inner.c.last_seq <= last)
        .order_by(inner.c.number.desc())
        .limit(1)
        .scalar_subquery()
    )


@functools.cache
def _write_statements(dialect: str) -> dict[str, Any]:
    """The append path's statements (run on the DBAPI cursor, see ``memstore._db.ops``)."""
    cols = list(messages.c)
    row = {c.name: bindparam(c.name, type_=c.type) for c in cols}
    out: dict[str, Any] = {
        "allocate": _allocate_statement(dialect),
        "insert": messages.insert().values(**row),
    }
    if dialect == "postgresql":
        # One statement: allocate the seq on the conversation row (creating it, taking
        # its row lock until the statement commits) and insert the message at it.
        alloc = _allocate_statement(dialect).cte("alloc")
        # The conversation id and the timestamp are the allocation's own parameters.
        shared = {"seq": alloc.c.last_seq,
                  "conversation_id": bindparam("cid", type_=M.conversation_id.type),
                  "created_at": bindparam("now", type_=M.created_at.type)}
        values = select(*[shared.get(c.name, row[c.name]) for c in cols])
        out["append_one"] = (
            postgresql.insert(messages)
            .from_select([c.name for c in cols], values.select_from(alloc))
            .returning(M.seq)
        )
    return out


class CompiledSQL:
    """One statement compiled for one dialect: its SQL text and how to order parameters.

    With ``process=True`` parameter values go through their SQLAlchemy types' bind
    processors (JSON serialisation, UTC timestamps...), as ``Connection.execute``
    would apply them: the write path sends Python values.
    """

    __slots__ = ("defaults", "getter", "positions", "processed", "processors", "sql", "steps")

    def __init__(self, statement: Any, dialect: Dialect, *, process: bool = False) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql: str = compiled.string
        self.processors: dict[str, Any] = {}
        if process:
            for name, bind in compiled.binds.items():
                proc = bind.type.dialect_impl(dialect).bind_processor(dialect)
                if proc is not None:
                    self.processors[name] = proc
        # literal binds the compiler added itself (e.g. SQLite's OFFSET 0)
        self.defaults: dict[str, Any] = {
            name: bind.value for name, bind in compiled.binds.items() if bind.value is not None
        }
        self.positions: tuple[str, ...] | None = (
            tuple(compiled.positiontup) if compiled.positional and compiled.positiontup
            else None
        )
        # Positional, each name bound once, no defaults (an INSERT's row): one step per
        # position, its processor looked up once here (see row_params).
        self.steps: tuple[tuple[str, Any], ...] | None = None
        #: For ``steps``: every position's value in one call, then the positions that
        #: have a processor.
        self.getter: Any = None
        self.processed: tuple[tuple[int, str, Any], ...] = ()
        if (self.positions is not None and not self.defaults
                and len(set(self.positions)) == len(self.positions)):
            self.steps = tuple((name, self.processors.get(name)) for name in self.positions)
            self.getter = operator.itemgetter(*self.positions)
            self.processed = tuple((i, name, proc) for i, (name, proc) in enumerate(self.steps)
                                   if proc is not None)

    def row_params(self, values: dict[str, Any], memo: dict[str, tuple[Any, Any]]) -> Any:
        """`params()` for one row of a batch (positional, every name in ``values``).

        ``memo`` carries processed values from one row to the next: a value that is the
        same object as the previous row's (the batch's one timestamp) is not processed
        again.
        """
        if self.steps is None:
            return self.params(values)
        return _row_values(self.getter, self.processed, values, memo)

    def params(self, values: dict[str, Any]) -> Any:
        """Parameters in the driver's paramstyle."""
        if self.processors:
            procs = self.processors
            if self.positions is not None:  # straight to the tuple (the write path)
                defaults = self.defaults
                out = []
                done: dict[str, Any] = {}  # a name bound twice (``now``) is processed once
                for name in self.positions:
                    v = values[name] if name in values else defaults[name]
                    p = procs.get(name)
                    if p is not None and v is not None:
                        if name not in done:
                            done[name] = p(v)
                        v = done[name]
                    out.append(v)
                return tuple(out)
            values = {k: (p(v) if (p := procs.get(k)) is not None and v is not None else v)
                      for k, v in values.items()}
        if self.positions is None:
            return {**self.defaults, **values} if self.defaults else values
        return tuple(
            values[name] if name in values else self.defaults[name] for name in self.positions
        )


def _row_values(getter: Any, processed: tuple[tuple[int, str, Any], ...],
                values: dict[str, Any], memo: dict[str, tuple[Any, Any]]) -> list[Any]:
    """A row's values in column order (``getter``), processed where they need it.

    The ``processed`` positions go through their bind processors; a value that is the
    same object as the previous row's (the batch's one timestamp) is taken from
    ``memo`` instead of being processed again.
    """
    out = list(getter(values))
    for i, name, proc in processed:
        v = out[i]
        if v is not None:
            seen = memo.get(name)
            if seen is not None and seen[0] is v:
                out[i] = seen[1]
            else:
                done = proc(v)
                memo[name] = (v, done)
                out[i] = done
    return out


class _MessageRows:
    """Message rows' values in ``memstore_messages``' column order.

    Processed as the INSERT's bind processors process them (JSON, UTC timestamps).
    """

    __slots__ = ("columns", "getter", "processed")

    def __init__(self, dialect: Dialect) -> None:
        names = tuple(c.name for c in messages.c)
        quote = dialect.identifier_preparer.quote
        #: ``memstore_messages (col, ...)``, quoted for ``dialect``
        self.columns = f"{quote(messages.name)} ({', '.join(quote(n) for n in names)})"
        processors = hot_write(dialect, "insert").processors
        self.getter = operator.itemgetter(*names)
        self.processed = tuple((i, name, processors[name]) for i, name in enumerate(names)
                               if name in processors)

    def row(self, values: dict[str, Any], memo: dict[str, tuple[Any, Any]]) -> list[Any]:
        """One message row's values, in column order."""
        return _row_values(self.getter, self.processed, values, memo)


class CopyMessages(_MessageRows):
    """``COPY memstore_messages (...) FROM STDIN`` (PostgreSQL): its SQL and its rows.

    A batch append's rows go to PostgreSQL as one COPY instead of an ``executemany``
    of INSERTs: the server parses one statement and takes a stream of rows (100 rows:
    4.3 against 6.9 ms, measured side by side).
    """

    __slots__ = ("sql",)

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        self.sql = f"COPY {self.columns} FROM STDIN"


class ValuesMessages(_MessageRows):
    """``INSERT INTO memstore_messages (...) VALUES (...), (...), ...`` (SQLite).

    A batch's rows go to SQLite as one multi-row INSERT per `rows_per_statement`
    rows instead of an ``executemany`` of one-row INSERTs. With the search index's
    trigger on the table, ``executemany`` pays the trigger program's setup once per
    row; one statement pays it once (100 messages: 0.7 against 3.2 ms, measured side
    by side on the same rows).
    """

    __slots__ = ("_sql", "row_sql", "width")

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        self.width = len(messages.c)
        self.row_sql = "(" + ", ".join("?" * self.width) + ")"
        self._sql: dict[int, str] = {}

    def rows_per_statement(self, variables: int) -> int:
        """Rows one statement may carry under a limit of ``variables`` bound values."""
        return max(1, min(variables // self.width, 500))

    def sql(self, rows: int) -> str:
        """The statement for ``rows`` rows (built once per row count)."""
        found = self._sql.get(rows)
        if found is None:
            found = self._sql[rows] = (f"INSERT INTO {self.columns} VALUES "
                                       + ", ".join([self.row_sql] * rows))
        return found

    def params(self, rows: list[dict[str, Any]], memo: dict[str, tuple[Any, Any]]) -> tuple[
            Any, ...]:
        """The rows' values, flat, in the statement's order."""
        out: list[Any] = []
        for values in rows:
            out.extend(self.row(values, memo))
        return tuple(out)


_ROWS: dict[tuple[str, str, type[_MessageRows]], _MessageRows] = {}


def _per_dialect(kind: type[_R], dialect: Dialect) -> _R:
    """The ``kind`` of ``dialect``, built once per dialect and driver."""
    key = (dialect.name, dialect.driver, kind)
    found = _ROWS.get(key)
    if found is None:
        found = _ROWS[key] = kind(dialect)
    return cast(_R, found)


def copy_messages(dialect: Dialect) -> CopyMessages:
    """The `CopyMessages` of ``dialect`` (built once per dialect and driver)."""
    return _per_dialect(CopyMessages, dialect)


def values_messages(dialect: Dialect) -> ValuesMessages:
    """The `ValuesMessages` of ``dialect`` (built once per dialect and driver)."""
    return _per_dialect(ValuesMessages, dialect)


_COMPILED: dict[tuple[str, str, str], CompiledSQL] = {}


def hot(dialect: Dialect, name: str) -> CompiledSQL:
    """A precompiled hot statement for ``dialect`` (compiled on first use, then reused)."""
    key = (dialect.name, dialect.driver, name)
    found = _COMPILED.get(key)
    if found is None:
        found = CompiledSQL(_hot_statements()[name], dialect)
        _COMPILED[key] = found
    return found


def precompile(dialect: Dialect) -> None:
    """Compile the window's and the append's statements for ``dialect`` now.

    Compiling costs more than running them (milliseconds each); a store does it when
    it opens, so the first window and the first append of a fresh process do not pay
    it. Idempotent (compiled once per dialect and driver per process).
    """
    for name in ("conversation", "conversation_page", "range", "range_checked"):
        hot(dialect, name)
    for name in _write_statements(dialect.name):
        hot_write(dialect, name)
    if dialect.name == "postgresql":
        copy_messages(dialect)


def hot_write(dialect: Dialect, name: str) -> CompiledSQL:
    """A precompiled write statement (``allocate``, ``insert``; PostgreSQL ``append_one``)."""
    key = (dialect.name, dialect.driver, "write:" + name)
    found = _COMPILED.get(key)
    if found is None:
        found = CompiledSQL(_write_statements(dialect.name)[name], dialect, process=True)
        _COMPILED[key] = found
    return found

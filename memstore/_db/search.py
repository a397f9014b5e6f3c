"""Full-text search: the index on both databases (its DDL, triggers and upkeep).

The index is kept in step with ``memstore_messages`` by triggers, in the transaction of
every write that adds, changes or removes messages (append, extend, rewrite, pop,
truncate, clear, delete, a state load, an import, and any write still to come), so no
write path carries code of its own for it:

* **SQLite**: ``fts_memstore_messages``, an FTS5 table (``unicode61``, diacritics
  removed; ``porter`` before it for ``english``) over the external content
  ``fts_memstore_messages_source``, a view computing each message's searchable text
  from its row. Its rowid is the message row's rowid. Ranked by ``bm25``.
* **PostgreSQL**: ``fts_memstore_messages``, one row per message keyed by
  ``(conversation_id, seq)`` holding its ``tsvector`` (GIN index) with the role and the
  time for filters. Statement-level triggers with transition tables fill it (one
  ``INSERT ... SELECT`` per statement, so a ``COPY`` of a batch is one more statement,
  not one per row); a row trigger follows updates of a message's content; a
  ``TRUNCATE`` empties it. Ranked by ``ts_rank_cd``.

The index's tables are named outside memstore's ``memstore_`` prefix on purpose:
Alembic's autogenerate compares only ``memstore_*`` tables (migrations/env.py), and
these are objects it cannot model (a virtual table and its shadow tables; a table a
trigger owns). Migration 0005 creates them; ``partitioned_ddl`` creates the
PostgreSQL table hash-partitioned like the others.

Search text and tokens are defined in `memstore.search` (pure Python); the SQL here
computes the same text from a stored row, and folds it as `memstore.search.fold()` does.
The queries are in ``memstore._db.search_query``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
)
from sqlalchemy.dialects.postgresql import TSVECTOR

from memstore._db.schema import UTCDateTime
from memstore._validate import short_repr
from memstore.errors import ConfigurationError
from memstore.search import (
    LANGUAGES,
    MAX_INDEXED_CHARS,
    REMOVED_MARKS,
    Language,
    bracket,
    separator_ranges,
)

__all__ = [
    "INDEX",
    "SOURCE",
    "averages",
    "create_index",
    "drop_index",
    "fts5_available",
    "has_secure_delete",
    "index_exists",
    "index_language",
    "postgresql_ddl",
    "sqlite_ddl",
]

log = logging.getLogger("memstore.search")

#: The index table (both databases) and SQLite's external-content view.
INDEX = "fts_memstore_messages"
SOURCE = "fts_memstore_messages_source"
#: SQLite: the index's vocabulary (an ``fts5vocab`` table: each token's document count).
VOCABULARY = "fts_memstore_messages_vocab"

# ---- SQLite ------------------------------------------------------------------------------


def _sqlite_text(row: str) -> str:
    """SQL computing `memstore.search.searchable_text()` from a message row (``row.*``).

    Plain messages (no parts, no tool calls) are their ``content_text``; the others go
    through SQLite's JSON functions (built in since 3.38, and in every FTS5 build
    memstore has met). A value that is not a JSON array contributes nothing.
    """
    def elements(column: str) -> str:
        return (f"json_each(CASE WHEN json_valid({row}.{column}) AND "
                f"json_type({row}.{column}) = 'array' THEN {row}.{column} END)")

    pieces = (
        f"SELECT {row}.content_text AS piece, 0 AS k, 0 AS i WHERE {row}.content_text "
        "IS NOT NULL "
        f"UNION ALL SELECT json_extract(p.value, '$.text'), 1, p.key FROM "
        f"{elements('content_parts')} AS p WHERE json_extract(p.value, '$.type') = 'text' "
        "AND json_type(p.value, '$.text') = 'text' "
        f"UNION ALL SELECT json_extract(c.value, '$.name'), 2, c.key * 2 FROM "
        f"{elements('tool_calls')} AS c WHERE json_type(c.value, '$.name') = 'text' "
        f"UNION ALL SELECT json_extract(c.value, '$.arguments'), 2, c.key * 2 + 1 FROM "
        f"{elements('tool_calls')} AS c WHERE json_type(c.value, '$.arguments') = 'text' "
        "ORDER BY 2, 3"
    )
    return (
        f"substr(CASE WHEN {row}.content_parts IS NULL AND {row}.tool_calls IS NULL THEN "
        f"{row}.content_text ELSE (SELECT group_concat(piece, char(10)) FROM ({pieces})) END, "
        f"1, {MAX_INDEXED_CHARS})"
    )


def _tokenizer(language: Language) -> str:
    base = "unicode61 remove_diacritics 2"
    return f"porter {base}" if language == "english" else base


#: A message with no parts and no tool calls: its searchable text is its ``content_text``.
_PLAIN = "{row}.content_parts IS NULL AND {row}.tool_calls IS NULL"


def sqlite_triggers(*, split: bool = True) -> list[str]:
    """SQLite's triggers keeping the index in step with ``memstore_messages``.

    Args:
        split: revision 0007's triggers: inserts and deletes of plain messages (no
            parts, no tool calls, most of them) index ``content_text`` directly, and a
            second trigger of each takes the others through the JSON functions.
            ``False`` gives revision 0005's (one trigger each, the expression for all).
    """
    def add(row: str, body: str) -> str:
        return f"INSERT INTO {INDEX}(rowid, body) VALUES ({row}.rowid, {body});"

    def remove(row: str, body: str) -> str:
        return f"INSERT INTO {INDEX}({INDEX}, rowid, body) VALUES ('delete', {row}.rowid, {body});"

    update = (f"CREATE TRIGGER memstore_search_update AFTER UPDATE OF content_text, "
              f"content_parts, tool_calls ON memstore_messages BEGIN "
              f"{remove('OLD', _sqlite_text('OLD'))} {add('NEW', _sqlite_text('NEW'))} END")
    if not split:
        return [
            f"CREATE TRIGGER memstore_search_insert AFTER INSERT ON memstore_messages "
            f"BEGIN {add('NEW', _sqlite_text('NEW'))} END",
            f"CREATE TRIGGER memstore_search_delete AFTER DELETE ON memstore_messages "
            f"BEGIN {remove('OLD', _sqlite_text('OLD'))} END",
            update,
        ]
    out = []
    for name, event, row, action in (("insert", "INSERT", "NEW", add),
                                     ("delete", "DELETE", "OLD", remove)):
        plain = _PLAIN.format(row=row)
        out.append(
            f"CREATE TRIGGER memstore_search_{name} AFTER {event} ON memstore_messages "
            f"WHEN {plain} BEGIN "
            f"{action(row, f'substr({row}.content_text, 1, {MAX_INDEXED_CHARS})')} END")
        out.append(
            f"CREATE TRIGGER memstore_search_{name}_parts AFTER {event} ON memstore_messages "
            f"WHEN NOT ({plain}) BEGIN {action(row, _sqlite_text(row))} END")
    out.append(update)
    return out


def sqlite_ddl(language: Language = "simple", *, split: bool = True) -> list[str]:
    """The statements creating SQLite's index (empty; `backfill` fills it).

    ``split``: see `sqlite_triggers` (``False``: revision 0005's triggers).
    """
    return [
        f"CREATE VIEW {SOURCE} (id, body) AS SELECT m.rowid, {_sqlite_text('m')} "
        "FROM memstore_messages AS m",
        f"CREATE VIRTUAL TABLE {INDEX} USING fts5(body, content='{SOURCE}', "
        f"content_rowid='id', tokenize='{_tokenizer(language)}')",
        # Document frequencies, for ranking a scoped search (`_bm25`).
        f"CREATE VIRTUAL TABLE {VOCABULARY} USING fts5vocab({INDEX}, 'row')",
        *sqlite_triggers(split=split),
    ]


#: Every trigger either revision created on SQLite.
SQLITE_DROP_TRIGGERS = [
    "DROP TRIGGER IF EXISTS memstore_search_insert",
    "DROP TRIGGER IF EXISTS memstore_search_insert_parts",
    "DROP TRIGGER IF EXISTS memstore_search_delete",
    "DROP TRIGGER IF EXISTS memstore_search_delete_parts",
    "DROP TRIGGER IF EXISTS memstore_search_update",
]


SQLITE_DROP = [
    *SQLITE_DROP_TRIGGERS,
    f"DROP TABLE IF EXISTS {VOCABULARY}",
    f"DROP TABLE IF EXISTS {INDEX}",
    f"DROP VIEW IF EXISTS {SOURCE}",
]


def fts5_available(conn: Connection) -> bool:
    """Whether this connection's SQLite has FTS5 (some Python builds leave it out)."""
    try:
        with conn.begin_nested():
            conn.exec_driver_sql("CREATE VIRTUAL TABLE temp.memstore_fts5_probe USING fts5(x)")
            conn.exec_driver_sql("DROP TABLE temp.memstore_fts5_probe")
    except Exception as exc:  # sqlite3.OperationalError: no such module: fts5
        if "fts5" not in str(exc).lower():
            raise
        return False
    return True


# ---- PostgreSQL --------------------------------------------------------------------------

_side_metadata = MetaData()

#: PostgreSQL's index table: one row per message (its key, role, time and tsvector).
side = Table(
    INDEX,
    _side_metadata,
    Column("conversation_id", String(255), nullable=False),
    Column("seq", BigInteger(), nullable=False),
    Column("role", String(16), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("document", TSVECTOR(), nullable=False),
    PrimaryKeyConstraint("conversation_id", "seq", name=f"pk_{INDEX}"),
)

_TEXT_FUNCTION = f"""CREATE FUNCTION memstore_search_text(content_text text, content_parts jsonb,
  tool_calls jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT left(CASE WHEN content_parts IS NULL AND tool_calls IS NULL THEN content_text
  ELSE concat_ws(E'\\n', content_text,
    (SELECT string_agg(p.value ->> 'text', E'\\n' ORDER BY p.i)
       FROM jsonb_array_elements(CASE WHEN jsonb_typeof(content_parts) = 'array'
                                      THEN content_parts END) WITH ORDINALITY AS p(value, i)
      WHERE p.value ->> 'type' = 'text' AND jsonb_typeof(p.value -> 'text') = 'string'),
    (SELECT string_agg(concat_ws(E'\\n', c.value ->> 'name', c.value ->> 'arguments'),
                       E'\\n' ORDER BY c.i)
       FROM jsonb_array_elements(CASE WHEN jsonb_typeof(tool_calls) = 'array'
                                      THEN tool_calls END) WITH ORDINALITY AS c(value, i)))
  END, {MAX_INDEXED_CHARS})
$$"""


def _fold_sql(value: str, utf8: bool) -> str:
    """SQL of `memstore.search.fold()` applied to ``value`` (a column: it is read twice).

    On a database whose encoding is not UTF-8 (no Unicode normalization there), only
    the ASCII separators are replaced. ASCII text skips the Unicode work.
    """
    ascii_class = bracket((a, min(b, 0x7F)) for a, b in separator_ranges() if a <= 0x7F)
    plain = f"regexp_replace({value}, E'[{_sql_escape(ascii_class)}]+', ' ', 'g')"
    if not utf8:
        return plain
    marks = bracket((ord(m), ord(m)) for m in REMOVED_MARKS)
    separators = bracket(separator_ranges())
    return (
        f"CASE WHEN {value} ~ E'[^\\\\u0001-\\\\u007f]' THEN regexp_replace(translate("
        f"regexp_replace(normalize({value}, NFD), E'[{_sql_escape(marks)}]+', '', 'g'), "
        f"E'\\u017f', 's'), E'[{_sql_escape(separators)}]+', ' ', 'g') ELSE {plain} END"
    )


def _sql_escape(pattern: str) -> str:
    """A regular expression as the inside of an ``E'...'`` literal."""
    return pattern.replace("\\", "\\\\").replace("'", "''")


def check_language(language: object, name: str = "search language",
                   error: type[Exception] = ConfigurationError) -> Language:
    """``language`` as a `Language`, or ``error`` naming ``name`` and the choices."""
    if language not in LANGUAGES:
        raise error(f"{name} must be one of {', '.join(LANGUAGES)}, got {short_repr(language)}")
    return "english" if language == "english" else "simple"


def _pg_functions(language: Language, utf8: bool) -> list[str]:
    config = "english" if language == "english" else "simple"
    return [
        _TEXT_FUNCTION,
        "CREATE FUNCTION memstore_search_fold(t text) RETURNS text LANGUAGE sql IMMUTABLE "
        f"PARALLEL SAFE AS $$ SELECT {_fold_sql('t', utf8)} $$",
        "CREATE FUNCTION memstore_search_config() RETURNS regconfig LANGUAGE sql IMMUTABLE "
        f"PARALLEL SAFE AS $$ SELECT '{config}'::regconfig $$",
    ]


def document_select(source: str) -> str:
    """``SELECT`` of the index rows of the message rows ``source`` (aliased ``n``).

    The document is computed inline (no function call for a plain message): the
    triggers' plans are cached per session, so a message costs its parse and no more.
    """
    text_ = (
        f"coalesce(CASE WHEN n.content_parts IS NULL AND n.tool_calls IS NULL THEN "
        f"left(n.content_text, {MAX_INDEXED_CHARS}) ELSE memstore_search_text(n.content_text, "
        "n.content_parts, n.tool_calls) END, '')"
    )
    # memstore_search_fold of a column is inlined by the planner (same plan as the
    # expression written out), and an error's context stays short.
    return (
        "SELECT n.conversation_id, n.seq, n.role, n.created_at, "
        "to_tsvector(memstore_search_config(), memstore_search_fold(x.t)) "
        f"FROM {source} CROSS JOIN LATERAL (SELECT {text_} AS t) AS x"
    )


def _upsert(source: str) -> str:
    return (
        f"INSERT INTO {INDEX} (conversation_id, seq, role, created_at, document) "
        f"{document_select(source)} "
        "ON CONFLICT (conversation_id, seq) DO UPDATE SET role = EXCLUDED.role, "
        "created_at = EXCLUDED.created_at, document = EXCLUDED.document"
    )


#: PostgreSQL: while this setting is ``on`` (transaction-local), inserted messages are
#: not indexed by the insert trigger: a fork copies the source's index rows instead
#: (`copy_index_rows`), so nothing is parsed twice.
COPYING = "memstore.search_copying"


def insert_function(*, copies: bool = True) -> str:
    """``CREATE OR REPLACE`` of the insert trigger's function.

    Args:
        copies: whether it skips rows inserted while `COPYING` is on (migration 0007;
            ``False`` gives 0005's function, for 0007's downgrade).
    """
    upsert = f"{_upsert('memstore_search_new AS n')};"
    if copies:
        upsert = (f"IF coalesce(current_setting('{COPYING}', true), '') <> 'on' THEN "
                  f"{upsert} END IF;")
    return ("CREATE OR REPLACE FUNCTION memstore_search_insert() RETURNS trigger "
            f"LANGUAGE plpgsql AS $$ BEGIN {upsert} RETURN NULL; END $$")


def copying(conn: Connection, on: bool) -> None:
    """Switch `COPYING` for the rest of the transaction (PostgreSQL)."""
    conn.exec_driver_sql(f"SELECT set_config('{COPYING}', %(on)s, true)",
                         {"on": "on" if on else "off"})


def copy_index_rows(conn: Connection, source: str, target: str, last: int) -> None:
    """Copy ``source``'s index rows up to seq ``last`` to ``target`` (PostgreSQL).

    For a fork, whose messages were inserted while `COPYING` was on: the documents
    are copied as stored, not parsed again.
    """
    conn.exec_driver_sql(
        f"INSERT INTO {INDEX} (conversation_id, seq, role, created_at, document) "
        f"SELECT %(target)s, seq, role, created_at, document FROM {INDEX} "
        "WHERE conversation_id = %(source)s AND seq <= %(last)s",
        {"target": target, "source": source, "last": last})


def _pg_triggers(copies: bool = True) -> list[str]:
    return [
        insert_function(copies=copies),
        "CREATE FUNCTION memstore_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN DELETE FROM {INDEX} AS s USING memstore_search_old AS o "
        "WHERE s.conversation_id = o.conversation_id AND s.seq = o.seq; RETURN NULL; END $$",
        "CREATE FUNCTION memstore_search_update() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN IF OLD.conversation_id IS DISTINCT FROM NEW.conversation_id OR OLD.seq IS "
        f"DISTINCT FROM NEW.seq THEN DELETE FROM {INDEX} WHERE conversation_id = "
        "OLD.conversation_id AND seq = OLD.seq; END IF; "
        f"{_upsert('(SELECT NEW.*) AS n')}; RETURN NULL; END $$",
        "CREATE FUNCTION memstore_search_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN TRUNCATE {INDEX}; RETURN NULL; END $$",
        "CREATE TRIGGER memstore_search_insert AFTER INSERT ON memstore_messages "
        "REFERENCING NEW TABLE AS memstore_search_new FOR EACH STATEMENT "
        "EXECUTE FUNCTION memstore_search_insert()",
        "CREATE TRIGGER memstore_search_delete AFTER DELETE ON memstore_messages "
        "REFERENCING OLD TABLE AS memstore_search_old FOR EACH STATEMENT "
        "EXECUTE FUNCTION memstore_search_delete()",
        "CREATE TRIGGER memstore_search_update AFTER UPDATE OF conversation_id, seq, role, "
        "content_text, content_parts, tool_calls, created_at ON memstore_messages FOR EACH ROW "
        "EXECUTE FUNCTION memstore_search_update()",
        "CREATE TRIGGER memstore_search_truncate AFTER TRUNCATE ON memstore_messages "
        "FOR EACH STATEMENT EXECUTE FUNCTION memstore_search_truncate()",
    ]


PG_INDEX = f"CREATE INDEX ix_{INDEX}_document ON {INDEX} USING gin (document)"


def postgresql_ddl(language: Language = "simple", *, utf8: bool = True,
                   partitions: int | None = None, index: bool = True,
                   copies: bool = True) -> list[str]:
    """The statements creating PostgreSQL's index (empty; `backfill` fills it).

    Args:
        language: ``"simple"`` or ``"english"``.
        utf8: the database's encoding is UTF-8 (Unicode folding; see `_fold_sql`).
        partitions: hash-partition the table by conversation id into this many
            partitions named ``fts_memstore_messages_p<i>`` (the partitioned layout).
        index: include the GIN index (a backfill creates it after filling the table).
        copies: the insert trigger skips rows a fork copies (revision 0007's; ``False``
            gives revision 0005's trigger).
    """
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateTable

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    table = side.to_metadata(MetaData())
    if partitions is not None:
        table.dialect_options["postgresql"]["partition_by"] = "HASH (conversation_id)"
    statements = _pg_functions(check_language(language), utf8)
    statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
    if partitions is not None:
        statements.extend(
            f"CREATE TABLE {INDEX}_p{i} PARTITION OF {INDEX} "
            f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {i})" for i in range(partitions))
    if index:
        statements.append(PG_INDEX)
    statements.extend(_pg_triggers(copies))
    return statements


POSTGRESQL_DROP = [
    "DROP TRIGGER IF EXISTS memstore_search_insert ON memstore_messages",
    "DROP TRIGGER IF EXISTS memstore_search_delete ON memstore_messages",
    "DROP TRIGGER IF EXISTS memstore_search_update ON memstore_messages",
    "DROP TRIGGER IF EXISTS memstore_search_truncate ON memstore_messages",
    f"DROP TABLE IF EXISTS {INDEX}",
    "DROP FUNCTION IF EXISTS memstore_search_insert()",
    "DROP FUNCTION IF EXISTS memstore_search_delete()",
    "DROP FUNCTION IF EXISTS memstore_search_update()",
    "DROP FUNCTION IF EXISTS memstore_search_truncate()",
    "DROP FUNCTION IF EXISTS memstore_search_config()",
    "DROP FUNCTION IF EXISTS memstore_search_fold(text)",
    "DROP FUNCTION IF EXISTS memstore_search_text(text, jsonb, jsonb)",
]


# ---- creating, filling and dropping the index ------------------------------------------------

#: Messages indexed per statement when an existing database is indexed (bounded memory).
BACKFILL_BATCH = 10_000
#: The environment variable naming the text-search configuration a new index gets.
LANGUAGE_VARIABLE = "MEMSTORE_SEARCH_LANGUAGE"

#: ``progress(done, total)``: called after each batch of a backfill.
Progress = Callable[[int, int], object]


#: The language a migration run in this context gives a new index
#: (``migrate.upgrade(..., search_language=...)``; see `language_for_new_index`).
_CHOSEN: ContextVar[str | None] = ContextVar("memstore_search_language", default=None)


def configured_language(language: str | None = None) -> Language:
    """The configuration a new index gets.

    ``language``, else the one a migration was given (`language_for_new_index`),
    else ``$MEMSTORE_SEARCH_LANGUAGE``, else ``"simple"``.
    """
    import os

    chosen = language if language is not None else _CHOSEN.get()
    if chosen is None:
        chosen = os.environ.get(LANGUAGE_VARIABLE, "").strip() or "simple"
    return check_language(chosen)


@contextlib.contextmanager
def language_for_new_index(language: str | None) -> Iterator[None]:
    """Within the block, an index created by a migration gets ``language`` (if given)."""
    token = _CHOSEN.set(language)
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def terminal_progress(stream: Any = None) -> Progress | None:
    """A `Progress` that redraws one line on a terminal (``None`` when not a terminal)."""
    out = stream if stream is not None else sys.stderr
    if not getattr(out, "isatty", lambda: False)():
        return None

    def show(done: int, total: int) -> None:
        share = 100 if total <= 0 else min(100, done * 100 // total)
        out.write(f"\rmemstore: indexing messages for search: {done:,} of {total:,} "
                  f"({share}%)" + ("\n" if done >= total else ""))
        out.flush()

    return show


def index_exists(conn: Connection) -> bool:
    """Whether the database holds the search index."""
    if conn.dialect.name == "sqlite":
        found = conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (INDEX,)).first()
    else:
        found = conn.exec_driver_sql("SELECT to_regclass(%(name)s)", {"name": INDEX}).scalar()
    return bool(found)


def _partitions(conn: Connection) -> int | None:
    """The hash partitions of ``memstore_messages`` (``None``: not partitioned)."""
    kind = conn.exec_driver_sql(
        "SELECT c.relkind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
        "AND c.relname = 'memstore_messages'").scalar()
    if kind != "p":
        return None
    count = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_catalog.pg_inherits "
        "WHERE inhparent = 'memstore_messages'::regclass").scalar()
    return int(count or 1)


def create_index(conn: Connection, language: str | None = None, *,
                 progress: Progress | None = None, current: bool = True) -> bool:
    """Create the search index and fill it from the stored messages (one transaction).

    Runs inside the caller's transaction (migration 0005, a rebuild). Messages are
    indexed `BACKFILL_BATCH` at a time, so memory stays bounded however many there
    are; ``progress`` hears of each batch. On PostgreSQL the triggers are created
    first: their lock holds other writers of ``memstore_messages`` until the
    transaction commits, so no message escapes the index.

    ``current=False`` creates the triggers as revision 0005 did (revision 0007 splits
    SQLite's by the kind of message and makes PostgreSQL's insert trigger skip the
    rows a fork copies with their index rows).

    Returns:
        ``False`` when nothing was created: SQLite without FTS5 (search then says so).
    """
    chosen = configured_language(language)
    if conn.dialect.name == "sqlite":
        if not fts5_available(conn):
            log.warning("this Python's sqlite3 (SQLite %s) has no FTS5: the search index "
                        "was not created (search will say how to create it)",
                        _sqlite_version(conn))
            return False
        for statement in sqlite_ddl(chosen, split=current):
            conn.exec_driver_sql(statement)
        _backfill(conn, progress)
        return True
    utf8 = str(conn.exec_driver_sql("SHOW server_encoding").scalar()).upper() in ("UTF8", "UTF-8")
    for statement in postgresql_ddl(chosen, utf8=utf8, partitions=_partitions(conn),
                                    index=False, copies=current):
        conn.exec_driver_sql(statement)
    _backfill(conn, progress)
    conn.exec_driver_sql(PG_INDEX)  # built once, after the rows: faster than row by row
    conn.exec_driver_sql(f"ANALYZE {INDEX}")
    return True


def drop_index(conn: Connection) -> None:
    """Remove the search index, its triggers and functions (what migration 0005 created).

    On a SQLite older than 3.42, an index that a newer one deleted from in place
    (`memstore._db.erasure`) cannot even be dropped as it is: its format number is set back
    first (the index goes, so nothing reads it in that format).
    """
    sqlite = conn.dialect.name == "sqlite"
    if sqlite and not has_secure_delete(conn) and index_exists(conn):
        try:
            conn.exec_driver_sql(f"UPDATE {INDEX}_config SET v = {_FORMAT} WHERE k = "
                                 f"'version' AND v = {_FORMAT_SECURE_DELETE}")
        except Exception as exc:  # e.g. SQLITE_DBCONFIG_DEFENSIVE: shadow tables read-only
            raise ConfigurationError(
                f"cannot reset the search index's format to drop it ({exc}): rebuild it "
                "under a Python whose SQLite is 3.42 or newer, or on a connection without "
                "SQLITE_DBCONFIG_DEFENSIVE") from exc
    for statement in SQLITE_DROP if sqlite else POSTGRESQL_DROP:
        conn.exec_driver_sql(statement)


#: The first SQLite whose FTS5 takes ``'secure-delete'``.
SECURE_DELETE_SINCE = (3, 42, 0)
#: FTS5's index format numbers: the usual one, and the one an index gets once rows
#: were deleted from it in place (SQLite before 3.42 refuses to use such an index).
_FORMAT, _FORMAT_SECURE_DELETE = 4, 5


def has_secure_delete(conn: Connection) -> bool:
    """Whether this connection's SQLite has FTS5's ``'secure-delete'`` (3.42 or newer)."""
    version = tuple(int(part) for part in _sqlite_version(conn).split(".")[:3])
    return version >= SECURE_DELETE_SINCE


def averages(block: Any) -> tuple[int, int]:
    """FTS5's averages record: (rows indexed, tokens indexed)."""
    if not block:
        return 0, 0
    values: list[int] = []
    data, i = bytes(block), 0
    while i < len(data) and len(values) < 2:
        value, i = _varint(data, i)
        values.append(value)
    values += [0, 0]
    return values[0], values[1]


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """SQLite's variable-length integer at ``data[i:]``: (value, next index)."""
    value = 0
    for n in range(9):
        byte = data[i + n]
        if n == 8:
            return (value << 8) | byte, i + 9
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i + n + 1
    return value, i + 9  # pragma: no cover - the loop returns


def stored_messages(conn: Connection) -> int:
    """How many messages the database stores (what a rebuilt index holds)."""
    return int(conn.exec_driver_sql("SELECT count(*) FROM memstore_messages").scalar() or 0)


def rebuild_index(conn: Connection, language: str | None = None, *,
                  progress: Progress | None = None) -> bool:
    """Drop the index and create it again from the stored messages (a repair).

    ``language``: the configuration of the new index (default: the current one, else
    ``$MEMSTORE_SEARCH_LANGUAGE``, else ``"simple"``).
    """
    if language is None and index_exists(conn):
        language = index_language(conn)
    drop_index(conn)
    return create_index(conn, language, progress=progress)


def backfill_sql(where: str = "") -> str:
    """PostgreSQL: index the stored messages (``where``: a condition on them), as new rows."""
    source = f"(SELECT * FROM memstore_messages{where}) AS n"
    return (f"INSERT INTO {INDEX} (conversation_id, seq, role, created_at, document) "
            f"{document_select(source)} ON CONFLICT DO NOTHING")


def _backfill(conn: Connection, progress: Progress | None) -> None:
    """Index every stored message, in keyset batches of `BACKFILL_BATCH`."""
    total = int(conn.exec_driver_sql("SELECT count(*) FROM memstore_messages").scalar() or 0)
    if total == 0:
        return
    done = 0
    if conn.dialect.name == "sqlite":
        after = 0
        while True:
            bound = conn.exec_driver_sql(
                "SELECT rowid FROM memstore_messages WHERE rowid > ? ORDER BY rowid "
                f"LIMIT 1 OFFSET {BACKFILL_BATCH - 1}", (after,)).scalar()
            upper = "" if bound is None else f" AND id <= {int(bound)}"
            done += conn.exec_driver_sql(
                f"INSERT INTO {INDEX}(rowid, body) SELECT id, body FROM {SOURCE} "
                f"WHERE id > ?{upper}", (after,)).rowcount
            if progress is not None:
                progress(min(done, total) if bound is not None else total, total)
            if bound is None:
                return
            after = int(bound)
    key: tuple[str, int] | None = None
    while True:
        since = "" if key is None else "WHERE (conversation_id, seq) > (%(cid)s, %(seq)s) "
        params = {} if key is None else {"cid": key[0], "seq": key[1]}
        bound = conn.exec_driver_sql(
            f"SELECT conversation_id, seq FROM memstore_messages {since}"
            f"ORDER BY conversation_id, seq OFFSET {BACKFILL_BATCH - 1} LIMIT 1", params).first()
        conditions = [] if key is None else ["(conversation_id, seq) > (%(cid)s, %(seq)s)"]
        if bound is not None:
            conditions.append("(conversation_id, seq) <= (%(to_cid)s, %(to_seq)s)")
            params.update(to_cid=bound[0], to_seq=int(bound[1]))
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        done += conn.exec_driver_sql(backfill_sql(where), params).rowcount
        if progress is not None:
            progress(min(done, total) if bound is not None else total, total)
        if bound is None:
            return
        key = (str(bound[0]), int(bound[1]))


def _sqlite_version(conn: Connection) -> str:
    return str(conn.exec_driver_sql("SELECT sqlite_version()").scalar())


def index_language(conn: Connection) -> Language:
    """The configuration of the database's index (``"simple"`` or ``"english"``).

    Raises:
        MissingDependencyError: SQLite without the index, because this Python's sqlite3
            has no FTS5.
        ConfigurationError: the index is missing for another reason.
    """
    if conn.dialect.name == "sqlite":
        sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (INDEX,)).scalar()
        if sql is None:
            raise missing_index(conn)
        return "english" if "porter" in str(sql) else "simple"
    config = conn.exec_driver_sql(
        "SELECT CASE WHEN to_regprocedure('memstore_search_config()') IS NOT NULL "
        "THEN 1 END").scalar()
    if config is None:
        raise missing_index(conn)
    name = conn.exec_driver_sql("SELECT memstore_search_config()::text").scalar()
    return "english" if name == "english" else "simple"


_REBUILD = "`memstore search --rebuild-index --url <database url>`"


def missing_index(conn: Connection) -> Exception:
    from memstore.errors import MissingDependencyError

    if conn.dialect.name == "sqlite" and not fts5_available(conn):
        return MissingDependencyError(
            f"search needs SQLite's FTS5 extension, and this Python's sqlite3 (SQLite "
            f"{_sqlite_version(conn)}) was built without it, so the database has no search "
            "index. Fix: run memstore under a Python whose sqlite3 includes FTS5 (the "
            "python.org, Homebrew, conda and Linux distributions' builds do), then create "
            f"the index once with {_REBUILD}")
    return ConfigurationError(
        f"this database has no search index (it was upgraded by a Python whose sqlite3 "
        f"lacked FTS5, or the index was dropped): create it with {_REBUILD}")

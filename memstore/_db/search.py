"""Full-text search: the index's DDL on both databases, and the search itself.

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
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import TSVECTOR
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from memstore._db.filters import conversation_filter
from memstore._db.rows import decode_raw, fetch_raw, to_stored
from memstore._db.schema import UTCDateTime, messages
from memstore._db.statements import MESSAGE_COLUMNS
from memstore.errors import ConfigurationError
from memstore.models import StoredMessage
from memstore.search import (
    LANGUAGES,
    MAX_INDEXED_CHARS,
    REMOVED_MARKS,
    Language,
    SearchHit,
    SearchRequest,
    bracket,
    searchable_text,
    separator_ranges,
)

__all__ = [
    "INDEX",
    "create_index",
    "drop_index",
    "fts5_available",
    "index_language",
    "postgresql_ddl",
    "purge_deleted",
    "search",
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


def _check_language(language: str) -> Language:
    if language not in LANGUAGES:
        raise ConfigurationError(
            f"search language must be one of {', '.join(LANGUAGES)}, got {language!r}")
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
    statements = _pg_functions(_check_language(language), utf8)
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
Progress = Callable[[int, int], None]


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
    return _check_language(chosen)


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
    """Remove the search index, its triggers and functions (what migration 0005 created)."""
    for statement in SQLITE_DROP if conn.dialect.name == "sqlite" else POSTGRESQL_DROP:
        conn.exec_driver_sql(statement)


def stored_messages(conn: Connection) -> int:
    """How many messages the database stores (what a rebuilt index holds)."""
    return int(conn.exec_driver_sql("SELECT count(*) FROM memstore_messages").scalar() or 0)


def purge_deleted(conn: Connection) -> None:
    """Rewrite SQLite's index without what deleted messages left in it (for ``forget``).

    FTS5 removes a deleted message from its index with a marker in a newer segment; the
    older segment still holds the message's words until segments are merged. This
    merges them all now (``'optimize'``: it rewrites the whole index, seconds per
    million messages). PostgreSQL's index rows are deleted with the messages (``VACUUM``
    reclaims their space): nothing to do there.
    """
    if conn.dialect.name == "sqlite" and index_exists(conn):
        conn.exec_driver_sql(f"INSERT INTO {INDEX}({INDEX}) VALUES ('optimize')")


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
            raise _missing_index(conn)
        return "english" if "porter" in str(sql) else "simple"
    config = conn.exec_driver_sql(
        "SELECT CASE WHEN to_regprocedure('memstore_search_config()') IS NOT NULL "
        "THEN 1 END").scalar()
    if config is None:
        raise _missing_index(conn)
    name = conn.exec_driver_sql("SELECT memstore_search_config()::text").scalar()
    return "english" if name == "english" else "simple"


_REBUILD = "`memstore search --rebuild-index --url <database url>`"


def _missing_index(conn: Connection) -> Exception:
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


# ---- searching ---------------------------------------------------------------------------

#: SQLite: a search scoped to conversations holding at most this many messages walks
#: them (one FTS5 lookup per message) instead of the whole index's matches; its hits are
#: ranked here, by the BM25 FTS5 computes (the same formula, over the same statistics).
SCOPED_ROWS = 5_000
#: ... when the index walk would be longer: a lookup per message costs about as much as
#: walking this many postings of the query's rarest word (measured on 1,000,000
#: messages: a lookup 60-100 µs, a posting about 0.2 µs).
SCOPED_WALK = 400
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
        return _missing_index(conn)
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
        # One conversation: where its messages lie close together in the table (rowids
        # within SCOPED_WALK times its size), the index's matches in that rowid range
        # are a walk no longer than the lookups of the scoped path: no statistics needed.
        ((low, high, size),) = fetch_raw(conn, _SQLITE_SPAN, (ids[0],))
        if not size:
            return [], False
        if high - low < SCOPED_WALK * size:
            rows = fetch_raw(conn, _SQLITE_IN_SPAN, (fts5, low, high, ids[0], request.limit))
            return ([(decode_raw(r[:_WIDTH], "sqlite", r[_WIDTH]), -float(r[_WIDTH + 1]))
                     for r in rows], bool(rows and rows[0][-1]))
    if ids is not None:
        stats = _sqlite_stats(conn, ids, sorted(request.query.keys))
        if stats.scope <= SCOPED_ROWS and (stats.stemmed or _postings(request, stats)
                                           > SCOPED_WALK * stats.scope):
            return _sqlite_scoped(conn, request, stats)
    if _simple(request):
        if ids is None:
            rows = fetch_raw(conn, _SQLITE_ALL, (fts5, request.limit))
        else:
            rows = fetch_raw(conn, _SQLITE_IN_ONE, (fts5, ids[0], request.limit))
        return ([(decode_raw(r[:_WIDTH], "sqlite", r[_WIDTH]), -float(r[_WIDTH + 1]))
                 for r in rows], bool(rows and rows[0][-1]))
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


#: SQLite: the matches of the whole index, filtered to one conversation (when the
#: query's words are rarer than the conversation's messages are many).
_SQLITE_IN_ONE = (
    f"SELECT {_columns('m')}, t.rank, {_SQLITE_STEMS} FROM (SELECT {INDEX}.rowid AS rid, "
    f"{INDEX}.rank AS rank FROM {INDEX} JOIN memstore_messages AS c ON c.rowid = {INDEX}.rowid "
    f"WHERE {INDEX} MATCH ? AND c.conversation_id = ? ORDER BY {INDEX}.rank, {INDEX}.rowid "
    "DESC LIMIT ?) AS t JOIN memstore_messages AS m ON m.rowid = t.rid ORDER BY t.rank, "
    "t.rid DESC"
)


#: SQLite: where one conversation's messages lie in the table, and how many there are.
_SQLITE_SPAN = ("SELECT min(rowid), max(rowid), count(*) FROM memstore_messages "
                "WHERE conversation_id = ?")

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
            stats.rows, stats.tokens = _averages(value)
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


def _averages(block: Any) -> tuple[int, int]:
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

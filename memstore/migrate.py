"""Programmatic schema migrations: memstore's packaged Alembic revisions.

The revisions live in ``migrations/`` in the repository and ship inside the
wheel as ``memstore/_migrations``, so an installed package migrates without the
checkout and without an ``alembic.ini``::

    from memstore import migrate
    migrate.upgrade("postgresql+psycopg://user@host/db")
    migrate.check(engine)            # raises SchemaOutOfDateError when behind

The same functions back ``memstore db upgrade|downgrade|current|check``.
memstore records its revision in its own table (``memstore_alembic_version``),
so it coexists with a host application's Alembic history in one database.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from memstore._engine import make_engine, write_options
from memstore.errors import (
    ConfigurationError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    translate_db_errors,
)
from memstore.schema import VERSION_TABLE

__all__ = [
    "check",
    "create_partitioned",
    "current",
    "downgrade",
    "heads",
    "is_current",
    "partitioned_ddl",
    "script_location",
    "upgrade",
]

Bind = Engine | Connection | str

# Arbitrary constant key for pg_advisory_xact_lock: one migrator at a time per database.
_PG_LOCK_KEY = 0x6D656D73  # "mems"

UPGRADE_HINT = "memstore db upgrade --url <database url>"


def script_location() -> str:
    """Directory holding memstore's Alembic environment and revisions.

    The installed wheel carries them as ``memstore/_migrations``; an editable or
    source checkout uses ``<repo>/migrations``.
    """
    packaged = resources.files("memstore") / "_migrations"
    if packaged.is_dir() and (packaged / "env.py").is_file():
        return str(packaged)
    checkout = Path(__file__).resolve().parent.parent / "migrations"
    if (checkout / "env.py").is_file():
        return str(checkout)
    raise ConfigurationError(
        "memstore's migration scripts are missing: neither memstore/_migrations nor "
        "the checkout's migrations/ directory exists (reinstall memstore)"
    )


def _config(connection: Connection | None = None, *, output: TextIO | None = None) -> Config:
    cfg = Config(output_buffer=output) if output is not None else Config()
    cfg.set_main_option("script_location", script_location())
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def heads() -> tuple[str, ...]:
    """The head revision(s) of memstore's migration scripts (exactly one)."""
    return tuple(ScriptDirectory.from_config(_config()).get_heads())


_KNOWN: frozenset[str] | None = None


def known_revisions() -> frozenset[str]:
    """Every revision id of memstore's migration scripts."""
    global _KNOWN
    if _KNOWN is None:
        script = ScriptDirectory.from_config(_config())
        _KNOWN = frozenset(s.revision for s in script.walk_revisions())
    return _KNOWN


def refuse_newer(at: tuple[str, ...]) -> None:
    """Raise :class:`SchemaTooNewError` for a revision this memstore does not know.

    Such a revision was written by a newer memstore: this one must not write there.
    """
    unknown = [r for r in at if r not in known_revisions()]
    if unknown:
        raise SchemaTooNewError(", ".join(unknown))


@contextmanager
def _connection(bind: Bind, *, write: bool) -> Iterator[Connection]:
    """A connection inside a transaction; writers take the migration lock."""
    if isinstance(bind, Connection):
        if write:
            _take_lock(bind)
        yield bind
        return
    engine = make_engine(bind) if isinstance(bind, str) else bind
    try:
        with translate_db_errors(), engine.connect() as conn:
            if write:
                conn.execution_options(**write_options())
            with conn.begin():
                if write:
                    _take_lock(conn)
                yield conn
    finally:
        if isinstance(bind, str):
            engine.dispose()


def _take_lock(conn: Connection) -> None:
    # SQLite: the write transaction is BEGIN IMMEDIATE, which already excludes other writers.
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})


def current(bind: Bind) -> tuple[str, ...]:
    """The revision(s) the database is at (empty when memstore's tables were never created)."""
    with _connection(bind, write=False) as conn:
        return _current(conn)


def _current(conn: Connection) -> tuple[str, ...]:
    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return tuple(ctx.get_current_heads())


def is_current(bind: Bind) -> bool:
    """Whether the database schema is at memstore's head revision."""
    with _connection(bind, write=False) as conn:
        return set(_current(conn)) == set(heads())


def check(bind: Bind) -> None:
    """Raise :class:`SchemaOutOfDateError` unless the schema is at memstore's head.

    The error names the command that fixes it. A database migrated by a newer
    memstore (a revision this one does not know) raises :class:`SchemaTooNewError`.
    """
    with _connection(bind, write=False) as conn:
        check_connection(conn)


def check_connection(conn: Connection) -> None:
    """:func:`check` on an open connection (used by the stores)."""
    at = _current(conn)
    refuse_newer(at)
    want = heads()
    if set(at) != set(want):
        where = ", ".join(at) if at else "no memstore schema"
        raise SchemaOutOfDateError(
            f"the database schema is at {where}; this memstore needs {', '.join(want)}. "
            f"Run `{UPGRADE_HINT}` (or memstore.migrate.upgrade(engine))."
        )


def upgrade_connection(conn: Connection, revision: str = "head") -> None:
    """Upgrade on an open connection whose transaction the caller manages."""
    _take_lock(conn)
    at = _current(conn)
    refuse_newer(at)
    if revision == "head" and set(at) == set(heads()):
        return
    command.upgrade(_config(conn), revision)


def upgrade(
    bind: Bind, revision: str = "head", *, sql: bool = False, output: TextIO | None = None
) -> str | None:
    """Upgrade the database to ``revision`` (default: head), in one transaction.

    Args:
        bind: an Engine, a Connection, or a database URL.
        revision: the target revision.
        sql: do not touch the database; return the DDL a DBA would run instead
            (``bind`` must then be a URL or Engine, used for its dialect only).
        output: where to write the DDL in ``sql`` mode (default: returned as a string).

    Returns:
        The DDL text in ``sql`` mode, else ``None``.
    """
    if sql:
        return _offline(bind, f"{revision}" if ":" in revision else f"base:{revision}",
                        "upgrade", output)
    with _connection(bind, write=True) as conn:
        upgrade_connection(conn, revision)
    return None


def downgrade(
    bind: Bind, revision: str, *, sql: bool = False, output: TextIO | None = None
) -> str | None:
    """Downgrade the database to ``revision`` (``"base"`` removes memstore's tables)."""
    if sql:
        return _offline(bind, f"head:{revision}", "downgrade", output)
    with _connection(bind, write=True) as conn:
        refuse_newer(_current(conn))
        command.downgrade(_config(conn), revision)
    return None


def _offline(bind: Bind, revision: str, direction: str, output: TextIO | None) -> str | None:
    if isinstance(bind, Connection):
        url = bind.engine.url
    elif isinstance(bind, Engine):
        url = bind.url
    else:
        from memstore._engine import sync_url

        url = sync_url(bind)
    buffer = output or io.StringIO()
    cfg = _config(output=buffer)
    cfg.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace(
        "%", "%%"))
    getattr(command, direction)(cfg, revision, sql=True)
    return buffer.getvalue() if output is None and isinstance(buffer, io.StringIO) else None


# ---- the hash-partitioned PostgreSQL layout -------------------------------------------------

#: Partition key of each table: the conversation id, so a conversation's row and all of its
#: messages land in partitions with the same number (hash of the same value, same modulus).
PARTITION_KEYS = {
    "memstore_conversations": "id",
    "memstore_messages": "conversation_id",
    "memstore_summaries": "conversation_id",
}


def partitioned_ddl(partitions: int = 8) -> list[str]:
    """The DDL of memstore's tables hash-partitioned by conversation id (PostgreSQL).

    Built from the same table definitions as the migrations (``memstore.schema``, which
    a test keeps identical to the head revision): every column, constraint and index,
    the partial index of anchored messages and the foreign keys to conversations
    included; each table is ``PARTITION BY HASH`` of its conversation id, with
    ``partitions`` partitions named ``<table>_p<i>``. Ends by creating memstore's
    version table and stamping the head revision, so ``memstore db check`` passes and
    later ``memstore db upgrade`` runs apply to the partitioned tables.

    Args:
        partitions: the number of hash partitions (1 to 1024).

    Returns:
        The statements, in order.

    Raises:
        ConfigurationError: ``partitions`` is not an int in [1, 1024].
    """
    from sqlalchemy import MetaData
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateTable

    from memstore import schema

    if not isinstance(partitions, int) or isinstance(partitions, bool) or not (
        1 <= partitions <= 1024
    ):
        raise ConfigurationError(f"partitions must be an int in [1, 1024], got {partitions!r}")
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    copy = MetaData(naming_convention=schema.metadata.naming_convention)
    statements: list[str] = []
    for source in (schema.conversations, schema.messages, schema.summaries):
        table = source.to_metadata(copy)
        table.dialect_options["postgresql"]["partition_by"] = (
            f"HASH ({PARTITION_KEYS[table.name]})"
        )
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        statements.extend(
            f"CREATE TABLE {table.name}_p{i} PARTITION OF {table.name} "
            f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {i})"
            for i in range(partitions)
        )
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    (head,) = heads()
    statements += [
        f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
        f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))",
        f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('{head}')",
    ]
    return statements


def create_partitioned(
    bind: Bind, partitions: int = 8, *, sql: bool = False, output: TextIO | None = None
) -> str | None:
    """Create memstore's tables hash-partitioned by conversation id, in one transaction.

    PostgreSQL only, on a database without memstore's tables: use it instead of the
    first ``memstore db upgrade``. Every hot statement names one conversation id, so it
    touches one partition of each table (see ``docs/deployment.md``); the same layout
    is what Citus distributes across servers.

    Args:
        bind: an Engine, a Connection, or a database URL.
        partitions: the number of hash partitions (default 8).
        sql: do not touch the database; return the DDL (``;``-terminated) for a DBA.
        output: where to write the DDL in ``sql`` mode (default: returned as a string).

    Returns:
        The DDL text in ``sql`` mode, else ``None``.

    Raises:
        ConfigurationError: not PostgreSQL, an invalid ``partitions``, or memstore's
            tables already exist.
    """
    statements = partitioned_ddl(partitions)
    if sql:
        text_ = "BEGIN;\n\n" + "".join(f"{statement};\n\n" for statement in statements)
        text_ += "COMMIT;\n"
        if output is not None:
            output.write(text_)
            return None
        return text_
    with _connection(bind, write=True) as conn:
        if conn.dialect.name != "postgresql":
            raise ConfigurationError(
                f"the partitioned layout is PostgreSQL's; this database is {conn.dialect.name}"
            )
        existing = conn.execute(text(
            "SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
            "AND c.relname IN ('memstore_conversations', 'memstore_messages', :version)"
        ), {"version": VERSION_TABLE}).scalar_one()
        if existing:
            raise ConfigurationError(
                "memstore's tables already exist in this database; the partitioned layout "
                "is created on a database without them (move conversations into it with "
                "save_state / load_state, or `memstore state save` / `memstore state load`)"
            )
        for statement in statements:
            conn.execute(text(statement))
    return None

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

import asyncio
import io
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from sqlalchemy import Connection, Engine, column, inspect, select, table, text
from sqlalchemy.engine import URL

from memstore._db.engine import install_sqlite_hooks, make_engine, sync_url, write_options
from memstore._db.schema import VERSION_TABLE
from memstore._validate import check_flag, short_repr
from memstore.errors import (
    ConfigurationError,
    DatabaseError,
    InvalidInputError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    translate_db_errors,
)

if TYPE_CHECKING:  # Alembic is imported when a migration runs, not to open a store
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "check",
    "create_partitioned",
    "current",
    "downgrade",
    "heads",
    "is_current",
    "partitioned_ddl",
    "rebuild_search_index",
    "script_location",
    "search_index_language",
    "upgrade",
]

Bind = Engine | Connection | str

# Arbitrary constant key for pg_advisory_xact_lock: one migrator at a time per database.
_PG_LOCK_KEY = 0x6D656D73  # "mems"

UPGRADE_HINT = "memstore db upgrade --url <database url>"

#: One Alembic migration at a time in this process. Alembic's ``context`` and ``op`` are
#: module-level proxies shared by the whole process: each migration installs them on entry
#: and removes them on exit. Two migrations at once on *different* databases (two threads,
#: or two async stores first used together) would run one database's DDL through the
#: other's context, or fail with a ``KeyError`` from Alembic; the database's own lock only
#: orders migrators of the same database. memstore's own paths take this lock first, before
#: any database lock, so the order is the same everywhere.
_MIGRATION_LOCK = threading.Lock()
#: Whether this context (thread, task, or the greenlet of an async store's ``run_sync``,
#: which SQLAlchemy runs in its caller's context) already holds ``_MIGRATION_LOCK``.
_HOLDING: ContextVar[bool] = ContextVar("memstore_migration_turn", default=False)


@contextmanager
def migration_turn() -> Iterator[None]:
    """Hold the process's migration lock (re-entrant within one thread or task)."""
    if _HOLDING.get():
        yield
        return
    with _MIGRATION_LOCK:
        token = _HOLDING.set(True)
        try:
            yield
        finally:
            _HOLDING.reset(token)


@asynccontextmanager
async def amigration_turn() -> AsyncIterator[None]:
    """`migration_turn()` for the event loop: waits without blocking other tasks.

    Polls rather than waiting in a worker thread, so a task cancelled while it waits
    never leaves the lock taken behind it. Migrations are rare (a store's first use),
    and only a migration running at that moment makes it wait.
    """
    if _HOLDING.get():
        yield
        return
    while not _MIGRATION_LOCK.acquire(blocking=False):  # noqa: ASYNC110 - a thread lock
        await asyncio.sleep(0.005)
    token = _HOLDING.set(True)
    try:
        yield
    finally:
        _HOLDING.reset(token)
        _MIGRATION_LOCK.release()

#: memstore's revisions, oldest first: the one line from base to head that its scripts in
#: ``migrations/versions`` form (a test holds the two equal, and every migration checks the
#: scripts against it). Opening a store compares the database's revision with this list,
#: so it needs neither Alembic nor the scripts: Alembic is imported only to migrate.
REVISIONS: tuple[str, ...] = (
    "0001_initial",
    "0002_conversation_epoch",
    "0003_summaries",
    "0004_recount_changed_rules",
    "0005",
    "0006_lifecycle",
    "0007_search_fork_copies",
)


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
    from alembic.config import Config

    _scripts()  # the scripts a migration runs must be the line memstore knows
    cfg = Config(output_buffer=output) if output is not None else Config()
    cfg.set_main_option("script_location", script_location())
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


_SCRIPTS: ScriptDirectory | None = None


def _scripts() -> ScriptDirectory:
    """The Alembic scripts, checked once to form the line `REVISIONS`."""
    global _SCRIPTS
    if _SCRIPTS is None:
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option("script_location", script_location())
        script = ScriptDirectory.from_config(cfg)
        oldest_first = list(reversed(list(script.walk_revisions())))
        chain = tuple(s.revision for s in oldest_first)
        downs = tuple(s.down_revision for s in oldest_first)
        if chain != REVISIONS or downs != (None, *chain[:-1]):
            raise ConfigurationError(
                "memstore's migration scripts do not form the line of revisions this "
                f"memstore knows ({', '.join(REVISIONS)}); reinstall memstore"
            )
        _SCRIPTS = script
    return _SCRIPTS


def heads() -> tuple[str, ...]:
    """The head revision(s) of memstore's migration scripts (exactly one)."""
    return REVISIONS[-1:]


def _chain() -> tuple[str, ...]:
    """The ids of memstore's revisions, oldest first (its history is one line from base)."""
    return REVISIONS


def known_revisions() -> frozenset[str]:
    """Every revision id of memstore's migration scripts."""
    return _KNOWN


_KNOWN = frozenset(REVISIONS)


def refuse_newer(at: tuple[str, ...]) -> None:
    """Raise `SchemaTooNewError` for a revision this memstore does not know.

    Such a revision was written by a newer memstore: this one must not write there.
    """
    unknown = [r for r in at if r not in known_revisions()]
    if unknown:
        raise SchemaTooNewError(", ".join(unknown))


# ---- revision arguments -------------------------------------------------------------------

Direction = Literal["upgrade", "downgrade"]

#: Alembic's relative form: ``[branch@][symbol]+N`` or ``-N`` (no symbol: from the database's
#: revision), e.g. ``head-1``, ``base+2``, ``0001_initial+1``, ``+1``, ``-1``.
_RELATIVE = re.compile(r"(?:(?P<label>[^@]*)@)?(?P<symbol>\w+)?(?P<steps>[+-][0-9]+)", re.ASCII)


def _name(position: int) -> str:
    """The revision at ``position`` of the chain (0 is base)."""
    return "base" if position == 0 else _chain()[position - 1]


def _bad_revision(revision: str, reason: str) -> InvalidInputError:
    return InvalidInputError(f"revision {revision!r}: {reason} (memstore's revisions: base, "
                             f"{', '.join(_chain())} (head))")


class _Revision:
    """A revision argument, checked against memstore's revisions (not yet the database's).

    The forms are Alembic's: a revision id (or a unique prefix of four characters or
    more), ``head``/``heads``, ``base``, optionally ``<revision>@`` before it (memstore
    has one branch), and relative forms ``<symbol>+N``/``<symbol>-N`` or ``+N``/``-N``
    (from the database's revision). Unlike Alembic, a form that walks past base or head
    is refused (Alembic fails with an ``AssertionError``, or resolves ``base-1`` to head).
    """

    def __init__(self, revision: object, direction: Direction | None,
                 argument: str | None = None) -> None:
        if not isinstance(revision, str):
            raise InvalidInputError(
                "the revision must be a str (a revision id, head, base, or a relative form "
                f"such as head-1), not {type(revision).__name__}"
            )
        self.argument = revision if argument is None else argument  # what errors name
        self.direction = direction
        self.steps = 0
        if not revision.strip():
            raise self.error("the revision is empty")
        if ":" in revision:
            raise self.error("a range (start:end) is valid only with sql=True (--sql)")
        match = _RELATIVE.fullmatch(revision)
        label: str | None
        if match:
            label, symbol = match.group("label"), match.group("symbol")
            self.steps = int(match.group("steps"))
        else:
            before, at_sign, symbol = revision.rpartition("@")
            label = before if at_sign else None
            if not symbol:
                raise self.error("it names no revision after '@'")
        if label is not None:
            if label in ("", "base", "head", "heads"):
                raise self.error(f"{label!r} is not a branch of memstore's revisions")
            self._position(label)  # memstore's one branch is named by any of its revisions
        #: Where the walk starts: a position of the chain, or None for the database's revision.
        self.start = self._position(symbol) if symbol else None
        if self.start is None and direction == "upgrade" and self.steps < 0:
            raise self.error("upgrade moves forward; use downgrade to go back")
        if self.start is None and direction == "downgrade" and self.steps > 0:
            raise self.error("downgrade moves back; use upgrade to go forward")
        if self.start is not None:
            self._walk(self.start, str(symbol))

    def error(self, reason: str) -> InvalidInputError:
        return _bad_revision(self.argument, reason)

    def _position(self, symbol: str) -> int:
        chain = _chain()
        if symbol in ("head", "heads"):
            return len(chain)
        if symbol == "base":
            return 0
        if symbol in chain:
            return chain.index(symbol) + 1
        matches = [i for i, rev in enumerate(chain) if len(symbol) >= 4 and rev.startswith(symbol)]
        if len(matches) > 1:
            raise self.error(f"{symbol!r} starts several revisions "
                             f"({', '.join(chain[i] for i in matches)})")
        if not matches:
            raise self.error(f"memstore has no revision {short_repr(symbol)}")
        return matches[0] + 1

    def _walk(self, start: int, origin: str) -> int:
        target = start + self.steps
        if target < 0:
            raise self.error(f"{-self.steps} step(s) back from {origin} is before base")
        if target > len(_chain()):
            raise self.error(f"{self.steps} step(s) forward from {origin} is past head "
                             f"({_chain()[-1]})")
        return target

    def resolve(self, at: int, where: str = "the database's revision") -> int:
        """The target's position, the walk of a relative form starting at position ``at``.

        A downgrade target above ``at`` is refused (Alembic's error names no revision).
        """
        target = self._walk(at if self.start is None else self.start, f"{where} ({_name(at)})")
        if self.direction == "downgrade" and target > at:
            raise self.error(f"{where} is {_name(at)}, below {_name(target)}; downgrade "
                             "cannot move up (use upgrade)")
        return target


def validate_revision(revision: object, direction: Direction, *, sql: bool = False) -> None:
    """Raise `InvalidInputError` for a revision argument that names no target.

    Checks what can be checked without the database: the type, the syntax, that the ids
    are memstore's and that a relative form stays between base and head (a form relative
    to the database's revision is checked when `upgrade()` or `downgrade()` has
    read it). The CLI calls it before it opens the database.
    """
    if check_flag(sql, "sql"):
        _offline_range(revision, direction)
    else:
        _Revision(revision, direction)


def _offline_range(revision: object, direction: Direction) -> tuple[int, int]:
    """The (start, end) positions of an ``sql=True`` run, from ``end`` or ``start:end``.

    Without a start, an upgrade starts at base and a downgrade at head.
    """
    if isinstance(revision, str) and ":" in revision:
        first, _, second = revision.partition(":")
        if ":" in second:
            raise _bad_revision(revision, "a range has one ':' (start:end)")
        start = _Revision(first, None, revision)
        if start.start is None:
            raise start.error("the start of an sql range cannot be relative to the database's "
                              "revision (sql mode reads no database)")
        begin = start.start
        end = _Revision(second, direction, revision)
        where = "the sql range's start"
    else:
        end = _Revision(revision, direction)
        begin = 0 if direction == "upgrade" else len(_chain())
        where = "the sql run's start"
    target = end.resolve(begin, where)
    if direction == "upgrade" and target < begin:
        raise end.error(f"{where} is {_name(begin)}, above {_name(target)}; upgrade "
                        "cannot move down (use downgrade)")
    return begin, target


def _check_bind(bind: object) -> None:
    if not isinstance(bind, (Engine, Connection, str)):
        raise ConfigurationError(
            "bind must be an Engine, a Connection or a database URL (str), "
            f"not {type(bind).__name__}"
        )


def _check_output(output: object) -> None:
    if output is not None and not callable(getattr(output, "write", None)):
        raise InvalidInputError(
            f"output must be a writable text stream (or None), not {type(output).__name__}"
        )


def _missing_sqlite_file(bind: Bind | URL, *, create: bool) -> bool:
    """Whether ``bind`` names a SQLite file that does not exist (so there is nothing to read).

    Raises `ConfigurationError` when the path is a directory, or when ``create``
    and the file's directory does not exist: SQLite's own error ("unable to open
    database file") names neither.
    """
    if isinstance(bind, Connection):
        return False
    u = bind.url if isinstance(bind, Engine) else bind if isinstance(bind, URL) else sync_url(bind)
    path = u.database
    if u.get_backend_name() != "sqlite" or not path or path == ":memory:" \
            or path.startswith("file:") or u.query.get("uri"):
        return False
    if os.path.isdir(path):
        raise ConfigurationError(f"the SQLite database {path!r} is a directory, not a file")
    if os.path.exists(path):
        return False
    parent = os.path.dirname(os.path.abspath(path))
    if create and not os.path.isdir(parent):
        raise ConfigurationError(
            f"cannot create the SQLite database {path!r}: the directory {parent!r} does not exist"
        )
    return True


@contextmanager
def _connection(bind: Bind, *, write: bool) -> Iterator[Connection]:
    """A connection inside a transaction; writers take the migration lock."""
    _check_bind(bind)
    if isinstance(bind, Connection):
        with translate_db_errors():
            if write:
                _take_lock(bind)
            yield bind
        return
    if isinstance(bind, str):
        engine = make_engine(bind)
    else:
        # A caller's SQLite engine gets memstore's connection setup, as a store's does:
        # without it pysqlite commits each DDL statement on its own (a failed upgrade
        # left half a schema, unstamped) and no BEGIN IMMEDIATE orders migrators.
        install_sqlite_hooks(bind)
        engine = bind
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
    """The revision(s) the database is at (empty when memstore's tables were never created).

    A SQLite file that does not exist is at no revision, and is not created.
    """
    _check_bind(bind)
    if _missing_sqlite_file(bind, create=False):
        return ()
    with _connection(bind, write=False) as conn:
        return _current(conn)


_VERSION_NUM = table(VERSION_TABLE, column("version_num")).c.version_num


def _current(conn: Connection) -> tuple[str, ...]:
    """The revision(s) in memstore's version table (none when it does not exist).

    What Alembic's ``MigrationContext.get_current_heads`` reads, without importing
    Alembic: opening a store runs this.
    """
    if not inspect(conn).has_table(VERSION_TABLE):
        return ()
    found = tuple(conn.execute(select(_VERSION_NUM)).scalars())
    for value in found:
        if not isinstance(value, str) or not value:
            raise DatabaseError(
                f"memstore's version table {VERSION_TABLE} holds {value!r}, not a revision "
                "id: it was edited by hand or by another tool. Leave the one revision the "
                "tables match, then migrate"
            )
    return found


def _position_at(conn: Connection) -> int:
    """The database's position in memstore's revisions (0: base), for a migration."""
    at = _current(conn)
    refuse_newer(at)
    if len(at) > 1:
        raise DatabaseError(
            f"memstore's version table {VERSION_TABLE} holds several revisions "
            f"({', '.join(at)}), but memstore's history is one line: it was edited by hand "
            "or by another tool. Leave the one revision the tables match, then migrate"
        )
    return _chain().index(at[0]) + 1 if at else 0


def is_current(bind: Bind) -> bool:
    """Whether the database schema is at memstore's head revision."""
    return set(current(bind)) == set(heads())


def check(bind: Bind) -> None:
    """Raise `SchemaOutOfDateError` unless the schema is at memstore's head.

    The error names the command that fixes it. A database migrated by a newer
    memstore (a revision this one does not know) raises `SchemaTooNewError`.
    """
    _require_head(current(bind))


def check_connection(conn: Connection) -> None:
    """`check()` on an open connection (used by the stores)."""
    _require_head(_current(conn))


def _require_head(at: tuple[str, ...]) -> None:
    refuse_newer(at)
    want = heads()
    if set(at) != set(want):
        if at:
            state, fix = (f"the database schema is at revision {', '.join(at)}, behind this "
                          f"memstore's {', '.join(want)}", "upgrade it")
        else:
            state, fix = (f"the database has no memstore tables yet (this memstore needs "
                          f"schema revision {', '.join(want)})", "create them")
        raise SchemaOutOfDateError(
            f"{state}: {fix} with `{UPGRADE_HINT}`, or from Python with "
            "memstore.migrate.upgrade(url_or_engine)"
        )


def upgrade_connection(conn: Connection, revision: str = "head") -> None:
    """Upgrade on an open connection whose transaction the caller manages."""
    target = _Revision(revision, "upgrade")
    with migration_turn():
        _take_lock(conn)
        at = _position_at(conn)
        position = target.resolve(at)
        if position > at:  # an upgrade never moves down: at or past the target, nothing to do
            from alembic import command

            command.upgrade(_config(conn), _name(position))


def upgrade(
    bind: Bind, revision: str = "head", *, sql: bool = False, output: TextIO | None = None,
    search_language: str | None = None,
) -> str | None:
    """Upgrade the database to ``revision`` (default: head), in one transaction.

    A database already at or past ``revision`` is left as it is.

    Args:
        bind: an Engine, a Connection, or a database URL.
        revision: the target: a revision id, ``head``, ``base``, or a relative form
            (``head-1``, ``base+2``, ``+1`` from the database's revision). In ``sql``
            mode also a range ``start:end`` (default start: base).
        sql: do not touch the database; return the DDL a DBA would run instead
            (``bind`` must then be a URL or Engine, used for its dialect only).
        output: where to write the DDL in ``sql`` mode (default: returned as a string).
        search_language: the search index's configuration when this upgrade creates
            it (revision 0005): ``"simple"`` (any language, no stemming) or
            ``"english"`` (English stemming and stop words); default
            ``$MEMSTORE_SEARCH_LANGUAGE``, else ``"simple"``. A database whose index
            already exists with the other configuration is refused (rebuild the index
            to change it: `memstore search --rebuild-index --language ...`).

    Returns:
        The DDL text in ``sql`` mode, else ``None``.

    Raises:
        InvalidInputError: ``revision`` names no revision of memstore's, or walks past
            base or head, or ``search_language`` is neither configuration or differs
            from the existing index's (nothing was written).
    """
    from memstore._db import search as _search

    _check_search_language(search_language)
    if check_flag(sql, "sql"):
        _check_output(output)
        begin, end = _offline_range(revision, "upgrade")
        with _search.language_for_new_index(search_language):
            return _offline(bind, f"{_name(begin)}:{_name(end)}", "upgrade", output)
    target = _Revision(revision, "upgrade")
    _check_bind(bind)
    if _missing_sqlite_file(bind, create=True) and target.resolve(0) == 0:
        return None  # a new database stays at base: create no file for it
    with migration_turn(), _connection(bind, write=True) as conn:
        if search_language is not None and _search.index_exists(conn):
            _refuse_other_language(conn, search_language)
        with _search.language_for_new_index(search_language):
            upgrade_connection(conn, revision)
    return None


def _check_search_language(language: object) -> None:
    from memstore._db import search as _search

    if language is not None:
        _search.check_language(language, "search_language", InvalidInputError)


def rebuild_search_index(
    bind: Bind, language: str | None = None, *,
    progress: Callable[[int, int], object] | None = None,
) -> int:
    """Drop the search index and build it again from the stored messages (one transaction).

    A repair: after restoring a SQLite database from a SQL text dump (which renumbers
    rowids), after editing memstore's tables by hand with triggers disabled, or to
    change the index's configuration. Writers of ``memstore_messages`` wait until it
    commits, so no message escapes the new index.

    Args:
        bind: an Engine, a Connection, or a database URL (at memstore's head revision).
        language: the new index's configuration, ``"simple"`` or ``"english"``
            (default: the current index's, else ``$MEMSTORE_SEARCH_LANGUAGE``, else
            ``"simple"``).
        progress: called with ``(messages indexed so far, messages to index)`` after
            each batch of 10,000.

    Returns:
        How many messages the new index holds.

    Raises:
        InvalidInputError: ``language`` is neither configuration (nothing was written).
        MissingDependencyError: SQLite without FTS5 (this Python's ``sqlite3``).
        SchemaOutdatedError: the database is not at memstore's head revision.
    """
    from memstore._db import search as _search
    from memstore.errors import MissingDependencyError

    if language is not None:
        _check_search_language(language)
    if progress is not None and not callable(progress):
        raise InvalidInputError(f"progress must be a callable or None, got {short_repr(progress)}")
    _check_bind(bind)
    if _missing_sqlite_file(bind, create=False):
        _require_head(())  # no database: says to create it (and creates no file)
    with migration_turn(), _connection(bind, write=True) as conn:
        check_connection(conn)
        made = _search.rebuild_index(conn, language, progress=progress)
        if not made:
            raise MissingDependencyError(
                "this Python's sqlite3 has no FTS5: the search index cannot be built here "
                "(run memstore under a Python whose sqlite3 includes FTS5)")
        return _search.stored_messages(conn)


def search_index_language(bind: Bind) -> str:
    """The configuration of the database's search index: ``"simple"`` or ``"english"``.

    Raises:
        MissingDependencyError: SQLite without the index, because this Python's sqlite3
            has no FTS5.
        ConfigurationError: the index is missing for another reason.
    """
    from memstore._db import search as _search

    _check_bind(bind)
    if _missing_sqlite_file(bind, create=False):
        _require_head(())
    with _connection(bind, write=False) as conn:
        return _search.index_language(conn)


def _refuse_other_language(conn: Connection, language: str) -> None:
    from memstore._db import search as _search

    existing = _search.index_language(conn)
    if existing != language:
        raise InvalidInputError(
            f"this database's search index is already {existing!r}: the search language "
            "is chosen when revision 0005 creates the index. To change it, rebuild the "
            f"index: `memstore search --rebuild-index --language {language}`")


def downgrade(
    bind: Bind, revision: str, *, sql: bool = False, output: TextIO | None = None
) -> str | None:
    """Downgrade the database to ``revision`` (``"base"`` removes memstore's tables).

    ``revision`` takes the forms `upgrade()` does (``-1``: one revision down from
    the database's). A target above the database's revision raises
    `InvalidInputError`, and nothing is written; in ``sql`` mode the DDL runs
    down from head, or from ``start`` in a range ``start:end``.
    """
    if check_flag(sql, "sql"):
        _check_output(output)
        begin, end = _offline_range(revision, "downgrade")
        return _offline(bind, f"{_name(begin)}:{_name(end)}", "downgrade", output)
    target = _Revision(revision, "downgrade")
    _check_bind(bind)
    if _missing_sqlite_file(bind, create=False):
        target.resolve(0)  # nothing to remove, and no file to create
        return None
    with migration_turn(), _connection(bind, write=True) as conn:
        at = _position_at(conn)
        position = target.resolve(at)
        if position < at:
            _refuse_partial_partitioned_downgrade(conn, position)
            from alembic import command

            command.downgrade(_config(conn), _name(position))
    return None


def _refuse_partial_partitioned_downgrade(conn: Connection, position: int) -> None:
    """On the partitioned layout, refuse a downgrade that drops a table but not all of them.

    Upgrading again would create that table unpartitioned (the revisions create plain
    tables), breaking the layout's one-partition property without any error. A downgrade
    to base is fine: the layout is then created again with `create_partitioned()`.
    """
    if conn.dialect.name != "postgresql" or position == 0:
        return
    # The newest revision that creates a per-conversation table: a downgrade below it
    # drops that (partitioned) table, and the upgrade back would create it plain.
    tables_from = REVISIONS.index("0006_lifecycle") + 1
    if position >= tables_from:
        return
    partitioned = conn.execute(text(
        "SELECT count(*) FROM pg_catalog.pg_partitioned_table p JOIN pg_catalog.pg_class c "
        "ON c.oid = p.partrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relname = 'memstore_conversations'"
    )).scalar_one()
    if partitioned:
        raise ConfigurationError(
            f"this database has the partitioned layout: a downgrade to {_name(position)} "
            "drops partitioned tables (memstore_conversation_keys, and memstore_summaries "
            "below 0003), and an upgrade would create them again unpartitioned. Downgrade "
            "to base (then create_partitioned), or to 0006_lifecycle or later"
        )


def _offline(bind: Bind, revision: str, direction: str, output: TextIO | None) -> str | None:
    if isinstance(bind, Connection):
        url = bind.engine.url
    elif isinstance(bind, Engine):
        url = bind.url
    else:
        url = sync_url(bind)
    buffer = output or io.StringIO()
    cfg = _config(output=buffer)
    cfg.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace(
        "%", "%%"))
    from alembic import command

    with migration_turn():
        getattr(command, direction)(cfg, revision, sql=True)
    return buffer.getvalue() if output is None and isinstance(buffer, io.StringIO) else None


# ---- the hash-partitioned PostgreSQL layout -------------------------------------------------

#: Partition key of each table: the conversation id, so a conversation's row and all of its
#: messages land in partitions with the same number (hash of the same value, same modulus).
PARTITION_KEYS = {
    "memstore_conversations": "id",
    "memstore_messages": "conversation_id",
    "memstore_summaries": "conversation_id",
    "memstore_conversation_keys": "conversation_id",
}


def partitioned_ddl(partitions: int = 8, search_language: str | None = None) -> list[str]:
    """The DDL of memstore's tables hash-partitioned by conversation id (PostgreSQL).

    Built from the same table definitions as the migrations (``memstore._db.schema``, which
    a test keeps identical to the head revision): every column, constraint and index,
    the partial index of anchored messages and the foreign keys to conversations
    included; each table is ``PARTITION BY HASH`` of its conversation id, with
    ``partitions`` partitions named ``<table>_p<i>``. Ends by creating memstore's
    version table and stamping the head revision, so ``memstore db check`` passes and
    later ``memstore db upgrade`` runs apply to the partitioned tables.

    Args:
        partitions: the number of hash partitions (1 to 1024).
        search_language: the search index's configuration, as in `upgrade()`.

    Returns:
        The statements, in order.

    Raises:
        ConfigurationError: ``partitions`` is not an int in [1, 1024].
    """
    from sqlalchemy import MetaData
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateTable

    from memstore._db import schema as schema

    if not isinstance(partitions, int) or isinstance(partitions, bool) or not (
        1 <= partitions <= 1024
    ):
        raise ConfigurationError(
            f"partitions must be an int in [1, 1024], got {short_repr(partitions)}"
        )
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    copy = MetaData(naming_convention=schema.metadata.naming_convention)
    statements: list[str] = []
    for source in (schema.conversations, schema.messages, schema.summaries,
                   schema.conversation_keys):
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
    # Not per conversation: the audit log of forget (one row per call).
    audit = schema.audit.to_metadata(copy)
    statements.append(str(CreateTable(audit).compile(dialect=dialect)).strip())
    statements.extend(schema.KEY_TRIGGERS["postgresql"])
    # The search index (revision 0005): partitioned like memstore_messages, so a search of
    # one conversation reads one partition. Its configuration: $MEMSTORE_SEARCH_LANGUAGE.
    from memstore._db import search as _search

    statements.extend(_search.postgresql_ddl(_search.configured_language(search_language),
                                             partitions=partitions))
    (head,) = heads()
    statements += [
        f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
        f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))",
        f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('{head}')",
    ]
    return statements


def create_partitioned(
    bind: Bind, partitions: int = 8, *, sql: bool = False, output: TextIO | None = None,
    search_language: str | None = None,
) -> str | None:
    """Create memstore's tables hash-partitioned by conversation id, in one transaction.

    PostgreSQL only, on a database without memstore's tables: use it instead of the
    first ``memstore db upgrade``. Every hot statement names one conversation id, so it
    touches one partition of each table (see [deployment](deployment.md)); the same layout
    is what Citus distributes across servers.

    Args:
        bind: an Engine, a Connection, or a database URL.
        partitions: the number of hash partitions (default 8).
        sql: do not touch the database; return the DDL (``;``-terminated) for a DBA.
        output: where to write the DDL in ``sql`` mode (default: returned as a string).
        search_language: the search index's configuration, as in `upgrade()`.

    Returns:
        The DDL text in ``sql`` mode, else ``None``.

    Raises:
        ConfigurationError: not PostgreSQL, an invalid ``partitions``, or memstore's
            tables already exist.
        InvalidInputError: ``search_language`` is neither configuration.
    """
    _check_search_language(search_language)
    statements = partitioned_ddl(partitions, search_language)
    if check_flag(sql, "sql"):
        text_ = "BEGIN;\n\n" + "".join(f"{statement};\n\n" for statement in statements)
        text_ += "COMMIT;\n"
        _check_output(output)
        if output is not None:
            output.write(text_)
            return None
        return text_
    _check_bind(bind)
    # Before connecting: a connection would create a SQLite file.
    dialect = (bind.dialect.name if isinstance(bind, (Engine, Connection))
               else sync_url(bind).get_backend_name())
    if dialect != "postgresql":
        raise ConfigurationError(
            f"the partitioned layout is PostgreSQL's; this database is {dialect}"
        )
    with _connection(bind, write=True) as conn:
        existing = conn.execute(text(
            "SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname IN "
            "('memstore_conversations', 'memstore_messages', 'memstore_summaries')"
        )).scalar_one()
        if inspect(conn).has_table(VERSION_TABLE):
            at = _current(conn)
            refuse_newer(at)  # a newer memstore's database: say so, by revision
            if not existing and not at:
                # What a downgrade to base leaves (Alembic keeps its version table,
                # empty): a database without memstore's tables, for the layout.
                conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
            else:
                existing += 1
        if existing:
            raise ConfigurationError(
                "memstore's tables already exist in this database; the partitioned layout "
                "is created on a database without them (move conversations into it with "
                "save_state / load_state, or `memstore state save` / `memstore state load`)"
            )
        for statement in statements:
            conn.execute(text(statement))
    return None

"""Engine construction and per-dialect connection setup, shared by both stores.

SQLite needs care to be a correct multi-writer database:

* WAL journal, ``foreign_keys=ON``, a busy timeout, and ``synchronous=FULL``
  (``durability="full"``, the default: every commit is fsynced, so a commit that
  returned survives power loss or an OS crash) or ``synchronous=NORMAL``
  (``durability="normal"``: faster commits; the last commits before power loss or an
  OS crash may be lost, never corrupted; a crash of the process alone loses nothing);
* memstore takes over transaction control from the ``sqlite3`` module (which
  otherwise never emits ``BEGIN`` before a ``SELECT``): read transactions start
  with ``BEGIN`` so a multi-page window read sees one snapshot, and write
  transactions start with ``BEGIN IMMEDIATE`` so a writer takes the write lock
  up front and waits (busy timeout) instead of failing on a stale snapshot.

PostgreSQL writes run in READ COMMITTED and serialize per conversation on the
conversation row lock; window reads run REPEATABLE READ READ ONLY (one snapshot).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, pool
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

from memstore._db.fork import after_fork_in_child
from memstore.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:  # the asyncio extension (and SQLAlchemy's ORM with it) loads with the async store
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "DEFAULT_URL",
    "DURABILITY_MODES",
    "apply_options",
    "check_durability",
    "async_url",
    "default_url",
    "install_sqlite_hooks",
    "make_async_engine",
    "make_engine",
    "parse_url",
    "read_options",
    "sync_url",
    "write_options",
]

DEFAULT_URL = "sqlite:///./memstore.db"

#: ``durability=`` values: SQLite ``synchronous=FULL`` or ``NORMAL``. PostgreSQL follows
#: the server's own settings (``synchronous_commit``, ``fsync``) in both modes.
DURABILITY_MODES = ("full", "normal")


def check_durability(durability: Any) -> str:
    """Validate the ``durability=`` argument."""
    if durability not in DURABILITY_MODES:
        from memstore._validate import short_repr
        from memstore.errors import ConfigurationError

        raise ConfigurationError(
            f"durability must be one of {', '.join(DURABILITY_MODES)}, not {short_repr(durability)}"
        )
    return str(durability)
_WRITE = "memstore_write"
_MARK = "_memstore_hooks"


def default_url() -> str:
    """``MEMSTORE_URL`` if set, else a SQLite file ``./memstore.db``."""
    return os.environ.get("MEMSTORE_URL") or DEFAULT_URL


_EXAMPLES = "sqlite:///path/to/memstore.db, sqlite:// (in memory) or postgresql://user@host/db"

#: The optional package each driver memstore selects needs, and the extra that installs it.
_DRIVER_EXTRAS = {"psycopg": ("psycopg", "postgres"), "aiosqlite": ("aiosqlite", "async")}


def parse_url(url: str | URL) -> URL:
    """Parse a database URL and check it names a database memstore supports.

    ``postgres://`` (the spelling of Heroku, libpq tools and most hosting providers)
    is accepted as ``postgresql://``.

    Raises:
        ConfigurationError: the URL does not parse (a bare file name gets a hint to
            write ``sqlite:///<name>``), or names a database other than SQLite or
            PostgreSQL.
    """
    if isinstance(url, URL):
        u = url
    elif isinstance(url, str):
        if "\x00" in url:
            raise ConfigurationError("the database URL contains a NUL character")
        surrogate = next((i for i, ch in enumerate(url) if "\ud800" <= ch <= "\udfff"), None)
        if surrogate is not None:  # no driver can encode it (bytes decoded with surrogateescape)
            raise ConfigurationError(
                f"the database URL contains a lone surrogate at index {surrogate}: it is "
                "not text (was it decoded with surrogateescape?)"
            )
        try:
            u = make_url(url)
        except (sa_exc.ArgumentError, ValueError) as exc:
            hint = ""
            if "://" not in url:
                hint = (f"; for a SQLite file write 'sqlite:///{url}'" if url
                        else "; pass a URL or set MEMSTORE_URL")
            raise ConfigurationError(
                f"{url!r} is not a database URL (expected {_EXAMPLES}){hint}"
            ) from exc
    else:
        raise ConfigurationError(f"the database URL must be a str, not {type(url).__name__}")
    backend = u.drivername.partition("+")[0]
    if backend == "postgres":
        driver = u.drivername.partition("+")[2]
        u = u.set(drivername="postgresql" + (f"+{driver}" if driver else ""))
        backend = "postgresql"
    if backend not in ("sqlite", "postgresql"):
        raise ConfigurationError(
            f"memstore does not support the database {backend!r} (URL "
            f"{u.render_as_string(hide_password=True)!r}); it runs on SQLite and PostgreSQL "
            f"({_EXAMPLES})"
        )
    return u


def _require_driver(u: URL) -> None:
    """Raise MissingDependencyError when the URL's driver package is not installed."""
    module, extra = _DRIVER_EXTRAS.get(u.get_driver_name(), (None, None))
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        database = "PostgreSQL" if u.get_backend_name() == "postgresql" else "asyncio SQLite"
        raise MissingDependencyError(
            f"{database} needs the {module!r} package, which is not installed: "
            f"pip install 'memstore[{extra}]'"
        ) from exc


def sync_url(url: str | URL) -> URL:
    """Normalise a URL to memstore's synchronous drivers (pysqlite, psycopg 3)."""
    u = parse_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        return u.set(drivername="sqlite")
    if backend == "postgresql" and (
        u.drivername == "postgresql"
        or u.get_driver_name() in ("psycopg2", "asyncpg", "psycopg_async", "")
    ):
        return u.set(drivername="postgresql+psycopg")
    return u


def async_url(url: str | URL) -> URL:
    """Normalise a URL to memstore's asyncio drivers (aiosqlite, psycopg 3 async)."""
    u = parse_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        return u.set(drivername="sqlite+aiosqlite")
    drivers = ("", "psycopg2", "psycopg", "psycopg_async")
    if backend == "postgresql" and u.get_driver_name() in drivers:
        return u.set(drivername="postgresql+psycopg")
    return u


def _create(factory: Any, u: URL, kwargs: dict[str, Any]) -> Any:
    """``factory(u, **kwargs)`` with driver and URL problems as memstore errors."""
    _require_driver(u)
    try:
        return factory(u, **kwargs)
    except ImportError as exc:
        raise MissingDependencyError(
            f"the driver of {u.render_as_string(hide_password=True)!r} is not installed: {exc}"
        ) from exc
    except (sa_exc.NoSuchModuleError, sa_exc.ArgumentError) as exc:
        raise ConfigurationError(
            f"cannot use {u.render_as_string(hide_password=True)!r}: {exc}"
        ) from exc
    except TypeError as exc:  # an engine option the dialect or pool does not take
        raise ConfigurationError(f"invalid engine option: {exc}") from exc
    except ValueError as exc:  # a URL query value the driver cannot read (?timeout=abc)
        raise ConfigurationError(
            f"cannot use {u.render_as_string(hide_password=True)!r}: {exc}"
        ) from exc


def _is_memory(u: URL) -> bool:
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def _engine_kwargs(u: URL, options: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(options)
    if _is_memory(u):
        # One shared in-memory database for every connection of this engine.
        kwargs.setdefault("poolclass", pool.StaticPool)
        kwargs.setdefault("connect_args", {"check_same_thread": False})
    # No pool_pre_ping by default (SQLAlchemy's default too): it costs a round trip per
    # checkout, which is a third of a small window on PostgreSQL. Pass
    # ``pool_pre_ping=True`` (or ``pool_recycle=...``) behind proxies that drop idle links.
    return kwargs


def make_engine(
    url: str | URL, *, busy_timeout: float = 30.0, durability: str = "full", **options: Any
) -> Engine:
    """Create a synchronous engine configured for memstore."""
    u = sync_url(url)
    engine: Engine = _create(create_engine, u, _engine_kwargs(u, options))
    install_sqlite_hooks(engine, busy_timeout=busy_timeout, durability=durability)
    forget_connections_after_fork(engine)
    return engine


def make_async_engine(
    url: str | URL, *, busy_timeout: float = 30.0, durability: str = "full", **options: Any
) -> AsyncEngine:
    """Create an asyncio engine configured for memstore."""
    from sqlalchemy.ext.asyncio import create_async_engine

    u = async_url(url)
    engine: AsyncEngine = _create(create_async_engine, u, _engine_kwargs(u, options))
    install_sqlite_hooks(engine.sync_engine, busy_timeout=busy_timeout, durability=durability)
    forget_connections_after_fork(engine.sync_engine)
    return engine


def forget_connections_after_fork(engine: Engine) -> None:
    """Give a forked child its own connections: the pool's inherited ones are dropped.

    A connection's socket (or SQLite file handle) is shared with the parent after
    ``os.fork()``: two processes talking over one PostgreSQL socket read each other's
    replies. In the child, the pool is replaced without closing what it held (closing
    would end the parent's sessions too), as SQLAlchemy's guide to multiprocessing
    does. An in-memory SQLite database lives in its one connection, which the child
    has a copy of: it is kept. The engine is held weakly (a store's engine is
    collected with it).
    """
    if not _is_memory(engine.url):
        after_fork_in_child(engine, _drop_pool)


def _drop_pool(engine: Engine) -> None:
    engine.dispose(close=False)


def install_sqlite_hooks(
    engine: Engine, *, busy_timeout: float = 30.0, durability: str = "full"
) -> None:
    """Install memstore's SQLite connection setup on ``engine`` (idempotent, no-op elsewhere).

    Injected engines get the hooks too: without them SQLite would not give window
    reads a snapshot, nor make concurrent writers wait for each other.
    """
    if engine.dialect.name != "sqlite" or getattr(engine, _MARK, False):
        return
    setattr(engine, _MARK, True)
    memory = _is_memory(engine.url)
    synchronous = "FULL" if check_durability(durability) == "full" else "NORMAL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # memstore emits BEGIN itself
        cursor = dbapi_connection.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        # Freed space is overwritten with zeros on every write, not only in a forget: a
        # page split or merge made without it leaves stale copies of rows in the free
        # areas of live pages, which a later secure delete of the rows does not reach
        # (tests/test_search_secure_delete.py). Many SQLite builds default to off.
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()

    @event.listens_for(engine, "close")
    def _on_close(dbapi_connection: Any, _record: Any) -> None:
        _rollback_before_close(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    if memory:
        # An in-memory database is one connection that every caller shares: two threads
        # (or tasks) using it at once interleave their transactions (a write
        # acknowledged, then rolled back by the other's error). The stores take turns
        # on it (`turn_of()`).
        setattr(engine, _TURN, threading.RLock())
    else:
        # Connections the engine pooled before (the caller used it already) lack the
        # setup above: close the idle ones, so every connection memstore gets has it.
        # (Not an in-memory one: its one connection is the database.)
        engine.pool.dispose()


#: The attribute holding an in-memory SQLite engine's turn lock.
_TURN = "_memstore_turn"


def turn_of(engine: Engine) -> Any:
    """The lock callers take turns on for ``engine``'s one shared connection, or ``None``.

    Only an in-memory SQLite engine (one connection for every caller) has one: a
    re-entrant lock, so a thread holding it (a stream being read) may call again.
    """
    return getattr(engine, _TURN, None)


def _rollback_before_close(dbapi_connection: Any) -> None:
    """Roll back a SQLite connection's open transaction before the pool closes it.

    A write cancelled inside a statement (``asyncio.timeout``, ``task.cancel``) makes
    SQLAlchemy invalidate and close its connection. Closing a ``sqlite3`` connection
    while one of its statements is still referenced (the cancelled call's cursor, kept
    alive by the ``CancelledError``'s traceback) leaves it open as a "zombie" that
    keeps its transaction, and with it the database's write lock, for every process,
    until that cursor is garbage-collected. Rolling back first releases the lock.
    Errors are ignored: the connection is going away either way.
    """
    driver = getattr(dbapi_connection, "driver_connection", None)
    try:
        if driver is None:  # the sync driver: sqlite3 itself
            if dbapi_connection.in_transaction:
                dbapi_connection.rollback()
        elif in_greenlet() and getattr(driver, "_connection", None) is not None:
            # aiosqlite runs calls in order on its own thread: this runs once the
            # statement the cancellation interrupted has finished; shielded, so a second
            # cancellation does not skip it
            await_only(asyncio.shield(driver.rollback()))
    except (Exception, asyncio.CancelledError):  # closing anyway
        pass


def apply_options(conn: Connection, options: dict[str, Any]) -> None:
    """``conn.execution_options(**options)``; a connection it leaves half-set is dropped.

    SQLAlchemy sets a connection characteristic (PostgreSQL's isolation level and
    read-only flag, which snapshot reads use) first, and only then registers its reset
    for the connection's return to the pool. An interruption in between, typically an
    asyncio cancellation while psycopg yields to the event loop inside
    ``set_read_only``, returned the connection to the pool still ``READ ONLY``: every
    later write that got it failed. Such a connection is invalidated instead (the pool
    opens a fresh one).
    """
    if not options:
        return
    try:
        conn.execution_options(**options)
    except BaseException:
        conn.invalidate()
        raise


def write_options() -> dict[str, Any]:
    """Execution options for a write transaction."""
    return {_WRITE: True}


def read_options(dialect_name: str, *, snapshot: bool) -> dict[str, Any]:
    """Execution options for a read transaction (one snapshot across pages when asked)."""
    if snapshot and dialect_name == "postgresql":
        return {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}
    return {}

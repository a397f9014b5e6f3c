"""Shared fixtures: one database fixture over SQLite and PostgreSQL, stores over sync and async.

PostgreSQL comes from ``MEMSTORE_TEST_POSTGRES_URL`` (default: the local server at
``127.0.0.1:5432``, user ``postgres``, database ``test``). Each test session creates
its own database there and drops it at the end. When the server cannot be reached,
the Postgres half is skipped with the reason, unless it is required
(``--require-postgres``, ``MEMSTORE_REQUIRE_POSTGRES=1`` or ``CI=true``), in which
case every Postgres test fails.
"""

from __future__ import annotations

import gc
import os
import queue
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from memstore import migrate
from memstore.tokens import FixedCounter
from tests.helpers import FULL, QUICK_FRACTION

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The quick suite (the README's command) leaves out the stress tests.

    Those are the tests marked ``slow`` and the second run of the store's contract on
    PostgreSQL's partitioned layout (``*__partitioned``, tests/test_partitioned.py);
    the layout's own tests (one partition per hot statement) stay in.
    """
    if FULL:
        return

    def stress(item: pytest.Item) -> bool:
        return (item.get_closest_marker("slow") is not None
                or item.name.split("[")[0].endswith("__partitioned"))

    slow = [item for item in items if stress(item)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not stress(item)]
    config.stash[_LEFT_OUT] = len(slow)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: tell the controller
        workeroutput["memstore_left_out"] = len(slow)


_LEFT_OUT = pytest.StashKey[int]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what collection built out of the garbage collector's full collections.

    The test modules import every integration's framework: hundreds of thousands of
    objects that live as long as the session. Each full collection (the collector's own,
    and the tests' ``gc.collect()``) walked them all; frozen, it walks what the tests
    made. Objects made later are collected as before.
    """
    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: each worker collected the same tests; keep what it left out."""
    left_out = getattr(node, "workeroutput", {}).get("memstore_left_out")
    if left_out is not None:
        node.config.stash[_LEFT_OUT] = left_out


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say what ran: the quick suite or the whole one, and how to run the rest."""
    if FULL:
        terminalreporter.write_line(
            "memstore: the whole suite ran (every property test at full strength, the "
            "stress tests too).")
        return
    terminalreporter.write_line(
        f"memstore: the quick suite ran: property tests on 1/{QUICK_FRACTION} of their "
        f"examples, {config.stash.get(_LEFT_OUT, 0)} stress tests left out (deselected). "
        "The whole suite, as CI runs it: MEMSTORE_FULL_TESTS=1 .venv/bin/python -m pytest -q -n 2")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--require-postgres", action="store_true",
                     help="fail (do not skip) when PostgreSQL cannot be reached")


def _required(config: pytest.Config) -> bool:
    return bool(
        config.getoption("--require-postgres")
        or os.environ.get("MEMSTORE_REQUIRE_POSTGRES") == "1"
        or os.environ.get("CI", "").lower() == "true"
    )


class PostgresServer:
    """A reachable server and a throwaway database per test session."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = make_url(admin_url).set(drivername="postgresql+psycopg")
        self.databases: list[str] = []
        self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT",
                                    pool_pre_ping=True)
        self._to_drop: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._dropper: threading.Thread | None = None
        self._drop_errors: list[BaseException] = []

    def create_database(self, prefix: str = "memstore_test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.databases.append(name)
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def drop_soon(self, url: str) -> None:
        """Drop a database no test uses any more, in a background thread.

        Each ``DROP DATABASE`` waits for a checkpoint of the whole server (about 0.2 s, the
        first one seconds); dropped while later tests run, the migration tests' databases
        no longer hold up the end of the session.
        """
        if self._dropper is None:
            self._dropper = threading.Thread(target=self._drop_queued, daemon=True,
                                             name="memstore-test-dropper")
            self._dropper.start()
        self._to_drop.put(make_url(url).database or "")

    def _drop_queued(self) -> None:
        while (name := self._to_drop.get()) is not None:
            try:
                with self._admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            except BaseException as exc:  # reported by drop_all
                self._drop_errors.append(exc)
            else:
                self.databases.remove(name)

    def drop_all(self) -> None:
        if self._dropper is not None:
            self._to_drop.put(None)
            self._dropper.join()
        with self._admin.connect() as conn:
            for name in self.databases:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self._admin.dispose()
        assert not self._drop_errors, self._drop_errors


@pytest.fixture(scope="session")
def postgres(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    url = os.environ.get("MEMSTORE_TEST_POSTGRES_URL", DEFAULT_PG)
    try:
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        reason = f"PostgreSQL not reachable at {make_url(url).render_as_string()}: {exc}"
        if _required(request.config):
            pytest.fail(f"{reason} (PostgreSQL is required in this run)")
        pytest.skip(reason)
    server = PostgresServer(url)
    yield server
    for engine in _EMPTYING_ENGINES.values():
        engine.dispose()
    _EMPTYING_ENGINES.clear()
    server.drop_all()


@pytest.fixture(scope="session")
def pg_url(postgres: PostgresServer) -> str:
    """One migrated database shared by the session's Postgres tests (emptied per test)."""
    url = postgres.create_database()
    migrate.upgrade(url)
    return url


#: One engine per database URL for emptying it between tests (a worker reuses its
#: connection; ``pool_pre_ping`` replaces one a test terminated on the server).
_EMPTYING_ENGINES: dict[str, Engine] = {}

#: What `_empty_pg` runs on a database holding a few rows: the search index first (so that
#: the index's delete trigger, joining the deleted messages to it, finds nothing), the
#: children, the conversations, and the audit log, whose ids restart at 1 as after
#: ``TRUNCATE ... RESTART IDENTITY``. On such tables ``DELETE`` takes about 1 ms where
#: ``TRUNCATE`` takes 15-20 ms, paid by every PostgreSQL test.
_EMPTY_PG = (
    "DELETE FROM fts_memstore_messages",
    "DELETE FROM memstore_summaries",
    "DELETE FROM memstore_messages",
    "DELETE FROM memstore_conversation_keys",
    "DELETE FROM memstore_conversations",
    "DELETE FROM memstore_audit",
    "SELECT setval(pg_get_serial_sequence('memstore_audit', 'id'), 1, false)",
)

#: Above this many messages or conversations (a stress test's 100,000), ``TRUNCATE``:
#: its cost does not grow with the rows.
_DELETE_AT_MOST = 1000

_TRUNCATE_PG = ("TRUNCATE memstore_summaries, memstore_messages, memstore_conversation_keys, "
                "memstore_conversations, memstore_audit RESTART IDENTITY")


def _empty_pg(url: str) -> None:
    """Empty the session's migrated PostgreSQL database: every memstore table, the search
    index included, with the audit log's ids restarted."""
    engine = _EMPTYING_ENGINES.get(url)
    if engine is None:
        engine = _EMPTYING_ENGINES[url] = create_engine(url, pool_size=1, pool_pre_ping=True)
    with engine.begin() as conn:
        rows = conn.execute(text(
            f"SELECT (SELECT count(*) FROM (SELECT 1 FROM memstore_messages "
            f"LIMIT {_DELETE_AT_MOST + 1}) AS m) + (SELECT count(*) FROM (SELECT 1 FROM "
            f"memstore_conversations LIMIT {_DELETE_AT_MOST + 1}) AS c)")).scalar_one()
        if rows > _DELETE_AT_MOST:
            conn.execute(text(_TRUNCATE_PG))
            return
        for statement in _EMPTY_PG:
            conn.execute(text(statement))


def _truncate_pg(url: str) -> None:
    """Empty the database with ``TRUNCATE`` (what fires the index's truncate trigger)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(_TRUNCATE_PG))
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """A SQLite file ``migrate.upgrade`` made, once per session (per search language).

    An upgrade of a new file takes about 30 ms and writes the same bytes each time (the
    file holds no clock reading or name); `migrated_sqlite` copies this one in 0.1 ms.
    """
    templates: dict[str, Path] = {}

    def template() -> Path:
        language = os.environ.get("MEMSTORE_SEARCH_LANGUAGE", "")
        path = templates.get(language)
        if path is None:
            path = tmp_path_factory.mktemp("sqlite_template") / "migrated.db"
            migrate.upgrade(f"sqlite:///{path}")
            templates[language] = path
        return path

    return template


@pytest.fixture
def migrated_sqlite(sqlite_template: Callable[[], Path]) -> Callable[[Path], str]:
    """``migrated_sqlite(path)``: a migrated, empty SQLite database at ``path``, its URL
    (what ``migrate.upgrade`` makes of a new file, copied from `sqlite_template`)."""

    def make(path: Path) -> str:
        shutil.copyfile(sqlite_template(), path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: a SQLite file, or the session's Postgres database."""
    if request.param == "sqlite":
        make: Callable[[Path], str] = request.getfixturevalue("migrated_sqlite")
        return make(tmp_path / "memstore.db")
    url: str = request.getfixturevalue("pg_url")
    _empty_pg(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A brand-new database with no tables at all (for migration tests)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    url = server.create_database("memstore_mig")
    yield url
    server.drop_soon(url)


@pytest.fixture
def counter() -> FixedCounter:
    """A deterministic counter: 3 tokens per message plus one per word."""
    return FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)


@pytest.fixture(params=["sync", "async"])
async def pg_store(request: pytest.FixtureRequest, pg_url: str) -> AsyncIterator[Any]:
    """A sync or async store on PostgreSQL only (``cache_size=0``), for PostgreSQL-only
    behaviour; the test carries ``@pytest.mark.postgres``."""
    from memstore.aio import AsyncMemoryStore
    from memstore.store import MemoryStore

    _empty_pg(pg_url)
    if request.param == "sync":
        sync_store = MemoryStore(pg_url, counter=FixedCounter(), cache_size=0)
        yield sync_store
        sync_store.close()
    else:
        async_store = AsyncMemoryStore(pg_url, counter=FixedCounter(), cache_size=0)
        await async_store.setup()
        yield async_store
        await async_store.close()


@pytest.fixture(params=["sync", "async"])
async def store(request: pytest.FixtureRequest, db_url: str,
                counter: FixedCounter) -> AsyncIterator[Any]:
    """A MemoryStore or an AsyncMemoryStore on ``db_url`` (use ``await call(...)``)."""
    from memstore.aio import AsyncMemoryStore
    from memstore.store import MemoryStore

    if request.param == "sync":
        sync_store = MemoryStore(db_url, counter=counter)
        yield sync_store
        sync_store.close()
    else:
        async_store = AsyncMemoryStore(db_url, counter=counter)
        await async_store.setup()
        yield async_store
        await async_store.close()

"""Fault injection: killed writers, terminated backends, held locks, newer schemas.

Bounded for CI. ``MEMSTORE_FAULT_ROUNDS`` (default 3) sets how many writers are
SIGKILLed per database; a longer run (e.g. ``MEMSTORE_FAULT_ROUNDS=100``) is the
soak mode described in ``docs/reliability.md``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import threading
import time
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore import (
    AsyncMemoryStore,
    ConnectionLostError,
    ContextView,
    ConversationNotFoundError,
    DatabaseBusyError,
    DatabaseError,
    DatabaseNotFoundError,
    MemoryStore,
    Message,
    SchemaOutOfDateError,
    SchemaTooNewError,
    TokenLimitedView,
    TransientError,
    migrate,
)
from memstore._db.schema import VERSION_TABLE
from memstore.tokens import FixedCounter
from tests.helpers import call

ROUNDS = int(os.environ.get("MEMSTORE_FAULT_ROUNDS", "3"))
BATCH = 20


def _batch(round_: int, b: int) -> list[Message]:
    return [Message.user(f"round {round_} batch {b} message {i}", id=f"r{round_}-b{b}-m{i}")
            for i in range(BATCH)]


def _writer(url: str, round_: int, batches: int) -> None:
    store = MemoryStore(url, counter=FixedCounter(), migrate="off")
    for b in range(batches):
        store.extend("killed", _batch(round_, b))


# ---- killed writers -------------------------------------------------------------------


@pytest.mark.slow
def test_sigkilled_writers_lose_duplicate_or_half_write_nothing(db_url: str) -> None:
    """SIGKILL a writer at a random moment; retrying every batch with the same client ids
    stores each message exactly once, in order, and no batch is ever half-written."""
    rng = random.Random(1234)
    ctx = multiprocessing.get_context("spawn")
    store = MemoryStore(db_url, counter=FixedCounter())
    batches = 15
    for round_ in range(ROUNDS):
        proc = ctx.Process(target=_writer, args=(db_url, round_, batches))
        proc.start()
        # wait until it has written something (or a bounded while), then kill it
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if store.get_conversation("killed").message_count > round_ * batches * BATCH:
                    break
            except ConversationNotFoundError:  # not created yet
                pass
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        proc.join(10)
        stored_ids = {m.id for m in store.iter_messages("killed")}
        for b in range(batches):  # atomic batches: all of a batch or none of it
            ids = {m.id for m in _batch(round_, b)}
            assert len(ids & stored_ids) in (0, BATCH), (round_, b)
        for b in range(batches):  # the retry, with the same client ids
            store.extend("killed", _batch(round_, b))
    messages = list(store.iter_messages("killed"))
    assert len(messages) == ROUNDS * batches * BATCH
    assert [m.seq for m in messages] == list(range(1, len(messages) + 1))
    assert len({m.id for m in messages}) == len(messages)
    store.close()


# ---- terminated PostgreSQL backends -----------------------------------------------------


def _terminate_others(url: str) -> int:
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        killed = conn.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )).scalar_one()
    admin.dispose()
    return int(killed)


class _TerminatingView(ContextView):
    """TokenLimitedView that terminates the store's backend once, in the middle of select."""

    def __init__(self, url: str) -> None:
        object.__setattr__(self, "inner", TokenLimitedView(token_limit=60))
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "terminated", [])

    def select(self, source: Any, counter: Any) -> Any:
        if not self.terminated:
            self.terminated.append(_terminate_others(self.url))
        return self.inner.select(source, counter)



@pytest.mark.postgres
async def test_terminated_backend_mid_window_is_retried_once(pg_store: Any,
                                                             pg_url: str) -> None:
    await call(pg_store.extend("c", [Message.user(f"m{i} " + "w " * 5) for i in range(40)]))
    expected = await call(pg_store.window("c", TokenLimitedView(token_limit=60)))
    view = _TerminatingView(pg_url)
    window = await call(pg_store.window("c", view))  # a read: retried transparently
    assert view.terminated[0] >= 1
    assert window.messages == expected.messages
    # as after a server restart: every pooled connection is dead
    _terminate_others(pg_url)
    assert len(await call(pg_store.messages("c"))) == 40  # a read: retried transparently
    _terminate_others(pg_url)
    with pytest.raises(ConnectionLostError):  # a write is the caller's to retry
        await call(pg_store.append("c", Message.user("late", id="late")))
    await call(pg_store.append("c", Message.user("late", id="late")))  # the pool recovered
    await call(pg_store.append("c", Message.user("late", id="late")))
    assert len(await call(pg_store.messages("c"))) == 41


class _Interrupted(BaseException):
    """An interruption of a sync call between two steps (as KeyboardInterrupt would be)."""


@pytest.mark.postgres
async def test_a_read_interrupted_while_it_sets_read_only_leaves_no_read_only_connection(
        pg_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy sets a snapshot read's READ ONLY flag, then registers its reset. A
    cancellation in between (psycopg may yield to the event loop in ``set_read_only``)
    returned the connection to the pool still read-only, and every later write on it
    failed; now that connection is dropped."""
    import asyncio

    await call(pg_store.extend("c", [Message.user("a"), Message.user("b")]))
    dialect = pg_store.engine.dialect
    real = dialect.set_readonly
    interruption = (asyncio.CancelledError if isinstance(pg_store, AsyncMemoryStore)
                    else _Interrupted)

    def set_then_interrupted(dbapi_connection: Any, value: bool) -> None:
        real(dbapi_connection, value)
        if value:
            raise interruption()

    monkeypatch.setattr(dialect, "set_readonly", set_then_interrupted)
    with pytest.raises(interruption):
        await call(pg_store.messages("c"))
    monkeypatch.setattr(dialect, "set_readonly", real)
    # The next connection the pool hands out writes (a transactional batch, then by ids).
    await call(pg_store.extend("c", [Message.user("c"), Message.user("d")]))
    await call(pg_store.extend("c", [Message.user("e", id="e")]))
    assert [m.text for m in await call(pg_store.messages("c"))] == ["a", "b", "c", "d", "e"]


@pytest.mark.postgres
def test_autocommit_switch_on_a_broken_connection_is_a_connection_error(pg_url: str) -> None:
    """The direct read and append paths flip the driver's autocommit flag first; on a
    connection the driver already knows is broken that raises, and it must come out as
    SQLAlchemy's wrapped error (which memstore translates) with the connection
    invalidated, not as a raw driver exception."""
    from sqlalchemy import exc as sa_exc

    from memstore._db import rows as _rows

    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            conn.connection.dbapi_connection.close()  # type: ignore[union-attr]
            with pytest.raises(sa_exc.DBAPIError) as caught:
                _rows.autocommit_on(conn)
            assert caught.value.connection_invalidated
            assert conn.invalidated
    finally:
        engine.dispose()


@pytest.mark.postgres
async def test_terminated_backend_mid_extend_is_retryable_and_exactly_once(
        pg_store: Any, pg_url: str) -> None:
    await call(pg_store.append("c", Message.user("first", id="first")))
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    locker = create_engine(pg_url)
    blocker = locker.connect()
    tx = blocker.begin()
    blocker.execute(text("SELECT 1 FROM memstore_conversations WHERE id = 'c' FOR UPDATE"))
    batch = [Message.user(f"m{i}", id=f"id-{i}") for i in range(50)]

    def terminate_the_waiter() -> None:
        with admin.connect() as conn:
            for _ in range(200):
                pid = conn.execute(text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )).scalar()
                if pid is not None:
                    conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                    return
                time.sleep(0.02)

    killer = threading.Thread(target=terminate_the_waiter)
    killer.start()
    with pytest.raises(ConnectionLostError) as info:
        await call(pg_store.extend("c", batch))  # blocked on the row lock, then terminated
    killer.join()
    tx.rollback()
    blocker.close()
    locker.dispose()
    admin.dispose()
    assert isinstance(info.value, TransientError) and isinstance(info.value, DatabaseError)
    assert [m.id for m in await call(pg_store.messages("c"))] == ["first"]  # nothing written
    stored = await call(pg_store.extend("c", batch))  # the retry
    again = await call(pg_store.extend("c", batch))  # and a duplicate retry
    assert [m.seq for m in stored] == [m.seq for m in again] == list(range(2, 52))
    assert len(await call(pg_store.messages("c"))) == 51


# ---- SQLite locks -----------------------------------------------------------------------


async def test_held_sqlite_lock_is_busy_and_readers_still_open(tmp_path: Any) -> None:
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}"
    migrate.upgrade(url)
    with MemoryStore(url, counter=FixedCounter()) as store:
        store.append("c", Message.user("before"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a long writer
    try:
        for mode in ("auto", "check", "off"):
            reader = MemoryStore(url, counter=FixedCounter(), migrate=mode, busy_timeout=0.2)
            assert [m.content for m in reader.messages("c")] == ["before"]
            with pytest.raises(DatabaseBusyError) as info:
                reader.append("c", Message.user("blocked"))
            assert isinstance(info.value, TransientError)
            reader.close()
        areader = AsyncMemoryStore(url, counter=FixedCounter(), migrate="check",
                                   busy_timeout=0.2)
        assert len(await areader.messages("c")) == 1
        with pytest.raises(DatabaseBusyError):
            await areader.extend("c", [Message.user("blocked")])
        await areader.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with MemoryStore(url, counter=FixedCounter()) as store:
        assert [m.content for m in store.messages("c")] == ["before"]  # nothing written


async def test_check_and_off_never_create_a_sqlite_file(tmp_path: Any) -> None:
    for mode in ("check", "off"):
        url = f"sqlite:///{tmp_path / mode}.db"
        with pytest.raises(DatabaseNotFoundError, match="does not exist"):
            MemoryStore(url, migrate=mode)
        with pytest.raises(DatabaseNotFoundError):
            await AsyncMemoryStore(url, migrate=mode).setup()
        assert not (tmp_path / f"{mode}.db").exists()
    MemoryStore(f"sqlite:///{tmp_path / 'auto.db'}").close()  # auto creates it
    assert (tmp_path / "auto.db").exists()


# ---- newer schemas ------------------------------------------------------------------------


def _stamp(url: str, revision: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = :r"), {"r": revision})
    engine.dispose()


@pytest.mark.parametrize("mode", ["auto", "check", "upgrade", "off"])
async def test_newer_schema_refused_in_every_mode(empty_db_url: str, mode: str) -> None:
    migrate.upgrade(empty_db_url)
    _stamp(empty_db_url, "9999_from_the_future")
    try:
        with pytest.raises(SchemaTooNewError, match=r"newer memstore.*9999_from_the_future"):
            MemoryStore(empty_db_url, counter=FixedCounter(), migrate=mode)  # type: ignore[arg-type]
        astore = AsyncMemoryStore(empty_db_url, counter=FixedCounter(),
                                  migrate=mode)  # type: ignore[arg-type]
        with pytest.raises(SchemaTooNewError) as info:
            await astore.append("c", Message.user("x"))
        await astore.close()
        assert info.value.revision == "9999_from_the_future"
        assert not isinstance(info.value, SchemaOutOfDateError)
        for action in (migrate.upgrade, migrate.check,
                       lambda u: migrate.downgrade(u, "base")):
            with pytest.raises(SchemaTooNewError):
                action(empty_db_url)
    finally:
        _stamp(empty_db_url, migrate.heads()[0])
    engine = create_engine(empty_db_url)
    with engine.connect() as conn:  # nothing was written into it
        assert conn.execute(text("SELECT count(*) FROM memstore_messages")).scalar_one() == 0
    engine.dispose()


def test_cli_db_upgrade_on_a_newer_schema_is_one_line(tmp_path: Any) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'new.db'}"
    migrate.upgrade(url)
    _stamp(url, "9999_from_the_future")
    done = subprocess.run([sys.executable, "-m", "memstore", "db", "upgrade", "--url", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "newer memstore" in done.stderr and "9999_from_the_future" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ---- durability ----------------------------------------------------------------------------


@pytest.mark.parametrize(("durability", "level"), [("full", 2), ("normal", 1)])
def test_durability_sets_sqlite_synchronous(tmp_path: Any, durability: str, level: int) -> None:
    store = MemoryStore(f"sqlite:///{tmp_path / 'd.db'}", durability=durability)  # type: ignore[arg-type]
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == level
    store.close()


def test_durability_default_is_full_and_validated(tmp_path: Any) -> None:
    from memstore import ConfigurationError

    store = MemoryStore(f"sqlite:///{tmp_path / 'd.db'}")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 2
    store.close()
    with pytest.raises(ConfigurationError, match="durability"):
        MemoryStore("sqlite://", durability="fast")  # type: ignore[arg-type]


def test_an_exhausted_pool_is_a_retryable_busy_error(db_url: str) -> None:
    """Every pooled connection in use past pool_timeout: DatabaseBusyError (a
    TransientError, worth a retry), not a plain DatabaseError."""
    from memstore import MemoryStore, TransientError
    from memstore.tokens import FixedCounter

    store = MemoryStore(db_url, counter=FixedCounter(), pool_size=1, max_overflow=0,
                        pool_timeout=0.2)
    store.append("c", Message.user("hi"))
    held = store.engine.connect()  # the pool's only connection
    try:
        with pytest.raises(DatabaseBusyError, match="pool_timeout") as info:
            store.append("c", Message.user("again"))
        assert isinstance(info.value, TransientError)
    finally:
        held.close()
    assert store.append("c", Message.user("again")).seq == 2
    store.close()


def _refusing_server(message: str) -> tuple[Any, int]:
    """A local socket that answers every PostgreSQL startup with FATAL 57P03 ``message``,
    what a restarting server sends to new connections."""
    import socket
    import struct

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed by the test
                return
            try:
                size = struct.unpack("!I", conn.recv(4))[0]
                body = conn.recv(size - 4)
                if struct.unpack("!I", body[:4])[0] == 80877103:  # an SSL request: no
                    conn.sendall(b"N")
                    size = struct.unpack("!I", conn.recv(4))[0]
                    conn.recv(size - 4)
                fields = b"SFATAL\0VFATAL\0C57P03\0M" + message.encode() + b"\0\0"
                conn.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)
            finally:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize("message", ["the database system is starting up",
                                     "the database system is shutting down"])
def test_a_server_restarting_refuses_connections_retryably(message: str) -> None:
    """During a PostgreSQL restart new connections are refused (57P03): a retryable
    ConnectionLostError, as docs/reliability.md tells callers to retry."""
    from memstore.errors import ConnectionLostError  # (psycopg is a test dependency)

    sock, port = _refusing_server(message)
    try:
        with pytest.raises(ConnectionLostError, match=message):
            MemoryStore(f"postgresql+psycopg://postgres@127.0.0.1:{port}/x?sslmode=disable")
    finally:
        sock.close()


@pytest.mark.parametrize(("sqlstate", "expected"), [
    ("40001", "DatabaseBusyError"), ("40P01", "DatabaseBusyError"),
    ("55P03", "DatabaseBusyError"), ("53300", "DatabaseBusyError"),
    ("08006", "ConnectionLostError"), ("08001", "ConnectionLostError"),
    ("57P01", "ConnectionLostError"), ("57P03", "ConnectionLostError"),
    ("42P01", "DatabaseError"),
])
def test_driver_errors_are_classified_by_sqlstate_in_any_language(sqlstate: str,
                                                                  expected: str) -> None:
    """A server with another lc_messages words its errors in its language: the SQLSTATE
    decides whether a failure is retryable."""
    from sqlalchemy import exc as sa_exc

    from memstore import errors

    class DriverError(Exception):
        def __init__(self, state: str) -> None:
            super().__init__("FEHLER: etwas ist schiefgegangen")  # no English marker
            self.sqlstate = state

    with pytest.raises(errors.DatabaseError) as info, errors.translate_db_errors():
        raise sa_exc.OperationalError("SELECT 1", {}, DriverError(sqlstate))
    assert type(info.value).__name__ == expected

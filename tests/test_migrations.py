"""Migrations on SQLite and PostgreSQL: one head, no drift, round trip, coexistence, packaging."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from memstore import migrate
from memstore.errors import (
    ConfigurationError,
    DatabaseError,
    InvalidInputError,
    SchemaOutOfDateError,
)
from memstore.schema import VERSION_TABLE, metadata
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter

ROOT = Path(__file__).resolve().parent.parent
MEMSTORE_TABLES = {"memstore_conversations", "memstore_messages", "memstore_summaries"}


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _include_memstore(name: str | None, type_: str, parent: Any) -> bool:
    if type_ == "table":
        return bool(name) and str(name).startswith("memstore_") and name != VERSION_TABLE
    return True


def _diff(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={
                "compare_type": True, "include_name": _include_memstore,
                "version_table": VERSION_TABLE,
            })
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()


def test_exactly_one_head() -> None:
    script = ScriptDirectory(migrate.script_location())
    assert len(script.get_heads()) == 1
    assert migrate.heads() == tuple(script.get_heads())
    # every revision chains back to base without branches
    revisions = list(script.walk_revisions())
    assert revisions[-1].down_revision is None


def test_upgrade_on_empty_database_leaves_no_autogenerate_diff(empty_db_url: str) -> None:
    assert migrate.current(empty_db_url) == ()
    assert not migrate.is_current(empty_db_url)
    migrate.upgrade(empty_db_url)
    assert _tables(empty_db_url) >= MEMSTORE_TABLES
    assert migrate.current(empty_db_url) == migrate.heads()
    assert migrate.is_current(empty_db_url)
    migrate.check(empty_db_url)
    assert _diff(empty_db_url) == []
    # a second upgrade is a no-op
    migrate.upgrade(empty_db_url)
    assert _diff(empty_db_url) == []


def test_upgrade_downgrade_upgrade_round_trip(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    store = MemoryStore(empty_db_url, counter=FixedCounter(), migrate="check")
    store.append("c", {"role": "user", "content": "survives nothing"})
    store.close()
    migrate.downgrade(empty_db_url, "base")
    assert _tables(empty_db_url) & MEMSTORE_TABLES == set()
    assert migrate.current(empty_db_url) == ()
    with pytest.raises(SchemaOutOfDateError, match="memstore db upgrade"):
        migrate.check(empty_db_url)
    migrate.upgrade(empty_db_url)
    assert _tables(empty_db_url) >= MEMSTORE_TABLES
    assert _diff(empty_db_url) == []
    store = MemoryStore(empty_db_url, counter=FixedCounter(), migrate="check")
    assert store.list_conversations() == []
    store.close()


HOST_ENV = '''
from alembic import context
from sqlalchemy import create_engine
config = context.config
engine = create_engine(config.get_main_option("sqlalchemy.url"))
with engine.begin() as conn:
    context.configure(connection=conn, target_metadata=None)
    context.run_migrations()
engine.dispose()
'''

HOST_REVISION = '''
revision = "host0001"
down_revision = None
branch_labels = None
depends_on = None
import sqlalchemy as sa
from alembic import op
def upgrade():
    op.create_table("host_items", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("name", sa.String(50)))
def downgrade():
    op.drop_table("host_items")
'''


def test_coexists_with_a_host_alembic_history(empty_db_url: str, tmp_path: Path) -> None:
    host = tmp_path / "host_migrations"
    (host / "versions").mkdir(parents=True)
    (host / "env.py").write_text(textwrap.dedent(HOST_ENV))
    (host / "script.py.mako").write_text("")
    (host / "versions" / "host0001.py").write_text(textwrap.dedent(HOST_REVISION))
    cfg = Config()
    cfg.set_main_option("script_location", str(host))
    cfg.set_main_option("sqlalchemy.url", empty_db_url.replace("%", "%%"))
    command.upgrade(cfg, "head")
    migrate.upgrade(empty_db_url)
    tables = _tables(empty_db_url)
    assert {"host_items", "alembic_version", VERSION_TABLE} | MEMSTORE_TABLES <= tables
    engine = create_engine(empty_db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "host0001"
        assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == \
            migrate.heads()[0]
    engine.dispose()
    assert _diff(empty_db_url) == []  # the host's table is not memstore's business
    migrate.downgrade(empty_db_url, "base")
    tables = _tables(empty_db_url)
    assert "host_items" in tables and not tables & MEMSTORE_TABLES
    command.downgrade(cfg, "base")
    assert "host_items" not in _tables(empty_db_url)


def test_store_migrate_policies(empty_db_url: str) -> None:
    embedded = empty_db_url.startswith("sqlite")
    if embedded:
        # auto upgrades an embedded database
        MemoryStore(empty_db_url, counter=FixedCounter()).close()
        assert migrate.is_current(empty_db_url)
        return
    with pytest.raises(SchemaOutOfDateError, match="memstore db upgrade"):
        MemoryStore(empty_db_url, counter=FixedCounter())
    with pytest.raises(SchemaOutOfDateError):
        MemoryStore(empty_db_url, counter=FixedCounter(), migrate="check")
    MemoryStore(empty_db_url, counter=FixedCounter(), migrate="off").close()
    assert migrate.current(empty_db_url) == ()
    MemoryStore(empty_db_url, counter=FixedCounter(), migrate="upgrade").close()
    assert migrate.is_current(empty_db_url)


async def test_async_store_checks_schema(empty_db_url: str) -> None:
    from memstore.aio import AsyncMemoryStore

    store = AsyncMemoryStore(empty_db_url, counter=FixedCounter())
    if empty_db_url.startswith("sqlite"):
        await store.setup()
        assert migrate.is_current(empty_db_url)
    else:
        with pytest.raises(SchemaOutOfDateError, match="memstore db upgrade"):
            await store.append("c", {"role": "user", "content": "x"})
    await store.close()


def test_offline_sql_for_a_dba() -> None:
    for url in ("postgresql+psycopg://u@h/db", "sqlite:///x.db"):
        ddl = migrate.upgrade(url, sql=True)
        assert ddl is not None
        assert "CREATE TABLE memstore_conversations" in ddl
        assert "CREATE TABLE memstore_messages" in ddl
        assert VERSION_TABLE in ddl
    assert "JSONB" in (migrate.upgrade("postgresql+psycopg://u@h/db", sql=True) or "")


@pytest.mark.slow
def test_wheel_ships_the_migrations_and_migrates_without_the_checkout(
    tmp_path: Path, empty_db_url: str
) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next(dist.glob("memstore-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "memstore/_migrations/env.py" in names
    assert "memstore/_migrations/script.py.mako" in names
    for rev in (ROOT / "migrations" / "versions").glob("*.py"):
        assert f"memstore/_migrations/versions/{rev.name}" in names
    assert "memstore/py.typed" in names
    # install the wheel's files alone and migrate from outside the checkout
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run(
        [sys.executable, "-c",
         "import memstore, memstore.migrate as m; print(memstore.__file__); "
         "print(m.script_location())"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=120,
    )
    module_file, location = probe.stdout.split()
    assert module_file.startswith(str(target)) and location.startswith(str(target))
    subprocess.run(
        [sys.executable, "-m", "memstore", "db", "upgrade", "--url", empty_db_url],
        cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120,
    )
    assert migrate.is_current(empty_db_url)
    assert _diff(empty_db_url) == []


# ---- bad input: a clear memstore error, and nothing written ----------------------------------


def _execute(url: str, *statements: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
    engine.dispose()


HEAD = migrate.heads()[0]


def test_relative_revision_forms_walk_memstore_history(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "+1")
    assert migrate.current(empty_db_url) == ("0001_initial",)
    migrate.upgrade(empty_db_url, "base+2")
    assert migrate.current(empty_db_url) == ("0002_conversation_epoch",)
    migrate.upgrade(empty_db_url, "heads")
    assert migrate.current(empty_db_url) == (HEAD,)
    migrate.upgrade(empty_db_url, "0001_initial")  # at or past the target: nothing to do
    assert migrate.current(empty_db_url) == (HEAD,)
    migrate.downgrade(empty_db_url, "-1")
    assert migrate.current(empty_db_url) == ("0002_conversation_epoch",)
    migrate.downgrade(empty_db_url, "head-3")
    assert migrate.current(empty_db_url) == ()


BAD_REVISIONS = [
    # (direction, revision, what the message says); the database is at 0001_initial
    ("upgrade", "head-9", "before base"),
    ("upgrade", "head+1", "past head"),
    ("upgrade", "base-1", "before base"),  # Alembic resolves it to head
    ("upgrade", "base+4", "past head"),
    ("upgrade", "0001_initial+5", "past head"),
    ("upgrade", "+5", "past head"),
    ("upgrade", "-1", "use downgrade"),
    ("upgrade", "", "empty"),
    ("upgrade", " ", "empty"),
    ("upgrade", "@", "no revision after"),
    ("upgrade", "nosuch@head", "no revision 'nosuch'"),
    ("upgrade", "head:base", "only with sql=True"),
    ("upgrade", "head-1x", "no revision"),
    ("downgrade", "+1", "use upgrade"),
    ("downgrade", "-2", "before base"),
    ("downgrade", "head", "below"),
    ("downgrade", "heads", "below"),
    ("downgrade", "0003_summaries", "below"),
    ("downgrade", "nosuch@head", "no revision 'nosuch'"),  # Alembic: a silent no-op at head
    ("downgrade", "base+3", "below"),
    ("downgrade", "", "empty"),
]


def test_a_revision_that_names_no_target_is_invalid_input(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0001_initial")
    for direction, revision, reason in BAD_REVISIONS:
        with pytest.raises(InvalidInputError) as info:
            getattr(migrate, direction)(empty_db_url, revision)
        message = str(info.value)
        assert f"revision {revision!r}" in message and reason in message, (revision, message)
        assert "0001_initial" in message  # the revisions there are
        assert migrate.current(empty_db_url) == ("0001_initial",), revision  # nothing written
    for revision in (None, 5):
        with pytest.raises(InvalidInputError, match="must be a str"):
            migrate.upgrade(empty_db_url, revision)  # type: ignore[arg-type]
    # the same on a Connection (the stores' path)
    engine = create_engine(empty_db_url)
    with engine.connect() as conn, pytest.raises(InvalidInputError, match="'head-9'"):
        migrate.upgrade(conn, "head-9")
    engine.dispose()
    assert migrate.current(empty_db_url) == ("0001_initial",)


def test_sql_mode_revisions_and_ranges() -> None:
    url = "postgresql+psycopg://u@h/db"
    ddl = migrate.downgrade(url, "0003_summaries:0001_initial", sql=True) or ""
    assert "DROP TABLE memstore_summaries" in ddl and "DROP TABLE memstore_messages" not in ddl
    ddl = migrate.upgrade(url, "0001_initial:+1", sql=True) or ""
    assert "ADD COLUMN epoch" in ddl and "CREATE TABLE memstore_messages" not in ddl
    for direction, revision, reason in [
        ("upgrade", "head:0001_initial", "upgrade cannot move down"),  # Alembic: empty output
        ("downgrade", "0001_initial:head", "downgrade cannot move up"),
        ("upgrade", "x:y:z", "one ':'"),
        ("downgrade", "x:y:z", "one ':'"),
        ("upgrade", "+1:head", "cannot be relative"),
        ("upgrade", ":head", "empty"),
        ("upgrade", "head-9", "before base"),
        ("downgrade", "+1", "use upgrade"),
    ]:
        with pytest.raises(InvalidInputError, match=re.escape(f"revision {revision!r}")) as info:
            getattr(migrate, direction)(url, revision, sql=True)
        assert reason in str(info.value), (revision, info.value)
    out = io.StringIO()
    with pytest.raises(InvalidInputError, match="revision 'head-9'"):
        migrate.upgrade(url, "head-9", sql=True, output=out)
    assert out.getvalue() == ""  # refused before a line was written
    with pytest.raises(InvalidInputError, match="writable text stream"):
        migrate.upgrade(url, sql=True, output="ddl.sql")  # type: ignore[arg-type]


def test_migrations_with_nothing_to_do_write_nothing(empty_db_url: str) -> None:
    _execute(empty_db_url, "CREATE TABLE unrelated (id INTEGER)")
    migrate.downgrade(empty_db_url, "base")
    migrate.upgrade(empty_db_url, "base")
    assert _tables(empty_db_url) == {"unrelated"}  # Alembic created its version table


def test_tables_of_the_same_name_that_are_not_memstore_s(empty_db_url: str) -> None:
    _execute(empty_db_url, "CREATE TABLE memstore_conversations (x INTEGER)")
    with pytest.raises(DatabaseError, match="memstore_conversations"):
        migrate.upgrade(empty_db_url)
    with pytest.raises(InvalidInputError, match="revision '-1'"):
        migrate.downgrade(empty_db_url, "-1")
    assert _tables(empty_db_url) == {"memstore_conversations"}
    assert migrate.current(empty_db_url) == ()
    engine = create_engine(empty_db_url)
    with engine.connect() as conn, pytest.raises(DatabaseError, match="memstore_conversations"):
        migrate.upgrade(conn)  # on a Connection too: the driver's error was raw
    engine.dispose()


def test_a_version_table_with_several_revisions_is_refused(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    _execute(empty_db_url, f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0001_initial')")
    for action in (migrate.upgrade, lambda url: migrate.downgrade(url, "base"),
                   lambda url: migrate.downgrade(url, "-1")):
        with pytest.raises(DatabaseError, match="several revisions"):
            action(empty_db_url)
    assert _tables(empty_db_url) >= MEMSTORE_TABLES | {VERSION_TABLE}
    assert sorted(migrate.current(empty_db_url)) == ["0001_initial", HEAD]


def test_a_bind_that_is_not_one_is_a_configuration_error() -> None:
    for bind in (None, 5, b"sqlite://"):
        for action in (migrate.upgrade, migrate.current, migrate.check, migrate.is_current,
                       lambda b: migrate.downgrade(b, "base"), migrate.create_partitioned):
            with pytest.raises(ConfigurationError, match="Engine, a Connection or a database URL"):
                action(bind)


def test_sqlite_paths_that_cannot_be_a_database(tmp_path: Path) -> None:
    directory = f"sqlite:///{tmp_path}"
    for action in (migrate.upgrade, migrate.current, migrate.check, migrate.is_current,
                   lambda u: migrate.downgrade(u, "base")):
        with pytest.raises(ConfigurationError, match="is a directory"):
            action(directory)
    with pytest.raises(ConfigurationError, match=r"directory .* does not exist"):
        migrate.upgrade(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    # a missing file is at no revision: reading it, or a migration to base, creates no file
    missing = tmp_path / "missing.db"
    url = f"sqlite:///{missing}"
    assert migrate.current(url) == () and not migrate.is_current(url)
    with pytest.raises(SchemaOutOfDateError):
        migrate.check(url)
    migrate.upgrade(url, "base")
    migrate.downgrade(url, "base")
    with pytest.raises(InvalidInputError, match="revision '\\+5'"):
        migrate.upgrade(url, "+5")
    with pytest.raises(ConfigurationError, match="PostgreSQL's"):
        migrate.create_partitioned(url)
    assert list(tmp_path.iterdir()) == []

"""Migrations on SQLite and PostgreSQL: one head, no drift, round trip, coexistence, packaging."""

from __future__ import annotations

import io
import json
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
from memstore._db.schema import VERSION_TABLE, metadata
from memstore.errors import (
    ConfigurationError,
    DatabaseError,
    InvalidInputError,
    SchemaOutOfDateError,
    TokenizerUnavailableError,
)
from memstore.models import Message, StoredMessage, TextPart
from memstore.store import MemoryStore
from memstore.tokens import (
    ApproxCounter,
    FixedCounter,
    TiktokenCounter,
    TokenCounter,
    counter_from_name,
)
from memstore.views import TokenLimitedView

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


def test_the_known_line_of_revisions_is_the_scripts_line() -> None:
    # Opening a store checks the database's revision against migrate.REVISIONS without
    # reading the scripts: a new revision must be added there too.
    script = ScriptDirectory(migrate.script_location())
    oldest_first = list(reversed(list(script.walk_revisions())))
    assert tuple(s.revision for s in oldest_first) == migrate.REVISIONS
    assert [s.down_revision for s in oldest_first] == [None, *migrate.REVISIONS[:-1]]


def test_scripts_that_are_not_the_known_line_are_refused(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrate, "REVISIONS", migrate.REVISIONS[:-1])
    monkeypatch.setattr(migrate, "_SCRIPTS", None)
    with pytest.raises(ConfigurationError, match="reinstall memstore"):
        migrate.upgrade(empty_db_url)
    assert migrate.current(empty_db_url) == ()


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
    assert migrate.current(empty_db_url) == (migrate.REVISIONS[-2],)
    n = len(migrate.REVISIONS)
    migrate.downgrade(empty_db_url, f"head-{n - 1}")
    assert migrate.current(empty_db_url) == ("0001_initial",)
    migrate.downgrade(empty_db_url, f"head-{n}")
    assert migrate.current(empty_db_url) == ()


BAD_REVISIONS = [
    # (direction, revision, what the message says); the database is at 0001_initial
    ("upgrade", "head-9", "before base"),
    ("upgrade", "head+1", "past head"),
    ("upgrade", "base-1", "before base"),  # Alembic resolves it to head
    ("upgrade", "base+9", "past head"),
    ("upgrade", "0001_initial+9", "past head"),
    ("upgrade", "+9", "past head"),
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


@pytest.mark.parametrize(("column", "value"), [
    ("VARCHAR(32)", "NULL"), ("VARCHAR(32)", "''"), ("INTEGER", "5")])
def test_a_version_table_holding_no_revision_id_is_refused(empty_db_url: str, column: str,
                                                           value: str) -> None:
    """A version table of another shape (a NULL, an empty string, an integer) gave a raw
    TypeError from every entry point, a store's in any mode included."""
    _execute(empty_db_url, f"CREATE TABLE {VERSION_TABLE} (version_num {column})",
             f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ({value})")
    for action in (migrate.current, migrate.check, migrate.upgrade,
                   lambda url: MemoryStore(url, counter=FixedCounter(), migrate="off")):
        with pytest.raises(DatabaseError, match="not a revision id"):
            action(empty_db_url)
    assert not MEMSTORE_TABLES & _tables(empty_db_url)


def test_upgrade_through_a_callers_sqlite_engine_is_one_transaction(tmp_path: Path) -> None:
    """``migrate.upgrade(create_engine("sqlite:///..."))``, as the docs show it: pysqlite
    committed each DDL statement on its own, so a failed upgrade left half a schema
    behind, unstamped (and every later upgrade failed), and engines of several processes
    were not ordered by BEGIN IMMEDIATE. The engine gets memstore's SQLite setup."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:  # the caller's table, named like one of memstore's
        conn.execute(text("CREATE TABLE memstore_summaries (x INTEGER)"))
    with pytest.raises(DatabaseError, match="already exists"):
        migrate.upgrade(engine)
    assert _tables(url) == {"memstore_summaries"} and migrate.current(engine) == ()
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE memstore_summaries"))
    migrate.upgrade(engine)
    with MemoryStore(engine=engine, counter=FixedCounter(), migrate="check") as store:
        store.append("c", Message.user("hi"))
    with engine.connect() as conn:  # the connection the store used has memstore's setup
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


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
    with pytest.raises(InvalidInputError, match="revision '\\+9'"):
        migrate.upgrade(url, "+9")
    with pytest.raises(ConfigurationError, match="PostgreSQL's"):
        migrate.create_partitioned(url)
    assert list(tmp_path.iterdir()) == []


async def test_stores_name_a_sqlite_path_that_cannot_be_a_database(tmp_path: Path) -> None:
    """A store on a directory, or in a directory that does not exist, raised SQLite's
    "unable to open database file", naming neither; migrate already named them."""
    from memstore.aio import AsyncMemoryStore

    nowhere = tmp_path / "no" / "such" / "dir.db"
    cases = [(f"sqlite:///{tmp_path}", mode, "is a directory")
             for mode in ("auto", "upgrade", "check", "off")]
    cases += [(f"sqlite:///{nowhere}", mode, r"directory .* does not exist")
              for mode in ("auto", "upgrade")]
    for url, mode, message in cases:
        with pytest.raises(ConfigurationError, match=message):
            MemoryStore(url, counter=FixedCounter(), migrate=mode)  # type: ignore[arg-type]
        store = AsyncMemoryStore(url.replace("sqlite://", "sqlite+aiosqlite://"),
                                 counter=FixedCounter(), migrate=mode)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=message):
            await store.setup()
        await store.close()
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240 - a test's own temporary folder


# ---- 0004_recount_changed_rules: counts stored by the two rules changed in place -------------

RECOUNT = "0004_recount_changed_rules"
TIKTOKEN = "tiktoken/cl100k_base"
APPROX = "approx/4"
#: A tiktoken name whose counter cannot be built here (the test empties tiktoken's cache).
UNAVAILABLE = "tiktoken/p50k_base"
#: 64 characters (the column's length), naming an encoding tiktoken does not know.
UNKNOWN = "tiktoken/" + "x" * 55
CITIES = ("Paris", "London", "Tokyo", "Berlin")
REMOTE_IMAGE = "https://example.com/cat.png"


def _calls(*cities: str, name: str = "get_weather") -> list[dict[str, Any]]:
    return [{"id": f"call_{city.lower()}", "type": "function",
             "function": {"name": name, "arguments": json.dumps({"city": city})}}
            for city in cities]


def _results(*cities: str) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": f"call_{city.lower()}", "content": f"{city}: 21C"}
            for city in cities]


def _old_count(counter: TokenCounter, message: Message) -> int:
    """The count the earlier rules stored for ``message`` under ``counter``'s name.

    TiktokenCounter charged each of several tool calls as a single call; ApproxCounter
    charged 85 per image part.
    """
    if isinstance(counter, TiktokenCounter) and message.tool_calls and \
            len(message.tool_calls) >= 2:
        bare = counter.count_message(message.model_copy(update={"tool_calls": None}))
        return bare + sum(
            counter.count_message(message.model_copy(update={"tool_calls": [call]})) - bare
            for call in message.tool_calls)
    if isinstance(counter, ApproxCounter) and isinstance(message.content, list):
        texts = [part for part in message.content if isinstance(part, TextPart)]
        images = len(message.content) - len(texts)
        return counter.count_message(message.model_copy(update={"content": texts})) + 85 * images
    return counter.count_message(message)


def _snapshot(url: str) -> tuple[dict[tuple[str, int], tuple[int, str]],
                                  dict[str, tuple[int, int]]]:
    """``{(cid, seq): (token_count, token_counter)}`` and ``{cid: (token_count, epoch)}``."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = {(cid, int(seq)): (int(n), name) for cid, seq, n, name in conn.execute(text(
                "SELECT conversation_id, seq, token_count, token_counter FROM memstore_messages"))}
            conversations = {cid: (int(n), int(epoch)) for cid, n, epoch in conn.execute(text(
                "SELECT id, token_count, epoch FROM memstore_conversations"))}
    finally:
        engine.dispose()
    return rows, conversations


def _write_as_the_earlier_code(url: str) -> None:
    """Conversations at revision 0003 holding the counts the earlier rules stored.

    The current store writes the rows (the schema is the same), then the counts of the
    rows the rules changed for are set back to what the earlier code computed, with the
    conversations' totals, as that code left them. ``current`` keeps counts written by
    the new rules; ``untouched`` holds only rows neither rule changed (some of which
    SQLite's prefilter finds).
    """
    tiktoken, approx = TiktokenCounter(), ApproxCounter(4)
    with MemoryStore(url, counter=tiktoken, migrate="off") as store:
        store.extend("tools", [
            {"role": "user", "content": "Weather in Paris, London, Tokyo and Berlin?"},
            {"role": "assistant", "content": None, "tool_calls": _calls(*CITIES)},
            *_results(*CITIES),
            {"role": "assistant", "content": "Mild everywhere."},
            {"role": "user", "content": "And Rome?"},
            {"role": "assistant", "content": None, "tool_calls": _calls("Rome")},
            *_results("Rome"),
            {"role": "user", "content": "Oslo and Lima?"},
            {"role": "assistant", "content": "Checking both.",
             "tool_calls": _calls("Oslo", "Lima")},
            *_results("Oslo", "Lima"),
            {"role": "assistant", "content": "Cold and warm."},
        ])
        store.extend("stale", [
            {"role": "user", "content": "Paris and London, then Rome?"},
            {"role": "assistant", "content": None, "tool_calls": _calls("Paris", "London")},
            *_results("Paris", "London"),
            {"role": "assistant", "content": None, "tool_calls": _calls("Tokyo", "Berlin")},
            *_results("Tokyo", "Berlin"),
            {"role": "assistant", "content": None, "tool_calls": _calls("Rome")},
            *_results("Rome"),
        ])
        store.extend("untouched", [
            {"role": "user", "content": [
                {"type": "text", "text": "A picture:"},
                {"type": "image_url", "image_url": {"url": REMOTE_IMAGE}}]},
            # one call whose name is "id": two '"id"' keys in its JSON, one call
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "id", "type": "function", "function": {"name": "id", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "id", "content": "7"},
        ])
        store.extend("current", [
            {"role": "user", "content": "Paris and Tokyo?"},
            {"role": "assistant", "content": None, "tool_calls": _calls("Paris", "Tokyo")},
            *_results("Paris", "Tokyo"),
        ])
    with MemoryStore(url, counter=approx, migrate="off") as store:
        store.extend("images", [
            {"role": "user", "content": [
                {"type": "text", "text": "What is in these pictures?"},
                {"type": "image_url", "image_url": {"url": REMOTE_IMAGE}},
                {"type": "image_url", "image_url": {"url": REMOTE_IMAGE, "detail": "low"}},
                {"type": "image_url", "image_url": {"url": REMOTE_IMAGE, "detail": "high"}}]},
            {"role": "assistant", "content": "Three cats."},
            {"role": "user", "content": [{"type": "text", "text": "Is image_url a field?"}]},
            {"role": "assistant", "content": "Yes."},
        ])
        store.extend("untouched", [
            {"role": "user", "content": [{"type": "text", "text": "no image_url here"}]},
            {"role": "assistant", "content": "Right."},
        ])
        store.append("current", {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": REMOTE_IMAGE}}]})
    with MemoryStore(url, counter=FixedCounter(), migrate="off") as store:
        store.extend("untouched", [
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": REMOTE_IMAGE}}]},
            {"role": "assistant", "content": None, "tool_calls": _calls("Paris", "Oslo")},
            *_results("Paris", "Oslo"),
        ])
        old = {cid: store.messages(cid) for cid in ("tools", "stale", "images")}
    engine = create_engine(url)
    with engine.begin() as conn:
        for cid, messages in old.items():
            for m in messages:
                counter = counter_from_name(m.token_counter)
                conn.execute(text("UPDATE memstore_messages SET token_count = :n "
                                  "WHERE conversation_id = :c AND seq = :s"),
                             {"n": _old_count(counter, m), "c": cid, "s": m.seq})
        # counts stored under names whose counters this process cannot build
        for seq, name in ((2, UNAVAILABLE), (5, UNKNOWN), (8, UNAVAILABLE)):
            conn.execute(text("UPDATE memstore_messages SET token_counter = :name "
                              "WHERE conversation_id = 'stale' AND seq = :s"),
                         {"name": name, "s": seq})
        conn.execute(text(
            "UPDATE memstore_conversations SET token_count = (SELECT sum(m.token_count) "
            "FROM memstore_messages m WHERE m.conversation_id = memstore_conversations.id)"))
    engine.dispose()


@pytest.fixture
def no_tiktoken_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken's cache is empty: only the packaged cl100k_base can be loaded."""
    empty = tmp_path / "tiktoken-cache"
    empty.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(empty))
    with pytest.raises(TokenizerUnavailableError):
        counter_from_name(UNAVAILABLE)
    with pytest.raises(ConfigurationError):
        counter_from_name(UNKNOWN)


def _stamp(url: str, revision: str) -> None:
    _execute(url, f"UPDATE {VERSION_TABLE} SET version_num = '{revision}'")


def _check_recount(url: str, partitioned: bool = False) -> None:
    """Write at 0003 as the earlier code did, upgrade, and check what 0004 changed.

    ``partitioned``: the layout was created at head and stamped 0003 (0004 only changes
    rows), so it is stamped back rather than taken through the later revisions.
    """
    _write_as_the_earlier_code(url)
    rows, conversations = _snapshot(url)
    migrate.upgrade(url, RECOUNT)
    assert migrate.current(url) == (RECOUNT,)
    after_rows, after_conversations = _snapshot(url)
    assert after_rows.keys() == rows.keys()
    changed = {key for key in rows if after_rows[key] != rows[key]}
    assert changed == {("tools", 2), ("tools", 12), ("images", 1),
                       ("stale", 2), ("stale", 5)}
    tiktoken, approx = TiktokenCounter(), ApproxCounter(4)
    if partitioned:
        _stamp(url, migrate.heads()[0])
    else:
        migrate.upgrade(url)
    with MemoryStore(url, counter=tiktoken, migrate="check") as store:
        stored = {(cid, m.seq): m for cid in conversations for m in store.messages(cid)}
    for key, counter in ((("tools", 2), tiktoken), (("tools", 12), tiktoken),
                         (("images", 1), approx)):
        m = stored[key]
        assert m.token_counter == counter.name and m.token_count == counter.count_message(m)
        assert m.token_count > rows[key][0]  # the earlier rules counted less
    assert stored["tools", 2].token_count - rows["tools", 2][0] == 87 - 52  # four calls
    assert stored["images", 1].token_count - rows["images", 1][0] == 2 * (1445 - 85)
    # rows whose counter cannot be built: the count is kept, the name no counter has
    assert after_rows["stale", 2] == (rows["stale", 2][0], "stale/" + UNAVAILABLE)
    assert after_rows["stale", 5] == (rows["stale", 5][0], ("stale/" + UNKNOWN)[:64])
    assert len(after_rows["stale", 5][1]) == 64
    assert after_rows["stale", 8] == rows["stale", 8] == (rows["stale", 8][0], UNAVAILABLE)
    # totals: the sum of the stored counts, moved by the changes; epochs replaced where
    # a row changed, kept elsewhere
    for cid, (total, epoch) in conversations.items():
        new_total, new_epoch = after_conversations[cid]
        assert new_total == sum(n for (c, _), (n, _) in after_rows.items() if c == cid)
        assert new_total - total == sum(after_rows[key][0] - rows[key][0]
                                        for key in changed if key[0] == cid)
        touched = cid in {"tools", "images", "stale"}
        assert (new_epoch != epoch) is touched, cid
        assert new_epoch != 0
    assert after_conversations["stale"][0] == conversations["stale"][0]
    # a second run (after going down and up) finds nothing to change
    if partitioned:
        _stamp(url, "0003_summaries")
    else:
        migrate.downgrade(url, "0003_summaries")
    migrate.upgrade(url, RECOUNT)
    assert _snapshot(url) == (after_rows, after_conversations)


@pytest.mark.usefixtures("no_tiktoken_cache")
def test_0004_recounts_rows_the_changed_rules_count(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0003_summaries")
    _check_recount(empty_db_url)


@pytest.mark.postgres
@pytest.mark.usefixtures("no_tiktoken_cache")
def test_0004_recounts_on_the_partitioned_layout(postgres: Any) -> None:
    url: str = postgres.create_database("memstore_mig_part")
    migrate.create_partitioned(url, 4)
    _stamp(url, "0003_summaries")
    _check_recount(url, partitioned=True)


def test_0004_windows_fit_their_budgets_after_the_upgrade(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0003_summaries")
    _write_as_the_earlier_code(empty_db_url)
    _, conversations = _snapshot(empty_db_url)
    tiktoken, approx = TiktokenCounter(), ApproxCounter(4)
    cases = [(tiktoken, "tools"), (approx, "images")]
    # a store of the earlier code's day, whose row cache outlives the upgrade
    stores = {counter.name: MemoryStore(empty_db_url, counter=counter, migrate="off")
              for counter, _ in cases}
    try:
        views = {}
        for counter, cid in cases:
            # the whole conversation, as the stored counts have it
            views[cid] = view = TokenLimitedView(conversations[cid][0] + counter.priming)
            window = stores[counter.name].window(cid, view)
            assert len(window.messages) == len(stores[counter.name].messages(cid))
            assert window.token_count == view.token_limit
            assert counter.count_messages(window.messages) > view.token_limit  # over budget
        migrate.upgrade(empty_db_url)
        fresh = {counter.name: MemoryStore(empty_db_url, counter=counter, migrate="upgrade")
                 for counter, _ in cases}
        try:
            for counter, cid in cases:
                for store in (stores[counter.name], fresh[counter.name]):
                    window = store.window(cid, views[cid])
                    assert all(isinstance(m, StoredMessage) for m in window.messages)
                    assert window.token_count == counter.count_messages(window.messages)
                    assert window.token_count <= views[cid].token_limit
                    assert len(window.messages) < len(store.messages(cid))
        finally:
            for store in fresh.values():
                store.close()
    finally:
        for store in stores.values():
            store.close()


def test_0004_upgrade_with_nothing_to_recount_changes_nothing(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0003_summaries")
    with MemoryStore(empty_db_url, counter=TiktokenCounter(), migrate="off") as store:
        store.extend("c", [
            {"role": "user", "content": "Paris and Tokyo?"},
            {"role": "assistant", "content": None, "tool_calls": _calls("Paris", "Tokyo")},
            *_results("Paris", "Tokyo"),
        ])
    before = _snapshot(empty_db_url)
    migrate.upgrade(empty_db_url)
    assert _snapshot(empty_db_url) == before


def test_0004_offline_sql_marks_the_rows_stale(empty_db_url: str) -> None:
    """``--sql`` cannot count: its script renames the rows and replaces their epochs."""
    migrate.upgrade(empty_db_url, "0003_summaries")
    _write_as_the_earlier_code(empty_db_url)
    rows, conversations = _snapshot(empty_db_url)
    script = migrate.upgrade(empty_db_url, f"0003_summaries:{RECOUNT}", sql=True) or ""
    assert "stale/" in script and "epoch" in script
    statements = [s.strip() for s in script.split(";\n")]
    engine = create_engine(empty_db_url)
    with engine.begin() as conn:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        for statement in statements:
            lines = [ln for ln in statement.splitlines() if not ln.startswith("--")]
            body = "\n".join(lines).strip()
            if body and body not in ("BEGIN", "COMMIT"):
                cursor.execute(body)
    engine.dispose()
    assert migrate.current(empty_db_url) == (RECOUNT,)
    after_rows, after_conversations = _snapshot(empty_db_url)
    stale = {key for key in rows if after_rows[key] != rows[key]}
    # exact on PostgreSQL; SQLite's LIKE prefilter also takes the single call named "id"
    # and the text part mentioning image_url (harmless: they are counted on the fly)
    expected = {("tools", 2), ("tools", 12), ("images", 1), ("stale", 2), ("stale", 5),
                ("current", 2), ("current", 5)}
    if empty_db_url.startswith("sqlite"):
        expected |= {("untouched", 2), ("images", 3), ("untouched", 4)}
    assert {(cid, seq) for cid, seq in stale} == expected
    for key in stale:
        count, name = after_rows[key]
        assert count == rows[key][0] and name == ("stale/" + rows[key][1])[:64]
    for cid, (total, epoch) in conversations.items():
        assert after_conversations[cid][0] == total
        assert (after_conversations[cid][1] != epoch) is (cid in {k[0] for k in stale})


@pytest.mark.postgres
@pytest.mark.usefixtures("no_tiktoken_cache")
def test_0004_reads_again_a_conversation_changed_while_it_runs(postgres: Any) -> None:
    """A writer holding a conversation (as the store holds one to change its rows) makes
    the migration wait; the rows it changed, with a new epoch, are read again."""
    import threading
    import time

    url: str = postgres.create_database("memstore_mig_race")
    migrate.upgrade(url, "0003_summaries")
    _write_as_the_earlier_code(url)
    tiktoken = TiktokenCounter()
    calls = _calls("Paris", "London", "Tokyo")  # seq 2 loses a call, as a rewrite would
    engine = create_engine(url)
    errors: list[BaseException] = []
    try:
        with engine.connect() as writer:
            writer.execute(text("SELECT id FROM memstore_conversations WHERE id = 'tools' "
                                "FOR UPDATE"))

            def upgrade() -> None:
                try:
                    migrate.upgrade(url, RECOUNT)
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            thread = threading.Thread(target=upgrade)
            thread.start()
            deadline = time.monotonic() + 30
            with engine.connect() as probe:
                while not probe.execute(text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'")).scalar():
                    assert time.monotonic() < deadline and thread.is_alive()
                    time.sleep(0.02)
                    probe.rollback()
            writer.execute(text(
                "UPDATE memstore_messages SET tool_calls = CAST(:calls AS jsonb), "
                "token_count = 1 WHERE conversation_id = 'tools' AND seq = 2"),
                {"calls": json.dumps([{"id": c["id"], "name": c["function"]["name"],
                                       "arguments": c["function"]["arguments"]}
                                      for c in calls])})
            writer.execute(text(
                "UPDATE memstore_conversations SET epoch = 12345, token_count = (SELECT "
                "sum(token_count) FROM memstore_messages WHERE conversation_id = 'tools') "
                "WHERE id = 'tools'"))
            writer.commit()
        thread.join(60)
        assert not thread.is_alive() and not errors
        assert migrate.current(url) == (RECOUNT,)
        rows, conversations = _snapshot(url)
        with MemoryStore(url, counter=tiktoken, migrate="upgrade") as store:
            tools = {m.seq: m for m in store.messages("tools")}
        assert len(tools[2].tool_calls or ()) == 3
        for seq in (2, 12):  # read again under the lock, and the one row not changed
            assert rows["tools", seq] == (tiktoken.count_message(tools[seq]), TIKTOKEN)
        assert conversations["tools"][0] == sum(m.token_count for m in tools.values())
        assert conversations["tools"][1] not in (12345, 0)
    finally:
        engine.dispose()


def _second_empty_db(empty_db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Another brand-new database of the same kind as ``empty_db_url``."""
    if empty_db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'second.db'}"
    server = request.getfixturevalue("postgres")
    return str(server.create_database("memstore_mig"))


def _at_head_with_tables(url: str) -> None:
    assert migrate.is_current(url)
    assert _tables(url) >= MEMSTORE_TABLES
    with MemoryStore(url, counter=FixedCounter(), migrate="upgrade") as store:
        store.append("c", Message.user("hi"))
        assert store.get_message("c", 1).text == "hi"


def test_two_databases_migrated_at_once_by_threads(
    empty_db_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Alembic's context is process-wide: two migrations of different databases at once
    # used to run one's DDL through the other's context (or fail with a KeyError).
    import threading

    urls = [empty_db_url, _second_empty_db(empty_db_url, request, tmp_path)]
    for _ in range(4):
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def open_store(url: str, barrier: threading.Barrier, errors: list[BaseException]
                       ) -> None:
            try:
                barrier.wait()
                MemoryStore(url, counter=FixedCounter(), migrate="upgrade").close()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=open_store, args=(u, barrier, errors))
                   for u in urls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for url in urls:
            _at_head_with_tables(url)
        # Downgrades at once too, then the next round upgrades again.
        downs = [threading.Thread(target=migrate.downgrade, args=(u, "base")) for u in urls]
        for t in downs:
            t.start()
        for t in downs:
            t.join(60)
        for url in urls:
            assert migrate.current(url) == ()
            assert not MEMSTORE_TABLES & _tables(url)


async def test_two_async_stores_migrate_their_databases_at_once(
    empty_db_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    import asyncio

    from memstore.aio import AsyncMemoryStore

    urls = [empty_db_url, _second_empty_db(empty_db_url, request, tmp_path)]
    if urls[0].startswith("sqlite"):
        urls = [u.replace("sqlite://", "sqlite+aiosqlite://") for u in urls]
    for _ in range(3):
        stores = [AsyncMemoryStore(u, counter=FixedCounter(), migrate="upgrade") for u in urls]
        try:
            # One task waits for the other's migration without blocking the event loop.
            await asyncio.wait_for(asyncio.gather(*(s.setup() for s in stores)), 60)
        finally:
            for s in stores:
                await s.close()
        sync_urls = [u.replace("+aiosqlite", "") for u in urls]
        for url in sync_urls:
            _at_head_with_tables(url)
            migrate.downgrade(url, "base")

"""The hash-partitioned PostgreSQL layout (``memstore db create-partitioned``).

``memstore_conversations`` and ``memstore_messages`` are hash-partitioned by the
conversation id (8 partitions). This is the single-node analogue of a Citus
deployment: the store contract tests run again on it unchanged, and ``EXPLAIN`` of
every statement the store runs for one conversation (the precompiled window reads and
everything SQLAlchemy executes for appends, reads, scores, pins, pops, truncation,
state and deletion) touches one partition of each table, the same one for both, in
custom and in generic (prepared) plans.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql as pgsql
from sqlalchemy import create_engine, event, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Engine

from memstore import migrate
from memstore._db import statements as q
from memstore._db.schema import VERSION_TABLE
from memstore.errors import ConfigurationError, SchemaTooNewError
from memstore.models import Message, ToolCall
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter
from memstore.views import (
    BufferedView,
    HeadAndTailView,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
)
from memstore.views.summary import SummaryView
from tests import (
    test_async,
    test_bad_input,
    test_cache,
    test_store,
    test_summaries,
    test_windows,
)
from tests.test_cache import pair  # noqa: F401  (a fixture the cache tests take)

pytestmark = pytest.mark.postgres

PARTITIONS = 8
TABLES = ("memstore_conversations", "memstore_messages", "memstore_summaries")
PARTITION_NAME = re.compile(
    r"\b(memstore_conversations|memstore_messages|memstore_summaries)_p(\d+)\b")


@pytest.fixture(scope="module")
def partitioned_url(postgres: Any) -> str:
    url: str = postgres.create_database("memstore_part")
    migrate.create_partitioned(url, PARTITIONS)
    return url


def _empty(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE memstore_summaries, memstore_messages, "
                          "memstore_conversation_keys, memstore_conversations, memstore_audit "
                          "RESTART IDENTITY"))
    engine.dispose()


@pytest.fixture
def db_url(partitioned_url: str) -> str:
    """Overrides conftest's: the contract tests below run on the partitioned database."""
    _empty(partitioned_url)
    return partitioned_url


# ---- the store contract, again, on the partitioned layout ------------------------------------
#
# The tests of the store, window, async, cache, bad-input and summaries modules that take a store,
# a pair of stores or a database url are collected here a second time; the ``db_url``
# fixture above points them at the partitioned database (conftest's ``store`` fixture
# builds sync and async stores on it).

#: Not about the layout: event-loop responsiveness while a driver call runs, and a test that
#: migrates the database down and back up (which re-creates tables unpartitioned).
_NOT_LAYOUT = {
    "test_event_loop_keeps_running_during_a_large_extend",
    "test_a_driver_error_on_the_window_path_is_a_memstore_error",
}

for _module in (test_store, test_windows, test_async, test_cache, test_bad_input,
                test_summaries):
    for _name, _test in inspect.getmembers(_module, inspect.isfunction):
        if _name.startswith("test_") and _name not in _NOT_LAYOUT and {
            "store", "db_url", "pair"
        } & set(inspect.signature(_test).parameters):
            globals()[f"{_name}__partitioned"] = _test


# ---- the layout ------------------------------------------------------------------------------


def _schema(engine: Engine) -> dict[str, Any]:
    """Columns, keys, constraints and indexes of memstore's tables, as reflected."""
    insp = sa_inspect(engine)
    out: dict[str, Any] = {}
    for table in TABLES:
        out[table] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"], c["default"])
                        for c in insp.get_columns(table)],
            "pk": insp.get_pk_constraint(table),
            "unique": sorted((u["name"], tuple(u["column_names"]))
                             for u in insp.get_unique_constraints(table)),
            # (PostgreSQL also lists the internal per-partition copies of a foreign key to
            # a partitioned table; the key itself is the one naming the parent.)
            "fks": [(f["name"], f["constrained_columns"], f["referred_table"],
                     f["referred_columns"], f["options"]) for f in insp.get_foreign_keys(table)
                    if f["referred_table"] in TABLES],
            "checks": sorted((c["name"], c["sqltext"]) for c in insp.get_check_constraints(table)),
            "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]),
                               str(i.get("dialect_options", {}).get("postgresql_where")))
                              for i in insp.get_indexes(table)),
        }
    return out


def test_layout_is_the_migrated_schema_hash_partitioned(partitioned_url: str,
                                                        pg_url: str) -> None:
    part, plain = create_engine(partitioned_url), create_engine(pg_url)
    try:
        assert _schema(part) == _schema(plain)
        migrate.check(partitioned_url)  # stamped at head
        assert migrate.current(partitioned_url) == migrate.heads()
        with part.connect() as conn:
            rows = conn.execute(text(
                "SELECT c.relname, p.partstrat, a.attname, "
                "(SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) "
                "FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
                "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = p.partattrs[0] "
                "ORDER BY c.relname"
            )).all()
        assert [tuple(r) for r in rows] == [
            ("fts_memstore_messages", "h", "conversation_id", PARTITIONS),  # search index
            ("memstore_conversation_keys", "h", "conversation_id", PARTITIONS),
            ("memstore_conversations", "h", "id", PARTITIONS),
            ("memstore_messages", "h", "conversation_id", PARTITIONS),
            ("memstore_summaries", "h", "conversation_id", PARTITIONS),
        ]
    finally:
        part.dispose()
        plain.dispose()


def test_a_conversation_and_its_messages_share_one_partition_number(db_url: str) -> None:
    store = MemoryStore(db_url, counter=FixedCounter(1))
    try:
        for i in range(40):
            store.extend(f"conv-{i}", [Message.user("q"), Message.assistant("a")])
    finally:
        store.close()
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT c.id, c.tableoid::regclass::text, "
            "array_agg(DISTINCT m.tableoid::regclass::text) "
            "FROM memstore_conversations c JOIN memstore_messages m ON m.conversation_id = c.id "
            "GROUP BY 1, 2"
        )).all()
    engine.dispose()
    assert len(rows) == 40
    used = set()
    for _, conv_part, message_parts in rows:
        assert len(message_parts) == 1
        assert conv_part.rsplit("_p", 1)[1] == message_parts[0].rsplit("_p", 1)[1]
        used.add(conv_part)
    assert len(used) > 1  # the hash spreads conversations


def test_create_partitioned_refuses_clearly(partitioned_url: str, tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="already exist"):
        migrate.create_partitioned(partitioned_url)
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        migrate.create_partitioned(f"sqlite:///{tmp_path / 'x.db'}")
    for bad in (0, 1025, "8", True):
        with pytest.raises(ConfigurationError, match="partitions"):
            migrate.partitioned_ddl(bad)  # type: ignore[arg-type]


def test_the_layout_is_created_after_a_downgrade_to_base(postgres: Any) -> None:
    """A downgrade to base leaves Alembic's version table, empty: a database without
    memstore's tables, in which the partitioned layout may be created; a version table
    holding a revision still means memstore's schema is there."""
    url = postgres.create_database("memstore_part_base")
    migrate.upgrade(url)
    migrate.downgrade(url, "base")
    migrate.create_partitioned(url, 2)
    assert migrate.is_current(url)
    with MemoryStore(url, migrate="check") as store:
        store.append("c", Message.user("hi"))
        assert [m.text for m in store.messages("c")] == ["hi"]
    other = postgres.create_database("memstore_part_version")
    engine = create_engine(other)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text(f"INSERT INTO {VERSION_TABLE} VALUES ('0001_initial')"))
    engine.dispose()
    with pytest.raises(ConfigurationError, match="already exist"):
        migrate.create_partitioned(other, 2)
    # A revision of a newer memstore is named as such (it was "tables already exist").
    engine = create_engine(other)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'"))
    engine.dispose()
    with pytest.raises(SchemaTooNewError, match="9999_from_the_future"):
        migrate.create_partitioned(other, 2)


def test_a_downgrade_that_would_leave_the_layout_half_plain_is_refused(postgres: Any) -> None:
    """Downgrading the partitioned layout below 0003 dropped memstore_summaries, and the
    next upgrade created it unpartitioned while `db check` passed."""
    url = postgres.create_database("memstore_part_down")
    migrate.create_partitioned(url, 2)
    for target in ("0005", "0003_summaries", "0002_conversation_epoch", "0001_initial", "-2"):
        with pytest.raises(ConfigurationError, match="partitioned layout"):
            migrate.downgrade(url, target)
    assert migrate.is_current(url)
    migrate.downgrade(url, "0006_lifecycle")  # keeps every table: allowed
    migrate.upgrade(url)
    migrate.downgrade(url, "base")  # drops every table: allowed
    migrate.create_partitioned(url, 2)
    engine = create_engine(url)
    with engine.connect() as conn:
        kinds = dict(conn.execute(text(
            "SELECT relname, relkind FROM pg_class WHERE relname IN "
            "('memstore_conversations', 'memstore_messages', 'memstore_summaries')")).all())
    engine.dispose()
    assert set(kinds.values()) == {"p"}


def test_cli_prints_the_ddl_for_a_dba() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memstore", "db", "create-partitioned", "--partitions", "4",
         "--sql", "--url", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
        capture_output=True, text=True, check=True,
    )
    ddl = result.stdout
    assert "PARTITION BY HASH (id)" in ddl and "PARTITION BY HASH (conversation_id)" in ddl
    assert ddl.count("FOR VALUES WITH (MODULUS 4,") == 20  # four tables and the search index
    assert "WHERE anchored" in ddl and "ON DELETE CASCADE" in ddl
    assert f"VALUES ('{migrate.heads()[0]}')" in ddl
    assert ddl.startswith("BEGIN;") and ddl.rstrip().endswith("COMMIT;")


# ---- every hot statement touches one partition -----------------------------------------------


@pytest.fixture
def recorded(db_url: str) -> Iterator[tuple[Engine, list[tuple[str, Any]]]]:
    """An engine whose executed statements (SQL text and driver parameters) are recorded."""
    engine = create_engine(db_url)
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        seen.append((statement, parameters[0] if executemany else parameters))

    event.listen(engine, "before_cursor_execute", record)
    yield engine, seen
    engine.dispose()


def _workload(store: MemoryStore) -> None:
    """Every per-conversation operation of the store (list_conversations aside)."""
    cid = "hot-conversation"
    store.create_conversation(cid, metadata={"tenant": "t1"})
    store.append(cid, Message.system("be brief"))
    store.extend(cid, [Message.user(f"question {i}", id=f"k{i}") for i in range(6)])
    store.extend(cid, [Message.user("question 0", id="k0")])  # idempotent retry: id lookup
    store.append(cid, Message.assistant(tool_calls=[ToolCall(id="t1", name="f")]))
    store.append(cid, Message.tool("result", tool_call_id="t1"))
    store.append(cid, Message.assistant("answer"))
    for view in (UnboundedView(), BufferedView(3), HeadAndTailView(2, 2),
                 TokenLimitedView(12, reserve=2), ScoreBasedView(12, half_life=60.0),
                 RecentTurnsView(2)):
        store.window(cid, view)
    store.messages(cid)
    store.messages(cid, start=2, stop=5, limit=2, newest_first=True)
    store.get_message(cid, 3)
    store.get_conversation(cid)
    store.count_tokens(cid)
    store.set_score(cid, 3, 4.0)
    store.pin(cid, 4)
    store.window(cid, TokenLimitedView(12))
    store.unpin(cid, 4)
    store.pop(cid, 1)
    store.summarize(cid, lambda ms: f"{len(ms)} messages", keep_tokens=2)
    store.summaries(cid)
    store.window(cid, SummaryView(40))
    store.truncate(cid, before_seq=3)
    state = store.save_state(cid)
    store.load_state(state, "hot-copy")
    store.load_state(state, "hot-copy")  # replacing a stored conversation
    store.append("hot-append", Message.user("already here"))
    store.load_state(state, "hot-append", replace=False)
    store.clear("hot-copy")
    store.delete_conversation("hot-copy")
    store.delete_conversation("hot-append")


def _positional(statement: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders as ``$n`` (for PREPARE), and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement), names


def _partitions(plan: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for table, number in PARTITION_NAME.findall(plan):
        found.setdefault(table, set()).add(number)
    return found


def test_every_hot_statement_touches_one_partition(
    recorded: tuple[Engine, list[tuple[str, Any]]]
) -> None:
    engine, seen = recorded
    store = MemoryStore(engine=engine, counter=FixedCounter(1), cache_size=0)
    try:
        _workload(store)
        epoch = store.get_conversation("hot-conversation")
    finally:
        store.close()
    assert epoch is not None
    statements = [(s, p) for s, p in seen
                  if re.search(r"\bmemstore_(messages|conversations|summaries)\b", s)]
    # The precompiled window reads run on the DBAPI cursor (not seen by SQLAlchemy's
    # events): explain each of them directly.
    values = {"cid": "hot-conversation", "start": 2, "stop": 6, "before": 8, "limit": 4, "last": 9,
              "epoch": 12345, "budget": 4000.0, "cached_epoch": 12345, "cached_last": 3}
    for name in q._hot_statements():
        compiled = q.hot(engine.dialect, name)
        needed = set(re.findall(r"%\((\w+)\)s", compiled.sql))
        statements.append((compiled.sql, compiled.params(
            {k: v for k, v in values.items() if k in needed})))
    assert len({s for s, _ in statements}) >= 20
    kinds = {s.split(None, 1)[0].upper() for s, _ in statements}
    assert {"SELECT", "INSERT", "UPDATE", "DELETE"} <= kinds
    assert not [s for s, _ in statements if "ORDER BY memstore_conversations.id" in s], (
        "list_conversations is not a per-conversation statement")

    checked = 0
    with engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        for index, (statement, params) in enumerate(statements):
            kind = statement.split(None, 1)[0].upper()
            plans = []
            custom = conn.exec_driver_sql("EXPLAIN " + statement, params).all()
            plans.append(("custom", "\n".join(r[0] for r in custom)))
            if kind in ("SELECT", "UPDATE", "DELETE"):
                # A generic plan (what a prepared statement may run) prunes at startup.
                conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
                positional, names = _positional(statement)
                conn.exec_driver_sql(f"PREPARE memstore_explain_{index} AS {positional}")
                literals = ", ".join(pgsql.Literal(params[n]).as_string(raw) for n in names)
                generic = conn.exec_driver_sql(
                    f"EXPLAIN EXECUTE memstore_explain_{index}({literals})").all()
                conn.exec_driver_sql(f"DEALLOCATE memstore_explain_{index}")
                conn.exec_driver_sql("RESET plan_cache_mode")
                plans.append(("generic", "\n".join(r[0] for r in generic)))
            for mode, plan in plans:
                if mode == "generic":
                    # A generic UPDATE/DELETE plan lists every partition as a possible
                    # result relation; the scan feeding it is pruned to one partition at
                    # executor startup ("Subplans Removed"), so only that one is touched.
                    plan = "\n".join(line for line in plan.splitlines() if "Scan" in line)
                found = _partitions(plan)
                where = f"{mode} plan of:\n{statement}\n{plan}"
                # one partition of each table, and the same partition number for both
                assert all(len(numbers) == 1 for numbers in found.values()), where
                assert len(set().union(*found.values()) if found else set()) <= 1, where
                if kind != "INSERT":  # an INSERT routes its rows; it scans nothing
                    assert found, where
                checked += 1
        conn.rollback()
    assert checked >= len(statements)


# ---- search: a search of one conversation reads one partition --------------------------------

SEARCH_PARTITION = re.compile(
    r"\b(fts_memstore_messages|memstore_messages|memstore_conversations|"
    r"memstore_conversation_keys|memstore_summaries)_p(\d+)\b")


def test_a_conversation_scoped_search_touches_one_partition(
    recorded: tuple[Engine, list[tuple[str, Any]]]
) -> None:
    """Every statement of ``search(conversation_id=...)`` (the ranked hits and their
    context) touches one partition of each table, the index's included, in custom and in
    generic plans. A search of every conversation fans out to every partition (and, on
    Citus, to every shard): docs/search.md says so."""
    from datetime import datetime, timedelta, timezone

    engine, seen = recorded
    store = MemoryStore(engine=engine, counter=FixedCounter(1), cache_size=0)
    try:
        for i in range(24):
            store.extend(f"other-{i}", [Message.user("flight to paris"),
                                        Message.assistant("paris flight booked")])
        store.extend("scoped", [Message.user(f"note {i} flight paris") for i in range(6)])
        seen.clear()
        store.search("flight paris", conversation_id="scoped", context=1)
        store.search("flight -note OR paris", conversation_id="scoped", roles=["user"],
                     since=datetime.now(timezone.utc) - timedelta(hours=1), context=2,
                     limit=3)
    finally:
        store.close()
    statements = [(s, p) for s, p in seen if "memstore_messages" in s]
    assert len(statements) >= 3
    with engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        for index, (statement, params) in enumerate(statements):
            custom = conn.exec_driver_sql("EXPLAIN " + statement, params).all()
            conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            positional, names = _positional(statement)
            conn.exec_driver_sql(f"PREPARE memstore_search_explain_{index} AS {positional}")
            literals = ", ".join(pgsql.Literal(params[n]).as_string(raw) for n in names)
            generic = conn.exec_driver_sql(
                f"EXPLAIN EXECUTE memstore_search_explain_{index}({literals})").all()
            conn.exec_driver_sql(f"DEALLOCATE memstore_search_explain_{index}")
            conn.exec_driver_sql("RESET plan_cache_mode")
            for mode, rows in (("custom", custom), ("generic", generic)):
                plan = "\n".join(r[0] for r in rows)
                found: dict[str, set[str]] = {}
                for table, number in SEARCH_PARTITION.findall(plan):
                    found.setdefault(table, set()).add(number)
                where = f"{mode} plan of:\n{statement}\n{plan}"
                assert found, where
                assert all(len(numbers) == 1 for numbers in found.values()), where
                assert len(set().union(*found.values())) == 1, where
        conn.rollback()

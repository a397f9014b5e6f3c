"""Migration 0005: the search index of a populated database, up, down and up again.

Also: a Python whose sqlite3 lacks FTS5 (the migration succeeds, the store works, search
says what is missing and how to fix it), the English configuration chosen at upgrade
time, offline SQL, a rebuild, and an older partitioned layout upgraded in place.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore import migrate
from memstore._db import search as _search
from memstore.errors import ConfigurationError, MissingDependencyError
from memstore.models import Message
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter

BEFORE = "0004_recount_changed_rules"


def _populate_0004(url: str, conversations: int = 5, per: int = 9) -> None:
    """Rows as memstore at revision 0004 wrote them (plain SQL: no store of that version)."""
    engine = create_engine(url)
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    stamp: Any = now.replace(tzinfo=None) if url.startswith("sqlite") else now
    with engine.begin() as conn:
        for c in range(conversations):
            cid = f"old-{c}"
            conn.execute(text(
                "INSERT INTO memstore_conversations (id, created_at, updated_at, metadata, "
                "first_seq, last_seq, token_count, max_score, epoch) VALUES (:id, :t, :t, "
                ":meta, 1, :last, 0, 1.0, 7)"),
                {"id": cid, "t": stamp, "meta": json.dumps({"n": c}), "last": per})
            for seq in range(1, per + 1):
                kind = seq % 3
                conn.execute(text(
                    "INSERT INTO memstore_messages (conversation_id, seq, message_id, role, "
                    "content_text, content_parts, tool_calls, score, pinned, anchored, "
                    "token_count, token_counter, created_at) VALUES (:cid, :seq, :mid, :role, "
                    ":text, :parts, :calls, 1.0, false, false, 1, 'fixed', :t)"), {
                        "cid": cid, "seq": seq, "mid": f"m{c}-{seq}",
                        "role": "assistant" if kind == 2 else "user",
                        "text": f"ancient {c} scroll {seq}" if kind == 0 else None,
                        "parts": json.dumps([{"type": "text", "text": f"papyrus {c}-{seq}"}])
                        if kind == 1 else None,
                        "calls": json.dumps([{"id": f"t{seq}", "name": "lookup_archive",
                                              "arguments": f'{{"shelf": "s{c}x{seq}"}}'}])
                        if kind == 2 else None,
                        "t": stamp})
    engine.dispose()


def _index_objects(url: str) -> set[str]:
    engine = create_engine(url)
    with engine.connect() as conn:
        if url.startswith("sqlite"):
            rows = conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE name LIKE '%search%' OR name LIKE "
                "'fts_memstore%'").scalars()
        else:
            rows = conn.execute(text(
                "SELECT relname FROM pg_class WHERE relname LIKE 'fts_memstore%' UNION ALL "
                "SELECT proname FROM pg_proc WHERE proname LIKE 'memstore_search%' UNION ALL "
                "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'memstore_search%'")).scalars()
        names = set(rows)
    engine.dispose()
    return names


def test_upgrading_a_populated_0004_database_indexes_its_messages(
        empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.upgrade(empty_db_url, BEFORE)
    _populate_0004(empty_db_url)
    assert _index_objects(empty_db_url) == set()
    monkeypatch.setattr(_search, "BACKFILL_BATCH", 7)  # several batches
    migrate.upgrade(empty_db_url)
    with MemoryStore(empty_db_url, counter=FixedCounter(), migrate="check") as store:
        assert len(store.search("ancient", limit=100)) == 5 * 3
        assert len(store.search("papyrus", limit=100)) == 5 * 3
        assert {(h.conversation_id, h.seq) for h in store.search("s3x8")} == {("old-3", 8)}
        assert {(h.conversation_id, h.seq) for h in store.search('"scroll 6"')} == {
            (f"old-{c}", 6) for c in range(5)}
        store.append("old-1", Message.user("ancient new"))
        assert len(store.search("ancient", limit=100)) == 16

    # down to 0004: the index goes, the messages stay
    migrate.downgrade(empty_db_url, BEFORE)
    assert _index_objects(empty_db_url) == set()
    engine = create_engine(empty_db_url)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM memstore_messages")).scalar() == 46
        conn.execute(text("DELETE FROM memstore_messages WHERE conversation_id = 'old-0'"))
    engine.dispose()

    # and up again: the index is built from what is stored now
    migrate.upgrade(empty_db_url)
    with MemoryStore(empty_db_url, counter=FixedCounter(), migrate="check") as store:
        assert len(store.search("ancient", limit=100)) == 4 * 3 + 1
        assert store.search("ancient", conversation_id="old-0") == []


def test_backfill_reports_progress(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    migrate.upgrade(url, BEFORE)
    _populate_0004(url, conversations=3, per=10)
    seen: list[tuple[int, int]] = []
    engine = create_engine(url)
    with engine.begin() as conn:
        _search.BACKFILL_BATCH, saved = 4, _search.BACKFILL_BATCH
        try:
            assert _search.create_index(conn, progress=lambda d, t: seen.append((d, t)))
        finally:
            _search.BACKFILL_BATCH = saved
    engine.dispose()
    assert seen[-1] == (30, 30)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) >= 8


def test_terminal_progress_draws_one_line() -> None:
    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def isatty(self) -> bool:
            return True

        def write(self, value: str) -> None:
            self.text += value

        def flush(self) -> None:
            pass

    class Pipe(Terminal):
        def isatty(self) -> bool:
            return False

    assert _search.terminal_progress(Pipe()) is None
    out = Terminal()
    show = _search.terminal_progress(out)
    assert show is not None
    show(10_000, 25_000)
    show(25_000, 25_000)
    assert out.text == ("\rmemstore: indexing messages for search: 10,000 of 25,000 (40%)"
                        "\rmemstore: indexing messages for search: 25,000 of 25,000 (100%)\n")


def test_without_fts5_the_store_works_and_search_says_why(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'nofts.db'}"
    monkeypatch.setattr(_search, "fts5_available", lambda conn: False)
    migrate.upgrade(url)  # does not fail
    assert _index_objects(url) == set()
    with MemoryStore(url, counter=FixedCounter()) as store:
        store.extend("c", [Message.user("still works"), Message.assistant("yes")])
        assert [m.text for m in store.messages("c")] == ["still works", "yes"]
        with pytest.raises(MissingDependencyError, match="FTS5") as raised:
            store.search("works")
        assert "memstore search --rebuild-index" in str(raised.value)
    monkeypatch.undo()
    # this Python has FTS5: the index can be created afterwards (what the fix runs)
    engine = create_engine(url)
    with engine.begin() as conn:
        with pytest.raises(ConfigurationError, match="no search index"):
            _search.index_language(conn)
        assert _search.rebuild_index(conn)
    engine.dispose()
    with MemoryStore(url, counter=FixedCounter()) as store:
        assert [h.seq for h in store.search("works")] == [1]


def test_the_english_configuration_stems(empty_db_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_search.LANGUAGE_VARIABLE, "english")
    migrate.upgrade(empty_db_url)
    monkeypatch.delenv(_search.LANGUAGE_VARIABLE)
    with MemoryStore(empty_db_url, counter=FixedCounter()) as store:
        store.extend("c", [Message.user("She runs every morning"),
                           Message.user("The runner was running late"),
                           Message.user("Nothing here")])
        assert {h.seq for h in store.search("run")} == {1, 2}
        assert {h.seq for h in store.search("running")} == {1, 2}
        (hit,) = store.search("mornings")
        assert "[morning]" in hit.snippet
        assert {h.seq for h in store.search("run", conversation_id="c")} == {1, 2}
        with store.engine.begin() as conn:
            assert _search.index_language(conn) == "english"
            _search.rebuild_index(conn, "simple")  # a rebuild may change it
        assert {h.seq for h in store.search("run")} == set()


def test_an_unknown_configuration_is_refused(tmp_path: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_search.LANGUAGE_VARIABLE, "klingon")
    with pytest.raises(ConfigurationError, match="simple, english"):
        migrate.upgrade(f"sqlite:///{tmp_path / 'k.db'}")


@pytest.mark.parametrize("url", ["sqlite:///x.db", "postgresql+psycopg://u@h/d"])
def test_offline_sql_creates_and_drops_the_index(url: str) -> None:
    up = migrate.upgrade(url, f"{BEFORE}:0005", sql=True)
    assert up is not None and _search.INDEX in up and "memstore_search_insert" in up
    down = migrate.downgrade(url, f"0005:{BEFORE}", sql=True)
    assert down is not None and f"DROP TABLE IF EXISTS {_search.INDEX}" in down


def test_rebuild_repairs_an_index_emptied_by_hand(db_url: str) -> None:
    with MemoryStore(db_url, counter=FixedCounter()) as store:
        store.extend("c", [Message.user("violet"), Message.user("violet again")])
        with store.engine.begin() as conn:
            if db_url.startswith("sqlite"):
                conn.exec_driver_sql(
                    f"INSERT INTO {_search.INDEX}({_search.INDEX}) VALUES ('delete-all')")
            else:
                conn.exec_driver_sql(f"DELETE FROM {_search.INDEX}")
        assert store.search("violet") == []
        with store.engine.begin() as conn:
            assert _search.rebuild_index(conn)
        assert len(store.search("violet")) == 2


@pytest.mark.postgres
def test_an_older_partitioned_layout_gets_a_partitioned_index(postgres: Any) -> None:
    """A partitioned database created before 0005 (the layout at head, without the index,
    stamped 0004) is upgraded to 0005: the index is partitioned like its messages."""
    from memstore._db.schema import VERSION_TABLE

    url = postgres.create_database("memstore_part_search")
    migrate.create_partitioned(url, 4)
    engine = create_engine(url)
    with engine.begin() as conn:
        _search.drop_index(conn)
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '{BEFORE}'"))
    engine.dispose()
    assert _index_objects(url) == set()
    _populate_0004(url)
    migrate.upgrade(url, "0005")
    engine = create_engine(url)
    with engine.connect() as conn:
        parts = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = "
            f"'{_search.INDEX}'::regclass").scalar()
        rows = conn.exec_driver_sql(f"SELECT count(*) FROM {_search.INDEX}").scalar()
    engine.dispose()
    assert (parts, rows) == (4, 45)


def test_the_search_language_is_an_argument_of_the_upgrade(
        empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from memstore.errors import InvalidInputError

    monkeypatch.setenv(_search.LANGUAGE_VARIABLE, "simple")  # the argument wins
    with pytest.raises(InvalidInputError, match="search_language must be one of"):
        migrate.upgrade(empty_db_url, search_language="klingon")
    assert migrate.current(empty_db_url) == ()  # nothing was written
    migrate.upgrade(empty_db_url, search_language="english")
    assert migrate.search_index_language(empty_db_url) == "english"
    migrate.upgrade(empty_db_url, search_language="english")  # the same: nothing to do
    with pytest.raises(InvalidInputError, match=r"already 'english'.*--rebuild-index"):
        migrate.upgrade(empty_db_url, search_language="simple")
    with MemoryStore(empty_db_url, counter=FixedCounter()) as store:
        store.append("c", Message.user("The runner was running"))
        assert [h.seq for h in store.search("run")] == [1]


def test_the_cli_upgrade_takes_the_search_language(tmp_path: Any, capsys: Any) -> None:
    from memstore.cli import main

    url = f"sqlite:///{tmp_path / 'lang.db'}"
    assert main(["db", "upgrade", "--url", url, "--search-language", "english"]) == 0
    assert migrate.search_index_language(url) == "english"
    assert main(["db", "upgrade", "--url", url, "--search-language", "simple"]) != 0
    err = capsys.readouterr().err
    assert "already 'english'" in err and "Traceback" not in err
    ddl = migrate.upgrade("postgresql+psycopg://u@h/d", sql=True, search_language="english")
    assert ddl is not None and "'english'::regconfig" in ddl
    ddl = migrate.upgrade("sqlite:///x.db", sql=True, search_language="english")
    assert ddl is not None and "porter" in ddl
    partitioned = migrate.create_partitioned("postgresql+psycopg://u@h/d", 2, sql=True,
                                             search_language="english")
    assert partitioned is not None and "'english'::regconfig" in partitioned


def test_rebuild_search_index_is_public(empty_db_url: str, tmp_path: Any) -> None:
    from memstore.errors import InvalidInputError, SchemaOutOfDateError

    # A database of its own: the rebuild changes the index's language, which the shared
    # test database must keep ("simple") for the tests after this one.
    db_url = empty_db_url
    migrate.upgrade(db_url)
    with MemoryStore(db_url, counter=FixedCounter()) as store:
        store.extend("c", [Message.user(f"walrus {i}") for i in range(25)])
    with pytest.raises(InvalidInputError, match="search_language must be one of"):
        migrate.rebuild_search_index(db_url, "klingon")
    with pytest.raises(InvalidInputError, match="progress"):
        migrate.rebuild_search_index(db_url, progress=3)  # type: ignore[arg-type]
    seen: list[tuple[int, int]] = []
    assert migrate.rebuild_search_index(
        db_url, "english", progress=lambda done, total: seen.append((done, total))) == 25
    assert seen and seen[-1] == (25, 25)
    assert migrate.search_index_language(db_url) == "english"
    assert migrate.rebuild_search_index(db_url) == 25  # keeps the index's configuration
    assert migrate.search_index_language(db_url) == "english"
    with MemoryStore(db_url, counter=FixedCounter()) as store:
        assert len(store.search("walrus", limit=100)) == 25
    missing = tmp_path / "nowhere.db"
    with pytest.raises(SchemaOutOfDateError):
        migrate.rebuild_search_index(f"sqlite:///{missing}")
    assert not missing.exists()

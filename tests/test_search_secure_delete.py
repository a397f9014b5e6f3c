"""Forget on SQLite 3.42 or newer: a few messages are deleted from the index in place.

FTS5 keeps a deleted row's words in older segments until they merge. A forget merges
the whole index afterwards (its cost grows with the index), except, from SQLite 3.42,
one that deletes few messages beside the index's size: FTS5's ``'secure-delete'``
removes those in place (slow per message, so only for a few). The index's format
number then becomes 5, which an older SQLite refuses even to drop: memstore names the
fix and its rebuild works there.

These tests need a newer SQLite than many Pythons have: they run it through the
``pysqlite3`` module (the ``pysqlite3-binary`` wheel bundles a recent SQLite; the dev
extra installs it on Linux x86-64) and skip, saying why, where it is missing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from memstore import MemoryStore, Message, migrate
from memstore._db import erasure as _erasure
from memstore._db.search import INDEX, SECURE_DELETE_SINCE
from memstore.errors import ConfigurationError
from memstore.tokens import FixedCounter
from tests.helpers import erasure_ways

newer = pytest.importorskip(
    "pysqlite3.dbapi2", reason="pysqlite3 (pip install pysqlite3-binary) is not installed: "
    "no SQLite with FTS5's secure-delete to test with")
if newer.sqlite_version_info < SECURE_DELETE_SINCE:  # pragma: no cover - an old wheel
    pytest.skip(f"pysqlite3's SQLite {newer.sqlite_version} predates FTS5's secure-delete",
                allow_module_level=True)

SYSTEM_IS_OLDER = sqlite3.sqlite_version_info < SECURE_DELETE_SINCE
PLANTED = "zq-planted-" + "7" * 12
TOKEN = "zqsecretword" + "4" * 9  # one word: the index holds it as a token


@pytest.fixture(autouse=True)
def _in_place_for_small_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """These stores are tiny: let a forget of most of one delete in place."""
    monkeypatch.setattr(_erasure, "IN_PLACE_FACTOR", 1)


def _store(path: Path, module: Any = newer) -> MemoryStore:
    return MemoryStore(f"sqlite:///{path}", counter=FixedCounter(), module=module)


def _fill(store: MemoryStore) -> None:
    store.create_conversation("x", {"user_id": "u1"})
    store.extend("x", [Message.user(f"my secret is {PLANTED} {TOKEN} ({i})") for i in range(50)])
    store.create_conversation("y", {"user_id": "u2"})
    store.extend("y", [Message.user(f"unrelated words, number {i}") for i in range(30)])


def _format(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"SELECT v FROM {INDEX}_config WHERE k = 'version'")
                   .fetchone()[0])


def _files(path: Path) -> list[Path]:
    return [p for p in path.parent.iterdir() if p.name.startswith(path.name)]


@pytest.mark.parametrize("index", ["in place", "rebuild", "merge"])
def test_forget_leaves_no_copy_where_sqlite_does_not_zero_by_default(
        tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """pysqlite3's SQLite is built with ``secure_delete`` off (Debian's, with it on):
    memstore turns it on for every connection, so the pages written before the forget
    hold no stale copies of its rows either; every way of purging the index."""
    if index != "in place":  # the forget is large beside the index
        monkeypatch.setattr(_erasure, "IN_PLACE_FACTOR", 800)
    chosen = erasure_ways(monkeypatch, force=None if index == "in place" else index)
    path = tmp_path / "m.db"
    store = _store(path)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA secure_delete").scalar() == 1
        _fill(store)
        store.forget(where={"user_id": "u1"})
        assert chosen == [index]
        for secret in (PLANTED, TOKEN):
            assert all(secret.encode() not in p.read_bytes() for p in _files(path)), secret
    finally:
        store.close()
    assert _format(path) == (5 if index == "in place" else 4)


def test_forget_deletes_from_the_index_in_place(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = _store(path)
    try:
        _fill(store)
        assert [h.message.conversation_id for h in store.search(TOKEN, limit=1)] == ["x"]
        report = store.forget(where={"user_id": "u1"})
        assert (report.conversations, report.messages) == (1, 50)
        assert store.search(TOKEN) == []
        assert sorted(h.message.seq for h in store.search("unrelated", limit=100)) == list(
            range(1, 31))
        with store.engine.connect() as conn:
            # in place, not merged: the option is off again (prunes stay cheap) and the
            # index is sound
            conn.exec_driver_sql(f"INSERT INTO {INDEX}({INDEX}) VALUES ('integrity-check')")
            options = dict(conn.exec_driver_sql(f"SELECT k, v FROM {INDEX}_config").all())
            assert options.get("secure-delete") == 0
    finally:
        store.close()
    assert _format(path) == 5


def test_a_failed_forget_leaves_the_option_as_it_was(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from memstore._db import lifecycle

    path = tmp_path / "m.db"
    store = _store(path)
    try:
        _fill(store)

        def fail(*args: Any) -> None:
            raise RuntimeError("the disk is gone")

        monkeypatch.setattr(lifecycle, "delete_contents", fail)
        with pytest.raises(RuntimeError):
            store.forget(where={"user_id": "u1"})
        monkeypatch.undo()
        with store.engine.connect() as conn:
            options = dict(conn.exec_driver_sql(f"SELECT k, v FROM {INDEX}_config").all())
        assert "secure-delete" not in options
        assert len(store.search(TOKEN, limit=100)) == 50
    finally:
        store.close()


@pytest.mark.skipif(not SYSTEM_IS_OLDER, reason=f"this Python's SQLite {sqlite3.sqlite_version} "
                    "reads the newer index format: nothing to recover from")
def test_an_older_sqlite_is_told_how_to_recover_and_can(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with _store(path) as store:
        _fill(store)
        store.forget(where={"user_id": "u1"})
    old = MemoryStore(f"sqlite:///{path}", counter=FixedCounter())  # the system's sqlite3
    try:
        for call in (lambda: old.search("unrelated"),
                     lambda: old.append("y", Message.user("more unrelated words"))):
            with pytest.raises(ConfigurationError, match="rebuild-index"):
                call()
        assert len(old.messages("y")) == 30  # nothing was written
        assert migrate.rebuild_search_index(f"sqlite:///{path}") == 30
        old.append("y", Message.user("more unrelated words"))
        assert len(old.search("unrelated", limit=100)) == 31
    finally:
        old.close()
    assert _format(path) == 4
    # the newer SQLite reads the rebuilt index as well
    with _store(path) as store:
        assert len(store.search("unrelated", limit=100)) == 31


@pytest.mark.parametrize("way", ["rebuild", "merge"])
def test_an_older_sqlite_forgets_by_rebuilding_or_merging_the_index(
        tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without secure-delete (this Python's SQLite, if older): the words go all the same,
    the index rebuilt from what stays (the forget is most of it, as here) or merged."""
    if not SYSTEM_IS_OLDER:
        pytest.skip(f"this Python's SQLite {sqlite3.sqlite_version} has secure-delete")
    chosen = erasure_ways(monkeypatch, force=way)
    path = tmp_path / "m.db"
    with MemoryStore(f"sqlite:///{path}", counter=FixedCounter()) as store:
        _fill(store)
        store.forget(where={"user_id": "u1"})
    assert chosen == [way]
    for secret in (PLANTED, TOKEN):
        assert all(secret.encode() not in p.read_bytes() for p in _files(path)), secret
    assert _format(path) == 4
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {INDEX}_config WHERE k = "
                                    "'secure-delete'").scalar() == 0
    engine.dispose()


def test_only_a_forget_small_beside_the_index_deletes_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_erasure, "IN_PLACE_FACTOR", 4)
    with _store(tmp_path / "m.db") as store:
        _fill(store)  # 80 messages indexed
        for messages, expected in ((20, "in place"), (21, "merge"), (0, "none"),
                                   (26, "merge"), (27, "rebuild")):
            with store.engine.connect() as conn, conn.begin():
                assert _erasure.begin(conn, lambda n=messages: n).way == expected, messages
                options = dict(conn.exec_driver_sql(f"SELECT k, v FROM {INDEX}_config").all())
                assert options.get("secure-delete", 0) == int(expected == "in place")
                triggers = conn.exec_driver_sql(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "
                    "AND name LIKE 'memstore_search_delete%'").scalar()
                assert triggers == (0 if expected == "rebuild" else 2)  # dropped to rebuild
                conn.rollback()

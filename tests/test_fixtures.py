"""The shared database fixtures (tests/conftest.py) give what they say.

``db_url`` copies one migrated SQLite file instead of migrating each test's file, and
empties the session's PostgreSQL database with ``DELETE`` instead of ``TRUNCATE``: these
tests hold both to what they replace, so that a new table, trigger or migration that
broke either would fail here rather than leave one test's rows to the next.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore import FixedCounter, MemoryStore, Message, migrate


def test_a_copied_migrated_sqlite_file_is_what_upgrade_makes(
    tmp_path: Path, migrated_sqlite: Any
) -> None:
    fresh = tmp_path / "fresh.db"
    migrate.upgrade(f"sqlite:///{fresh}")
    copied = migrated_sqlite(tmp_path / "copied.db")
    assert copied == f"sqlite:///{tmp_path / 'copied.db'}"
    assert (tmp_path / "copied.db").read_bytes() == fresh.read_bytes()
    assert migrate.is_current(copied)


@pytest.mark.postgres
def test_emptying_postgres_leaves_every_table_empty_and_restarts_the_audit_ids(
    pg_url: str
) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    with MemoryStore(pg_url, counter=FixedCounter()) as store:
        store.create_conversation("a", {"user_id": "u1"})
        store.extend("a", [Message.user(f"kestrel {i}") for i in range(6)])
        store.summarize("a", lambda messages: "a summary", keep_tokens=0)
        store.create_conversation("b", {"user_id": "u2"})
        store.extend("b", [Message.user("osprey")])
        assert store.forget(where={"user_id": "u2"}).audit_id is not None
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(text(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' "
                "AND table_name <> 'memstore_alembic_version'")).scalars().all()

            def counts() -> dict[str, int]:
                return {t: conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one()
                        for t in tables}

            assert len(tables) >= 6 and all(counts().values()), counts()  # all filled
            conn.rollback()
            _empty_pg(pg_url)
            assert counts() == dict.fromkeys(tables, 0)
    finally:
        engine.dispose()
    with MemoryStore(pg_url, counter=FixedCounter()) as store:
        store.create_conversation("c", {"user_id": "u3"})
        assert store.forget(where={"user_id": "u3"}).audit_id == 1  # as after RESTART IDENTITY
        assert store.search("kestrel") == [] and store.list_conversations() == []

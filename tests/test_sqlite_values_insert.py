"""SQLite's batch inserts: one multi-row INSERT per statement's worth of bound values.

``memstore._db.ops`` inserts a batch on SQLite as ``INSERT ... VALUES (...), (...)``
statements (each carrying as many rows as SQLite's limit on bound values allows)
rather than an ``executemany``. These tests shrink that limit so every batch spans
several statements, and hold the result to the same read-back, search-index and
all-or-nothing guarantees, on both paths that use it (the direct append path and
the transactional one, which client ids take) and on both stores.
"""

from __future__ import annotations

from typing import Any

import pytest

from memstore import MemoryStore, migrate
from memstore._db import ops as _ops
from memstore._db import statements as q
from memstore.errors import MemstoreError
from memstore.models import Message, TextPart, ToolCall
from memstore.tokens import FixedCounter
from tests.helpers import call

COLUMNS = len(q.values_messages.__globals__["messages"].c)


def _sync_engine(store: Any) -> Any:
    return getattr(store.engine, "sync_engine", store.engine)


def _batch(tag: str, n: int) -> list[Message]:
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(Message.user(f"{tag} plain{i} text"))
        elif i % 3 == 1:
            out.append(Message(role="user", content=[TextPart(text=f"{tag} part{i}")],
                               metadata={"i": i}))
        else:
            out.append(Message(role="assistant", tool_calls=[
                ToolCall(id=f"call_{tag}_{i}", name="lookup", arguments=f'{{"q": "{tag}{i}"}}')]))
            out.append(Message(role="tool", content=f"{tag} result{i}",
                               tool_call_id=f"call_{tag}_{i}"))
    return out


@pytest.fixture
def small_statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Two rows per statement: every batch of three or more spans several.

    Returns the row counts of the multi-row statements built (SQLite only).
    """
    monkeypatch.setattr(_ops, "sqlite_variable_limit", lambda: 2 * COLUMNS + 1)
    built: list[int] = []
    real = q.ValuesMessages.sql

    def sql(self: q.ValuesMessages, rows: int) -> str:
        built.append(rows)
        return real(self, rows)

    monkeypatch.setattr(q.ValuesMessages, "sql", sql)
    return built


def test_the_limit_is_read_from_the_library() -> None:
    from sqlalchemy.dialects import sqlite

    limit = _ops.sqlite_variable_limit()
    assert limit >= 999
    values = q.values_messages(sqlite.dialect())
    assert values.rows_per_statement(limit) == min(limit // COLUMNS, 500)
    assert values.rows_per_statement(COLUMNS - 1) == 1  # never zero rows
    assert values.sql(3).count("(?") == 3


@pytest.mark.parametrize("client_ids", [False, True], ids=["direct", "transactional"])
async def test_batches_spanning_statements_read_back_exactly(
        store: Any, small_statements: list[int], client_ids: bool) -> None:
    messages = _batch("alpha", 7)
    if client_ids:
        messages = [m.model_copy(update={"id": f"id-{i}"}) for i, m in enumerate(messages)]
    stored = await call(store.extend("c", messages))
    assert [s.seq for s in stored] == list(range(1, len(messages) + 1))
    if _sync_engine(store).dialect.name == "sqlite":  # two rows per statement
        n = len(messages)
        assert small_statements == [2] * (n // 2) + [1] * (n % 2)
    back = await call(store.messages("c"))
    assert back == stored
    for s, m in zip(back, messages):
        assert s.as_message().same_content(m)
        assert s.metadata == m.metadata
        if client_ids:
            assert s.id == m.id
    for i in range(7):
        word = (f"plain{i}", f"part{i}", f"result{i}")[i % 3]
        found = await call(store.search(word))
        assert [h.message.content for h in found] == [
            s.content for s in stored if word in str(s.content)], word


@pytest.mark.parametrize("client_ids", [False, True], ids=["direct", "transactional"])
def test_a_failing_row_in_a_later_statement_writes_nothing(
        tmp_path: Any, small_statements: list[int], client_ids: bool) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    store = MemoryStore(url, counter=FixedCounter())
    with store.engine.begin() as conn:  # the database refuses one row: the fifth
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON memstore_messages "
            "WHEN NEW.content_text = 'm4' BEGIN SELECT RAISE(ABORT, 'refused'); END")
    store.extend("c", [Message.user("before")])
    small_statements.clear()
    batch = [Message.user(f"m{i}") for i in range(6)]
    if client_ids:
        batch = [m.model_copy(update={"id": f"x{i}"}) for i, m in enumerate(batch)]
    with pytest.raises(MemstoreError):
        store.extend("c", batch)
    assert small_statements == [2, 2, 2]  # the third statement failed
    assert [m.content for m in store.messages("c")] == ["before"]
    assert store.search("m1") == []
    assert store.get_conversation("c").message_count == 1
    store.extend("c", [Message.user("after")])
    assert [m.seq for m in store.messages("c")] == [1, 2]
    store.close()

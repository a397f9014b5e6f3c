"""The append path on the DBAPI cursor (``memstore._db.ops.append_direct``).

Appends without client ids skip SQLAlchemy's statement machinery (SQLite: one
transaction of raw statements; PostgreSQL, one message: one statement in
autocommit). These tests hold it to the transactional path's guarantees on both
databases and both stores: exact read-back, all-or-nothing on failure with the
error translated, the conversation's counters, and the fallback for client ids.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from memstore import TokenLimitedView
from memstore._db import ops as _ops
from memstore._db import window as _window
from memstore.errors import ConflictError
from memstore.models import ImagePart, ImageURL, Message, TextPart, ToolCall
from tests.helpers import call


def _sync_engine(store: Any) -> Any:
    engine = store.engine
    return getattr(engine, "sync_engine", engine)


SHAPES = [
    Message.system("be brief"),
    Message.user("plain text"),
    Message(role="user", content=[TextPart(text="look"), ImagePart(
        image_url=ImageURL(url="https://example.com/a.png", detail="low"))], name="ann"),
    Message(role="assistant", content=None, tool_calls=[
        ToolCall(id="call_1", name="lookup", arguments='{"q": "x"}')]),
    Message(role="tool", content="result", tool_call_id="call_1", score=2.5,
            metadata={"k": [1, "two", None]}),
    Message(role="user", content="pinned", pinned=True),
]


@pytest.mark.parametrize("batch", [False, True], ids=["append", "extend"])
async def test_appended_rows_read_back_exactly(store: Any, batch: bool) -> None:
    if batch:
        written = await call(store.extend("c", SHAPES))
    else:
        written = [await call(store.append("c", m)) for m in SHAPES]
    assert [m.seq for m in written] == list(range(1, len(SHAPES) + 1))
    stored = await call(store.messages("c"))
    assert stored == written
    for original, back in zip(SHAPES, stored):
        assert back.same_content(original)
        assert back.created_at.tzinfo is not None
    conv = await call(store.get_conversation("c"))
    assert conv.message_count == len(SHAPES)
    assert conv.token_count == sum(m.token_count for m in stored)
    # the window sees them (the pinned message and the system prompt are anchored)
    window = await call(store.window("c", TokenLimitedView(10_000)))
    assert [m.seq for m in window.messages] == [m.seq for m in stored]


async def test_batch_text_that_copy_must_escape_reads_back_exactly(store: Any) -> None:
    """On PostgreSQL a batch goes in as one ``COPY ... FROM STDIN`` (text format), where
    tabs, newlines, backslashes, ``\\.`` and ``\\N`` mean something: every such value
    must come back as sent, in text, JSON and metadata alike."""
    texts = ["tab\there", "line\nbreak", "cr\rreturn", "back\\slash", "\\.", "\\N",
             "end\\", "naïve 🚀 ünïcode", "", "'quote\" and,comma"]
    batch = [Message.user(t, metadata={"k": t, t: [t]}) for t in texts]
    batch.append(Message(role="assistant", content=None, tool_calls=[
        ToolCall(id="call\t1", name="f\\g", arguments='{"a": "\\n\\t\\\\"}')]))
    batch.append(Message(role="tool", content=[TextPart(text="\\.\n\\N")],
                         tool_call_id="call\t1", name="n\\m"))
    written = await call(store.extend("c", batch))
    stored = await call(store.messages("c"))
    assert stored == written
    for original, back in zip(batch, stored):
        assert back.same_content(original)
        assert back.metadata == original.metadata


@pytest.mark.parametrize("size", [1, 3])
async def test_failed_direct_append_writes_nothing(store: Any, monkeypatch: Any,
                                                   size: int) -> None:
    first = await call(store.append("c", Message.user("keep")))
    conv_before = await call(store.get_conversation("c"))
    # Every new row gets the stored row's message id: the insert violates
    # UNIQUE(conversation_id, message_id) after the seq was allocated.
    monkeypatch.setattr(_ops, "new_message_id", lambda: first.id)
    monkeypatch.setattr(_ops, "new_message_ids", lambda n: [first.id] * n)
    with pytest.raises(ConflictError):
        await call(store.extend("c", [Message.user(f"n{i}") for i in range(size)]))
    monkeypatch.undo()
    assert await call(store.messages("c")) == [first]
    assert await call(store.get_conversation("c")) == conv_before
    nxt = await call(store.append("c", Message.user("next")))
    assert nxt.seq == 2


async def test_append_without_ids_skips_sqlalchemy_execution(store: Any) -> None:
    await call(store.append("c", Message.user("create")))
    engine = _sync_engine(store)
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        await call(store.append("c", Message.user("fast")))
        fast = len(seen)
        await call(store.append("c", Message.user("with id", id="client-1")))
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert fast == 0
    assert len(seen) > 0  # a client id takes the transactional path (idempotency lookup)
    msgs = await call(store.messages("c"))
    assert [m.seq for m in msgs] == [1, 2, 3]


async def test_client_ids_keep_their_guarantees_next_to_direct_appends(store: Any) -> None:
    await call(store.append("c", Message.user("a")))
    kept = await call(store.append("c", Message.user("b", id="x")))
    await call(store.append("c", Message.user("c")))
    again = await call(store.append("c", Message.user("b", id="x")))
    assert again == kept
    with pytest.raises(ConflictError):
        await call(store.append("c", Message.user("different", id="x")))
    assert [m.seq for m in await call(store.messages("c"))] == [1, 2, 3]


@pytest.mark.postgres
async def test_direct_paths_return_connections_out_of_autocommit(pg_store: Any) -> None:
    """PostgreSQL's direct window and append switch the driver to autocommit by its own
    flag; every connection must be back out of it before the pool hands it on, or a
    later multi-statement write would commit statement by statement."""
    store = pg_store
    engine = _sync_engine(store)
    states: list[bool] = []

    def checkin(dbapi_connection: Any, record: Any) -> None:
        states.append(bool(dbapi_connection.autocommit))

    event.listen(engine.pool, "checkin", checkin)
    try:
        await call(store.append("c", Message.user("a")))
        await call(store.window("c", TokenLimitedView(1_000)))
        missing = await call(store.window("missing", TokenLimitedView(1_000)))
        assert missing.messages == [] and not missing.report.conversation_exists
        # Then a failing multi-statement write: all or nothing, as in a transaction.
        await call(store.append("c", Message.user("b", id="x")))
        with pytest.raises(ConflictError):
            await call(store.extend("c", [Message.user("new", id="y"),
                                          Message.user("changed", id="x")]))
    finally:
        event.remove(engine.pool, "checkin", checkin)
    assert states and not any(states)
    assert [m.content for m in await call(store.messages("c"))] == ["a", "b"]


async def test_direct_append_creates_the_conversation_with_an_epoch(store: Any) -> None:
    from sqlalchemy import select

    from memstore._db.schema import conversations

    await call(store.append("new", Message.user("hello")))
    stmt = select(conversations.c.epoch).where(conversations.c.id == "new")

    async def epoch() -> int:
        if hasattr(store.engine, "sync_engine"):
            async with store.engine.connect() as aconn:
                return int((await aconn.execute(stmt)).scalar_one())
        with store.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    e = await epoch()
    assert e != _window.UNTRUSTED_EPOCH
    await call(store.append("new", Message.user("again")))
    assert await epoch() == e  # appends keep the epoch (cached rows stay valid)


async def test_read_rows_share_one_fields_set_without_leaking(store: Any) -> None:
    """Rows built on the read path share ``model_fields_set`` (one GC object fewer per
    cached row); copies get their own and never change the shared one."""
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(5)]))
    window = await call(store.window("c", TokenLimitedView(10_000)))
    rows = window.messages
    fields = set(type(rows[0]).model_fields)
    assert all(m.model_fields_set == fields for m in rows)
    assert len({id(m.__pydantic_fields_set__) for m in rows}) == 1
    changed = rows[0].model_copy(update={"score": 3.0})
    assert changed.score == 3.0 and rows[0].score == 1.0
    assert rows[1].model_fields_set == fields
    again = await call(store.window("c", TokenLimitedView(10_000)))
    assert again.messages == rows


async def test_client_id_lookups_cross_chunks_and_stay_exactly_once(store: Any) -> None:
    """Batches with more client ids than one lookup statement takes (``ID_LOOKUP_CHUNK``)."""
    from memstore._db.statements import ID_LOOKUP_CHUNK

    n = ID_LOOKUP_CHUNK * 2 + 7
    batch = [Message.user(f"m{i}", id=f"id-{i}") for i in range(n)]
    first = await call(store.extend("c", batch[: n // 2]))
    again = await call(store.extend("c", batch))  # the first half is stored already
    assert again[: n // 2] == first
    assert [m.seq for m in again] == list(range(1, n + 1))
    assert [m.id for m in await call(store.messages("c"))] == [m.id for m in batch]
    with pytest.raises(ConflictError, match="id-1000"):
        await call(store.extend("c", [*batch[:5], Message.user("other", id="id-1000")]))
    assert (await call(store.get_conversation("c"))).message_count == n


@pytest.mark.postgres
def test_postgres_client_id_lookup_probes_the_unique_index_without_statistics(
    pg_url: str,
) -> None:
    """The lookup is one index probe per id even when the planner's statistics are stale.

    ``message_id IN (...)`` let PostgreSQL, with no statistics for a freshly filled
    conversation, scan the whole conversation and test each row against the list.
    """
    from sqlalchemy import create_engine, text

    from memstore import MemoryStore
    from memstore._db import statements as q

    with MemoryStore(pg_url, migrate="upgrade") as store:
        store.extend("big", [Message.user(f"m{i}", id=f"id-{i}") for i in range(5000)])
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            ids = [f"id-{i}" for i in range(q.ID_LOOKUP_CHUNK)]
            stmt = q.messages_by_ids("postgresql", "big", ids).compile(dialect=engine.dialect)
            plans = []
            # Whatever the statistics: none yet (a fresh fill), then analysed.
            for analyse in (False, True):
                if analyse:
                    conn.execute(text("ANALYZE memstore_messages"))
                plans.append("\n".join(row[0] for row in conn.exec_driver_sql(
                    "EXPLAIN " + str(stmt), stmt.params)))
            assert len(conn.execute(q.messages_by_ids("postgresql", "big", ids)).all()) == len(ids)
    finally:
        engine.dispose()
    for plan in plans:
        assert "Nested Loop" in plan, plan
        assert "uq_memstore_messages_conversation_id_message_id" in plan, plan
        assert "message_id)::text = (wanted.id)::text" in plan, plan


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_opening_a_store_compiles_the_hot_statements(db_url: str, kind: str,
                                                           monkeypatch: Any) -> None:
    """The first window and append of a fresh process run precompiled SQL.

    Also when the schema is already at head and opening takes no write transaction.
    """
    from memstore import AsyncMemoryStore, MemoryStore
    from memstore._db import statements as q

    MemoryStore(db_url, migrate="upgrade").close()  # at head from here on
    monkeypatch.setattr(q, "_COMPILED", {})
    if kind == "sync":
        store: Any = MemoryStore(db_url, migrate="check")
    else:
        store = AsyncMemoryStore(db_url, migrate="check")
        await store.setup()
    try:
        names = {key[2] for key in q._COMPILED}
        assert {"conversation", "range", "range_checked", "write:allocate",
                "write:insert"} <= names, names
        compiled = len(q._COMPILED)
        await call(store.append("c", Message.user("hi")))
        await call(store.window("c", TokenLimitedView(100)))
        assert len(q._COMPILED) == compiled  # nothing compiled on first use
    finally:
        await call(store.close())

"""The store contract: every method, run on {sync, async} × {SQLite, PostgreSQL}."""

from __future__ import annotations

from datetime import timezone
from typing import Any

import pytest

from memstore.errors import (
    ConflictError,
    ConversationNotFoundError,
    DatabaseError,
    InvalidInputError,
    MessageNotFoundError,
    NotFoundError,
)
from memstore.models import ConversationState, ImagePart, ImageURL, Message, TextPart, ToolCall
from tests.helpers import call


def _sync_engine(store: Any) -> Any:
    engine = store.engine
    return getattr(engine, "sync_engine", engine)


async def _contents(store: Any, cid: str) -> list[tuple[int, str, Any]]:
    return [(m.seq, m.role, m.content) for m in await call(store.messages(cid))]


# ---- conversations ----------------------------------------------------------------------


async def test_create_get_list_delete_conversation(store: Any) -> None:
    conv = await call(store.create_conversation("alpha", metadata={"user": "u1", "n": [1, 2]}))
    assert conv.id == "alpha"
    assert conv.metadata == {"user": "u1", "n": [1, 2]}
    assert conv.message_count == 0 and conv.token_count == 0
    assert conv.created_at.tzinfo is not None
    generated = await call(store.create_conversation())
    assert len(generated.id) == 36
    with pytest.raises(ConflictError, match="already exists"):
        await call(store.create_conversation("alpha"))
    got = await call(store.get_conversation("alpha"))
    assert got == conv
    for cid in ["x3", "x1", "x2"]:
        await call(store.create_conversation(cid))
    ids = [c.id for c in await call(store.list_conversations())]
    assert ids == sorted(ids) and {"x1", "x2", "x3", "alpha"} <= set(ids)
    # generated ids are hex UUIDs, which sort before "x"
    page = await call(store.list_conversations(limit=2, after="x1"))
    assert [c.id for c in page] == ["x2", "x3"]
    await call(store.append("alpha", Message.user("x")))
    await call(store.delete_conversation("alpha"))
    with pytest.raises(ConversationNotFoundError):
        await call(store.get_conversation("alpha"))
    with pytest.raises(ConversationNotFoundError):
        await call(store.delete_conversation("alpha"))


async def test_unknown_ids_raise_not_found(store: Any) -> None:
    for method, args in [
        ("get_conversation", ("nope",)),
        ("get_message", ("nope", 1)),
        ("set_score", ("nope", 1, 2.0)),
        ("pin", ("nope", 1)),
        ("unpin", ("nope", 1)),
        ("pop", ("nope",)),
        ("clear", ("nope",)),
        ("save_state", ("nope",)),
        ("delete_conversation", ("nope",)),
    ]:
        with pytest.raises(ConversationNotFoundError, match="'nope'"):
            await call(getattr(store, method)(*args))
    with pytest.raises(NotFoundError):
        await call(store.truncate("nope", before_seq=2))
    await call(store.append("c", Message.user("one")))
    with pytest.raises(MessageNotFoundError, match="seq 5"):
        await call(store.get_message("c", 5))
    with pytest.raises(MessageNotFoundError):
        await call(store.set_score("c", 5, 1.0))
    with pytest.raises(MessageNotFoundError):
        await call(store.pin("c", 2))
    # LookupError compatibility
    with pytest.raises(LookupError):
        await call(store.get_message("c", 9))


async def test_empty_conversation(store: Any) -> None:
    await call(store.create_conversation("empty"))
    assert await call(store.messages("empty")) == []
    assert await call(store.count_tokens("empty")) == 0
    assert await call(store.pop("empty", 3)) == []
    assert await call(store.truncate("empty", before_seq=10)) == 0
    assert await call(store.clear("empty")) == 0
    state = await call(store.save_state("empty"))
    assert state.messages == []
    assert await call(store.extend("empty", [])) == []


# ---- writing ----------------------------------------------------------------------------


async def test_append_assigns_contiguous_seqs_and_counts_tokens(store: Any, counter: Any) -> None:
    first = await call(store.append("c", Message.system("be brief")))
    assert first.seq == 1 and first.conversation_id == "c"
    assert first.token_counter == counter.name
    assert first.token_count == counter.count_message(Message.system("be brief"))
    assert first.created_at.tzinfo == timezone.utc
    assert len(first.id) == 36  # store-assigned UUID
    batch = await call(store.extend("c", [
        Message.user("what is the weather"),
        Message.assistant(tool_calls=[
            ToolCall(id="call_1", name="weather", arguments='{"c":"Oslo"}')]),
        Message.tool("rainy, 4C", tool_call_id="call_1"),
        {"role": "assistant", "content": "It is rainy."},
    ]))
    assert [m.seq for m in batch] == [2, 3, 4, 5]
    assert batch[1].tool_calls == [ToolCall(id="call_1", name="weather", arguments='{"c":"Oslo"}')]
    conv = await call(store.get_conversation("c"))
    assert conv.message_count == 5
    total = sum(m.token_count for m in [first, *batch])
    assert conv.token_count == total == await call(store.count_tokens("c"))
    stored = await call(store.messages("c"))
    assert [m.seq for m in stored] == [1, 2, 3, 4, 5]
    assert stored[1:] == batch and stored[0] == first


async def test_messages_ranges_and_order(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(1, 11)]))
    assert [m.seq for m in await call(store.messages("c", start=3, stop=6))] == [3, 4, 5]
    assert [m.seq for m in await call(store.messages("c", limit=3))] == [1, 2, 3]
    newest = await call(store.messages("c", limit=3, newest_first=True))
    assert [m.seq for m in newest] == [10, 9, 8]
    assert [m.seq for m in await call(store.messages("c", stop=3, newest_first=True))] == [2, 1]
    got = await call(store.get_message("c", 7))
    assert got.content == "m7"
    with pytest.raises(InvalidInputError, match="limit"):
        await call(store.messages("c", limit=-1))


async def test_unicode_emoji_and_long_content_round_trip(store: Any) -> None:
    texts = [
        "héllo wörld — ünïcødé",
        "emoji 🎉🚀👩‍👩‍👧‍👦 and flags 🇳🇴",
        "中文字符和日本語のテキスト",
        "right-to-left: مرحبا بالعالم",
        "x" * 1_000_000,
        "",
    ]
    await call(store.extend("u", [Message.user(t) for t in texts]))
    parts = Message.user([TextPart(text="see "),
                          ImagePart(image_url=ImageURL(url="data:image/png;base64,AAAA",
                                                       detail="low"))])
    await call(store.append("u", parts))
    back = await call(store.messages("u"))
    assert [m.content for m in back[:-1]] == texts
    assert back[-1].content == parts.content
    assert back[-1].to_openai()["content"][1]["image_url"]["detail"] == "low"


async def test_metadata_name_score_pinned_round_trip(store: Any) -> None:
    msg = Message.user("hi", name="alice", score=2.5, pinned=True,
                       metadata={"k": [1, {"deep": None}], "ü": "✓"})
    stored = await call(store.append("c", msg))
    got = await call(store.get_message("c", stored.seq))
    assert got.name == "alice" and got.score == 2.5 and got.pinned
    assert got.metadata == {"k": [1, {"deep": None}], "ü": "✓"}
    assert got.as_message() == msg.model_copy(update={"id": got.id})


async def test_idempotent_append_with_client_id(store: Any) -> None:
    m = Message.user("pay the invoice", id="req-1")
    a = await call(store.append("c", m))
    b = await call(store.append("c", m))
    assert a == b and a.id == "req-1"
    assert len(await call(store.messages("c"))) == 1
    # the same id in another conversation is independent
    other = await call(store.append("d", m))
    assert other.conversation_id == "d" and other.seq == 1
    with pytest.raises(ConflictError, match="req-1"):
        await call(store.append("c", Message.user("pay twice", id="req-1")))
    # a batch retried after partial success: stored ones come back, new ones are added
    batch = [Message.user("pay the invoice", id="req-1"), Message.user("next", id="req-2")]
    out = await call(store.extend("c", batch))
    assert [x.seq for x in out] == [1, 2]
    again = await call(store.extend("c", batch))
    assert again == out
    # repeated id inside one batch is stored once
    dup = await call(store.extend("c", [Message.user("z", id="r3"), Message.user("z", id="r3")]))
    assert dup[0] == dup[1] and dup[0].seq == 3
    with pytest.raises(ConflictError, match="twice"):
        await call(store.extend("c", [Message.user("y", id="r4"), Message.user("w", id="r4")]))
    assert len(await call(store.messages("c"))) == 3


async def test_set_score_pin_unpin(store: Any) -> None:
    await call(store.extend("c", [Message.user("a"), Message.system("s")]))
    assert (await call(store.set_score("c", 1, 7.5))).score == 7.5
    assert (await call(store.get_message("c", 1))).score == 7.5
    pinned = await call(store.pin("c", 1))
    assert pinned.pinned and pinned.anchored
    unpinned = await call(store.unpin("c", 1))
    assert not unpinned.pinned and not unpinned.anchored
    # a system message stays anchored whatever its pin
    assert (await call(store.unpin("c", 2))).anchored
    with pytest.raises(InvalidInputError, match="score"):
        await call(store.set_score("c", 1, float("nan")))
    with pytest.raises(InvalidInputError, match="score"):
        await call(store.set_score("c", 1, -1))


# ---- destructive ------------------------------------------------------------------------


async def test_pop_truncate_clear(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(1, 8)]))
    popped = await call(store.pop("c", 2))
    assert [m.seq for m in popped] == [6, 7]
    assert [m.seq for m in await call(store.pop("c"))] == [5]
    # seqs stay gap-free: the next append reuses the popped position
    assert (await call(store.append("c", Message.user("new")))).seq == 5
    assert await call(store.truncate("c", before_seq=3)) == 2
    seqs = [m.seq for m in await call(store.messages("c"))]
    assert seqs == [3, 4, 5]
    conv = await call(store.get_conversation("c"))
    assert conv.message_count == 3
    assert conv.token_count == sum(m.token_count for m in await call(store.messages("c")))
    assert await call(store.pop("c", 10)) != []
    assert await call(store.messages("c")) == []
    await call(store.extend("c", [Message.user("a"), Message.user("b")]))
    assert await call(store.clear("c")) == 2
    assert (await call(store.get_conversation("c"))).token_count == 0
    assert (await call(store.append("c", Message.user("fresh")))).seq == 1


async def test_truncate_beyond_end_and_before_start(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(5)]))
    assert await call(store.truncate("c", before_seq=1)) == 0
    assert await call(store.truncate("c", before_seq=100)) == 5
    assert (await call(store.get_conversation("c"))).message_count == 0
    assert (await call(store.append("c", Message.user("after")))).seq == 6


# ---- atomicity --------------------------------------------------------------------------


async def test_extend_with_invalid_message_writes_nothing(store: Any) -> None:
    await call(store.append("c", Message.user("keep")))
    before = await _contents(store, "c")
    bad_batch: list[Any] = [
        Message.user("ok 1"),
        {"role": "user", "content": "ok 2"},
        {"role": "tool", "content": "no call id"},
    ]
    with pytest.raises(ValueError, match="tool_call_id"):
        await call(store.extend("c", bad_batch))
    assert await _contents(store, "c") == before
    assert (await call(store.get_conversation("c"))).message_count == 1


async def test_extend_with_forced_database_error_rolls_back(store: Any, monkeypatch: Any) -> None:
    from memstore._db import ops as _ops

    await call(store.append("c", Message.user("keep")))
    before = await _contents(store, "c")
    conv_before = await call(store.get_conversation("c"))
    monkeypatch.setattr(_ops, "INSERT_CHUNK", 2)
    seen = {"inserts": 0}
    real_insert = _ops.insert_message_rows

    def fail_on_second_chunk(conn: Any, rows: Any) -> None:
        # (INSERT on SQLite, COPY on PostgreSQL: one call per chunk either way)
        seen["inserts"] += 1
        if seen["inserts"] == 2:
            raise RuntimeError("forced failure half way through the batch")
        real_insert(conn, rows)

    monkeypatch.setattr(_ops, "insert_message_rows", fail_on_second_chunk)
    with pytest.raises((RuntimeError, DatabaseError)):
        await call(store.extend("c", [Message.user(f"n{i}") for i in range(5)]))
    monkeypatch.undo()
    assert seen["inserts"] == 2  # the first chunk was really written before the failure
    assert await _contents(store, "c") == before
    assert await call(store.get_conversation("c")) == conv_before
    assert (await call(store.append("c", Message.user("next")))).seq == 2


# ---- state ------------------------------------------------------------------------------


async def test_save_and_load_state(store: Any) -> None:
    await call(store.create_conversation("src", metadata={"topic": "t"}))
    await call(store.extend("src", [
        Message.system("sys"),
        Message.user("q", id="client-1", score=3.0),
        Message.assistant(tool_calls=[ToolCall(id="k1", name="f", arguments="{}")]),
        Message.tool("r", tool_call_id="k1"),
        Message.assistant("a", pinned=True, metadata={"x": 1}),
    ]))
    await call(store.truncate("src", before_seq=2))
    state = await call(store.save_state("src"))
    text = state.to_json()
    parsed = ConversationState.from_json(text)
    assert parsed == state
    assert [m.seq for m in parsed.messages] == [2, 3, 4, 5]
    conv = await call(store.load_state(text, "dst"))
    assert conv.id == "dst" and conv.metadata == {"topic": "t"} and conv.message_count == 4
    copied = await call(store.messages("dst"))
    original = await call(store.messages("src"))
    strip = ("conversation_id",)
    assert [m.model_dump(exclude=set(strip)) for m in copied] == [
        m.model_dump(exclude=set(strip)) for m in original
    ]
    # replace=True makes dst exactly the snapshot again
    await call(store.append("dst", Message.user("extra")))
    await call(store.load_state(state, "dst", replace=True))
    assert [m.seq for m in await call(store.messages("dst"))] == [2, 3, 4, 5]
    # replace=False appends after what is stored, keeping timestamps, scores and ids
    await call(store.append("other", Message.user("already here")))
    await call(store.load_state(state, "other", replace=False))
    after = await call(store.messages("other"))
    assert [m.seq for m in after] == [1, 2, 3, 4, 5]
    assert after[1].score == original[0].score == 3.0
    assert after[1].created_at == original[0].created_at
    assert after[1].id == "client-1"
    # the same snapshot again would duplicate client ids: refused, nothing written
    with pytest.raises(ConflictError):
        await call(store.load_state(state, "other", replace=False))
    assert len(await call(store.messages("other"))) == 5
    # loading a snapshot into its own id replaces it
    await call(store.load_state(state.model_dump(mode="json")))
    assert [m.seq for m in await call(store.messages("src"))] == [2, 3, 4, 5]


async def test_load_state_conflict_rolls_back(store: Any) -> None:
    await call(store.extend("a", [Message.user("x", id="same")]))
    state = await call(store.save_state("a"))
    await call(store.extend("b", [Message.user("y", id="same"), Message.user("z")]))
    before = await _contents(store, "b")
    with pytest.raises(ConflictError):
        await call(store.load_state(state, "b", replace=False))
    assert await _contents(store, "b") == before


def test_sqlite_connections_use_wal_foreign_keys_and_busy_timeout(tmp_path: Any) -> None:
    from memstore.store import MemoryStore
    from memstore.tokens import FixedCounter

    store = MemoryStore(f"sqlite:///{tmp_path / 'p.db'}", counter=FixedCounter(),
                        busy_timeout=7.5)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7500
    # deleting a conversation cascades to its messages at the database level too
    store.append("c", Message.user("x"))
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM memstore_conversations WHERE id = 'c'")
        assert conn.exec_driver_sql("SELECT count(*) FROM memstore_messages").scalar() == 0
    store.close()


async def test_store_assigned_ids_are_time_ordered_uuids(store: Any) -> None:
    # Version 7 UUIDs: they enter the (conversation_id, message_id) index at its right
    # edge, so appends stay cheap however large the index grows.
    import asyncio
    import uuid

    first = await call(store.append("c", Message.user("one")))
    await asyncio.sleep(0.002)
    second = await call(store.append("c", Message.user("two")))
    ids = [uuid.UUID(first.id), uuid.UUID(second.id)]
    assert [i.version for i in ids] == [7, 7]
    assert ids[0].variant == uuid.RFC_4122
    assert first.id < second.id  # the millisecond timestamp leads
    given = await call(store.append("c", Message.user("three", id="client-7")))
    assert given.id == "client-7"
    # A batch's ids (made together, see _rows.new_message_ids) are the same kind: distinct
    # version 7 UUIDs after the earlier ones, in canonical text form.
    await asyncio.sleep(0.002)
    batch = await call(store.extend("c", [Message.user(f"b{i}") for i in range(300)]))
    parsed = [uuid.UUID(m.id) for m in batch]
    assert {i.version for i in parsed} == {7}
    assert {i.variant for i in parsed} == {uuid.RFC_4122}
    assert [str(i) for i in parsed] == [m.id for m in batch]
    assert len({m.id for m in batch}) == 300
    assert min(m.id for m in batch) > second.id


@pytest.mark.parametrize("where", ["memory", "url"])
def test_a_store_collected_without_close_releases_its_connections(
    where: str, db_url: str
) -> None:
    """A store dropped without close() left its engine's pooled connections to the
    garbage collector (Python 3.13 warns of every sqlite3 connection collected unclosed,
    and a PostgreSQL session stayed open until then). The store's engine is disposed
    when the store is collected; an injected engine is left alone."""
    import gc

    from sqlalchemy import event

    from memstore import MemoryStore, TokenLimitedView

    url = "sqlite://" if where == "memory" else db_url
    closed: list[object] = []
    store = MemoryStore(url)
    event.listen(store.engine.pool, "close", lambda conn, rec: closed.append(conn))
    store.append("c", Message.user("hi"))
    store.window("c", TokenLimitedView(100))
    del store
    gc.collect()
    assert closed, "the collected store's pooled connection was not closed"

    injected = MemoryStore(url).engine  # (its own store is collected: a fresh pool)
    mine = MemoryStore(engine=injected)
    kept: list[object] = []
    event.listen(injected.pool, "close", lambda conn, rec: kept.append(conn))
    mine.append("c", Message.user("again"))
    del mine
    gc.collect()
    assert kept == []  # the caller's engine keeps its connections
    injected.dispose()


async def test_reads_of_a_conversation_never_written_are_empty(store: Any) -> None:
    from memstore import (
        BufferedView,
        HeadAndTailView,
        RecentTurnsView,
        ScoreBasedView,
        SummaryView,
        TokenLimitedView,
        UnboundedView,
    )

    assert await call(store.messages("new")) == []
    assert await call(store.messages("new", limit=3, newest_first=True)) == []
    assert await call(store.count_tokens("new")) == 0
    stream = store.iter_messages("new")
    if hasattr(stream, "__anext__"):
        assert [m async for m in stream] == []
    else:
        assert list(stream) == []
    views = [UnboundedView(), BufferedView(3), HeadAndTailView(1, 1), RecentTurnsView(2),
             TokenLimitedView(100, reserve=99), ScoreBasedView(50), SummaryView(80)]
    for view in views:
        window = await call(store.window("new", view))
        assert window.messages == [] and window.token_count == 0, view
        assert window.report.conversation_exists is False and window.conversation_id == "new"
        assert window.report.conversation_message_count == 0
        assert window.to_openai() == []
    context = store.context("new", BufferedView(4))
    assert await call(context.get_messages()) == []
    # Reading created nothing: the conversation is still unknown to the calls that raise.
    with pytest.raises(ConversationNotFoundError, match="'new'"):
        await call(store.get_conversation("new"))
    assert "new" not in [c.id for c in await call(store.list_conversations())]
    # Once written, the same reads see it, and the report says it exists.
    await call(store.append("new", Message.user("hi")))
    window = await call(store.window("new", UnboundedView()))
    assert [m.text for m in window.messages] == ["hi"]
    assert window.report.conversation_exists is True
    assert await call(store.count_tokens("new")) > 0


async def test_extend_without_messages_back_streams_all_or_nothing(store: Any) -> None:
    from memstore._db.ops import INSERT_CHUNK

    n = 2 * INSERT_CHUNK + 7

    def chat(count: int, bad_at: int | None = None) -> Any:
        for i in range(count):
            if i == bad_at:
                yield {"role": "nobody", "content": "x"}
            yield Message.user(f"m{i}", id=f"id{i}")

    assert await call(store.extend("s", chat(n), return_messages=False)) == n
    assert await call(store.count_tokens("s")) > 0
    stored = await call(store.messages("s"))
    assert [m.id for m in stored] == [f"id{i}" for i in range(n)]
    # ids already stored (by this call's earlier chunks or before) are not stored again
    assert await call(store.extend("s", chat(n + 3), return_messages=False)) == n + 3
    assert len(await call(store.messages("s"))) == n + 3
    # a bad message in the third chunk, or the iterable's own error: nothing is written
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="role"):
        await call(store.extend("t", chat(n, bad_at=2 * INSERT_CHUNK + 1),
                                return_messages=False))

    def failing() -> Any:
        yield from chat(INSERT_CHUNK + 1)
        raise RuntimeError("source went away")

    with pytest.raises(RuntimeError, match="went away"):
        await call(store.extend("t", failing(), return_messages=False))
    assert await call(store.messages("t")) == []
    with pytest.raises(InvalidInputError, match="return_messages"):
        await call(store.extend("t", [], return_messages="no"))


def test_extend_without_messages_back_holds_one_chunk_in_memory(db_url: str) -> None:
    import tracemalloc

    from memstore import MemoryStore
    from memstore._db.ops import INSERT_CHUNK
    from memstore.tokens import FixedCounter

    store = MemoryStore(db_url, counter=FixedCounter(), cache_size=0)

    def peak(cid: str, count: int) -> int:
        messages = (Message.user("lorem ipsum dolor sit amet " * 20) for _ in range(count))
        tracemalloc.start()
        try:
            assert store.extend(cid, messages, return_messages=False) == count
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    try:
        peak("warm", INSERT_CHUNK)
        small, large = peak("small", 2 * INSERT_CHUNK), peak("large", 12 * INSERT_CHUNK)
        assert large < 2 * small, (small, large)  # six times the messages, flat memory
    finally:
        store.close()

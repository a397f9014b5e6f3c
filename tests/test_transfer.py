"""JSON Lines export/import and streaming snapshots, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import event

from memstore import (
    BufferedView,
    ConflictError,
    ConversationNotFoundError,
    ConversationState,
    HeadAndTailView,
    ImportFormatError,
    InvalidInputError,
    MemoryStore,
    MemstoreError,
    Message,
    RecentTurnsView,
    ScoreBasedView,
    StoredMessage,
    TokenLimitedView,
    ToolCall,
    UnboundedView,
    export_jsonl,
    import_jsonl,
    transfer,
)
from memstore._db import ops as _ops
from memstore.tokens import FixedCounter
from tests.helpers import call, examples


def _conversation(n: int = 12) -> list[Message]:
    out: list[Message] = [Message.system("You are terse.", metadata={"v": 1.5, "z": [1, None]})]
    for i in range(n):
        out.append(Message.user(f"question {i} " + "word " * (i % 5), id=f"u{i}"))
        if i % 4 == 1:
            call_ = ToolCall(id=f"call{i}", name="lookup", arguments='{"q": "x"}')
            out.append(Message.assistant(None, tool_calls=[call_], id=f"a{i}"))
            out.append(Message.tool(f"result {i}", tool_call_id=f"call{i}", id=f"t{i}"))
        out.append(Message.assistant(f"answer {i}", id=f"r{i}", score=1.0 + i % 3,
                                     name="bot" if i % 2 else None))
    return out


def _seed(store: MemoryStore, cid: str = "c", n: int = 12) -> None:
    store.create_conversation(cid, metadata={"owner": "ann", "n": 3})
    store.extend(cid, _conversation(n))
    store.pin(cid, 3)
    store.set_score(cid, 4, 2.5)


def _export(store: MemoryStore, ids: Any = None) -> str:
    buffer = io.StringIO()
    export_jsonl(store, buffer, ids)
    return buffer.getvalue()


@pytest.fixture
def sync_store(db_url: str, counter: FixedCounter) -> Any:
    store = MemoryStore(db_url, counter=counter)
    yield store
    store.close()


def test_round_trip_keeps_every_field(sync_store: MemoryStore, tmp_path: Any,
                                      counter: FixedCounter) -> None:
    _seed(sync_store)
    _seed(sync_store, "d", 3)
    text = _export(sync_store)
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0] == {
        "memstore_export": 1, "type": "conversation", "id": "c",
        "created_at": lines[0]["created_at"], "updated_at": lines[0]["updated_at"],
        "metadata": {"owner": "ann", "n": 3}, "message_count": lines[0]["message_count"],
    }
    # a message line is exactly a StoredMessage's JSON
    first = sync_store.get_message("c", 1)
    assert text.splitlines()[1] == first.model_dump_json()

    target = MemoryStore(f"sqlite:///{tmp_path / 'target.db'}", counter=counter)
    result = import_jsonl(target, io.StringIO(text))
    assert [(c.id, c.written, c.unchanged, c.replaced) for c in result.conversations] == [
        ("c", lines[0]["message_count"], 0, False), ("d", 9, 0, False)]
    for cid in ("c", "d"):
        assert target.save_state(cid) == sync_store.save_state(cid)
        assert target.get_conversation(cid) == sync_store.get_conversation(cid)
    target.close()


def test_reimport_stores_nothing_new(sync_store: MemoryStore) -> None:
    _seed(sync_store)
    text = _export(sync_store)
    before = sync_store.save_state("c")
    result = import_jsonl(sync_store, io.StringIO(text))
    (only,) = result.conversations
    assert only.written == 0 and only.unchanged == before.conversation.message_count
    assert sync_store.save_state("c") == before


def test_import_appends_only_new_messages(sync_store: MemoryStore) -> None:
    _seed(sync_store)
    text = _export(sync_store)
    sync_store.pop("c", 3)
    result = import_jsonl(sync_store, io.StringIO(text))
    assert (result.conversations[0].written, result.conversations[0].unchanged) == (
        3, sync_store.get_conversation("c").message_count - 3)


def test_replace_overwrites(sync_store: MemoryStore) -> None:
    _seed(sync_store)
    text = _export(sync_store)
    original = sync_store.save_state("c")
    sync_store.clear("c")
    sync_store.append("c", Message.user("something else", id="u0"))
    with pytest.raises(ConflictError):
        import_jsonl(sync_store, io.StringIO(text))
    assert [m.content for m in sync_store.messages("c")] == ["something else"]
    result = import_jsonl(sync_store, io.StringIO(text), replace=True)
    assert result.conversations[0].replaced
    restored = sync_store.save_state("c")
    assert restored.messages == original.messages
    assert restored.conversation.metadata == original.conversation.metadata


def test_rename_and_bare_message_lines(sync_store: MemoryStore) -> None:
    _seed(sync_store)
    bare = "\n".join(m.model_dump_json() for m in sync_store.messages("c", start=3)) + "\n"
    with pytest.raises(ImportFormatError) as info:
        import_jsonl(sync_store, io.StringIO(bare))
    assert info.value.line == 1
    result = import_jsonl(sync_store, io.StringIO(bare), rename="copy")
    assert result.conversations[0].id == "copy"
    copied = sync_store.messages("copy")
    assert [m.seq for m in copied] == [m.seq for m in sync_store.messages("c", start=3)]
    assert [m.as_message() for m in copied] == [
        m.as_message() for m in sync_store.messages("c", start=3)]
    # a whole export under a new id; a file with two conversations cannot be renamed
    _seed(sync_store, "d", 2)
    one = _export(sync_store, ["d"])
    assert import_jsonl(sync_store, io.StringIO(one), rename="d2").conversations[0].written
    assert sync_store.save_state("d2").messages[-1].content == (
        sync_store.save_state("d").messages[-1].content)
    with pytest.raises(ImportFormatError, match="rename imports one conversation") as two:
        import_jsonl(sync_store, io.StringIO(_export(sync_store, ["c", "d"])), rename="x")
    # Refused before the first conversation commits: nothing of the file is stored.
    assert two.value.imported == []
    assert two.value.line == len(_export(sync_store, ["c"]).splitlines()) + 1
    with pytest.raises(ConversationNotFoundError):
        sync_store.get_conversation("x")


@pytest.mark.parametrize("damage", ["bad_json", "bad_role", "wrong_owner", "seq_gap",
                                    "truncated", "not_object", "version", "extra_header",
                                    "too_deep", "too_deep_metadata", "version_true"])
def test_a_bad_line_leaves_its_conversation_untouched(sync_store: MemoryStore,
                                                      damage: str) -> None:
    _seed(sync_store, "a", 2)
    _seed(sync_store, "c", 2)
    lines = _export(sync_store).splitlines()
    c_header = next(i for i, line in enumerate(lines) if '"id":"c"' in line)
    bad = c_header + 3  # the third message line of conversation "c"
    message = json.loads(lines[bad])
    if damage == "bad_json":
        lines[bad] = lines[bad][:-5]
    elif damage == "bad_role":
        lines[bad] = json.dumps({**message, "role": "wizard"})
    elif damage == "wrong_owner":
        lines[bad] = json.dumps({**message, "conversation_id": "a"})
    elif damage == "seq_gap":
        lines[bad] = json.dumps({**message, "seq": message["seq"] + 5})
    elif damage == "truncated":
        lines = lines[:bad]
        bad = c_header
    elif damage == "not_object":
        lines[bad] = "[1, 2]"
    elif damage == "too_deep":  # deeper than Python's JSON parser can follow
        lines[bad] = "[" * 100_000 + "]" * 100_000
    elif damage == "too_deep_metadata":
        lines[bad] = lines[bad].replace('"metadata":{}',
                                        '"metadata":{"a":' + "[" * 100_000 + "]" * 100_000 + "}")
        assert "[[[" in lines[bad]
    elif damage == "version":
        lines[c_header] = lines[c_header].replace('"memstore_export":1', '"memstore_export":9')
        bad = c_header
    elif damage == "version_true":  # true == 1 in Python, not in the format
        lines[c_header] = lines[c_header].replace('"memstore_export":1', '"memstore_export":true')
        bad = c_header
    elif damage == "extra_header":
        lines[c_header] = lines[c_header].replace('"type"', '"colour":"red","type"')
        bad = c_header
    before = {cid: sync_store.save_state(cid) for cid in ("a", "c")}
    sync_store.delete_conversation("c")
    with pytest.raises(ImportFormatError) as info:
        import_jsonl(sync_store, io.StringIO("\n".join(lines) + "\n"), replace=True)
    assert info.value.line == bad + 1
    assert isinstance(info.value, InvalidInputError)
    assert [c.id for c in info.value.imported] == ["a"]
    with pytest.raises(ConversationNotFoundError):
        sync_store.get_conversation("c")  # nothing of it was written
    assert sync_store.save_state("a").messages == before["a"].messages


def test_a_bad_line_is_named_in_one_line_without_pydantic_urls(sync_store: MemoryStore) -> None:
    """docs/cli.md shows `history.jsonl:2: tool_call_id: ...`: the problem, not a dump."""
    sync_store.extend("c", [Message.user("hi")])
    lines = _export(sync_store).splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "role": "tool"})
    sync_store.delete_conversation("c")
    with pytest.raises(ImportFormatError) as info:
        import_jsonl(sync_store, io.StringIO("\n".join(lines) + "\n"))
    text = str(info.value)
    assert text == ("line 2: not a stored message: tool_call_id is required for a tool "
                    "message"), text
    header = json.loads(lines[0])
    with pytest.raises(ImportFormatError) as info:
        import_jsonl(sync_store, io.StringIO(json.dumps({**header, "created_at": "soon"})))
    assert str(info.value).startswith("line 1: bad conversation header: created_at: ")
    assert "pydantic" not in str(info.value) and "\n" not in str(info.value)


def test_file_arguments_must_be_file_objects(sync_store: MemoryStore, tmp_path: Any) -> None:
    """A path (or anything else that is not a file object) is refused by name, not with
    an AttributeError from deep inside; nothing is written."""
    _seed(sync_store, "c", 2)
    path = str(tmp_path / "out.jsonl")
    for bad, kind in ((path, "str"), ([_export(sync_store)], "list"), (None, "NoneType")):
        with pytest.raises(InvalidInputError, match=f"import_jsonl reads a text file object, "
                           f"not {kind}"):
            import_jsonl(sync_store, bad, rename="other")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=f"export_jsonl writes to a text file "
                           f"object, not {kind}"):
            export_jsonl(sync_store, bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=f"dump_state writes to a text file "
                           f"object, not {kind}"):
            sync_store.dump_state("c", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"a path: pass open\(path, 'w'"):
        export_jsonl(sync_store, path)  # type: ignore[arg-type]
    # A binary file object (it raised a raw TypeError on the first write).
    with pytest.raises(InvalidInputError, match=r"not a binary file .*text mode"):
        export_jsonl(sync_store, io.BytesIO())  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"not a binary file .*text mode"):
        sync_store.dump_state("c", io.BytesIO())  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"not a binary file .*text mode"):
        import_jsonl(sync_store, io.BytesIO(_export(sync_store).encode()))  # type: ignore[arg-type]
    assert [c.id for c in sync_store.list_conversations()] == ["c"]
    assert not (tmp_path / "out.jsonl").exists()


def test_metadata_differing_only_in_json_type_is_a_conflict(sync_store: MemoryStore) -> None:
    """An idempotent re-import matches messages by id and content, and content compares
    as JSON: metadata ``1.0`` or ``1`` where ``true`` is stored is other content."""
    sync_store.extend("c", [Message.user("hi", id="u1", metadata={"flag": True, "n": 1})])
    text = _export(sync_store)
    assert import_jsonl(sync_store, io.StringIO(text)).conversations[0].unchanged == 1
    for changed in (text.replace('"flag":true', '"flag":1'), text.replace('"n":1', '"n":1.0')):
        assert changed != text
        with pytest.raises(ConflictError, match="u1"):
            import_jsonl(sync_store, io.StringIO(changed))
    assert dict(sync_store.messages("c")[0].metadata) == {"flag": True, "n": 1}


def test_a_conflict_with_stored_rows_is_marked_as_one(sync_store: MemoryStore) -> None:
    """``transfer.conflicts_with_stored`` tells the CLI when replace=True would help."""
    sync_store.extend("c", [Message.user("one", id="m1")])
    text = _export(sync_store)
    sync_store.delete_conversation("c")
    sync_store.extend("c", [Message.user("uno", id="m1")])
    with pytest.raises(ConflictError) as info:
        import_jsonl(sync_store, io.StringIO(text))
    assert transfer.conflicts_with_stored(info.value)
    assert [m.text for m in sync_store.messages("c")] == ["uno"]
    assert import_jsonl(sync_store, io.StringIO(text), replace=True).conversations[0].replaced
    assert not transfer.conflicts_with_stored(ConflictError("another conflict"))
    assert not transfer.conflicts_with_stored(ValueError("not a conflict"))


def test_a_conflict_lists_the_conversations_imported_before_it(sync_store: MemoryStore) -> None:
    sync_store.extend("a", [Message.user("first")])
    sync_store.extend("c", [Message.user("one", id="m1")])
    text = _export(sync_store)
    for cid in ("a", "c"):
        sync_store.delete_conversation(cid)
    sync_store.extend("c", [Message.user("uno", id="m1")])
    with pytest.raises(ConflictError) as info:
        import_jsonl(sync_store, io.StringIO(text))
    imported = info.value.imported  # type: ignore[attr-defined]
    assert [c.id for c in imported] == ["a"]  # committed before "c" conflicted
    assert [m.text for m in sync_store.messages("a")] == ["first"]


def test_counts_in_a_file_are_recomputed(sync_store: MemoryStore) -> None:
    sync_store.append("c", Message.user("word " * 5000))
    sync_store.append("c", Message.user("short"))
    lines = _export(sync_store).splitlines()
    honest = json.loads(lines[1])["token_count"]
    lines[1] = json.dumps({**json.loads(lines[1]), "token_count": 0})
    lines[2] = json.dumps({**json.loads(lines[2]), "token_counter": "made-up/1"})
    result = import_jsonl(sync_store, io.StringIO("\n".join(lines)), rename="copy")
    assert result.conversations[0].recounted == 2
    copied = sync_store.messages("copy")
    assert copied[0].token_count == honest
    assert copied[1].token_counter == sync_store.counter.name
    assert sync_store.count_tokens("copy") == sync_store.count_tokens("c")


def test_progress_and_keyset_listing(sync_store: MemoryStore,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "EXPORT_PAGE", 2)
    monkeypatch.setattr(transfer, "IMPORT_BATCH", 3)
    for cid in ("e", "b", "d", "a", "c"):
        sync_store.extend(cid, [Message.user(f"{cid}{i}") for i in range(5)])
    ticks: list[int] = []
    buffer = io.StringIO()
    result = export_jsonl(sync_store, buffer, progress=ticks.append)
    assert (result.conversations, result.messages) == (5, 25)
    assert ticks == [2, 2, 1] * 5
    headers = [json.loads(line)["id"] for line in buffer.getvalue().splitlines()
               if "memstore_export" in line]
    assert headers == ["a", "b", "c", "d", "e"]
    ticks.clear()
    imported = import_jsonl(sync_store, io.StringIO(buffer.getvalue()), replace=True,
                            progress=ticks.append)
    assert ticks == [3, 2] * 5 and len(imported.conversations) == 5
    with pytest.raises(InvalidInputError):
        export_jsonl(sync_store, io.StringIO(), "a")
    with pytest.raises(InvalidInputError, match="takes a MemoryStore"):
        import_jsonl(object(), io.StringIO())  # type: ignore[arg-type]
    with pytest.raises(ConversationNotFoundError):
        export_jsonl(sync_store, io.StringIO(), ["a", "nope"])


def test_streams_read_and_write_in_bounded_pages(sync_store: MemoryStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Structural bound: every statement reads or writes at most one page/batch."""
    monkeypatch.setattr(transfer, "EXPORT_PAGE", 50)
    sync_store.extend("c", [Message.user(f"m{i}") for i in range(1234)])
    seen: list[tuple[str, Any, bool]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, context: Any,
               many: bool) -> None:
        seen.append((statement, params, many))

    event.listen(sync_store.engine, "before_cursor_execute", record)
    try:
        buffer = io.StringIO()
        export_jsonl(sync_store, buffer)
        reads = [(s, p) for s, p, _ in seen if "FROM memstore_messages" in s]
        assert len(reads) == 1234 // 50 + 1
        assert all("LIMIT" in s for s, _ in reads)
        seen.clear()
        # Rows are written by one INSERT (SQLite) or COPY (PostgreSQL) per call.
        inserts: list[int] = []
        real_insert = _ops.insert_message_rows

        def insert(conn: Any, rows: Any) -> None:
            inserts.append(len(rows))
            real_insert(conn, rows)

        monkeypatch.setattr(_ops, "insert_message_rows", insert)
        import_jsonl(sync_store, io.StringIO(buffer.getvalue()), rename="copy")
        assert len(inserts) == 1234 // transfer.IMPORT_BATCH + 1
        assert max(inserts) <= transfer.IMPORT_BATCH
        seen.clear()
        assert sum(1 for _ in sync_store.iter_messages("copy", page_size=100)) == 1234
        pages = [p for s, p, _ in seen if "FROM memstore_messages" in s]
        assert len(pages) == 13
        seen.clear()
        monkeypatch.setattr(_ops, "DELETE_CHUNK", 100)
        sync_store.delete_conversation("copy")  # deleted 100 rows per statement
        deletes = [s for s, _, _ in seen if s.startswith("DELETE FROM memstore_messages")]
        assert len(deletes) == 13
        assert all("seq >=" in s and "seq <" in s for s in deletes[:-1])
        with pytest.raises(ConversationNotFoundError):
            sync_store.get_conversation("copy")
        assert sync_store.get_conversation("c").message_count == 1234
    finally:
        event.remove(sync_store.engine, "before_cursor_execute", record)


def test_iter_messages_reads_one_snapshot(sync_store: MemoryStore) -> None:
    sync_store.extend("c", [Message.user(f"m{i}") for i in range(10)])
    it = sync_store.iter_messages("c", page_size=3)
    first = [next(it) for _ in range(4)]
    sync_store.extend("c", [Message.user("late")])
    rest = list(it)
    assert [m.seq for m in first + rest] == list(range(1, 11))
    assert [m.seq for m in sync_store.iter_messages("c", start=4, stop=7, page_size=2)] == [
        4, 5, 6]
    assert list(sync_store.iter_messages("nope")) == []  # never written: nothing to read
    with pytest.raises(InvalidInputError):
        sync_store.iter_messages("c", page_size=0)


def _windows(store: MemoryStore, cid: str) -> list[Any]:
    views = [UnboundedView(), BufferedView(buffer_size=5), TokenLimitedView(token_limit=60),
             HeadAndTailView(head_size=2, tail_size=4), RecentTurnsView(max_turns=2),
             ScoreBasedView(token_limit=60)]
    return [store.window(cid, view) for view in views]


@pytest.mark.postgres
def test_sqlite_export_postgres_import_same_windows(tmp_path: Any, pg_url: str,
                                                     counter: FixedCounter) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    lite = MemoryStore(f"sqlite:///{tmp_path / 'lite.db'}", counter=counter)
    pg = MemoryStore(pg_url, counter=counter)
    _seed(lite, "c", 20)
    buffer = io.StringIO()
    export_jsonl(lite, buffer)
    buffer.seek(0)
    import_jsonl(pg, buffer)
    assert pg.save_state("c") == lite.save_state("c")
    assert _windows(pg, "c") == _windows(lite, "c")
    buffer.seek(0)
    assert import_jsonl(pg, buffer).conversations[0].written == 0
    lite.close()
    pg.close()


# ---- snapshots as files ---------------------------------------------------------------


async def test_dump_and_restore_state_stream(store: Any) -> None:
    await call(store.extend("c", _conversation(6)))
    buffer = io.StringIO()
    head = await call(store.dump_state("c", buffer, page_size=4))
    text = buffer.getvalue()
    assert ConversationState.from_json(text) == await call(store.save_state("c"))
    assert head.message_count == len(text.splitlines()) - 2
    report = await call(store.restore_state(io.StringIO(text), "copy"))
    assert (report.messages, report.written, report.recounted) == (
        head.message_count, head.message_count, 0)
    copied = await call(store.save_state("copy"))
    original = await call(store.save_state("c"))
    assert [m.model_copy(update={"conversation_id": "c"}) for m in copied.messages] == (
        original.messages)
    # load_state takes a file too (and a compact to_json() file, read whole)
    conv = await call(store.load_state(io.StringIO(original.to_json()), "copy2"))
    assert conv.message_count == head.message_count
    seqs = [m.seq async for m in store.iter_messages("c", page_size=5)] if hasattr(
        store.iter_messages("c"), "__aiter__") else [m.seq for m in store.iter_messages("c")]
    assert seqs == list(range(1, head.message_count + 1))


async def test_truncated_snapshot_file_writes_nothing(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(30)]))
    buffer = io.StringIO()
    await call(store.dump_state("c", buffer))
    lines = buffer.getvalue().splitlines()
    for cut, match in ((len(lines) - 1, "truncated"), (5, "truncated")):
        with pytest.raises(InvalidInputError, match=match):
            await call(store.restore_state(io.StringIO("\n".join(lines[:cut])), "copy"))
        with pytest.raises(ConversationNotFoundError):
            await call(store.get_conversation("copy"))
    bad = lines.copy()
    bad[3] = bad[3].replace('"role":"user"', '"role":"wizard"')
    with pytest.raises(InvalidInputError, match="line 4"):
        await call(store.restore_state(io.StringIO("\n".join(bad)), "copy"))
    with pytest.raises(ConversationNotFoundError):
        await call(store.get_conversation("copy"))


async def test_load_state_recounts_untrusted_counts(store: Any) -> None:
    await call(store.append("c", Message.user("word " * 5000)))
    await call(store.append("c", Message.user("hi")))
    state = await call(store.save_state("c"))
    honest = state.messages[0].token_count
    lying = state.model_copy(update={"messages": [
        state.messages[0].model_copy(update={"token_count": 0}),
        state.messages[1].model_copy(update={"token_counter": "nobody/knows"}),
    ]})
    report = await call(store.restore_state(lying, "copy"))
    assert report.recounted == 2
    stored = await call(store.messages("copy"))
    assert stored[0].token_count == honest
    assert stored[1].token_counter == store.counter.name
    assert await call(store.count_tokens("copy")) == await call(store.count_tokens("c"))
    window = await call(store.window("copy", TokenLimitedView(token_limit=100)))
    assert window.token_count <= 100


def test_files_that_are_not_text_are_format_errors(sync_store: MemoryStore) -> None:
    _seed(sync_store, "c", 2)
    good = _export(sync_store).encode()
    garbage = io.TextIOWrapper(io.BytesIO(good + b"\xff\xfe\x00junk\n"), encoding="utf-8")
    before = sync_store.save_state("c")
    with pytest.raises(ImportFormatError, match="not UTF-8"):  # (decoded in chunks: the
        import_jsonl(sync_store, garbage, replace=True)       # line is where reading failed)
    assert sync_store.save_state("c") == before
    with pytest.raises(InvalidInputError, match="UTF-8"):
        sync_store.restore_state(io.TextIOWrapper(io.BytesIO(b"\xff\xfe"), encoding="utf-8"))


# ---- fuzzing: a mutated export is imported exactly or refused cleanly ------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    store = MemoryStore(f"sqlite:///{path}", counter=FixedCounter())
    _seed(store, "src", 3)
    yield store
    store.close()


@settings(derandomize=True, database=None, max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_exports_import_exactly_or_fail_cleanly(fuzz_store: MemoryStore,
                                                         data: st.DataObject) -> None:
    lines = [json.loads(line) for line in _export(fuzz_store, ["src"]).splitlines()]
    index = data.draw(st.integers(0, len(lines) - 1), label="line")
    keys = sorted(lines[index])
    key = data.draw(st.sampled_from([*keys, "extra"]), label="key")
    action = data.draw(st.sampled_from(["set", "delete"]), label="action")
    if action == "delete":
        lines[index].pop(key, None)
    else:
        lines[index][key] = data.draw(_JSON, label="value")
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    target = f"t{data.draw(st.integers(0, 10**9), label='target')}"
    try:
        result = import_jsonl(fuzz_store, io.StringIO(text), rename=target)
    except (MemstoreError, ValidationError):
        with pytest.raises(ConversationNotFoundError):  # nothing of it was written
            fuzz_store.get_conversation(target)
        return
    # accepted: what is stored reads back as the lines said (counts are recounted)
    assert result.conversations[0].id == target
    stored = fuzz_store.messages(target)
    assert len(stored) == len(lines) - 1
    for line, message in zip(lines[1:], stored):
        expected = StoredMessage.model_validate({**line, "conversation_id": target})
        assert message.as_message() == expected.as_message()
        assert (message.seq, message.created_at) == (expected.seq, expected.created_at)
    fuzz_store.delete_conversation(target)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_in_memory_streams_stop_at_the_count_their_header_announced(kind: str) -> None:
    """An in-memory SQLite store reads each page on its own (no held snapshot): the first
    page's header fixes how many messages come back, whatever is appended meanwhile."""
    from memstore import AsyncMemoryStore

    store: Any = (MemoryStore("sqlite://", counter=FixedCounter()) if kind == "sync"
                  else AsyncMemoryStore("sqlite+aiosqlite://", counter=FixedCounter()))
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(10)]))
    seqs = []
    if kind == "sync":
        for m in store.iter_messages("c", page_size=3):
            seqs.append(m.seq)
            if m.seq == 4:
                store.extend("c", [Message.user("late")])
    else:
        async for m in store.iter_messages("c", page_size=3):
            seqs.append(m.seq)
            if m.seq == 4:
                await store.extend("c", [Message.user("late")])
    assert seqs == list(range(1, 11))
    await call(store.close())


def test_pager_trims_to_the_announced_newest_seq_and_stops() -> None:
    from datetime import datetime, timezone

    from memstore._streaming import Pager
    from memstore.models import StoredMessage

    now = datetime.now(timezone.utc)

    def page(*seqs: int) -> list[StoredMessage]:
        return [StoredMessage(role="user", content="x", id=f"m{s}", conversation_id="c", seq=s,
                              created_at=now, token_count=1, token_counter="f") for s in seqs]

    pager = Pager(3, snapshot=False)
    got, more = pager.take(page(1, 2, 3), 5)  # the header: newest seq 5
    assert [m.seq for m in got] == [1, 2, 3] and more and pager.after == 3
    got, more = pager.take(page(4, 5, 6), None)  # 6 was appended after the header
    assert [m.seq for m in got] == [4, 5] and not more
    # A stream starting at seq 4 of 5 messages: two to return, not five.
    pager = Pager(1, snapshot=False)
    assert pager.take(page(4), 5) == (page(4), True)
    assert pager.take(page(5), None) == (page(5), False)
    pager = Pager(3, snapshot=True)  # one snapshot: no trimming, a short page ends it
    assert pager.take(page(1, 2, 3), 5)[1] and not pager.take(page(4, 5), None)[1]


def test_an_export_that_fails_midway_releases_its_snapshot_at_once(sync_store: Any) -> None:
    """A progress callback that raises, or a write that fails (a full disk, a closed
    pipe), left the conversation's snapshot open for as long as the exception's
    traceback was referenced: its connection stayed checked out with its transaction,
    whose locks made a TRUNCATE or a migration wait."""
    sync_store.extend("c", [Message.user(f"m{i}") for i in range(transfer.EXPORT_PAGE + 5)])

    def fails(n: int) -> None:
        raise RuntimeError("progress bar broke")

    class FullDisk(io.StringIO):
        def write(self, text: str) -> int:
            if self.tell() > 100:
                raise OSError(28, "No space left on device")
            return super().write(text)

    kept: list[BaseException] = []  # as a logger or a test runner keeps the exception
    for run in (lambda: export_jsonl(sync_store, io.StringIO(), progress=fails),
                lambda: export_jsonl(sync_store, FullDisk())):
        with pytest.raises((RuntimeError, OSError)) as caught:
            run()
        kept.append(caught.value)
        assert sync_store.engine.pool.checkedout() == 0
    assert len(kept) == 2

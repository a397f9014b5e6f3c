"""Summaries through snapshot files (dump_state/load_state) and the JSONL export/import."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from memstore import (
    ConflictError,
    ConversationNotFoundError,
    ConversationState,
    ImportFormatError,
    InvalidInputError,
    MemoryStore,
    Message,
    StoredMessage,
    SummaryView,
    export_jsonl,
    import_jsonl,
)
from memstore.tokens import FixedCounter
from tests.helpers import call

VIEW = SummaryView(token_limit=60)


def turns(n: int, start: int = 0) -> list[Message]:
    out: list[Message] = []
    for i in range(start, start + n):
        out += [Message.user(f"question {i}", id=f"u{i}"),
                Message.assistant(f"answer {i}", id=f"a{i}")]
    return out


def gist(messages: list[Message]) -> str:
    seqs = [m.seq for m in messages if isinstance(m, StoredMessage)]
    return f"gist {seqs[0]}-{seqs[-1]}"


async def seed(store: Any, cid: str = "c") -> None:
    """A conversation with two summaries (2..17, then 2..37) and an unsummarized tail."""
    await call(store.extend(cid, [Message.system("You are terse.", id="sys"), *turns(10)]))
    await call(store.summarize(cid, gist, keep_tokens=20))
    await call(store.extend(cid, turns(10, start=10)))
    await call(store.summarize(cid, gist, keep_tokens=20))


def shape(window: Any) -> tuple[Any, ...]:
    """A window without its conversation id (to compare a copy with its original)."""
    return ([(m.role, m.text, getattr(m, "seq", None)) for m in window.messages],
            window.token_count, window.report.summary_range, window.report.unsummarized)


def renamed(summaries: list[Any], cid: str) -> list[Any]:
    return [s.model_copy(update={"conversation_id": cid}) for s in summaries]


# ---- dump_state / load_state -------------------------------------------------------------


async def test_dump_state_carries_summaries_and_load_state_restores_them(store: Any) -> None:
    await seed(store)
    summaries = await call(store.summaries("c"))
    assert [s.seq_range for s in summaries] == [(2, 17), (2, 37)]
    buffer = io.StringIO()
    await call(store.dump_state("c", buffer, page_size=4))
    text = buffer.getvalue()
    original = await call(store.save_state("c"))
    assert ConversationState.from_json(text) == original
    assert len(json.loads(text.splitlines()[0][:-len(',"messages":[')] + "}")["summaries"]) == 2
    want = shape(await call(store.window("c", VIEW)))
    assert want[2] == (2, 37)

    # a dump_state file and a whole to_json() file, loaded as new conversations
    report = await call(store.restore_state(io.StringIO(text), "copy"))
    assert report.written == original.conversation.message_count
    await call(store.load_state(io.StringIO(original.to_json()), "copy2"))
    for cid in ("copy", "copy2"):
        assert await call(store.summaries(cid)) == renamed(summaries, cid)
        assert shape(await call(store.window(cid, VIEW))) == want

    # replace=True onto a conversation with other summaries: exactly the snapshot's
    await call(store.summarize("copy", lambda ms: "other", keep_tokens=5))
    await call(store.load_state(io.StringIO(text), "copy", replace=True))
    assert await call(store.summaries("copy")) == renamed(summaries, "copy")
    assert await call(store.save_state("copy")) == ConversationState.model_validate({
        **original.model_dump(), "conversation": {**original.conversation.model_dump(),
                                                  "id": "copy"},
        "messages": [{**m.model_dump(), "conversation_id": "copy"} for m in original.messages],
        "summaries": [{**s.model_dump(), "conversation_id": "copy"} for s in summaries],
    })

    # replace=False appends the messages (new seqs): the summaries are not written
    count = original.conversation.message_count
    await call(store.extend("other", [Message.user("first", id="x")]))
    conv = await call(store.load_state(io.StringIO(text), "other", replace=False))
    assert conv.message_count == count + 1
    assert await call(store.summaries("other")) == []


async def test_an_empty_snapshot_with_summaries_loads_as_load_state_does(store: Any) -> None:
    await seed(store)
    await call(store.truncate("c", before_seq=10_000))  # every message gone; summaries kept
    state = await call(store.save_state("c"))
    assert state.messages == [] and len(state.summaries) == 2
    buffer = io.StringIO()
    await call(store.dump_state("c", buffer))
    await call(store.load_state(state, "whole"))
    await call(store.load_state(io.StringIO(buffer.getvalue()), "streamed"))
    await call(store.load_state(io.StringIO(state.to_json()), "json"))
    assert (await call(store.append("whole", Message.user("next")))).seq == 38
    for cid in ("streamed", "json"):
        assert (await call(store.get_conversation(cid))).message_count == 0
        assert await call(store.summaries(cid)) == renamed(state.summaries, cid)
        # seqs go on after the newest summarized one
        assert (await call(store.append(cid, Message.user("next")))).seq == 38


async def test_a_snapshot_file_whose_summary_passes_its_messages_writes_nothing(
    store: Any,
) -> None:
    await seed(store)
    buffer = io.StringIO()
    await call(store.dump_state("c", buffer))
    lines = buffer.getvalue().splitlines()
    # keep messages 1..30 only: summary 2 ends at seq 37
    cut = [*lines[:30], lines[30].rstrip(","), lines[-1]]
    with pytest.raises(InvalidInputError, match="summary 2 ends at seq 37"):
        await call(store.restore_state(io.StringIO("\n".join(cut)), "copy"))
    with pytest.raises(ConversationNotFoundError):
        await call(store.get_conversation("copy"))


# ---- export_jsonl / import_jsonl ---------------------------------------------------------


@pytest.fixture
def sync_store(db_url: str, counter: FixedCounter) -> Any:
    store = MemoryStore(db_url, counter=counter)
    yield store
    store.close()


def export(store: MemoryStore, ids: Any = None) -> str:
    buffer = io.StringIO()
    export_jsonl(store, buffer, ids)
    return buffer.getvalue()


def load(store: MemoryStore, text: str, **kwargs: Any) -> Any:
    return import_jsonl(store, io.StringIO(text), **kwargs).conversations


async def test_export_writes_summary_lines_after_the_messages(sync_store: MemoryStore) -> None:
    await seed(sync_store)
    await call(sync_store.extend("plain", turns(2)))
    buffer = io.StringIO()
    result = export_jsonl(sync_store, buffer)
    assert (result.conversations, result.summaries) == (2, 2)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    kinds = [line.get("type", "message") for line in lines]
    count = sync_store.get_conversation("c").message_count
    assert kinds == (["conversation", *["message"] * count, "summary", "summary",
                      "conversation", *["message"] * 4])
    assert lines[count + 1]["memstore_export"] == 1
    stored = sync_store.summaries("c")
    assert [json.loads(json.dumps(s.model_dump(mode="json"))) for s in stored] == [
        {k: v for k, v in line.items() if k not in ("memstore_export", "type")}
        for line in lines[count + 1:count + 3]]


async def test_import_stores_summaries_and_reimport_stores_nothing_new(
    sync_store: MemoryStore,
) -> None:
    await seed(sync_store)
    text = export(sync_store)
    summaries = sync_store.summaries("c")
    want = shape(sync_store.window("c", VIEW))
    [first] = load(sync_store, text, rename="copy")
    assert (first.summaries, first.summaries_unchanged) == (2, 0)
    assert sync_store.summaries("copy") == renamed(summaries, "copy")
    assert shape(sync_store.window("copy", VIEW)) == want
    [again] = load(sync_store, text, rename="copy")
    assert (again.written, again.summaries, again.summaries_unchanged) == (0, 0, 2)
    assert sync_store.summaries("copy") == renamed(summaries, "copy")
    [replaced] = load(sync_store, text, rename="copy", replace=True)
    assert replaced.replaced and replaced.summaries == 2
    assert sync_store.summaries("copy") == renamed(summaries, "copy")

    # the source grows and summarizes again: a merge import brings the new summary
    sync_store.extend("c", turns(5, start=20))
    sync_store.summarize("c", gist, keep_tokens=20)
    [grown] = load(sync_store, export(sync_store, ["c"]), rename="copy")
    assert (grown.written, grown.summaries, grown.summaries_unchanged) == (10, 1, 2)
    assert sync_store.summaries("copy") == renamed(sync_store.summaries("c"), "copy")
    assert shape(sync_store.window("copy", VIEW)) == shape(sync_store.window("c", VIEW))


async def test_merge_import_leaves_out_summaries_of_moved_messages(
    sync_store: MemoryStore,
) -> None:
    await seed(sync_store)
    text = export(sync_store)
    sync_store.extend("other", [Message.user("already here", id="x")])
    [result] = load(sync_store, text, rename="other")
    assert result.written == sync_store.get_conversation("c").message_count
    assert (result.summaries, result.summaries_unchanged) == (0, 0)
    assert sync_store.summaries("other") == []  # seqs moved by one: ranges would lie


async def test_a_changed_summary_is_a_conflict(sync_store: MemoryStore) -> None:
    await seed(sync_store)
    text = export(sync_store)
    load(sync_store, text, rename="copy")
    edited = text.replace('"text":"gist', '"text":"edited gist')
    with pytest.raises(ConflictError, match="summary 1"):
        load(sync_store, edited, rename="copy")
    assert sync_store.summaries("copy") == renamed(sync_store.summaries("c"), "copy")


async def test_bad_summary_lines_are_format_errors_with_their_line(
    sync_store: MemoryStore,
) -> None:
    await seed(sync_store)
    lines = export(sync_store).splitlines()
    count = sync_store.get_conversation("c").message_count
    summary_line = count + 2  # 1-based: header, messages, then the summaries
    # messages cut at seq 30: summary 2 (2..37) is not covered
    head = json.loads(lines[0])
    short = [json.dumps({**head, "message_count": 30}), *lines[1:31], *lines[count + 1:]]
    with pytest.raises(ImportFormatError, match="not in the imported messages") as info:
        load(sync_store, "\n".join(short), rename="copy")
    assert info.value.line == 33
    with pytest.raises(ConversationNotFoundError):
        sync_store.get_conversation("copy")
    # out of order, foreign, malformed, and a summary line with no conversation
    swapped = [*lines[:count + 1], lines[count + 2], lines[count + 1]]
    foreign = [*lines[:count + 1], lines[count + 1].replace('"conversation_id":"c"',
                                                             '"conversation_id":"zz"')]
    bad = [*lines[:count + 1], lines[count + 1].replace('"number":1', '"number":0')]
    cases = [(swapped, summary_line + 1, "does not extend"),
             (foreign, summary_line, "belongs to conversation 'zz'"),
             (bad, summary_line, "not a summary"),
             ([lines[count + 1], *lines], 1, "before any conversation header")]
    for case, line, match in cases:
        with pytest.raises(ImportFormatError, match=match) as info:
            load(sync_store, "\n".join(case), replace=True)
        assert info.value.line == line
    assert sync_store.summaries("c")[-1].seq_range == (2, 37)


async def test_files_without_summary_lines_still_import(sync_store: MemoryStore) -> None:
    await seed(sync_store)
    lines = [line for line in export(sync_store).splitlines() if '"type":"summary"' not in line]
    [result] = load(sync_store, "\n".join(lines), rename="copy")
    assert result.written == sync_store.get_conversation("c").message_count
    assert result.summaries == 0 and sync_store.summaries("copy") == []


# ---- SQLite -> PostgreSQL ----------------------------------------------------------------


@pytest.mark.postgres
async def test_sqlite_to_postgres_keeps_summaries_and_the_summary_window(
    tmp_path: Any, pg_url: str, counter: FixedCounter,
) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    lite = MemoryStore(f"sqlite:///{tmp_path / 'lite.db'}", counter=counter)
    pg = MemoryStore(pg_url, counter=counter)
    try:
        await seed(lite)
        views = [VIEW, SummaryView(token_limit=200), SummaryView(token_limit=30, reserve=2)]
        import_jsonl(pg, io.StringIO(export(lite)))
        assert pg.save_state("c") == lite.save_state("c")
        assert [pg.window("c", v) for v in views] == [lite.window("c", v) for v in views]
        buffer = io.StringIO()
        lite.dump_state("c", buffer)
        pg.load_state(io.StringIO(buffer.getvalue()), "dumped")
        assert pg.summaries("dumped") == renamed(lite.summaries("c"), "dumped")
        assert [shape(pg.window("dumped", v)) for v in views] == [
            shape(lite.window("c", v)) for v in views]
    finally:
        lite.close()
        pg.close()


# ---- the CLI -----------------------------------------------------------------------------


async def test_cli_export_and_import_report_summaries(tmp_path: Any, capsys: Any,
                                                       counter: FixedCounter) -> None:
    from memstore.cli import main

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with MemoryStore(url, counter=counter) as store:
        await seed(store)
    dump = tmp_path / "c.jsonl"
    assert main(["export", "c", "-o", str(dump), "--url", url]) == 0
    _, err = capsys.readouterr()
    assert "2 summaries" in err
    assert main(["import", str(dump), "--as", "copy", "--url", url]) == 0
    out, _ = capsys.readouterr()
    assert "copy: 41 messages written, 2 summaries stored" in out
    assert main(["import", str(dump), "--as", "copy", "--url", url]) == 0
    out, _ = capsys.readouterr()
    assert "copy: nothing new (41 messages already stored)" in out
    with MemoryStore(url, counter=counter) as store:
        assert store.summaries("copy") == renamed(store.summaries("c"), "copy")

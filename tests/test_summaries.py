"""Persisted summaries: ``store.summarize``, ``store.summaries``, ``SummaryView`` and state."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect

from memstore import (
    ConflictError,
    ContextBudgetError,
    ConversationNotFoundError,
    ConversationState,
    InvalidInputError,
    ListHistory,
    MemoryStore,
    Message,
    StoredMessage,
    Summary,
    SummaryView,
    TokenLimitedView,
    ToolCall,
    migrate,
    view_from_config,
)
from memstore._base import SUMMARIZE_ATTEMPTS
from memstore.aio import AsyncMemoryStore
from memstore.tokens import FixedCounter
from tests.helpers import call

ROOT = Path(__file__).resolve().parent.parent


class Folder:
    """A deterministic summarizer: the previous summary's text plus the new seqs.

    So the final summary lists every seq ever folded in, in folding order: a lost
    or twice-folded unit shows up in it.
    """

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []
        self.lock = threading.Lock()

    @staticmethod
    def split(messages: list[Message]) -> tuple[str, list[Message]]:
        first = messages[0] if messages else None
        if first is not None and first.metadata.get("memstore", {}).get("summary"):  # type: ignore[union-attr]
            return first.text.split(": ", 1)[1], messages[1:]
        return "", messages

    def __call__(self, messages: list[Message]) -> str:
        with self.lock:
            self.calls.append(list(messages))
        previous, new = self.split(messages)
        seqs = " ".join(str(m.seq) for m in new if isinstance(m, StoredMessage))
        return f"{previous} {seqs}".strip()


def folded_seqs(summary: Summary) -> list[int]:
    return [int(s) for s in summary.text.split()]


def turns(n: int, start: int = 0) -> list[Message]:
    out: list[Message] = []
    for i in range(start, start + n):
        out += [Message.user(f"question {i}"), Message.assistant(f"answer {i}")]
    return out


async def chat(store: Any, cid: str, n: int, *, system: bool = True) -> None:
    messages = ([Message.system("You are terse.")] if system else []) + turns(n)
    await call(store.extend(cid, messages))


# ---- summarize ---------------------------------------------------------------------------


async def test_summarize_folds_old_units_and_keeps_the_recent_tokens(store: Any) -> None:
    await chat(store, "c", 10)  # seq 1 system, then 20 messages of 5 tokens each
    folder = Folder()
    summary = await call(store.summarize("c", folder, keep_tokens=20))
    assert isinstance(summary, Summary)
    # the newest 4 messages (20 tokens) stay; seqs 2..17 are folded; the system
    # message is anchored (every view keeps it) and is not given to the summarizer
    assert [m.seq for m in folder.calls[0]] == list(range(2, 18))  # type: ignore[attr-defined]
    assert (summary.first_seq, summary.last_seq, summary.number) == (2, 17, 1)
    assert summary.token_counter == store.counter.name
    assert summary.token_count == store.counter.count_message(Message.system(summary.text))
    assert summary.created_at.tzinfo is not None
    assert await call(store.summaries("c")) == [summary]
    # the originals stay stored
    assert len(await call(store.messages("c"))) == 21


async def test_summarize_is_incremental(store: Any) -> None:
    await chat(store, "c", 10)
    folder = Folder()
    first = await call(store.summarize("c", folder, keep_tokens=20))
    # nothing aged out since: no call, the latest summary comes back
    again = await call(store.summarize("c", folder, keep_tokens=20))
    assert again == first and len(folder.calls) == 1
    await call(store.extend("c", turns(3, start=10)))  # seqs 22..27
    second = await call(store.summarize("c", folder, keep_tokens=20))
    assert len(folder.calls) == 2
    given = folder.calls[1]
    # the previous summary first (as one system message), then only the new units
    assert given[0].role == "system" and given[0].text == first.to_message().text
    assert given[0].metadata == {"memstore": {"summary": True, "first_seq": 2, "last_seq": 17}}
    assert [m.seq for m in given[1:]] == list(range(18, 24))  # type: ignore[attr-defined]
    assert (second.first_seq, second.last_seq, second.number) == (2, 23, 2)
    assert folded_seqs(second) == list(range(2, 24))
    assert await call(store.summaries("c")) == [first, second]


async def test_summarize_keeps_tool_units_whole_and_skips_incomplete_ones(store: Any) -> None:
    call_a = Message.assistant(tool_calls=[ToolCall(id="a", name="f", arguments="{}"),
                                           ToolCall(id="b", name="g", arguments="{}")])
    await call(store.extend("c", [
        Message.user("old question"),                      # 1
        Message.tool("orphan", tool_call_id="zzz"),        # 2: an orphan result
        Message.user("look it up"),                        # 3
        call_a,                                            # 4
        Message.tool("A", tool_call_id="a"),               # 5
        Message.tool("B", tool_call_id="b"),               # 6
        Message.user("pinned fact", pinned=True),          # 7
        Message.user("recent"),                            # 8
        Message.assistant(tool_calls=[ToolCall(id="p", name="f", arguments="{}")]),  # 9 pending
    ]))
    folder = Folder()
    # the call unit (4..6) costs 3+2+2 + 3+1 + 3+1 = 15 tokens; "recent" 4: keep 10 keeps
    # only "recent" (the pinned message is kept by every view and costs nothing here)
    summary = await call(store.summarize("c", folder, keep_tokens=10))
    assert [m.seq for m in folder.calls[0]] == [1, 3, 4, 5, 6]  # type: ignore[attr-defined]
    assert (summary.first_seq, summary.last_seq) == (1, 6)
    # the pending call is never folded: it may still be answered
    await call(store.append("c", Message.tool("P", tool_call_id="p")))  # 10
    await call(store.append("c", Message.user("next")))                 # 11
    summary = await call(store.summarize("c", folder, keep_tokens=0))
    # keep_tokens=0 still keeps the newest unit ("next", the turn being answered)
    assert [m.seq for m in folder.calls[1][1:]] == [8, 9, 10]  # type: ignore[attr-defined]
    assert summary.last_seq == 10


async def test_summarize_with_nothing_old_enough_writes_nothing(store: Any) -> None:
    await chat(store, "c", 2)
    folder = Folder()
    assert await call(store.summarize("c", folder, keep_tokens=10_000)) is None
    assert folder.calls == [] and await call(store.summaries("c")) == []


async def test_summarize_accepts_a_message_and_another_counter(store: Any) -> None:
    await chat(store, "c", 4)
    other = FixedCounter(per_message=1)
    summary = await call(store.summarize(
        "c", lambda ms: Message.assistant(f"{len(ms)} messages"), keep_tokens=2, counter=other
    ))
    assert summary.text == "6 messages"  # other counts 1 a message: the newest 2 stay
    assert summary.token_counter == other.name and summary.token_count == 1


async def test_summarize_rejects_bad_input_and_writes_nothing(store: Any) -> None:
    await chat(store, "c", 4)
    bad_results: list[Any] = [None, 42, "", "   ", "nul\x00", "lone \ud800",
                              Message.assistant(tool_calls=[
        ToolCall(id="x", name="f", arguments="{}")])]
    for bad in bad_results:
        with pytest.raises(InvalidInputError):
            await call(store.summarize("c", lambda ms, bad=bad: bad, keep_tokens=0))
    with pytest.raises(InvalidInputError, match="keep_tokens"):
        await call(store.summarize("c", Folder(), keep_tokens=-1))
    with pytest.raises(InvalidInputError, match="keep_tokens"):
        await call(store.summarize("c", Folder(), keep_tokens="10"))
    with pytest.raises(InvalidInputError, match="callable"):
        await call(store.summarize("c", "not a function", keep_tokens=0))
    with pytest.raises(InvalidInputError, match="counter"):
        await call(store.summarize("c", Folder(), keep_tokens=0, counter="cl100k"))

    class Returns(FixedCounter):
        """A counter whose counts are not token counts."""

        def __init__(self, value: Any) -> None:
            super().__init__()
            self.value = value

        @property
        def name(self) -> str:
            return "returns"

        def count_message(self, message: Message) -> Any:
            return self.value

    for value in (None, "7", 1.5, -5, 2**70):
        folder = Folder()
        with pytest.raises(InvalidInputError, match="token counter 'returns' counted"):
            await call(store.summarize("c", folder, keep_tokens=0, counter=Returns(value)))
        assert folder.calls == []  # refused before anything was read or summarized
    with pytest.raises(ConversationNotFoundError):
        await call(store.summarize("nope", Folder(), keep_tokens=0))
    with pytest.raises(ConversationNotFoundError):
        await call(store.summaries("nope"))

    def broken(messages: list[Message]) -> str:
        raise RuntimeError("model unavailable")

    with pytest.raises(RuntimeError, match="model unavailable"):
        await call(store.summarize("c", broken, keep_tokens=0))
    assert await call(store.summaries("c")) == []


def test_sync_store_refuses_an_async_summarizer(db_url: str) -> None:
    async def summarize(messages: list[Message]) -> str:
        return "never"

    with MemoryStore(db_url, counter=FixedCounter(per_message=1)) as store:
        store.extend("c", turns(3))
        with pytest.raises(InvalidInputError, match="AsyncMemoryStore"):
            store.summarize("c", summarize, keep_tokens=0)
        assert store.summaries("c") == []


async def test_async_store_awaits_async_summarizers(db_url: str) -> None:
    async def summarize(messages: list[Message]) -> str:
        await asyncio.sleep(0)
        return f"{len(messages)} folded"

    async with AsyncMemoryStore(db_url, counter=FixedCounter(per_message=1)) as store:
        await store.extend("c", turns(3))
        summary = await store.summarize("c", summarize, keep_tokens=2)
        assert summary is not None and summary.text == "4 folded"
        await store.extend("c", turns(1, start=3))
        summary = await store.summarize("c", summarize, keep_tokens=2)
        assert summary is not None and summary.text == "3 folded"  # previous + 2 new


# ---- destructive operations and summaries ------------------------------------------------


async def test_pop_clear_truncate_delete_and_summaries(store: Any) -> None:
    await chat(store, "c", 10, system=False)  # seqs 1..20
    folder = Folder()
    s1 = await call(store.summarize("c", folder, keep_tokens=40))  # folds 1..12
    await call(store.extend("c", turns(2, start=10)))  # 21..24
    s2 = await call(store.summarize("c", folder, keep_tokens=10))  # folds 13..22
    assert (s1.last_seq, s2.last_seq) == (12, 22)
    # truncate keeps the summaries: they stand for the deleted messages
    await call(store.truncate("c", before_seq=13))
    assert await call(store.summaries("c")) == [s1, s2]
    # popping seqs a summary stands for deletes that summary (its seqs get reused)
    await call(store.pop("c", 3))  # 22..24
    assert await call(store.summaries("c")) == [s1]
    # clear restarts seqs at 1: no summary survives
    await call(store.clear("c"))
    assert await call(store.summaries("c")) == []
    await chat(store, "c", 4, system=False)
    await call(store.summarize("c", folder, keep_tokens=0))
    await call(store.delete_conversation("c"))
    await call(store.create_conversation("c"))
    assert await call(store.summaries("c")) == []


async def test_unpinning_a_message_no_summary_holds_deletes_the_summaries_reaching_it(
    store: Any,
) -> None:
    """summarize skips pinned messages (every view keeps them), so no summary stands for
    one: unpinned later, SummaryView would hide it behind a summary that never saw it."""
    await call(store.extend("c", [Message.system("S"), Message.user("my account id is 4711"),
                                  Message.assistant("noted"), Message.user("q2"),
                                  Message.assistant("a2"), Message.user("q3")]))
    await call(store.pin("c", 2))
    kept = await call(store.summarize("c", Folder(), keep_tokens=0))
    assert 2 not in folded_seqs(kept) and kept.last_seq >= 2
    # pinning and unpinning a message no summary reaches keeps the summaries
    await call(store.pin("c", 6))
    await call(store.unpin("c", 6))
    assert await call(store.summaries("c")) == [kept]
    await call(store.unpin("c", 2))
    assert await call(store.summaries("c")) == []
    window = await call(store.window("c", SummaryView(1000)))
    assert 2 in window.seqs and window.report.summary_range is None
    # summarized again, the message is folded in this time
    again = await call(store.summarize("c", Folder(), keep_tokens=0))
    assert 2 in folded_seqs(again)


# ---- SummaryView -------------------------------------------------------------------------


async def test_summary_view_shows_anchored_summary_and_tail(store: Any) -> None:
    await chat(store, "c", 10)
    await call(store.pin("c", 4))
    summary = await call(store.summarize("c", Folder(), keep_tokens=20))
    assert summary.seq_range == (2, 17)
    view = SummaryView(token_limit=200)
    window = await call(store.window("c", view))
    texts = [m.text for m in window.messages]
    assert texts[0] == "You are terse."
    assert texts[1] == "question 1"  # pinned: kept in place, not summarized away
    assert texts[2] == f"Summary of messages 2–17: {summary.text}"
    assert window.seqs == [1, 4, 18, 19, 20, 21]
    rendered = window.messages[2]
    assert not isinstance(rendered, StoredMessage) and rendered.role == "system"
    report = window.report
    assert report.summary_range == (2, 17) and report.unsummarized == 0
    assert [(o.first_seq, o.last_seq, o.reason) for o in report.omitted] == [
        (2, 3, "summarized"), (5, 17, "summarized")]
    counter = store.counter
    assert window.token_count == counter.count_messages(window.messages) <= 200
    assert [m["role"] for m in window.to_openai()][:3] == ["system", "user", "system"]


async def test_summary_view_reports_unsummarized_messages(store: Any) -> None:
    await chat(store, "c", 10)
    await call(store.summarize("c", lambda ms: "gist", keep_tokens=20))  # 2..17
    await call(store.extend("c", turns(10, start=10)))  # 22..41
    view = SummaryView(token_limit=60)
    window = await call(store.window("c", view))
    tail = window.seqs[1:]
    assert tail == list(range(tail[0], 42))
    # everything after the summary that is not shown is unsummarized
    assert window.report.unsummarized == tail[0] - 18
    assert window.token_count == store.counter.count_messages(window.messages) <= 60
    # summarizing with the view's tail size brings it back to 0
    await call(store.summarize("c", lambda ms: "gist", keep_tokens=5 * len(tail)))
    window = await call(store.window("c", view))
    assert window.report.unsummarized == 0 and window.seqs[1:] == tail


async def test_summary_view_without_a_summary_is_a_token_limited_view(store: Any) -> None:
    await chat(store, "c", 10)
    got = await call(store.window("c", SummaryView(token_limit=40, reserve=3)))
    want = await call(store.window("c", TokenLimitedView(token_limit=40, reserve=3)))
    assert got.messages == want.messages and got.token_count == want.token_count
    assert got.report.summary_range is None
    assert got.report.unsummarized == want.report.omitted_count
    assert want.report.summary_range is None and want.report.unsummarized == 0


async def test_summary_view_budget_errors(store: Any) -> None:
    await chat(store, "c", 10)
    await call(store.summarize("c", lambda ms: "word " * 50, keep_tokens=20))
    with pytest.raises(ContextBudgetError) as info:
        await call(store.window("c", SummaryView(token_limit=50)))
    # system 6 + summary (3 + 4 template words + 50) + newest unit 5 + priming 3
    assert info.value.required == 6 + 57 + 5 + 3 and info.value.budget == 50
    # everything summarized but the newest unit (the turn being answered), which
    # keep_tokens=0 still keeps: anchored + summary + newest unit must fit
    await call(store.summarize("c", lambda ms: "short", keep_tokens=0))
    window = await call(store.window("c", SummaryView(token_limit=22)))
    assert window.seqs == [1, 21] and window.report.unsummarized == 0
    assert window.messages[1].text == "Summary of messages 2–20: short"
    # system 6 + summary 8 + newest unit 5 + priming 3
    assert window.token_count == 22
    with pytest.raises(ContextBudgetError) as info:
        await call(store.window("c", SummaryView(token_limit=21)))
    assert info.value.required == 22


async def test_summary_view_reads_only_the_summary_and_the_tail(store: Any) -> None:
    """rows_read does not grow with the summarized history."""
    reads = []
    for cid, n in (("small", 50), ("large", 1500)):
        await chat(store, cid, n)
        await call(store.summarize(cid, lambda ms: "gist", keep_tokens=50))
        await call(store.extend(cid, turns(2, start=n)))
        window = await call(store.window(cid, SummaryView(token_limit=200)))
        assert window.report.unsummarized == 0
        reads.append((window.report.rows_read, len(window.seqs)))
    (small_read, small_len), (large_read, large_len) = reads
    assert small_len == large_len
    assert large_read == small_read <= small_len + 16


async def test_summary_view_never_writes(store: Any) -> None:
    await chat(store, "c", 6)
    await call(store.summarize("c", Folder(), keep_tokens=10))
    before = (await call(store.save_state("c"))).model_dump()
    await call(store.window("c", SummaryView(token_limit=100)))
    assert (await call(store.save_state("c"))).model_dump() == before


def test_summary_view_configuration() -> None:
    view = SummaryView(token_limit=500, reserve=10, tools=[{"type": "function"}],
                       template="[{first}-{last}] {text}")
    config = view.to_config()
    assert config["type"] == "SummaryView" and config["template"] == "[{first}-{last}] {text}"
    assert view_from_config(json.loads(json.dumps(config))) == view
    for bad in ({"token_limit": 0}, {"token_limit": 10, "reserve": 10},
                {"token_limit": 10, "template": "{nope}"}, {"token_limit": 10, "template": 3},
                {"token_limit": 10, "template": "{first.real}"},
                # seqs run to 2**62: {last:c} fails past U+10FFFF, makes a surrogate below
                {"token_limit": 10, "template": "{text} (up to #{last:c})"},
                {"token_limit": 10, "template": "{first:c}{text}"},
                {"token_limit": 10, "template": "{text:>99999}"},
                {"token_limit": 10, "template": "{text"},
                {"token_limit": 10, "template": "bad \ud800 {text}"},
                {"token_limit": 10, "template": "x" * 5000},
                {"token_limit": 10, "counter": "x"}):
        with pytest.raises(ValueError):
            SummaryView(**bad)


def test_summary_view_over_a_list_history() -> None:
    counter = FixedCounter(per_message=1)
    now = datetime.now(timezone.utc)
    stored = [
        StoredMessage(**m.model_dump(exclude={"id"}), conversation_id="c", seq=i + 1,
                      created_at=now, token_count=1, token_counter=counter.name, id=f"m{i}")
        for i, m in enumerate(turns(5))
    ]
    summary = Summary(conversation_id="c", number=1, first_seq=1, last_seq=6, text="gist",
                      token_count=1, token_counter=counter.name, created_at=now)
    source = ListHistory(stored, summaries=[summary])
    assert source.latest_summary() == summary
    assert ListHistory(stored).latest_summary() is None
    window = SummaryView(token_limit=100).apply(stored, counter, summaries=[summary])
    assert window.seqs == [7, 8, 9, 10] and window.report.summary_range == (1, 6)
    assert window.messages[0].text == "Summary of messages 1–6: gist"
    # a summary ending after the list's newest message is not this history's
    late = summary.model_copy(update={"number": 2, "last_seq": 11})
    assert ListHistory(stored, summaries=[summary, late]).latest_summary() == summary
    # another conversation's summary is refused, not shown as this one's
    other = summary.model_copy(update={"conversation_id": "other"})
    with pytest.raises(InvalidInputError, match="the summaries belong to 'other' and the "
                       "messages to 'c'"):
        SummaryView(token_limit=100).apply(stored, counter, summaries=[other])
    with pytest.raises(InvalidInputError, match="the summaries belong to 'c', 'other'"):
        ListHistory([], summaries=[summary, other])


# ---- state -------------------------------------------------------------------------------


async def test_state_round_trip_keeps_summaries(store: Any) -> None:
    await chat(store, "c", 8)
    folder = Folder()
    await call(store.summarize("c", folder, keep_tokens=20))
    await call(store.extend("c", turns(2, start=8)))
    await call(store.summarize("c", folder, keep_tokens=20))
    state = await call(store.save_state("c"))
    assert state.version == 2 and len(state.summaries) == 2
    text = state.to_json()
    await call(store.load_state(ConversationState.from_json(text), "copy"))
    copied = await call(store.summaries("copy"))
    assert [s.model_copy(update={"conversation_id": "c"}) for s in copied] == state.summaries
    view = SummaryView(token_limit=100)
    a = await call(store.window("c", view))
    b = await call(store.window("copy", view))
    assert a.to_openai() == b.to_openai() and a.report.summary_range == b.report.summary_range
    # replacing with a snapshot without summaries removes them
    bare = state.model_copy(update={"summaries": []})
    await call(store.load_state(bare, "copy"))
    assert await call(store.summaries("copy")) == []
    # appending a snapshot to a stored conversation renumbers its messages: the
    # snapshot's summaries do not apply there and are left out
    await call(store.extend("other", turns(2)))
    await call(store.load_state(state, "other", replace=False))
    assert len(await call(store.messages("other"))) == 4 + len(state.messages)
    assert await call(store.summaries("other")) == []


async def test_state_of_a_fully_truncated_conversation_keeps_seqs_after_its_summary(
    store: Any,
) -> None:
    await chat(store, "c", 4, system=False)
    summary = await call(store.summarize("c", Folder(), keep_tokens=0))
    await call(store.truncate("c", before_seq=9))
    state = await call(store.save_state("c"))
    assert state.messages == [] and state.summaries == [summary]
    await call(store.load_state(state, "d"))
    stored = await call(store.append("d", Message.user("after")))
    assert stored.seq == summary.last_seq + 1


def test_version_1_snapshot_still_loads(db_url: str) -> None:
    snapshot = {
        "format": "memstore.conversation", "version": 1,
        "conversation": {"id": "old", "created_at": "2026-01-01T00:00:00Z",
                         "updated_at": "2026-01-01T00:00:00Z", "metadata": {},
                         "message_count": 1, "token_count": 4},
        "messages": [{"role": "user", "content": "hello there", "conversation_id": "old",
                      "seq": 1, "created_at": "2026-01-01T00:00:00Z", "token_count": 4,
                      "token_counter": "fixed/1/0/1/0/0", "id": "m1"}],
        "view": None,
    }
    with MemoryStore(db_url, counter=FixedCounter(per_message=1, per_word=1)) as store:
        store.load_state(json.dumps(snapshot))
        assert store.summaries("old") == []
        assert store.save_state("old").version == 2
        assert [m.text for m in store.messages("old")] == ["hello there"]


def test_state_rejects_inconsistent_summaries() -> None:
    now = "2026-01-01T00:00:00Z"
    base: dict[str, Any] = {
        "conversation": {"id": "c", "created_at": now, "updated_at": now},
        "messages": [{"role": "user", "content": "x", "conversation_id": "c", "seq": s,
                      "created_at": now, "token_count": 1, "token_counter": "f", "id": f"{s}"}
                     for s in (1, 2, 3)],
    }

    def summary(number: int, first: int, last: int, cid: str = "c") -> dict[str, Any]:
        return {"conversation_id": cid, "number": number, "first_seq": first,
                "last_seq": last, "text": "t", "token_count": 1, "token_counter": "f",
                "created_at": now}

    ConversationState.model_validate({**base, "summaries": [summary(1, 1, 1), summary(2, 1, 3)]})
    for bad in ([summary(1, 1, 2), summary(2, 2, 3)],   # does not contain the previous
                [summary(2, 1, 1), summary(1, 1, 2)],   # numbers out of order
                [summary(1, 1, 4)],                     # after the newest message
                [summary(1, 2, 1)],                     # empty range
                [summary(1, 1, 1, cid="other")]):
        with pytest.raises(ValueError):
            ConversationState.model_validate({**base, "summaries": bad})
    with pytest.raises(ValueError, match="version"):
        ConversationState.model_validate({**base, "version": 3})


@pytest.mark.postgres
def test_summaries_move_from_sqlite_to_postgres(tmp_path: Path, pg_url: str) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    counter = FixedCounter(per_message=3, per_word=1)
    lite_url = f"sqlite:///{tmp_path / 'lite.db'}"
    with MemoryStore(lite_url, counter=counter) as lite:
        lite.extend("c", [Message.system("sys"), *turns(12)])
        folder = Folder()
        lite.summarize("c", folder, keep_tokens=30)
        lite.extend("c", turns(3, start=12))
        lite.summarize("c", folder, keep_tokens=30)
        state = lite.save_state("c")
        lite_window = lite.window("c", SummaryView(token_limit=120))
    with MemoryStore(pg_url, counter=counter) as pg:
        pg.load_state(state.to_json())
        assert pg.summaries("c") == state.summaries
        assert pg.save_state("c") == state
        pg_window = pg.window("c", SummaryView(token_limit=120))
    assert pg_window.to_openai() == lite_window.to_openai()
    assert pg_window.report == lite_window.report


# ---- concurrency -------------------------------------------------------------------------


def _check_chain(summaries: list[Summary], expected_seqs: list[int]) -> None:
    """Numbers 1..n, each range containing the previous one, nothing folded twice or lost."""
    assert [s.number for s in summaries] == list(range(1, len(summaries) + 1))
    for before, after in itertools.pairwise(summaries):
        assert after.first_seq == before.first_seq and after.last_seq > before.last_seq
        assert folded_seqs(after)[:len(folded_seqs(before))] == folded_seqs(before)
    assert folded_seqs(summaries[-1]) == expected_seqs


def _summarize_in_threads(stores: list[MemoryStore], cid: str, folder: Folder) -> list[Any]:
    barrier = threading.Barrier(len(stores), timeout=30)

    def summarizer(messages: list[Message]) -> str:
        # Every call has read before any writes. (A retry after the others finished
        # would find nobody to wait for: the barrier is broken, it goes on.)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return folder(messages)

    results: list[Any] = [None] * len(stores)

    def run(i: int) -> None:
        try:
            results[i] = stores[i].summarize(cid, summarizer, keep_tokens=20)
        except BaseException as exc:  # pragma: no cover - reported below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    barrier.abort()
    return results


@pytest.mark.parametrize("two_stores", [False, True], ids=["threads", "two-stores"])
def test_concurrent_summarize_serialises(db_url: str, two_stores: bool) -> None:
    counter = FixedCounter(per_message=3, per_word=1)
    stores = [MemoryStore(db_url, counter=counter)]
    if two_stores:
        stores.append(MemoryStore(db_url, counter=counter))
    try:
        stores[0].extend("c", [Message.system("sys"), *turns(20)])
        runners = [stores[i % len(stores)] for i in range(4)]
        folder = Folder()
        results = _summarize_in_threads(runners, "c", folder)
        assert not [r for r in results if isinstance(r, BaseException)], results
        summaries = stores[0].summaries("c")
        # four concurrent calls with nothing appended between them: one summary,
        # the one every call returns (as if they had run one after the other)
        assert len(summaries) == 1 and all(r == summaries[0] for r in results)
        _check_chain(summaries, list(range(2, 38)))
        # rounds of appends and concurrent summaries: still one consistent chain
        for round_ in range(3):
            stores[-1].extend("c", turns(4, start=20 + 4 * round_))
            results = _summarize_in_threads(runners, "c", folder)
            assert not [r for r in results if isinstance(r, BaseException)], results
            latest = stores[0].summaries("c")[-1]
            assert all(r == latest for r in results)
        summaries = stores[0].summaries("c")
        assert len(summaries) == 4
        _check_chain(summaries, list(range(2, 62)))
        window = stores[0].window("c", SummaryView(token_limit=200))
        assert window.report.summary_range == (2, 61) and window.report.unsummarized == 0
    finally:
        for s in stores:
            s.close()


async def test_concurrent_async_summarize_on_two_stores(db_url: str) -> None:
    counter = FixedCounter(per_message=3, per_word=1)
    a = AsyncMemoryStore(db_url, counter=counter)
    b = AsyncMemoryStore(db_url, counter=counter)
    try:
        await a.extend("c", [Message.system("sys"), *turns(20)])
        folder = Folder()
        arrived = 0
        everyone = asyncio.Event()

        async def summarizer(messages: list[Message]) -> str:
            nonlocal arrived
            arrived += 1
            if arrived == 4:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 30)  # all four read before any writes
            return folder(messages)

        results = await asyncio.gather(*(
            store.summarize("c", summarizer, keep_tokens=20) for store in (a, b, a, b)
        ))
        summaries = await a.summaries("c")
        assert len(summaries) == 1 and all(r == summaries[0] for r in results)
        _check_chain(summaries, list(range(2, 38)))
        assert len(folder.calls) == 4  # all four summarized; three lost and read again
    finally:
        await a.close()
        await b.close()


def test_summarize_gives_up_when_it_always_loses(db_url: str, monkeypatch: Any) -> None:
    """A draft made stale by a concurrent summary on every attempt ends in ConflictError."""
    with MemoryStore(db_url, counter=FixedCounter(per_message=1)) as store, \
            MemoryStore(db_url, counter=FixedCounter(per_message=1)) as other:
        store.extend("c", turns(4))
        appended = 0

        def summarizer(messages: list[Message]) -> str:
            nonlocal appended
            # another writer appends and summarizes while this one thinks
            other.extend("c", turns(2, start=10 + 2 * appended))
            appended += 1
            other.summarize("c", lambda ms: "other", keep_tokens=2)  # leaves work for us
            return "mine"

        with pytest.raises(ConflictError, match="gave up"):
            store.summarize("c", summarizer, keep_tokens=0)
        assert appended == SUMMARIZE_ATTEMPTS
        assert all(s.text == "other" for s in store.summaries("c"))


# ---- migration ---------------------------------------------------------------------------


def test_summaries_migration_down_and_up(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    counter = FixedCounter(per_message=1)
    with MemoryStore(empty_db_url, counter=counter, migrate="check") as store:
        store.extend("c", turns(3))
        store.summarize("c", lambda ms: "gist", keep_tokens=0)
    migrate.downgrade(empty_db_url, "0002_conversation_epoch")
    engine = create_engine(empty_db_url)
    try:
        assert "memstore_summaries" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    migrate.upgrade(empty_db_url)
    with MemoryStore(empty_db_url, counter=counter, migrate="check") as store:
        assert store.summaries("c") == []
        assert len(store.messages("c")) == 6
        # deleting a conversation deletes its summaries (ON DELETE CASCADE)
        store.summarize("c", lambda ms: "again", keep_tokens=0)
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM memstore_conversations WHERE id = 'c'")
            left = conn.exec_driver_sql("SELECT count(*) FROM memstore_summaries").scalar()
        assert left == 0


# ---- docs --------------------------------------------------------------------------------


def test_summaries_doc_example_runs_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    text = (ROOT / "docs" / "summaries.md").read_text()
    fenced = text.split("```")[1::2]
    code = [b.split("\n", 1)[1] for b in fenced if b.startswith("python")]
    printed = [b.split("\n", 1)[1] for b in fenced if b.startswith("text")]
    assert len(code) == 1 and printed
    exec(compile(code[0], "summaries.md", "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out == printed[0]


# ---- windows read without a transaction --------------------------------------------------


@pytest.mark.parametrize("change", ["pop", "summarize", "clear"])
@pytest.mark.parametrize("reader", ["sync", "async"])
async def test_a_change_between_the_window_statements_is_never_half_seen(
    db_url: str, counter: FixedCounter, monkeypatch: Any, change: str, reader: str
) -> None:
    """A summary view reads its row, then the summary, then the tail: a write in between
    either leaves what it read valid or makes it read again in one snapshot."""
    from memstore._db import window as _window

    writer = MemoryStore(db_url, counter=counter)
    writer.extend("c", [Message.system("sys"), *turns(10)])
    writer.summarize("c", lambda ms: "first", keep_tokens=0)  # covers 2..21
    writer.extend("c", turns(3, start=10))  # 22..27
    real_execute = _window.SQLHistory._execute
    calls: list[tuple[str, bool]] = []

    def execute(self: Any, name: str, values: dict[str, Any]) -> Any:
        calls.append((name, self._checked))
        if name == "latest_summary" and len(calls) == 2:
            if change == "pop":
                writer.pop("c", 8)  # the summary covered 21: it goes
            elif change == "summarize":
                writer.summarize("c", lambda ms: "second", keep_tokens=10)
            else:
                writer.clear("c")
                writer.extend("c", turns(2))
        return real_execute(self, name, values)

    monkeypatch.setattr(_window.SQLHistory, "_execute", execute)
    view = SummaryView(token_limit=200)
    store: Any = (MemoryStore(db_url, counter=counter) if reader == "sync"
                  else AsyncMemoryStore(db_url, counter=counter))
    try:
        window = await call(store.window("c", view))
    finally:
        await call(store.close())
        monkeypatch.undo()
    fresh = writer.window("c", view)
    writer.close()
    # The first statement reads the conversation row (on PostgreSQL with the first page:
    # the view has a budget), outside a transaction; the second the summary.
    head = "conversation" if db_url.startswith("sqlite") else "conversation_page"
    assert calls[0] == (head, True) and calls[1] == ("latest_summary", True)
    if change == "summarize":
        # no message changed: the new summary ends within the rows first read, so the
        # window may use it, and it then equals a fresh read
        assert window == fresh and window.report.summary_range == (2, 25)
    else:
        assert (head, False) in calls  # read again in one snapshot
        assert window == fresh


def test_the_latest_summary_read_uses_the_key_on_sqlite(tmp_path: Path) -> None:
    from memstore._db import statements as q

    with MemoryStore(f"sqlite:///{tmp_path / 'plan.db'}",
                     counter=FixedCounter(per_message=1)) as store:
        for i in range(6):
            store.extend("c", turns(2, start=2 * i))
            store.summarize("c", lambda ms: "gist", keep_tokens=2)
        with store.engine.connect() as conn:
            compiled = q.hot(conn.dialect, "latest_summary")
            plan = " ".join(str(r) for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + compiled.sql,
                compiled.params({"cid": "c", "last": 100, "epoch": 1})).fetchall())
    assert "SCAN" not in plan and "TEMP B-TREE" not in plan, plan


# ---- with the context builder ------------------------------------------------------------


async def test_a_history_block_can_read_through_a_summary_view(store: Any) -> None:
    from memstore import Block, ContextBuilder, HistoryBlock, Strict, Tier

    await chat(store, "c", 60)
    await call(store.summarize("c", Folder(), keep_tokens=30))
    builder = ContextBuilder(400, counter=store.counter).add_block(
        Block("persona", tier=Tier.SYSTEM, strategy=Strict(),
              messages=[Message.system("Be brief.")])
    ).add_block(
        Block("history", tier=Tier.HISTORY, strategy=Strict(),
              history=HistoryBlock(store, "c", SummaryView(token_limit=50)))
    )
    compiled = (await builder.acompile() if isinstance(store, AsyncMemoryStore)
                else builder.compile())
    report = compiled.report.history_reports["history"]
    assert report.view == "SummaryView" and report.summary_range == (2, 115)
    assert report.unsummarized == 0 and report.rows_read == 1 + 6  # system + kept tail
    texts = [m.text for m in compiled.messages]
    assert texts[:2] == ["Be brief.", "You are terse."]
    assert texts[2].startswith("Summary of messages 2–115: 2 3 4")
    assert compiled.token_count == store.counter.count_messages(compiled.messages) <= 400


def test_summary_view_can_start_its_tail_on_a_user_turn() -> None:
    from memstore import ConfigurationError, MemoryStore, SummaryView
    from memstore.tokens import FixedCounter

    store = MemoryStore("sqlite://", counter=FixedCounter(per_message=10, priming=0))
    store.extend("c", [Message.system("s"), Message.user("q1"), Message.assistant("a1"),
                       Message.assistant("a2"), Message.user("q2"), Message.assistant("a3")])
    plain = store.window("c", SummaryView(40))
    assert [m.content for m in plain.messages] == ["s", "a2", "q2", "a3"]
    trimmed = store.window("c", SummaryView(40, start_on_user=True))
    assert [m.content for m in trimmed.messages] == ["s", "q2", "a3"]
    assert trimmed.report.omitted_seqs("start_on_user") == [4]
    assert SummaryView(40, start_on_user=True).to_config()["start_on_user"] is True
    with pytest.raises(ConfigurationError):
        SummaryView(40, start_on_user="yes")  # type: ignore[arg-type]

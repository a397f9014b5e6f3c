"""``store.rewrite``: replace the newest messages in one transaction, on both databases.

Every test runs on SQLite and PostgreSQL, with the sync and the async store.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError

from memstore import (
    ConflictError,
    ConversationNotFoundError,
    InvalidInputError,
    MemoryStore,
    Message,
    StoredMessage,
    SummaryView,
    ToolCall,
    UnboundedView,
)
from memstore.aio import AsyncMemoryStore
from memstore.tokens import FixedCounter
from memstore.transfer import export_jsonl, import_jsonl
from tests.helpers import call


def texts(messages: list[Any]) -> list[str]:
    return [m.text for m in messages]


def open_like(store: Any, db_url: str, counter: Any) -> Any:
    """A second store of the same kind on the same database."""
    if isinstance(store, AsyncMemoryStore):
        return AsyncMemoryStore(db_url, counter=counter)
    return MemoryStore(db_url, counter=counter)


async def seed(store: Any, cid: str = "c", n: int = 5) -> list[StoredMessage]:
    return await call(store.extend(cid, [Message.user(f"m{i}") for i in range(1, n + 1)]))


async def snapshot(store: Any, cid: str = "c") -> tuple[Any, ...]:
    """Everything a rewrite may change: messages, summaries, the conversation row."""
    return (await call(store.messages(cid)), await call(store.summaries(cid)),
            await call(store.get_conversation(cid)))


async def assert_consistent(store: Any, cid: str = "c") -> list[StoredMessage]:
    stored = await call(store.messages(cid))
    conversation = await call(store.get_conversation(cid))
    if stored:
        assert [m.seq for m in stored] == list(range(stored[0].seq, stored[0].seq + len(stored)))
    assert conversation.message_count == len(stored)
    assert conversation.token_count == sum(m.token_count for m in stored)
    assert await call(store.count_tokens(cid)) == conversation.token_count
    assert len({m.id for m in stored}) == len(stored)
    return stored  # type: ignore[no-any-return]


# ---- identity, seqs, counts ----------------------------------------------------------------


async def test_stored_messages_keep_their_identity_and_messages_are_new(
        store: Any, counter: Any) -> None:
    await seed(store)
    await call(store.append("c", Message.user("named", name="ann", metadata={"k": [1]},
                                              id="client-6")))
    await call(store.set_score("c", 4, 2.5))
    await call(store.pin("c", 4))
    old = await call(store.messages("c"))
    before = time.time()

    def fn(messages: list[StoredMessage]) -> list[Message]:
        assert [m.seq for m in messages] == [4, 5, 6]
        m4, _m5, m6 = messages
        return [m6.model_copy(update={"content": "named, longer now"}),
                Message.assistant("new"), m4]

    result = await call(store.rewrite("c", fn, newest=3))
    stored = await assert_consistent(store)
    assert stored[3:] == result
    assert [m.seq for m in result] == [4, 5, 6]
    assert texts(stored) == ["m1", "m2", "m3", "named, longer now", "new", "m4"]
    assert stored[:3] == old[:3]  # not read, not touched
    moved6, new, moved4 = result
    # a StoredMessage keeps everything but its seq (and, when its content changed, its count)
    for moved, was in ((moved6, old[5]), (moved4, old[3])):
        assert (moved.id, moved.created_at, moved.score, moved.pinned, moved.name,
                moved.metadata) == (was.id, was.created_at, was.score, was.pinned, was.name,
                                    was.metadata)
    assert moved4.token_count == old[3].token_count and moved4.score == 2.5 and moved4.pinned
    assert moved6.id == "client-6" and moved6.name == "ann" and moved6.metadata == {"k": [1]}
    assert moved6.token_count == counter.count_message(moved6) != old[5].token_count
    assert moved6.token_counter == counter.name
    # a Message is new: a new id, the time of the rewrite
    assert new.id not in {m.id for m in old}
    assert new.created_at.timestamp() >= before - 1
    assert new.token_count == counter.count_message(new)
    # seqs go on after the rewrite
    appended = await call(store.append("c", Message.user("after")))
    assert appended.seq == 7


async def test_seqs_stay_contiguous_when_the_rewrite_shrinks_or_grows(store: Any) -> None:
    await seed(store, n=6)
    out = await call(store.rewrite("c", lambda ms: ms[::2], newest=4))  # m3 m5 kept
    assert [(m.seq, m.text) for m in out] == [(3, "m3"), (4, "m5")]
    assert texts(await assert_consistent(store)) == ["m1", "m2", "m3", "m5"]
    grown = await call(store.rewrite(
        "c", lambda ms: [*ms, *(Message.user(f"x{i}") for i in range(3))], newest=1))
    assert [m.seq for m in grown] == [4, 5, 6, 7]
    assert texts(await assert_consistent(store)) == ["m1", "m2", "m3", "m5", "x0", "x1", "x2"]
    assert (await call(store.append("c", Message.user("next")))).seq == 8
    # everything removed: the conversation stays, empty, and seqs go on from the gap
    assert await call(store.rewrite("c", lambda ms: [])) == []
    assert await assert_consistent(store) == []
    assert (await call(store.append("c", Message.user("again")))).seq == 1


async def test_an_unchanged_result_writes_nothing(store: Any) -> None:
    await seed(store)
    before = await snapshot(store)
    seen: list[list[StoredMessage]] = []

    def same(ms: list[StoredMessage]) -> list[StoredMessage]:
        seen.append(ms)
        return ms

    assert await call(store.rewrite("c", same)) == before[0]
    assert await call(store.rewrite("c", same, newest=2)) == before[0][-2:]
    assert await snapshot(store) == before  # updated_at too
    assert seen[0] == before[0]


async def test_newest_none_zero_and_k(store: Any) -> None:
    await seed(store, n=4)
    seen: list[list[int]] = []

    def record(ms: list[StoredMessage]) -> list[StoredMessage]:
        seen.append([m.seq for m in ms])
        return ms

    for newest in (None, 0, 1, 3, 4, 10, 2**70):
        await call(store.rewrite("c", record, newest=newest))
    assert seen == [[1, 2, 3, 4], [], [4], [2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]
    # newest=0: the result is appended
    added = await call(store.rewrite("c", lambda ms: [Message.user("tail")], newest=0))
    assert [(m.seq, m.text) for m in added] == [(5, "tail")]
    assert texts(await assert_consistent(store)) == ["m1", "m2", "m3", "m4", "tail"]


async def test_empty_and_unknown_conversations(store: Any) -> None:
    called: list[Any] = []

    def fn(ms: list[StoredMessage]) -> list[Message]:
        called.append(ms)
        return [Message.user("first")]

    with pytest.raises(ConversationNotFoundError):
        await call(store.rewrite("nobody", fn))
    with pytest.raises(ConversationNotFoundError):
        await call(store.rewrite("nobody", fn, newest=0))
    assert called == []
    await call(store.create_conversation("empty"))
    assert await call(store.rewrite("empty", lambda ms: [])) == []
    out = await call(store.rewrite("empty", fn))
    assert called == [[]] and [(m.seq, m.text) for m in out] == [(1, "first")]
    await assert_consistent(store, "empty")
    # a conversation emptied by truncate: seqs go on where they were
    await seed(store, "cut", n=3)
    await call(store.truncate("cut", before_seq=4))
    out = await call(store.rewrite("cut", fn))
    assert called[-1] == [] and [m.seq for m in out] == [4]
    await assert_consistent(store, "cut")


# ---- ids -----------------------------------------------------------------------------------


async def test_ids_stay_unique(store: Any) -> None:
    stored = await seed(store)
    before = await snapshot(store)
    # an id of a message the rewrite does not replace
    with pytest.raises(ConflictError, match=repr(stored[0].id)):
        await call(store.rewrite("c", lambda ms: [Message.user("x", id=stored[0].id)],
                                 newest=2))
    with pytest.raises(ConflictError):
        await call(store.rewrite("c", lambda ms: [stored[1]], newest=2))
    # two replacements with one id
    with pytest.raises(InvalidInputError, match="items 0 and 1"):
        await call(store.rewrite("c", lambda ms: [ms[0], ms[0]], newest=2))
    with pytest.raises(InvalidInputError, match="'dup'"):
        await call(store.rewrite(
            "c", lambda ms: [Message.user("a", id="dup"), Message.user("b", id="dup")]))
    assert await snapshot(store) == before
    # the id of a replaced message is free: a new message may take it
    out = await call(store.rewrite("c", lambda ms: [Message.user("new", id=ms[0].id)],
                                   newest=1))
    assert out[0].id == stored[-1].id and out[0].created_at >= stored[-1].created_at
    # and a message given an id of its own keeps it
    out = await call(store.rewrite("c", lambda ms: [*ms, Message.user("z", id="zed")],
                                   newest=1))
    assert out[-1].id == "zed"
    await assert_consistent(store)


# ---- bad results and failures write nothing ------------------------------------------------


class Boom(Exception):
    pass


async def test_a_bad_result_or_a_failing_fn_writes_nothing(store: Any) -> None:
    await seed(store)
    await call(store.summarize("c", lambda ms: "sum", keep_tokens=8))
    before = await snapshot(store)
    assert before[1]

    async def coroutine(ms: Any) -> list[Any]:
        return []

    bad: list[tuple[Any, str]] = [
        (lambda ms: None, "not NoneType"),
        (lambda ms: "text", "not str"),
        (lambda ms: {"role": "user", "content": "x"}, "not dict"),
        (lambda ms: Message.user("one"), "not Message"),
        (lambda ms: [*ms[:1], {"role": "user", "content": "x"}], "item 1 .* dict"),
        (lambda ms: [ms[0], 7], "item 1 .* int"),
        (lambda ms: coroutine(ms), "awaitable"),
    ]
    for fn, match in bad:
        with pytest.raises(InvalidInputError, match=match):
            await call(store.rewrite("c", fn))
        assert await snapshot(store) == before

    def invalid(ms: list[StoredMessage]) -> list[Message]:
        return [Message(role="tool", content="no call id")]

    with pytest.raises(ValidationError):
        await call(store.rewrite("c", invalid))
    # model_copy(update=...) skips pydantic's checks: the result is validated again, as
    # extend validates, whatever path built the message
    from datetime import datetime, timezone

    skipped_checks = [
        {"role": "tool"},                          # a tool message without tool_call_id
        {"tool_call_id": "x"},                     # a tool_call_id on a user message
        {"content": ["x"]},                        # a part that is not a part
        {"content": "a\x00b"},                    # NUL in text
    ]
    for update in skipped_checks:
        with pytest.raises(ValidationError):
            await call(store.rewrite(
                "c", lambda ms, update=update: [ms[0].model_copy(update=update), *ms[1:]]))
        with pytest.raises(ValidationError):
            await call(store.rewrite(
                "c", lambda ms, update=update: [Message.user("new").model_copy(update=update)]))
        assert await snapshot(store) == before
    # a naive timestamp is taken as UTC, as the models take it (not a raw ValueError)
    done = await call(store.rewrite("c", lambda ms: [
        ms[0].model_copy(update={"created_at": datetime(2026, 1, 1)}), *ms[1:]]))
    assert done[0].created_at == datetime(2026, 1, 1, tzinfo=timezone.utc)
    before = await snapshot(store)

    def failing(ms: list[StoredMessage]) -> list[Message]:
        raise Boom("no")

    with pytest.raises(Boom):
        await call(store.rewrite("c", failing, newest=0))

    def half_done(ms: list[StoredMessage]) -> Any:
        yield ms[0]
        raise Boom("halfway")

    with pytest.raises(Boom):
        await call(store.rewrite("c", half_done))
    assert await snapshot(store) == before
    await assert_consistent(store)


async def test_bad_arguments_are_refused(store: Any) -> None:
    await seed(store)

    async def coroutine_fn(ms: Any) -> list[Any]:
        return list(ms)

    class AsyncCallable:
        async def __call__(self, ms: Any) -> list[Any]:
            return list(ms)

    for fn in (coroutine_fn, AsyncCallable()):
        with pytest.raises(InvalidInputError, match="plain"):
            await call(store.rewrite("c", fn))
    with pytest.raises(InvalidInputError, match="callable"):
        await call(store.rewrite("c", [Message.user("x")]))
    for newest in (-1, "2", True, 1.5):
        with pytest.raises(InvalidInputError, match="newest"):
            await call(store.rewrite("c", lambda ms: ms, newest=newest))
    with pytest.raises(InvalidInputError):
        await call(store.rewrite("", lambda ms: ms))


# ---- summaries -----------------------------------------------------------------------------


async def test_summaries_before_the_first_change_are_kept(store: Any) -> None:
    await seed(store, n=10)
    summary = await call(store.summarize("c", lambda ms: "early", keep_tokens=12))
    end = summary.last_seq
    assert 1 < end < 9

    def change(seq: int) -> Any:
        def fn(ms: list[StoredMessage]) -> list[StoredMessage]:
            return [m.model_copy(update={"content": m.text + "!"}) if m.seq == seq else m
                    for m in ms]
        return fn

    # content changed after the summary's range: kept (whether or not it was read)
    await call(store.rewrite("c", change(end + 1)))
    await call(store.rewrite("c", change(10), newest=3))
    # a score is not content
    await call(store.rewrite("c", lambda ms: [m.model_copy(update={"score": 3.0}) for m in ms]))
    assert await call(store.summaries("c")) == [summary]
    window = await call(store.window("c", SummaryView(token_limit=1000)))
    assert window.messages[0].text.endswith("early")
    # content changed inside the range: the summary describes replaced content
    await call(store.rewrite("c", change(end)))
    assert await call(store.summaries("c")) == []
    window = await call(store.window("c", SummaryView(token_limit=1000)))
    assert len(window.messages) == 10


async def test_summaries_reaching_a_removed_or_inserted_position_go(store: Any) -> None:
    for cid, fn in [
        ("removed", lambda ms: [m for m in ms if m.text != "m2"]),
        ("inserted", lambda ms: [ms[0], Message.user("in"), *ms[1:]]),
        ("renamed", lambda ms: [ms[0], Message.user("m2"), *ms[2:]]),  # same text, new id
    ]:
        await seed(store, cid, n=10)
        summary = await call(store.summarize(cid, lambda ms: "s", keep_tokens=12))
        assert summary.first_seq == 1
        await call(store.rewrite(cid, fn))
        assert await call(store.summaries(cid)) == [], cid
        # the messages are all there, and later ones after the change keep their ids
        await assert_consistent(store, cid)
    # a summary ending before the change stays, and a newer one reaching it goes
    await seed(store, "two", n=12)
    first = await call(store.summarize("two", lambda ms: "one", keep_tokens=32))
    await call(store.append("two", Message.user("m13")))
    second = await call(store.summarize("two", lambda ms: "two", keep_tokens=12))
    assert first.last_seq < second.last_seq
    await call(store.rewrite("two", lambda ms: [m for m in ms if m.seq != first.last_seq + 1]))
    assert await call(store.summaries("two")) == [first]


# ---- the row cache -------------------------------------------------------------------------


async def test_windows_see_the_rewrite_through_every_store(
        store: Any, db_url: str, counter: Any) -> None:
    await call(store.extend("c", [Message.user("aa"), Message.user("bb"), Message.user("cc")]))
    other = open_like(store, db_url, counter)
    try:
        view = UnboundedView()
        assert texts((await call(store.window("c", view))).messages) == ["aa", "bb", "cc"]
        assert texts((await call(other.window("c", view))).messages) == ["aa", "bb", "cc"]
        # same seqs, same token counts, other content: only the epoch tells the caches
        out = await call(store.rewrite(
            "c", lambda ms: [ms[0].model_copy(update={"content": "BB"}), ms[1]], newest=2))
        assert [m.seq for m in out] == [2, 3]
        for s in (store, other):
            assert texts((await call(s.window("c", view))).messages) == ["aa", "BB", "cc"]
        # the other store rewrites: this store's cache drops its rows too
        await call(other.rewrite("c", lambda ms: [ms[2], ms[1], ms[0]]))
        for s in (store, other):
            assert texts((await call(s.window("c", view))).messages) == ["cc", "BB", "aa"]
        # a rewrite that only appends leaves cached rows valid, and windows see the new one
        await call(store.rewrite("c", lambda ms: [*ms, Message.user("dd")], newest=1))
        for s in (store, other):
            assert texts((await call(s.window("c", view))).messages) == ["cc", "BB", "aa", "dd"]
        # a removal, in a tool unit: no window hands out the orphan result
        await call(store.extend("c", [
            Message.assistant(None, tool_calls=[ToolCall(id="t1", name="f", arguments="{}")]),
            Message.tool("42", tool_call_id="t1"), Message.assistant("done")]))
        for s in (store, other):
            assert len((await call(s.window("c", view))).messages) == 7
        await call(store.rewrite("c", lambda ms: [m for m in ms if not m.tool_calls]))
        for s in (store, other):
            assert texts((await call(s.window("c", view))).messages) == [
                "cc", "BB", "aa", "dd", "done"]
    finally:
        await call(other.close())


# ---- concurrency ---------------------------------------------------------------------------


def writer(db_url: str, counter: Any, stop: threading.Event, written: list[str],
           errors: list[BaseException]) -> None:
    """Append ``keep-i`` messages through a store of its own until told to stop."""
    other = MemoryStore(db_url, counter=counter)
    try:
        i = 0
        while not stop.is_set():
            text = f"keep-{i}"
            other.append("race", Message.user(text))
            written.append(text)
            i += 1
    except BaseException as exc:  # reported by the test
        errors.append(exc)
    finally:
        other.close()


@pytest.mark.slow
async def test_appends_during_rewrites_are_never_lost(
        store: Any, db_url: str, counter: Any) -> None:
    await call(store.extend("race", [Message.user(f"drop-{i}") for i in range(50)]
                            + [Message.user(f"keep-seed-{i}") for i in range(50)]))
    stop = threading.Event()
    written: list[str] = []
    errors: list[BaseException] = []
    thread = threading.Thread(target=writer, args=(db_url, counter, stop, written, errors))
    thread.start()
    rounds = 0

    def rewrite_all(ms: list[StoredMessage]) -> list[Message]:
        time.sleep(0.002)  # hold the lock a little: appends queue up behind it
        out: list[Message] = [m for m in ms if not m.text.startswith("drop")]
        return [*out, Message.user(f"drop-r{rounds}")]

    def rewrite_tail(ms: list[StoredMessage]) -> list[Message]:
        return [m.model_copy(update={"score": 2.0}) for m in ms]

    try:
        deadline = time.monotonic() + 20
        while (rounds < 40 or len(written) < 20) and time.monotonic() < deadline:
            await call(store.rewrite("race", rewrite_all))
            await call(store.rewrite("race", rewrite_tail, newest=3))
            rounds += 1
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    stored = await assert_consistent(store, "race")
    got = [m.text for m in stored if m.text.startswith("keep-") and "seed" not in m.text]
    assert sorted(got, key=lambda t: int(t.split("-")[1])) == written
    assert got == written  # in the order they were appended
    assert [m.text for m in stored if "seed" in m.text] == [f"keep-seed-{i}" for i in range(50)]
    assert written, "the writer never ran"


async def test_concurrent_rewrites_and_appends_on_one_store(store: Any) -> None:
    """Tasks (async store) or threads (sync store) sharing the store itself."""
    await call(store.extend("shared", [Message.user("start")]))

    def bump(ms: list[StoredMessage]) -> list[Message]:
        # pop the newest and put it back changed: a lost update would show in the total
        (last,) = ms
        n = int(last.metadata.get("n", 0))
        return [last.model_copy(update={"metadata": {**last.metadata, "n": n + 1}})]

    appends = [Message.user(f"a{i}") for i in range(30)]
    if isinstance(store, AsyncMemoryStore):
        await asyncio.gather(*(store.append("shared", m) for m in appends),
                             *(store.rewrite("shared", bump, newest=1) for _ in range(30)))
    else:
        threads = [threading.Thread(target=store.append, args=("shared", m)) for m in appends]
        threads += [threading.Thread(target=store.rewrite, args=("shared", bump),
                                     kwargs={"newest": 1}) for _ in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    stored = await assert_consistent(store, "shared")
    assert sorted(m.text for m in stored) == sorted(["start", *(m.text for m in appends)])
    assert sum(int(m.metadata.get("n", 0)) for m in stored) == 30


async def test_a_store_called_from_inside_fn_is_refused(store: Any, db_url: str) -> None:
    """fn runs while the rewrite holds the conversation's lock: a store call from it
    would wait for the rewrite itself (forever on PostgreSQL). It is refused at once, and
    the rewrite writes nothing."""
    await seed(store)
    before = await snapshot(store)
    # lock_timeout bounds the wait on PostgreSQL should the refusal ever regress
    options = ({"connect_args": {"options": "-c lock_timeout=5000"}}
               if db_url.startswith("postgresql") else {"busy_timeout": 5})
    other = MemoryStore(db_url, counter=FixedCounter(), **options)

    def reentrant(ms: list[StoredMessage]) -> list[Any]:
        other.append("c", Message.user("from inside"))
        return ms

    with pytest.raises(InvalidInputError, match="inside rewrite's fn"):
        await call(store.rewrite("c", reentrant))

    def generator(ms: list[StoredMessage]) -> Any:
        """A generator's body runs while its result is consumed: still inside fn."""
        other.append("c", Message.user("from a generator"))
        yield from ms

    def restoring(ms: list[StoredMessage]) -> list[Any]:
        other.restore_state(io.StringIO(other_state), "elsewhere")
        return ms

    def importing(ms: list[StoredMessage]) -> list[Any]:
        import_jsonl(other, io.StringIO(exported))
        return ms

    def iterating(ms: list[StoredMessage]) -> list[Any]:
        list(other.iter_messages("c"))
        return ms

    other_state = other.save_state("c").to_json()
    buffer = io.StringIO()
    export_jsonl(other, buffer, ["c"])
    exported = buffer.getvalue().replace('"id":"c"', '"id":"copy"', 1)
    for fn in (generator, restoring, importing, iterating):
        with pytest.raises(InvalidInputError, match="inside rewrite's fn"):
            await call(store.rewrite("c", fn))
    other.close()
    assert await snapshot(store) == before
    # outside fn the same store works as usual
    assert (await call(store.append("c", Message.user("after")))).seq == len(before[0]) + 1

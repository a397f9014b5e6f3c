"""Counting a batch of messages: ``count_each``, and TiktokenCounter's threads."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore import MemoryStore
from memstore.aio import AsyncMemoryStore
from memstore.errors import ConfigurationError, InvalidInputError
from memstore.models import Message, TextPart, ToolCall
from memstore.tokens import BaseTokenCounter, FixedCounter, TiktokenCounter, _parallel, count_each
from memstore.tokens._openai import _text_chars
from tests.helpers import examples

#: Characters a message may hold (no NUL, no lone surrogates).
STORABLE = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
WORDS = "retry policy upload worker backs off exponentially 東京 naïve émoji 🙂 {\"k\": [1, 2]}"


def _text(i: int, size: int) -> str:
    words = WORDS.split()
    return " ".join(words[(i + k) % len(words)] for k in range(size // 6 + 1))[:size]


def batch(n: int, size: int) -> list[Message]:
    """``n`` messages of every shape, about ``size`` characters of text each."""
    out: list[Message] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(Message.user(_text(i, size)))
        elif kind == 1:
            out.append(Message(role="assistant", content=None, tool_calls=[
                ToolCall(id=f"c{i}", name="lookup", arguments=_text(i, size))]))
        elif kind == 2:
            out.append(Message(role="tool", content=_text(i, size), tool_call_id=f"c{i - 1}"))
        else:
            out.append(Message(role="user", name="ann", content=[
                TextPart(text=_text(i, size // 2)), TextPart(text=_text(i + 1, size // 2))]))
    return out


@pytest.fixture(scope="module")
def tiktoken2() -> TiktokenCounter:
    return TiktokenCounter(threads=2)


class Recording(BaseTokenCounter):
    """Counts characters; records the thread each message was counted on.

    ``delay`` seconds per message (a sleep releases the GIL, as tiktoken's encoder does)
    give the pool's thread time to start before the caller is done with its chunk.
    """

    name = "test/recording"

    def __init__(self, fail_on: str | None = None, delay: float = 0.0) -> None:
        self.threads: list[str] = []
        self.fail_on = fail_on
        self.delay = delay
        self._lock = threading.Lock()

    def count_message(self, message: Message) -> int:
        with self._lock:
            self.threads.append(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on is not None and message.text == self.fail_on:
            raise ValueError(f"cannot count {self.fail_on!r}")
        return 3 + len(message.text)

    def count_each(self, messages: Sequence[Message]) -> list[int]:
        chunks = _parallel.split_by_size(messages, 2, lambda m: len(m.text), 1_000)
        return _parallel.map_chunks(lambda c: [self.count_message(m) for m in c], chunks)


# ---- the counts ----------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_count_each_equals_count_message_on_any_number_of_threads(threads: int) -> None:
    counter = TiktokenCounter(threads=threads)
    one_by_one = TiktokenCounter(threads=1)
    for n, size in [(0, 0), (1, 30_000), (2, 10_000), (7, 3_000), (120, 400), (9, 10)]:
        messages = batch(n, size)
        expected = [one_by_one.count_message(m) for m in messages]
        assert counter.count_each(messages) == expected
        assert count_each(counter, messages) == expected


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.text(STORABLE, max_size=3_000), max_size=40))
def test_count_each_matches_count_message_for_any_texts(texts: list[str]) -> None:
    counter = TiktokenCounter(threads=2)
    messages = [Message.user(t) for t in texts]
    assert counter.count_each(messages) == [counter.count_message(m) for m in messages]


def test_a_large_batch_is_counted_on_two_threads_and_a_small_one_on_the_caller() -> None:
    counter = Recording(delay=0.02)
    big = [Message.user("x" * 400) for _ in range(10)]  # 4,000 characters: over 1,000
    assert counter.count_each(big) == [403] * 10
    caller = threading.current_thread().name
    assert caller in counter.threads
    assert any(name.startswith("memstore-count") for name in counter.threads)
    counter.threads.clear()
    assert counter.count_each(big[:2]) == [403, 403]  # 800 characters: one chunk
    assert set(counter.threads) == {caller}


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many chunks each of TiktokenCounter's batches was cut into, in call order."""
    seen: list[int] = []
    real = _parallel.map_chunks

    def spy(fn: Any, chunks: list[Sequence[Any]]) -> Any:
        seen.append(len(chunks))
        return real(fn, chunks)

    monkeypatch.setattr("memstore.tokens._openai.map_chunks", spy)
    return seen


def test_tiktoken_splits_only_past_its_threshold(chunked: list[int],
                                                 tiktoken2: TiktokenCounter) -> None:
    small = batch(8, 1_000)
    large = batch(40, 1_000)
    assert sum(map(_text_chars, small)) < _parallel.PARALLEL_MIN_CHARS
    assert sum(map(_text_chars, large)) > _parallel.PARALLEL_MIN_CHARS
    tiktoken2.count_each(small)
    tiktoken2.count_each(large)
    TiktokenCounter(threads=1).count_each(large)
    assert chunked == [1, 2, 1]


def test_text_chars_counts_what_is_encoded() -> None:
    assert _text_chars(Message.user("abc")) == 3
    assert _text_chars(Message(role="assistant", content=None, tool_calls=[
        ToolCall(id="x", name="ab", arguments="{}")])) == 4
    assert _text_chars(Message(role="user", content=[TextPart(text="ab"), TextPart(text="c")])) == 3


# ---- the pool ------------------------------------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 6), st.integers(0, 200))
def test_split_by_size_keeps_order_and_bounds(sizes: list[int], parts: int, least: int) -> None:
    chunks = _parallel.split_by_size(sizes, parts, lambda n: n, least)
    assert [n for chunk in chunks for n in chunk] == sizes
    assert 1 <= len(chunks) <= max(1, min(parts, len(sizes)))
    if len(chunks) > 1:
        assert all(chunks) and sum(sizes) >= least
    if sum(sizes) < least or parts < 2:
        assert len(chunks) == 1


def test_split_by_size_balances_text() -> None:
    chunks = _parallel.split_by_size([10] * 10, 2, lambda n: n, 0)
    assert [len(c) for c in chunks] == [5, 5]
    chunks = _parallel.split_by_size([90, 1, 1, 1, 1, 1, 1], 2, lambda n: n, 0)
    assert [len(c) for c in chunks] == [1, 6]
    chunks = _parallel.split_by_size([10] * 9, 3, lambda n: n, 0)
    assert [len(c) for c in chunks] == [3, 3, 3]
    chunks = _parallel.split_by_size([10, 10, 10], 4, lambda n: n, 0)
    assert [len(c) for c in chunks] == [1, 1, 1]


def test_a_busy_pool_does_not_make_the_caller_wait() -> None:
    counter = Recording()
    big = [Message.user("x" * 400) for _ in range(10)]
    counter.count_each(big)  # the pool exists, with one thread
    release = threading.Event()
    # Every thread of the shared pool busy with someone else's work.
    workers = _parallel._pool_workers
    started = threading.Semaphore(0)

    def occupy() -> None:
        started.release()
        release.wait(30)

    blockers = [_parallel._executor(1).submit(occupy) for _ in range(workers)]
    try:
        for _ in range(workers):
            assert started.acquire(timeout=10)
        counter.threads.clear()
        assert counter.count_each(big) == [403] * 10  # would hang if it waited for the pool
        assert set(counter.threads) == {threading.current_thread().name}
    finally:
        release.set()
        for blocker in blockers:
            blocker.result(10)


def test_an_error_in_any_chunk_propagates() -> None:
    early = [Message.user("bad")] + [Message.user("x" * 400) for _ in range(9)]
    late = [Message.user("x" * 400) for _ in range(9)] + [Message.user("bad")]
    for messages in (early, late):
        with pytest.raises(ValueError, match="cannot count 'bad'"):
            Recording(fail_on="bad").count_each(messages)


def _count_in_child(queue: Any) -> None:
    counter = Recording(delay=0.02)
    counts = counter.count_each([Message.user("x" * 400) for _ in range(10)])
    queue.put((counts, any(n.startswith("memstore-count") for n in counter.threads)))


def test_a_forked_child_makes_its_own_pool() -> None:
    Recording().count_each([Message.user("x" * 400) for _ in range(10)])  # the parent's pool
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_count_in_child, args=(queue,))
    child.start()
    counts, pooled = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert counts == [403] * 10 and pooled


# ---- the helper and the protocol -----------------------------------------------------------


class Plain:
    """A protocol counter with no count_each."""

    name = "test/plain"

    def count_message(self, message: Message) -> int:
        return len(message.text)

    def count_messages(self, messages: Sequence[Message]) -> int:
        return sum(map(self.count_message, messages))


class WrongLength(Plain):
    name = "test/wrong"

    def count_each(self, messages: Sequence[Message]) -> Any:
        return [1]


def test_count_each_falls_back_to_count_message_and_checks_the_shape() -> None:
    messages = [Message.user("ab"), Message.user("abc")]
    assert count_each(Plain(), messages) == [2, 3]
    assert FixedCounter().count_each(messages) == [FixedCounter().count_message(m)
                                                   for m in messages]
    with pytest.raises(ConfigurationError, match=r"count_each must return a list of one count "
                                                 r"per message \(2\), got a list of 1"):
        count_each(WrongLength(), messages)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_threads_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="threads must be an int >= 1"):
        TiktokenCounter(threads=bad)


def test_threads_default_to_the_cpus_at_most_four() -> None:
    assert TiktokenCounter().threads == max(1, min(4, _parallel.available_cpus()))
    assert TiktokenCounter(threads=3) == TiktokenCounter(threads=1)  # the same counts


# ---- through the stores --------------------------------------------------------------------


async def test_extend_stores_each_messages_own_count(db_url: str,
                                                     tiktoken2: TiktokenCounter) -> None:
    messages = batch(60, 800)
    assert sum(map(_text_chars, messages)) > _parallel.PARALLEL_MIN_CHARS
    expected = [tiktoken2.count_message(m) for m in messages]
    with MemoryStore(db_url, counter=tiktoken2) as store:
        stored = store.extend("sync", messages)
        assert [m.token_count for m in stored] == expected
        assert [m.token_count for m in store.messages("sync")] == expected
    async_store = AsyncMemoryStore(db_url, counter=tiktoken2)
    try:
        stored = await async_store.extend("async", messages)
        assert [m.token_count for m in stored] == expected
    finally:
        await async_store.close()


def test_a_bad_count_from_count_each_writes_nothing(db_url: str) -> None:
    with MemoryStore(db_url, counter=WrongLength()) as store:
        with pytest.raises(ConfigurationError, match="count_each"):
            store.extend("c", [Message.user("a"), Message.user("b")])
        assert store.list_conversations() == []
        store.append("c", Message.user("a"))  # one message: count_message
        assert [m.token_count for m in store.messages("c")] == [1]


def test_imports_and_loaded_states_are_recounted_in_batches(
    db_url: str, tiktoken2: TiktokenCounter, chunked: list[int]
) -> None:
    import io
    import json

    from memstore.transfer import export_jsonl, import_jsonl

    messages = batch(60, 800)
    expected = [tiktoken2.count_message(m) for m in messages]
    with MemoryStore(db_url, counter=tiktoken2) as store:
        store.extend("c", messages)
        out = io.StringIO()
        export_jsonl(store, out, ["c"])
        lines = out.getvalue().splitlines()
        for i in (1, 7, 30):  # three counts a file got wrong
            lines[i] = json.dumps({**json.loads(lines[i]), "token_count": 0})
        chunked.clear()
        result = import_jsonl(store, io.StringIO("\n".join(lines)), rename="copy")
        assert result.conversations[0].recounted == 3
        assert [m.token_count for m in store.messages("copy")] == expected
        assert 2 in chunked  # the recount split the batch
        state = store.save_state("c").model_dump()
        state["messages"][5]["token_count"] = 1
        chunked.clear()
        store.load_state(state, conversation_id="loaded")
        assert [m.token_count for m in store.messages("loaded")] == expected
        assert 2 in chunked


def test_a_forked_child_does_not_inherit_a_held_lock() -> None:
    Recording().count_each([Message.user("x" * 400) for _ in range(10)])
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with _parallel._lock:  # held by the parent at the moment of the fork
        child = context.Process(target=_count_in_child, args=(queue,))
        child.start()
    counts, _pooled = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and counts == [403] * 10


def test_cgroup_quotas_cap_the_cpus() -> None:
    assert _parallel._quota_cpus("max", "100000") is None
    assert _parallel._quota_cpus("-1", "100000") is None
    assert _parallel._quota_cpus("150000", "100000") == 2
    assert _parallel._quota_cpus("100000", "100000") == 1
    assert _parallel._quota_cpus("50000", "100000") == 1
    assert 1 <= _parallel.available_cpus() <= (os.cpu_count() or 1)


class BadCounts(Plain):
    """A store counter whose count_each returns values that are not counts."""

    name = "test/bad-counts"

    def count_each(self, messages: Sequence[Message]) -> Any:
        return [3, True, 2.5][: len(messages)]


def test_imported_and_loaded_counts_are_checked_like_extended_ones(db_url: str) -> None:
    import io

    from memstore.transfer import export_jsonl, import_jsonl

    messages = [Message.user("a"), Message.user("bb"), Message.user("ccc")]
    with MemoryStore(db_url, counter=Plain()) as source:
        source.extend("c", messages)
        out = io.StringIO()
        export_jsonl(source, out, ["c"])
        state = source.save_state("c")
    for counter, error in ((BadCounts(), InvalidInputError), (WrongLength(), ConfigurationError)):
        with MemoryStore(db_url, counter=counter) as store:
            with pytest.raises(error, match="count"):
                store.extend("x", messages)
            lines = [line.replace('"test/plain"', f'"{counter.name}"')
                     for line in out.getvalue().splitlines()]
            with pytest.raises(error, match="count"):
                import_jsonl(store, io.StringIO("\n".join(lines)), rename="copy")
            with pytest.raises(error, match="count"):
                store.load_state(state, conversation_id="loaded")
            assert {c.id for c in store.list_conversations()} == {"c"}  # nothing written

"""The row cache: windows reuse decoded rows only while the conversation's epoch holds.

Every test compares a caching store with a store that has no cache (``cache_size=0``)
on the same database: their windows must be identical after any sequence of writes,
whichever store (or process) made them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore._db import window as _window
from memstore._db.cache import RowCache
from memstore.aio import AsyncMemoryStore
from memstore.errors import ConfigurationError, ConversationNotFoundError
from memstore.models import Message
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter
from memstore.views import (
    BufferedView,
    ContextView,
    HeadAndTailView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
)
from tests.helpers import call
from tests.test_windows import conversation

VIEWS: list[ContextView] = [
    TokenLimitedView(600),
    TokenLimitedView(250, start_on_user=True),
    ScoreBasedView(500),
    ScoreBasedView(400, half_life=60.0),
    HeadAndTailView(3, 12),
    BufferedView(15),
    UnboundedView(),
]


@pytest.fixture
def pair(db_url: str, counter: FixedCounter) -> Iterator[tuple[MemoryStore, MemoryStore]]:
    """A caching store and an uncached one (the 'other process') on one database."""
    cached = MemoryStore(db_url, counter=counter)
    plain = MemoryStore(db_url, counter=counter, cache_size=0)
    yield cached, plain
    cached.close()
    plain.close()


def same_windows(cached: MemoryStore, plain: MemoryStore, cid: str) -> None:
    for view in VIEWS:
        try:
            expected = plain.window(cid, view)
        except ConversationNotFoundError:
            with pytest.raises(ConversationNotFoundError):
                cached.window(cid, view)
            continue
        assert cached.window(cid, view) == expected, view


def test_a_warm_window_reads_only_the_new_rows(pair: tuple[MemoryStore, MemoryStore]) -> None:
    cached, plain = pair
    plain.extend("c", conversation(60))
    view = TokenLimitedView(600)
    first = cached.window("c", view)
    info = cached.cache_info()
    assert info.hits == 0 and info.misses == first.report.rows_read
    assert cached.window("c", view) == first
    info2 = cached.cache_info()
    assert info2.misses == info.misses  # nothing read from the database again
    assert info2.hits == first.report.rows_read
    plain.append("c", Message.user("one more"))
    plain.append("c", Message.assistant("and a reply"))
    third = cached.window("c", view)
    assert third == plain.window("c", view)
    assert cached.cache_info().misses == info.misses + 2  # just the two new rows


def test_hits_count_only_rows_the_cache_held(pair: tuple[MemoryStore, MemoryStore]) -> None:
    """Rows a window decoded itself and served again (its anchored rows, the head and
    tail of HeadAndTailView overlapping) were counted as hits of an empty cache."""
    cached, plain = pair
    plain.extend("c", [Message.system("s"), *[Message.user(f"u{i}") for i in range(9)]])
    for seq in (3, 5, 7):
        plain.pin("c", seq)
    for view in (UnboundedView(), HeadAndTailView(4, 4)):
        cached.clear_cache()
        window = cached.window("c", view)
        info = cached.cache_info()
        assert (info.hits, info.misses) == (0, 10), view
        assert window.report.rows_read >= 10
        cached.window("c", view)
        assert cached.cache_info().misses == 10  # the second window decoded nothing
        assert 10 <= cached.cache_info().hits <= window.report.rows_read


MUTATIONS: dict[str, Callable[[MemoryStore], Any]] = {
    "set_score": lambda s: s.set_score("c", 5, 9.0),
    "pin": lambda s: s.pin("c", 4),
    "unpin": lambda s: s.unpin("c", 6),
    "pop_then_append_same_seq": lambda s: (s.pop("c", 3), s.append("c", Message.user("new"))),
    "truncate": lambda s: s.truncate("c", before_seq=20),
    "clear_then_refill": lambda s: (s.clear("c"), s.extend("c", conversation(5, seed=99))),
    "delete_then_recreate": lambda s: (
        s.delete_conversation("c"), s.extend("c", conversation(40, seed=98))
    ),
    "load_state_append": lambda s: (
        s.extend("d", conversation(3, seed=5)),
        s.load_state(s.save_state("d"), "c", replace=False),
    ),
    "load_state_replace": lambda s: s.load_state(
        s.save_state("c").model_copy(update={"messages": s.save_state("c").messages[:30]}),
        "c",
    ),
}


#: What a mutation needs done before the cache is filled.
SETUP: dict[str, Callable[[MemoryStore], Any]] = {"unpin": lambda s: s.pin("c", 6)}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_change_made_elsewhere_is_seen(
    pair: tuple[MemoryStore, MemoryStore], mutation: str
) -> None:
    cached, plain = pair
    plain.extend("c", conversation(40))
    if mutation in SETUP:
        SETUP[mutation](plain)
    same_windows(cached, plain, "c")  # fills the cache with every view's rows
    before = cached.window("c", UnboundedView())
    MUTATIONS[mutation](plain)
    same_windows(cached, plain, "c")
    assert cached.window("c", UnboundedView()) != before  # the change is visible


def test_random_writes_from_both_stores_keep_windows_identical(
    pair: tuple[MemoryStore, MemoryStore],
) -> None:
    cached, plain = pair
    rng = random.Random(5)
    source = conversation(300, seed=3)
    position = 0

    def next_messages(n: int) -> list[Message]:
        nonlocal position
        chunk = source[position:position + n]
        position += n
        return chunk

    plain.extend("c", next_messages(40))
    for _ in range(60):
        writer = rng.choice([cached, plain])
        op = rng.choice(["append", "append", "extend", "score", "pin", "pop", "truncate"])
        last = writer.get_conversation("c").message_count
        first_seq = writer.messages("c", limit=1)[0].seq if last else 1
        last_seq = first_seq + last - 1
        if op == "append":
            writer.extend("c", next_messages(1))
        elif op == "extend":
            writer.extend("c", next_messages(rng.randint(2, 9)))
        elif op == "score" and last:
            writer.set_score("c", rng.randint(first_seq, last_seq), rng.choice([0.0, 2.5]))
        elif op == "pin" and last:
            seq = rng.randint(first_seq, last_seq)
            (writer.pin if rng.random() < 0.6 else writer.unpin)("c", seq)
        elif op == "pop" and last > 10:
            writer.pop("c", rng.randint(1, 3))
        elif op == "truncate" and last > 30:
            writer.truncate("c", before_seq=first_seq + rng.randint(1, 5))
        same_windows(cached, plain, "c")
    assert cached.cache_info().hits > 0


def test_an_entry_records_its_newest_seq_as_windows_add_rows(
    pair: tuple[MemoryStore, MemoryStore],
) -> None:
    # The window tracks the newest cached seq row by row (no max over the entry at each
    # put); it bounds the next window's first page, so it must equal the rows' own max.
    cached, plain = pair
    cache = cached._plan.cache
    assert cache is not None
    plain.extend("c", conversation(20))
    view = TokenLimitedView(token_limit=60)
    for step in range(4):
        cached.window("c", view)
        entry = cache.get("c")
        assert entry is not None and entry.last_seq == max(entry.rows), step
        plain.extend("c", conversation(3))  # the next window decodes only the new rows
    cached.window("c", ScoreBasedView(token_limit=10_000))  # reads older rows too
    entry = cache.get("c")
    assert entry is not None and entry.last_seq == max(entry.rows)


def test_rows_beyond_the_snapshot_are_never_served(
    pair: tuple[MemoryStore, MemoryStore], counter: FixedCounter
) -> None:
    # A reader whose snapshot is older than the one that filled the cache holds fewer
    # messages than the cache: the extra cached rows must stay invisible to it.
    cached, plain = pair
    plain.extend("c", conversation(20))
    cache = cached._plan.cache
    assert cache is not None
    cached.window("c", UnboundedView())
    entry = cache.get("c")
    assert entry is not None
    newest = max(entry.rows)
    future = entry.rows[newest].model_copy(update={"seq": newest + 1, "content": "future"})
    cache.put("c", entry.epoch, {**entry.rows, newest + 1: future})
    window = cached.window("c", UnboundedView())
    assert window == plain.window("c", UnboundedView())
    assert all(m.text != "future" for m in window.messages)


def test_an_edit_by_hand_needs_a_new_epoch_or_clear_cache(
    pair: tuple[MemoryStore, MemoryStore], db_url: str
) -> None:
    cached, plain = pair
    plain.extend("c", conversation(10))
    view = UnboundedView()
    cached.window("c", view)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE memstore_messages SET content_text = 'edited' "
            "WHERE conversation_id = 'c' AND seq = 2"
        ))
    # Documented limit: an out-of-band edit that leaves the epoch alone is not seen...
    assert cached.window("c", view) != plain.window("c", view)
    cached.clear_cache()
    assert cached.window("c", view) == plain.window("c", view)
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE memstore_messages SET content_text = 'edited again' "
            "WHERE conversation_id = 'c' AND seq = 2"
        ))
        conn.execute(text("UPDATE memstore_conversations SET epoch = epoch + 1 WHERE id = 'c'"))
    # ...one that also sets a new epoch is.
    assert cached.window("c", view) == plain.window("c", view)
    engine.dispose()


def test_the_cache_is_bounded_least_recently_used_first(
    db_url: str, counter: FixedCounter
) -> None:
    store = MemoryStore(db_url, counter=counter, cache_size=120)
    for i in range(6):
        store.extend(f"c{i}", conversation(30, seed=i))
        store.window(f"c{i}", UnboundedView())
        assert store.cache_info().size <= 120
    info = store.cache_info()
    assert info.max_size == 120 and info.conversations < 6
    cache = store._plan.cache
    assert cache is not None and cache.get("c5") is not None and cache.get("c0") is None
    # One conversation bigger than the cache keeps its anchored rows and the newest.
    store.extend("big", conversation(200, seed=9))
    store.window("big", UnboundedView())
    entry = cache.get("big")
    assert entry is not None and len(entry.rows) == 120
    assert 1 in entry.rows  # the system prompt
    assert max(entry.rows) == store.get_conversation("big").message_count
    store.close()


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_cache_size_is_validated(db_url: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="cache_size"):
        MemoryStore(db_url, cache_size=bad)


def test_disabled_cache_reports_zeros(db_url: str, counter: FixedCounter) -> None:
    store = MemoryStore(db_url, counter=counter, cache_size=0)
    store.extend("c", conversation(5))
    store.window("c", UnboundedView())
    assert tuple(store.cache_info()) == (0, 0, 0, 0, 0)
    store.clear_cache()  # harmless
    store.close()


async def test_async_store_caches_the_same_way(store: Any, counter: FixedCounter) -> None:
    await call(store.extend("c", conversation(30)))
    view = TokenLimitedView(400)
    first = await call(store.window("c", view))
    misses = store.cache_info().misses
    assert await call(store.window("c", view)) == first
    assert store.cache_info().misses == misses
    assert store.cache_info().hits >= first.report.rows_read
    await call(store.pop("c", 2))
    after = await call(store.window("c", view))
    assert after.seqs[-1] == first.seqs[-1] - 2


def test_a_write_transaction_never_fills_the_cache(
    pair: tuple[MemoryStore, MemoryStore],
) -> None:
    cached, _ = pair
    cached.extend("c", conversation(10))
    cached.pop("c", 1)
    cached.set_score("c", 2, 3.0)
    cache = cached._plan.cache
    assert isinstance(cache, RowCache) and len(cache) == 0
    # ...while a read does fill it (so the check above can tell the two apart)
    window = cached.window("c", UnboundedView())
    assert len(cache) == len(window.messages) > 0


@pytest.mark.parametrize("reader", ["sync", "async"])
@pytest.mark.parametrize("change", ["set_score", "pop", "delete"])
async def test_a_rewrite_between_two_statements_makes_the_window_read_again_in_a_snapshot(
    pair: tuple[MemoryStore, MemoryStore], change: str, reader: str, db_url: str,
    counter: FixedCounter,
) -> None:
    # Windows run without a transaction; every range read after the first statement
    # checks the epoch. Force a rewrite right between the two statements.
    cached, plain = pair
    plain.extend("c", conversation(40))
    real_execute = _window.SQLHistory._execute
    calls: list[tuple[str, bool]] = []

    def execute(self: Any, name: str, values: dict[str, Any]) -> Any:
        calls.append((name, self._checked))
        if name == "range_checked" and sum(n == name for n, _ in calls) == 1:
            if change == "set_score":
                plain.set_score("c", 30, 4.0)
            elif change == "pop":
                plain.pop("c", 2)
            else:
                plain.delete_conversation("c")
        return real_execute(self, name, values)

    reading: Any = cached if reader == "sync" else AsyncMemoryStore(db_url, counter=counter)
    _window.SQLHistory._execute = execute  # type: ignore[method-assign]
    try:
        window = await call(reading.window("c", UnboundedView()))
        if change == "delete":
            # Read again in one snapshot, where it is gone: an empty window, as for a
            # conversation never written.
            assert window.messages == [] and not window.report.conversation_exists
    finally:
        _window.SQLHistory._execute = real_execute  # type: ignore[method-assign]
        if reader == "async":
            await reading.close()
    # First attempt without a transaction, then again in one snapshot (plain ranges).
    assert calls[0] == ("conversation", True)
    assert ("range_checked", True) in calls
    assert ("conversation", False) in calls
    if change != "delete":
        assert window == plain.window("c", UnboundedView())
        assert ("range", False) in calls


async def test_a_driver_error_on_the_window_path_is_a_memstore_error(
    db_url: str, counter: FixedCounter
) -> None:
    # Windows run their SQL on the DBAPI cursor; its errors must still come out as
    # memstore errors. An out-of-date schema (no epoch column) makes one.
    from memstore import migrate
    from memstore.errors import DatabaseError

    store = MemoryStore(db_url, counter=counter)
    store.extend("c", conversation(5))
    store.close()
    migrate.downgrade(db_url, "0001_initial")
    try:
        old = MemoryStore(db_url, counter=counter, migrate="off")
        with pytest.raises(DatabaseError, match="epoch"):
            old.window("c", UnboundedView())
        old.close()
        old_async = AsyncMemoryStore(db_url, counter=counter, migrate="off")
        with pytest.raises(DatabaseError, match="epoch"):
            await old_async.window("c", UnboundedView())
        await old_async.close()
    finally:
        migrate.upgrade(db_url)


def test_a_stale_entry_is_dropped_when_its_epoch_is_gone(
    pair: tuple[MemoryStore, MemoryStore],
) -> None:
    cached, plain = pair
    plain.extend("c", conversation(10))
    cached.window("c", UnboundedView())
    cache = cached._plan.cache
    assert cache is not None and cache.get("c") is not None
    plain.clear("c")  # nothing left to decode: the next window caches nothing new
    assert cached.window("c", UnboundedView()).messages == []
    assert cache.get("c") is None and len(cache) == 0


def test_conversations_from_before_the_epoch_are_never_cached(
    pair: tuple[MemoryStore, MemoryStore], db_url: str
) -> None:
    # Rows written before migration 0002 have epoch 0 (its server default), and a
    # process still running an older memstore changes rows without a new epoch.
    cached, plain = pair
    plain.extend("c", conversation(10))
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE memstore_conversations SET epoch = 0 WHERE id = 'c'"))
    view = UnboundedView()
    first = cached.window("c", view)
    assert cached.cache_info().size == 0
    with engine.begin() as conn:  # an old writer's edit: no new epoch
        conn.execute(text(
            "UPDATE memstore_messages SET content_text = 'old writer' "
            "WHERE conversation_id = 'c' AND seq = 2"
        ))
    second = cached.window("c", view)
    assert second != first and second == plain.window("c", view)
    assert cached.cache_info().hits == 0
    # The first write by this version gives the conversation a real epoch.
    plain.append("c", Message.user("new"))
    with engine.connect() as conn:
        epoch = conn.execute(
            text("SELECT epoch FROM memstore_conversations WHERE id = 'c'")
        ).scalar_one()
    assert epoch != 0
    cached.window("c", view)
    assert cached.window("c", view) == plain.window("c", view)
    assert cached.cache_info().hits > 0
    engine.dispose()


def test_a_window_never_reads_another_callers_uncommitted_write(counter: FixedCounter) -> None:
    # An in-memory SQLite store shares one connection between callers. A window taken
    # while a write transaction is open on it must not read (or cache) that write.
    from memstore.errors import DatabaseError

    store = MemoryStore("sqlite://", counter=counter)
    store.extend("c", conversation(3))
    with store.engine.connect() as other:
        tx = other.begin()
        other.execute(text(
            "UPDATE memstore_messages SET content_text = 'uncommitted' "
            "WHERE conversation_id = 'c' AND seq = 2"
        ))
        with pytest.raises(DatabaseError):
            store.window("c", UnboundedView())
        tx.rollback()
    assert all(m.text != "uncommitted" for m in store.window("c", UnboundedView()).messages)
    store.close()


def _fingerprint(window: Any) -> tuple[Any, ...]:
    return tuple((m.seq, m.text, m.score, m.pinned) for m in window.messages)


@pytest.mark.slow
def test_threads_reading_during_rewrites_only_see_committed_states(
    db_url: str, counter: FixedCounter
) -> None:
    # One writer rewrites and appends; after each write it records the state it made
    # (read without the cache). Reader threads with the cache must only ever have
    # seen recorded states: no torn window, no stale cached row.
    import threading

    writer_store = MemoryStore(db_url, counter=counter, cache_size=0)
    readers_store = MemoryStore(db_url, counter=counter, cache_size=500)
    writer_store.extend("c", conversation(20))
    view = UnboundedView()
    states = {_fingerprint(writer_store.window("c", view))}
    seen: list[tuple[Any, ...]] = []
    done = threading.Event()
    errors: list[BaseException] = []
    rng = random.Random(11)

    def read() -> None:
        try:
            while not done.is_set():
                seen.append(_fingerprint(readers_store.window("c", view)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(120):
            count = writer_store.get_conversation("c").message_count
            first = writer_store.messages("c", limit=1)[0].seq
            op = rng.choice(["score", "pin", "pop_append", "append"])
            if op == "score":
                writer_store.set_score("c", rng.randint(first, first + count - 1), float(i % 7))
            elif op == "pin":
                writer_store.pin("c", rng.randint(first, first + count - 1))
            elif op == "pop_append":
                writer_store.pop("c", 1)
                states.add(_fingerprint(writer_store.window("c", view)))
                writer_store.append("c", Message.user(f"again {i}"))
            else:
                writer_store.append("c", Message.user(f"more {i}"))
            states.add(_fingerprint(writer_store.window("c", view)))
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not errors
    assert seen and all(s in states for s in seen)
    assert readers_store.cache_info().hits > 0
    writer_store.close()
    readers_store.close()


def test_a_full_cache_admits_a_conversation_when_it_is_used_again(
    db_url: str, counter: FixedCounter
) -> None:
    """One-off windows over many conversations do not evict the rows in use."""
    writer = MemoryStore(db_url, counter=counter)
    for i in range(12):
        writer.extend(f"c{i}", conversation(30, seed=i))
    sizes = [writer.get_conversation(f"c{i}").message_count for i in range(12)]
    store = MemoryStore(db_url, counter=counter, cache_size=sizes[0] + sizes[1])
    cache = store._plan.cache
    assert cache is not None
    view = UnboundedView()
    store.window("c0", view)
    store.window("c1", view)  # the cache is full now, by room alone
    assert cache.get("c0") is not None and cache.get("c1") is not None
    for i in range(2, 12):  # read once each: remembered, not cached
        assert store.window(f"c{i}", view) == writer.window(f"c{i}", view)
        assert cache.get(f"c{i}") is None
    assert cache.get("c0") is not None and cache.get("c1") is not None
    # Used again: admitted (evicting the least recently used), then served from it.
    store.window("c5", view)
    assert cache.get("c5") is not None
    before = store.cache_info()
    again = store.window("c5", view)
    after = store.cache_info()
    assert after.misses == before.misses and after.hits - before.hits == sizes[5]
    assert again == writer.window("c5", view)
    # A write through the store counts as a use: the next window is cached at once.
    store.append("c9", Message.user("more"))
    store.window("c9", view)
    assert cache.get("c9") is not None
    store.clear_cache()
    assert store.cache_info().size == 0 and cache._recent == {}
    store.close()
    writer.close()

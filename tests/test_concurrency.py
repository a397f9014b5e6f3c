"""Many writers on one conversation: every message stored once, seqs contiguous."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from typing import Any

import pytest

from memstore.models import Message
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter
from memstore.views import TokenLimitedView

PROCESSES = 2
THREADS = 8
PER_THREAD = 250


def _writer_process(url: str, process: int, barrier: Any) -> None:
    store = MemoryStore(url, counter=FixedCounter(per_message=3, per_word=1),
                        pool_size=THREADS, max_overflow=0)
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for i in range(PER_THREAD):
                store.append("shared", Message.user(f"p{process} t{thread} i{i}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    barrier.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    if errors:
        raise errors[0]


@pytest.mark.slow
def test_threads_in_two_processes_append_to_one_conversation(db_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_writer_process, args=(db_url, p, barrier))
             for p in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * PROCESSES

    store = MemoryStore(db_url, counter=FixedCounter(per_message=3, per_word=1))
    stored = store.messages("shared")
    total = PROCESSES * THREADS * PER_THREAD
    assert len(stored) == total
    assert [m.seq for m in stored] == list(range(1, total + 1))
    expected = {f"p{p} t{t} i{i}" for p in range(PROCESSES) for t in range(THREADS)
                for i in range(PER_THREAD)}
    assert [m.content for m in stored if isinstance(m.content, str)] and \
        {m.content for m in stored} == expected
    # each thread's own messages appear in the order it wrote them
    for p in range(PROCESSES):
        for t in range(THREADS):
            mine = [m.content for m in stored
                    if isinstance(m.content, str) and m.content.startswith(f"p{p} t{t} ")]
            assert mine == [f"p{p} t{t} i{i}" for i in range(PER_THREAD)]
    conv = store.get_conversation("shared")
    assert conv.message_count == total
    assert conv.token_count == sum(m.token_count for m in stored)
    store.close()


def test_loads_into_a_conversation_being_created_concurrently_do_not_conflict(
    db_url: str,
) -> None:
    """A load or import into a conversation that does not exist yet, while other writers
    create it (appends, other loads): on PostgreSQL a SELECT ... FOR UPDATE of a missing
    row locks nothing, and the load's INSERT of the conversation row was a unique
    violation (a ConflictError, documented as not worth a retry). Every call succeeds."""
    import io

    from memstore import export_jsonl, import_jsonl

    stores = [MemoryStore(db_url, counter=FixedCounter()) for _ in range(4)]
    stores[0].extend("template", [Message.system("s", id="s"), Message.user("u", id="u")])
    snapshot = stores[0].save_state("template")
    buffer = io.StringIO()
    export_jsonl(stores[0], buffer, ["template"])
    exported = buffer.getvalue()
    errors: list[BaseException] = []

    def run(i: int, cid: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            if i == 0:
                stores[i].load_state(snapshot, cid, replace=True)
            elif i == 1:
                stores[i].append(cid, Message.user("x"))
            elif i == 2:
                import_jsonl(stores[i], io.StringIO(exported), rename=cid, replace=True)
            else:
                stores[i].load_state(snapshot, cid, replace=True)
        except BaseException as exc:
            errors.append(exc)

    for r in range(40):
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=run, args=(i, f"c{r}", barrier)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for store in stores:
        store.close()
    assert errors == []


@pytest.mark.slow
def test_writers_waiting_on_a_replacing_load_find_the_conversation(db_url: str) -> None:
    """A replacing load deleted the conversation row and inserted it again: on
    PostgreSQL a writer waiting for the row's lock then found no row, and clear, pop,
    truncate and set_score raised ConversationNotFoundError (ChatContext.clear then
    silently did nothing) although the conversation never stopped existing."""
    import time

    from memstore import MessageNotFoundError

    loader = MemoryStore(db_url, counter=FixedCounter())
    writer = MemoryStore(db_url, counter=FixedCounter())
    loader.extend("c", [Message.user(f"m{i}") for i in range(20)])
    state = loader.save_state("c")
    stop = threading.Event()
    errors: list[BaseException] = []
    done = {"loads": 0, "writes": 0}

    def load() -> None:
        while not stop.is_set():
            loader.load_state(state, "c")
            done["loads"] += 1

    def write() -> None:
        calls = [lambda: writer.clear("c"), lambda: writer.pop("c", 0),
                 lambda: writer.truncate("c", before_seq=2),
                 lambda: writer.set_score("c", 5, 2.0),
                 lambda: writer.append("c", Message.user("x"))]
        i = 0
        while not stop.is_set():
            try:
                calls[i % len(calls)]()
                done["writes"] += 1
            except MessageNotFoundError:
                pass  # seq 5 cleared by the previous call and not loaded back yet
            except BaseException as exc:
                errors.append(exc)
                return
            i += 1

    threads = [threading.Thread(target=load), threading.Thread(target=write)]
    for t in threads:
        t.start()
    # At least 2 s (PostgreSQL failed within that) and 10 calls of each, at most 30 s.
    start = time.monotonic()
    while not errors and time.monotonic() - start < 30 and (
            time.monotonic() - start < 2 or min(done.values()) < 10):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    loader.close()
    writer.close()
    assert errors == []
    assert min(done.values()) >= 10


def _windows_of_own_conversation(store: Any, cid: str, who: str, rounds: int) -> str:
    """Read ``cid``'s window ``rounds`` times (appending now and then); what went wrong."""
    from memstore import UnboundedView

    for i in range(rounds):
        try:
            if i % 10 == 0:
                store.append(cid, Message.user(f"{who} more {i}"))
            window = store.window(cid, UnboundedView())
        except Exception as exc:  # every failure is reported, not only memstore's
            return f"{who}: {type(exc).__name__}: {exc}"
        if window.conversation_id != cid or any(not m.text.startswith(who)
                                                for m in window.messages):
            return f"{who}: read another process's rows: {[m.text for m in window.messages]}"
    return ""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_store_opened_before_fork_gives_the_child_its_own_connections(db_url: str) -> None:
    """Parent and child shared the pooled PostgreSQL socket after os.fork() and read each
    other's replies (a window of the wrong conversation, silently). The child's pool
    now starts empty; the parent's connections stay open."""
    store = MemoryStore(db_url, counter=FixedCounter(), cache_size=0)
    store.extend("parent", [Message.user(f"parent {i}") for i in range(3)])
    store.extend("child", [Message.user(f"child {i}") for i in range(3)])
    store.count_tokens("parent")  # the pool now holds an open connection
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            os.close(reader)
            problem = _windows_of_own_conversation(store, "child", "child", 300)
            os.write(writer, problem.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    problem = _windows_of_own_conversation(store, "parent", "parent", 300)
    _, status = os.waitpid(pid, 0)
    child_problem = os.read(reader, 65536).decode()
    os.close(reader)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (problem, child_problem) == ("", "")
    assert len(store.messages("child")) == 3 + 30 and len(store.messages("parent")) == 33
    store.close()


def test_threads_share_an_in_memory_store() -> None:
    """An in-memory database is one connection every caller shares: two threads used it
    at once and interleaved their transactions (appends acknowledged and then lost,
    failed ones committed, raw KeyError). Calls take turns; a thread reading a stream
    may still call the store."""
    store = MemoryStore("sqlite://", counter=FixedCounter())
    acked: list[str] = []
    errors: list[BaseException] = []

    def append(t: int) -> None:
        try:
            for i in range(150):
                acked.append(store.append("c", Message.user(f"{t}-{i}")).id)
                if i % 25 == 0:
                    store.window("c", TokenLimitedView(200))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stored = store.messages("c")
    assert sorted(m.id for m in stored) == sorted(acked)
    assert [m.seq for m in stored] == list(range(1, 451))
    # a stream being read, and a call from the same thread in between
    for m in store.iter_messages("c", page_size=100):
        if m.seq == 50:
            store.append("d", Message.user("while streaming"))
    assert len(store.messages("d")) == 1
    store.close()


def test_tasks_share_an_in_memory_async_store() -> None:
    """The same for tasks on an in-memory AsyncMemoryStore (600 gathered tasks: every
    write raised, and half of them were stored anyway)."""
    from memstore.aio import AsyncMemoryStore

    async def main() -> None:
        store = AsyncMemoryStore("sqlite+aiosqlite://", counter=FixedCounter())
        results = await asyncio.gather(
            *(store.append("c", Message.user(f"m{i}")) for i in range(300)),
            *(store.window("c", TokenLimitedView(100)) for _ in range(50)),
            return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        stored = await store.messages("c")
        assert sorted(m.id for m in stored) == sorted(r.id for r in results[:300])
        assert [m.seq for m in stored] == list(range(1, 301))
        async for m in store.iter_messages("c", page_size=100):
            if m.seq == 10:
                await store.append("d", Message.user("while streaming"))
        assert len(await store.messages("d")) == 1
        await store.close()

    asyncio.run(main())


def test_an_in_memory_stream_takes_turns_per_page_and_ends_where_it_began() -> None:
    """An in-memory database reads each page separately: its stream held the store's
    turn across yields, so an iterator resumed by two threads (a thread pool serving a
    streaming response) raised "cannot release un-acquired lock" and left the store
    blocked; and it capped the stream at the conversation's message count, not its
    newest seq, so messages appended during the loop were returned."""
    from concurrent.futures import ThreadPoolExecutor

    store = MemoryStore("sqlite://", counter=FixedCounter())
    store.extend("c", [Message.user(f"m{i}") for i in range(1, 9)])
    seen = []
    for m in store.iter_messages("c", start=4, page_size=1):
        seen.append(m.seq)
        store.append("c", Message.user("appended while streaming"))
    assert seen == [4, 5, 6, 7, 8]

    iterator = store.iter_messages("c", page_size=2)
    with ThreadPoolExecutor(2) as pool:  # next() on alternating threads
        texts = [pool.submit(next, iterator).result().text for _ in range(5)]
        assert texts == ["m1", "m2", "m3", "m4", "m5"]
        rest = [m.text for m in pool.submit(list, iterator).result()]
        assert rest[:3] == ["m6", "m7", "m8"] and len(rest) == 3 + 5
        # another thread's call goes through (it blocked forever)
        assert pool.submit(store.count_tokens, "c").result(timeout=10) > 0
    store.close()


def test_an_in_memory_async_stream_lets_other_tasks_call_the_store() -> None:
    """A paused async stream of an in-memory store held its turn: a call from another
    task (gather, a task group, wait_for on Python 3.11) waited until the stream ended."""
    from memstore.aio import AsyncMemoryStore

    async def main() -> None:
        store = AsyncMemoryStore("sqlite+aiosqlite://", counter=FixedCounter())
        await store.extend("c", [Message.user(f"m{i}") for i in range(1, 7)])
        seen = []
        async for m in store.iter_messages("c", start=3, page_size=1):
            seen.append(m.seq)
            await asyncio.wait_for(asyncio.ensure_future(
                store.append("c", Message.user("appended while streaming"))), 10)
        assert seen == [3, 4, 5, 6]
        stream = store.iter_messages("c", page_size=2)
        assert (await stream.__anext__()).text == "m1"
        assert await asyncio.wait_for(asyncio.ensure_future(store.count_tokens("c")), 10) > 0
        await stream.aclose()
        await store.close()

    asyncio.run(main())


def test_async_stores_sharing_an_injected_in_memory_engine_take_turns() -> None:
    """Each async store had its own turn: two stores on one in-memory engine interleaved
    their transactions on its one connection (calls failed, and the writes of calls that
    failed were committed by the other store's COMMIT)."""
    from memstore._db.engine import make_async_engine
    from memstore.aio import AsyncMemoryStore

    async def main() -> None:
        engine = make_async_engine("sqlite+aiosqlite://")
        stores = [AsyncMemoryStore(engine=engine, counter=FixedCounter()) for _ in range(2)]
        results = await asyncio.gather(*(
            stores[i % 2].extend("c", [Message.user(f"{i}a"), Message.user(f"{i}b")])
            for i in range(200)), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        stored = await stores[0].messages("c")
        assert [m.seq for m in stored] == list(range(1, 401))
        for store in stores:
            await store.close()
        await engine.dispose()

    asyncio.run(main())

"""SQLite's three plans for a search of one conversation give the same hits.

``memstore._db.search`` picks, for ``search(q, conversation_id=c)`` on SQLite:

* the index's matches in the rowid range of ``c``'s messages: at once when they lie
  close together in the table (the range is under ``SCOPED_WALK`` times their
  number), otherwise timed, given as long as the per-message plan would take;
* one lookup per message of ``c`` ranked in Python by the index's statistics, when the
  timed walk runs out of time;
* the index's matches filtered to ``c``, when ``c`` holds over ``SCOPED_ROWS`` messages.

Conversations here are written interleaved, so some are spread thin over the table
and others are not; each query's hits must not depend on the plan taken.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from memstore import MemoryStore, migrate
from memstore._db import search_query as _search
from memstore.models import Message
from memstore.tokens import FixedCounter

WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "iris",
         "juniper", "kelp", "lumen", "maple", "nectar", "onyx", "pearl", "quartz", "raven",
         "sable", "tundra"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    url = f"sqlite:///{tmp_path_factory.mktemp('paths') / 'paths.db'}"
    migrate.upgrade(url)
    rng = random.Random(7)
    with MemoryStore(url, counter=FixedCounter()) as store:
        store.extend("dense", [Message.user(" ".join(rng.choices(WORDS, k=6)))
                               for _ in range(40)])
        for round_ in range(60):  # "thin" gets one message per round, among 30 others
            for other in range(30):
                store.append(f"other-{other}", Message.user(" ".join(rng.choices(WORDS, k=6))))
            store.append("thin", Message.user(" ".join(rng.choices(WORDS, k=4))
                                              + (" common" if round_ % 2 else "")))
        yield store


QUERIES = ["amber", "amber basil", "quartz -raven", '"cedar delta"', "iris OR onyx",
           "common", "common amber", "nowhere"]


def _hits(store: Any, cid: str, query: str) -> list[tuple[int, float, str]]:
    return [(h.message.seq, h.rank, h.snippet)
            for h in store.search(query, conversation_id=cid, limit=100)]


@pytest.mark.parametrize("cid", ["dense", "thin", "other-3", "missing"])
def test_every_plan_finds_the_same_hits(store: Any, cid: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    plans: dict[str, dict[str, list[tuple[int, float, str]]]] = {}
    plans["chosen"] = {q: _hits(store, cid, q) for q in QUERIES}
    monkeypatch.setattr(_search, "SCOPED_WALK", 10)  # "thin" is spread thin now: timed,
    monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 1.0)  # in time however busy
    plans["timed"] = {q: _hits(store, cid, q) for q in QUERIES}
    monkeypatch.setattr(_search, "SCOPED_WALK", 0)  # every range walk is timed ...
    monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 0.0)  # ... and out of time at once
    monkeypatch.setattr(_search, "PROGRESS_STEPS", 1)
    plans["per message"] = {q: _hits(store, cid, q) for q in QUERIES}
    monkeypatch.setattr(_search, "SCOPED_ROWS", -1)  # no range plan, no per-message plan
    plans["filtered"] = {q: _hits(store, cid, q) for q in QUERIES}
    for q in QUERIES:
        chosen, filtered, each = (plans[p][q] for p in ("chosen", "filtered", "per message"))
        # The range plans and the filtered one are the same SQL over a narrower walk.
        assert chosen == filtered, q
        assert plans["timed"][q] == filtered, q
        # Ranked in Python by the same BM25: the same hits, ranks equal to rounding
        # (a phrase is ranked by its words there, by its occurrences in FTS5).
        assert sorted(s for s, _, _ in each) == sorted(s for s, _, _ in filtered), q
        if '"' not in q:
            by_seq = {s: r for s, r, _ in filtered}
            for seq, rank, _ in each:
                assert rank == pytest.approx(by_seq[seq], rel=1e-6), (q, seq)
    assert plans["chosen"]["amber"] or cid == "missing"


def _plans_taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The plans searches take from now on (``"statistics"``: the statistics read)."""
    taken: list[str] = []
    plans = {_search._SQLITE_IN_SPAN: "range", _search._SQLITE_IN_ONE: "filtered",
             _search._SQLITE_ONE: "per message"}
    real_fetch, real_stats = _search.fetch_raw, _search._sqlite_stats

    def fetch(conn: Any, sql: str, params: Any) -> Any:
        if sql in plans:
            taken.append(plans[sql])
        return real_fetch(conn, sql, params)

    def stats(*args: Any) -> Any:
        taken.append("statistics")
        return real_stats(*args)

    monkeypatch.setattr(_search, "fetch_raw", fetch)
    monkeypatch.setattr(_search, "_sqlite_stats", stats)
    return taken


def test_which_plan_each_conversation_takes(store: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_search, "SCOPED_WALK", 10)  # "thin": 60 messages over 1,860 rows
    monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 1.0)  # in time however busy
    taken = _plans_taken(monkeypatch)
    store.search("amber", conversation_id="dense")  # close together: the range, untimed
    store.search("amber", conversation_id="thin")  # spread: the range, timed, in time
    assert taken == ["range", "range"]
    # out of time: the walk stops, the statistics are read, one lookup per message
    monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 0.0)
    monkeypatch.setattr(_search, "PROGRESS_STEPS", 1)
    taken.clear()
    assert _hits(store, "thin", "common")
    assert taken == ["range", "statistics", "per message"]
    # a conversation over SCOPED_ROWS messages: the filtered matches, no statistics read
    monkeypatch.setattr(_search, "SCOPED_ROWS", 30)  # "dense" holds 40
    taken.clear()
    store.search("amber", conversation_id="dense")
    assert taken == ["filtered"]


def test_a_stopped_walk_leaves_the_connection_usable(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupted statement ran inside the search's snapshot: later reads work,
    and no progress handler is left on the pooled connection."""
    monkeypatch.setattr(_search, "SCOPED_WALK", 0)
    monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 0.0)
    monkeypatch.setattr(_search, "PROGRESS_STEPS", 1)
    stopped = _hits(store, "thin", "amber")
    monkeypatch.undo()
    assert stopped == _hits(store, "thin", "amber")
    with store.engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        long = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000) "
        assert dbapi.execute(long + "SELECT count(*) FROM n").fetchone() == (50000,)


async def test_the_async_store_takes_the_same_plans(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from memstore import AsyncMemoryStore

    url = str(store.engine.url).replace("sqlite://", "sqlite+aiosqlite://", 1)
    monkeypatch.setattr(_search, "SCOPED_WALK", 10)
    monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 1.0)  # in time however busy
    async with AsyncMemoryStore(url, counter=FixedCounter()) as astore:
        for query in QUERIES:
            timed = [(h.message.seq, h.rank) for h in
                     await astore.search(query, conversation_id="thin", limit=100)]
            assert timed == [(s, r) for s, r, _ in _hits(store, "thin", query)], query
        monkeypatch.setattr(_search, "SCOPED_LOOKUP_SECONDS", 0.0)
        monkeypatch.setattr(_search, "PROGRESS_STEPS", 1)
        taken = _plans_taken(monkeypatch)
        stopped = [(h.message.seq, h.rank) for h in
                   await astore.search("common", conversation_id="thin", limit=100)]
        assert taken == ["range", "statistics", "per message"]
        assert [s for s, _ in stopped] and sorted(s for s, _ in stopped) == sorted(
            s for s, _, _ in _hits(store, "thin", "common"))


async def test_a_cancelled_walk_does_not_pool_a_connection_with_its_handler(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio cancels a search while aiosqlite's thread removes the progress handler:
    the connection, whose handler may still be set, is not pooled again."""
    import asyncio

    import aiosqlite

    from memstore import AsyncMemoryStore

    url = str(store.engine.url).replace("sqlite://", "sqlite+aiosqlite://", 1)
    monkeypatch.setattr(_search, "SCOPED_WALK", 0)  # every range walk is timed
    real = aiosqlite.Connection.set_progress_handler
    cancelled: list[bool] = []

    async def set_handler(self: Any, handler: Any, n: int) -> None:
        if handler is None and not cancelled:  # the removal: cancelled before it runs
            cancelled.append(True)
            raise asyncio.CancelledError
        await real(self, handler, n)

    monkeypatch.setattr(aiosqlite.Connection, "set_progress_handler", set_handler)
    async with AsyncMemoryStore(url, counter=FixedCounter(), pool_size=1,
                                max_overflow=0) as astore:
        with pytest.raises(asyncio.CancelledError):
            await astore.search("amber", conversation_id="thin")
        assert cancelled
        long = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE "
                "i < 50000) SELECT count(*) FROM n")
        async with astore.engine.connect() as conn:  # the pool's one connection
            assert (await conn.exec_driver_sql(long)).scalar() == 50000
        assert [h.message.seq for h in await astore.search("amber", conversation_id="thin",
                                                           limit=100)]

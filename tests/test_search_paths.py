"""SQLite's three plans for a search of one conversation give the same hits.

``memstore._db.search`` picks, for ``search(q, conversation_id=c)`` on SQLite:

* the index's matches in the rowid range of ``c``'s messages, when they lie close
  together in the table (the range is under ``SCOPED_WALK`` times their number);
* otherwise, from the index's statistics: the index's matches filtered to ``c``
  (rare words), or one lookup per message of ``c`` ranked in Python (common words).

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
    monkeypatch.setattr(_search, "SCOPED_WALK", 10)  # "thin" is spread thin now
    plans["chosen, thin"] = {q: _hits(store, cid, q) for q in QUERIES}
    monkeypatch.setattr(_search, "SCOPED_WALK", 0)  # no range plan; always per message
    plans["per message"] = {q: _hits(store, cid, q) for q in QUERIES}
    monkeypatch.setattr(_search, "SCOPED_ROWS", -1)  # no range plan, no per-message plan
    plans["filtered"] = {q: _hits(store, cid, q) for q in QUERIES}
    for q in QUERIES:
        chosen, filtered, each = (plans[p][q] for p in ("chosen", "filtered", "per message"))
        # The range plan and the filtered one are the same SQL over a narrower walk.
        assert chosen == filtered, q
        assert plans["chosen, thin"][q] in (filtered, each), q
        # Ranked in Python by the same BM25: the same hits, ranks equal to rounding
        # (a phrase is ranked by its words there, by its occurrences in FTS5).
        assert sorted(s for s, _, _ in each) == sorted(s for s, _, _ in filtered), q
        if '"' not in q:
            by_seq = {s: r for s, r, _ in filtered}
            for seq, rank, _ in each:
                assert rank == pytest.approx(by_seq[seq], rel=1e-6), (q, seq)
    assert plans["chosen"]["amber"] or cid == "missing"


def test_the_range_plan_is_taken_only_where_the_messages_lie_close(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_search, "SCOPED_WALK", 10)  # "thin": 60 messages over 1,860 rows
    taken: list[str] = []
    plans = {_search._SQLITE_IN_SPAN: "range", _search._SQLITE_IN_ONE: "filtered",
             _search._SQLITE_ONE: "per message"}
    real = _search.fetch_raw

    def fetch(conn: Any, sql: str, params: Any) -> Any:
        if sql in plans:
            taken.append(plans[sql])
        return real(conn, sql, params)

    monkeypatch.setattr(_search, "fetch_raw", fetch)
    store.search("amber", conversation_id="dense")
    store.search("amber", conversation_id="thin")
    store.search("common", conversation_id="thin")
    assert taken[0] == "range"
    assert len(taken) == 3 and "range" not in taken[1:]
    # a conversation over SCOPED_ROWS messages is not measured out: the statistics decide
    monkeypatch.setattr(_search, "SCOPED_ROWS", 30)  # "dense" holds 40
    taken.clear()
    store.search("amber", conversation_id="dense")
    assert taken == ["filtered"]

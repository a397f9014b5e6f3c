"""``store.search``: what is indexed, the query language, filters, snippets, context, ranking.

Every test runs on SQLite and PostgreSQL, through the sync and the async store
(conftest's ``store`` fixture). The index is kept by triggers: each write path is
checked to leave it exactly in step (tests/test_search_state.py does it at random).
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memstore.errors import InvalidInputError
from memstore.models import ImagePart, ImageURL, Message, TextPart, ToolCall
from memstore.search import MAX_LIMIT, MAX_QUERY_CHARS, MAX_QUERY_TERMS, SearchHit
from tests.helpers import Cases, call, examples


async def found(store: Any, query: str, **kwargs: Any) -> list[tuple[str, int]]:
    """(conversation id, seq) of each hit, in result order."""
    hits = await call(store.search(query, **kwargs))
    return [(h.conversation_id, h.message.seq) for h in hits]


async def found_set(store: Any, query: str, **kwargs: Any) -> set[tuple[str, int]]:
    return set(await found(store, query, limit=MAX_LIMIT, **kwargs))


async def trip(store: Any) -> None:
    """A small trip-planning conversation and a billing one."""
    await call(store.create_conversation("trip", metadata={"user": "u1", "tier": "pro"}))
    await call(store.extend("trip", [
        Message.system("You plan trips."),                                     # 1
        Message.user("Book me a flight to Paris next Tuesday, please."),       # 2
        Message.assistant("I found a flight to Paris on Tuesday at 9:40."),    # 3
        Message.assistant(tool_calls=[ToolCall(id="c1", name="get_weather",   # 4
                                               arguments='{"city": "Lisbon"}')]),
        Message.tool("Sunny in Lisbon, 24 degrees.", tool_call_id="c1"),       # 5
        Message.user([TextPart(text="Here is my passport scan"),               # 6
                      ImagePart(image_url=ImageURL(url="https://example.com/zebra.png"))]),
        Message.user("The café in Montréal was naïve about it.",               # 7
                     metadata={"secret": "platypus"}),
    ]))
    await call(store.create_conversation("bill", metadata={"user": "u2", "tier": "free"}))
    await call(store.extend("bill", [
        Message.user("My invoice shows a double charge for the flight."),      # 1
        Message.assistant("I refunded the double charge on your invoice."),    # 2
    ]))


# ---- what is indexed -----------------------------------------------------------------------


async def test_text_tool_calls_and_tool_results_are_indexed(store: Any) -> None:
    await trip(store)
    assert await found_set(store, "paris") == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "get_weather") == {("trip", 4)}  # a tool call's name
    assert await found_set(store, "lisbon") == {("trip", 4), ("trip", 5)}  # arguments, result
    assert await found_set(store, "passport") == {("trip", 6)}  # a text part
    assert await found_set(store, "invoice") == {("bill", 1), ("bill", 2)}


async def test_metadata_roles_urls_of_images_and_ids_are_not_indexed(store: Any) -> None:
    await trip(store)
    for query in ("platypus", "secret", "zebra", "u1", "assistant", "user", "c1", "trip"):
        assert await found(store, query) == [], query


async def test_matching_ignores_case_and_latin_diacritics(store: Any) -> None:
    await trip(store)
    for query in ("PARIS", "Paris", "pArIs"):
        assert await found_set(store, query) == {("trip", 2), ("trip", 3)}
    for query in ("cafe", "café", "CAFÉ", "montreal", "naive", "naïve"):
        assert await found_set(store, query) == {("trip", 7)}, query


async def test_a_hit_carries_the_stored_message(store: Any) -> None:
    await trip(store)
    (hit,) = await call(store.search("passport"))
    assert isinstance(hit, SearchHit)
    assert hit.conversation_id == "trip" and hit.seq == 6
    stored = await call(store.get_message("trip", 6))
    assert hit.message == stored
    assert hit.before == () and hit.after == ()
    assert isinstance(hit.rank, float) and hit.rank > 0
    with pytest.raises(ValidationError, match="frozen"):
        hit.rank = 1.0  # type: ignore[misc]


# ---- the query language ----------------------------------------------------------------------


async def test_words_are_anded(store: Any) -> None:
    await trip(store)
    assert await found_set(store, "flight paris") == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "flight invoice") == {("bill", 1)}
    assert await found_set(store, "flight paris invoice") == set()


async def test_phrases_match_words_in_order(store: Any) -> None:
    await trip(store)
    assert await found_set(store, '"flight to paris"') == {("trip", 2), ("trip", 3)}
    assert await found_set(store, '"paris to flight"') == set()
    assert await found_set(store, '"double charge"') == {("bill", 1), ("bill", 2)}
    assert await found_set(store, '"charge double"') == set()
    # punctuation inside a word joins its parts into a phrase
    assert await found_set(store, "get-weather") == {("trip", 4)}
    assert await found_set(store, "weather-get") == set()
    # an unbalanced quote runs to the end of the query
    assert await found_set(store, '"double charge') == {("bill", 1), ("bill", 2)}


async def test_or_and_exclusion(store: Any) -> None:
    await trip(store)
    assert await found_set(store, "passport OR invoice") == {
        ("trip", 6), ("bill", 1), ("bill", 2)}
    assert await found_set(store, "passport or invoice") == {
        ("trip", 6), ("bill", 1), ("bill", 2)}
    # OR binds looser than AND: (flight AND paris) OR passport
    assert await found_set(store, "flight paris OR passport") == {
        ("trip", 2), ("trip", 3), ("trip", 6)}
    assert await found_set(store, "flight -paris") == {("bill", 1)}
    assert await found_set(store, 'charge -"double charge"') == set()
    assert await found_set(store, "paris -tuesday -please") == set()
    # "or" at either end, or twice, is a word
    assert await found_set(store, "paris or") == set()


async def test_operators_of_the_engines_are_words(store: Any) -> None:
    """FTS5's and tsquery's syntax means nothing: every term reaches the database quoted."""
    await trip(store)
    assert await found_set(store, "paris AND tuesday") == set()  # "and" is a word here
    assert await found_set(store, "paris NOT tuesday") == set()
    assert await found_set(store, "flight & paris") == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "flight | paris") == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "paris*") == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "pari*") == set()  # no prefix search
    assert await found_set(store, "body:paris") == set()  # a phrase "body paris"
    assert await found_set(store, "NEAR(flight paris)") == set()  # a phrase "near flight"


# ---- filters -----------------------------------------------------------------------------


async def test_conversation_filters(store: Any) -> None:
    await trip(store)
    assert await found_set(store, "flight", conversation_id="trip") == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "flight", conversation_id="bill") == {("bill", 1)}
    assert await found_set(store, "flight", conversation_id=["bill", "trip"]) == {
        ("trip", 2), ("trip", 3), ("bill", 1)}
    assert await found_set(store, "flight", conversation_id=("bill", "nowhere")) == {
        ("bill", 1)}
    assert await found_set(store, "flight", conversation_id=[]) == set()
    assert await found_set(store, "flight", conversation_id="nowhere") == set()


async def test_metadata_filter(store: Any) -> None:
    await trip(store)
    assert await found_set(store, "flight", where={"user": "u2"}) == {("bill", 1)}
    assert await found_set(store, "flight", where={"tier": "pro"}) == {("trip", 2), ("trip", 3)}
    assert await found_set(store, "flight", where={"tier": "pro", "user": "u2"}) == set()
    assert await found_set(store, "flight", where={"missing": None}) == {
        ("trip", 2), ("trip", 3), ("bill", 1)}
    assert await found_set(store, "flight", where={}) == {("trip", 2), ("trip", 3), ("bill", 1)}
    assert await found_set(store, "flight", where={"user": "u1"},
                           conversation_id=["bill", "trip"]) == {("trip", 2), ("trip", 3)}


async def test_role_filter(store: Any) -> None:
    await trip(store)
    assert await found_set(store, "flight", roles=["user"]) == {("trip", 2), ("bill", 1)}
    assert await found_set(store, "flight", roles="assistant") == {("trip", 3)}
    assert await found_set(store, "lisbon", roles=["tool"]) == {("trip", 5)}
    assert await found_set(store, "lisbon", roles=["user", "system"]) == set()
    assert await found_set(store, "flight", roles=[]) == set()
    assert await found_set(store, "flight", roles=["user"], conversation_id="trip") == {
        ("trip", 2)}


async def test_time_filters(store: Any) -> None:
    await call(store.append("t", Message.user("alpha one")))
    middle = (await call(store.get_message("t", 1))).created_at + timedelta(microseconds=1)
    later = datetime.now(timezone.utc) + timedelta(seconds=1)
    while datetime.now(timezone.utc) <= middle:
        pass
    await call(store.append("t", Message.user("alpha two")))
    assert await found_set(store, "alpha", since=middle) == {("t", 2)}
    assert await found_set(store, "alpha", until=middle) == {("t", 1)}
    assert await found_set(store, "alpha", since=middle, until=later) == {("t", 2)}
    assert await found_set(store, "alpha", since=later) == set()
    other_zone = timezone(timedelta(hours=-7))
    assert await found_set(store, "alpha", since=middle.astimezone(other_zone)) == {("t", 2)}


# ---- limits, ranking, context, snippets ----------------------------------------------------------


async def test_limit_keeps_the_best(store: Any) -> None:
    await call(store.extend("r", [Message.user(f"kiwi {'filler ' * i}") for i in range(30)]
                               + [Message.user("kiwi kiwi kiwi")]))
    hits = await call(store.search("kiwi", limit=5))
    assert len(hits) == 5
    ranks = [h.rank for h in hits]
    assert ranks == sorted(ranks, reverse=True)
    assert hits[0].message.seq == 31  # three matches in three words
    assert hits[1].message.seq == 1  # one match in one word
    everything = await call(store.search("kiwi", limit=MAX_LIMIT))
    assert len(everything) == 31
    assert [h.message.seq for h in everything[:5]] == [h.message.seq for h in hits]


async def test_ranking_within_one_conversation_prefers_denser_matches(store: Any) -> None:
    await call(store.extend("r", [
        Message.user("mango " + "lorem ipsum dolor " * 20),
        Message.user("mango mango smoothie"),
        Message.user("mango"),
    ]))
    for scope in ({}, {"conversation_id": "r"}):
        seqs = [s for _, s in await found(store, "mango", **scope)]
        assert seqs[-1] == 1, scope  # diluted by filler: last
        assert set(seqs) == {1, 2, 3}


async def test_context_around_hits(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"line {i}" + (" needle" if i in (1, 5, 6) else ""))
                                  for i in range(1, 10)]))
    hits = {h.message.seq: h for h in await call(store.search("needle", context=2))}
    assert set(hits) == {1, 5, 6}
    assert [m.seq for m in hits[1].before] == []
    assert [m.seq for m in hits[1].after] == [2, 3]
    assert [m.seq for m in hits[5].before] == [3, 4]
    assert [m.seq for m in hits[5].after] == [6, 7]
    assert [m.seq for m in hits[6].before] == [4, 5]
    assert [m.seq for m in hits[6].after] == [7, 8]
    assert hits[5].after[0] == hits[6].message
    end = await call(store.search("needle", context=50, conversation_id="c"))
    assert all(len(h.before) + len(h.after) == 8 for h in end)
    none = await call(store.search("needle", context=0))
    assert all(h.before == () and h.after == () for h in none)


async def test_context_skips_nothing_after_a_truncate(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"row {i} pear") for i in range(1, 8)]))
    await call(store.truncate("c", before_seq=4))
    hits = {h.message.seq: h for h in await call(store.search("pear", context=3))}
    assert set(hits) == {4, 5, 6, 7}
    assert [m.seq for m in hits[4].before] == []
    assert [m.seq for m in hits[5].before] == [4]
    assert [m.seq for m in hits[7].after] == []


async def test_snippets_mark_the_matched_words(store: Any) -> None:
    await trip(store)
    (hit,) = await call(store.search("passport"))
    assert hit.snippet == "Here is my [passport] scan"
    (hit,) = await call(store.search("montreal", mark=("<b>", "</b>")))
    assert "<b>Montréal</b>" in hit.snippet
    (hit,) = await call(store.search("get_weather"))
    assert "[get]_[weather]" in hit.snippet
    hits = await call(store.search("lisbon", mark=("", "")))
    assert {h.snippet for h in hits} >= {"Sunny in Lisbon, 24 degrees."}
    long = " ".join(f"w{i}" for i in range(200)) + " target " + " ".join(
        f"v{i}" for i in range(200))
    await call(store.append("long", Message.user(long)))
    (hit,) = await call(store.search("target"))
    assert "[target]" in hit.snippet
    assert hit.snippet.startswith("\u2026") and hit.snippet.endswith("\u2026")
    assert len(hit.snippet) < 200
    (hit,) = await call(store.search("flight -paris"))
    assert "[flight]" in hit.snippet and "[" not in hit.snippet.replace("[flight]", "")


# ---- arguments -------------------------------------------------------------------------------


BAD_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"limit": 0}, "limit"),
    ({"limit": MAX_LIMIT + 1}, "limit"),
    ({"limit": True}, "limit"),
    ({"limit": 2.0}, "limit"),
    ({"context": -1}, "context"),
    ({"context": 51}, "context"),
    ({"mark": "[]"}, "mark"),
    ({"mark": ("[", 1)}, "mark"),
    ({"mark": ("[", "]", "!")}, "mark"),
    ({"mark": ("\x00", "]")}, "NUL"),
    ({"roles": ["user", "human"]}, "human"),
    ({"roles": 3}, "roles"),
    ({"since": datetime(2024, 1, 1)}, "timezone-aware"),
    ({"until": "2024-01-01"}, "until"),
    ({"conversation_id": 7}, "conversation_id"),
    ({"conversation_id": ["ok", ""]}, "empty"),
    ({"conversation_id": ["x" * 256]}, "255"),
    ({"conversation_id": [f"c{i}" for i in range(MAX_LIMIT + 1)]}, "conversation_id"),
    ({"where": {"k": [1]}}, "where"),
    ({"where": "user=u1"}, "where"),
]


async def test_bad_arguments_are_invalid_input(store: Any) -> None:
    """Each of BAD_ARGUMENTS is refused naming the argument; the cases share one store (a
    refused search writes nothing) and a failure names every failing case."""
    await call(store.append("c", Message.user("hello")))
    cases = Cases()
    for kwargs, message in BAD_ARGUMENTS:
        with cases.case(kwargs), pytest.raises(InvalidInputError, match=message):
            await call(store.search("hello", **kwargs))
    cases.check()


async def test_limit_bounds_are_inclusive(store: Any) -> None:
    await call(store.extend("c", [Message.user("plum") for _ in range(3)]))
    assert len(await call(store.search("plum", limit=1))) == 1
    assert len(await call(store.search("plum", limit=MAX_LIMIT))) == 3


#: Queries that must be searched or refused with InvalidInputError, never a driver error.
HOSTILE = [
    '"', '""', '"""', '"unbalanced', 'unbalanced"', 'a"b', '"a" "b', "'", "''", "it's", "'a'",
    "AND", "OR", "NOT", "a AND", "OR a", "a OR OR b", "a NOT", "NOT a", "a AND NOT b",
    "NEAR(a b)", "NEAR(a b, 2)", "NEAR", "near(", "a NEAR b", "(", ")", "((a)", "a)",
    "*", "a*", "*a", "a * b", "^a", "^", "a^b", "+", "a + b", "-", "--", "-a", "- a",
    "a -", "a --b", "role:user", "body:x", "{body}: x", "{", "}", "col:", ":", "a:b:c",
    "!a", "!!", "a & b", "a | b", "a <-> b", "<->", "<1>", "a:*", "a:A", "\\", "\\\\",
    "a\\b", "%", "_", "%_", "$$", "$1", "?", ";", "; DROP TABLE memstore_messages; --",
    "') OR 1=1 --", "\") OR (\"", "\x01\x02", "\t\n\r", "\u00a0", "\u200b", "\ufeff",
    "\U0001f600", "\U0001f600\U0001f600 \U0001f4a9", "emoji \U0001f600 word", "\U0001e900",
    "\u0301", "e\u0301", "\u2028", "日本語", "한국어 텍스트", "ﬁx", "²", "x²y", "İstanbul",
    "ſ", "Straße", "a" * 3000, " ".join(["a"] * 3000), "x" * 10_000,
    " ".join(f"t{i}" for i in range(MAX_QUERY_TERMS)),
    "\x00", "a\x00b", "\ud800", "a\udfffb", "", "   ", "\t", "a" * (MAX_QUERY_CHARS + 1),
    " ".join(f"t{i}" for i in range(MAX_QUERY_TERMS + 1)),
    "a " * 500_000, " ".join(["w"] * 10_000),
]


async def test_hostile_queries_are_searched_or_refused(store: Any) -> None:
    """Every query of HOSTILE is searched or refused with a message. The queries share one
    store (a search writes nothing; a refused one leaves the store usable for the next);
    a failure names every failing query by its index in HOSTILE."""
    await call(store.append("c", Message.user("a plain message: it's an Istanbul street")))
    cases = Cases()
    for i, query in enumerate(HOSTILE):
        with cases.case(f"HOSTILE[{i}] {query[:40]!r}"):
            try:
                hits = await call(store.search(query))
            except InvalidInputError as exc:
                assert str(exc)
            else:
                assert isinstance(hits, list)
    cases.check()


REFUSALS: list[tuple[str, str]] = [
    ("", "nothing to search for"), ("   ", "nothing to search for"),
    ("!!! ???", "nothing to search for"), ("\U0001f600", "nothing to search for"),
    ("-cat", "only excludes"), ("cat OR -dog", "only excludes"),
    ("\x00", "NUL"), ("\ud800", "surrogate"),
    ("a" * (MAX_QUERY_CHARS + 1), "characters long"),
    (" ".join(f"t{i}" for i in range(MAX_QUERY_TERMS + 1)), "terms"),
]


async def test_refusals_name_the_problem(store: Any) -> None:
    """Each query of REFUSALS is refused naming its problem (one store for all: a refused
    search writes nothing)."""
    cases = Cases()
    for query, message in REFUSALS:
        with cases.case(f"{query[:40]!r}"), pytest.raises(InvalidInputError, match=message):
            await call(store.search(query))
    cases.check()


async def test_a_query_that_is_not_a_string(store: Any) -> None:
    for bad in (None, 3, b"bytes", ["a"]):
        with pytest.raises(InvalidInputError, match="query must be a str"):
            await call(store.search(bad))


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=60))
def test_any_text_is_searched_or_refused_sqlite(sqlite_store: Any, query: str) -> None:
    _searched_or_refused(sqlite_store, query)


@pytest.mark.postgres
@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=60))
def test_any_text_is_searched_or_refused_postgres(postgres_store: Any, query: str) -> None:
    _searched_or_refused(postgres_store, query)


def _searched_or_refused(store: Any, query: str) -> None:
    try:
        hits = store.search(query, limit=3, context=1)
    except InvalidInputError:
        return
    assert isinstance(hits, list)


@pytest.fixture
def sqlite_store(tmp_path: Any, counter: Any, migrated_sqlite: Any) -> Any:
    from memstore.store import MemoryStore

    store = MemoryStore(migrated_sqlite(tmp_path / "any.db"), counter=counter)
    store.extend("c", [Message.user("the quick brown fox"), Message.user("naïve café 日本語"),
                       Message.assistant(tool_calls=[ToolCall(id="t", name="f_x",
                                                              arguments='{"a": "b c"}')])])
    yield store
    store.close()


@pytest.fixture
def postgres_store(pg_url: str, counter: Any) -> Any:
    from memstore.store import MemoryStore
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    store = MemoryStore(pg_url, counter=counter)
    store.extend("c", [Message.user("the quick brown fox"), Message.user("naïve café 日本語"),
                       Message.assistant(tool_calls=[ToolCall(id="t", name="f_x",
                                                              arguments='{"a": "b c"}')])])
    yield store
    store.close()


# ---- every write path keeps the index in step ---------------------------------------------------


async def test_writes_that_remove_or_replace_messages_leave_the_index(store: Any) -> None:
    await call(store.extend("w", [Message.user(f"common m{i}") for i in range(1, 11)]))
    assert len(await found_set(store, "common")) == 10
    await call(store.pop("w", 2))  # m9, m10 go
    assert await found_set(store, "m10") == set()
    await call(store.truncate("w", before_seq=3))  # m1, m2 go
    assert await found_set(store, "m1") == set()
    assert {s for _, s in await found_set(store, "common")} == {3, 4, 5, 6, 7, 8}
    await call(store.rewrite("w", lambda ms: [Message.user("common replaced")], newest=2))
    assert await found_set(store, "m7") == set() and await found_set(store, "m8") == set()
    assert await found_set(store, "replaced") == {("w", 7)}
    await call(store.append("w", Message.user("common m9 again")))  # a popped seq reused
    assert await found_set(store, "m9") == {("w", 8)}
    await call(store.clear("w"))
    assert await found_set(store, "common") == set()
    await call(store.append("w", Message.user("common fresh")))
    assert await found_set(store, "common") == {("w", 1)}
    await call(store.delete_conversation("w"))
    assert await found_set(store, "common") == set()


async def test_state_loads_and_imports_are_indexed(store: Any) -> None:
    await call(store.extend("src", [Message.user("orchid one"), Message.user("orchid two")]))
    state = await call(store.save_state("src"))
    await call(store.load_state(state, "copy"))
    assert await found_set(store, "orchid") == {
        ("src", 1), ("src", 2), ("copy", 1), ("copy", 2)}
    await call(store.append("other", Message.user("orchid zero")))
    await call(store.load_state(state, "other", replace=False))
    assert await found_set(store, "orchid", conversation_id="other") == {
        ("other", 1), ("other", 2), ("other", 3)}
    await call(store.load_state(state, "other"))  # replacing
    assert await found_set(store, "zero") == set()
    assert await found_set(store, "orchid", conversation_id="other") == {
        ("other", 1), ("other", 2)}


def test_exports_imported_are_indexed(db_url: str, counter: Any) -> None:
    from memstore.store import MemoryStore
    from memstore.transfer import export_jsonl, import_jsonl

    with MemoryStore(db_url, counter=counter) as store:
        store.extend("a", [Message.user("tulip red"), Message.assistant("tulip blue")])
        out = io.StringIO()
        export_jsonl(store, out)
        store.delete_conversation("a")
        assert store.search("tulip") == []
        import_jsonl(store, io.StringIO(out.getvalue()))
        assert {(h.conversation_id, h.message.seq) for h in store.search("tulip")} == {
            ("a", 1), ("a", 2)}
        import_jsonl(store, io.StringIO(out.getvalue()), rename="b")
        assert len(store.search("tulip")) == 4


def test_lifecycle_writes_keep_the_index(db_url: str, counter: Any) -> None:
    from memstore.store import MemoryStore

    with MemoryStore(db_url, counter=counter) as store:
        store.create_conversation("p", metadata={"user": "gone"})
        store.extend("p", [Message.user(f"lilac {i}") for i in range(5)])
        store.fork("p", "f", at_seq=3)
        assert {(h.conversation_id, h.message.seq) for h in store.search("lilac", limit=50)} == {
            *(("p", s) for s in range(1, 6)), *(("f", s) for s in range(1, 4))}
        store.prune(keep_last=2, conversation_ids=["p"])
        assert {s for _, s in [(h.conversation_id, h.message.seq) for h in store.search(
            "lilac", conversation_id="p")]} == {4, 5}
        store.forget(where={"user": "gone"})
        assert store.search("lilac") == []


async def test_a_hit_round_trips_and_its_snippet_is_made_when_read(store: Any) -> None:
    await trip(store)
    (hit,) = await call(store.search("passport"))
    assert hit._snippet is None  # not made yet
    assert hit.snippet == "Here is my [passport] scan"
    dumped = hit.model_dump()
    assert dumped["snippet"] == hit.snippet and dumped["message"]["seq"] == 6
    again = SearchHit.model_validate(dumped)
    assert again == hit and again.snippet == hit.snippet and hash(again) == hash(hit)
    assert SearchHit.model_validate_json(hit.model_dump_json()) == hit
    with pytest.raises(ValidationError, match="snippet"):
        SearchHit.model_validate({**dumped, "snippet": 3})


async def test_a_message_without_text_is_stored_and_found_by_nothing(store: Any) -> None:
    await call(store.extend("empty", [Message(role="assistant", content=None),
                                      Message.user(""), Message.user([]),
                                      Message.user("words after")]))
    assert [m.seq for m in await call(store.messages("empty"))] == [1, 2, 3, 4]
    assert await found_set(store, "words") == {("empty", 4)}

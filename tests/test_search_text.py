"""Search text and tokens: one definition, replayed in Python, SQLite and PostgreSQL.

* the separator table in ``memstore.search`` is SQLite ``unicode61``'s, read again here;
* ``fold`` in Python and ``memstore_search_fold`` in PostgreSQL give the same words;
* the searchable text of a message is the same in Python and in both databases' SQL;
* for queries of plain ASCII words, SQLite and PostgreSQL find the same messages in one
  shared corpus (mixed punctuation, URLs, numbers, diacritics, emoji, tool calls);
* the query language's parser and renderers, and snippets (no database).
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from memstore import migrate
from memstore._db import erasure as _erasure
from memstore._db import search as _search
from memstore.errors import InvalidInputError
from memstore.models import ImagePart, ImageURL, Message, TextPart, ToolCall
from memstore.search import (
    MAX_INDEXED_CHARS,
    REMOVED_MARKS,
    Query,
    Term,
    fold,
    parse_query,
    searchable_text,
    separator_ranges,
    snippet,
)
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter
from tests.helpers import examples

# ---- the token definition --------------------------------------------------------------------


def _unicode61() -> tuple[list[tuple[int, int]], list[int]]:
    """SQLite's unicode61 (remove_diacritics 2): its separators, and the marks it removes.

    Every code point (surrogates aside) is tokenized between two letters, ``a<cp>a``: a
    separator gives the tokens ``a`` and ``a``, a removed mark the one token ``aa``, any
    other character one token of its own. The tokenizer decides each code point alone,
    so the items go 512 to a row, a space between them (one row each took 5 s); the
    offsets of the tokens ``a`` and ``aa`` place each item, and each row's token count
    must be what that placement says (so no item gave anything else).
    """
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(b, tokenize='unicode61 remove_diacritics 2')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    points = [cp for cp in range(1, 0x110000) if not 0xD800 <= cp < 0xE000]
    rows = [points[i:i + 512] for i in range(0, len(points), 512)]
    db.executemany("INSERT INTO t(rowid, b) VALUES (?, ?)",
                   [(k, " ".join("a" + chr(cp) + "a" for cp in row))
                    for k, row in enumerate(rows)])
    marks: dict[int, dict[int, str]] = {}
    for term, doc, offset in db.execute(
            "SELECT term, doc, offset FROM v WHERE term IN ('a', 'aa')"):
        marks.setdefault(doc, {})[offset] = term
    counts = dict(db.execute("SELECT doc, count(*) FROM v GROUP BY doc"))
    separators: list[int] = []
    removed: list[int] = []
    for k, row in enumerate(rows):
        at, offset = marks.get(k, {}), 0
        for cp in row:
            if at.get(offset) == "a":
                assert at.get(offset + 1) == "a", hex(cp)
                separators.append(cp)
                offset += 2
            else:
                if at.get(offset) == "aa":
                    removed.append(cp)
                offset += 1
        assert offset == counts[k], k  # every token placed: one or two per item
    ranges: list[tuple[int, int]] = []
    for cp in separators:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return ranges, removed


def test_the_separator_table_is_sqlite_unicode61s() -> None:
    ranges, removed = _unicode61()
    assert separator_ranges() == ranges
    assert [ord(m) for m in REMOVED_MARKS] == removed


WORDS = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)


@pytest.fixture(scope="module")
def pg_engine(postgres: Any) -> Any:
    url = postgres.create_database("memstore_search_text")
    migrate.upgrade(url)
    engine = create_engine(url)
    yield engine
    engine.dispose()


@pytest.mark.postgres
@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=WORDS)
def test_fold_is_the_same_in_python_and_postgresql(pg_engine: Any, value: str) -> None:
    with pg_engine.connect() as conn:
        folded = conn.execute(text("SELECT memstore_search_fold(:v)"), {"v": value}).scalar()
    assert folded.split() == fold(value).split()


@pytest.mark.postgres
def test_fold_of_known_text(pg_engine: Any) -> None:
    sample = "naïve Café x²y foo—bar ſ e.g. https://example.com/x?y=1 한국어 e\u0301 İ"
    with pg_engine.connect() as conn:
        folded = conn.execute(text("SELECT memstore_search_fold(:v)"), {"v": sample}).scalar()
    assert folded.split() == fold(sample).split()
    assert fold(sample).split()[:12] == ["naive", "Cafe", "x²y", "foo", "bar", "s", "e", "g",
                                         "https", "example", "com", "x"]


# ---- the searchable text ---------------------------------------------------------------------

PIECES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
MESSAGES = st.one_of(
    st.builds(Message.user, PIECES),
    st.builds(lambda texts: Message.user([TextPart(text=t) for t in texts] + [
        ImagePart(image_url=ImageURL(url="https://e.x/i.png"))]),
        st.lists(PIECES, min_size=1, max_size=3)),
    st.builds(lambda calls, content: Message.assistant(content or None, tool_calls=[
        ToolCall(id=f"c{i}", name=f"n{i}_{name}", arguments=arguments)
        for i, (name, arguments) in enumerate(calls)]),
        st.lists(st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), PIECES),
                 min_size=1, max_size=3), PIECES),
    st.builds(lambda t: Message.tool(t, tool_call_id="x"), PIECES),
)


@settings(max_examples=examples(120), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGES, min_size=1, max_size=4))
def test_searchable_text_is_the_same_in_python_and_sqlite(tmp_path_factory: Any,
                                                          messages: list[Message]) -> None:
    url = f"sqlite:///{tmp_path_factory.mktemp('t') / 'x.db'}"
    with MemoryStore(url, counter=FixedCounter()) as store:
        stored = store.extend("c", messages)
        with store.engine.connect() as conn:
            bodies = [r[0] for r in conn.exec_driver_sql(
                f"SELECT s.body FROM {_search.SOURCE} s JOIN memstore_messages m "
                "ON m.rowid = s.id ORDER BY m.seq")]
    assert [b or "" for b in bodies] == [searchable_text(m.content, m.tool_calls)
                                         for m in stored]


@pytest.mark.postgres
@settings(max_examples=examples(120), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=MESSAGES)
def test_searchable_text_is_the_same_in_python_and_postgresql(pg_engine: Any,
                                                              message: Message) -> None:
    store = MemoryStore(engine=pg_engine, counter=FixedCounter())
    try:
        stored = store.append("c", message)
        with pg_engine.connect() as conn:
            body = conn.execute(text(
                "SELECT memstore_search_text(content_text, content_parts, tool_calls) "
                "FROM memstore_messages WHERE conversation_id = 'c' AND seq = :s"),
                {"s": stored.seq}).scalar()
    finally:
        store.delete_conversation("c")
        store.close()
    assert (body or "") == searchable_text(stored.content, stored.tool_calls)


def test_only_the_first_characters_are_indexed(tmp_path: Any) -> None:
    head = "alpha " * (MAX_INDEXED_CHARS // 6 - 1)
    with MemoryStore(f"sqlite:///{tmp_path / 'x.db'}", counter=FixedCounter()) as store:
        store.append("c", Message.user(head + "inside " + "beta " * 10 + " outside"))
        assert len(store.search("inside")) == 1
        assert store.search("outside") == []


# ---- SQLite and PostgreSQL find the same messages --------------------------------------------

VOCABULARY = [
    "flight", "paris", "invoice", "refund", "charge", "python", "error", "docker", "timeout",
    "garlic", "oven", "meeting", "tuesday", "passport", "hotel", "visa", "budget", "report",
    "deploy", "server", "cache", "query", "index", "table", "weather", "lisbon", "city",
    "sunny", "rain", "coffee", "cafe", "naive", "resume",
]


def _corpus(seed: int = 5) -> list[tuple[str, list[Message]]]:
    rng = random.Random(seed)
    decorations = ["{w}", "{w}.", "{w},", "({w})", "'{w}'", "\"{w}\"", "{w}!", "{w}?",
                   "#{w}", "{w}:", "https://{w}.example.com/{w}", "{w}@mail.test", "{w}-{w}",
                   "{w}_{w}", "{w}/{w}", "{W}", "{w}s", "{w}123", "3.14 {w}", "{w}\u2014x",
                   "\U0001f600{w}", "{w}\u2019s", "caf\u00e9 {w}", "na\u00efve", "r\u00e9sum\u00e9",
                   "Montr\u00e9al"]
    out = []
    for c in range(12):
        messages = []
        for _ in range(rng.randint(3, 12)):
            words = [rng.choice(decorations).format(w=(w := rng.choice(VOCABULARY)),
                                                    W=w.upper())
                     for _ in range(rng.randint(3, 15))]
            body = " ".join(words)
            shape = rng.random()
            if shape < 0.15:
                messages.append(Message.assistant(tool_calls=[ToolCall(
                    id=f"t{rng.random()}", name=rng.choice(VOCABULARY) + "_tool",
                    arguments=f'{{"q": "{rng.choice(VOCABULARY)} {rng.choice(VOCABULARY)}"}}')]))
            elif shape < 0.25:
                messages.append(Message.user([TextPart(text=body), TextPart(text=words[0])]))
            else:
                messages.append(rng.choice([Message.user, Message.assistant])(body))
        out.append((f"conv-{c}", messages))
    return out


def _queries(seed: int = 9) -> list[str]:
    rng = random.Random(seed)
    queries = [*VOCABULARY, "com", "example", "mail", "test", "s", "123", "14", "3", "x",
               "cafe", "naive", "resume", "montreal", "tool"]
    for _ in range(60):
        a, b, c = rng.sample(VOCABULARY, 3)
        queries += [f"{a} {b}", f"{a} OR {b}", f'"{a} {b}"', f"{a} -{b}", f"{a} {b} OR {c}",
                    f"{a}-{b}", f"{a}_{b}", f"{a}.{b}"]
    return queries


@pytest.mark.postgres
def test_sqlite_and_postgresql_find_the_same_messages(tmp_path: Any, pg_url: str) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    sqlite_url = f"sqlite:///{tmp_path / 'same.db'}"
    found: dict[str, dict[str, set[tuple[str, int]]]] = {}
    for name, url in (("sqlite", sqlite_url), ("postgresql", pg_url)):
        with MemoryStore(url, counter=FixedCounter()) as store:
            for cid, messages in _corpus():
                store.extend(cid, messages)
            found[name] = {
                q: {(h.conversation_id, h.message.seq) for h in store.search(q, limit=1000)}
                for q in _queries()}
            for q in ("flight", "paris invoice"):  # scoped (SQLite ranks those itself)
                for cid in ("conv-1", "conv-2"):
                    found[name][f"{q} @{cid}"] = {
                        (h.conversation_id, h.message.seq)
                        for h in store.search(q, conversation_id=cid, limit=1000)}
    differing = [q for q in found["sqlite"] if found["sqlite"][q] != found["postgresql"][q]]
    assert not differing, differing[:10]
    assert sum(bool(v) for v in found["sqlite"].values()) > len(found["sqlite"]) // 2


# ---- triggers beyond memstore's own writes -----------------------------------------------------


def test_a_content_update_by_hand_is_followed(db_url: str) -> None:
    with MemoryStore(db_url, counter=FixedCounter()) as store:
        store.append("c", Message.user("original words"))
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE memstore_messages SET content_text = 'edited words' "
                              "WHERE conversation_id = 'c'"))
            conn.execute(text("UPDATE memstore_messages SET score = 3"))
        assert store.search("original") == []
        assert [h.message.seq for h in store.search("edited")] == [1]


@pytest.mark.postgres
def test_truncate_empties_the_index(pg_url: str) -> None:
    from tests.conftest import _empty_pg, _truncate_pg

    _empty_pg(pg_url)
    with MemoryStore(pg_url, counter=FixedCounter()) as store:
        store.append("c", Message.user("gone soon"))
        _truncate_pg(pg_url)
        assert store.search("gone") == []
        with store.engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {_search.INDEX}")).scalar() == 0
        store.append("c", Message.user("gone again"))  # seq 1 again: no stale key in the way
        assert [h.message.seq for h in store.search("gone")] == [1]


def test_sqlite_index_passes_fts5_integrity_check(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with MemoryStore(url, counter=FixedCounter()) as store:
        for i in range(30):
            store.extend(f"c{i % 3}", [Message.user(f"w{i} text"), Message.assistant(
                tool_calls=[ToolCall(id=f"t{i}", name="f", arguments='{"a": 1}')]),
                Message.tool(f"r{i}", tool_call_id=f"t{i}")])
        store.pop("c0", 4)
        store.truncate("c1", before_seq=5)
        store.rewrite("c2", lambda ms: [Message.user("new")], newest=3)
        store.delete_conversation("c1")
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {_search.INDEX}({_search.INDEX}) VALUES ('integrity-check')")


# ---- the query language ----------------------------------------------------------------------


def test_parse_query_groups_and_terms() -> None:
    q = parse_query('cat "black dog" OR bird -fish x:y')
    assert q.groups == ((Term("cat"), Term("black dog")),
                        (Term("bird"), Term("fish", exclude=True), Term("x:y")))
    assert q.fts5() == '("cat" AND "black dog") OR (("bird" AND "x:y") NOT "fish")'
    assert q.tsquery() == "('cat' & 'black dog') | ('bird' & !'fish' & 'x y')"
    assert q.keys == {"cat", "black", "dog", "bird", "x", "y"}


@pytest.mark.parametrize(("query", "groups"), [
    ("a or", [["a", "or"]]), ("or a", [["or", "a"]]), ("a OR OR b", [["a"], ["OR", "b"]]),
    ("--a b", [["a", "b"]]), ("a - b c", [["a", "-b", "c"]]), ('a "" b', [["a", "b"]]),
    ('"unbalanced phrase', [["unbalanced phrase"]]), ("a !!! b", [["a", "b"]]),
    ('a"b c"', [["a", "b c"]]), ("Or", [["Or"]]), ("-or x", [["-or", "x"]]),
])
def test_parse_query_edge_cases(query: str, groups: list[list[str]]) -> None:
    parsed = parse_query(query)
    assert [[("-" if t.exclude else "") + t.text for t in g] for g in parsed.groups] == groups


def test_rendered_queries_quote_everything() -> None:
    q = Query('x', ((Term('say "hi"'), Term("it's \\ ok", exclude=True)),))
    assert q.fts5() == '(("say ""hi""") NOT "it\'s \\ ok")'
    assert q.tsquery() == "('say hi' & !'it s ok')"


def test_parse_query_refusals() -> None:
    for bad in ("", "-a", "a OR -b", "!!!"):
        with pytest.raises(InvalidInputError):
            parse_query(bad)


# ---- snippets --------------------------------------------------------------------------------


def test_snippet_windows_and_marks() -> None:
    keys = frozenset({"target"})
    assert snippet("a target here.", keys) == "a [target] here."
    assert snippet("  lead (target)  ", keys, ("<", ">")) == "lead (<target>)"
    text_ = " ".join(["x"] * 50) + " target " + " ".join(["y"] * 50)
    cut = snippet(text_, keys)
    assert cut.startswith("\u2026 x x x [target] y") and cut.endswith("\u2026")
    assert snippet("nothing matches here", keys) == "nothing matches here"
    assert snippet("", keys) == ""
    assert snippet("!!!", keys) == "!!!"
    assert "[Café]" in snippet("le Café noir", frozenset({"cafe"}))
    long = "w" * 10_000
    assert len(snippet(long, frozenset({long}))) < 100
    assert snippet("runs running ran", frozenset({"running"}), stemmed=True) == (
        "[runs] [running] ran")


def test_purge_removes_what_deleted_messages_left_in_sqlite_s_index(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with MemoryStore(url, counter=FixedCounter()) as store:
        store.append("a", Message.user("alpha beta"))
        store.append("gone", Message.user("zzqsecretword and more"))
        store.delete_conversation("gone")
        assert store.search("zzqsecretword") == []

        def left() -> int:
            with store.engine.connect() as conn:
                return int(conn.exec_driver_sql(
                    f"SELECT count(*) FROM {_search.INDEX}_data "
                    "WHERE instr(block, 'zzqsecretword') > 0").scalar() or 0)

        assert left() > 0  # FTS5 marks the deletion; the old segment still holds the word
        with store.engine.begin() as conn:
            _erasure.purge_deleted(conn)
        assert left() == 0
        assert [h.seq for h in store.search("alpha")] == [1]

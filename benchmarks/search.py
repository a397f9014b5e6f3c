"""The ``search`` phase: full-text search latency, write cost, index size and backfill time.

``python -m benchmarks --phase search`` (or ``python -m benchmarks.search``) generates a
deterministic corpus of realistic messages (an English vocabulary ranked by frequency,
drawn by Zipf's law, with each conversation's own topic words, tool calls with JSON
arguments and longer tool results), loads it into SQLite and PostgreSQL without the
index, builds the index (the backfill of migration 0005, timed), then measures:

* two-word queries (two words of one stored message, neither among the 150 commonest),
  ``limit=10``, over all conversations and over one conversation: p50 and p90 of
  ``store.search`` and of a raw floor (hand-written SQL over the same index returning
  tuples), timed alternately in one process. Half the conversations are written one at a
  time, half interleaved (in groups of `INTERLEAVE`, `EXTEND` messages each in turn),
  as a service with many users writes them: one conversation's search is timed on
  each half;
* the anchors' way to search: ``LIKE '%word%'`` (``ILIKE`` on PostgreSQL) over the same
  messages, as the OpenAI Agents SDK's and Letta's stores do;
* the write cost of the index: a single append and an ``extend`` of 100 on a database
  with the index against the same on one without it, timed alternately;
* the index's size per message.

Default corpus: 100,000 messages in 1,000 conversations; ``--full``: 1,000,000 in
10,000. Results go to ``benchmarks/results/search.json`` and, with ``--update-docs``,
into the table of docs/search.md.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DOC = REPO / "docs" / "search.md"
BEGIN, END = "<!-- BEGIN SEARCH BENCHMARK -->", "<!-- END SEARCH BENCHMARK -->"

# ---- the corpus --------------------------------------------------------------------------

#: Words left out of the vocabulary (the tokenizer's list holds some).
_BLOCKED = {"fuck", "fucking", "shit", "porn", "sex", "nude", "nigger", "rape", "cock", "dick",
            "pussy", "bitch", "slut", "whore", "cunt", "asshole"}


#: The interleaved half of the corpus: conversations written in turn in groups this
#: large, EXTEND messages at a time.
INTERLEAVE = 1_000
EXTEND = 10


def vocabulary() -> list[str]:
    """English words (4–12 letters) in cl100k's merge order, roughly by frequency."""
    from memstore.tokens._loading import _load_encoding

    encoding = _load_encoding("cl100k_base")
    words: list[str] = []
    seen: set[str] = set()
    for token in range(100_000):
        try:
            text = encoding.decode_single_token_bytes(token).decode("utf-8", "ignore")
        except Exception:
            continue
        if re.fullmatch(r" [a-z]{4,12}", text):
            word = text[1:]
            if word not in seen and word not in _BLOCKED:
                seen.add(word)
                words.append(word)
    return words


FUNCTION = [
    "the", "a", "an", "and", "or", "but", "to", "of", "in", "on", "for", "with", "at", "by",
    "from", "about", "as", "is", "are", "was", "were", "be", "been", "have", "has", "had",
    "do", "does", "did", "can", "could", "will", "would", "should", "may", "might", "this",
    "that", "these", "those", "it", "its", "we", "you", "they", "he", "she", "i", "my", "your",
    "our", "their", "there", "here", "what", "which", "who", "when", "where", "why", "how",
    "not", "no", "yes", "please", "thanks", "okay", "so", "if", "then", "than", "also", "just",
    "only", "very", "more", "most", "some", "any", "all", "each", "every", "other",
]


class Corpus:
    """Deterministic realistic messages: ``conversation(i)`` is always the same."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.words = vocabulary()
        weights = [1 / (rank + 10) ** 1.07 for rank in range(len(self.words))]
        self.cumulative = list(itertools.accumulate(weights))
        self.common = set(self.words[:150]) | set(FUNCTION)

    def _word(self, rng: random.Random) -> str:
        return self.words[bisect.bisect(self.cumulative, rng.random() * self.cumulative[-1])]

    def _sentence(self, rng: random.Random, topic: list[str], n: int) -> str:
        out = []
        for _ in range(n):
            r = rng.random()
            if r < 0.42:
                out.append(rng.choice(FUNCTION))
            elif r < 0.62:
                out.append(rng.choice(topic))
            elif r < 0.64:
                out.append(str(rng.randint(1, 2030)))
            else:
                out.append(self._word(rng))
        text = " ".join(out)
        return text[:1].upper() + text[1:] + rng.choice(".?!.,;:")[0]

    def _text(self, rng: random.Random, topic: list[str], low: int, high: int) -> str:
        total = rng.randint(low, high)
        sentences = []
        while total > 0:
            n = min(total, rng.randint(5, 18))
            sentences.append(self._sentence(rng, topic, n))
            total -= n
        return " ".join(sentences)

    def conversation(self, index: int, size: int) -> list[dict[str, Any]]:
        """``size`` OpenAI message dicts of conversation ``index``."""
        rng = random.Random(f"{self.seed}:{index}")
        topic = [self._word(rng) for _ in range(25)] + [
            self.words[rng.randint(300, 8000)] for _ in range(15)]
        out: list[dict[str, Any]] = []
        while len(out) < size:
            out.append({"role": "user", "content": self._text(rng, topic, 6, 40)})
            if len(out) < size - 2 and rng.random() < 0.12:
                call = f"call_{index}_{len(out)}"
                name = rng.choice(("search_docs", "get_weather", "lookup_order", "run_query"))
                args = json.dumps({"query": self._text(rng, topic, 2, 6).rstrip(".?!,;:"),
                                   "limit": rng.randint(1, 20)})
                out.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": call, "type": "function",
                    "function": {"name": name, "arguments": args}}]})
                out.append({"role": "tool", "tool_call_id": call,
                            "content": self._text(rng, topic, 40, 160)})
            if len(out) < size:
                out.append({"role": "assistant", "content": self._text(rng, topic, 15, 90)})
        return out[:size]

    def query(self, rng: random.Random, message: dict[str, Any]) -> str | None:
        """Two distinct uncommon words of one message, or ``None``."""
        text = message.get("content") or json.dumps(message.get("tool_calls"))
        words = sorted({w for w in re.findall(r"[a-z]{4,}", text.lower())
                        if w not in self.common})
        if len(words) < 2:
            return None
        return " ".join(rng.sample(words, 2))


# ---- databases ---------------------------------------------------------------------------


def _postgres_url(args: argparse.Namespace, name: str) -> str:
    from sqlalchemy import create_engine, text

    admin = create_engine(f"postgresql+psycopg://{args.pg_user}@{args.pg_host}:{args.pg_port}/"
                          f"{args.pg_admin_db}", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return f"postgresql+psycopg://{args.pg_user}@{args.pg_host}:{args.pg_port}/{name}"


def _drop_postgres(args: argparse.Namespace, name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(f"postgresql+psycopg://{args.pg_user}@{args.pg_host}:{args.pg_port}/"
                          f"{args.pg_admin_db}", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _database(args: argparse.Namespace, db: str, label: str, workdir: Path) -> str:
    from memstore import migrate

    if db == "sqlite":
        url = f"sqlite:///{workdir / f'{label}.db'}"
    else:
        url = _postgres_url(args, f"memstore_bench_search_{label}")
    migrate.upgrade(url)
    return url


def _without_index(url: str) -> None:
    from sqlalchemy import create_engine

    from memstore._db import search as _search

    engine = create_engine(url)
    with engine.begin() as conn:
        _search.drop_index(conn)
    engine.dispose()


def _index_bytes(conn: Any) -> int:
    from memstore._db import search as _search

    if conn.dialect.name == "sqlite":
        total = 0
        for table, column in (("data", "block"), ("idx", "term"), ("docsize", "sz")):
            total += int(conn.exec_driver_sql(
                f"SELECT coalesce(sum(length({column})), 0) FROM {_search.INDEX}_{table}"
            ).scalar() or 0)
        return total
    return int(conn.exec_driver_sql(
        f"SELECT pg_total_relation_size('{_search.INDEX}') + coalesce((SELECT "
        "sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = "
        f"'{_search.INDEX}'::regclass), 0)").scalar() or 0)


# ---- timing ------------------------------------------------------------------------------


def _ms(seconds: list[float], q: float) -> float:
    ordered = sorted(seconds)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _alternate(pairs: list[tuple[Callable[[], Any], Callable[[], Any]]],
               repeat: int) -> tuple[list[float], list[float]]:
    """Time each pair's two calls alternately (order flipped every round)."""
    first: list[float] = []
    second: list[float] = []
    for round_ in range(repeat):
        for a, b in pairs:
            for which, fn in ((0, a), (1, b)) if round_ % 2 == 0 else ((1, b), (0, a)):
                start = time.perf_counter()
                fn()
                (first if which == 0 else second).append(time.perf_counter() - start)
    return first, second


def _floor(conn: Any, query: str, cid: str | None) -> Callable[[], Any]:
    """Hand-written SQL over the same index: the top 10 as tuples."""
    words = query.split()
    if conn.dialect.name == "sqlite":
        match = " AND ".join(f'"{w}"' for w in words)
        if cid is None:
            sql = ("SELECT m.conversation_id, m.seq, m.role, m.content_text FROM (SELECT rowid "
                   "AS rid, rank FROM fts_memstore_messages WHERE fts_memstore_messages MATCH ? "
                   "ORDER BY rank LIMIT 10) t JOIN memstore_messages m ON m.rowid = t.rid "
                   "ORDER BY t.rank")
            params: Any = (match,)
        else:
            sql = ("SELECT m.conversation_id, m.seq, m.role, m.content_text FROM "
                   "fts_memstore_messages JOIN memstore_messages m ON m.rowid = "
                   "fts_memstore_messages.rowid WHERE fts_memstore_messages MATCH ? AND "
                   "m.conversation_id = ? ORDER BY fts_memstore_messages.rank LIMIT 10")
            params = (match, cid)
    else:
        tsq = " & ".join(f"'{w}'" for w in words)
        scope = "" if cid is None else " AND conversation_id = %(cid)s"
        sql = ("SELECT m.conversation_id, m.seq, m.role, m.content_text FROM (SELECT "
               "conversation_id, seq, ts_rank_cd(document, q, 1) AS r FROM "
               "fts_memstore_messages, to_tsquery('simple', %(q)s) AS q WHERE document @@ q"
               f"{scope} ORDER BY r DESC LIMIT 10) t JOIN memstore_messages m USING "
               "(conversation_id, seq) ORDER BY t.r DESC")
        params = {"q": tsq, "cid": cid}

    def run() -> Any:
        return conn.exec_driver_sql(sql, params).fetchall()

    return run


def _like(conn: Any, query: str, cid: str | None) -> Callable[[], Any]:
    """The anchors' search: a LIKE '%word%' scan (ILIKE on PostgreSQL), no ranking."""
    words = query.split()
    if conn.dialect.name == "sqlite":
        conds = " AND ".join("content_text LIKE ?" for _ in words)
        params: Any = tuple(f"%{w}%" for w in words)
        scope = ""
        if cid is not None:
            scope, params = " AND conversation_id = ?", (*params, cid)
        sql = (f"SELECT conversation_id, seq, role, content_text FROM memstore_messages "
               f"WHERE {conds}{scope} ORDER BY created_at DESC LIMIT 10")
    else:
        conds = " AND ".join(f"content_text ILIKE %(w{i})s" for i in range(len(words)))
        params = {f"w{i}": f"%{w}%" for i, w in enumerate(words)}
        scope = ""
        if cid is not None:
            scope, params["cid"] = " AND conversation_id = %(cid)s", cid
        sql = (f"SELECT conversation_id, seq, role, content_text FROM memstore_messages "
               f"WHERE {conds}{scope} ORDER BY created_at DESC LIMIT 10")

    def run() -> Any:
        return conn.exec_driver_sql(sql, params).fetchall()

    return run


# ---- one database --------------------------------------------------------------------------


def run_db(args: argparse.Namespace, db: str, corpus: Corpus, workdir: Path) -> dict[str, Any]:
    from memstore import MemoryStore
    from memstore._db import search as _search
    from memstore.tokens import ApproxCounter

    conversations, per = args.conversations, args.per_conversation
    label = f"{db}_{uuid.uuid4().hex[:6]}"
    url = _database(args, db, label, workdir)
    _without_index(url)
    counter = ApproxCounter()
    store = MemoryStore(url, counter=counter, durability="normal", cache_size=0)
    rng = random.Random(args.seed)
    samples: list[tuple[str, dict[str, Any]]] = []
    started = time.perf_counter()
    # The first half of the conversations is written one conversation at a time (each
    # conversation's messages together in the table); the second half is written as
    # many conversations are in a service, interleaved: groups of INTERLEAVE
    # conversations each take EXTEND messages in turn, so one conversation's messages
    # are spread over a range of the table INTERLEAVE times its size.
    half = conversations // 2
    for i in range(half):
        messages = corpus.conversation(i, per)
        store.extend(f"conv-{i:06d}", messages)
        if rng.random() < 400 / conversations:
            samples.append((f"conv-{i:06d}", rng.choice(messages)))
        if args.verbose and i % 500 == 0:
            print(f"  {db}: loaded {i * per:,} messages", file=sys.stderr, flush=True)
    for group in range(half, conversations, INTERLEAVE):
        members = range(group, min(group + INTERLEAVE, conversations))
        texts = {i: corpus.conversation(i, per) for i in members}
        for start in range(0, per, EXTEND):
            for i in members:
                store.extend(f"conv-{i:06d}", texts[i][start:start + EXTEND])
        for i in members:
            if rng.random() < 400 / conversations:
                samples.append((f"conv-{i:06d}", rng.choice(texts[i])))
        if args.verbose:
            print(f"  {db}: loaded {(group + len(members)) * per:,} messages", file=sys.stderr,
                  flush=True)
    load = time.perf_counter() - started
    engine = store.engine
    with engine.connect() as conn:
        conn.execution_options(**_write())
        with conn.begin():
            started = time.perf_counter()
            _search.create_index(conn, "simple")
            backfill = time.perf_counter() - started
        size = _index_bytes(conn)
        if db == "postgresql":
            conn.commit()
            raw = conn.connection.dbapi_connection
            raw.autocommit = True  # type: ignore[union-attr]
            raw.execute("VACUUM ANALYZE")  # type: ignore[union-attr]
            raw.autocommit = False  # type: ignore[union-attr]
        else:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
    total = conversations * per
    queries = [(cid, q) for cid, m in samples if (q := corpus.query(rng, m)) is not None]
    # as many from each half (one at a time, interleaved) as there are
    first = [x for x in queries if int(x[0][5:]) < half]
    second = [x for x in queries if int(x[0][5:]) >= half]
    queries = [x for pair in itertools.zip_longest(first, second) for x in pair
               if x is not None][: args.queries]
    out: dict[str, Any] = {
        "db": db, "messages": total, "conversations": conversations,
        "load_s": round(load, 1), "backfill_s": round(backfill, 2),
        "backfill_per_message_us": round(backfill / total * 1e6, 1),
        "index_bytes": size, "index_bytes_per_message": round(size / total, 1),
        "queries": len(queries), "interleaved_with": min(INTERLEAVE, conversations - half),
    }
    with engine.connect() as conn:
        found_all = [len(store.search(q, limit=10)) for _, q in queries]
        out["hits_per_query_all"] = round(statistics.mean(found_all), 2)
        interleaved = {f"conv-{i:06d}" for i in range(half, conversations)}
        for scope in ("all", "one", "spread"):
            pairs = []
            for cid, q in queries:
                if scope != "all" and (cid in interleaved) != (scope == "spread"):
                    continue
                target = None if scope == "all" else cid
                pairs.append((
                    (lambda q=q, t=target: store.search(q, conversation_id=t, limit=10)),
                    _floor(conn, q, target)))
            mem, floor = _alternate(pairs, args.repeat)
            if scope == "all":  # the same, every hit's snippet read too
                read = []
                for _, q in queries:
                    start = time.perf_counter()
                    for hit in store.search(q, limit=10):
                        _ = hit.snippet
                    read.append(time.perf_counter() - start)
                out["all_snippets_p50_ms"] = round(_ms(read, 0.5), 3)
            out[f"{scope}_p50_ms"] = round(_ms(mem, 0.5), 3)
            out[f"{scope}_p90_ms"] = round(_ms(mem, 0.9), 3)
            out[f"{scope}_floor_p50_ms"] = round(_ms(floor, 0.5), 3)
            out[f"{scope}_floor_ratio"] = round(_ms(mem, 0.5) / _ms(floor, 0.5), 2)
            likes = [_like(conn, q, None if scope == "all" else cid)
                     for cid, q in queries[: args.like_queries]
                     if scope == "all" or (cid in interleaved) == (scope == "spread")]
            times = []
            for fn in likes:
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            out[f"{scope}_like_p50_ms"] = round(_ms(times, 0.5), 3)
            out[f"{scope}_like_ratio"] = round(_ms(times, 0.5) / _ms(mem, 0.5), 2)
            if args.verbose:
                print(f"  {db} {scope}: {out[f'{scope}_p50_ms']} ms", file=sys.stderr)
        conn.rollback()
    store.close()
    out.update(_writes(args, db, corpus, workdir))
    if db == "postgresql" and not args.keep_dbs:
        _drop_postgres(args, f"memstore_bench_search_{label}")
    return out


def _write() -> dict[str, Any]:
    from memstore._db.engine import write_options

    return write_options()


def _writes(args: argparse.Namespace, db: str, corpus: Corpus, workdir: Path) -> dict[str, Any]:
    """Append and extend with the index against the same without it, alternately."""
    from memstore import MemoryStore
    from memstore.tokens import ApproxCounter

    names = [f"{db}_w_on_{uuid.uuid4().hex[:6]}", f"{db}_w_off_{uuid.uuid4().hex[:6]}"]
    urls = [_database(args, db, name, workdir) for name in names]
    _without_index(urls[1])
    stores = [MemoryStore(u, counter=ApproxCounter(), durability="normal", cache_size=0)
              for u in urls]
    warm = [corpus.conversation(10_000_000 + i, 100) for i in range(args.write_warmup)]
    for store in stores:
        for i, messages in enumerate(warm):
            store.extend(f"warm-{i}", messages)
    batches = [corpus.conversation(20_000_000 + i, 100) for i in range(40)]
    singles = [m for batch in batches for m in batch if m.get("content")][:600]
    counter = itertools.count()
    append_pairs = [((lambda m=m: stores[0].append(f"a-{next(counter) % 50}", m)),
                     (lambda m=m: stores[1].append(f"a-{next(counter) % 50}", m)))
                    for m in singles[:300]]
    on, off = _alternate(append_pairs, 1)
    extend_pairs = [((lambda b=b: stores[0].extend(f"e-{next(counter)}", b)),
                     (lambda b=b: stores[1].extend(f"e-{next(counter)}", b)))
                    for b in batches[:30]]
    e_on, e_off = _alternate(extend_pairs, 1)
    for store in stores:
        store.close()
    engine = _engine_writes(db, urls[0], workdir, warm, singles[:300], batches[:30])
    if db == "postgresql" and not args.keep_dbs:
        for name in names:
            _drop_postgres(args, f"memstore_bench_search_{name}")
    return {**engine, **_costs("", on, off, e_on, e_off)}


def _costs(prefix: str, on: list[float], off: list[float], e_on: list[float],
           e_off: list[float]) -> dict[str, Any]:
    """Medians of appends and extends with the index and without it, and their ratios."""
    median = statistics.median
    return {
        f"{prefix}append_with_index_us": round(median(on) * 1e6),
        f"{prefix}append_without_index_us": round(median(off) * 1e6),
        f"{prefix}append_ratio": round(median(on) / median(off), 2),
        f"{prefix}extend100_with_index_ms": round(median(e_on) * 1e3, 2),
        f"{prefix}extend100_without_index_ms": round(median(e_off) * 1e3, 2),
        f"{prefix}extend100_ratio": round(median(e_on) / median(e_off), 2),
    }


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(message.get("tool_calls"))


def _engine_writes(db: str, url_on: str, workdir: Path, warm: list[list[dict[str, Any]]],
                   singles: list[dict[str, Any]],
                   batches: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The database's own cost of indexing the same rows, without memstore.

    A bare table of ``(id, conversation_id, body)`` rows, with the same index as
    memstore's and without it: on SQLite an FTS5 table of the same tokenizer over it as
    external content, filled by a trigger; on PostgreSQL a stored generated
    ``tsvector`` (the same configuration and separator folding) with a GIN index. One
    committed ``INSERT`` of a row (append) or of 100 rows (extend), timed alternately.
    What the index adds here is what any index kept in the same transaction adds.
    """
    conns = _engine_tables(db, url_on, workdir)
    counter = itertools.count()

    def insert(conn: Any, messages: list[dict[str, Any]]) -> Callable[[], None]:
        rows = [(f"c-{next(counter) % 50}", _text(m)) for m in messages]
        mark = "?" if db == "sqlite" else "%s"
        sql = ("INSERT INTO bench_m (conversation_id, body) VALUES "
               + ", ".join([f"({mark}, {mark})"] * len(rows)))
        flat = [value for row in rows for value in row]

        def run() -> None:
            if db == "sqlite":
                conn.execute("BEGIN")
                conn.execute(sql, flat)
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    conn.execute(sql, flat)
        return run

    for conn in conns:
        for messages in warm:
            insert(conn, messages)()
    on, off = _alternate([(insert(conns[0], [m]), insert(conns[1], [m])) for m in singles], 1)
    e_on, e_off = _alternate([(insert(conns[0], b), insert(conns[1], b)) for b in batches], 1)
    for conn in conns:
        conn.close()
    return _costs("engine_", on, off, e_on, e_off)


def _engine_tables(db: str, url_on: str, workdir: Path) -> list[Any]:
    """Two driver connections, to a bare table with the index and to one without it."""
    if db == "sqlite":
        import sqlite3

        from memstore._db.search import _tokenizer

        conns = []
        for name, indexed in (("engine_on", True), ("engine_off", False)):
            path = workdir / f"{name}_{uuid.uuid4().hex[:6]}.db"
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # as durability="normal"
            conn.execute("CREATE TABLE bench_m (id INTEGER PRIMARY KEY, conversation_id TEXT "
                         "NOT NULL, body TEXT)")
            if indexed:
                conn.execute("CREATE VIRTUAL TABLE bench_f USING fts5(body, content='bench_m', "
                             f"content_rowid='id', tokenize='{_tokenizer('simple')}')")
                conn.execute("CREATE TRIGGER bench_i AFTER INSERT ON bench_m BEGIN INSERT INTO "
                             "bench_f(rowid, body) VALUES (NEW.id, NEW.body); END")
            conns.append(conn)
        return conns
    import psycopg

    from memstore._db.engine import sync_url

    url = sync_url(url_on)
    conns = []
    for indexed in (True, False):
        conn = psycopg.connect(host=url.host, port=url.port, user=url.username,
                               dbname=url.database, autocommit=True)
        table = "bench_m_on" if indexed else "bench_m_off"
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        document = (", document tsvector GENERATED ALWAYS AS (to_tsvector('simple', "
                    "memstore_search_fold(coalesce(body, '')))) STORED" if indexed else "")
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, conversation_id text "
                     f"NOT NULL, body text{document})")
        if indexed:
            conn.execute(f"CREATE INDEX ON {table} USING gin (document)")
        conn.execute(f"CREATE OR REPLACE TEMP VIEW bench_m AS SELECT * FROM {table}")
        conns.append(conn)
    return conns


# ---- report --------------------------------------------------------------------------------


def table(results: list[dict[str, Any]], command: str) -> str:
    """The markdown table of docs/search.md."""
    lines = [
        f"Measured with `{command}` on {_machine()}: "
        f"{results[0]['messages']:,} messages in {results[0]['conversations']:,} "
        "conversations of generated text; two-word queries (two uncommon words of one stored "
        "message), `limit=10`; p50 over "
        f"{results[0]['queries']} queries, memstore and the floor timed alternately.",
        "",
        "| | SQLite | PostgreSQL |",
        "|---|---|---|",
    ]
    by = {r["db"]: r for r in results}

    def row(title: str, fmt: Callable[[dict[str, Any]], str]) -> None:
        cells = [fmt(by[d]) if d in by else "—" for d in ("sqlite", "postgresql")]
        lines.append(f"| {title} | {cells[0]} | {cells[1]} |")

    row("all conversations: p50 (p90)", lambda r: f"{r['all_p50_ms']} ms ({r['all_p90_ms']} ms)")
    row("all conversations: vs. the raw floor", lambda r: f"{r['all_floor_ratio']}×")
    row("all conversations: p50, every snippet read", lambda r: f"{r['all_snippets_p50_ms']} ms")
    row("all conversations: `LIKE '%word%'` (anchors)",
        lambda r: f"{r['all_like_p50_ms']} ms, {r['all_like_ratio']}× memstore")
    row("one conversation: p50 (p90)", lambda r: f"{r['one_p50_ms']} ms ({r['one_p90_ms']} ms)")
    row("one conversation: vs. the raw floor", lambda r: f"{r['one_floor_ratio']}×")
    row("one conversation: `LIKE '%word%'` (anchors)",
        lambda r: f"{r['one_like_p50_ms']} ms, {r['one_like_ratio']}× memstore")
    among = f"{results[0]['interleaved_with']:,}"
    row(f"one conversation written among {among}: p50 (p90)",
        lambda r: f"{r['spread_p50_ms']} ms ({r['spread_p90_ms']} ms)")
    row(f"one conversation written among {among}: vs. the raw floor",
        lambda r: f"{r['spread_floor_ratio']}×")
    row("append: with the index / without",
        lambda r: f"{r['append_with_index_us']} / {r['append_without_index_us']} µs "
                  f"({r['append_ratio']}×)")
    row("extend of 100: with / without",
        lambda r: f"{r['extend100_with_index_ms']} / {r['extend100_without_index_ms']} ms "
                  f"({r['extend100_ratio']}×)")
    row("the database alone (no memstore), one row: with the index / without",
        lambda r: f"{r['engine_append_with_index_us']} / {r['engine_append_without_index_us']} "
                  f"µs (+{r['engine_append_with_index_us'] - r['engine_append_without_index_us']}"
                  " µs)" if "engine_append_ratio" in r else "—")
    def engine_extend(r: dict[str, Any]) -> str:
        on, off = r["engine_extend100_with_index_ms"], r["engine_extend100_without_index_ms"]
        return f"{on} / {off} ms (+{on - off:.2f} ms)"

    row("the database alone, 100 rows: with the index / without",
        lambda r: engine_extend(r) if "engine_extend100_ratio" in r else "—")
    row("index size per message", lambda r: f"{r['index_bytes_per_message']:.0f} bytes")
    row("backfill (migration 0005)",
        lambda r: f"{r['backfill_s']} s ({r['backfill_per_message_us']} µs per message)")
    return "\n".join(lines)


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def update_docs(text: str) -> None:
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.search",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true",
                   help="1,000,000 messages in 10,000 conversations (default 100,000 in 1,000)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 10,000 messages")
    p.add_argument("--db", default="sqlite,postgres", help="sqlite,postgres (default both)")
    p.add_argument("--queries", type=int, default=200, help="queries timed (default 200)")
    p.add_argument("--like-queries", type=int, default=20, help="LIKE scans timed (default 20)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of the queries (default 3)")
    p.add_argument("--write-warmup", type=int, default=100,
                   help="conversations of 100 messages in the write-cost databases")
    p.add_argument("--seed", type=int, default=20_241_201)
    p.add_argument("--results", type=Path, default=HERE / "results" / "search.json")
    p.add_argument("--update-docs", action="store_true", help="write the table into "
                   "docs/search.md")
    p.add_argument("--keep-dbs", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--pg-host", default="127.0.0.1")
    p.add_argument("--pg-port", type=int, default=5432)
    p.add_argument("--pg-user", default="postgres")
    p.add_argument("--pg-admin-db", default="test")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.conversations, args.per_conversation = (
        (10_000, 100) if args.full else (100, 100) if args.quick else (1_000, 100))
    if args.quick:
        args.queries, args.repeat, args.like_queries, args.write_warmup = 40, 2, 5, 10
    corpus = Corpus(args.seed)
    dbs = [{"postgres": "postgresql"}.get(d.strip(), d.strip()) for d in args.db.split(",")
           if d.strip()]
    results = []
    with tempfile.TemporaryDirectory(prefix="memstore-search-bench-") as tmp:
        for db in dbs:
            print(f"search benchmark on {db}: {args.conversations * args.per_conversation:,} "
                  "messages", file=sys.stderr, flush=True)
            results.append(run_db(args, db, corpus, Path(tmp)))
    command = "python -m benchmarks --phase search" + (" --sizes 1m" if args.full else "") + (
        " --quick" if args.quick else "")
    doc = {"command": command, "git": _git(), "results": results}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(doc, indent=1) + "\n")
    rendered = table(results, command)
    print(rendered)
    if args.update_docs:
        update_docs(rendered)
    return 0


def _git() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=REPO, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())


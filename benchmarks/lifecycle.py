"""Lifecycle benchmarks: filtered listing, prune, forget and fork (a report, not a test).

Run ``python -m benchmarks.lifecycle [--db sqlite,postgres] [--full] [--phases ...]``.
Nothing here asserts a time; it prints a markdown section (the one in
``docs/lifecycle.md``, "Benchmarks") and writes every number to a JSON file
(``benchmarks/results/raw/lifecycle-quick.json``, or ``lifecycle-full.json``).

What is measured, per database:

* **list**: ``list_conversations(where={"user_id": u})`` over 100,000 conversations
  (10,000 users, 10 conversations each, a random user per call), against a raw floor:
  the same query hand-written (``id IN (SELECT conversation_id FROM
  memstore_conversation_keys WHERE key = ? AND kind = 'text' AND value = ?)``, the
  same index) on the driver's own connection, returning tuples; and that floor with its
  rows built into ``Conversation`` models by memstore's own decoder (what a listing
  returns: parsed times, decoded metadata), which shows how much of the gap is the
  models. The three are timed in turn, call after call in one process (in a new
  random order every call), so a busy machine slows them alike; p50, p95 and the
  ratios of the p50s.
* **prune**: ``prune(older_than=90 days, keep_last=20)`` over conversations of 100
  messages written evenly over the last 180 days (about half of each goes), with the
  store's defaults (``keep_anchored``: each system prompt moves up). Two sizes, each
  pruned in a fresh process (``--worker prune``): 10,000 and 100,000 messages (quick),
  100,000 and 1,000,000 (``--full``). Throughput is the messages the prune covered
  per second (and the messages deleted per second); the process's peak RSS
  (``VmHWM``: interpreter, imports and store included; ``getrusage``'s ``ru_maxrss``
  would carry over the parent's peak, see `_peak_mib`) at both sizes shows whether
  memory grows with the data.
* **forget**: ``forget(where={"user_id": subject})`` of a subject with 100
  conversations of 1,000 messages (100,000 messages), beside other users'
  conversations of 100 messages: 200 of them (quick), 9,000 (``--full``: the subject
  is a tenth of a store of 1,000,000 messages); wall time in a fresh process, the
  SQLite WAL checkpoint included (PostgreSQL without ``vacuum``). Then, in the same
  process, the forget of one other user's 100 messages (a person's few messages in a
  large store: on SQLite 3.42 or newer, ``--sqlite-module``, deleted from the index in
  place).
* **erasure** (SQLite): the two ways a forget takes a large share of the messages out
  of the full-text index (`memstore._db.erasure`: merge the whole index after marking
  the deleted messages, or rebuild it from what stays), each forced in turn on a fresh
  copy of one store of conversations of 100 messages (1,000 of them, ``--full``:
  3,000), a share of 0.25, 0.33, 0.4 and 0.5 of them forgotten, each forget in a fresh
  process. Where the two cross is ``REBUILD_SHARE``.
* **fork**: ``fork`` of a 100,000-message conversation, three times (new ids) in a
  fresh process: microseconds per message copied (median), and the growth of the
  process's peak RSS during the first fork (the copy runs in the database; on SQLite
  the database engine is in the process, its page cache included).

Corpora are written fast, around the store: after ``migrate.upgrade``, bulk
``executemany`` inserts through SQLAlchemy Core into memstore's tables (the
triggers fill the metadata index and the search index as for any write). The text
is `benchmarks.workload`'s fixed-seed agent conversations (system prompt, user and
assistant turns, tool calls and results), so every run writes the same data. SQLite
databases are files under ``benchmarks/results/raw/``; PostgreSQL ones are created as
``memstore_bench_lc_*`` on the server of ``--pg-url`` and dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shlex
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RAW = HERE / "results" / "raw"
SEED = 20_261_128
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

LIST_CONVERSATIONS = 100_000
LIST_USERS = 10_000
PRUNE_PER_CONVERSATION = 100
PRUNE_SIZES = {"quick": (10_000, 100_000), "full": (100_000, 1_000_000)}
LIST_PAIRS = {"quick": 400, "full": 2_000}
FORGET_CONVERSATIONS, FORGET_MESSAGES = 100, 1_000
FORGET_OTHER_MESSAGES = 100
#: Other users' conversations beside the subject's (of FORGET_OTHER_MESSAGES each): in
#: quick mode the subject holds most of the store; with --full, a tenth of a store of
#: 1,000,000 messages (on SQLite the index merge a forget ends with covers the whole
#: index, so it grows with the store, not only with the subject).
FORGET_OTHERS = {"quick": 200, "full": 9_000}
#: The erasure phase: conversations of 100 messages, and the shares of them forgotten.
ERASURE_CONVERSATIONS = {"quick": 1_000, "full": 3_000}
ERASURE_SHARES = (0.25, 0.33, 0.4, 0.5)
FORK_MESSAGES = 100_000
FORK_REPEATS = 3
BATCH = 10_000
COUNTER = "fixed"  # the name the rows' token counts are stored under (FixedCounter's)
PHASES = ("list", "prune", "forget", "fork", "erasure")


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---- corpus ---------------------------------------------------------------------------------


class Texts:
    """A pool of row templates cut from `benchmarks.workload`'s fixed-seed conversations.

    Each template is a turn (a user message and an answer, or a tool exchange: the
    call, its results, the answer) as memstore stores it; a conversation is the system
    prompt and turns drawn from the pool, tool-call ids renamed per conversation.
    """

    def __init__(self, seed: int = SEED, turns: int = 800) -> None:
        from benchmarks.workload import _Gen

        gen = _Gen(seed, 0, 10**9)
        self.system = self._row(gen.system())
        self.turns = [[self._row(m) for m in gen.turn(1_000)] for _ in range(turns)]
        self.plain = [t for t in self.turns
                      if len(t) == 2 and not t[0]["tool_calls"] and not t[1]["tool_calls"]]

    @staticmethod
    def _row(m: dict[str, Any]) -> dict[str, Any]:
        text = m.get("content")
        calls = [{"id": c["id"], "name": c["function"]["name"],
                  "arguments": c["function"]["arguments"]} for c in m.get("tool_calls") or ()]
        tokens = 4 + len(text or "") // 4 + sum(6 + len(c["arguments"]) // 4 for c in calls)
        return {"role": m["role"], "content_text": text, "tool_calls": calls or None,
                "tool_call_id": m.get("tool_call_id"), "anchored": m["role"] == "system",
                "token_count": tokens}

    def conversation(self, cid: str, n: int, rng: random.Random, start: datetime,
                     end: datetime) -> Iterator[dict[str, Any]]:
        """The ``n`` message rows of conversation ``cid``, created evenly from start to end."""
        step = (end - start) / max(1, n - 1)
        seq = 0

        def emit(template: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
            nonlocal seq
            seq += 1
            calls = template["tool_calls"]
            if calls is not None:
                calls = [{**c, "id": renamed.setdefault(c["id"], f"call_{seq}_{i}")}
                         for i, c in enumerate(calls)]
            reply_to = template["tool_call_id"]
            return {
                "conversation_id": cid, "seq": seq, "message_id": f"m{seq}",
                "role": template["role"], "content_text": template["content_text"],
                "content_parts": None, "name": None, "tool_calls": calls,
                "tool_call_id": renamed.get(reply_to, reply_to) if reply_to else None,
                "score": 1.0, "pinned": False, "anchored": template["anchored"],
                "token_count": template["token_count"], "token_counter": COUNTER,
                "created_at": start + step * (seq - 1), "metadata": None,
            }

        if n <= 0:
            return
        yield emit(self.system, {})
        while seq < n:
            left = n - seq
            turn = self.turns[rng.randrange(len(self.turns))]
            if len(turn) > left:
                turn = self.plain[rng.randrange(len(self.plain))][:left]
            renamed: dict[str, str] = {}
            for template in turn:
                yield emit(template, renamed)


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class Database:
    """A fresh, migrated database for one corpus: a SQLite file or a PostgreSQL database."""

    def __init__(self, kind: str, name: str, pg_url: str, keep: bool) -> None:
        from sqlalchemy.engine import make_url

        self.kind = kind
        self.keep = keep
        if kind == "sqlite":
            RAW.mkdir(parents=True, exist_ok=True)
            self.path: Path | None = RAW / f"lifecycle-{name}.db"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self.url = f"sqlite:///{self.path}"
        else:
            self.path = None
            self.admin = make_url(pg_url).set(drivername="postgresql+psycopg")
            self.name = f"memstore_bench_lc_{name}_{uuid.uuid4().hex[:6]}"
            self._admin_sql(f'CREATE DATABASE "{self.name}"')
            self.url = self.admin.set(database=self.name).render_as_string(hide_password=False)
        from memstore import migrate

        migrate.upgrade(self.url)

    def _admin_sql(self, statement: str) -> None:
        from sqlalchemy import create_engine, text

        engine = create_engine(self.admin, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(statement))
        finally:
            engine.dispose()

    def engine(self) -> Any:
        """A plain SQLAlchemy engine for loading (SQLite: ``synchronous=OFF`` while loading)."""
        from sqlalchemy import create_engine, event

        engine = create_engine(self.url)
        if self.kind == "sqlite":
            @event.listens_for(engine, "connect")
            def _fast(dbapi: Any, _record: Any) -> None:
                dbapi.execute("PRAGMA synchronous=OFF")
                dbapi.execute("PRAGMA foreign_keys=ON")
        return engine

    def finish_load(self) -> None:
        """What a deployed database has had time to do: PostgreSQL's statistics."""
        if self.kind == "postgresql":
            from sqlalchemy import create_engine, text

            engine = create_engine(self.url, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text("VACUUM ANALYZE"))
            engine.dispose()

    def drop(self) -> None:
        if self.keep:
            _log(f"  kept {self.url}")
            return
        if self.kind == "sqlite":
            assert self.path is not None
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        else:
            self._admin_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def load(db: Database, conversations: list[tuple[str, int, dict[str, Any], datetime, datetime]],
         texts: Texts | None, rng: random.Random) -> int:
    """Insert conversations ``(id, messages, metadata, first created, last created)``.

    Returns the number of message rows written. Conversations go in before their
    messages (foreign key), in batches of `BATCH` rows, one transaction per batch.
    """
    from sqlalchemy import insert

    from memstore._db.schema import conversations as conv_table
    from memstore._db.schema import messages as msg_table

    engine = db.engine()
    written = 0
    pending: list[dict[str, Any]] = []
    heads: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal pending, heads
        with engine.begin() as conn:
            if heads:
                conn.execute(insert(conv_table), heads)
            if pending:
                conn.execute(insert(msg_table), pending)
        pending, heads = [], []

    try:
        for cid, n, metadata, start, end in conversations:
            rows = list(texts.conversation(cid, n, rng, start, end)) if texts and n else []
            heads.append({
                "id": cid, "created_at": start, "updated_at": end, "metadata": metadata,
                "first_seq": 1, "last_seq": len(rows),
                "token_count": sum(r["token_count"] for r in rows), "max_score": 1.0,
                "epoch": rng.getrandbits(62) + 1, "expires_at": None, "parent_id": None,
                "forked_at_seq": None})
            pending.extend(rows)
            written += len(rows)
            if len(pending) >= BATCH or len(heads) >= BATCH:
                flush()
        flush()
    finally:
        engine.dispose()
    db.finish_load()
    return written


# ---- measurements in this process -----------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


FLOOR_SQL = (
    "SELECT id, created_at, updated_at, metadata, first_seq, last_seq, token_count, "
    "expires_at, parent_id, forked_at_seq FROM memstore_conversations "
    "WHERE id IN (SELECT conversation_id FROM memstore_conversation_keys "
    "WHERE key = {p} AND kind = 'text' AND value = {p}) ORDER BY id LIMIT 100")


def _floor(db: Database) -> tuple[Callable[[str], list[tuple[Any, ...]]], Callable[[], None]]:
    """The raw floor: the driver's own connection, the hand-written query, tuples back."""
    if db.kind == "sqlite":
        assert db.path is not None
        conn = _driver(db.url).get("module", sqlite3).connect(db.path)
        sql = FLOOR_SQL.format(p="?")
        return (lambda user: conn.execute(sql, ("user_id", user)).fetchall()), conn.close
    import psycopg

    from memstore._db.engine import sync_url

    url = sync_url(db.url)
    pg = psycopg.connect(host=url.host, port=url.port, user=url.username,
                         password=url.password, dbname=url.database, autocommit=True)
    sql = FLOOR_SQL.format(p="%s")

    def query(user: str) -> list[tuple[Any, ...]]:
        with pg.cursor() as cur:
            cur.execute(sql, ("user_id", user))
            return cur.fetchall()

    return query, pg.close


def bench_list(db: Database, pairs: int) -> dict[str, Any]:
    """``list_conversations(where=...)`` vs the floor, alternately, over 100,000 conversations."""
    from memstore import MemoryStore
    from memstore._db.rows import conversations_from_raw
    from memstore.tokens import FixedCounter

    rng = random.Random(SEED)
    now = datetime.now(timezone.utc)
    users = [f"user-{i:05d}" for i in range(LIST_USERS)]
    plans = ("free", "pro", "team")
    rows = []
    for i in range(LIST_CONVERSATIONS):
        created = now - timedelta(days=rng.uniform(1, 365))
        rows.append((_uuid(rng), 0, {"user_id": users[i % LIST_USERS],
                                     "tenant": f"tenant-{i % 50:02d}",
                                     "plan": plans[i % 3]},
                     created, created + timedelta(hours=rng.uniform(0, 24))))
    started = time.perf_counter()
    load(db, rows, None, rng)
    _log(f"  {LIST_CONVERSATIONS:,} conversations written in {time.perf_counter() - started:.1f} s")
    store = MemoryStore(db.url, counter=FixedCounter(), **_driver(db.url))
    floor, close = _floor(db)
    dialect = "sqlite" if db.kind == "sqlite" else "postgresql"

    def floor_models(user: str) -> list[Any]:
        return conversations_from_raw(floor(user), dialect)

    sides: list[Callable[[str], Any]] = [
        lambda user: store.list_conversations(where={"user_id": user}), floor, floor_models]
    try:
        sample = [rng.choice(users) for _ in range(pairs + 50)]
        for user in sample[:50]:  # warm-up, and the three agree
            ours = store.list_conversations(where={"user_id": user})
            assert [c.id for c in ours] == [r[0] for r in floor(user)], user
            assert floor_models(user) == ours and len(ours) == LIST_CONVERSATIONS // LIST_USERS
        times: list[list[float]] = [[], [], []]
        clock = time.perf_counter_ns
        for user in sample[50:]:
            for side in rng.sample(range(3), 3):  # a new order every call
                t0 = clock()
                sides[side](user)
                times[side].append((clock() - t0) / 1e6)
    finally:
        close()
        store.close()
    mine, raw, models = times
    p50, floor_p50 = _percentile(mine, 0.5), _percentile(raw, 0.5)
    models_p50 = _percentile(models, 0.5)
    return {"conversations": LIST_CONVERSATIONS, "per_user": LIST_CONVERSATIONS // LIST_USERS,
            "pairs": pairs, "memstore_p50_ms": p50, "memstore_p95_ms": _percentile(mine, 0.95),
            "floor_p50_ms": floor_p50, "floor_p95_ms": _percentile(raw, 0.95),
            "ratio_p50": p50 / floor_p50, "floor_models_p50_ms": models_p50,
            "ratio_models_p50": p50 / models_p50}


def _worker(kind: str, url: str, extra: list[str] | None = None) -> dict[str, Any]:
    """Run ``--worker kind`` in a fresh process; its JSON result."""
    cmd = [sys.executable, "-m", "benchmarks.lifecycle", "--worker", kind, "--url", url,
           *(extra or [])]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=7_200)
    if done.returncode != 0:
        raise RuntimeError(f"worker {kind} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_prune(kind: str, pg_url: str, size: int, keep: bool) -> dict[str, Any]:
    """Prune ``size`` messages in ``size / 100`` conversations, in a fresh process."""
    rng = random.Random(SEED + size)
    db = Database(kind, f"prune_{size}", pg_url, keep)
    try:
        now = datetime.now(timezone.utc)
        n = size // PRUNE_PER_CONVERSATION
        rows = [(_uuid(rng), PRUNE_PER_CONVERSATION, {"user_id": f"user-{i % 1000:04d}"},
                 now - timedelta(days=180), now - timedelta(days=1)) for i in range(n)]
        started = time.perf_counter()
        written = load(db, rows, Texts(), rng)
        _log(f"  {written:,} messages in {n:,} conversations written in "
             f"{time.perf_counter() - started:.1f} s")
        result = _worker("prune", db.url)
    finally:
        db.drop()
    report = result["report"]
    result.update(messages=size, conversations=n,
                  messages_per_s=size / result["seconds"],
                  deleted_per_s=report["messages_deleted"] / result["seconds"])
    return result


def bench_forget(kind: str, pg_url: str, keep: bool, others: int) -> dict[str, Any]:
    """Forget a subject of 100 conversations x 1,000 messages, in a fresh process."""
    rng = random.Random(SEED + 1)
    db = Database(kind, "forget", pg_url, keep)
    try:
        now = datetime.now(timezone.utc)
        rows = [(_uuid(rng), FORGET_MESSAGES, {"user_id": "subject"},
                 now - timedelta(days=30), now) for _ in range(FORGET_CONVERSATIONS)]
        rows += [(_uuid(rng), FORGET_OTHER_MESSAGES, {"user_id": f"user-{i:04d}"},
                  now - timedelta(days=30), now) for i in range(others)]
        rng.shuffle(rows)
        started = time.perf_counter()
        written = load(db, rows, Texts(), rng)
        _log(f"  {written:,} messages written in {time.perf_counter() - started:.1f} s")
        result = _worker("forget", db.url)
    finally:
        db.drop()
    assert result["report"]["conversations"] == FORGET_CONVERSATIONS, result
    assert result["report"]["messages"] == FORGET_CONVERSATIONS * FORGET_MESSAGES, result
    assert result["small_report"]["messages"] == FORGET_OTHER_MESSAGES, result
    return result


def bench_fork(kind: str, pg_url: str, keep: bool) -> dict[str, Any]:
    """Fork a 100,000-message conversation (three times), in a fresh process."""
    rng = random.Random(SEED + 2)
    db = Database(kind, "fork", pg_url, keep)
    try:
        now = datetime.now(timezone.utc)
        started = time.perf_counter()
        load(db, [("source", FORK_MESSAGES, {"user_id": "u1"}, now - timedelta(days=30), now)],
             Texts(), rng)
        _log(f"  {FORK_MESSAGES:,} messages written in {time.perf_counter() - started:.1f} s")
        result = _worker("fork", db.url)
    finally:
        db.drop()
    return result


def bench_erasure(mode: str, keep: bool) -> list[dict[str, Any]]:
    """SQLite: forget's two ways out of the index (merge, rebuild) at several shares.

    One store of conversations of 100 messages; each forget runs in a fresh process on
    a fresh copy of its file, the way forced (``memstore._db.erasure.REBUILD_SHARE``),
    so both ways are timed on the same data at each share of the index deleted.
    """
    import shutil

    rng = random.Random(SEED + 3)
    db = Database("sqlite", "erasure", "", keep)
    assert db.path is not None
    copy = db.path.with_name("lifecycle-erasure-run.db")
    out = []
    try:
        now = datetime.now(timezone.utc)
        ids = [f"c{i:05d}" for i in range(ERASURE_CONVERSATIONS[mode])]
        started = time.perf_counter()
        written = load(db, [(cid, 100, {"user_id": cid}, now - timedelta(days=30), now)
                            for cid in ids], Texts(), rng)
        _log(f"  {written:,} messages written in {time.perf_counter() - started:.1f} s")
        for share in ERASURE_SHARES:
            for way in ("merge", "rebuild"):
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{copy}{suffix}").unlink(missing_ok=True)
                    if Path(f"{db.path}{suffix}").exists():
                        shutil.copy(f"{db.path}{suffix}", f"{copy}{suffix}")
                result = _worker("erasure", f"sqlite:///{copy}",
                                 ["--way", way, "--share", str(share)])
                assert result["way"] == way, result
                out.append(result)
                _log(f"  {share:.2f} {way}: {result['seconds']:.2f} s")
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)
        db.drop()
    return out


# ---- workers (a fresh process each) ---------------------------------------------------------


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    """The process's peak RSS: ``VmHWM``, else ``getrusage``'s ``ru_maxrss``.

    ``ru_maxrss`` of a process started by ``subprocess`` keeps the high-water mark of
    the parent it was forked from (Linux carries it across ``exec``): a worker started
    by a parent holding a 200 MiB corpus would report 200 MiB whatever it did.
    ``VmHWM`` belongs to the process's own memory map, created at ``exec``.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


#: The environment variable naming the DBAPI module the SQLite workers use (set by
#: ``--sqlite-module``; default the standard library's sqlite3).
SQLITE_MODULE = "MEMSTORE_BENCH_SQLITE_MODULE"


def _driver(url: str) -> dict[str, Any]:
    """The store's ``module=`` for a SQLite worker given ``--sqlite-module``, else nothing."""
    name = os.environ.get(SQLITE_MODULE)
    if not name or not url.startswith("sqlite"):
        return {}
    import importlib

    return {"module": importlib.import_module(name)}


def _sqlite_version() -> str:
    """The SQLite the workers run: ``--sqlite-module``'s, else the standard library's."""
    module = _driver("sqlite://").get("module")
    if module is None:
        return sqlite3.sqlite_version
    return f"{module.sqlite_version} (through {module.__name__})"


def run_worker(kind: str, url: str, way: str = "merge", share: float = 0.0) -> dict[str, Any]:
    """One measurement in this (fresh) process (``way`` and ``share``: the erasure's)."""
    from memstore import MemoryStore
    from memstore.tokens import FixedCounter

    store = MemoryStore(url, counter=FixedCounter(), **_driver(url))
    store.count_conversations()  # connected, statements compiled
    opened = _rss_mib()
    try:
        if kind == "prune":
            t0 = time.perf_counter()
            report = store.prune(older_than=timedelta(days=90), keep_last=20)
            seconds = time.perf_counter() - t0
            return {"seconds": seconds, "report": report.model_dump(), "rss_open_mib": opened,
                    "peak_rss_mib": _peak_mib()}
        if kind == "forget":
            t0 = time.perf_counter()
            done = store.forget(where={"user_id": "subject"}, reason="benchmark")
            seconds = time.perf_counter() - t0
            t0 = time.perf_counter()  # then one other user's few messages
            small = store.forget(where={"user_id": "user-0000"}, reason="benchmark")
            small_seconds = time.perf_counter() - t0
            return {"seconds": seconds, "report": done.model_dump(), "rss_open_mib": opened,
                    "peak_rss_mib": _peak_mib(), "small_seconds": small_seconds,
                    "small_report": small.model_dump()}
        if kind == "fork":
            from benchmarks.measure import MemoryPhase

            times = []
            with MemoryPhase() as phase:
                t0 = time.perf_counter()
                made = store.fork("source", "fork-1")
                times.append(time.perf_counter() - t0)
            for i in range(2, FORK_REPEATS + 1):
                t0 = time.perf_counter()
                store.fork("source", f"fork-{i}")
                times.append(time.perf_counter() - t0)
            return {"messages": made.message_count, "seconds": times,
                    "us_per_message": statistics.median(times) / made.message_count * 1e6,
                    "rss_delta_mib": phase.peak_mib, "rss_open_mib": opened,
                    "peak_rss_mib": _peak_mib()}
        if kind == "erasure":
            from memstore._db import erasure

            # The way forced: a rebuild above a share of 0, a merge below a share of 2.
            erasure.REBUILD_SHARE = 0.0 if way == "rebuild" else 2.0
            erasure.IN_PLACE_FACTOR = 10**12  # never in place
            chosen: list[str] = []
            begin = erasure.begin

            def record(*args: Any) -> Any:
                found = begin(*args)
                chosen.append(found.way)
                return found

            erasure.begin = record  # type: ignore[assignment]
            ids = [c.id for c in store.list_conversations(limit=10_000)]
            targets = ids[:round(len(ids) * share)]
            t0 = time.perf_counter()
            done = store.forget(conversation_ids=targets)
            return {"share": share, "way": chosen[0], "messages": done.messages,
                    "indexed": len(ids) * 100,
                    "seconds": time.perf_counter() - t0}
        raise SystemExit(f"unknown worker {kind!r}")
    finally:
        store.close()


# ---- report ---------------------------------------------------------------------------------


def machine(pg_url: str, dbs: list[str]) -> dict[str, Any]:
    from benchmarks.runner import cpu_name

    cpu = cpu_name()
    pg = None
    if "postgresql" in dbs:
        from sqlalchemy import create_engine, text

        engine = create_engine(pg_url)
        with engine.connect() as conn:
            pg = str(conn.execute(text("SHOW server_version")).scalar())
        engine.dispose()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "sqlite": _sqlite_version(), "postgresql": pg, "load_1min": load1,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}


NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def markdown(results: dict[str, Any]) -> str:
    """The "Benchmarks" section of docs/lifecycle.md."""
    dbs = [d for d in ("sqlite", "postgresql") if d in results["databases"]]
    m = results["machine"]
    lines = [
        "## Benchmarks", "",
        f"Measured with `{results['command']}` ({results['mode']} mode) on {m['cpu']} "
        f"({m['cores']} cores, load average {m['load_1min']:.1f} while it ran: other jobs "
        f"shared the machine), Python {m['python']}, SQLite {m['sqlite']}"
        + (f", PostgreSQL {m['postgresql']}" if m["postgresql"] else "")
        + f", {m['date']}. Corpora are fixed-seed agent conversations bulk-loaded into "
        "memstore's tables; each prune, forget and fork runs in a fresh process. "
        "`benchmarks/lifecycle.py` describes every measurement.", "",
        "| | " + " | ".join(NAMES[d] for d in dbs) + " |",
        "|---|" + "---:|" * len(dbs),
    ]

    def row(label: str, cell: Callable[[dict[str, Any]], str]) -> None:
        cells = []
        for d in dbs:
            try:
                cells.append(cell(results["databases"][d]))
            except (KeyError, TypeError, IndexError):
                cells.append("not run")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("`list_conversations(where={\"user_id\": u})`, 100,000 conversations, 10 per user: p50",
        lambda r: f"{r['list']['memstore_p50_ms']:.2f} ms")
    row("raw-SQL floor on the same index (tuples): p50",
        lambda r: f"{r['list']['floor_p50_ms']:.2f} ms")
    row("ratio (timed alternately in one process)", lambda r: f"{r['list']['ratio_p50']:.2f}×")
    row("the floor, its rows then built into `Conversation`s by memstore's decoder: p50 "
        "(memstore's ratio to it)",
        lambda r: f"{r['list']['floor_models_p50_ms']:.2f} ms "
                  f"({r['list']['ratio_models_p50']:.2f}×)")
    sizes = sorted({s["messages"] for d in dbs
                    for s in results["databases"][d].get("prune", [])})
    for size in sizes:
        def prune_cell(r: dict[str, Any], size: int = size) -> str:
            s = next(x for x in r["prune"] if x["messages"] == size)
            return (f"{s['messages_per_s']:,.0f} msg/s ({s['deleted_per_s']:,.0f} deleted/s; "
                    f"{s['seconds']:.1f} s)")

        row(f"`prune(older_than=90d, keep_last=20)`, {size:,} messages in "
            f"{size // PRUNE_PER_CONVERSATION:,} conversations", prune_cell)
    if sizes:
        def peaks(r: dict[str, Any]) -> str:
            by = {x["messages"]: x["peak_rss_mib"] for x in r["prune"]}
            return " / ".join(f"{by[s]:.0f} MiB" for s in sizes)

        row("prune: peak RSS of the process at " + " / ".join(f"{s:,}" for s in sizes)
            + " messages", peaks)
    others = FORGET_OTHERS[results["mode"]] * FORGET_OTHER_MESSAGES
    row("`forget(where={\"user_id\": subject})`: 100 conversations × 1,000 messages, beside "
        f"{others:,} other messages", lambda r: f"{r['forget']['seconds']:.2f} s")
    row(f"then `forget` of one other user's {FORGET_OTHER_MESSAGES} messages",
        lambda r: f"{r['forget']['small_seconds']:.2f} s")
    row("`fork` of a 100,000-message conversation",
        lambda r: f"{r['fork']['us_per_message']:.2f} µs/message "
                  f"({statistics.median(r['fork']['seconds']):.2f} s)")
    row("fork: growth of the process's peak RSS",
        lambda r: f"{r['fork']['rss_delta_mib']:.1f} MiB")
    lines += ["", "Read them as orders of magnitude on a shared machine, not as targets: "
              "SQLite runs with the store's default `durability=\"full\"` (one fsync per "
              "pruned conversation), and PostgreSQL is the local server with its default "
              "settings. The JSON of the run holds p95s and every timing."]
    runs = results["databases"].get("sqlite", {}).get("erasure")
    if runs:
        n = runs[0]["indexed"]
        lines += ["", f"SQLite, `forget` of a share of {n:,} indexed messages (conversations "
                  "of 100), each way forced on a fresh copy:", "",
                  "| share forgotten | merge | rebuild |", "|---:|---:|---:|"]
        for share in sorted({r["share"] for r in runs}):
            cells = {r["way"]: f"{r['seconds']:.2f} s" for r in runs if r["share"] == share}
            lines.append(f"| {share:.2f} | {cells.get('merge', '-')} | "
                         f"{cells.get('rebuild', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lifecycle",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgres",
                        help="databases, comma-separated: sqlite, postgres (default: both)")
    parser.add_argument("--full", action="store_true",
                        help="prune 100,000 and 1,000,000 messages (default: 10,000 and 100,000)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {', '.join(PHASES)}")
    parser.add_argument("--pg-url", default=PG_URL,
                        help="a PostgreSQL server and a database to create the others from")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default: results/raw/lifecycle-{quick,full}.json)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the markdown section to this file")
    parser.add_argument("--keep-dbs", action="store_true", help="keep the databases")
    parser.add_argument("--sqlite-module", default=None,
                        help="the DBAPI module SQLite's prune, forget and fork run on, e.g. "
                        "pysqlite3.dbapi2 for a newer SQLite (default: sqlite3)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--way", default="merge", help=argparse.SUPPRESS)
    parser.add_argument("--share", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.url, args.way, args.share)))
        return 0
    if args.sqlite_module:
        os.environ[SQLITE_MODULE] = args.sqlite_module  # the workers inherit it
    mode = "full" if args.full else "quick"
    aliases = {"sqlite": "sqlite", "postgres": "postgresql", "postgresql": "postgresql"}
    dbs = [aliases[d.strip()] for d in args.db.split(",") if d.strip()]
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    given = list(sys.argv[1:] if argv is None else argv)
    for option in ("--json", "--markdown"):  # where the results go: not what was measured
        while option in given and given.index(option) + 1 < len(given):
            at = given.index(option)
            del given[at:at + 2]
    given = [a for a in given if not a.startswith(("--json=", "--markdown="))]
    command = "python -m benchmarks.lifecycle " + shlex.join(given)
    results: dict[str, Any] = {"command": command.strip(), "mode": mode,
                               "machine": machine(args.pg_url, dbs), "databases": {}}
    out = args.json or RAW / f"lifecycle-{mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for kind in dbs:
        found: dict[str, Any] = results["databases"].setdefault(kind, {})
        if "list" in phases:
            _log(f"{kind}: list")
            db = Database(kind, "list", args.pg_url, args.keep_dbs)
            try:
                found["list"] = bench_list(db, LIST_PAIRS[mode])
            finally:
                db.drop()
            _log(f"  {found['list']}")
        if "prune" in phases:
            found["prune"] = []
            for size in PRUNE_SIZES[mode]:
                _log(f"{kind}: prune {size:,}")
                found["prune"].append(bench_prune(kind, args.pg_url, size, args.keep_dbs))
                _log(f"  {found['prune'][-1]}")
        if "forget" in phases:
            _log(f"{kind}: forget")
            found["forget"] = bench_forget(kind, args.pg_url, args.keep_dbs,
                                           FORGET_OTHERS[mode])
            _log(f"  {found['forget']}")
        if "fork" in phases:
            _log(f"{kind}: fork")
            found["fork"] = bench_fork(kind, args.pg_url, args.keep_dbs)
            _log(f"  {found['fork']}")
        if "erasure" in phases and kind == "sqlite":
            _log("sqlite: erasure")
            found["erasure"] = bench_erasure(mode, args.keep_dbs)
        out.write_text(json.dumps(results, indent=2, default=str))
    results["machine"]["load_1min"] = max(results["machine"]["load_1min"] or 0.0,
                                          os.getloadavg()[0])
    out.write_text(json.dumps(results, indent=2, default=str))
    section = markdown(results)
    if args.markdown:
        args.markdown.write_text(section)
    print(section)
    _log(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

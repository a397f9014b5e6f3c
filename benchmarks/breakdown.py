"""Where a cold window and an append spend their time, by layer: ``python -m benchmarks.breakdown``.

The deployment phases (``--phases tenants,append``) report memstore against the raw-SQL
floor. This splits memstore's side into layers, each **timed alternately with the others
and with the floor in one process**, so the layers can be compared with each other:

windows (``cache_size=0``, a random one of ``--conversations`` × 300 messages, 4k budget)
    ``floor``: the floor's whole window. ``sql``: memstore's own statements for that
    window (recorded from a real window, replayed on a bare driver connection, rows
    fetched, nothing decoded). ``sql+decode``: the same, and the rows that window
    decoded (those its view took) turned into ``StoredMessage`` objects. ``window``:
    ``store.window``. The differences are the decoding and everything above it (views,
    units, report, connection pool, validation).
appends (one message to a random one of 50 conversations)
    ``floor``: the floor's insert, tokenizing included. ``sql``: memstore's own
    statements for one append on a bare driver connection, with parameters built
    beforehand (PostgreSQL: one statement in autocommit; SQLite: ``BEGIN IMMEDIATE``,
    allocation, insert, ``COMMIT``). ``append``: ``store.append``, tokenizing included.
extends (100 messages to a random one of 50 conversations)
    ``floor``: the floor's ``executemany`` in one transaction, tokenizing included.
    ``count``: memstore validating and counting the batch on one thread (no database).
    ``one thread``: ``store.extend`` with ``TiktokenCounter(threads=1)``. ``extend``:
    ``store.extend`` with the default counter, which counts a large batch on up to
    four threads (two on a 2-core machine).

Example::

    python -m benchmarks.breakdown --db sqlite,postgres --conversations 400
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.deploy import (
    APPEND_CONVERSATIONS,
    BUDGET,
    DURABILITY,
    _floor,
    _FloorExtend,
    _messages,
    append_fixture,
    tenant_id,
)
from benchmarks.systems.base import Context, DbTarget, WindowSpec
from benchmarks.tokens import counters, prime_tiktoken_cache
from benchmarks.worker import create_db, drop_db, settle_and_measure

HERE = Path(__file__).resolve().parent


def _alternate(cases: dict[str, Callable[[str], Any]], keys: list[str]) -> dict[str, float]:
    """Median ms of each case over ``keys``, the cases' order rotated every round."""
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r, key in enumerate(keys):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            cases[n](key)
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(xs) * 1000 for n, xs in times.items()}


def _raw_connection(db: DbTarget) -> Any:
    if db.kind == "sqlite":
        return sqlite3.connect(str(db.sqlite_path), isolation_level=None)
    import psycopg

    return psycopg.connect(db.libpq_dsn, autocommit=True)


def _recorded_statements(
    store: Any, cid: str, view: Any
) -> tuple[list[tuple[str, dict[str, Any]]], set[int]]:
    """The hot statements (name, values) one window of ``cid`` runs, and the seqs of the
    rows it decoded (a page's rows past the last one the view takes are never decoded)."""
    from memstore._db import window as _window

    seen: list[tuple[str, dict[str, Any]]] = []
    decoded: set[int] = set()
    real = _window.SQLHistory._execute
    real_decode = _window.decode_raw

    def record(self: Any, name: str, values: dict[str, Any]) -> Any:
        seen.append((name, dict(values)))
        return real(self, name, values)

    def record_decode(row: Any, dialect: str, cid: str) -> Any:
        decoded.add(int(row[0]))
        return real_decode(row, dialect, cid)

    _window.SQLHistory._execute = record  # type: ignore[method-assign]
    _window.decode_raw = record_decode  # type: ignore[assignment]
    try:
        store.window(cid, view)
    finally:
        _window.SQLHistory._execute = real  # type: ignore[method-assign]
        _window.decode_raw = real_decode  # type: ignore[assignment]
    return seen, decoded


#: Where the message columns start in each hot statement's rows (see memstore._db.window).
_MESSAGE_OFFSET = {"conversation": 5, "conversation_page": 7, "range": 0, "range_checked": 0,
                   "latest_summary": None}


def windows(db: DbTarget, ctx: Context, n: int, rounds: int, seed: int) -> dict[str, float]:
    """The window layers' medians (ms)."""
    from memstore import MemoryStore, Message, TokenLimitedView
    from memstore._db import statements as q
    from memstore._db.rows import decode_raw

    counter = ctx.reference.counter  # type: ignore[attr-defined]
    loader = MemoryStore(db.url(), counter=counter, migrate="upgrade", durability=DURABILITY)
    floor = _floor(db, ctx)
    for i in range(n):
        msgs = _messages(seed, 10_000 + i, 300)
        loader.extend(tenant_id(i), [Message.from_openai(m) for m in msgs])
        floor.import_chunk(tenant_id(i), msgs, main=False)
    loader.close()
    settle_and_measure(db)
    store = MemoryStore(db.url(), counter=counter, migrate="check", cache_size=0,
                        durability=DURABILITY)
    view = TokenLimitedView(BUDGET)
    pf = floor.prepare("", WindowSpec("token_limited", BUDGET))
    dialect = store.engine.dialect
    kind = "sqlite" if db.kind == "sqlite" else "postgresql"
    raw = _raw_connection(db)
    plans = {}
    taken: dict[str, set[int]] = {}
    for i in range(n):
        cid = tenant_id(i)
        statements, taken[cid] = _recorded_statements(store, cid, view)
        plans[cid] = [(name, q.hot(dialect, name), q.hot(dialect, name).params(values))
                      for name, values in statements]

    def replay(cid: str, decode: bool) -> None:
        wanted = taken[cid]
        for name, compiled, params in plans[cid]:
            rows = raw.execute(compiled.sql, params).fetchall()
            offset = _MESSAGE_OFFSET[name]
            if decode and offset is not None:
                for r in rows:
                    if r[offset] is not None and r[offset] in wanted:
                        decode_raw(r[offset:], kind, cid)

    rng = random.Random(seed)
    keys = [tenant_id(rng.randrange(n)) for _ in range(rounds)]
    cases: dict[str, Callable[[str], Any]] = {
        "floor": lambda c: floor.fetch(c, pf),
        "sql": lambda c: replay(c, False),
        "sql+decode": lambda c: replay(c, True),
        "window": lambda c: store.window(c, view),
    }
    _alternate(cases, keys[: rounds // 5])  # warm the page cache and the prepared statements
    out = _alternate(cases, keys)
    store.close()
    floor.close()
    raw.close()
    return out


def appends(db: DbTarget, ctx: Context, rounds: int, seed: int,
            fixture: tuple[Any, Any]) -> dict[str, float]:
    """The append layers' medians (ms), on ``append_fixture``'s store and floor."""
    from benchmarks.workload import _Gen
    from memstore import Message
    from memstore._db import ops as _ops
    from memstore._db import statements as q
    from memstore._db.rows import Prepared, message_row, new_message_id, utcnow

    counter = ctx.reference.counter  # type: ignore[attr-defined]
    store, floor = fixture
    dialect = store.engine.dialect
    raw = _raw_connection(db)
    if db.kind == "sqlite":
        raw.execute("PRAGMA synchronous=NORMAL")  # the store's durability="normal"
    gen = _Gen(seed + 7, 999, 3 * rounds)
    msgs = [gen.user() if i % 2 == 0 else gen.assistant() for i in range(3 * rounds)]
    rng = random.Random(seed + 1)
    keys = [str(i) for i in range(rounds)]
    cids = [f"app-{rng.randrange(APPEND_CONVERSATIONS)}" for _ in range(rounds)]
    prepared = [Prepared(Message.from_openai(m), counter.count_message(Message.from_openai(m)))
                for m in msgs[rounds:2 * rounds]]

    def sql(k: str) -> None:
        i = int(k)
        cid, p, now = cids[i], prepared[i], utcnow()
        row = message_row(cid, 0, p, new_message_id(), counter.name, now)
        alloc = _ops._allocation(cid, now, [p])
        if db.kind != "sqlite":
            one = q.hot_write(dialect, "append_one")
            raw.execute(one.sql, one.params({**alloc, **row})).fetchall()
            return
        allocate, insert = q.hot_write(dialect, "allocate"), q.hot_write(dialect, "insert")
        raw.execute("BEGIN IMMEDIATE")
        row["seq"] = raw.execute(allocate.sql, allocate.params(alloc)).fetchall()[0][0]
        raw.execute(insert.sql, insert.row_params(row, {}))
        raw.execute("COMMIT")

    cases: dict[str, Callable[[str], Any]] = {
        "floor": lambda k: floor.append(cids[int(k)], msgs[int(k)]),
        "sql": sql,
        "append": lambda k: store.append(cids[int(k)], msgs[2 * rounds + int(k)]),
    }
    out = _alternate(cases, keys)
    raw.close()
    return out


def extends(db: DbTarget, rounds: int, seed: int, fixture: tuple[Any, Any]) -> dict[str, float]:
    """The ``extend`` layers' medians (ms), on ``append_fixture``'s store and floor."""
    from memstore import MemoryStore, TiktokenCounter
    from memstore._base import prepare

    store, floor = fixture
    counter = store.counter
    if not isinstance(counter, TiktokenCounter):
        raise SystemExit("the extend layers compare TiktokenCounter's threads; "
                         f"this run counts with {counter.name}")
    single = TiktokenCounter(counter.encoding_name, threads=1)
    one = MemoryStore(db.url(), counter=single, migrate="check", durability=DURABILITY)
    fx = _FloorExtend(floor)
    batches = [_messages(seed, 40_000 + k, 100) for k in range(50)]
    rng = random.Random(seed + 2)
    picks = {str(k): (f"app-{rng.randrange(APPEND_CONVERSATIONS)}", batches[k % 50])
             for k in range(rounds)}
    cases: dict[str, Callable[[str], Any]] = {
        "floor": lambda k: fx(*picks[k]),
        "count": lambda k: prepare(single, picks[k][1]),
        "one thread": lambda k: one.extend(*picks[k]),
        "extend": lambda k: store.extend(*picks[k]),
    }
    out = _alternate(cases, list(picks))
    one.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.breakdown", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite,postgres", help="sqlite,postgres (default both)")
    p.add_argument("--conversations", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2_000, help="windows (and appends) timed")
    p.add_argument("--seed", type=int, default=20_240_601)
    p.add_argument("--pg-host", default="127.0.0.1")
    p.add_argument("--pg-port", type=int, default=5432)
    p.add_argument("--pg-user", default="postgres")
    p.add_argument("--pg-admin-db", default="test")
    args = p.parse_args(argv)
    raw_dir = HERE / "results" / "raw"
    prime_tiktoken_cache(raw_dir / "tiktoken-cache")
    sample = _messages(args.seed, 10_000, 300)
    reference, formula, _note = counters(sample)
    loop = asyncio.new_event_loop()
    ctx = Context(formula=formula, reference=reference, system_prompt=sample[0], loop=loop,
                  budgets=(BUDGET,))
    pg = {"host": args.pg_host, "port": args.pg_port, "user": args.pg_user,
          "admin_db": args.pg_admin_db}
    for kind in args.db.split(","):
        job = {"db": kind, "group": "breakdown", "size": args.conversations,
               "raw_dir": str(raw_dir), "pg": pg}
        db = create_db(job)
        try:
            w = windows(db, ctx, args.conversations, args.rounds, args.seed)
            fixture = append_fixture(db, ctx, args.seed)
            try:
                a = appends(db, ctx, args.rounds, args.seed, fixture)
                e = extends(db, max(100, args.rounds // 5), args.seed, fixture)
            finally:
                fixture[0].close()
                fixture[1].close()
        finally:
            drop_db(job, db)
        f = w["floor"]
        print(f"{kind}: cold 4k window, a random one of {args.conversations:,} × 300 "
              "(median ms, × floor)")
        for name in ("floor", "sql", "sql+decode", "window"):
            print(f"  {name:12s} {w[name]:7.3f}  {w[name] / f:5.2f}×")
        print(f"  decoding {w['sql+decode'] - w['sql']:.3f} ms; views, report, pool and "
              f"validation {w['window'] - w['sql+decode']:.3f} ms")
        print(f"{kind}: single append (median ms, × floor)")
        for name in ("floor", "sql", "append"):
            print(f"  {name:12s} {a[name]:7.3f}  {a[name] / a['floor']:5.2f}×")
        print(f"{kind}: extend of 100 messages (median ms, × floor)")
        for name in ("floor", "count", "one thread", "extend"):
            print(f"  {name:12s} {e[name]:7.3f}  {e[name] / e['floor']:5.2f}×")
        sys.stdout.flush()
    loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

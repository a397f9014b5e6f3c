"""Deployment phases: many tenants, appends, agent turns and the first window.

The main benchmark's window numbers are warm (one conversation fetched again and
again). These phases measure what a service sees, each against the raw-SQL floor
(``systems/floor.py``) **timed alternately in one process**, so machine drift cancels
out of the ratios:

``tenants``
    ``conversations`` × ``per_conversation`` messages; each round picks one
    conversation uniformly at random and reads its 4k ``TokenLimitedView`` window
    with the default store, a ``cache_size=0`` store and the floor (order rotated).
    Also checks that a repeated conversation is served from the row cache in one
    statement.
``append``
    one message per call (memstore tokenizes it; the floor's count is computed by
    the same chat formula, also timed) on a random tenant conversation, alternating;
    then ``extend`` of 100 vs a floor ``executemany`` of 100 in one transaction.
``turn``
    a 10,000-message conversation; an agent turn is append user, 4k window, append
    an assistant tool call, append its result, 4k window.
``cold``
    a fresh ``python`` process per sample: ``import memstore``, tokenizer load,
    opening the store (engine + migrations check), the first window; the floor's
    fresh process imports its driver, connects and reads the same window.

Every memstore store here runs with ``durability="normal"`` (WAL, ``synchronous=NORMAL``),
the setting the SQLite floor runs with: the ratios compare the same durability. The
default ``durability="full"`` adds an fsync to every commit on both alike.

Run through ``python -m benchmarks --phases tenants,append,turn,cold [--quick]``;
one worker process per database (``python -m benchmarks.deploy SPEC``).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks.checks import check_window
from benchmarks.measure import stats
from benchmarks.systems.base import Context, DbTarget, Msg, System, WindowSpec
from benchmarks.systems.floor import FloorPostgres, FloorSQLite
from benchmarks.tokens import counters, prime_tiktoken_cache
from benchmarks.worker import create_db, drop_db, settle_and_measure
from benchmarks.workload import _Gen

__all__ = ["PHASES", "DeployProfile", "run_deploy", "run_phases"]

PHASES = ("tenants", "append", "turn", "cold")
BUDGET = 4_000
TURN_ID = "turn-main"
#: The floor's SQLite settings (WAL, ``synchronous=NORMAL``); ignored on PostgreSQL.
DURABILITY: Final = "normal"


@dataclass
class DeployProfile:
    """Sizes and repetitions of the deployment phases."""

    conversations: int = 2_000
    per_conversation: int = 300
    warm_rounds: int = 300
    rounds: int = 1_500
    appends: int = 400
    extends: int = 30
    extend_size: int = 100
    turn_history: int = 10_000
    turns: int = 150
    cold_samples: int = 7

    @classmethod
    def quick(cls) -> DeployProfile:
        """About a minute per database."""
        return cls(conversations=200, per_conversation=300, warm_rounds=100, rounds=300,
                   appends=150, extends=10, turn_history=10_000, turns=40, cold_samples=3)


def tenant_id(i: int) -> str:
    """Id of tenant conversation ``i``."""
    return f"tenant-{i:05d}"


def _messages(seed: int, index: int, size: int) -> list[Msg]:
    return list(_Gen(seed, index, size).messages())


def _floor(db: DbTarget, ctx: Context) -> System:
    floor = (FloorSQLite if db.kind == "sqlite" else FloorPostgres)(db, ctx)
    floor.setup()
    return floor


def _pair(entry: dict[str, Any], name: str, xs: list[float], floor: list[float]) -> None:
    s, f = stats(xs), stats(floor)
    entry[name] = {
        "stats": s, "floor_stats": f,
        "ratio_p50": s["p50_ms"] / f["p50_ms"], "ratio_p95": s["p95_ms"] / f["p95_ms"],
    }


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _FloorExtend:
    """The floor's batch write: one transaction, seq lookup, ``executemany``."""

    def __init__(self, floor: System) -> None:
        self.floor = floor

    def __call__(self, cid: str, batch: list[Msg]) -> None:
        from benchmarks.systems.floor import _encode

        count = self.floor.ctx.formula.count
        if isinstance(self.floor, FloorSQLite):
            con = self.floor.con
            con.execute("BEGIN IMMEDIATE")
            (top,) = con.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE conversation_id = ?", (cid,)
            ).fetchone()
            con.executemany(
                "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(cid, top + 1 + i, *_encode(m, count(m))) for i, m in enumerate(batch)],
            )
            con.execute("COMMIT")
            return
        conn = self.floor.conn  # type: ignore[attr-defined]
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (cid,))
            cur.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE conversation_id = %s", (cid,)
            )
            (top,) = cur.fetchone()
            cur.executemany(
                "INSERT INTO messages VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(cid, top + 1 + i, *_encode(m, count(m))) for i, m in enumerate(batch)],
            )


# ---- phases -------------------------------------------------------------------------------


def phase_tenants(db: DbTarget, ctx: Context, prof: DeployProfile, seed: int) -> dict[str, Any]:
    """Random-conversation 4k windows: default store vs ``cache_size=0`` vs the floor."""
    from memstore import MemoryStore, Message, TokenLimitedView

    counter = ctx.reference.counter  # type: ignore[attr-defined]
    out: dict[str, Any] = {"conversations": prof.conversations,
                           "per_conversation": prof.per_conversation}
    loader = MemoryStore(db.url(), counter=counter, migrate="upgrade", durability=DURABILITY)
    floor = _floor(db, ctx)
    t0 = time.perf_counter()
    for i in range(prof.conversations):
        msgs = _messages(seed, 10_000 + i, prof.per_conversation)
        loader.extend(tenant_id(i), [Message.from_openai(m) for m in msgs])
        floor.import_chunk(tenant_id(i), msgs, main=False)
    out["load_s"] = time.perf_counter() - t0
    loader.close()
    settle_and_measure(db)
    cached = MemoryStore(db.url(), counter=counter, migrate="check", durability=DURABILITY)
    nocache = MemoryStore(db.url(), counter=counter, migrate="check", cache_size=0,
                          durability=DURABILITY)
    # A control: a second cache_size=0 store. Two identical stores timed alternately
    # differ by a few percent (which store, which connection); that is the noise the
    # cached-vs-uncached ratio is read against.
    control = MemoryStore(db.url(), counter=counter, migrate="check", cache_size=0,
                          durability=DURABILITY)
    view = TokenLimitedView(BUDGET)
    spec = WindowSpec("token_limited", BUDGET)
    pf = floor.prepare("", spec)
    rng = random.Random(seed)
    # Correctness once, on one conversation: memstore's and the floor's windows agree.
    cid = tenant_id(0)
    first = _messages(seed, 10_000, prof.per_conversation)
    got = [m for m in cached.window(cid, view).to_openai()]
    chk = check_window(got, formula=ctx.reference, budget=BUDGET, system=first[0],
                       newest=first[-1])
    out["check"] = chk.to_json()
    # A repeated conversation comes from the cache: no row decoded the second time.
    before = cached.cache_info()
    cached.window(cid, view)
    after = cached.cache_info()
    out["repeat_rows_read"] = after.misses - before.misses
    out["repeat_rows_cached"] = after.hits - before.hits
    systems = {
        "memstore": lambda c: cached.window(c, view),
        "memstore-nocache": lambda c: nocache.window(c, view),
        "memstore-nocache-control": lambda c: control.window(c, view),
        "floor": lambda c: floor.fetch(c, pf),
    }
    names = list(systems)
    for _ in range(prof.warm_rounds):  # fill the cache to its steady state
        c = tenant_id(rng.randrange(prof.conversations))
        for fn in systems.values():
            fn(c)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(prof.rounds):
        c = tenant_id(rng.randrange(prof.conversations))
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            fn = systems[n]
            times[n].append(_timed(lambda fn=fn, c=c: fn(c)))
    for n in ("memstore", "memstore-nocache"):
        _pair(out, n, times[n], times["floor"])
    out["cached_vs_nocache_p50"] = (
        stats(times["memstore"])["p50_ms"] / stats(times["memstore-nocache"])["p50_ms"]
    )
    out["control_vs_nocache_p50"] = (
        stats(times["memstore-nocache-control"])["p50_ms"]
        / stats(times["memstore-nocache"])["p50_ms"]
    )
    info = cached.cache_info()
    out["cache"] = info._asdict()
    cached.close()
    nocache.close()
    control.close()
    floor.close()
    return out


#: Conversations the appends go to (``app-0`` .. ``app-49``, 50 messages each to start).
APPEND_CONVERSATIONS = 50


def append_fixture(db: DbTarget, ctx: Context, seed: int) -> tuple[Any, System]:
    """A memstore store and the floor, both holding the append phase's conversations."""
    from memstore import MemoryStore, Message

    counter = ctx.reference.counter  # type: ignore[attr-defined]
    store = MemoryStore(db.url(), counter=counter, migrate="upgrade", durability=DURABILITY)
    floor = _floor(db, ctx)
    for i in range(APPEND_CONVERSATIONS):
        msgs = _messages(seed, 20_000 + i, 50)
        store.extend(f"app-{i}", [Message.from_openai(m) for m in msgs])
        floor.import_chunk(f"app-{i}", msgs, main=False)
    floor._next_seq.clear()  # type: ignore[attr-defined]
    settle_and_measure(db)
    return store, floor


def phase_append(db: DbTarget, ctx: Context, prof: DeployProfile, seed: int) -> dict[str, Any]:
    """Single appends and ``extend`` of 100 against the floor's insert and executemany."""
    store, floor = append_fixture(db, ctx, seed)
    n_conv = APPEND_CONVERSATIONS
    rng = random.Random(seed + 1)
    gen = _Gen(seed + 7, 999, prof.appends)
    singles = [gen.user() if i % 2 == 0 else gen.assistant() for i in range(prof.appends)]
    tm: list[float] = []
    tf: list[float] = []
    for k, m in enumerate(singles):
        c = f"app-{rng.randrange(n_conv)}"
        pair = [
            (tm, lambda c=c, m=m: store.append(c, m)),
            (tf, lambda c=c, m=m: floor.append(c, m)),
        ]
        if k % 2:
            pair.reverse()
        for bucket, fn in pair:
            bucket.append(_timed(fn))
    out: dict[str, Any] = {}
    _pair(out, "append", tm, tf)
    fx = _FloorExtend(floor)
    em: list[float] = []
    ef: list[float] = []
    for k in range(prof.extends):
        batch = _messages(seed, 30_000 + k, prof.extend_size)
        c = f"app-{rng.randrange(n_conv)}"
        pair = [
            (em, lambda c=c, b=batch: store.extend(c, b)),
            (ef, lambda c=c, b=batch: fx(c, b)),
        ]
        if k % 2:
            pair.reverse()
        for bucket, fn in pair:
            bucket.append(_timed(fn))
    _pair(out, "extend", em, ef)
    out["extend"]["size"] = prof.extend_size
    store.close()
    floor.close()
    return out


def phase_turn(db: DbTarget, ctx: Context, prof: DeployProfile, seed: int) -> dict[str, Any]:
    """Agent turns at 10k history: append user, window, tool call, tool result, window."""
    from memstore import MemoryStore, Message, TokenLimitedView

    counter = ctx.reference.counter  # type: ignore[attr-defined]
    store = MemoryStore(db.url(), counter=counter, migrate="upgrade", durability=DURABILITY)
    floor = _floor(db, ctx)
    msgs = _messages(seed, 40_000, prof.turn_history)
    for start in range(0, len(msgs), 5_000):
        chunk = msgs[start:start + 5_000]
        store.extend(TURN_ID, [Message.from_openai(m) for m in chunk])
        floor.import_chunk(TURN_ID, chunk, main=True)
    settle_and_measure(db)
    view = TokenLimitedView(BUDGET)
    pf = floor.prepare("", WindowSpec("token_limited", BUDGET))
    gen = _Gen(seed + 11, 998, 10)
    turns = []
    for k in range(prof.turns):
        call_id = f"call_turn_{k}"
        turns.append((
            gen.user(),
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"q": k})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": gen.words(40)},
        ))

    def ms_turn(t: tuple[Msg, Msg, Msg]) -> Any:
        store.append(TURN_ID, t[0])
        store.window(TURN_ID, view)
        store.append(TURN_ID, t[1])
        store.append(TURN_ID, t[2])
        return store.window(TURN_ID, view)

    def floor_turn(t: tuple[Msg, Msg, Msg]) -> Any:
        floor.append(TURN_ID, t[0])
        floor.fetch(TURN_ID, pf)
        floor.append(TURN_ID, t[1])
        floor.append(TURN_ID, t[2])
        return floor.fetch(TURN_ID, pf)

    tm: list[float] = []
    tf: list[float] = []
    last: Any = None
    for k, t in enumerate(turns):
        if k % 2:
            tf.append(_timed(lambda t=t: floor_turn(t)))
            t0 = time.perf_counter()
            last = ms_turn(t)
            tm.append(time.perf_counter() - t0)
        else:
            t0 = time.perf_counter()
            last = ms_turn(t)
            tm.append(time.perf_counter() - t0)
            tf.append(_timed(lambda t=t: floor_turn(t)))
    out: dict[str, Any] = {"history": prof.turn_history}
    _pair(out, "turn", tm, tf)
    window = list(last.to_openai())
    out["check"] = check_window(window, formula=ctx.reference, budget=BUDGET, system=msgs[0],
                                newest=turns[-1][2]).to_json()
    store.close()
    floor.close()
    return out


_COLD_MEMSTORE = r"""
import json, sys, time
t0 = time.perf_counter()
import memstore
from memstore import MemoryStore, TokenLimitedView
t1 = time.perf_counter()
counter = memstore.TiktokenCounter("cl100k_base")
counter.count_message(memstore.Message.user("warm the encoding"))
t2 = time.perf_counter()
store = MemoryStore(sys.argv[1], counter=counter, migrate=sys.argv[3])
t3 = time.perf_counter()
w = store.window(sys.argv[2], TokenLimitedView(4000))
t4 = time.perf_counter()
store.window(sys.argv[2], TokenLimitedView(4000))
t5 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "tokenizer": t2 - t1, "open": t3 - t2,
                  "window": t4 - t3, "total": t4 - t0, "second_window": t5 - t4,
                  "messages": len(w.messages)}))
"""

_COLD_FLOOR_SQLITE = r"""
import json, sys, time
t0 = time.perf_counter()
import sqlite3
t1 = time.perf_counter()
con = sqlite3.connect(sys.argv[1], isolation_level=None)
t2 = time.perf_counter()
sys.path.insert(0, sys.argv[3])
from benchmarks.systems.floor import take_units, _SQLITE_SYSTEM, _COLS
t3 = time.perf_counter()
system = con.execute(_SQLITE_SYSTEM, (sys.argv[2],)).fetchone()
cur = con.execute(f"SELECT {_COLS} FROM messages WHERE conversation_id = ? AND seq > 1 "
                  "ORDER BY seq DESC", (sys.argv[2],))
kept = take_units(cur, 4000 - 3 - system[4])
t4 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "open": t2 - t1, "window": t4 - t3,
                  "total": (t4 - t3) + (t2 - t0), "messages": len(kept) + 1}))
"""

_COLD_FLOOR_PG = r"""
import json, sys, time
t0 = time.perf_counter()
import psycopg
t1 = time.perf_counter()
conn = psycopg.connect(sys.argv[1], autocommit=True)
t2 = time.perf_counter()
sys.path.insert(0, sys.argv[3])
from benchmarks.systems.floor import take_units, _PG_FIRST, _PG_NEXT
t3 = time.perf_counter()
cid = sys.argv[2]
rows = conn.execute(_PG_FIRST, (cid, cid, 62)).fetchall()
kept = take_units((r[2:] for r in rows[1:]), 4000 - 3 - rows[0][6])
t4 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "open": t2 - t1, "window": t4 - t3,
                  "total": (t4 - t3) + (t2 - t0), "messages": len(kept) + 1}))
"""


def phase_cold(db: DbTarget, ctx: Context, prof: DeployProfile, seed: int,
               env: dict[str, str]) -> dict[str, Any]:
    """First window in a fresh process, with its breakdown, vs the floor's fresh process.

    Uses the ``turn`` phase's conversation when it is there (else builds 2,000 rows).
    """
    from memstore import ConversationNotFoundError, MemoryStore, Message

    counter = ctx.reference.counter  # type: ignore[attr-defined]
    store = MemoryStore(db.url(), counter=counter, migrate="upgrade", durability=DURABILITY)
    try:
        store.get_conversation(TURN_ID)
    except ConversationNotFoundError:
        msgs = _messages(seed, 40_000, 2_000)
        store.extend(TURN_ID, [Message.from_openai(m) for m in msgs])
        floor = _floor(db, ctx)
        floor.import_chunk(TURN_ID, msgs, main=True)
        floor.close()
    store.close()
    repo = str(Path(__file__).resolve().parent.parent)
    target = str(db.sqlite_path) if db.kind == "sqlite" else db.libpq_dsn
    migrate = "auto" if db.kind == "sqlite" else "check"
    runs: dict[str, list[dict[str, float]]] = {"memstore": [], "floor": []}
    floor_code = _COLD_FLOOR_SQLITE if db.kind == "sqlite" else _COLD_FLOOR_PG
    for _ in range(prof.cold_samples):
        for name, code, args in (
            ("memstore", _COLD_MEMSTORE, [db.url(), TURN_ID, migrate]),
            ("floor", floor_code, [target, TURN_ID, repo]),
        ):
            proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                                  text=True, env=env, check=True)
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"samples": prof.cold_samples, "migrate": migrate}
    for name, samples in runs.items():
        keys = samples[0].keys()
        out[name] = {k: sorted(s[k] for s in samples)[len(samples) // 2] * 1000
                     for k in keys if k != "messages"}
    return out


# ---- worker ---------------------------------------------------------------------------------


def run_phases(job: dict[str, Any]) -> dict[str, Any]:
    """Every requested phase on one fresh database; returns the results."""
    import os

    raw = Path(job["raw_dir"])
    cache_dir = raw / "tiktoken-cache"
    prime_tiktoken_cache(cache_dir)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache_dir)}
    prof = DeployProfile(**job["profile"])
    seed = int(job["seed"])
    sample = _messages(seed, 10_000, 300)
    reference, formula, _note = counters(sample)
    loop = asyncio.new_event_loop()
    ctx = Context(formula=formula, reference=reference, system_prompt=sample[0], loop=loop,
                  budgets=(BUDGET,))
    result: dict[str, Any] = {"db": job["db"], "phases": {}, "status": "running"}
    job = {**job, "group": "deploy", "size": prof.conversations}
    db = create_db(job)
    try:
        for phase in job["phases"]:
            t0 = time.perf_counter()
            try:
                if phase == "tenants":
                    data = phase_tenants(db, ctx, prof, seed)
                elif phase == "append":
                    data = phase_append(db, ctx, prof, seed)
                elif phase == "turn":
                    data = phase_turn(db, ctx, prof, seed)
                else:
                    data = phase_cold(db, ctx, prof, seed, env)
                data["elapsed_s"] = time.perf_counter() - t0
                # CPU contention inflates longer calls more than short ones (they span
                # scheduler slices): the report shows the load the phase ran under.
                data["loadavg_1m"] = os.getloadavg()[0]
            except Exception as exc:  # a phase's failure is a result, not a crash
                import traceback

                data = {"error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()[-3_000:]}
            result["phases"][phase] = data
            print(f"  {job['db']} {phase}: {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                  flush=True)
            Path(job["out"]).write_text(json.dumps(result, indent=1, default=str))
    finally:
        loop.close()
        if not job.get("keep_db"):
            drop_db(job, db)
    result["status"] = "ok"
    return result


def profile_dict(quick: bool) -> dict[str, Any]:
    """The profile of a run, as JSON."""
    return asdict(DeployProfile.quick() if quick else DeployProfile())


def run_deploy(
    phases: list[str], dbs: list[str], *, quick: bool, seed: int, raw_dir: Path,
    pg: dict[str, Any], results_path: Path, command: str, keep_dbs: bool = False,
) -> dict[str, Any]:
    """Run ``phases`` on each database, one worker process each; write and return the results."""
    from datetime import datetime, timezone

    from benchmarks.runner import machine_info

    raw_dir.mkdir(parents=True, exist_ok=True)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    machine = machine_info(pg)
    if "postgres" in dbs and machine["postgres"] is None:
        dbs = [d for d in dbs if d != "postgres"]
        print("PostgreSQL is not reachable: skipped.", file=sys.stderr)
    doc: dict[str, Any] = {
        "format": "memstore-benchmarks-deploy/1", "command": command, "quick": quick,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profile": profile_dict(quick), "machine": machine, "runs": [],
    }
    jobs = raw_dir / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    # Every phase is run in order: "cold" reuses the "turn" phase's conversation.
    ordered = [p for p in PHASES if p in phases]
    for db in dbs:
        spec = jobs / f"deploy-{db}.job.json"
        out = jobs / f"deploy-{db}.result.json"
        out.unlink(missing_ok=True)
        job = {"db": db, "phases": ordered, "profile": doc["profile"], "seed": seed,
               "raw_dir": str(raw_dir), "pg": pg, "keep_db": keep_dbs, "out": str(out)}
        spec.write_text(json.dumps(job, indent=1))
        print(f"deploy phases {','.join(ordered)} on {db}", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.deploy", str(spec)])
        try:
            result = json.loads(out.read_text())
        except (OSError, json.JSONDecodeError):
            result = {"db": db, "phases": {}, "status": "error"}
        if proc.returncode:
            result["status"] = "error"
        doc["runs"].append(result)
    doc["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results_path.write_text(json.dumps(doc, indent=1, default=str))
    return doc


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.deploy SPEC.json``: one database's phases."""
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(args[0]).read_text())
    result = run_phases(job)
    Path(job["out"]).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

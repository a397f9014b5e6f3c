"""One benchmark job, in its own process: one system group x one database x one size.

``python -m benchmarks.worker JOB.json`` reads the job, builds the workload history
in a fresh database, measures, and rewrites ``job["out"]`` (JSON) after every step,
so a job the runner kills on its time cap still leaves what it finished.

Steps: create the database → build the history (main conversation, then the 50
others; the bulk path is timed) → storage (bytes per message) → for every measured
system: each window kind is fetched once and checked, then timed; one traced fetch
for memory; appends at the end of the main conversation → drop the database.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.checks import check_window
from benchmarks.measure import MemoryPhase, stats, traced_peak_kib
from benchmarks.systems import PAIRED_FLOOR, floor_classes, group_classes
from benchmarks.systems.base import Context, DbTarget, Msg, SkipSystem, System, WindowSpec
from benchmarks.tokens import counters, prime_tiktoken_cache
from benchmarks.workload import MAIN_ID, Workload

__all__ = ["Profile", "run_job"]

VIEW_ORDER = ("token_limited", "score_based", "head_and_tail")


@dataclass(frozen=True)
class Profile:
    """How hard to measure (``--quick`` or full).

    Attributes:
        target_s: time to spend on one timed series when calls are fast.
        min_reps / max_reps: bounds on a series' repetitions.
        series_cap_s: a series never runs longer than this (slow peers get fewer
            repetitions, at least one).
        warmup: untimed calls before a series when calls are fast (< 0.1 s).
        appends: messages appended in the append phase.
        turns: agent turns (append one message, then fetch the 4k window) per system.
        paired_reps: alternating memstore/floor fetch pairs in the paired phase.
        async_extend: messages written by the extra async ``extend`` measurement.
    """

    target_s: float = 2.0
    min_reps: int = 5
    max_reps: int = 200
    series_cap_s: float = 40.0
    warmup: int = 3
    appends: int = 100
    turns: int = 100
    paired_reps: int = 600
    async_extend: int = 10_000

    @classmethod
    def quick(cls) -> Profile:
        """Small numbers for a smoke run."""
        return cls(
            target_s=0.25,
            min_reps=3,
            max_reps=30,
            series_cap_s=2.5,
            warmup=1,
            appends=10,
            turns=10,
            paired_reps=60,
            async_extend=500,
        )


class _Writer:
    def __init__(self, path: Path, result: dict[str, Any]) -> None:
        self.path = path
        self.result = result

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        tmp.replace(self.path)


def _error(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(tb[-3:]).strip()[-2_000:]


# ---- databases ----------------------------------------------------------------------


def _admin(job: dict[str, Any]) -> Any:
    import psycopg

    pg = job["pg"]
    return psycopg.connect(
        host=pg["host"], port=pg["port"], user=pg["user"], dbname=pg["admin_db"], autocommit=True
    )


def create_db(job: dict[str, Any]) -> DbTarget:
    """A fresh, empty database for the job."""
    raw = Path(job["raw_dir"])
    name = f"{job['group']}-{job['size']}".replace("-", "_")
    if job["db"] == "sqlite":
        path = raw / f"{name}.sqlite"
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        con = sqlite3.connect(path)
        con.execute("PRAGMA journal_mode=WAL")  # persistent: every system runs on WAL
        con.close()
        return DbTarget("sqlite", sqlite_path=path)
    pg = job["pg"]
    dbname = f"memstore_bench_{name}"
    with _admin(job) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    return DbTarget(
        "postgres", pg_host=pg["host"], pg_port=pg["port"], pg_user=pg["user"], pg_dbname=dbname
    )


def drop_db(job: dict[str, Any], db: DbTarget) -> None:
    """Remove the job's database."""
    if db.kind == "sqlite":
        assert db.sqlite_path is not None
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{db.sqlite_path}{suffix}").unlink(missing_ok=True)
        return
    with _admin(job) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db.pg_dbname}" WITH (FORCE)')


def settle_and_measure(db: DbTarget) -> int:
    """Bytes the job's tables use. Postgres gets ``VACUUM ANALYZE`` first (not timed)."""
    if db.kind == "sqlite":
        assert db.sqlite_path is not None
        con = sqlite3.connect(db.sqlite_path)
        try:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = con.execute("PRAGMA page_count").fetchone()[0]
            size = con.execute("PRAGMA page_size").fetchone()[0]
            return int(pages * size)
        finally:
            con.close()
    import psycopg

    with psycopg.connect(db.libpq_dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_stat_user_tables"
        ).fetchone()
        return int(row[0]) if row else 0


# ---- phases -------------------------------------------------------------------------


def _build(importer: System, workload: Workload, out: dict[str, Any]) -> tuple[Msg, Msg, int]:
    """Build the history; returns (system prompt, newest message, messages written)."""
    first: Msg | None = None
    last: Msg | None = None
    written = 0

    def track(chunks: Iterator[list[Msg]]) -> Iterator[list[Msg]]:
        nonlocal first, last
        for chunk in chunks:
            if first is None:
                first = chunk[0]
            last = chunk[-1]
            yield chunk

    size = importer.import_chunk_size
    main_s = 0.0
    for chunk in track(workload.chunks(workload.main, size)):
        t0 = time.perf_counter()
        importer.import_chunk(MAIN_ID, chunk, main=True)
        main_s += time.perf_counter() - t0
        written += len(chunk)
    t0 = time.perf_counter()
    importer.finish_import(MAIN_ID, main=True)
    main_s += time.perf_counter() - t0
    main_first, main_last = first, last
    others_s = 0.0
    others = 0
    for spec in workload.background:
        for chunk in workload.chunks(spec, size):
            t0 = time.perf_counter()
            importer.import_chunk(spec.conversation_id, chunk, main=False)
            others_s += time.perf_counter() - t0
            others += len(chunk)
        t0 = time.perf_counter()
        importer.finish_import(spec.conversation_id, main=False)
        others_s += time.perf_counter() - t0
    out.update(
        {
            "path": importer.import_path,
            "main_messages": workload.size,
            "main_s": main_s,
            "main_msgs_per_s": workload.size / main_s if main_s else None,
            "other_messages": others,
            "other_s": others_s,
            "msgs_per_s": (workload.size + others) / (main_s + others_s),
        }
    )
    assert main_first is not None and main_last is not None
    return main_first, main_last, written * importer.main_copies + others


def _series(system: System, prepared: Any, first_s: float, profile: Profile) -> list[float]:
    """Timed repetitions of one window fetch, sized from the first call's time."""
    reps = int(profile.target_s / max(first_s, 1e-6))
    reps = max(profile.min_reps, min(profile.max_reps, reps))
    if first_s * reps > profile.series_cap_s:
        reps = max(1, int(profile.series_cap_s / max(first_s, 1e-6)))
    if first_s < 0.1 and profile.warmup:
        system.timed_fetch(MAIN_ID, prepared, profile.warmup)
    return system.timed_fetch(MAIN_ID, prepared, reps)


def _measure_windows(
    system: System,
    specs: list[WindowSpec],
    ctx: Context,
    system_prompt: Msg,
    newest: Msg,
    profile: Profile,
    entry: dict[str, Any],
    writer: _Writer,
) -> None:
    windows: dict[str, Any] = entry.setdefault("windows", {})
    with MemoryPhase() as mem:
        for spec in specs:
            if spec.view not in system.views:
                continue
            w: dict[str, Any] = {"label": spec.label, "view": spec.view, "budget": spec.budget}
            windows[spec.key] = w
            try:
                prepared = system.prepare(MAIN_ID, spec)
                t0 = time.perf_counter()
                native = system.call_fetch(MAIN_ID, prepared)
                first_s = time.perf_counter() - t0
                check = check_window(
                    system.to_openai(native),
                    formula=ctx.reference,
                    budget=spec.budget if spec.budgeted else None,
                    system=system_prompt,
                    newest=newest,
                )
                del native
                w["check"] = check.to_json()
                w["first_ms"] = first_s * 1000
                w["status"] = "running"
                writer.flush()
                w.update(stats(_series(system, prepared, first_s, profile)))
                w["status"] = "ok"
            except SkipSystem as exc:
                w["status"] = "skipped"
                w["note"] = str(exc)
            except Exception as exc:
                w["status"] = "error"
                w["error"] = _error(exc)
            writer.flush()
    entry["window_peak_rss_mib"] = mem.peak_mib
    tl4k = next((s for s in specs if s.view == "token_limited" and s.budget == 4_000), None)
    if tl4k is not None and windows.get(tl4k.key, {}).get("status") == "ok":
        prepared = system.prepare(MAIN_ID, tl4k)
        entry["window_alloc_kib"] = traced_peak_kib(lambda: system.call_fetch(MAIN_ID, prepared))
    writer.flush()


def _measure_paired(
    db: DbTarget,
    ctx: Context,
    workload: Workload,
    systems: list[System],
    spec: WindowSpec,
    system_prompt: Msg,
    newest: Msg,
    profile: Profile,
) -> dict[str, Any]:
    """memstore and the floor on the same database, their fetches alternating.

    Jobs run one after another, and this machine's speed drifts between them; the
    floor ratio is only trustworthy when both sides are timed in the same process,
    call after call. So the memstore job also loads the floor's table (its own
    schema, next to memstore's tables; after the storage measurement) and times each
    memstore variant against its floor (sync vs sync, async vs async), alternating.
    """
    floors: dict[str, System] = {}
    for cls in floor_classes(db.kind):
        floor = cls(db, ctx)
        floor.setup()
        floors[floor.name] = floor
    try:
        loader = floors["floor"]
        t0 = time.perf_counter()
        for conv in [workload.main, *workload.background]:
            for chunk in workload.chunks(conv, loader.import_chunk_size):
                loader.import_chunk(conv.conversation_id, chunk, main=conv is workload.main)
        out: dict[str, Any] = {"floor_load_s": time.perf_counter() - t0}
        settle_and_measure(db)  # PostgreSQL: ANALYZE the new table
        for system in systems:
            floor_name = PAIRED_FLOOR.get(system.name)
            if floor_name is None:
                continue
            floor = floors[floor_name]
            pm, pf = system.prepare(MAIN_ID, spec), floor.prepare(MAIN_ID, spec)
            check = check_window(
                floor.to_openai(floor.call_fetch(MAIN_ID, pf)),
                formula=ctx.reference,
                budget=spec.budget,
                system=system_prompt,
                newest=newest,
            )
            system.timed_fetch(MAIN_ID, pm, profile.warmup + 1)
            floor.timed_fetch(MAIN_ID, pf, profile.warmup + 1)
            tm: list[float] = []
            tf: list[float] = []
            for _ in range(profile.paired_reps):
                tm += system.timed_fetch(MAIN_ID, pm, 1)
                tf += floor.timed_fetch(MAIN_ID, pf, 1)
            sm, sf = stats(tm), stats(tf)
            out[system.name] = {
                "floor": floor_name,
                "system_stats": sm,
                "floor_stats": sf,
                "floor_check": check.to_json(),
                "ratio_p50": sm["p50_ms"] / sf["p50_ms"],
            }
            if system.name != "memstore-nocache":  # same append code as memstore
                # Appends too, alternating: the floor's append (an index lookup and an
                # insert) measures what the machine and the database cost right now.
                am: list[float] = []
                af: list[float] = []
                for m in workload.append_messages(profile.appends):
                    am += system.timed_appends(MAIN_ID, [m])
                    af += floor.timed_appends(MAIN_ID, [m])
                sam, saf = stats(am), stats(af)
                out[system.name]["append"] = {
                    "system_stats": sam,
                    "floor_stats": saf,
                    "ratio_p50": sam["p50_ms"] / saf["p50_ms"],
                }
        return out
    finally:
        for floor in floors.values():
            floor.close()


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job and return its result dict (also written to ``job["out"]``)."""
    started = time.perf_counter()
    raw = Path(job["raw_dir"])
    prime_tiktoken_cache(raw / "tiktoken-cache")
    profile = Profile(**job["profile"])
    workload = Workload(job["size"], seed=job["seed"])
    result: dict[str, Any] = {
        "group": job["group"],
        "db": job["db"],
        "size": job["size"],
        "status": "running",
        "workload": {
            "main_messages": workload.size,
            "others": workload.others,
            "other_messages_each": workload.other_messages,
        },
        "systems": {},
        "notes": [],
    }
    writer = _Writer(Path(job["out"]), result)
    writer.flush()

    sample = []
    for i, m in enumerate(workload.iter_messages(workload.main)):
        if i >= 3_000:
            break
        sample.append(m)
    reference, formula, note = counters(sample)
    result["counter_note"] = note
    result["reference_counter"] = reference.name
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    ctx = Context(
        formula=formula,
        reference=reference,
        system_prompt=sample[0],
        loop=loop,
        budgets=tuple(job["budgets"]),
    )
    specs = [WindowSpec(view, budget) for view in VIEW_ORDER for budget in job["budgets"]]

    db = create_db(job)
    systems: list[System] = []
    try:
        for cls in group_classes(job["group"], job["db"]):
            entry: dict[str, Any] = {
                "label": cls.label,
                "versions": cls.versions(),
                "status": "running",
            }
            result["systems"][cls.name] = entry
            system = cls(db, ctx)
            try:
                system.setup()
            except SkipSystem as exc:
                entry["status"] = "skipped"
                entry["note"] = str(exc)
                continue
            systems.append(system)
        writer.flush()
        if not systems:
            result["status"] = "skipped"
            return result
        importer = systems[0]

        build: dict[str, Any] = {}
        result["import"] = build
        with MemoryPhase() as mem:
            system_prompt, newest, written = _build(importer, workload, build)
        build["peak_rss_mib"] = mem.peak_mib
        writer.flush()

        total = settle_and_measure(db)
        result["storage"] = {
            "bytes": total,
            "messages": written,
            "bytes_per_message": total / written if written else None,
        }
        writer.flush()

        # Windows of every system first: appends change the newest message.
        paired_specs = [s for s in specs if s.view == "token_limited" and s.budget == 4_000]
        for system in systems:
            entry = result["systems"][system.name]
            try:
                _measure_windows(system, specs, ctx, system_prompt, newest, profile, entry, writer)
            except Exception as exc:
                entry["status"] = "error"
                entry["error"] = _error(exc)
            writer.flush()
        if job["group"] == "memstore" and paired_specs:
            try:
                result["paired"] = _measure_paired(
                    db, ctx, workload, systems, paired_specs[0], system_prompt, newest, profile
                )
            except Exception as exc:
                result["paired"] = {"error": _error(exc)}
            writer.flush()
        for system in systems:
            entry = result["systems"][system.name]
            if entry["status"] == "error":
                continue
            try:
                appends = workload.append_messages(profile.appends)
                entry["append"] = stats(system.timed_appends(MAIN_ID, appends))
                entry["status"] = "ok"
            except Exception as exc:
                entry["status"] = "error"
                entry["error"] = _error(exc)
            writer.flush()

        # Agent turns: append one message, then read the 4k window (checked at the end).
        tl4k = next((s for s in specs if s.view == "token_limited" and s.budget == 4_000), None)
        extra = workload.append_messages(profile.appends + profile.turns)[profile.appends :]
        for system in systems:
            entry = result["systems"][system.name]
            if entry["status"] == "error" or not system.measure_turns or tl4k is None:
                continue
            try:
                seconds, native = system.timed_turns(MAIN_ID, extra, system.prepare(MAIN_ID, tl4k))
                turn = stats(seconds)
                turn["check"] = check_window(
                    system.to_openai(native),
                    formula=ctx.reference,
                    budget=tl4k.budget,
                    system=system_prompt,
                    newest=extra[-1],
                ).to_json()
                entry["turn"] = turn
            except Exception as exc:
                entry["turn"] = {"error": _error(exc)}
            writer.flush()

        # Systems sharing the importer's rows: their own bulk write, on a scratch id.
        for system in systems[1:]:
            entry = result["systems"][system.name]
            n = min(workload.size, profile.async_extend)
            chunk = list(itertools.islice(workload.iter_messages(workload.main), n))
            t0 = time.perf_counter()
            for i in range(0, n, system.import_chunk_size):
                system.import_chunk(
                    "bench-extend", chunk[i : i + system.import_chunk_size], main=False
                )
            dt = time.perf_counter() - t0
            entry["extend"] = {"messages": n, "seconds": dt, "msgs_per_s": n / dt}
            writer.flush()
        result["status"] = "ok"
    except Exception as exc:
        result["status"] = "error"
        result["error"] = _error(exc)
    finally:
        for system in systems:
            try:
                system.close()
            except Exception as exc:
                result["notes"].append(f"{system.name} close failed: {exc}")
        loop.close()
        if not job.get("keep_db"):
            try:
                drop_db(job, db)
            except Exception as exc:
                result["notes"].append(f"dropping the database failed: {exc}")
        result["elapsed_s"] = time.perf_counter() - started
        writer.flush()
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m benchmarks.worker JOB.json``."""
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(args[0]).read_text())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run_job(job)
    return 0 if result["status"] in ("ok", "skipped") else 1


if __name__ == "__main__":
    raise SystemExit(main())

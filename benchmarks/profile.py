"""Where a window fetch spends its time: ``python -m benchmarks.profile``.

Builds the benchmark history for one system, database and size (same workload and
bulk path as the benchmark), then runs ``cProfile`` over repeated window fetches
(or appends) and prints the top functions. Issue 5 asks for such a profile
wherever a target is missed.

Example::

    python -m benchmarks.profile --system memstore --db sqlite --size 100k \\
        --view token_limited --budget 4000 --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.__main__ import _ints
from benchmarks.report import SYSTEMS
from benchmarks.systems import group_classes
from benchmarks.systems.base import Context, WindowSpec
from benchmarks.tokens import counters, prime_tiktoken_cache
from benchmarks.worker import _build, create_db, drop_db, settle_and_measure
from benchmarks.workload import MAIN_ID, Workload

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    p.add_argument("--system", choices=SYSTEMS, default="memstore")
    p.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--size", type=_ints, default=[10_000], help="history length, e.g. 100k")
    p.add_argument(
        "--view",
        choices=("token_limited", "score_based", "head_and_tail"),
        default="token_limited",
    )
    p.add_argument("--budget", type=int, default=4_000)
    p.add_argument("--calls", type=int, default=200, help="fetches (or appends) profiled")
    p.add_argument("--append", action="store_true", help="profile appends instead of windows")
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--sort", default="cumulative", help="pstats sort key (cumulative, tottime)")
    p.add_argument("--seed", type=int, default=20_240_601)
    p.add_argument("--out", type=Path, help="also save the raw profile (.prof) here")
    p.add_argument(
        "--keep-db", action="store_true", help="keep the database (prints where) for EXPLAIN"
    )
    args = p.parse_args(argv)

    raw = HERE / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    prime_tiktoken_cache(raw / "tiktoken-cache")
    group = (
        args.system.split("-")[0]
        if args.system.startswith(("memstore", "floor"))
        else (args.system)
    )
    size = args.size[0]
    job: dict[str, Any] = {
        "group": f"profile-{group}",
        "db": args.db,
        "size": size,
        "raw_dir": str(raw),
        "pg": {"host": "127.0.0.1", "port": 5432, "user": "postgres", "admin_db": "test"},
    }
    workload = Workload(size, seed=args.seed)
    sample = [m for _, m in zip(range(3_000), workload.iter_messages(workload.main), strict=False)]
    reference, formula, note = counters(sample)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    ctx = Context(formula, reference, sample[0], loop, budgets=(args.budget,))
    db = create_db(job)
    systems = []
    try:
        for cls in group_classes(group, args.db):
            s = cls(db, ctx)
            s.setup()
            systems.append(s)
        target = next(s for s in systems if s.name == args.system)
        print(
            f"building {size:,} messages with {systems[0].name} on {args.db} ...", file=sys.stderr
        )
        t0 = time.perf_counter()
        _build(systems[0], workload, {})
        settle_and_measure(db)
        print(f"built in {time.perf_counter() - t0:.1f} s; {note}", file=sys.stderr)
        prof = cProfile.Profile()
        if args.append:
            messages = workload.append_messages(args.calls)
            prof.enable()
            seconds = target.timed_appends(MAIN_ID, messages)
            prof.disable()
        else:
            spec = WindowSpec(args.view, args.budget)
            prepared = target.prepare(MAIN_ID, spec)
            target.timed_fetch(MAIN_ID, prepared, 3)  # warm-up
            prof.enable()
            seconds = target.timed_fetch(MAIN_ID, prepared, args.calls)
            prof.disable()
        seconds.sort()
        what = "appends" if args.append else f"{args.view} {args.budget} windows"
        print(
            f"{args.calls} {what}: p50 {seconds[len(seconds) // 2] * 1000:.3f} ms "
            f"(under the profiler)\n"
        )
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(args.sort).print_stats(args.top)
        print(buf.getvalue())
        if args.out:
            prof.dump_stats(args.out)
    finally:
        for s in systems:
            s.close()
        loop.close()
        if args.keep_db:
            print(f"kept the database: {db.url()}", file=sys.stderr)
        else:
            drop_db(job, db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

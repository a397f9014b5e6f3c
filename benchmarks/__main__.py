"""``python -m benchmarks``: run the benchmark and write the JSON, report and plot."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.deploy import PHASES, run_deploy
from benchmarks.report import write_report
from benchmarks.runner import RunConfig, command_line, run
from benchmarks.systems import GROUPS
from benchmarks.worker import Profile

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

FULL_SIZES = [1_000, 10_000, 100_000, 1_000_000]
QUICK_SIZES = [1_000, 3_000]


def _ints(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        mult = 1
        if part.endswith("k"):
            mult, part = 1_000, part[:-1]
        elif part.endswith("m"):
            mult, part = 1_000_000, part[:-1]
        out.append(int(float(part) * mult))
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of numbers")
    return out


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown: {', '.join(bad)} (choose from {', '.join(allowed)})"
            )
        return names

    return parse


def _load(path: Path) -> dict[str, Any] | None:
    """The deployment phases' results, when a run wrote them."""
    return json.loads(path.read_text()) if path.exists() else None


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Benchmark memstore against LangChain, LlamaIndex, the OpenAI Agents SDK "
            "and a raw-SQL floor on SQLite and PostgreSQL; write results JSON, a "
            "markdown report and a plot."
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: sizes {QUICK_SIZES}, few repetitions (< 2 minutes)",
    )
    p.add_argument(
        "--sizes",
        type=_ints,
        help=f"history lengths, e.g. 1k,10k,100k,1m (default {','.join(map(str, FULL_SIZES))})",
    )
    p.add_argument(
        "--db",
        type=_names(("sqlite", "postgres")),
        default=["sqlite", "postgres"],
        help="databases: sqlite,postgres (default both)",
    )
    p.add_argument(
        "--systems",
        type=_names(GROUPS),
        default=list(GROUPS),
        help=f"systems: {','.join(GROUPS)} (default all)",
    )
    p.add_argument(
        "--budgets", type=_ints, default=[4_000, 32_000], help="token budgets (default 4000,32000)"
    )
    p.add_argument(
        "--peer-max-size",
        type=_ints,
        default=[100_000],
        help="largest history the peers run at (default 100000)",
    )
    p.add_argument(
        "--time-cap",
        type=float,
        help="seconds per job up to 100,000 messages (default 900; quick 90)",
    )
    p.add_argument(
        "--big-time-cap",
        type=float,
        default=2_400.0,
        help="seconds per job above 100,000 messages (default 2400)",
    )
    p.add_argument("--seed", type=int, default=20_240_601, help="workload seed")
    p.add_argument(
        "--out",
        type=Path,
        help="markdown report (default docs/benchmarks.md; with --quick "
        "benchmarks/results/raw/quick.md, so a smoke run never overwrites the docs)",
    )
    p.add_argument(
        "--plot", type=Path, help="PNG plot (default <out dir>/benchmarks_window_latency.png)"
    )
    p.add_argument(
        "--results",
        type=Path,
        help="results JSON (default benchmarks/results/latest.json; "
        "quick: benchmarks/results/raw/quick.json)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="re-render the report and plot from --results without running",
    )
    p.add_argument("--pg-host", default="127.0.0.1")
    p.add_argument("--pg-port", type=int, default=5432)
    p.add_argument("--pg-user", default="postgres")
    p.add_argument(
        "--pg-admin-db",
        default="test",
        help="existing database used to create/drop the benchmark databases",
    )
    p.add_argument(
        "--phase",
        choices=("windows", "transfer", "search"),
        default="windows",
        help="windows: the latency benchmark (default); transfer: peak memory of export, "
        "import, dump/load state, iteration and delete at 10k and 1M messages "
        "(benchmarks/transfer_memory.py; --sizes and --db apply); search: full-text search "
        "latency, write cost, index size and backfill time (benchmarks/search.py: 100,000 "
        "messages, --sizes 1m for 1,000,000; --db and --quick apply)",
    )
    p.add_argument(
        "--phases",
        type=_names(PHASES),
        help="run only these deployment phases (tenants,append,turn,cold: many tenants, "
        "appends, agent turns, the first window of a fresh process), each against the "
        "floor timed alternately; results go to benchmarks/results/deploy.json (quick: "
        "results/raw/deploy-quick.json) and into the report",
    )
    p.add_argument(
        "--keep-dbs",
        action="store_true",
        help="keep each job's database (SQLite files under benchmarks/results/raw)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args_list = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(args_list)
    if args.phase == "transfer":
        from benchmarks import transfer_memory

        phase_args = ["--db", ",".join(args.db)]
        if args.sizes:
            phase_args += ["--sizes", ",".join(map(str, args.sizes))]
        return transfer_memory.main(phase_args)
    if args.phase == "search":
        from benchmarks import search

        search_args = ["--db", ",".join(args.db), "--update-docs"]
        if args.quick:
            search_args = ["--db", ",".join(args.db), "--quick",
                           "--results", str(HERE / "results" / "raw" / "search-quick.json")]
        elif args.sizes and max(args.sizes) >= 1_000_000:
            search_args.append("--full")
        return search.main(search_args)
    raw = HERE / "results" / "raw"
    results = args.results or (
        raw / "quick.json" if args.quick else HERE / "results" / "latest.json"
    )
    out = args.out or (raw / "quick.md" if args.quick else REPO / "docs" / "benchmarks.md")
    plot = args.plot or out.parent / "benchmarks_window_latency.png"
    deploy = (raw / "deploy-quick.json" if args.quick else HERE / "results" / "deploy.json")
    if args.phases:
        pg = {"host": args.pg_host, "port": args.pg_port, "user": args.pg_user,
              "admin_db": args.pg_admin_db}
        ddoc = run_deploy(args.phases, args.db, quick=args.quick, seed=args.seed, raw_dir=raw,
                          pg=pg, results_path=deploy, command=command_line(args_list),
                          keep_dbs=args.keep_dbs)
        if results.exists():
            write_report(json.loads(results.read_text()), out, plot, deploy=ddoc)
            print(f"wrote {deploy} and {out}")
        else:
            print(f"wrote {deploy} (no {results} to render the report from)")
        return 0
    if args.report_only:
        doc = json.loads(results.read_text())
        write_report(doc, out, plot, deploy=_load(deploy))
        print(f"wrote {out} and {plot} from {results}")
        return 0
    profile = Profile.quick() if args.quick else Profile()
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    cfg = RunConfig(
        sizes=sizes,
        dbs=args.db,
        groups=args.systems,
        budgets=args.budgets,
        quick=args.quick,
        peer_max_size=args.peer_max_size[0],
        time_cap_s=args.time_cap or (90.0 if args.quick else 900.0),
        big_time_cap_s=args.big_time_cap,
        seed=args.seed,
        results_path=results,
        raw_dir=raw,
        pg={
            "host": args.pg_host,
            "port": args.pg_port,
            "user": args.pg_user,
            "admin_db": args.pg_admin_db,
        },
        command=command_line(args_list),
        keep_dbs=args.keep_dbs,
        profile=replace(profile),
    )
    doc = run(cfg)
    write_report(doc, out, plot, deploy=_load(deploy))
    print(f"wrote {results}, {out} and {plot}")
    failed = [r for r in doc["runs"] if r.get("status") == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

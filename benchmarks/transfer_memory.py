"""Peak memory of whole-conversation operations: export, import, dump/load state, iterate, delete.

``python -m benchmarks --phase transfer`` (or ``python -m benchmarks.transfer_memory``)
writes one conversation of each size, then runs every operation in a fresh process
and records that process's peak RSS (``VmHWM``). The target: the streaming
operations' peak RSS at 1,000,000 messages is within 1.5x of their peak at 10,000
(memory does not grow with the conversation's length).

Messages are ~200 characters of text with a little metadata, a tool call every 10th
turn; the store counts with a ``FixedCounter`` (tokenisation cost is not what is
measured here, and the import recounts every message with it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OPERATIONS = ("iter_messages", "export_jsonl", "import_jsonl", "dump_state", "load_state",
              "delete_conversation")
TARGET_RATIO = 1.5
WRITE_BATCH = 10_000


def _counter() -> Any:
    from memstore.tokens import FixedCounter

    return FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)


def _messages(start: int, count: int) -> list[Any]:
    from memstore import Message, ToolCall

    out = []
    for i in range(start, start + count):
        text = f"message {i}: " + ("lorem ipsum dolor sit amet " * 7)
        if i % 20 == 10:
            call = ToolCall(id=f"call-{i}", name="search", arguments='{"q": "x"}')
            out.append(Message.assistant(None, tool_calls=[call], id=f"m{i}"))
        elif i % 20 == 11:
            out.append(Message.tool(text, tool_call_id=f"call-{i - 1}", id=f"m{i}"))
        else:
            role = Message.user if i % 2 == 0 else Message.assistant
            out.append(role(text, id=f"m{i}", metadata={"turn": i}))
    return out


def populate(url: str, cid: str, size: int) -> None:
    """Write a conversation of ``size`` messages (not measured)."""
    from memstore import MemoryStore

    with MemoryStore(url, counter=_counter(), durability="normal", cache_size=0) as store:
        for start in range(0, size, WRITE_BATCH):
            store.extend(cid, _messages(start, min(WRITE_BATCH, size - start)))


def peak_rss_kb() -> int:
    """This process's peak resident set size in KiB.

    ``VmHWM`` from ``/proc/self/status`` on Linux: unlike ``ru_maxrss`` it is not
    inherited from the parent across fork+exec. ``ru_maxrss`` elsewhere.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _operation(url: str, op: str, cid: str, scratch: str, queue: Any) -> None:
    """One operation in a fresh process; reports (peak RSS before, after, seconds)."""
    from memstore import MemoryStore, export_jsonl, import_jsonl

    store = MemoryStore(url, counter=_counter(), cache_size=0)
    export_path = os.path.join(scratch, f"{cid}.jsonl")
    state_path = os.path.join(scratch, f"{cid}.state.json")
    baseline = peak_rss_kb()
    started = time.perf_counter()
    if op == "iter_messages":
        count = sum(1 for _ in store.iter_messages(cid))
    elif op == "export_jsonl":
        with open(export_path, "w", encoding="utf-8") as fp:
            count = export_jsonl(store, fp, [cid]).messages
    elif op == "import_jsonl":
        with open(export_path, encoding="utf-8") as fp:
            count = import_jsonl(store, fp, rename=f"{cid}-imported").conversations[0].written
    elif op == "dump_state":
        with open(state_path, "w", encoding="utf-8") as fp:
            count = store.dump_state(cid, fp).message_count
    elif op == "load_state":
        with open(state_path, encoding="utf-8") as fp:
            count = store.restore_state(fp, f"{cid}-loaded").written
    elif op == "delete_conversation":
        count = store.get_conversation(f"{cid}-imported").message_count
        store.delete_conversation(f"{cid}-imported")
        store.delete_conversation(f"{cid}-loaded")
    else:  # pragma: no cover - argparse restricts it
        raise ValueError(op)
    seconds = time.perf_counter() - started
    peak = peak_rss_kb()
    store.close()
    queue.put({"op": op, "count": count, "baseline_kb": baseline, "peak_kb": peak,
               "seconds": round(seconds, 2)})


def measure(url: str, op: str, cid: str, scratch: str) -> dict[str, Any]:
    """Run one operation in a spawned process; its result."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_operation, args=(url, op, cid, scratch, queue))
    proc.start()
    result: dict[str, Any] = queue.get()
    proc.join()
    return result


def _databases(dbs: list[str], scratch: str, pg: str) -> list[tuple[str, str, Any]]:
    out: list[tuple[str, str, Any]] = []
    for db in dbs:
        if db == "sqlite":
            out.append(("sqlite", f"sqlite:///{scratch}/transfer.db", None))
        else:
            from sqlalchemy import create_engine, text

            name = f"memstore_bench_transfer_{uuid.uuid4().hex[:8]}"
            admin = create_engine(pg, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            url = admin.url.set(database=name).render_as_string(hide_password=False)

            def drop(name: str = name, admin: Any = admin) -> None:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()

            out.append(("postgres", url, drop))
    return out


def run(sizes: list[int], dbs: list[str], pg: str, log: Any = print) -> dict[str, Any]:
    """Measure every operation at every size on every database."""
    from memstore import migrate

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="memstore-transfer-") as scratch:
        for db, url, drop in _databases(dbs, scratch, pg):
            try:
                migrate.upgrade(url)
                for size in sizes:
                    cid = f"conv-{size}"
                    started = time.perf_counter()
                    populate(url, cid, size)
                    log(f"[{db}] wrote {size:,} messages in {time.perf_counter() - started:.0f}s")
                    for op in OPERATIONS:
                        result = measure(url, op, cid, scratch)
                        result.update(db=db, size=size)
                        rows.append(result)
                        log(f"[{db}] {size:>9,} {op:<20} peak {result['peak_kb'] / 1024:7.1f} MB"
                            f"  {result['seconds']:7.1f}s  ({result['count']:,} messages)")
                    for name in os.listdir(scratch):
                        if name.startswith(cid):
                            os.remove(os.path.join(scratch, name))
            finally:
                if drop is not None:
                    drop()
    return {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                        "cpus": os.cpu_count()},
            "sizes": sizes, "target_ratio": TARGET_RATIO, "rows": rows,
            "verdicts": verdicts(rows, sizes)}


def verdicts(rows: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Peak RSS at the largest size over the smallest, per database and operation."""
    out = []
    small, large = min(sizes), max(sizes)
    index = {(r["db"], r["size"], r["op"]): r for r in rows}
    for db in sorted({r["db"] for r in rows}):
        for op in OPERATIONS:
            a, b = index.get((db, small, op)), index.get((db, large, op))
            if a is None or b is None or small == large:
                continue
            ratio = b["peak_kb"] / a["peak_kb"]
            out.append({"db": db, "op": op, "small_mb": round(a["peak_kb"] / 1024, 1),
                        "large_mb": round(b["peak_kb"] / 1024, 1), "ratio": round(ratio, 2),
                        "met": ratio <= TARGET_RATIO})
    return out


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown section."""
    sizes = doc["sizes"]
    lines = [
        "# Peak memory of whole-conversation operations",
        "",
        "Generated by `python -m benchmarks --phase transfer` "
        f"(Python {doc['machine']['python']}, {doc['machine']['cpus']} CPUs). "
        "Each operation runs in a fresh process; the figure is that process's peak RSS "
        "(interpreter and imports included). Target: the peak at "
        f"{max(sizes):,} messages within {doc['target_ratio']}x of the peak at "
        f"{min(sizes):,}.",
        "",
        "| database | operation | " + " | ".join(f"{s:,} msgs" for s in sizes)
        + " | ratio | target |",
        "|---|---|" + "---|" * len(sizes) + "---|---|",
    ]
    index = {(r["db"], r["size"], r["op"]): r for r in doc["rows"]}
    verdict = {(v["db"], v["op"]): v for v in doc["verdicts"]}
    for db in sorted({r["db"] for r in doc["rows"]}):
        for op in OPERATIONS:
            cells = []
            for s in sizes:
                r = index.get((db, s, op))
                cells.append("—" if r is None else
                             f"{r['peak_kb'] / 1024:.0f} MB ({r['seconds']:.0f} s)")
            v = verdict.get((db, op))
            ratio = "—" if v is None else f"{v['ratio']:.2f}x"
            met = "—" if v is None else ("met" if v["met"] else "**missed**")
            lines.append(f"| {db} | `{op}` | " + " | ".join(cells) + f" | {ratio} | {met} |")
    lines += [
        "",
        "Before the operations, each conversation is written (not measured) with `extend` in",
        "batches of 10,000 messages, each with a client id, as an import of existing history",
        "would; the run's log gives that time too (`[postgres] wrote 1,000,000 messages in ...`).",
        "The client-id lookup probes the unique index once per id on PostgreSQL, so the fill",
        "stays linear even when the planner has no statistics for the new rows.",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the phase."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.transfer_memory",
                                description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,1000000",
                   help="conversation lengths (default 10000,1000000)")
    p.add_argument("--db", default="sqlite,postgres", help="sqlite,postgres")
    p.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                   help="an existing PostgreSQL database used to create/drop the scratch one")
    p.add_argument("--results", type=Path,
                   default=HERE / "results" / "transfer_memory.json")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-memory.md")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = build_parser().parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    dbs = [d.strip() for d in args.db.split(",") if d.strip()]
    rows: list[dict[str, Any]] = []
    if args.results.exists():
        # Keep the other databases' rows of an earlier run at the same sizes, so that
        # `--db postgres` re-measures PostgreSQL without dropping the SQLite half.
        earlier = json.loads(args.results.read_text())
        if earlier.get("sizes") == sizes:
            rows = [r for r in earlier.get("rows", []) if r.get("db") not in dbs]
    doc: dict[str, Any] = {}
    for db in dbs:  # results are written after each database, so a long run keeps them
        doc = run(sizes, [db], args.pg)
        rows.extend(doc["rows"])
        doc.update(rows=rows, verdicts=verdicts(rows, sizes))
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(doc, indent=2) + "\n")
        args.out.write_text(markdown(doc))
    print(markdown(doc))
    return 0 if all(v["met"] for v in doc["verdicts"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Render a results document as markdown (``docs/benchmarks.md``) and a PNG plot.

Everything here is computed from the results JSON of one run, so the report, the
ratios and the target verdicts always describe the same measurements.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.systems import PAIRED_FLOOR

__all__ = ["render_markdown", "render_plot", "targets", "write_report"]

SYSTEMS = (
    "memstore",
    "memstore-async",
    "memstore-nocache",
    "floor",
    "floor-async",
    "langchain",
    "llamaindex",
    "openai-agents",
)
SHORT = {
    "memstore": "memstore",
    "memstore-async": "memstore (async)",
    "memstore-nocache": "memstore (cache_size=0)",
    "floor": "raw SQL floor",
    "floor-async": "raw SQL floor (async)",
    "langchain": "LangChain",
    "llamaindex": "LlamaIndex",
    "openai-agents": "OpenAI Agents SDK",
}
PEER_SYSTEMS = ("langchain", "llamaindex", "openai-agents")
DB_LABEL = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
TL4K = "token_limited:4000"
FLOOR_OF = PAIRED_FLOOR
#: systems sharing another system's database (no storage number of their own)
SHARES_DB = frozenset({"memstore-async", "memstore-nocache", "floor-async"})
P95_GOAL_MS = {"sqlite": 5.0, "postgres": 10.0}


# ---- access -------------------------------------------------------------------------


class Results:
    """Index over one results document."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.runs: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.entries: dict[tuple[str, str, int], dict[str, Any]] = {}
        for run in doc.get("runs", []):
            self.runs[(run["group"], run["db"], run["size"])] = run
            for name, entry in run.get("systems", {}).items():
                self.entries[(name, run["db"], run["size"])] = entry
        self.dbs: list[str] = [d for d in ("sqlite", "postgres") if d in doc["config"]["dbs"]]
        self.sizes: list[int] = sorted({r["size"] for r in doc.get("runs", [])})
        self.budgets: list[int] = list(doc["config"]["budgets"])

    @staticmethod
    def group_of(system: str) -> str:
        """The job group a system runs in."""
        if system.startswith("memstore"):
            return "memstore"
        return "floor" if system.startswith("floor") else system

    def run_of(self, system: str, db: str, size: int) -> dict[str, Any] | None:
        """The job result holding ``system`` at ``db``/``size``."""
        return self.runs.get((self.group_of(system), db, size))

    def entry(self, system: str, db: str, size: int) -> dict[str, Any] | None:
        """The system's entry in its job result."""
        return self.entries.get((system, db, size))

    def window(self, system: str, db: str, size: int, key: str) -> dict[str, Any] | None:
        """One window measurement."""
        entry = self.entry(system, db, size)
        if entry is None:
            return None
        w: dict[str, Any] | None = entry.get("windows", {}).get(key)
        return w

    def p(self, system: str, db: str, size: int, key: str, stat: str = "p50_ms") -> float | None:
        """A timing statistic, when the window was measured."""
        w = self.window(system, db, size, key)
        if w is None or stat not in w:
            return None
        return float(w[stat])

    def paired(self, system: str, db: str, size: int) -> dict[str, Any] | None:
        """The paired (alternating, same-process) floor measurement of a memstore variant."""
        run = self.runs.get(("memstore", db, size))
        pr = (run or {}).get("paired") or {}
        found: dict[str, Any] | None = pr.get(system)
        return found if found and "ratio_p50" in found else None

    def systems_present(self) -> list[str]:
        """Systems with at least one entry, in report order."""
        names = {k[0] for k in self.entries}
        return [s for s in SYSTEMS if s in names]

    def status_text(self, system: str, db: str, size: int) -> str | None:
        """Why a system has no number at this size (None when it has one)."""
        run = self.run_of(system, db, size)
        if run is None:
            return ""
        if run.get("status") == "not_run":
            return "—"
        entry = self.entry(system, db, size)
        if entry is None:
            return "timed out" if run.get("status") == "timed_out" else "error"
        if entry.get("status") == "skipped":
            return "skipped"
        return None


# ---- formatting ---------------------------------------------------------------------


def fmt_ms(x: float | None) -> str:
    """Milliseconds with precision that suits the magnitude."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x < 1:
        return f"{x:.3f}"
    if x < 10:
        return f"{x:.2f}"
    if x < 100:
        return f"{x:.1f}"
    return f"{x:,.0f}"


def fmt_ratio(x: float | None) -> str:
    """``12.3×`` style ratio."""
    if x is None or math.isnan(x) or math.isinf(x):
        return "—"
    if x >= 100:
        return f"{x:,.0f}×"
    if x >= 10:
        return f"{x:.1f}×"
    return f"{x:.2f}×"


def _short_size(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def fmt_size(n: int) -> str:
    """``1,000`` style."""
    return f"{n:,}"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out.extend("| " + " | ".join(r) + " |" for r in rows)
    return out


def _window_cell(res: Results, system: str, db: str, size: int, key: str) -> str:
    why = res.status_text(system, db, size)
    if why is not None:
        return why
    w = res.window(system, db, size, key)
    if w is None:
        run = res.run_of(system, db, size) or {}
        return "timed out" if run.get("status") == "timed_out" else ""
    status = w.get("status")
    if status == "skipped":
        return "n/a"
    if "p50_ms" not in w:
        return {"timed_out": "timed out", "error": "error"}.get(str(status), str(status))
    cell = f"{fmt_ms(w['p50_ms'])} / {fmt_ms(w['p95_ms'])}"
    if not w.get("check", {}).get("ok", False):
        cell += " ✗"
    if w.get("n", 0) < 5:
        cell += f" (n={w['n']})"
    return cell


# ---- targets ------------------------------------------------------------------------


def _verdict(ok: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not evaluated"}[ok]


def _growth_row(goal: str, label: str, system: str, a: float, b: float) -> dict[str, Any]:
    """A target row for "cost at the large size <= 1.5x cost at the small size"."""
    return {
        "target": goal,
        "db": label,
        "system": SHORT[system],
        "measured": f"{fmt_ms(b)} ms vs {fmt_ms(a)} ms = {fmt_ratio(b / a)}",
        "ok": b <= 1.5 * a,
    }


def _drift_row(
    goal: str,
    label: str,
    system: str,
    a: float,
    b: float,
    pa: dict[str, Any],
    pb: dict[str, Any],
    what: str = "window",
) -> dict[str, Any]:
    """A growth target judged relative to the floor timed alternately in each job.

    The 1,000 and 1,000,000 jobs run many minutes apart on a machine whose speed drifts
    (in one run the floor's identical window query differed 2.6x between them), so
    the raw cross-job ratio is shown, but the verdict uses memstore's cost relative to
    the floor measured call by call in the same job.
    """
    norm = pb["ratio_p50"] / pa["ratio_p50"]
    return {
        "target": goal,
        "db": label,
        "system": SHORT[system],
        "measured": f"{fmt_ms(b)} ms vs {fmt_ms(a)} ms = {fmt_ratio(b / a)} across jobs; "
        f"{fmt_ratio(norm)} relative to the floor's {what} timed alternately "
        f"({fmt_ratio(pb['ratio_p50'])} of the floor at 1,000,000, "
        f"{fmt_ratio(pa['ratio_p50'])} at 1,000)",
        "ok": norm <= 1.5,
    }


def targets(res: Results) -> list[dict[str, Any]]:
    """The issue-5 targets, each with the numbers and a verdict, from this run."""
    out: list[dict[str, Any]] = []
    small = min(res.sizes) if res.sizes else None
    for db in res.dbs:
        label = DB_LABEL[db]
        # 1. window cost independent of history length
        for system in ("memstore", "memstore-async", "memstore-nocache"):
            sizes = [s for s in res.sizes if res.p(system, db, s, TL4K) is not None]
            goal = "4k window at 1,000,000 msgs ≤ 1.5× its cost at 1,000"
            if 1_000 in sizes and 1_000_000 in sizes:
                a = res.p(system, db, 1_000, TL4K)
                b = res.p(system, db, 1_000_000, TL4K)
                assert a is not None and b is not None
                pa, pb = res.paired(system, db, 1_000), res.paired(system, db, 1_000_000)
                if pa and pb:
                    out.append(_drift_row(goal, label, system, a, b, pa, pb))
                else:
                    out.append(_growth_row(goal, label, system, a, b))
            else:
                big = max(sizes) if sizes else None
                note = "not measured" if big is None else f"largest size run: {fmt_size(big)}"
                if big is not None and small is not None and big > small:
                    a = res.p(system, db, small, TL4K)
                    b = res.p(system, db, big, TL4K)
                    if a and b:
                        note += f"; {fmt_size(big)} vs {fmt_size(small)}: {fmt_ratio(b / a)}"
                out.append(
                    {
                        "target": goal,
                        "db": label,
                        "system": SHORT[system],
                        "measured": note,
                        "ok": None,
                    }
                )
        # 2. within 2x of the floor (like for like, timed alternately in one process
        #    when the run has paired measurements), and p95 under the goal
        for system in ("memstore", "memstore-async", "memstore-nocache"):
            floor = FLOOR_OF[system]
            ratios = []
            p95s = []
            paired = False
            for s in res.sizes:
                pr = res.paired(system, db, s)
                if pr is not None:
                    ratios.append((pr["ratio_p50"], s))
                    paired = True
                else:
                    m = res.p(system, db, s, TL4K)
                    f = res.p(floor, db, s, TL4K)
                    if m is not None and f is not None:
                        ratios.append((m / f, s))
                q = res.p(system, db, s, TL4K, "p95_ms")
                if q is not None:
                    p95s.append((q, s))
            how = "paired, alternating calls" if paired else "separate jobs"
            if ratios:
                worst, at = max(ratios)
                out.append(
                    {
                        "target": "TokenLimited 4k p50 within 2× of the raw floor",
                        "db": label,
                        "system": SHORT[system],
                        "measured": f"worst {fmt_ratio(worst)} of {SHORT[floor]} "
                        f"(at {fmt_size(at)} msgs; {how})",
                        "ok": worst <= 2.0,
                    }
                )
            else:
                out.append(
                    {
                        "target": "TokenLimited 4k p50 within 2× of the raw floor",
                        "db": label,
                        "system": SHORT[system],
                        "measured": "not measured",
                        "ok": None,
                    }
                )
            goal_ms = P95_GOAL_MS[db]
            if p95s:
                worst95, at95 = max(p95s)
                out.append(
                    {
                        "target": f"TokenLimited 4k p95 < {goal_ms:g} ms",
                        "db": label,
                        "system": SHORT[system],
                        "measured": f"worst {fmt_ms(worst95)} ms (at {fmt_size(at95)} msgs)",
                        "ok": worst95 < goal_ms,
                    }
                )
            else:
                out.append(
                    {
                        "target": f"TokenLimited 4k p95 < {goal_ms:g} ms",
                        "db": label,
                        "system": SHORT[system],
                        "measured": "not measured",
                        "ok": None,
                    }
                )
        # 3. 100x faster than LangChain at 100k
        for system in ("memstore", "memstore-async", "memstore-nocache"):
            goal = "≥ 100× faster than LangChain load-and-trim at 100,000 msgs (4k p50)"
            m = res.p(system, db, 100_000, TL4K)
            lc = res.p("langchain", db, 100_000, TL4K)
            lc_run = res.run_of("langchain", db, 100_000)
            if m is not None and lc is not None:
                out.append(
                    {
                        "target": goal,
                        "db": label,
                        "system": SHORT[system],
                        "measured": f"{fmt_ms(lc)} ms vs {fmt_ms(m)} ms = {fmt_ratio(lc / m)}",
                        "ok": lc / m >= 100,
                    }
                )
            elif m is not None and lc_run and lc_run.get("status") == "timed_out":
                # A lower bound of one LangChain fetch: its first (checked) fetch if it
                # finished, else the time the job spent after building the history.
                w = res.window("langchain", db, 100_000, TL4K) or {}
                imp = lc_run.get("import") or {}
                built = float(imp.get("main_s") or 0) + float(imp.get("other_s") or 0)
                bound = float(w.get("first_ms") or 0) or max(
                    0.0, (float(lc_run.get("elapsed_s") or 0) - built) * 1000
                )
                out.append(
                    {
                        "target": goal,
                        "db": label,
                        "system": SHORT[system],
                        "measured": f"LangChain timed out; one fetch > {fmt_ms(bound)} ms "
                        f"vs {fmt_ms(m)} ms = > {fmt_ratio(bound / m)}",
                        "ok": True if bound / m >= 100 else None,
                    }
                )
            else:
                out.append(
                    {
                        "target": goal,
                        "db": label,
                        "system": SHORT[system],
                        "measured": "100,000 not run for both",
                        "ok": None,
                    }
                )
        # 4. append cost independent of history length
        for system in ("memstore", "memstore-async"):
            goal = "append at 1,000,000 msgs ≤ 1.5× append at 1,000 (p50)"
            e_small = res.entry(system, db, 1_000)
            e_big = res.entry(system, db, 1_000_000)
            a = (e_small or {}).get("append", {}).get("p50_ms")
            b = (e_big or {}).get("append", {}).get("p50_ms")
            pa = (res.paired(system, db, 1_000) or {}).get("append")
            pb = (res.paired(system, db, 1_000_000) or {}).get("append")
            if a and b and pa and pb:
                out.append(_drift_row(goal, label, system, a, b, pa, pb, what="append"))
            elif a and b:
                out.append(_growth_row(goal, label, system, a, b))
            else:
                out.append(
                    {
                        "target": goal,
                        "db": label,
                        "system": SHORT[system],
                        "measured": "1,000 and 1,000,000 not both run",
                        "ok": None,
                    }
                )
    return out


# ---- sections -----------------------------------------------------------------------


def _machine(res: Results) -> list[str]:
    m = res.doc["machine"]
    rows = [
        ["CPU", str(m.get("cpu"))],
        ["cores", str(m.get("cores"))],
        ["RAM", f"{m.get('ram_gib')} GiB"],
        ["OS", str(m.get("os"))],
        ["Python", str(m.get("python"))],
        ["SQLite", str(m.get("sqlite"))],
        ["PostgreSQL", str(m.get("postgres") or "not reachable")],
        ["memstore commit", str(m.get("memstore_commit"))],
    ]
    pkgs = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items() if v)
    rows.append(["packages", pkgs])
    return _table(["", ""], rows)


def _headline(res: Results) -> list[str]:
    has_memstore = any(
        res.p("memstore", db, s, TL4K) is not None for db in res.dbs for s in res.sizes
    )
    base = "memstore" if has_memstore else "floor"
    present = res.systems_present()
    peers = [o for o in PEER_SYSTEMS if o in present]
    header = ["DB", "messages", f"{SHORT[base]} p50 (ms)"]
    pairs: list[tuple[str, str]] = []  # (memstore variant, its floor) ratio columns
    if has_memstore:
        header += ["floor p50 (ms)"]
        pairs = [(m, f) for m, f in FLOOR_OF.items() if m in present and f in present]
        header += [f"{SHORT[m]} ÷ {SHORT[f]}" for m, f in pairs]
    header += [f"{SHORT[o]} ÷ {SHORT[base]}" for o in peers]
    rows = []
    for db in res.dbs:
        for size in res.sizes:
            b = res.p(base, db, size, TL4K)
            row = [DB_LABEL[db], fmt_size(size), fmt_ms(b)]
            if has_memstore:
                f = res.p("floor", db, size, TL4K)
                row.append(
                    fmt_ms(f) if f is not None else (res.status_text("floor", db, size) or "—")
                )
                for m, fl in pairs:
                    pr = res.paired(m, db, size)
                    mv, fv = res.p(m, db, size, TL4K), res.p(fl, db, size, TL4K)
                    if pr is not None:
                        row.append(fmt_ratio(pr["ratio_p50"]))
                    else:
                        row.append(fmt_ratio(mv / fv) if mv and fv else "—")
            for o in peers:
                v = res.p(o, db, size, TL4K)
                row.append(fmt_ratio(v / b) if b and v else (res.status_text(o, db, size) or "—"))
            rows.append(row)
    lines = [
        "Window fetch, `TokenLimited` 4,000 tokens, p50. Ratio columns against the floor "
        "compare like with like (sync with the sync floor, async with the async floor; "
        "target ≤ 2×), timed alternately in one process on one database (the memstore "
        "job loads the floor's table too), because this machine's speed drifts between "
        "jobs; the two p50 columns come from the separate jobs. Peer columns: how many times "
        f"longer the peer takes than {SHORT[base]} in this run (a ✗ in the tables below "
        "means the peer's window also failed a correctness check).",
        "",
        *_table(header, rows),
    ]
    if "llamaindex" in peers:
        lines += [
            "",
            "LlamaIndex reads cheaply because its `Memory` trims at *write* time (every "
            "`aput` re-reads and re-tokenizes the whole active window: see the append "
            "table) and its window holds about 70% of the budget.",
        ]
    if not has_memstore:
        lines += ["", "_memstore did not run in this run; ratios are against the raw floor._"]
    return lines


def _targets_section(res: Results) -> list[str]:
    rows = [
        [t["target"], t["db"], t["system"], t["measured"], _verdict(t["ok"])] for t in targets(res)
    ]
    return _table(["target", "DB", "system", "measured", "verdict"], rows)


def _windows_section(res: Results) -> list[str]:
    lines: list[str] = []
    keys = []
    for view in ("token_limited", "score_based", "head_and_tail"):
        for b in res.budgets:
            keys.append(f"{view}:{b}")
    for db in res.dbs:
        lines += [f"### {DB_LABEL[db]}", ""]
        rows = []
        for system in res.systems_present():
            for key in keys:
                label = None
                for size in res.sizes:
                    w = res.window(system, db, size, key)
                    if w is not None:
                        label = w["label"]
                        break
                if label is None:
                    continue
                rows.append(
                    [SHORT[system], label]
                    + [_window_cell(res, system, db, s, key) for s in res.sizes]
                )
        lines += _table(["system", "window"] + [fmt_size(s) for s in res.sizes], rows)
        lines.append("")
    return lines


def _correctness(res: Results) -> list[str]:
    rows = []
    for system in res.systems_present():
        for db in res.dbs:
            checked = passed = 0
            problems: dict[str, list[str]] = {}
            for size in res.sizes:
                entry = res.entry(system, db, size)
                if entry is None:
                    continue
                for w in entry.get("windows", {}).values():
                    c = w.get("check")
                    if not c:
                        continue
                    checked += 1
                    if c["ok"]:
                        passed += 1
                    for p in c["problems"]:
                        kind = p.split(":")[0] if p.startswith("over budget") else p
                        problems.setdefault(kind, []).append(f"{w['label']} @ {fmt_size(size)}")
            if not checked:
                continue
            detail = "; ".join(f"{k} ({', '.join(v)})" for k, v in problems.items()) or "—"
            rows.append([SHORT[system], DB_LABEL[db], f"{passed}/{checked}", detail])
    return _table(["system", "DB", "windows passing", "problems"], rows)


def _per_size_table(res: Results, getter: Any, fmt: Any) -> list[str]:
    rows = []
    for system in res.systems_present():
        for db in res.dbs:
            cells = []
            any_value = False
            for size in res.sizes:
                why = res.status_text(system, db, size)
                if why is not None:
                    cells.append(why)
                    continue
                entry = res.entry(system, db, size) or {}
                run = res.run_of(system, db, size) or {}
                v = getter(entry, run, system)
                if v is None:
                    cells.append("—")
                else:
                    any_value = True
                    cells.append(fmt(v))
            if any_value:
                rows.append([SHORT[system], DB_LABEL[db], *cells])
    return _table(["system", "DB"] + [fmt_size(s) for s in res.sizes], rows)


def _append_get(entry: dict[str, Any], run: dict[str, Any], system: str) -> Any:
    a = entry.get("append")
    return (a["p50_ms"], a["p95_ms"]) if a and "p50_ms" in a else None


def _import_get(entry: dict[str, Any], run: dict[str, Any], system: str) -> Any:
    if "extend" in entry:
        return entry["extend"]["msgs_per_s"]
    if system != run.get("group"):  # not the system that built the history
        return None
    return (run.get("import") or {}).get("msgs_per_s")


def _turn_get(entry: dict[str, Any], run: dict[str, Any], system: str) -> Any:
    t = entry.get("turn")
    if not t or "p50_ms" not in t:
        return None
    return t["p50_ms"], t["p95_ms"], (t.get("check") or {}).get("ok", True)


def _storage_get(entry: dict[str, Any], run: dict[str, Any], system: str) -> Any:
    if system in SHARES_DB:
        return None
    st = run.get("storage") or {}
    return st.get("bytes_per_message")


def _alloc_get(entry: dict[str, Any], run: dict[str, Any], system: str) -> Any:
    return entry.get("window_alloc_kib")


def _rss_get(entry: dict[str, Any], run: dict[str, Any], system: str) -> Any:
    return entry.get("window_peak_rss_mib")


def _import_paths(res: Results) -> list[str]:
    seen: dict[str, str] = {}
    for run in res.doc.get("runs", []):
        path = (run.get("import") or {}).get("path")
        if path:
            seen.setdefault(run["group"], path)
    return [f"- {SHORT.get(g, g)}: {p}" for g, p in seen.items()]


def _method(res: Results) -> list[str]:
    cfg = res.doc["config"]
    prof = cfg["profile"]
    return [
        "- **Workload** (`benchmarks/workload.py`, seed "
        f"{cfg['seed']}): a system prompt (~300 tokens), then turns of a user message and "
        "either an assistant answer or a tool exchange (an assistant message with 1–3 "
        "parallel calls, the results, sometimes a chained second call, then the answer). "
        "About 10% of messages are assistant tool calls; ~1 tool result in 80 is a "
        "~2,000-token log dump; ~90 tokens per message on average. 50 other conversations "
        "(size ÷ 20 messages each, 20–2,000) share the tables.",
        "- **Counting**: " + str(res.doc.get("counter_note") or ""),
        "- **Budgets**: a window must satisfy `count(window) + reply priming ≤ budget`. "
        "LangChain gets `max_tokens = budget − priming` (it sums per-message counts). "
        "LlamaIndex gets `token_limit = budget` with its default "
        "`chat_history_token_ratio` of 0.7, so its windows hold about 70% of the budget.",
        "- **Systems**: see `benchmarks/README.md`. LlamaIndex and the Agents SDK are "
        "async-only and are timed inside their event loop; so are memstore (async) and "
        "the async floor (aiosqlite / psycopg `AsyncConnection`). memstore keeps the rows "
        "its windows decoded in a process-local cache validated by the conversation's "
        "epoch on every read (its default, `cache_size=10000`), so repeated windows of "
        "one conversation mostly come from memory; `memstore (cache_size=0)` reads and "
        "decodes every row of every window. "
        "SQLite files run in WAL mode for every system; PostgreSQL gets `VACUUM ANALYZE` "
        "after the bulk load (not timed).",
        "- **Timing**: each window kind is fetched once and checked (the first call's time "
        f"is kept as `first_ms`), then {prof['warmup']} warm-up calls when fast, then "
        f"repetitions sized to ~{prof['target_s']} s ({prof['min_reps']}–{prof['max_reps']}, "
        f"never more than {prof['series_cap_s']} s; slow systems get fewer — marked `n=`). "
        f"Appends: {prof['appends']} messages at the end of the main conversation, after "
        "all window timings, tokenization included where the system tokenizes at write.",
        "- **Memory**: `window_alloc_kib` is the tracemalloc peak of one 4k window fetch "
        "(Python allocations only); peak RSS growth per phase is in the JSON.",
        "- **Storage**: SQLite `page_count × page_size` after a WAL checkpoint; PostgreSQL "
        "`pg_total_relation_size` summed over the job's tables; divided by the messages "
        "stored (LlamaIndex stores the main conversation once per budget).",
        f"- **Time caps**: {cfg['time_cap_s']:.0f} s per job up to 100,000 messages, "
        f"{cfg['big_time_cap_s']:.0f} s above; a peer that hits its cap is not run at larger "
        f"sizes. Peers run up to {cfg['peer_max_size']:,} messages.",
    ]


def render_markdown(doc: dict[str, Any], plot_name: str | None) -> str:
    """The whole report."""
    res = Results(doc)
    lines = [
        "# memstore benchmarks",
        "",
        "Generated by the command below from `benchmarks/` "
        f"({'quick smoke run' if doc.get('quick') else 'full run'}, "
        f"started {doc.get('started')}, {float(doc.get('elapsed_s') or 0) / 60:.1f} min). "
        "Absolute times are this machine's; the ratios between systems measured in the "
        "same run are the headline.",
        "",
        "```",
        str(doc.get("command")),
        "```",
        "",
        "## Machine",
        "",
        *_machine(res),
        "",
        "## Headline",
        "",
        *_headline(res),
        "",
    ]
    if plot_name:
        lines += [f"![window p50 vs history length]({plot_name})", ""]
    lines += [
        "## Targets",
        "",
        "Each verdict is computed from this run's numbers. `TokenLimited` targets use the "
        "4,000-token window at every size run (the 32,000-token numbers are in the "
        "tables below). The floor ratios and the two growth targets (1,000,000 vs 1,000 "
        "messages, which compare jobs run many minutes apart) are judged on memstore's "
        "cost relative to the floor timed call by call in the same job; the raw "
        "cross-job ratio is shown beside it.",
        "",
        *_targets_section(res),
        "",
        "## Window fetch latency",
        "",
        "p50 / p95 in ms per history length. ✗ = the window failed a correctness check "
        "(see below); `n=` = fewer than 5 timed calls; `—` = not run at that size; "
        "`n/a` = the system has no such view.",
        "",
        *_windows_section(res),
        "## Correctness",
        "",
        "Every window is checked before it is timed: within budget by the reference "
        "counter (not for `HeadAndTail`, which is count-based), starts with the system "
        "prompt, ends with the newest message, no orphan tool result, no unanswered tool "
        "call.",
        "",
        *_correctness(res),
        "",
        "## Append latency",
        "",
        "One message appended at the end of the main conversation: p50 / p95 in ms.",
        "",
        *_per_size_table(res, _append_get, lambda v: f"{fmt_ms(v[0])} / {fmt_ms(v[1])}"),
        "",
        "## Agent turn",
        "",
        "One turn of an agent loop: append a message, then fetch the 4,000-token "
        f"`TokenLimited` window; {doc['config']['profile'].get('turns', 0)} turns per "
        "system after the append phase, p50 / p95 in ms (✗: the last window failed its "
        "check). Here memstore's row cache must pick up the new rows: each window reads "
        "the rows appended since the previous one and reuses the rest.",
        "",
        *_per_size_table(
            res,
            _turn_get,
            lambda v: f"{fmt_ms(v[0])} / {fmt_ms(v[1])}" + ("" if v[2] else " ✗"),
        ),
        "",
        "## Bulk import throughput",
        "",
        "Messages per second through each system's bulk path (main conversation and the "
        "50 others; memstore (async): a separate `extend` of up to "
        f"{doc['config']['profile']['async_extend']:,} messages on the same database).",
        "",
        *_per_size_table(res, _import_get, lambda v: f"{v:,.0f}"),
        "",
        *_import_paths(res),
        "",
        "## Storage",
        "",
        "Database bytes per stored message (tables and indexes).",
        "",
        *_per_size_table(res, _storage_get, lambda v: f"{v:,.0f}"),
        "",
        "## Memory",
        "",
        "Python allocation peak of one 4,000-token window fetch (tracemalloc), KiB.",
        "",
        *_per_size_table(res, _alloc_get, lambda v: f"{v:,.0f}"),
        "",
        "Growth of the process's peak RSS over the whole window phase (all window kinds "
        "and repetitions), MiB; a lower bound (memory the allocator already held is not "
        "counted).",
        "",
        *_per_size_table(res, _rss_get, lambda v: f"{v:,.1f}"),
        "",
        "## Method",
        "",
        *_method(res),
        "",
    ]
    notes = list(doc.get("notes") or [])
    for run in doc.get("runs", []):
        for n in run.get("notes") or []:
            notes.append(f"{run['group']} {run['db']} {fmt_size(run['size'])}: {n}")
        if run.get("status") == "error":
            err = str(run.get("error", "")).strip().splitlines()
            notes.append(
                f"{run['group']} {run['db']} {fmt_size(run['size'])}: error: "
                + (err[-1] if err else "?")
            )
        for name, entry in run.get("systems", {}).items():
            if entry.get("status") == "skipped":
                notes.append(f"{SHORT.get(name, name)} skipped: {entry.get('note')}")
    if notes:
        lines += ["## Notes", ""]
        lines += [f"- {n}" for n in dict.fromkeys(notes)]
        lines.append("")
    return "\n".join(lines)


def render_plot(doc: dict[str, Any], path: Path) -> bool:
    """Window p50 (TokenLimited 4k solid, 32k dashed) vs history length, per DB."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    res = Results(doc)
    if not res.dbs or not res.sizes:
        return False
    fig, axes = plt.subplots(1, len(res.dbs), figsize=(6.2 * len(res.dbs), 4.6), squeeze=False)
    colors = {
        "memstore": "#1f77b4",
        "memstore-async": "#17becf",
        "memstore-nocache": "#7f7f7f",
        "floor": "#2ca02c",
        "floor-async": "#bcbd22",
        "langchain": "#d62728",
        "llamaindex": "#9467bd",
        "openai-agents": "#ff7f0e",
    }
    drew = False
    handles: dict[str, Any] = {}
    for ax, db in zip(axes[0], res.dbs, strict=True):
        for system in res.systems_present():
            for budget, style in ((4_000, "-"), (32_000, "--")):
                key = f"token_limited:{budget}"
                xs, ys = [], []
                for s in res.sizes:
                    v = res.p(system, db, s, key)
                    if v is not None:
                        xs.append(s)
                        ys.append(v)
                if not xs:
                    continue
                drew = True
                (line,) = ax.plot(xs, ys, style, marker="o", markersize=4, color=colors[system])
                if budget == 4_000:
                    handles.setdefault(SHORT[system], line)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(res.sizes)
        ax.set_xticklabels([_short_size(s) for s in res.sizes])
        ax.minorticks_off()
        ax.set_xlabel("messages in the conversation")
        ax.set_ylabel("window fetch p50 (ms)")
        ax.set_title(f"{DB_LABEL[db]}")
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(
        "TokenLimited window fetch p50 vs history length "
        "(solid: 4,000 tokens, dashed: 32,000; this machine; lower is better)",
        fontsize=10,
    )
    fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc="lower center",
        ncol=min(6, len(handles)),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if drew:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drew


def write_report(doc: dict[str, Any], out: Path, plot: Path | None) -> None:
    """Write the markdown report (and the plot next to it)."""
    plot_ref = None
    if plot is not None and render_plot(doc, plot):
        plot_ref = os.path.relpath(plot, out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(doc, plot_ref))

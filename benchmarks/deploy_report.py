"""The deployment phases' section of the report: tables and target verdicts."""

from __future__ import annotations

from typing import Any

__all__ = ["deploy_targets", "render_deploy"]

#: (goal text, phase, key, stat, sqlite limit, postgres limit)
_RATIO_TARGETS = (
    ("random-conversation 4k window, default store, p50 vs floor", "tenants", "memstore",
     "ratio_p50", 2.0, 1.3),
    ("random-conversation 4k window, default store, p95 vs floor", "tenants", "memstore",
     "ratio_p95", 2.5, 1.5),
    ("random-conversation 4k window, `cache_size=0`, p50 vs floor", "tenants",
     "memstore-nocache", "ratio_p50", 2.0, 1.3),
    ("random-conversation 4k window, `cache_size=0`, p95 vs floor", "tenants",
     "memstore-nocache", "ratio_p95", 2.5, 1.5),
    ("single append (tokenization included) vs floor insert, p50", "append", "append",
     "ratio_p50", 3.0, 1.3),
    ("`extend` of 100 vs floor `executemany`, p50", "append", "extend", "ratio_p50", 1.5, 1.5),
    ("agent turn at 10k history vs floor, p50", "turn", "turn", "ratio_p50", 2.5, 1.3),
)

#: The default cache may be this much slower than none and still count as "not slower":
#: both are timed alternately, but p50s of two series of the same work differ by a few %.
CACHE_NOISE = 1.05


def _fmt(x: float | None, unit: str = "×") -> str:
    if x is None:
        return "–"
    return f"{x:.2f}{unit}" if unit == "×" else f"{x:.3f} {unit}"


def _verdict(ok: bool | None) -> str:
    return "not evaluated" if ok is None else ("**met**" if ok else "**not met**")


def deploy_targets(ddoc: dict[str, Any]) -> list[dict[str, Any]]:
    """One verdict per target and database, from the run's own numbers."""
    out: list[dict[str, Any]] = []
    for run in ddoc.get("runs", []):
        db = run["db"] + (f" ({run['label']})" if run.get("label") else "")
        phases = run.get("phases", {})
        for goal, phase, key, stat, lim_sqlite, lim_pg in _RATIO_TARGETS:
            limit = lim_sqlite if run["db"] == "sqlite" else lim_pg
            value = phases.get(phase, {}).get(key, {}).get(stat)
            out.append({"db": db, "goal": f"{goal} ≤ {limit:g}×", "value": _fmt(value),
                        "ok": None if value is None else value <= limit})
        ten = phases.get("tenants", {})
        ratio = ten.get("cached_vs_nocache_p50")
        control = ten.get("control_vs_nocache_p50")
        noise = max(CACHE_NOISE, control or 0.0)
        out.append({
            "db": db,
            "goal": f"default row cache not slower than `cache_size=0` under uniform random "
                    f"access (p50 ratio ≤ {CACHE_NOISE:g}, or ≤ the control: a second "
                    f"`cache_size=0` store against the first)",
            "value": _fmt(ratio) + (f" (control {_fmt(control)})" if control else ""),
            "ok": None if ratio is None else ratio <= noise,
        })
        if "repeat_rows_read" in ten:
            read = ten["repeat_rows_read"]
            out.append({
                "db": db,
                "goal": "a repeated conversation is served from the cache (0 rows decoded; "
                        "one statement)",
                "value": f"{read} rows decoded, {ten.get('repeat_rows_cached')} cached",
                "ok": read == 0,
            })
        cold = phases.get("cold", {}).get("memstore")
        if run["db"] == "sqlite":
            out.append({
                "db": db,
                "goal": "first window in a fresh process ≤ 2 ms (the `window` call after the "
                        "store is open; imports, tokenizer and opening shown beside it)",
                "value": _fmt(cold["window"], "ms") if cold else "–",
                "ok": None if not cold else cold["window"] <= 2.0,
            })
    return out


def _stat_row(label: str, entry: dict[str, Any] | None) -> list[str]:
    if not entry:
        return [label, "–", "–", "–", "–", "–", "–"]
    s, f = entry["stats"], entry["floor_stats"]
    return [label, f"{s['p50_ms']:.3f}", f"{s['p95_ms']:.3f}", f"{f['p50_ms']:.3f}",
            f"{f['p95_ms']:.3f}", _fmt(entry["ratio_p50"]), _fmt(entry["ratio_p95"])]


def render_deploy(ddoc: dict[str, Any]) -> list[str]:
    """Markdown lines of the deployment phases' section."""
    lines = [
        "## Deployment phases: many tenants, appends, agent turns, first window",
        "",
        "Unlike the warm window tables below (one conversation fetched again and again), "
        "these phases read a conversation the process has probably not seen lately, append "
        "through the normal write path, and start fresh processes. Every memstore number is "
        "timed **alternately with the raw-SQL floor in one process** (order rotated), so the "
        "ratios are the result; absolute times drift with the machine. "
        f"{'Quick run (smaller sizes). ' if ddoc.get('quick') else ''}Command:",
        "",
        "```",
        str(ddoc.get("command")),
        "```",
        "",
    ]
    for run in ddoc.get("runs", []):
        db = run["db"]
        ph = run.get("phases", {})
        name = "SQLite" if db == "sqlite" else "PostgreSQL"
        header = ["case", "memstore p50 ms", "p95 ms", "floor p50 ms", "p95 ms",
                  "ratio p50", "ratio p95"]
        rows: list[list[str]] = []
        ten = ph.get("tenants", {})
        if ten and "error" not in ten:
            n = f"{ten['conversations']:,} × {ten['per_conversation']}"
            c = ten.get("cache") or {}
            seen = (c.get("hits", 0) + c.get("misses", 0)) or 1
            share = 100 * c.get("hits", 0) / seen
            rows.append(_stat_row(
                f"4k window of a random one of {n}, default store ({share:.0f}% of rows "
                "from the cache)", ten.get("memstore")))
            rows.append(_stat_row("same, `cache_size=0`", ten.get("memstore-nocache")))
        app = ph.get("append", {})
        if app and "error" not in app:
            rows.append(_stat_row("single append (tokenized) vs insert", app.get("append")))
            copy = " (memstore sends one COPY)" if db == "postgres" else ""
            rows.append(_stat_row(f"`extend` of {app['extend'].get('size', 100)} vs "
                                  f"`executemany`{copy}", app.get("extend")))
        turn = ph.get("turn", {})
        if turn and "error" not in turn:
            rows.append(_stat_row(f"agent turn at {turn['history']:,} history", turn.get("turn")))
        lines += [f"### {name}" + (f" ({run['label']})" if run.get("label") else ""), ""]
        loads = {p: d["loadavg_1m"] for p, d in ph.items() if "loadavg_1m" in d}
        if loads:
            lines += [
                "1-minute load average at the end of each phase (2 cores; above 2 means "
                "CPU contention, which inflates longer calls more than short ones): "
                + ", ".join(f"{p} {v:.1f}" for p, v in loads.items()) + ".",
                "",
            ]
        if rows:
            lines += ["| " + " | ".join(header) + " |",
                      "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            lines.append("")
        cold = ph.get("cold", {})
        if cold and "error" not in cold:
            m, f = cold["memstore"], cold["floor"]
            lines += [
                f"First window in a fresh process (median of {cold['samples']} processes, "
                f"ms; migrations mode `{cold['migrate']}`): memstore imports "
                f"{m['imports']:.1f}, tokenizer load {m['tokenizer']:.1f}, opening the store "
                f"(engine, migrations check) {m['open']:.1f}, first window "
                f"{m['window']:.2f} (the second {m['second_window']:.2f}); the floor imports "
                f"its driver in {f['imports']:.1f}, connects in {f['open']:.1f} and reads "
                f"the window in {f['window']:.2f}.",
                "",
            ]
        for phase, data in ph.items():
            if "error" in data:
                lines += [f"- {phase}: error: {data['error']}", ""]
            elif data.get("check") and not data["check"].get("ok", True):
                lines += [f"- {phase}: window check failed: {data['check']}", ""]
        if ten.get("cache"):
            c = ten["cache"]
            lines += [
                f"Row cache after the tenants phase: {c['size']:,} of {c['max_size']:,} "
                f"messages held over {c['conversations']:,} conversations; hits "
                f"{c['hits']:,}, misses {c['misses']:,}.",
                "",
            ]
    lines += ["### Targets (deployment)", "",
              "| database | target | this run | verdict |", "|---|---|---|---|"]
    for t in deploy_targets(ddoc):
        lines.append(f"| {t['db']} | {t['goal']} | {t['value']} | {_verdict(t['ok'])} |")
    lines += ["", "Where the time of a cold window and of an append goes, layer by layer "
              "(`python -m benchmarks.breakdown`), and what was tried: "
              "[Where the time goes](benchmarks-profile.md).", ""]
    return lines

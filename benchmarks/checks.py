"""Correctness checks every window must pass before it is timed.

A window (a list of OpenAI chat dicts) is correct when:

* **budget**: the reference formula counts it (reply priming included) at or under
  the budget (skipped for count-based views such as ``HeadAndTailView``);
* **newest**: it ends with the conversation's newest message;
* **system**: it starts with the conversation's system prompt;
* **pairs**: no tool result lacks its call in the same unit (an *orphan*), and no
  assistant tool call lacks a result before the next non-tool message (an
  *unanswered call*) — the two shapes OpenAI and Anthropic reject with a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.tokens import ChatFormula, message_parts

__all__ = ["CheckResult", "check_window", "normalize"]


def normalize(m: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a message across systems' formats (role, text, call ids)."""
    role, text, _name, calls, tool_call_id = message_parts(m)
    return (role, text.strip(), tuple(c[0] for c in calls), tool_call_id)


@dataclass
class CheckResult:
    """The verdict on one window."""

    ok: bool
    messages: int
    tokens: int
    budget: int | None
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _pair_problems(window: Sequence[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    orphans = 0
    unanswered = 0
    i = 0
    n = len(window)
    while i < n:
        m = window[i]
        calls = m.get("tool_calls") or []
        if m["role"] == "tool":
            orphans += 1  # a tool result not directly after its call's unit
            i += 1
            continue
        if m["role"] == "assistant" and calls:
            wanted = {c["id"] for c in calls}
            j = i + 1
            while j < n and window[j]["role"] == "tool":
                tcid = window[j].get("tool_call_id")
                if tcid in wanted:
                    wanted.discard(tcid)
                else:
                    orphans += 1
                j += 1
            unanswered += len(wanted)
            i = j
            continue
        i += 1
    if orphans:
        problems.append(f"{orphans} orphan tool result(s)")
    if unanswered:
        problems.append(f"{unanswered} unanswered tool call(s)")
    return problems


def check_window(
    window: Sequence[dict[str, Any]],
    *,
    formula: ChatFormula,
    budget: int | None,
    system: dict[str, Any],
    newest: dict[str, Any],
) -> CheckResult:
    """Check ``window`` against the rules in the module docstring."""
    problems: list[str] = []
    tokens = formula.count_all(window)
    if not window:
        return CheckResult(False, 0, tokens, budget, ["empty window"])
    if budget is not None and tokens > budget:
        problems.append(f"over budget: {tokens} > {budget} tokens")
    if normalize(window[-1]) != normalize(newest):
        problems.append("does not end with the newest message")
    if normalize(window[0]) != normalize(system):
        problems.append("system prompt missing")
    problems.extend(_pair_problems(window))
    return CheckResult(not problems, len(window), tokens, budget, problems)

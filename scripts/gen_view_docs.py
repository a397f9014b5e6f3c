"""Regenerate the per-view sections of docs/views.md from the views' docstrings.

Run ``python scripts/gen_view_docs.py``; ``--check`` exits 1 when the file is stale
(tests/test_docs.py runs the check).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import memstore
from memstore import views

DOC = Path(__file__).resolve().parent.parent / "docs" / "views.md"
BEGIN = "<!-- BEGIN GENERATED: view docstrings -->"
END = "<!-- END GENERATED -->"
ORDER = ["UnboundedView", "BufferedView", "HeadAndTailView", "TokenLimitedView",
         "ScoreBasedView", "RecentTurnsView", "SummaryView"]


def generated() -> str:
    """The generated block: each view's signature and docstring."""
    parts = [BEGIN, ""]
    for name in ORDER:
        cls = getattr(views, name, None) or getattr(memstore, name)
        signature = str(inspect.signature(cls)).replace("'", "")
        parts += [f"### `{name}{signature}`", "", "```text", inspect.getdoc(cls) or "", "```", ""]
    parts.append(END)
    return "\n".join(parts)


def render(text: str) -> str:
    """``text`` with its generated block replaced by a fresh one."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + generated() + tail


def main(argv: list[str]) -> int:
    """Rewrite docs/views.md, or with ``--check`` report whether it is stale."""
    current = DOC.read_text()
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print("docs/views.md is stale: run python scripts/gen_view_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

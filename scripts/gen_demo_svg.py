"""Regenerate docs/images/demo.svg: the table ``memstore demo`` prints, as a picture.

Run ``python scripts/gen_demo_svg.py``; ``--check`` exits 1 when the file is stale
(tests/test_docs.py runs the check). The demo runs on an in-memory database, and the
table shows no timestamps or ids, so the picture is the same on every run.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rich.console import Console

from memstore import MemoryStore
from memstore.cli._demo import DEFAULT_BUDGET, demo_table, run_demo

SVG = Path(__file__).resolve().parent.parent / "docs" / "images" / "demo.svg"
WIDTH = 112


def generated() -> str:
    """The SVG of the demo table at the default budget."""
    with MemoryStore("sqlite://") as store:
        result = run_demo(store, DEFAULT_BUDGET)
    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", markup=False)
    console.print(demo_table(result, WIDTH))
    return console.export_svg(title="memstore demo")


def main(argv: list[str]) -> int:
    """Rewrite the SVG, or with ``--check`` report whether it is stale."""
    fresh = generated()
    if "--check" in argv:
        if not SVG.exists() or SVG.read_text() != fresh:
            print("docs/images/demo.svg is stale: run python scripts/gen_demo_svg.py",
                  file=sys.stderr)
            return 1
        return 0
    SVG.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

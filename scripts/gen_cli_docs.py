"""Regenerate the command reference in docs/cli.md from the ``memstore`` parser's help.

Run ``python scripts/gen_cli_docs.py``; ``--check`` exits 1 when the file is stale
(tests/test_docs.py runs the check). Only the block between the markers is generated;
the page's introduction above it is written by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
BEGIN = "<!-- BEGIN GENERATED: memstore --help -->"
END = "<!-- END GENERATED -->"
WIDTH = "96"
#: The Python whose argparse formats the page (CI's). Each version lays help out a
#: little differently (3.13 aligns subcommands and writes ``-o, --out OUT``), so the
#: page is checked only there.
PYTHON = (3, 11)


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every sub-parser, depth first, in declaration order."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for child in action.choices.values():
                if id(child) not in seen:  # aliases map to the same parser
                    seen.add(id(child))
                    yield from commands(child)


def generated() -> str:
    """The generated block: ``--help`` of every command."""
    os.environ["COLUMNS"] = WIDTH  # argparse wraps help at the terminal's width
    from memstore.cli import build_parser

    parts = [BEGIN, ""]
    for parser in commands(build_parser()):
        anchor = parser.prog.replace(" ", "-")
        parts += [f"### `{parser.prog}` {{#{anchor}}}", "", "```text",
                  parser.format_help().rstrip(), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def render(text: str) -> str:
    """``text`` with its generated block replaced by a fresh one."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + generated() + tail


def main(argv: list[str]) -> int:
    """Rewrite docs/cli.md, or with ``--check`` report whether it is stale."""
    current = DOC.read_text()
    if BEGIN not in current:
        print(f"{DOC} has no {BEGIN} marker", file=sys.stderr)
        return 1
    if sys.version_info[:2] != PYTHON:
        print(f"run this with Python {PYTHON[0]}.{PYTHON[1]}: argparse lays help out "
              "differently on each version", file=sys.stderr)
        return 1
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print("docs/cli.md is stale: run python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

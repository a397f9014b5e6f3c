"""docs/builder.md cannot rot: every Python block runs, and prints exactly what the page shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "builder.md"


def _examples() -> list[tuple[str, str | None]]:
    """Each Python block with the ``text`` block right after it (its printed output), if any."""
    text = PAGE.read_text()
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        after = re.match(r"\s*(?:It prints:\s*)?```text\n(.*?)```", text[match.end():], flags=re.S)
        found.append((match.group(1), after.group(1) if after else None))
    return found


def test_the_page_has_runnable_examples_with_output() -> None:
    examples = _examples()
    assert len(examples) >= 2
    assert all(output is not None for _, output in examples[:2])


@pytest.mark.parametrize("index", range(len(_examples())))
def test_builder_doc_example_runs_and_prints_what_the_page_shows(
    index: int, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    code, expected = _examples()[index]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"builder.md block {index}", "exec"), {"__name__": "__docs__"})
    if expected is not None:
        assert out.getvalue() == expected

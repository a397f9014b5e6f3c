"""The integration and format pages' examples run as written and print what they show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.integrations import require

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = {
    "docs/formats.md": None,
    "docs/integrations/autogen.md": "autogen_ext.models.replay",
    "docs/integrations/langchain.md": "langchain_core",
}


def _blocks(path: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), flags=re.S)


def _expected_output(code: str) -> list[str]:
    """What each ``print(...)`` shows: its trailing ``# comment`` or the comment lines after it."""
    lines = code.splitlines()
    expected: list[str] = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("print("):
            continue
        if "  # " in line:
            expected.append(line.split("  # ", 1)[1].strip())
            continue
        shown = []
        for follow in lines[i + 1:]:
            if not follow.lstrip().startswith("# "):
                break
            shown.append(follow.lstrip()[2:].strip())
        expected.append(" ".join(shown))
    return expected


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_examples_run(page: str, tmp_path: Path, monkeypatch: Any,
                           capsys: pytest.CaptureFixture[str]) -> None:
    module = PAGES[page]
    if module is not None:
        require(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    blocks = _blocks(page)
    assert blocks, f"{page} has no python example"
    for index, code in enumerate(blocks):
        exec(compile(code, f"{page} block {index}", "exec"), {"__name__": "__docs__"})
        printed = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
        assert printed == _expected_output(code), f"{page} block {index}"

"""The docs cannot rot: README examples run, the first screen has the two commands, the CLI is
documented."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from memstore.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_first_screen_has_the_two_commands() -> None:
    first_screen = "\n".join(README.splitlines()[:25])
    commands = _blocks(first_screen, "bash")
    assert len(commands) >= 2
    assert "memstore window" in commands[0] and "pip install" in commands[0]
    assert "pytest" in commands[1] and "pip install" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1].strip() in ci, ".ci/run must run the README's test command verbatim"


@pytest.mark.parametrize("index", range(len(_blocks(README, "python"))))
def test_readme_python_blocks_run(index: int, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'readme.db'}")
    code = _blocks(README, "python")[index]
    exec(compile(code, f"README block {index}", "exec"), {"__name__": "__readme__"})


def test_every_cli_command_is_documented() -> None:
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, subparser in sub.choices.items():  # type: ignore[union-attr]
        nested = [a for a in subparser._actions if getattr(a, "choices", None)
                  and a.dest.endswith("_command")]
        if nested:
            for child in nested[0].choices:  # type: ignore[union-attr]
                assert f"memstore {name} {child}" in cli_doc, f"{name} {child}"
        else:
            assert f"memstore {name}" in cli_doc, name


def test_view_docs_are_generated_from_the_docstrings() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_view_docs.py"),
                             "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_docs_python_blocks_run(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    for page in ("views.md", "async.md"):
        for i, code in enumerate(_blocks((ROOT / "docs" / page).read_text(), "python")):
            exec(compile(code, f"{page} block {i}", "exec"), {"__name__": "__docs__"})
